//! Topic and group creations on many connections at once, while the periodic persister runs,
//! all succeed and all survive a restart: config files have one writer at a time (they once
//! raced on one temp file: "cannot persist ... subscriptionGroup.json.tmp: No such file").

mod common;

use bytes::Bytes;
use common::{test_config, TestBroker};
use quiver_protocol::body::{SubscriptionGroupWrapper, TopicConfigSerializeWrapper};
use quiver_protocol::code::{request, response};

const CONNECTIONS: usize = 4;
const PER_CONNECTION: usize = 25;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creations_and_persists_all_succeed() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        // The smallest interval allowed: the periodic persister runs throughout.
        persist_interval_ms: 100,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config.clone()).await;

    let mut writers = Vec::new();
    for connection in 0..CONNECTIONS {
        let mut client = broker.client().await;
        writers.push(tokio::spawn(async move {
            for i in 0..PER_CONNECTION {
                let topic = format!("T{connection}-{i}");
                let created = client.create_topic(&topic, 1).await;
                assert_eq!(created.code, response::SUCCESS, "{:?}", created.remark);
                let group = format!(r#"{{"groupName":"G{connection}-{i}"}}"#);
                let created = client
                    .call(
                        request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                        Default::default(),
                        Bytes::from(group),
                    )
                    .await;
                assert_eq!(created.code, response::SUCCESS, "{:?}", created.remark);
                let drained = client
                    .call(
                        request::UPDATE_BROKER_CONFIG,
                        Default::default(),
                        Bytes::from_static(b"brokerPermission=6"),
                    )
                    .await;
                assert_eq!(drained.code, response::SUCCESS, "{:?}", drained.remark);
            }
        }));
    }
    for writer in writers {
        writer.await.expect("writer did not panic");
    }
    broker.stop().await;
    // Checked while no broker runs: a write in progress has its temp file.
    let leftovers: Vec<_> = std::fs::read_dir(dir.path().join("config"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");

    let broker = TestBroker::start(config).await;
    let mut admin = broker.client().await;
    let topics = admin
        .call(
            request::GET_ALL_TOPIC_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let topics = TopicConfigSerializeWrapper::decode(&topics.body).unwrap();
    let groups = admin
        .call(
            request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let groups = SubscriptionGroupWrapper::decode(&groups.body).unwrap();
    for connection in 0..CONNECTIONS {
        for i in 0..PER_CONNECTION {
            assert!(topics
                .topic_config_table
                .contains_key(&format!("T{connection}-{i}")));
            assert!(groups
                .subscription_group_table
                .contains_key(&format!("G{connection}-{i}")));
        }
    }
    broker.stop().await;
}
