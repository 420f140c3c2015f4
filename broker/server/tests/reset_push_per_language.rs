//! RESET_CONSUMER_CLIENT_OFFSET (220) pushes carry the offset table in the form each member's
//! language reads: an array of entries for the C++ client, fastjson's map for Java.

mod common;

use bytes::Bytes;
use common::{ext, test_config, Client, TestBroker};
use quiver_protocol::body::ResetOffsetBody;
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;

/// Sends a heartbeat for group RG tagged with `language` and waits for its answer.
async fn join(client: &mut Client, client_id: &str, language: &str) {
    let body = format!(
        r#"{{"clientID":"{client_id}","consumerDataSet":[{{"consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","consumeType":"CONSUME_PASSIVELY","groupName":"RG","messageModel":"CLUSTERING",
        "subscriptionDataSet":[{{"subString":"*","subVersion":1,"topic":"Rst"}}]}}],"producerDataSet":[]}}"#
    );
    let mut heartbeat =
        RemotingCommand::request(request::HEART_BEAT, Default::default()).with_opaque(900);
    heartbeat.language = language.to_string();
    client.write(&heartbeat.with_body(Bytes::from(body))).await;
    loop {
        let answer = client.read().await.expect("heartbeat answered");
        if answer.is_response() && answer.opaque == 900 {
            assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
            return;
        }
    }
}

async fn reset_push(client: &mut Client) -> RemotingCommand {
    loop {
        let command = client.read().await.expect("reset push");
        if command.code == request::RESET_CONSUMER_CLIENT_OFFSET {
            return command;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_push_is_encoded_for_each_members_language() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut admin = broker.client().await;
    let created = admin.create_topic("Rst", 2).await;
    assert_eq!(created.code, response::SUCCESS);
    for i in 0..3 {
        admin.send("Rst", 0, &format!("m{i}"), "A").await;
    }

    let mut cpp = broker.client().await;
    let mut java = broker.client().await;
    join(&mut cpp, "cpp-member", "CPP").await;
    join(&mut java, "java-member", "JAVA").await;

    let reset = admin
        .call(
            request::INVOKE_BROKER_TO_RESET_OFFSET,
            ext(&[
                ("topic", "Rst"),
                ("group", "RG"),
                ("timestamp", "-1"),
                ("isForce", "true"),
            ]),
            Bytes::new(),
        )
        .await;
    assert_eq!(reset.code, response::SUCCESS, "{:?}", reset.remark);
    let expected = ResetOffsetBody::decode(&reset.body).expect("reset answer decodes");
    assert_eq!(expected.offset_table.len(), 2);
    assert_eq!(expected.offset_table.values().copied().max(), Some(3));

    let cpp_push = reset_push(&mut cpp).await;
    let cpp_json: serde_json::Value = serde_json::from_slice(&cpp_push.body).unwrap();
    let entries = cpp_json["offsetTable"]
        .as_array()
        .unwrap_or_else(|| panic!("C++ form is an array: {cpp_json}"));
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().any(|e| e["topic"] == "Rst"
        && e["queueId"] == 0
        && e["offset"] == 3
        && e["brokerName"] == "broker-0"));
    assert_eq!(ResetOffsetBody::decode(&cpp_push.body).unwrap(), expected);

    let java_push = reset_push(&mut java).await;
    assert_eq!(java_push.body, expected.encode());
    assert_eq!(ResetOffsetBody::decode(&java_push.body).unwrap(), expected);

    broker.stop().await;
}
