//! The HTTP port: /healthz, /readyz and /metrics with the names of docs/METRICS.md.

mod common;

use std::collections::BTreeSet;

use common::{http_get, test_config, TestBroker};

const METRICS_MD: &str = include_str!("../../../docs/METRICS.md");

/// One row of METRICS.md's broker table.
struct Documented {
    name: String,
    kind: String,
    labels: BTreeSet<String>,
}

/// The rows of the `## Broker` table: | `name` | type | labels | meaning |.
fn documented_broker_metrics() -> Vec<Documented> {
    let section = METRICS_MD
        .split("\n## ")
        .find(|section| section.starts_with("Broker\n"))
        .expect("METRICS.md has a ## Broker section");
    let rows = section.lines().filter(|line| line.starts_with("| `"));
    let documented: Vec<Documented> = rows
        .map(|row| {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            Documented {
                name: cells[1].trim_matches('`').to_string(),
                kind: cells[2].to_string(),
                labels: cells[3].split(',').map(|l| l.trim().to_string()).collect(),
            }
        })
        .collect();
    assert!(documented.len() >= 20, "parsed {} rows", documented.len());
    documented
}

/// The label names of every sample of `name` in an exposition.
fn sample_label_names(exposition: &str, name: &str) -> Vec<BTreeSet<String>> {
    let prefix = format!("{name}{{");
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .map(|rest| {
            let labels = rest.split_once("} ").expect("a sample has a value").0;
            labels
                .split(',')
                .map(|pair| pair.split_once('=').expect("name=\"value\"").0.to_string())
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_metric_is_exposed_with_its_type_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    // ACL on (its series exist only then), with this host white-listed: no signing needed.
    let acl_file = dir.path().join("plain_acl.yml");
    std::fs::write(&acl_file, "globalWhiteRemoteAddresses: [127.0.0.1]\n").unwrap();
    let mut config = test_config(&dir.path().join("data"));
    config.acl_file = Some(acl_file);
    // TLS on (its series exist only then), permissive: the plain test client still connects.
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
    config.tls_mode = quiver_broker::TlsMode::Permissive;
    config.tls_cert_file = Some(cert);
    config.tls_key_file = Some(key);
    // Peers from a config file (the series of its reloads exist only then).
    let config_file = dir.path().join("broker.json");
    std::fs::write(&config_file, r#"{"peers": []}"#).unwrap();
    config.peers_file = Some(config_file);
    let (broker, service) = TestBroker::start_with_broker(config).await;
    let mut client = broker.client().await;
    client.send("Met", 0, "m", "A").await;
    // Pulls with a commit, so the traffic-out and lag series exist.
    client.pull("G", "Met", 0, 0, 0, Some(0)).await;
    // A POP receive, so a group has messages in flight.
    let receive = quiver_broker::pop::ReceiveRequest {
        group: "PopG",
        topic: "Met",
        filter: &quiver_broker::filter::ConsumerFilter::All,
        max_messages: 1,
        invisible: std::time::Duration::from_secs(60),
        long_poll: std::time::Duration::ZERO,
    };
    assert_eq!(
        service
            .pop()
            .receive(&service, receive)
            .await
            .unwrap()
            .len(),
        1
    );
    let exposition = broker.metrics().await;
    for metric in documented_broker_metrics() {
        let type_line = format!("# TYPE {} {}\n", metric.name, metric.kind);
        assert!(
            exposition.contains(&type_line),
            "no {type_line:?}:\n{exposition}"
        );
        let samples = sample_label_names(&exposition, &metric.name);
        // Documented as absent while the store takes writes (tests/disk_high_water.rs has it).
        if metric.name != "quiver_store_write_refusal" {
            assert!(!samples.is_empty(), "no {} sample", metric.name);
        }
        for labels in samples {
            assert_eq!(labels, metric.labels, "labels of {}", metric.name);
        }
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_ready_and_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    assert_eq!(http_get(broker.http, "/healthz").await.unwrap().0, 200);
    assert_eq!(
        http_get(broker.http, "/readyz").await.unwrap(),
        (200, "ready\n".to_string())
    );
    assert_eq!(http_get(broker.http, "/nothing").await.unwrap().0, 404);

    let mut client = broker.client().await;
    client.send("Met", 0, "m", "A").await;
    let metrics = broker.metrics().await;
    let cluster = "{cluster=\"DefaultCluster\"}";
    assert!(metrics.contains(&format!("quiver_broker_ready{cluster} 1")));
    assert!(metrics.contains(&format!("quiver_broker_writable{cluster} 1")));
    assert!(metrics.contains(&format!("quiver_connections{cluster} 1")));
    assert!(metrics
        .contains("rocketmq_throughput_in_total{cluster=\"DefaultCluster\",topic=\"Met\"} 1"));

    // Nothing committed: no lag series (unknown is not zero).
    assert!(
        !metrics.contains("rocketmq_consumer_lag_messages{"),
        "{metrics}"
    );
    client.pull("G", "Met", 0, 0, 0, Some(0)).await;
    let metrics = broker.metrics().await;
    assert!(metrics.contains(
        "rocketmq_consumer_lag_messages{cluster=\"DefaultCluster\",consumer_group=\"G\",topic=\"Met\"} 1"
    ));
    let latency = metrics
        .lines()
        .find(|l| l.starts_with("rocketmq_consumer_lag_latency{"))
        .expect("latency series");
    let value: i64 = latency.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(value >= 0);
    broker.stop().await;
}
