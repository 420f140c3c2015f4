use bytes::Bytes;
use quiver_protocol::acl::Credentials;
use quiver_protocol::ExtFields;

use super::*;

const FILE: &str = r#"
globalWhiteRemoteAddresses:
  - 10.0.0.*
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
  - accessKey: consumer1
    secretKey: consumer-secret
    defaultTopicPerm: SUB
    defaultGroupPerm: DENY
    topicPerms:
      - Secret=DENY
    groupPerms:
      - Readers=SUB
  - accessKey: operator1
    secretKey: operator-secret
    whiteRemoteAddress: 192.168.5.5
    admin: true
"#;

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn signed(code: i32, fields: &[(&str, &str)], key: &str, secret: &str) -> RemotingCommand {
    let mut req = RemotingCommand::request(code, ext(fields)).with_body(Bytes::from_static(b"b"));
    Credentials::new(key, secret).sign(&mut req);
    req
}

fn outcome(req: &RemotingCommand, remote: &str) -> Result<(), (RefusedBecause, String)> {
    let accounts = Accounts::parse(FILE).unwrap();
    check(&accounts, req, remote.parse().unwrap())
}

const HERE: &str = "127.0.0.1";

#[test]
fn a_signed_send_with_pub_passes() {
    let req = signed(
        request::SEND_MESSAGE,
        &[("topic", "Orders")],
        "producer1",
        "producer-secret",
    );
    assert_eq!(outcome(&req, HERE), Ok(()));
    let v2 = signed(
        request::SEND_MESSAGE_V2,
        &[("b", "Orders")],
        "producer1",
        "producer-secret",
    );
    assert_eq!(outcome(&v2, HERE), Ok(()));
}

#[test]
fn each_refusal_names_the_account_resource_and_permission() {
    let cases = [
        (
            RemotingCommand::request(request::SEND_MESSAGE, ext(&[("topic", "Orders")])),
            RefusedBecause::NoSignature,
            "no signature",
        ),
        (
            signed(request::SEND_MESSAGE, &[("topic", "Orders")], "nobody12", "whatever1"),
            RefusedBecause::UnknownAccount,
            "\"nobody12\"",
        ),
        (
            signed(request::SEND_MESSAGE, &[("topic", "Orders")], "producer1", "wrong-secret"),
            RefusedBecause::SignatureMismatch,
            "signature mismatch for access key \"producer1\"",
        ),
        (
            signed(request::SEND_MESSAGE, &[("topic", "Other")], "producer1", "producer-secret"),
            RefusedBecause::NoPermission,
            "access key \"producer1\" has no PUB permission on topic \"Other\"",
        ),
        (
            signed(
                request::PULL_MESSAGE,
                &[("topic", "Orders"), ("consumerGroup", "Writers")],
                "consumer1",
                "consumer-secret",
            ),
            RefusedBecause::NoPermission,
            "has no SUB permission on group \"Writers\"",
        ),
        (
            signed(request::PULL_MESSAGE, &[("topic", "Secret"), ("consumerGroup", "Readers")], "consumer1", "consumer-secret"),
            RefusedBecause::NoPermission,
            "has no SUB permission on topic \"Secret\"",
        ),
        (
            signed(request::DELETE_TOPIC_IN_BROKER, &[("topic", "Orders")], "consumer1", "consumer-secret"),
            RefusedBecause::AdminRequired,
            "request code 215 (DELETE_TOPIC_IN_BROKER) needs an admin account; access key \"consumer1\" is not admin",
        ),
    ];
    for (req, because, remark) in cases {
        let (got, text) = outcome(&req, HERE).unwrap_err();
        assert_eq!(got, because, "{text}");
        assert!(text.contains(remark), "{text} lacks {remark}");
    }
}

#[test]
fn a_signature_without_its_access_key_or_the_reverse_is_unsigned() {
    let mut req = signed(
        request::SEND_MESSAGE,
        &[("topic", "Orders")],
        "producer1",
        "producer-secret",
    );
    req.ext_fields.remove(signing::SIGNATURE);
    assert_eq!(
        outcome(&req, HERE).unwrap_err().0,
        RefusedBecause::NoSignature
    );
}

#[test]
fn white_lists_skip_the_signature() {
    let unsigned =
        RemotingCommand::request(request::DELETE_TOPIC_IN_BROKER, ext(&[("topic", "T")]));
    assert_eq!(outcome(&unsigned, "10.0.0.9"), Ok(()));
    let mut operator = unsigned.clone();
    operator.ext_fields.insert(signing::ACCESS_KEY, "operator1");
    assert_eq!(outcome(&operator, "192.168.5.5"), Ok(()));
    assert!(outcome(&operator, "192.168.5.6").is_err());
}

#[test]
fn admins_without_perms_may_do_anything() {
    for (code, fields) in [
        (request::UPDATE_AND_CREATE_TOPIC, &[("topic", "New")][..]),
        (request::SEND_MESSAGE, &[("topic", "Anything")][..]),
        (
            request::PULL_MESSAGE,
            &[("topic", "Anything"), ("consumerGroup", "Any")][..],
        ),
    ] {
        let req = signed(code, fields, "operator1", "operator-secret");
        assert_eq!(outcome(&req, HERE), Ok(()), "code {code}");
    }
}

#[test]
fn heartbeats_need_sub_on_the_group_and_each_topic() {
    let body = |group: &str, topic: &str| {
        format!(
            r#"{{"clientID":"c","consumerDataSet":[{{"groupName":"{group}","subscriptionDataSet":[{{"topic":"{topic}","subString":"*"}},{{"topic":"%RETRY%{group}","subString":"*"}}]}}],"producerDataSet":[]}}"#
        )
    };
    let heartbeat = |group: &str, topic: &str| {
        let mut req = RemotingCommand::request(request::HEART_BEAT, ExtFields::default())
            .with_body(Bytes::from(body(group, topic)));
        Credentials::new("consumer1", "consumer-secret").sign(&mut req);
        req
    };
    assert_eq!(outcome(&heartbeat("Readers", "Orders"), HERE), Ok(()));
    let (_, text) = outcome(&heartbeat("Readers", "Secret"), HERE).unwrap_err();
    assert!(text.contains("topic \"Secret\""), "{text}");
    let (_, text) = outcome(&heartbeat("Others", "Orders"), HERE).unwrap_err();
    assert!(text.contains("group \"Others\""), "{text}");
}

#[test]
fn a_send_to_a_retry_topic_needs_sub_on_the_group() {
    let req = signed(
        request::SEND_MESSAGE,
        &[("topic", "%RETRY%Readers")],
        "consumer1",
        "consumer-secret",
    );
    assert_eq!(outcome(&req, HERE), Ok(()));
    let back = signed(
        request::CONSUMER_SEND_MSG_BACK,
        &[("group", "Readers"), ("originTopic", "Orders")],
        "consumer1",
        "consumer-secret",
    );
    assert_eq!(outcome(&back, HERE), Ok(()));
}

#[test]
fn every_admin_code_the_broker_serves_needs_admin() {
    for code in [
        request::UPDATE_AND_CREATE_TOPIC,
        request::DELETE_TOPIC_IN_BROKER,
        request::DELETE_TOPIC_IN_NAMESRV,
        request::UPDATE_BROKER_CONFIG,
        request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
        request::DELETE_SUBSCRIPTIONGROUP,
        request::INVOKE_BROKER_TO_RESET_OFFSET,
        request::CLONE_GROUP_OFFSET,
        request::CONSUME_MESSAGE_DIRECTLY,
    ] {
        assert!(needs_admin(code), "{code}");
    }
    for code in [
        request::SEND_MESSAGE,
        request::PULL_MESSAGE,
        request::GET_ROUTEINFO_BY_TOPIC,
    ] {
        assert!(!needs_admin(code), "{code}");
    }
}

#[test]
fn a_bad_file_keeps_the_accounts_in_force_and_counts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plain_acl.yml");
    std::fs::write(&path, FILE).unwrap();
    let acl = Acl::load(&path).unwrap();
    assert_eq!(acl.account_count(), 3);
    std::fs::write(&path, "accounts: [ {accessKey: x} ]\n").unwrap();
    acl.reload_if_changed();
    assert_eq!(acl.account_count(), 3);
    assert_eq!(acl.reload_counts(), (0, 1));
    // The same bad file is not read (nor counted) again until it changes.
    acl.reload_if_changed();
    assert_eq!(acl.reload_counts(), (0, 1));
    std::fs::write(
        &path,
        "accounts:\n  - accessKey: onlyone\n    secretKey: onlyone-secret\n",
    )
    .unwrap();
    acl.reload_if_changed();
    assert_eq!((acl.account_count(), acl.reload_counts()), (1, (1, 1)));
    assert!(Acl::load(&dir.path().join("missing.yml")).is_err());
}

#[test]
fn locks_need_the_group_and_replies_only_a_signature() {
    let lock = |group: &str| {
        let body = format!(r#"{{"consumerGroup":"{group}","clientId":"c","mqSet":[]}}"#);
        let mut req = RemotingCommand::request(request::LOCK_BATCH_MQ, ExtFields::default())
            .with_body(Bytes::from(body));
        Credentials::new("consumer1", "consumer-secret").sign(&mut req);
        req
    };
    assert_eq!(outcome(&lock("Readers"), HERE), Ok(()));
    let (_, text) = outcome(&lock("Others"), HERE).unwrap_err();
    assert!(text.contains("group \"Others\""), "{text}");
    let reply = signed(
        request::SEND_REPLY_MESSAGE_V2,
        &[("b", "DefaultCluster_REPLY_TOPIC")],
        "consumer1",
        "consumer-secret",
    );
    assert_eq!(outcome(&reply, HERE), Ok(()));
}
