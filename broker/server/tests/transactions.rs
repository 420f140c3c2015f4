//! Transactional messages over raw frames, as a stock producer sends them: half messages are
//! invisible until committed, END_TRANSACTION commits or rolls back once, and the check-back
//! service asks the producer group, re-putting each half message with its check count until
//! the limit discards it to TRANS_CHECK_MAX_TIME_TOPIC.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{
    end_fields, end_fields_at, ext, ext_u64, producer_heartbeat, pulled_bodies, pulled_records,
    send_half, test_config, Client, TestBroker,
};
use quiver_broker::transaction::{
    CHECK_MAX_TIME_TOPIC, HALF_TOPIC, OP_REMOVE_TAG, OP_TOPIC, SYSTEM_GROUP,
};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::CheckTransactionStateRequestHeader;
use quiver_protocol::message::sys_flag;
use quiver_protocol::record::{property, Record};
use quiver_protocol::RemotingCommand;

const COMMIT: i32 = sys_flag::TRANSACTION_COMMIT;
const ROLLBACK: i32 = sys_flag::TRANSACTION_ROLLBACK;

async fn end(client: &mut Client, fields: quiver_protocol::ExtFields) -> RemotingCommand {
    client
        .call(request::END_TRANSACTION, fields, Bytes::new())
        .await
}

async fn max_offset(client: &mut Client, topic: &str, queue_id: u32) -> u64 {
    let reply = client
        .call(
            request::GET_MAX_OFFSET,
            ext(&[("topic", topic), ("queueId", &queue_id.to_string())]),
            Bytes::new(),
        )
        .await;
    ext_u64(&reply, "offset")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_rollback_and_duplicate_ends_act_once_and_halves_stay_invisible() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    // No check-back during this test: every outcome comes from an END.
    config.transaction_timeout_ms = 600_000;
    let broker = TestBroker::start(config).await;
    let mut client = broker.client().await;

    let half = send_half(&mut client, "P", "Tx", 1, "h0", &[]).await;
    assert_eq!(half.code, response::SUCCESS, "{half:?}");
    assert_eq!(ext_u64(&half, "queueId"), 1, "the queue of the real topic");
    assert_eq!(ext_u64(&half, "queueOffset"), 0, "the half queue's offset");
    assert_eq!(half.ext("transactionId"), Some("U-h0"));
    assert_eq!(half.ext("msgId").map(str::len), Some(32));

    // Invisible before the commit: nothing in the real topic; kept in the half topic.
    let pulled = client.pull("G", "Tx", 1, 0, 0, None).await;
    assert!(pulled_bodies(&pulled).is_empty(), "{pulled:?}");
    assert_eq!(max_offset(&mut client, "Tx", 1).await, 0);
    let kept = pulled_records(&client.pull("G", HALF_TOPIC, 0, 0, 0, None).await);
    assert_eq!(kept.len(), 1);
    assert_eq!(property(&kept[0].properties, "REAL_TOPIC"), Some("Tx"));
    assert_eq!(property(&kept[0].properties, "REAL_QID"), Some("1"));
    assert_eq!(kept[0].sys_flag & sys_flag::TRANSACTION_ROLLBACK, 0);

    let ended = end(&mut client, end_fields("P", &half, COMMIT, false)).await;
    assert_eq!(ended.code, response::SUCCESS, "{ended:?}");
    let committed = pulled_records(&client.pull("G", "Tx", 1, 0, 0, None).await);
    assert_eq!(committed.len(), 1);
    let message = &committed[0];
    assert_eq!(&message.body[..], b"h0");
    assert_eq!(sys_flag::transaction_type(message.sys_flag), COMMIT);
    assert_eq!(property(&message.properties, "UNIQ_KEY"), Some("U-h0"));
    assert_eq!(property(&message.properties, "PGROUP"), Some("P"));
    for gone in ["TRAN_MSG", "REAL_TOPIC", "REAL_QID"] {
        assert_eq!(property(&message.properties, gone), None, "{gone}");
    }
    assert_eq!(
        message.prepared_transaction_offset,
        kept[0].physical_offset.0 as i64
    );

    // A second END, either way, does nothing: the op record tells.
    for outcome in [COMMIT, ROLLBACK] {
        let again = end(&mut client, end_fields("P", &half, outcome, false)).await;
        assert_eq!(again.code, response::SUCCESS, "{again:?}");
    }
    assert_eq!(max_offset(&mut client, "Tx", 1).await, 1);

    // A rollback writes the op record only, and a later commit is ignored.
    let rolled = send_half(&mut client, "P", "Tx", 1, "h1", &[]).await;
    assert_eq!(ext_u64(&rolled, "queueOffset"), 1);
    let ended = end(&mut client, end_fields("P", &rolled, ROLLBACK, false)).await;
    assert_eq!(ended.code, response::SUCCESS, "{ended:?}");
    let late = end(&mut client, end_fields("P", &rolled, COMMIT, false)).await;
    assert_eq!(late.code, response::SUCCESS, "{late:?}");
    assert_eq!(max_offset(&mut client, "Tx", 1).await, 1);

    let ops = pulled_records(&client.pull("G", OP_TOPIC, 0, 0, 0, None).await);
    let op_bodies: Vec<&[u8]> = ops.iter().map(|op| &op.body[..]).collect();
    assert_eq!(op_bodies, [b"0".as_slice(), b"1".as_slice()]);
    assert!(ops.iter().all(|op| op.tags() == Some(OP_REMOVE_TAG)));

    // Checked as Apache's checkPrepareMessage: the group and offsets must match.
    let third = send_half(&mut client, "P", "Tx", 0, "h2", &[]).await;
    let wrong_group = end(&mut client, end_fields("Q", &third, COMMIT, false)).await;
    assert_eq!(wrong_group.code, response::SYSTEM_ERROR);
    assert!(wrong_group
        .remark
        .unwrap_or_default()
        .contains("producer group"));
    // An END naming an unsettled half offset but a plain message's CommitLog offset.
    let plain = client.send("Plain", 0, "p0", "T").await;
    let plain_offset = quiver_protocol::message::decode_offset_msg_id(plain.ext("msgId").unwrap())
        .unwrap()
        .1;
    let fields = end_fields_at(
        "P",
        ext_u64(&third, "queueOffset"),
        plain_offset,
        COMMIT,
        false,
    );
    let not_half = end(&mut client, fields).await;
    assert_eq!(not_half.code, response::SYSTEM_ERROR, "{not_half:?}");
    // The refused ENDs left the third half message unsettled: it still commits.
    let ended = end(&mut client, end_fields("P", &third, COMMIT, false)).await;
    assert_eq!(ended.code, response::SUCCESS);
    assert_eq!(
        pulled_bodies(&client.pull("G", "Tx", 0, 0, 0, None).await),
        ["h2"]
    );
    broker.stop().await;
}

/// The next CHECK_TRANSACTION_STATE the broker pushes on this connection.
async fn next_check(client: &mut Client) -> (CheckTransactionStateRequestHeader, Record) {
    loop {
        let command = client.read().await.expect("connection open");
        if command.code != request::CHECK_TRANSACTION_STATE || command.is_response() {
            continue;
        }
        assert!(command.is_oneway(), "checks are oneway: {command:?}");
        let header = CheckTransactionStateRequestHeader::from_command(&command).expect("header");
        let (record, _) = quiver_protocol::record::decode(&command.body).expect("body decodes");
        return (header, record);
    }
}

fn check_times(record: &Record) -> Option<&str> {
    property(&record.properties, "TRANSACTION_CHECK_TIMES")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_group_is_checked_back_and_its_answers_settle_the_halves() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.transaction_timeout_ms = 300;
    config.transaction_check_interval_ms = 50;
    let broker = TestBroker::start(config).await;
    let mut producer = broker.client().await;
    producer_heartbeat(&mut producer, "producer-1", "P").await;
    let mut sender = broker.client().await;
    // Immune to checks for an hour, ahead of the others: they are checked all the same.
    let immune = send_half(
        &mut sender,
        "P",
        "Tx",
        1,
        "immune",
        &[("CHECK_IMMUNITY_TIME_IN_SECONDS", "3600")],
    )
    .await;
    assert_eq!(immune.code, response::SUCCESS);
    let to_commit = send_half(&mut sender, "P", "Tx", 1, "c0", &[]).await;
    let to_roll_back = send_half(&mut sender, "P", "Tx", 1, "r0", &[]).await;
    assert_eq!(to_commit.code, response::SUCCESS);
    assert_eq!(to_roll_back.code, response::SUCCESS);

    let mut answered = Vec::new();
    while answered.len() < 2 {
        let (header, message) = next_check(&mut producer).await;
        assert_eq!(message.topic, "Tx", "the body names the real topic");
        assert_eq!(message.queue_id, 1);
        assert_eq!(check_times(&message), Some("1"));
        let body = String::from_utf8_lossy(&message.body).into_owned();
        assert_eq!(
            header.transaction_id.as_deref(),
            Some(format!("U-{body}").as_str())
        );
        let outcome = if body == "c0" { COMMIT } else { ROLLBACK };
        // The answer as a stock client sends it: oneway, fromTransactionCheck.
        let fields = end_fields_at(
            "P",
            header.tran_state_table_offset as u64,
            header.commit_log_offset as u64,
            outcome,
            true,
        );
        let oneway = RemotingCommand::request(request::END_TRANSACTION, fields).into_oneway();
        producer.write(&oneway).await;
        answered.push(body);
    }
    answered.sort();
    assert_eq!(answered, ["c0", "r0"], "the immune one is not asked");

    common::wait_for("the commit is stored", Duration::from_secs(20), || {
        let addr = broker.addr;
        async move {
            let mut client = Client::connect(addr).await;
            max_offset(&mut client, "Tx", 1).await == 1
        }
    })
    .await;
    assert_eq!(
        pulled_bodies(&sender.pull("G", "Tx", 1, 0, 0, None).await),
        ["c0"]
    );
    // The immune half message holds the progress; the ones behind it are settled all the same.
    let offset = sender.query_offset(SYSTEM_GROUP, HALF_TOPIC, 0).await;
    assert!(
        offset.code != response::SUCCESS || ext_u64(&offset, "offset") == 0,
        "{offset:?}"
    );
    let ended = end(&mut sender, end_fields("P", &immune, COMMIT, false)).await;
    assert_eq!(ended.code, response::SUCCESS);
    // Settled: the immune one, the originals and their checked copies are all behind the
    // system group.
    common::wait_for("the half queue is settled", Duration::from_secs(20), || {
        let addr = broker.addr;
        async move {
            let mut client = Client::connect(addr).await;
            let offset = client.query_offset(SYSTEM_GROUP, HALF_TOPIC, 0).await;
            offset.code == response::SUCCESS && ext_u64(&offset, "offset") == 5
        }
    })
    .await;
    let metrics = broker.metrics().await;
    assert!(
        metrics.contains(
            "quiver_transaction_checks_total{cluster=\"DefaultCluster\",result=\"sent\"} 2"
        ),
        "{metrics}"
    );
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_message_checked_the_maximum_times_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(dir.path());
    config.transaction_timeout_ms = 200;
    config.transaction_check_interval_ms = 50;
    config.transaction_check_max = 2;
    let broker = TestBroker::start(config).await;
    let mut producer = broker.client().await;
    producer_heartbeat(&mut producer, "producer-1", "P").await;
    let half = send_half(&mut producer, "P", "Tx", 0, "never", &[]).await;
    assert_eq!(half.code, response::SUCCESS);

    // Asked twice, never answered.
    let (_, first) = next_check(&mut producer).await;
    assert_eq!(check_times(&first), Some("1"));
    let (_, second) = next_check(&mut producer).await;
    assert_eq!(check_times(&second), Some("2"));

    let addr = broker.addr;
    common::wait_for("the discard", Duration::from_secs(20), || async move {
        let mut client = Client::connect(addr).await;
        max_offset(&mut client, CHECK_MAX_TIME_TOPIC, 0).await == 1
    })
    .await;
    let discarded = pulled_records(
        &producer
            .pull("G", CHECK_MAX_TIME_TOPIC, 0, 0, 0, None)
            .await,
    );
    assert_eq!(&discarded[0].body[..], b"never");
    assert_eq!(check_times(&discarded[0]), Some("2"));
    assert_eq!(property(&discarded[0].properties, "REAL_TOPIC"), Some("Tx"));
    let metrics = broker.metrics().await;
    assert!(
        metrics.contains("quiver_transaction_discarded_total{cluster=\"DefaultCluster\",topic=\"TRANS_CHECK_MAX_TIME_TOPIC\"} 1"),
        "{metrics}"
    );
    // Once discarded, a late commit does nothing.
    let late = end(&mut producer, end_fields("P", &half, COMMIT, false)).await;
    assert_eq!(late.code, response::SUCCESS);
    assert_eq!(max_offset(&mut producer, "Tx", 0).await, 0);
    broker.stop().await;
}
