//! GET /debug/stages: with `--stage-sample-every 1` every send and every parked pull woken by
//! a dispatch is timed stage by stage; the stages of a send add up to its time in the broker,
//! and `since_ns` leaves out what came before. Off by default, and then the endpoint says so.

mod common;

use std::time::Duration;

use common::{http_get, pulled_bodies, test_config, TestBroker};
use quiver_protocol::code::response;
use serde_json::Value;

async fn stages(broker: &TestBroker, since_ns: Option<u64>) -> Value {
    let path = match since_ns {
        Some(since) => format!("/debug/stages?since_ns={since}"),
        None => "/debug/stages".to_string(),
    };
    let (status, body) = http_get(broker.http, &path).await.expect("http answers");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn samples(report: &Value, kind: &str) -> u64 {
    report[kind]["samples"].as_u64().expect("samples")
}

fn stage_p50s(report: &Value, kind: &str) -> Vec<f64> {
    let stages = report[kind]["stages"].as_array().expect("stages");
    stages
        .iter()
        .map(|s| s["p50_us"].as_f64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_and_woken_pulls_are_timed_stage_by_stage() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        stage_sample_every: 1,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut producer = broker.client().await;
    assert_eq!(
        producer.send("Staged", 0, "first", "A").await.code,
        response::SUCCESS
    );
    // The writer stamps after the answer left, so the reply can come before the sample.
    common::wait_for(
        "the first send to be recorded",
        Duration::from_secs(10),
        || async { samples(&stages(&broker, None).await, "send") >= 1 },
    )
    .await;
    let first = stages(&broker, None).await;
    assert_eq!(first["sample_every"], 1);
    assert_eq!(samples(&first, "send"), 1, "{first}");
    assert_eq!(samples(&first, "parked_pull_wake"), 0, "{first}");
    let since = first["now_ns"].as_u64().unwrap();

    for round in 0..3u64 {
        let addr = broker.addr;
        let parked = tokio::spawn(async move {
            let mut consumer = common::Client::connect(addr).await;
            consumer
                .pull("G", "Staged", 0, round + 1, 15_000, None)
                .await
        });
        broker.wait_parked(1).await;
        let body = format!("m{round}");
        assert_eq!(
            producer.send("Staged", 0, &body, "A").await.code,
            response::SUCCESS
        );
        let reply = parked.await.unwrap();
        assert_eq!(pulled_bodies(&reply), vec![body]);
    }
    // The writer stamps after the answer left: give the last one a moment.
    common::wait_for(
        "the last wake to be recorded",
        Duration::from_secs(10),
        || async { samples(&stages(&broker, Some(since)).await, "parked_pull_wake") == 3 },
    )
    .await;
    let report = stages(&broker, Some(since)).await;
    assert_eq!(
        samples(&report, "send"),
        3,
        "the first send is before since_ns: {report}"
    );
    let send = stage_p50s(&report, "send");
    let wake = stage_p50s(&report, "parked_pull_wake");
    // A send's three stages, its whole, and read -> answered with and without page faults.
    assert_eq!((send.len(), wake.len()), (6, 3), "{report}");
    // Every stage took some time (its bytes waited in the socket, too), and none anywhere
    // near the pull's 15 s suspend; either fault row may be empty.
    for value in send[..4].iter().chain(&wake) {
        assert!(*value > 0.0 && *value < 5_000_000.0, "{report}");
    }
    broker.stop().await;
}

#[tokio::test]
async fn off_by_default_and_the_endpoint_says_how_to_turn_it_on() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut producer = broker.client().await;
    assert_eq!(
        producer.send("Off", 0, "m", "A").await.code,
        response::SUCCESS
    );
    let (status, body) = http_get(broker.http, "/debug/stages").await.unwrap();
    assert_eq!(status, 404);
    assert!(body.contains("--stage-sample-every"), "{body}");
    broker.stop().await;
}
