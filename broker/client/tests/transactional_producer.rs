//! The transactional producer end to end: a committed local transaction is delivered, a
//! rolled-back one never, and one whose outcome is unknown is delivered once the broker
//! checks back and the check listener answers; producers announce their group in heartbeats.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, Received, TestBroker};
use parking_lot::Mutex;
use quiver_client::{
    Admin, ConsumeFromWhere, LocalTransactionState, Message, ProducerConfig, PushConsumer,
    ReceivedMessage, TransactionListener, TransactionProducer,
};

/// Outcomes by body prefix; records what the broker asked about.
#[derive(Clone, Default)]
struct ByBody {
    checked: Arc<Mutex<Vec<String>>>,
}

fn outcome_of(body: &[u8]) -> LocalTransactionState {
    match body {
        b if b.starts_with(b"commit") => LocalTransactionState::Commit,
        b if b.starts_with(b"rollback") => LocalTransactionState::Rollback,
        _ => LocalTransactionState::Unknown,
    }
}

impl TransactionListener for ByBody {
    fn execute_local_transaction(
        &self,
        message: &Message,
        transaction_id: &str,
    ) -> LocalTransactionState {
        assert_eq!(transaction_id.len(), 32);
        outcome_of(&message.body)
    }

    fn check_local_transaction(&self, message: &ReceivedMessage) -> LocalTransactionState {
        let body = String::from_utf8_lossy(&message.body).into_owned();
        self.checked.lock().push(body.clone());
        // The broker asks about the unknown ones: by now the application knows.
        if body.starts_with("unknown") {
            LocalTransactionState::Commit
        } else {
            outcome_of(&message.body)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_rollback_and_checked_back_outcomes_reach_consumers_once() {
    let broker = TestBroker::start_with(|config| {
        config.transaction_timeout_ms = 300;
        config.transaction_check_interval_ms = 50;
    })
    .await;
    let topic = "txn";
    broker.create_topic(topic, 2).await;
    let listener = ByBody::default();
    let mut config = ProducerConfig::new(&broker.addr);
    config.group = "tx-producers".into();
    let producer = TransactionProducer::start(config, listener.clone());
    for body in [
        "commit-1",
        "rollback-1",
        "unknown-1",
        "commit-2",
        "rollback-2",
    ] {
        let sent = producer
            .send_in_transaction(Message::new(topic, body))
            .await
            .expect("half message sent");
        assert_eq!(sent.local_state, outcome_of(body.as_bytes()));
        assert_eq!(sent.transaction_id, sent.send.msg_id);
    }

    // The producer's heartbeat announced its group on the broker.
    let admin = Admin::new(broker.client());
    let producers = admin
        .producers_at(&broker.addr, "tx-producers")
        .await
        .expect("producer connections");
    assert_eq!(producers.len(), 1, "{producers:?}");
    assert_eq!(producers[0].client_id, producer.client_id());
    admin.shutdown().await;

    let received = Received::default();
    let consumer_config = broker
        .consumer_config("tx-consumers", topic)
        .consume_from(ConsumeFromWhere::FirstOffset);
    let consumer = PushConsumer::start(consumer_config, received.listener())
        .await
        .expect("consumer starts");
    wait_until("three committed messages", Duration::from_secs(30), || {
        received.len() >= 3
    })
    .await;
    let checked = listener.checked.lock().clone();
    // Only the unknown outcome is asked (more than once if an answer is slower than the
    // timeout: a later copy's answer then settles it, still once).
    assert!(
        !checked.is_empty() && checked.iter().all(|body| body == "unknown-1"),
        "{checked:?}"
    );
    let mut bodies = received.bodies();
    bodies.sort();
    assert_eq!(bodies, ["commit-1", "commit-2", "unknown-1"]);
    consumer.shutdown().await.expect("consumer stops");
    producer.shutdown().await;
    broker.stop().await;
}
