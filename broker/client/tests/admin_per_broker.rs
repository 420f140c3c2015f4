//! Admin calls addressed to one broker (the operator's broker-admin calls) against a real
//! in-process broker.

mod common;

use std::time::Duration;

use common::{produce, Received, TestBroker};
use quiver_client::{Admin, PushConsumer, QueueOffset, ResetTarget, TopicSpec};
use quiver_protocol::body::{ConsumeStats, SubscriptionGroupConfig};

fn now_ms() -> i64 {
    let since_epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(since_epoch.expect("after 1970").as_millis()).expect("fits")
}

/// Consumer offsets per queue id of a group's consume stats.
fn consumer_offsets(stats: &ConsumeStats) -> Vec<(u32, i64, i64)> {
    stats
        .offset_table
        .iter()
        .map(|(queue, o)| (queue.queue_id, o.consumer_offset, o.broker_offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_groups_offsets_and_runtime_info_of_one_broker() {
    let broker = TestBroker::start().await;
    let addr = broker.addr.clone();
    let admin = Admin::new(broker.client());
    let topic = "per-broker";
    admin
        .create_topic_at(&addr, &TopicSpec::new(topic, 2))
        .await
        .expect("create topic");
    produce(&broker.producer(), topic, "m", 6).await;

    let stats = admin
        .topic_stats_at(&addr, topic)
        .await
        .expect("topic stats");
    assert_eq!(stats.offset_table.len(), 2);
    let stored: i64 = stats.offset_table.values().map(|o| o.max_offset).sum();
    assert_eq!(stored, 6);

    let group = "g-per-broker";
    let config = SubscriptionGroupConfig {
        retry_max_times: 3,
        ..SubscriptionGroupConfig::named(group)
    };
    admin.upsert_group_at(&addr, &config).await.expect("upsert");
    let groups = admin.groups_at(&addr).await.expect("groups");
    assert!(groups.iter().any(|g| g == group), "{groups:?}");
    assert!(admin
        .members_at(&addr, group)
        .await
        .expect("members")
        .is_empty());

    admin
        .reset_offsets_at(&addr, group, topic, ResetTarget::Latest)
        .await
        .expect("reset to latest");
    let stats = admin
        .consume_stats_at(&addr, group, Some(topic))
        .await
        .expect("consume stats")
        .expect("the broker knows the group");
    for (queue, consumer, broker_offset) in consumer_offsets(&stats) {
        assert_eq!(consumer, broker_offset, "queue {queue} is at the end");
    }

    admin
        .reset_offsets_at(&addr, group, topic, ResetTarget::Earliest)
        .await
        .expect("reset to earliest");
    let stats = admin
        .consume_stats_at(&addr, group, Some(topic))
        .await
        .expect("consume stats")
        .expect("known group");
    assert!(consumer_offsets(&stats).iter().all(|(_, c, _)| *c == 0));
    let (queue, offsets) = stats
        .offset_table
        .iter()
        .find(|(_, o)| o.broker_offset > 0)
        .expect("a queue with messages");
    let stored_at = admin
        .store_time_at(&addr, group, queue, QueueOffset(0))
        .await
        .expect("pull")
        .expect("a message at offset 0");
    assert!(stored_at > 0 && stored_at <= now_ms());
    let past_the_end = QueueOffset(offsets.broker_offset as u64);
    let nothing = admin.store_time_at(&addr, group, queue, past_the_end).await;
    assert_eq!(nothing.expect("pull"), None);

    admin.delete_group_at(&addr, group).await.expect("delete");
    let groups = admin.groups_at(&addr).await.expect("groups");
    assert!(!groups.iter().any(|g| g == group), "{groups:?}");

    let runtime = admin.runtime_info_at(&addr).await.expect("runtime info");
    assert!(runtime.contains_key("commitLogDiskRatio"), "{runtime:?}");
    let booted: i64 = runtime["bootTimestamp"].parse().expect("a time");
    assert!(booted > 0 && booted <= now_ms(), "{runtime:?}");
    assert_eq!(runtime["brokerVersionDesc"], "V4_9_4");
    assert!(runtime["runtime"].ends_with("seconds ]"), "{runtime:?}");
    assert_eq!(
        runtime.get("quiverWritable").map(String::as_str),
        Some("true")
    );
    admin.shutdown().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_of_an_online_group_and_stats_of_an_unknown_one() {
    let broker = TestBroker::start().await;
    let addr = broker.addr.clone();
    let topic = "members";
    let group = "g-members";
    broker.create_topic(topic, 1).await;
    let admin = Admin::new(broker.client());
    let received = Received::default();
    let consumer = PushConsumer::start(broker.consumer_config(group, topic), received.listener())
        .await
        .expect("start");
    let mut members = Vec::new();
    let started = std::time::Instant::now();
    while members.is_empty() {
        assert!(started.elapsed() < Duration::from_secs(10), "no member");
        members = admin.members_at(&addr, group).await.expect("members");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(members.len(), 1);
    assert!(!members[0].client_id.is_empty());
    consumer.shutdown().await.expect("shutdown");

    let unknown = admin
        .consume_stats_at(&addr, "g-nobody", None)
        .await
        .expect("consume stats of an unknown group");
    assert!(
        unknown
            .as_ref()
            .is_none_or(|stats| stats.offset_table.is_empty()),
        "{unknown:?}"
    );
    admin.shutdown().await;
    broker.stop().await;
}

/// The mqadmin calls: a running consumer's running info (relayed by the broker), who consumes
/// a topic, offset cloning, producer connections and the cluster's topic list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_info_consumers_of_a_topic_and_cloned_offsets() {
    let broker = TestBroker::start().await;
    let addr = broker.addr.clone();
    let topic = "tools";
    let group = "g-tools";
    broker.create_topic(topic, 2).await;
    produce(&broker.producer(), topic, "m", 4).await;
    let admin = Admin::new(broker.client());
    let received = Received::default();
    let config = broker
        .consumer_config(group, topic)
        .consume_from(quiver_client::ConsumeFromWhere::FirstOffset);
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start");
    common::wait_until("every message", Duration::from_secs(20), || {
        received.len() >= 4
    })
    .await;
    let members = admin.members_at(&addr, group).await.expect("members");
    let client_id = members[0].client_id.clone();

    let info = admin
        .consumer_running_info_at(&addr, group, &client_id)
        .await
        .expect("running info");
    assert_eq!(info["properties"]["PROP_CONSUME_TYPE"], "CONSUME_PASSIVELY");
    assert_eq!(info["subscriptionSet"][0]["topic"], topic);
    // The topic's two queues and the group's retry queue, keyed as fastjson writes them.
    let queues = info["mqTable"].as_object().expect("mqTable");
    let of_topic = |key: &&String| key.contains(&format!("\"topic\":\"{topic}\""));
    assert_eq!(queues.keys().filter(of_topic).count(), 2, "{info}");
    assert!(
        queues.keys().any(|key| key.contains("%RETRY%g-tools")),
        "{info}"
    );
    // A stored message consumed once more, directly, by that consumer's listener.
    let sent = broker
        .producer()
        .send(quiver_client::Message::new(topic, "direct"))
        .await
        .expect("send");
    common::wait_until("the new message", Duration::from_secs(20), || {
        received.len() >= 5
    })
    .await;
    let direct = admin
        .consume_message_directly_at(&addr, group, &client_id, &sent.offset_msg_id)
        .await
        .expect("consume directly");
    assert_eq!(direct["consumeResult"], "CR_SUCCESS", "{direct}");
    assert_eq!(received.counts().get("direct"), Some(&2));
    let refused = admin
        .consumer_running_info_at(&addr, group, "no-such-client")
        .await
        .expect_err("not online");
    assert!(refused.to_string().contains("not online"), "{refused}");

    let consumers = admin.consumed_by_at(&addr, topic).await.expect("by who");
    assert_eq!(consumers, [group]);
    consumer.shutdown().await.expect("shutdown");

    admin
        .clone_offsets_at(&addr, group, "g-copy", Some(topic))
        .await
        .expect("clone");
    let source = admin
        .consume_stats_at(&addr, group, Some(topic))
        .await
        .expect("stats")
        .expect("known group");
    let copy = admin
        .consume_stats_at(&addr, "g-copy", Some(topic))
        .await
        .expect("stats")
        .expect("known group");
    assert_eq!(consumer_offsets(&copy), consumer_offsets(&source));
    assert!(consumer_offsets(&copy).iter().all(|(_, c, b)| c == b));

    let producers = admin
        .producers_at(&addr, "no-producers")
        .await
        .expect("204");
    assert!(producers.is_empty());
    let topics = admin.all_topic_names_at(&addr).await.expect("206");
    assert!(topics.iter().any(|t| t == topic), "{topics:?}");
    admin.shutdown().await;
    broker.stop().await;
}
