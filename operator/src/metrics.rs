//! The operator's Prometheus metrics (docs/METRICS.md); one struct owns the registry.

use crate::lag::{GroupLag, Progress, QueueLag};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

/// Labels of per-topic lag series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TopicLabels {
    /// Broker resource name.
    pub cluster: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Topic.
    pub topic: String,
}

/// Labels of per-queue lag series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QueueLabels {
    /// Broker resource name.
    pub cluster: String,
    /// Consumer group.
    pub consumer_group: String,
    /// Topic.
    pub topic: String,
    /// Broker name.
    pub broker: String,
    /// Queue id.
    pub queue_id: String,
}

/// Labels of per-group series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct GroupLabels {
    /// Broker resource name.
    pub cluster: String,
    /// Consumer group.
    pub consumer_group: String,
}

/// Labels of reconcile counters and durations.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    /// `broker` or `consumergroup`.
    pub controller: String,
}

/// Labels of reconcile errors.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// `broker` or `consumergroup`.
    pub controller: String,
    /// [`crate::Error::metric_label`].
    pub error: String,
}

/// Series published for one group, to remove the ones that disappear.
#[derive(Default)]
struct PublishedSeries {
    topics: BTreeSet<TopicLabels>,
    queues: BTreeSet<QueueLabels>,
}

/// Every metric of the operator.
pub struct Metrics {
    registry: Registry,
    lag_messages: Family<TopicLabels, Gauge>,
    lag_latency_ms: Family<TopicLabels, Gauge>,
    queue_lag_messages: Family<QueueLabels, Gauge>,
    group_stalled: Family<GroupLabels, Gauge>,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    published: Mutex<BTreeMap<GroupLabels, PublishedSeries>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let lag_messages = Family::<TopicLabels, Gauge>::default();
        let lag_latency_ms = Family::<TopicLabels, Gauge>::default();
        let queue_lag_messages = Family::<QueueLabels, Gauge>::default();
        let group_stalled = Family::<GroupLabels, Gauge>::default();
        let reconciles = Family::<ControllerLabels, Counter>::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let reconcile_duration = Family::<ControllerLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.005, 2.0, 14))) as fn() -> Histogram,
        );
        registry.register(
            "rocketmq_consumer_lag_messages",
            "Unconsumed messages over queues with a commit",
            lag_messages.clone(),
        );
        registry.register(
            "rocketmq_consumer_lag_latency",
            "Milliseconds since the oldest unconsumed message was stored, 0 when caught up",
            lag_latency_ms.clone(),
        );
        registry.register(
            "quiver_consumer_queue_lag_messages",
            "Unconsumed messages per queue",
            queue_lag_messages.clone(),
        );
        registry.register(
            "quiver_consumer_group_stalled",
            "1 when lag > 0 and committed offsets did not move across N polls",
            group_stalled.clone(),
        );
        // prometheus-client appends `_total` to counters.
        registry.register(
            "quiver_reconcile",
            "Reconciliations run",
            reconciles.clone(),
        );
        registry.register(
            "quiver_reconcile_errors",
            "Failed reconciliations by error kind",
            reconcile_errors.clone(),
        );
        registry.register(
            "quiver_reconcile_duration_seconds",
            "Reconcile duration",
            reconcile_duration.clone(),
        );
        Metrics {
            registry,
            lag_messages,
            lag_latency_ms,
            queue_lag_messages,
            group_stalled,
            reconciles,
            reconcile_errors,
            reconcile_duration,
            published: Mutex::new(BTreeMap::new()),
        }
    }
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }

    /// Counts one reconcile and its duration.
    pub fn reconciled(&self, controller: &str, duration: Duration) {
        let labels = ControllerLabels {
            controller: controller.to_string(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.reconcile_duration
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// Counts one failed reconcile.
    pub fn reconcile_failed(&self, controller: &str, error: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                controller: controller.to_string(),
                error: error.to_string(),
            })
            .inc();
    }

    /// Publishes a group's lag; topics without a commit get no series (unknown is not zero).
    pub fn set_group_lag(&self, cluster: &str, group: &str, lag: &GroupLag, progress: Progress) {
        let group_labels = GroupLabels {
            cluster: cluster.to_string(),
            consumer_group: group.to_string(),
        };
        let mut series = PublishedSeries::default();
        for (topic, topic_lag) in &lag.topics {
            let labels = TopicLabels {
                cluster: cluster.to_string(),
                consumer_group: group.to_string(),
                topic: topic.clone(),
            };
            let Some(messages) = topic_lag.messages else {
                continue;
            };
            self.lag_messages
                .get_or_create(&labels)
                .set(gauge_value(messages));
            match topic_lag.latency_ms {
                Some(latency_ms) => {
                    self.lag_latency_ms
                        .get_or_create(&labels)
                        .set(gauge_value(latency_ms));
                }
                // Unknown this poll: a stale value would be worse than no series.
                None => {
                    self.lag_latency_ms.remove(&labels);
                }
            }
            series.topics.insert(labels);
        }
        for sample in &lag.queues {
            let QueueLag::Known { messages, .. } = sample.lag else {
                continue;
            };
            let labels = QueueLabels {
                cluster: cluster.to_string(),
                consumer_group: group.to_string(),
                topic: sample.key.topic.clone(),
                broker: sample.key.broker.clone(),
                queue_id: sample.key.queue_id.to_string(),
            };
            self.queue_lag_messages
                .get_or_create(&labels)
                .set(gauge_value(messages));
            series.queues.insert(labels);
        }
        let stalled = matches!(progress, Progress::Stalled { .. });
        self.group_stalled
            .get_or_create(&group_labels)
            .set(i64::from(stalled));
        let mut published = self.published.lock().expect("metrics lock poisoned");
        if let Some(previous) = published.insert(group_labels.clone(), series) {
            self.remove_missing(&previous, published.get(&group_labels));
        }
    }

    fn remove_missing(&self, previous: &PublishedSeries, current: Option<&PublishedSeries>) {
        let empty = PublishedSeries::default();
        let current = current.unwrap_or(&empty);
        for labels in previous.topics.difference(&current.topics) {
            self.lag_messages.remove(labels);
            self.lag_latency_ms.remove(labels);
        }
        for labels in previous.queues.difference(&current.queues) {
            self.queue_lag_messages.remove(labels);
        }
    }

    /// Removes every series of a deleted group.
    pub fn forget_group(&self, cluster: &str, group: &str) {
        let group_labels = GroupLabels {
            cluster: cluster.to_string(),
            consumer_group: group.to_string(),
        };
        let previous = self
            .published
            .lock()
            .expect("metrics lock poisoned")
            .remove(&group_labels);
        if let Some(previous) = previous {
            self.remove_missing(&previous, None);
        }
        self.group_stalled.remove(&group_labels);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::{QueueConsumeStats, QueueOffset};
    use crate::lag::group_lag;

    fn queue(topic: &str, queue_id: i32, max: u64, committed: Option<u64>) -> QueueConsumeStats {
        QueueConsumeStats {
            topic: topic.to_string(),
            broker_name: "qb-0".to_string(),
            queue_id,
            broker_offset: QueueOffset(max),
            consumer_offset: committed.map(QueueOffset),
            oldest_unconsumed_store_ms: Some(1_000),
        }
    }

    #[test]
    fn lag_series_follow_the_contract_names() {
        let metrics = Metrics::default();
        let lag = group_lag(
            &[queue("orders", 0, 10, Some(4)), queue("fresh", 0, 10, None)],
            &[],
            3_000,
        );
        metrics.set_group_lag(
            "qb",
            "billing",
            &lag,
            Progress::Stalled { unmoved_polls: 3 },
        );
        metrics.reconciled("broker", Duration::from_millis(12));
        metrics.reconcile_failed("broker", "kube");
        let text = metrics.encode();
        for expected in [
            r#"rocketmq_consumer_lag_messages{cluster="qb",consumer_group="billing",topic="orders"} 6"#,
            r#"rocketmq_consumer_lag_latency{cluster="qb",consumer_group="billing",topic="orders"} 2000"#,
            r#"quiver_consumer_queue_lag_messages{cluster="qb",consumer_group="billing",topic="orders",broker="qb-0",queue_id="0"} 6"#,
            r#"quiver_consumer_group_stalled{cluster="qb",consumer_group="billing"} 1"#,
            r#"quiver_reconcile_total{controller="broker"} 1"#,
            r#"quiver_reconcile_errors_total{controller="broker",error="kube"} 1"#,
            r#"quiver_reconcile_duration_seconds_count{controller="broker"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        assert!(
            !text.contains(r#"topic="fresh""#),
            "no series for a topic without a commit:\n{text}"
        );
    }

    #[test]
    fn vanished_topics_and_deleted_groups_lose_their_series() {
        let metrics = Metrics::default();
        let both = group_lag(
            &[queue("a", 0, 10, Some(4)), queue("b", 0, 10, Some(4))],
            &[],
            3_000,
        );
        metrics.set_group_lag("qb", "g", &both, Progress::Moving);
        let only_a = group_lag(&[queue("a", 0, 10, Some(5))], &[], 3_000);
        metrics.set_group_lag("qb", "g", &only_a, Progress::Moving);
        let text = metrics.encode();
        assert!(text.contains(
            r#"rocketmq_consumer_lag_messages{cluster="qb",consumer_group="g",topic="a"} 5"#
        ));
        assert!(!text.contains(r#"topic="b""#), "{text}");
        metrics.forget_group("qb", "g");
        let text = metrics.encode();
        assert!(!text.contains(r#"consumer_group="g""#), "{text}");
    }
}
