//! Frames captured from the real Apache RocketMQ C++ client (PyPI rocketmq==0.4.4) by
//! tests/capture/capture.py decode into the typed headers and bodies with the right values.

use std::path::PathBuf;

use bytes::BytesMut;
use quiver_protocol::body::{
    ConsumeFromWhere, ConsumeType, HeartbeatData, LockBatchRequestBody, MessageModel,
};
use quiver_protocol::code::request;
use quiver_protocol::header::{
    ConsumerSendMsgBackRequestHeader, GetConsumerListByGroupRequestHeader,
    GetMaxOffsetRequestHeader, GetRouteInfoRequestHeader, PullMessageRequestHeader,
    QueryConsumerOffsetRequestHeader, SendMessageRequestHeader, UnregisterClientRequestHeader,
    UpdateConsumerOffsetRequestHeader,
};
use quiver_protocol::message::{decode_batch, encode_batch};
use quiver_protocol::{frame, RemotingCommand, SerializeType};

fn frames_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/frames")
}

/// Decodes one captured file, checking it holds exactly one frame.
fn captured(name: &str) -> RemotingCommand {
    let bytes = std::fs::read(frames_dir().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut buf = BytesMut::from(&bytes[..]);
    let command = frame::decode(&mut buf)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .unwrap_or_else(|| panic!("{name}: incomplete frame"));
    assert!(buf.is_empty(), "{name}: bytes left after the frame");
    assert_eq!(command.language, "CPP", "{name}");
    assert_eq!(command.version, 63, "{name}");
    assert_eq!(command.serialize_type, SerializeType::Json, "{name}");
    assert!(!command.is_response(), "{name}");
    command
}

/// Every capture of a request kind, in file order.
fn all_captured(prefix: &str) -> Vec<RemotingCommand> {
    let mut names: Vec<String> = std::fs::read_dir(frames_dir())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with(prefix) && name.ends_with(".bin"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no captures named {prefix}*");
    names.iter().map(|name| captured(name)).collect()
}

#[test]
fn every_captured_frame_decodes_and_re_encodes_identically() {
    let mut count = 0;
    for entry in std::fs::read_dir(frames_dir()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let command = captured(&name);
        let mut buf = BytesMut::new();
        frame::encode(&command, &mut buf).unwrap();
        let again = frame::decode(&mut buf).unwrap().unwrap();
        assert_eq!(again, command, "{name}");
        count += 1;
    }
    assert!(count >= 20, "only {count} captured frames");
}

#[test]
fn send_message_uses_long_names_with_numbers_and_strings_mixed() {
    let command = captured("send_message_0.bin");
    assert_eq!(command.code, request::SEND_MESSAGE);
    // The C++ client sends numbers as JSON numbers and strings alike; both read as strings.
    assert_eq!(command.ext("defaultTopicQueueNums"), Some("4"));
    assert_eq!(command.ext("reconsumeTimes"), Some("0"));
    let header = SendMessageRequestHeader::from_request(&command).unwrap();
    assert_eq!(header.producer_group, "GroupCaptureProducer");
    assert_eq!(header.topic, "TopicTest");
    assert_eq!(header.default_topic, "TBW102");
    assert_eq!(header.default_topic_queue_nums, 4);
    assert_eq!(header.queue_id, 0);
    assert_eq!(header.sys_flag, 0);
    assert_eq!(header.flag, 0);
    assert!(header.born_timestamp > 1_700_000_000_000);
    assert_eq!(header.batch, Some(false), "C++ sends batch as \"0\"");
    assert_eq!(header.unit_mode, Some(false));
    assert_eq!(header.reconsume_times, Some(0));
    assert_eq!(header.max_reconsume_times, None);
    let properties = header.properties.unwrap();
    for pair in [
        "TAGS\u{1}TagA\u{2}",
        "KEYS\u{1}key-1\u{2}",
        "custom\u{1}value\u{2}",
        "WAIT\u{1}true\u{2}",
    ] {
        assert!(properties.contains(pair), "{properties:?} lacks {pair:?}");
    }
    assert!(properties.contains("UNIQ_KEY\u{1}"));
    assert_eq!(&command.body[..], b"hello from the C++ client");

    let oneway = captured("send_message_1.bin");
    let header = SendMessageRequestHeader::from_request(&oneway).unwrap();
    assert_eq!(header.topic, "TopicTest");
    assert_eq!(&oneway.body[..], b"hello from the C++ client");
}

#[test]
fn heartbeat_body_has_int_enums_and_string_sub_version() {
    let heartbeats: Vec<HeartbeatData> = all_captured("heart_beat_")
        .iter()
        .map(|command| {
            assert_eq!(command.code, request::HEART_BEAT);
            HeartbeatData::decode(&command.body).unwrap()
        })
        .collect();
    for heartbeat in &heartbeats {
        assert!(
            heartbeat.client_id.ends_with("-127.0.0.1@DEFAULT"),
            "{}",
            heartbeat.client_id
        );
    }
    assert!(
        heartbeats.iter().any(|heartbeat| heartbeat
            .producer_data_set
            .iter()
            .any(|producer| producer.group_name == "GroupCaptureProducer")),
        "the producer group is announced"
    );
    let heartbeat = heartbeats
        .iter()
        .find(|heartbeat| !heartbeat.consumer_data_set.is_empty())
        .expect("a consumer heartbeat");
    assert_eq!(heartbeat.consumer_data_set.len(), 1);
    let consumer = &heartbeat.consumer_data_set[0];
    assert_eq!(consumer.group_name, "GroupCapture");
    assert_eq!(consumer.consume_type, ConsumeType::ConsumePassively);
    assert_eq!(consumer.message_model, MessageModel::Clustering);
    assert_eq!(consumer.consume_from_where, ConsumeFromWhere::LastOffset);
    assert!(!consumer.unit_mode);
    let retry = &consumer.subscription_data_set[0];
    assert_eq!(retry.topic, "%RETRY%GroupCapture");
    assert_eq!(retry.sub_string, "*");
    assert!(retry.tags_set.is_empty() && retry.code_set.is_empty());
    let topic = &consumer.subscription_data_set[1];
    assert_eq!(topic.topic, "TopicTest");
    assert_eq!(topic.sub_string, "TagA || TagB");
    assert_eq!(topic.tags_set, vec!["TagA".to_owned(), "TagB".to_owned()]);
    // The C++ client sends zeros here instead of tag hash codes: the broker must not trust them.
    assert_eq!(topic.code_set, vec![0, 0]);
    assert!(topic.sub_version > 1_700_000_000_000);
    assert_eq!(topic.expression_type, None);

    let both = heartbeats.last().unwrap();
    let groups: Vec<&str> = both
        .consumer_data_set
        .iter()
        .map(|consumer| consumer.group_name.as_str())
        .collect();
    assert_eq!(groups, ["GroupCapture", "GroupCaptureOrderly"]);
}

#[test]
fn pull_message_headers_of_retry_and_topic_queues() {
    let pulls = all_captured("pull_message_");
    assert!(pulls.iter().all(|pull| pull.code == request::PULL_MESSAGE));
    let headers: Vec<PullMessageRequestHeader> = pulls
        .iter()
        .map(|pull| PullMessageRequestHeader::from_command(pull).unwrap())
        .collect();
    let retry = headers
        .iter()
        .find(|header| header.topic == "%RETRY%GroupCapture")
        .expect("a pull of the retry topic");
    assert_eq!(retry.subscription.as_deref(), Some("*"));
    let topic = headers
        .iter()
        .find(|header| header.topic == "TopicTest")
        .expect("a pull of TopicTest");
    assert_eq!(topic.subscription.as_deref(), Some("TagA || TagB"));
    for header in &headers {
        assert_eq!(header.consumer_group, "GroupCapture");
        assert_eq!(header.queue_offset, 0);
        assert_eq!(header.max_msg_nums, 32);
        assert_eq!(header.sys_flag, 6);
        assert!(header.has_suspend() && header.has_subscription());
        assert!(!header.has_commit_offset());
        assert_eq!(header.commit_offset, -1);
        assert_eq!(header.suspend_timeout_millis, 15_000);
        assert!(header.sub_version > 1_700_000_000_000);
        assert_eq!(header.expression_type, None);
        assert!((0..4).contains(&header.queue_id));
    }
}

#[test]
fn offset_queries_and_commits() {
    for command in all_captured("query_consumer_offset_") {
        assert_eq!(command.code, request::QUERY_CONSUMER_OFFSET);
        let header = QueryConsumerOffsetRequestHeader::from_command(&command).unwrap();
        assert_eq!(header.consumer_group, "GroupCapture");
        assert!(header.topic == "TopicTest" || header.topic == "%RETRY%GroupCapture");
        assert!((0..4).contains(&header.queue_id));
    }
    for command in all_captured("get_max_offset_") {
        assert_eq!(command.code, request::GET_MAX_OFFSET);
        let header = GetMaxOffsetRequestHeader::from_command(&command).unwrap();
        assert_eq!(header.topic, "TopicTest");
        assert!((0..4).contains(&header.queue_id));
    }
    let commit = captured("update_consumer_offset_0.bin");
    assert_eq!(commit.code, request::UPDATE_CONSUMER_OFFSET);
    let header = UpdateConsumerOffsetRequestHeader::from_command(&commit).unwrap();
    assert_eq!(
        header,
        UpdateConsumerOffsetRequestHeader {
            consumer_group: "GroupCapture".into(),
            topic: "TopicTest".into(),
            queue_id: 0,
            commit_offset: 1,
        }
    );
}

#[test]
fn routing_and_membership_requests() {
    let topics: Vec<String> = all_captured("get_routeinfo_by_topic_")
        .iter()
        .map(|command| {
            assert_eq!(command.code, request::GET_ROUTEINFO_BY_TOPIC);
            GetRouteInfoRequestHeader::from_command(command)
                .unwrap()
                .topic
        })
        .collect();
    assert!(topics.contains(&"TopicTest".to_owned()));
    assert!(topics.contains(&"%RETRY%GroupCapture".to_owned()));
    for command in all_captured("get_consumer_list_by_group_") {
        assert_eq!(command.code, request::GET_CONSUMER_LIST_BY_GROUP);
        let header = GetConsumerListByGroupRequestHeader::from_command(&command).unwrap();
        assert_eq!(header.consumer_group, "GroupCapture");
    }
}

#[test]
fn orderly_consumer_lock_and_unlock_bodies() {
    for command in all_captured("lock_batch_mq_") {
        assert_eq!(command.code, request::LOCK_BATCH_MQ);
        assert!(command
            .ext_fields
            .keys()
            .all(|key| { ["AccessKey", "OnsChannel", "Signature"].contains(&key) }));
        let body = LockBatchRequestBody::decode(&command.body).unwrap();
        assert_eq!(body.consumer_group, "GroupCaptureOrderly");
        assert!(body.client_id.ends_with("@DEFAULT"));
        assert!(!body.only_this_broker);
        assert_eq!(body.mq_set.len(), 1);
        assert_eq!(body.mq_set[0].broker_name, "broker-a");
        assert!(body.mq_set[0].queue_id < 4);
    }
    let unlock = captured("unlock_batch_mq_0.bin");
    assert_eq!(unlock.code, request::UNLOCK_BATCH_MQ);
    let body = LockBatchRequestBody::decode(&unlock.body).unwrap();
    assert_eq!(body.mq_set.len(), 7);
    assert_eq!(
        body.mq_set
            .iter()
            .filter(|queue| queue.topic == "TopicTest")
            .count(),
        4
    );
}

#[test]
fn send_back_after_reconsume_later() {
    let command = captured("consumer_send_msg_back_0.bin");
    assert_eq!(command.code, request::CONSUMER_SEND_MSG_BACK);
    let header = ConsumerSendMsgBackRequestHeader::from_command(&command).unwrap();
    assert_eq!(header.group, "GroupCapture");
    // The capture's fake broker delivered the message at CommitLog offset 0.
    assert_eq!(header.offset, 0);
    assert_eq!(header.delay_level, 0);
    assert_eq!(header.origin_msg_id, None);
    assert_eq!(header.origin_topic, None);
    assert_eq!(header.max_reconsume_times, None);
}

#[test]
fn unregister_sends_the_unused_group_empty() {
    let headers: Vec<UnregisterClientRequestHeader> = all_captured("unregister_client_")
        .iter()
        .map(|command| {
            assert_eq!(command.code, request::UNREGISTER_CLIENT);
            UnregisterClientRequestHeader::from_command(command).unwrap()
        })
        .collect();
    assert!(headers
        .iter()
        .all(|header| header.client_id.ends_with("@DEFAULT")));
    let producer = headers
        .iter()
        .find(|header| header.producer_group.is_some())
        .expect("the producer's unregistration");
    assert_eq!(
        producer.producer_group.as_deref(),
        Some("GroupCaptureProducer")
    );
    assert_eq!(producer.consumer_group, None, "sent as \"\"");
    let mut consumers: Vec<&str> = headers
        .iter()
        .filter_map(|header| header.consumer_group.as_deref())
        .collect();
    consumers.sort_unstable();
    assert_eq!(consumers, ["GroupCapture", "GroupCaptureOrderly"]);
}

#[test]
fn batch_send_is_send_message_with_batch_one_and_a_batch_body() {
    let command = captured("send_message_2.bin");
    assert_eq!(
        command.code,
        request::SEND_MESSAGE,
        "the C++ client never uses 320"
    );
    assert_eq!(command.ext("batch"), Some("1"));
    let header = SendMessageRequestHeader::from_request(&command).unwrap();
    assert!(header.is_batch());
    assert_eq!(header.topic, "TopicTest");
    let messages = decode_batch(&command.body).unwrap();
    assert_eq!(messages.len(), 3);
    for (index, message) in messages.iter().enumerate() {
        assert_eq!(message.flag, 0);
        assert_eq!(message.body, format!("batch body {index}").as_bytes());
        assert!(message.properties.contains("TAGS\u{1}TagB\u{2}"));
        assert!(message
            .properties
            .contains(&format!("KEYS\u{1}batch-{index}\u{2}")));
        assert!(message.properties.contains("UNIQ_KEY\u{1}"));
    }
    assert_eq!(
        encode_batch(&messages),
        command.body,
        "re-encodes byte for byte"
    );
}
