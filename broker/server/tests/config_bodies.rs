//! Topic and subscription-group configs use quiver-protocol's body types: files written by the
//! broker's earlier own types still load, C++-style bodies ("0"/"1" booleans, numbers as
//! strings) are accepted, and the listings decode as RocketMQ wrappers.

mod common;

use bytes::Bytes;
use common::{test_config, TestBroker};
use quiver_protocol::body::{
    SubscriptionGroupConfig, SubscriptionGroupWrapper, TopicConfigSerializeWrapper,
};
use quiver_protocol::code::{request, response};

/// `config/topics.json` as the broker wrote it before it used quiver-protocol's types.
const OLD_TOPICS_FILE: &str = r#"{"topicConfigTable":{"Legacy":{"topicName":"Legacy","readQueueNums":3,"writeQueueNums":3,"perm":4,"topicFilterType":"SINGLE_TAG","topicSysFlag":0,"order":true}}}"#;
/// `config/subscriptionGroup.json` in the same earlier form.
const OLD_GROUPS_FILE: &str = r#"{"subscriptionGroupTable":{"OldGroup":{"groupName":"OldGroup","consumeEnable":false,"consumeFromMinEnable":true,"consumeBroadcastEnable":true,"retryQueueNums":2,"retryMaxTimes":5,"brokerId":0,"whichBrokerWhenConsumeSlowly":1,"notifyConsumerIdsChangedEnable":true}}}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_files_load_and_cpp_style_bodies_are_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("topics.json"), OLD_TOPICS_FILE).unwrap();
    std::fs::write(config_dir.join("subscriptionGroup.json"), OLD_GROUPS_FILE).unwrap();

    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut admin = broker.client().await;

    let topics = admin
        .call(
            request::GET_ALL_TOPIC_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    assert_eq!(topics.code, response::SUCCESS);
    let topics = TopicConfigSerializeWrapper::decode(&topics.body).expect("topic wrapper");
    let legacy = &topics.topic_config_table["Legacy"];
    assert_eq!(
        (legacy.read_queue_nums, legacy.perm, legacy.order),
        (3, 4, true)
    );
    assert!(topics.topic_config_table.contains_key("TBW102"));

    // The C++ admin sends booleans as 0/1 and numbers as strings.
    let cpp_group = br#"{"groupName":"CppGroup","consumeEnable":"0","consumeBroadcastEnable":1,"retryQueueNums":"3","retryMaxTimes":"7"}"#;
    let created = admin
        .call(
            request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            Default::default(),
            Bytes::from_static(cpp_group),
        )
        .await;
    assert_eq!(created.code, response::SUCCESS, "{:?}", created.remark);

    let groups = admin
        .call(
            request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let groups = SubscriptionGroupWrapper::decode(&groups.body).expect("group wrapper");
    assert_eq!(
        groups.subscription_group_table["CppGroup"],
        SubscriptionGroupConfig {
            consume_enable: false,
            retry_queue_nums: 3,
            retry_max_times: 7,
            ..SubscriptionGroupConfig::named("CppGroup")
        }
    );
    let old = &groups.subscription_group_table["OldGroup"];
    assert_eq!((old.consume_enable, old.retry_max_times), (false, 5));

    // What the broker writes now loads again after a restart.
    broker.stop().await;
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut admin = broker.client().await;
    let groups = admin
        .call(
            request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let groups = SubscriptionGroupWrapper::decode(&groups.body).expect("group wrapper");
    assert_eq!(
        groups.subscription_group_table["CppGroup"].retry_max_times,
        7
    );
    assert!(groups.subscription_group_table.contains_key("OldGroup"));
    broker.stop().await;
}
