//! Requests the broker relays to a client and answers with the client's answer:
//! GET_CONSUMER_RUNNING_INFO (307), CONSUME_MESSAGE_DIRECTLY (309), and request-reply
//! (SEND_REPLY_MESSAGE 324/325 pushed on as PUSH_REPLY_MESSAGE_TO_CLIENT 326).

mod common;

use bytes::Bytes;
use common::{ext, test_config, v2_send_fields, Client, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::{ExtFields, RemotingCommand};
use quiver_store::record::property;

async fn heartbeat(client: &mut Client, body: String) {
    let joined = client
        .call(request::HEART_BEAT, Default::default(), Bytes::from(body))
        .await;
    assert_eq!(joined.code, response::SUCCESS, "{joined:?}");
}

/// Sends `fields` as `code` from `admin` on another task, and returns that task.
fn call_later(
    mut admin: Client,
    code: i32,
    fields: ExtFields,
    body: Bytes,
) -> tokio::task::JoinHandle<(Client, RemotingCommand)> {
    tokio::spawn(async move {
        let reply = admin.call(code, fields, body).await;
        (admin, reply)
    })
}

/// The next request the broker sends to `client`.
async fn next_request(client: &mut Client) -> RemotingCommand {
    loop {
        let command = client.read().await.expect("a request from the broker");
        if !command.is_response() && !command.is_oneway() {
            return command;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_info_and_direct_consumption_are_relayed_to_the_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut consumer = broker.client().await;
    heartbeat(
        &mut consumer,
        r#"{"clientID":"rc1","consumerDataSet":[{"groupName":"RG","subscriptionDataSet":[{"topic":"Rel","subString":"*"}]}],"producerDataSet":[]}"#.into(),
    )
    .await;

    // 307: the consumer's answer comes back as it is.
    let admin = broker.client().await;
    let info = ext(&[
        ("consumerGroup", "RG"),
        ("clientId", "rc1"),
        ("jstackEnable", "false"),
    ]);
    let pending = call_later(
        admin,
        request::GET_CONSUMER_RUNNING_INFO,
        info,
        Bytes::new(),
    );
    let asked = next_request(&mut consumer).await;
    assert_eq!(asked.code, request::GET_CONSUMER_RUNNING_INFO);
    assert_eq!(asked.ext("clientId"), Some("rc1"));
    let answer = asked
        .response_to(response::SUCCESS, None)
        .with_body(Bytes::from_static(br#"{"properties":{"x":"1"}}"#));
    consumer.write(&answer).await;
    let (mut admin, reply) = pending.await.unwrap();
    assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
    assert_eq!(&reply.body[..], br#"{"properties":{"x":"1"}}"#);

    // 309: the stored message goes to the consumer with the broker's name.
    let sent = admin.send("Rel", 0, "direct-body", "A").await;
    let msg_id = sent.ext("msgId").unwrap().to_owned();
    let direct = ext(&[
        ("consumerGroup", "RG"),
        ("clientId", "rc1"),
        ("msgId", &msg_id),
    ]);
    let pending = call_later(
        admin,
        request::CONSUME_MESSAGE_DIRECTLY,
        direct,
        Bytes::new(),
    );
    let asked = next_request(&mut consumer).await;
    assert_eq!(asked.code, request::CONSUME_MESSAGE_DIRECTLY);
    assert!(asked.ext("brokerName").is_some_and(|name| !name.is_empty()));
    let record = quiver_store::record::decode_all(&asked.body).unwrap();
    assert_eq!(&record[0].body[..], b"direct-body");
    let result =
        br#"{"consumeResult":"CR_SUCCESS","order":false,"autoCommit":true,"spentTimeMills":1}"#;
    consumer
        .write(
            &asked
                .response_to(response::SUCCESS, None)
                .with_body(Bytes::from_static(result)),
        )
        .await;
    let (mut admin, reply) = pending.await.unwrap();
    assert_eq!(reply.code, response::SUCCESS);
    assert_eq!(&reply.body[..], result);

    // A client that is not online, and an id of no stored message, are refused.
    let offline = ext(&[("consumerGroup", "RG"), ("clientId", "ghost")]);
    let refused = admin
        .call(request::GET_CONSUMER_RUNNING_INFO, offline, Bytes::new())
        .await;
    assert_eq!(refused.code, response::SYSTEM_ERROR);
    assert!(refused.remark.unwrap().contains("not online"));
    let nowhere = ext(&[
        ("consumerGroup", "RG"),
        ("clientId", "rc1"),
        ("msgId", "7F00000100002A9F0000000000FFFFFF"),
    ]);
    let refused = admin
        .call(request::CONSUME_MESSAGE_DIRECTLY, nowhere, Bytes::new())
        .await;
    assert_eq!(refused.code, response::SYSTEM_ERROR, "{refused:?}");
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_is_pushed_to_the_requesting_producer() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut requester = broker.client().await;
    heartbeat(
        &mut requester,
        r#"{"clientID":"req-1","consumerDataSet":[],"producerDataSet":[{"groupName":"ReqGroup"}]}"#
            .into(),
    )
    .await;
    let properties =
        "CORRELATION_ID\u{1}corr-7\u{2}REPLY_TO_CLIENT\u{1}req-1\u{2}MSG_TYPE\u{1}reply\u{2}";
    let replier = broker.client().await;
    for (code, fields) in [
        (request::SEND_REPLY_MESSAGE, v1_fields(properties)),
        (
            request::SEND_REPLY_MESSAGE_V2,
            v2_send_fields("DefaultCluster_REPLY_TOPIC", "0", "0", properties, false),
        ),
    ] {
        let replier_now = broker.client().await;
        let pending = call_later(replier_now, code, fields, Bytes::from_static(b"the answer"));
        let pushed = next_request(&mut requester).await;
        assert_eq!(pushed.code, request::PUSH_REPLY_MESSAGE_TO_CLIENT);
        let pushed_properties = pushed.ext("properties").unwrap();
        assert_eq!(
            property(pushed_properties, "CORRELATION_ID"),
            Some("corr-7")
        );
        assert!(property(pushed_properties, "PUSH_REPLY_TIME").is_some());
        assert!(pushed.ext("bornHost").is_some() && pushed.ext("storeHost").is_some());
        assert_eq!(&pushed.body[..], b"the answer");
        requester
            .write(&pushed.response_to(response::SUCCESS, None))
            .await;
        let (_, reply) = pending.await.unwrap();
        assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
        assert_eq!(reply.ext("msgId"), Some("0"));
    }

    // No such requester, and no requester named at all.
    let mut replier = replier;
    let unknown = "REPLY_TO_CLIENT\u{1}req-404\u{2}";
    let refused = replier
        .call(
            request::SEND_REPLY_MESSAGE,
            v1_fields(unknown),
            Bytes::from_static(b"x"),
        )
        .await;
    assert_eq!(refused.code, response::SYSTEM_ERROR);
    assert!(refused.remark.unwrap().contains("not found"));
    let refused = replier
        .call(
            request::SEND_REPLY_MESSAGE,
            v1_fields(""),
            Bytes::from_static(b"x"),
        )
        .await;
    assert_eq!(refused.code, response::SYSTEM_ERROR);
    assert!(refused.remark.unwrap().contains("REPLY_TO_CLIENT"));
    broker.stop().await;
}

fn v1_fields(properties: &str) -> ExtFields {
    let born = quiver_broker::now_ms().to_string();
    ext(&[
        ("producerGroup", "Replier"),
        ("topic", "DefaultCluster_REPLY_TOPIC"),
        ("defaultTopic", "TBW102"),
        ("defaultTopicQueueNums", "4"),
        ("queueId", "0"),
        ("sysFlag", "0"),
        ("bornTimestamp", &born),
        ("flag", "0"),
        ("properties", properties),
        ("reconsumeTimes", "0"),
    ])
}
