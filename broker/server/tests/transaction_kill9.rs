//! Half and op state survive kill -9: after a restart, a half message committed is delivered
//! once, one rolled back before the kill is never delivered (a late commit does nothing),
//! and one left unsettled is checked back with its producer group.

mod common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{
    end_fields, end_fields_at, ext, ext_u64, producer_heartbeat, pulled_bodies, send_half, Client,
};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::CheckTransactionStateRequestHeader;
use quiver_protocol::message::sys_flag::{TRANSACTION_COMMIT, TRANSACTION_ROLLBACK};
use quiver_protocol::RemotingCommand;

/// The binary over `data_dir` with this transaction timeout, checking every 100 ms.
async fn start(data_dir: &Path, log: &Path, transaction_timeout_ms: u64) -> common::BrokerProcess {
    let timeout = transaction_timeout_ms.to_string();
    let extra = [
        "--transaction-timeout-ms",
        &timeout,
        "--transaction-check-interval-ms",
        "100",
    ];
    common::start_binary(data_dir, log, &extra).await
}

async fn topic_messages(addr: std::net::SocketAddr) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    let mut bodies = pulled_bodies(&client.pull("G", "Tx", 0, 0, 0, None).await);
    bodies.sort();
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_and_op_state_survive_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let logs = tempfile::tempdir().unwrap();
    // Before the kill nothing is checked back: every half message is as the kill left it.
    let mut first = start(data.path(), &logs.path().join("first.log"), 600_000).await;
    let mut client = Client::connect(first.addr).await;
    let rolled_back = send_half(&mut client, "P", "Tx", 0, "rolled-back", &[]).await;
    let ended = client
        .call(
            request::END_TRANSACTION,
            end_fields("P", &rolled_back, TRANSACTION_ROLLBACK, false),
            Bytes::new(),
        )
        .await;
    assert_eq!(ended.code, response::SUCCESS, "{ended:?}");
    let unsettled = send_half(&mut client, "P", "Tx", 0, "checked-back", &[]).await;
    // Immune to checks for an hour: only this test's END settles it.
    let to_commit = send_half(
        &mut client,
        "P",
        "Tx",
        0,
        "committed",
        &[("CHECK_IMMUNITY_TIME_IN_SECONDS", "3600")],
    )
    .await;
    for half in [&unsettled, &to_commit] {
        assert_eq!(half.code, response::SUCCESS, "{half:?}");
    }
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(first);

    let second = start(data.path(), &logs.path().join("second.log"), 1_000).await;
    let mut producer = Client::connect(second.addr).await;
    producer_heartbeat(&mut producer, "producer-1", "P").await;
    let ended = producer
        .call(
            request::END_TRANSACTION,
            end_fields("P", &to_commit, TRANSACTION_COMMIT, false),
            Bytes::new(),
        )
        .await;
    assert_eq!(ended.code, response::SUCCESS, "{ended:?}");
    // The rollback's op record survived: a late commit does nothing.
    let late = producer
        .call(
            request::END_TRANSACTION,
            end_fields("P", &rolled_back, TRANSACTION_COMMIT, false),
            Bytes::new(),
        )
        .await;
    assert_eq!(late.code, response::SUCCESS, "{late:?}");

    let check = loop {
        let command = producer.read().await.expect("connection open");
        if command.code == request::CHECK_TRANSACTION_STATE && !command.is_response() {
            break command;
        }
    };
    let header = CheckTransactionStateRequestHeader::from_command(&check).unwrap();
    let (record, _) = quiver_protocol::record::decode(&check.body).unwrap();
    assert_eq!(&record.body[..], b"checked-back");
    let answer = end_fields_at(
        "P",
        header.tran_state_table_offset as u64,
        header.commit_log_offset as u64,
        TRANSACTION_COMMIT,
        true,
    );
    producer
        .write(&RemotingCommand::request(request::END_TRANSACTION, answer).into_oneway())
        .await;

    let addr = second.addr;
    common::wait_for(
        "both commits stored",
        Duration::from_secs(20),
        || async move { topic_messages(addr).await.len() >= 2 },
    )
    .await;
    assert_eq!(topic_messages(addr).await, ["checked-back", "committed"]);
    let max = producer
        .call(
            request::GET_MAX_OFFSET,
            ext(&[("topic", "Tx"), ("queueId", "0")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(ext_u64(&max, "offset"), 2, "each delivered once");
    drop(second);
}
