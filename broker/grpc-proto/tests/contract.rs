//! The generated contract matches apache/rocketmq-apis where the 5.x clients depend on it:
//! field numbers and names read from the compiled descriptor, and bytes on the wire.

use prost::Message as _;
use prost_types::{DescriptorProto, FileDescriptorSet};
use quiver_grpc_proto::v2;

fn descriptor_set() -> FileDescriptorSet {
    FileDescriptorSet::decode(quiver_grpc_proto::FILE_DESCRIPTOR_SET).expect("descriptor set")
}

fn message<'a>(set: &'a FileDescriptorSet, name: &str) -> &'a DescriptorProto {
    set.file
        .iter()
        .filter(|file| file.package() == "apache.rocketmq.v2")
        .flat_map(|file| file.message_type.iter())
        .find(|message| message.name() == name)
        .unwrap_or_else(|| panic!("message {name} missing"))
}

fn field_number(set: &FileDescriptorSet, message_name: &str, field: &str) -> i32 {
    message(set, message_name)
        .field
        .iter()
        .find(|f| f.name() == field)
        .unwrap_or_else(|| panic!("{message_name}.{field} missing"))
        .number()
}

#[test]
fn key_fields_keep_apache_numbers() {
    let set = descriptor_set();
    let expected = [
        ("SystemProperties", "tag", 1),
        ("SystemProperties", "keys", 2),
        ("SystemProperties", "message_id", 3),
        ("SystemProperties", "message_type", 6),
        ("SystemProperties", "delivery_timestamp", 11),
        ("SystemProperties", "receipt_handle", 12),
        ("SystemProperties", "delivery_attempt", 16),
        ("SystemProperties", "message_group", 17),
        ("Message", "user_properties", 2),
        ("Message", "body", 4),
        ("MessageQueue", "accept_message_types", 5),
        ("ReceiveMessageRequest", "invisible_duration", 5),
        ("ReceiveMessageRequest", "long_polling_timeout", 7),
        ("ReceiveMessageResponse", "delivery_timestamp", 3),
        ("TelemetryCommand", "settings", 2),
        (
            "TelemetryCommand",
            "recover_orphaned_transaction_command",
            5,
        ),
        ("Settings", "backoff_policy", 3),
        ("Settings", "subscription", 6),
        ("Subscription", "fifo", 3),
        ("EndTransactionRequest", "resolution", 4),
        ("ChangeInvisibleDurationResponse", "receipt_handle", 2),
    ];
    for (message_name, field, number) in expected {
        assert_eq!(
            field_number(&set, message_name, field),
            number,
            "{message_name}.{field}"
        );
    }
}

#[test]
fn service_methods_keep_apache_names() {
    let set = descriptor_set();
    let service = set
        .file
        .iter()
        .flat_map(|file| file.service.iter())
        .find(|service| service.name() == "MessagingService")
        .expect("MessagingService");
    let methods: Vec<&str> = service.method.iter().map(|m| m.name()).collect();
    for name in [
        "QueryRoute",
        "Heartbeat",
        "SendMessage",
        "QueryAssignment",
        "ReceiveMessage",
        "AckMessage",
        "ForwardMessageToDeadLetterQueue",
        "EndTransaction",
        "Telemetry",
        "NotifyClientTermination",
        "ChangeInvisibleDuration",
    ] {
        assert!(methods.contains(&name), "{name} missing from {methods:?}");
    }
}

#[test]
fn codes_keep_apache_values() {
    assert_eq!(v2::Code::Ok as i32, 20000);
    assert_eq!(v2::Code::BadRequest as i32, 40000);
    assert_eq!(v2::Code::InvalidReceiptHandle as i32, 40013);
    assert_eq!(v2::Code::Unauthorized as i32, 40100);
    assert_eq!(v2::Code::Forbidden as i32, 40300);
    assert_eq!(v2::Code::TopicNotFound as i32, 40402);
    assert_eq!(v2::Code::MessageNotFound as i32, 40401);
    assert_eq!(v2::Code::NotImplemented as i32, 50100);
}

#[test]
fn a_message_encodes_as_apache_clients_write_it() {
    let message = v2::Message {
        topic: Some(v2::Resource {
            resource_namespace: String::new(),
            name: "T".into(),
        }),
        system_properties: Some(v2::SystemProperties {
            message_id: "ID".into(),
            ..Default::default()
        }),
        body: b"b".to_vec().into(),
        ..Default::default()
    };
    // topic: field 1 (0x0a) holding Resource.name, field 2 (0x12); system_properties: field 3
    // (0x1a) holding message_id, field 3; body: field 4 (0x22).
    let expected = [
        0x0a, 0x03, 0x12, 0x01, b'T', 0x1a, 0x04, 0x1a, 0x02, b'I', b'D', 0x22, 0x01, b'b',
    ];
    assert_eq!(message.encode_to_vec(), expected);
    assert_eq!(v2::Message::decode(&expected[..]).expect("decode"), message);
}
