//! A connection may park at most max-parked-pulls-per-connection pulls; one more is refused
//! with SYSTEM_BUSY and counted, while another connection's parked pull is still woken by a
//! send and answered.

mod common;

use bytes::Bytes;
use common::{ext, pulled_bodies, test_config, Client, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;

fn parking_pull(queue_id: u32, opaque: i32) -> RemotingCommand {
    let fields = ext(&[
        ("consumerGroup", "G"),
        ("topic", "Park"),
        ("queueId", &queue_id.to_string()),
        ("queueOffset", "0"),
        ("maxMsgNums", "32"),
        ("sysFlag", "2"),
        ("commitOffset", "-1"),
        ("suspendTimeoutMillis", "15000"),
        ("subscription", "*"),
        ("subVersion", "0"),
    ]);
    RemotingCommand::request(request::PULL_MESSAGE, fields)
        .with_opaque(opaque)
        .with_body(Bytes::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_third_parked_pull_on_one_connection_is_refused_and_others_work() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        max_parked_pulls_per_connection: 2,
        default_queue_nums: 4,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut admin = broker.client().await;
    assert_eq!(admin.create_topic("Park", 4).await.code, response::SUCCESS);

    let mut greedy = Client::connect(broker.addr).await;
    greedy.write(&parking_pull(0, 1)).await;
    greedy.write(&parking_pull(1, 2)).await;
    broker.wait_parked(2).await;
    greedy.write(&parking_pull(2, 3)).await;
    let refused = greedy.read().await.expect("an answer");
    assert_eq!(refused.opaque, 3, "the third pull is answered at once");
    assert_eq!(refused.code, response::SYSTEM_BUSY);
    let remark = refused.remark.unwrap_or_default();
    assert!(
        remark.contains("max-parked-pulls-per-connection"),
        "{remark}"
    );

    let addr = broker.addr;
    let patient = tokio::spawn(async move {
        let mut patient = Client::connect(addr).await;
        patient.pull("G2", "Park", 3, 0, 15_000, None).await
    });
    broker.wait_parked(3).await;
    assert_eq!(
        admin.send("Park", 3, "for the patient", "A").await.code,
        response::SUCCESS
    );
    let answer = patient.await.unwrap();
    assert_eq!(answer.code, response::SUCCESS);
    assert_eq!(pulled_bodies(&answer), vec!["for the patient"]);
    let metrics = broker.metrics().await;
    assert!(
        metrics.contains(r#"quiver_parked_pulls_refused_total{cluster="DefaultCluster",reason="max-parked-pulls-per-connection"} 1"#),
        "{metrics}"
    );
    broker.stop().await;
}
