//! The operator's Prometheus metrics (docs/METRICS.md); one struct owns the registry.
//!
//! Every series of a group carries `namespace`, `cluster` (the Broker) and `consumer_group`, so
//! same-named Brokers or groups in two namespaces never share a series.

use crate::lag::{GroupLag, Progress, QueueKey, QueueLag, StalledQueues};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

/// Labels of per-group series, and the identity of a group's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct GroupLabels {
    /// Namespace of the ConsumerGroup (and of its Broker).
    pub namespace: String,
    /// Broker resource name.
    pub cluster: String,
    /// Consumer group.
    pub consumer_group: String,
}

impl GroupLabels {
    /// The series identity of group `consumer_group` on Broker `cluster` in `namespace`.
    pub fn new(namespace: &str, cluster: &str, consumer_group: &str) -> GroupLabels {
        GroupLabels {
            namespace: namespace.to_string(),
            cluster: cluster.to_string(),
            consumer_group: consumer_group.to_string(),
        }
    }
}

/// Labels of per-topic lag series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TopicLabels {
    /// The group.
    #[prometheus(flatten)]
    pub group: GroupLabels,
    /// Topic.
    pub topic: String,
}

/// Labels of per-queue lag series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct QueueLabels {
    /// The group.
    #[prometheus(flatten)]
    pub group: GroupLabels,
    /// Topic.
    pub topic: String,
    /// Broker name.
    pub broker: String,
    /// Queue id.
    pub queue_id: String,
}

/// Labels of the one-hot progress series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct StatusLabels {
    /// The group.
    #[prometheus(flatten)]
    pub group: GroupLabels,
    /// One of [`Progress::LABELS`].
    pub status: String,
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
    group_stalled_queues: Family<GroupLabels, Gauge>,
    queue_stalled_since: Family<QueueLabels, Gauge>,
    group_status: Family<StatusLabels, Gauge>,
    poll_success: Family<GroupLabels, Gauge>,
    reconciles: Family<ControllerLabels, Counter>,
    reconcile_errors: Family<ErrorLabels, Counter>,
    reconcile_duration: Family<ControllerLabels, Histogram>,
    published: Mutex<BTreeMap<GroupLabels, PublishedSeries>>,
    /// Per group, the stalled queues given a series (at most the status lists).
    published_stalled: Mutex<BTreeMap<GroupLabels, BTreeSet<QueueLabels>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut metrics = Metrics {
            registry: Registry::default(),
            lag_messages: Family::default(),
            lag_latency_ms: Family::default(),
            queue_lag_messages: Family::default(),
            group_stalled: Family::default(),
            group_stalled_queues: Family::default(),
            queue_stalled_since: Family::default(),
            group_status: Family::default(),
            poll_success: Family::default(),
            reconciles: Family::default(),
            reconcile_errors: Family::default(),
            reconcile_duration: Family::new_with_constructor(
                (|| Histogram::new(exponential_buckets(0.005, 2.0, 14))) as fn() -> Histogram,
            ),
            published: Mutex::new(BTreeMap::new()),
            published_stalled: Mutex::new(BTreeMap::new()),
        };
        metrics.register_group_series();
        metrics.register_reconcile_series();
        metrics
    }
}

fn gauge_value(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

impl Metrics {
    fn register_group_series(&mut self) {
        let registry = &mut self.registry;
        registry.register(
            "rocketmq_consumer_lag_messages",
            "Unconsumed messages over queues with a commit",
            self.lag_messages.clone(),
        );
        registry.register(
            "rocketmq_consumer_lag_latency",
            "Milliseconds since the oldest unconsumed message was stored, 0 when caught up",
            self.lag_latency_ms.clone(),
        );
        registry.register(
            "quiver_consumer_queue_lag_messages",
            "Unconsumed messages per queue",
            self.queue_lag_messages.clone(),
        );
        registry.register(
            "quiver_consumer_group_stalled",
            "1 when lag > 0 and no commit for the group's whole window",
            self.group_stalled.clone(),
        );
        registry.register(
            "quiver_consumer_group_stalled_queues",
            "Queues of the group with lag and no commit for its whole window, even while the \
             group's sums move",
            self.group_stalled_queues.clone(),
        );
        registry.register(
            "quiver_consumer_queue_stalled_since_timestamp_seconds",
            "Since when a stalled queue has had lag and no commit (Unix time); only the \
             queues the ConsumerGroup's status lists (at most 10 per group)",
            self.queue_stalled_since.clone(),
        );
        registry.register(
            "quiver_consumer_group_status",
            "1 for the group's judged status (ok, warning, stalled, stopped), 0 for the others",
            self.group_status.clone(),
        );
        registry.register(
            "quiver_lag_poll_success",
            "1 when the last lag poll of the group succeeded, 0 when it failed (no lag series then)",
            self.poll_success.clone(),
        );
    }

    fn register_reconcile_series(&mut self) {
        // prometheus-client appends `_total` to counters.
        self.registry.register(
            "quiver_reconcile",
            "Reconciliations run",
            self.reconciles.clone(),
        );
        self.registry.register(
            "quiver_reconcile_errors",
            "Failed reconciliations by error kind",
            self.reconcile_errors.clone(),
        );
        self.registry.register(
            "quiver_reconcile_duration_seconds",
            "Reconcile duration",
            self.reconcile_duration.clone(),
        );
    }

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

    /// Publishes a successful poll: the lag (topics without a commit get no series, unknown is
    /// not zero), the judged progress, whether it is stalled (`None`: unknown), and poll
    /// success. Series no longer present are removed.
    pub fn set_group_lag(
        &self,
        group: &GroupLabels,
        lag: &GroupLag,
        progress: Progress,
        stalled: Option<bool>,
    ) {
        let mut series = PublishedSeries::default();
        for (topic, topic_lag) in &lag.topics {
            let Some(messages) = topic_lag.messages else {
                continue;
            };
            let labels = TopicLabels {
                group: group.clone(),
                topic: topic.clone(),
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
                group: group.clone(),
                topic: sample.key.topic.clone(),
                broker: sample.key.broker.clone(),
                queue_id: sample.key.queue_id.to_string(),
            };
            self.queue_lag_messages
                .get_or_create(&labels)
                .set(gauge_value(messages));
            series.queues.insert(labels);
        }
        self.replace_published(group, series);
        self.set_progress(group, progress, stalled);
        self.poll_success.get_or_create(group).set(1);
    }

    /// A failed poll: the group's lag is unknown, so its lag and progress series go (old values
    /// would read as current) and `quiver_lag_poll_success` is 0.
    pub fn lag_unknown(&self, group: &GroupLabels) {
        self.replace_published(group, PublishedSeries::default());
        self.set_stalled_queues(group, None);
        self.set_progress(group, Progress::Unknown, None);
        self.poll_success.get_or_create(group).set(0);
    }

    /// Removes every series of a deleted group.
    pub fn forget_group(&self, group: &GroupLabels) {
        self.lag_unknown(group);
        self.published
            .lock()
            .expect("metrics lock poisoned")
            .remove(group);
        self.published_stalled
            .lock()
            .expect("metrics lock poisoned")
            .remove(group);
        self.poll_success.remove(group);
    }

    /// Publishes the stalled queues of a judgement: their count, and since when each listed
    /// one stalled (the others have no series: the labels stay bounded). `None`: not judged,
    /// so both go.
    pub fn set_stalled_queues(&self, group: &GroupLabels, stalled: Option<&StalledQueues>) {
        let labels_of = |key: &QueueKey| QueueLabels {
            group: group.clone(),
            topic: key.topic.clone(),
            broker: key.broker.clone(),
            queue_id: key.queue_id.to_string(),
        };
        let mut current = BTreeSet::new();
        match stalled {
            Some(stalled) => {
                let count = u64::try_from(stalled.count).unwrap_or(u64::MAX);
                self.group_stalled_queues
                    .get_or_create(group)
                    .set(gauge_value(count));
                for (key, run) in &stalled.listed {
                    let labels = labels_of(key);
                    self.queue_stalled_since
                        .get_or_create(&labels)
                        .set(run.since_ms.div_euclid(1000));
                    current.insert(labels);
                }
            }
            None => {
                self.group_stalled_queues.remove(group);
            }
        }
        let mut published = self
            .published_stalled
            .lock()
            .expect("metrics lock poisoned");
        let previous = published.insert(group.clone(), current).unwrap_or_default();
        for labels in previous.difference(&published[group]) {
            self.queue_stalled_since.remove(labels);
        }
    }

    fn set_progress(&self, group: &GroupLabels, progress: Progress, stalled: Option<bool>) {
        let current = progress.label();
        for status in Progress::LABELS {
            let labels = StatusLabels {
                group: group.clone(),
                status: status.to_string(),
            };
            match current {
                Some(current) => {
                    self.group_status
                        .get_or_create(&labels)
                        .set(i64::from(current == status));
                }
                None => {
                    self.group_status.remove(&labels);
                }
            }
        }
        match stalled {
            Some(stalled) => {
                self.group_stalled
                    .get_or_create(group)
                    .set(i64::from(stalled));
            }
            None => {
                self.group_stalled.remove(group);
            }
        }
    }

    fn replace_published(&self, group: &GroupLabels, current: PublishedSeries) {
        let mut published = self.published.lock().expect("metrics lock poisoned");
        let previous = published.insert(group.clone(), current).unwrap_or_default();
        let current = &published[group];
        for labels in previous.topics.difference(&current.topics) {
            self.lag_messages.remove(labels);
            self.lag_latency_ms.remove(labels);
        }
        for labels in previous.queues.difference(&current.queues) {
            self.queue_lag_messages.remove(labels);
        }
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

    fn billing(namespace: &str) -> GroupLabels {
        GroupLabels::new(namespace, "qb", "billing")
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
            &billing("ns"),
            &lag,
            Progress::Stalled { since_ms: 0 },
            Some(true),
        );
        metrics.reconciled("broker", Duration::from_millis(12));
        metrics.reconcile_failed("broker", "kube");
        let text = metrics.encode();
        for expected in [
            r#"rocketmq_consumer_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="orders"} 6"#,
            r#"rocketmq_consumer_lag_latency{namespace="ns",cluster="qb",consumer_group="billing",topic="orders"} 2000"#,
            r#"quiver_consumer_queue_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-0",queue_id="0"} 6"#,
            r#"quiver_consumer_group_stalled{namespace="ns",cluster="qb",consumer_group="billing"} 1"#,
            r#"quiver_consumer_group_status{namespace="ns",cluster="qb",consumer_group="billing",status="stalled"} 1"#,
            r#"quiver_consumer_group_status{namespace="ns",cluster="qb",consumer_group="billing",status="ok"} 0"#,
            r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"} 1"#,
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
        metrics.set_group_lag(&billing("ns"), &both, Progress::Ok, Some(false));
        let only_a = group_lag(&[queue("a", 0, 10, Some(5))], &[], 3_000);
        metrics.set_group_lag(&billing("ns"), &only_a, Progress::Ok, Some(false));
        let text = metrics.encode();
        assert!(text.contains(
            r#"rocketmq_consumer_lag_messages{namespace="ns",cluster="qb",consumer_group="billing",topic="a"} 5"#
        ));
        assert!(!text.contains(r#"topic="b""#), "{text}");
        metrics.forget_group(&billing("ns"));
        let text = metrics.encode();
        assert!(!text.contains(r#"consumer_group="billing""#), "{text}");
    }

    #[test]
    fn same_named_groups_in_two_namespaces_keep_their_own_series() {
        let metrics = Metrics::default();
        let lag_of = |committed| group_lag(&[queue("orders", 0, 10, Some(committed))], &[], 3_000);
        metrics.set_group_lag(&billing("team-a"), &lag_of(4), Progress::Ok, Some(false));
        metrics.set_group_lag(&billing("team-b"), &lag_of(9), Progress::Ok, Some(false));
        let text = metrics.encode();
        for expected in [
            r#"rocketmq_consumer_lag_messages{namespace="team-a",cluster="qb",consumer_group="billing",topic="orders"} 6"#,
            r#"rocketmq_consumer_lag_messages{namespace="team-b",cluster="qb",consumer_group="billing",topic="orders"} 1"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        metrics.forget_group(&billing("team-a"));
        let text = metrics.encode();
        assert!(!text.contains(r#"namespace="team-a""#), "{text}");
        assert!(
            text.contains(r#"rocketmq_consumer_lag_messages{namespace="team-b",cluster="qb",consumer_group="billing",topic="orders"} 1"#),
            "deleting one group keeps the other's series:\n{text}"
        );
    }

    #[test]
    fn a_failed_poll_drops_the_lag_and_says_so() {
        let metrics = Metrics::default();
        let lag = group_lag(&[queue("orders", 0, 10, Some(4))], &[], 3_000);
        metrics.set_group_lag(&billing("ns"), &lag, Progress::Ok, Some(false));
        metrics.lag_unknown(&billing("ns"));
        let text = metrics.encode();
        assert!(
            text.contains(
                r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"} 0"#
            ),
            "{text}"
        );
        for gone in [
            "rocketmq_consumer_lag_messages{",
            "rocketmq_consumer_lag_latency{",
            "quiver_consumer_queue_lag_messages{",
            "quiver_consumer_group_stalled{",
            "quiver_consumer_group_status{",
        ] {
            assert!(!text.contains(gone), "{gone} still exported:\n{text}");
        }
        metrics.set_group_lag(&billing("ns"), &lag, Progress::Ok, Some(false));
        assert!(metrics.encode().contains(
            r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"} 1"#
        ));
    }

    fn stalled_queue(queue_id: i32, since_ms: i64) -> (QueueKey, crate::lag::QueueRun) {
        let key = QueueKey {
            topic: "orders".into(),
            broker: "qb-1".into(),
            queue_id,
        };
        let run = crate::lag::QueueRun {
            committed: QueueOffset(40),
            lag: 5,
            since_ms,
        };
        (key, run)
    }

    #[test]
    fn stalled_queues_are_counted_and_the_listed_ones_named() {
        let metrics = Metrics::default();
        let two = StalledQueues {
            listed: vec![
                stalled_queue(3, 1_700_000_000_500),
                stalled_queue(5, 1_700_000_100_000),
            ],
            count: 12,
        };
        metrics.set_stalled_queues(&billing("ns"), Some(&two));
        let text = metrics.encode();
        for expected in [
            r#"quiver_consumer_group_stalled_queues{namespace="ns",cluster="qb",consumer_group="billing"} 12"#,
            r#"quiver_consumer_queue_stalled_since_timestamp_seconds{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-1",queue_id="3"} 1700000000"#,
            r#"quiver_consumer_queue_stalled_since_timestamp_seconds{namespace="ns",cluster="qb",consumer_group="billing",topic="orders",broker="qb-1",queue_id="5"} 1700000100"#,
        ] {
            assert!(text.contains(expected), "missing {expected} in\n{text}");
        }
        let one = StalledQueues {
            listed: vec![stalled_queue(5, 1_700_000_100_000)],
            count: 1,
        };
        metrics.set_stalled_queues(&billing("ns"), Some(&one));
        let text = metrics.encode();
        assert!(
            !text.contains(r#"queue_id="3""#),
            "queue 3 moved on:\n{text}"
        );
        assert!(text.contains(r#"quiver_consumer_group_stalled_queues{namespace="ns",cluster="qb",consumer_group="billing"} 1"#));
        metrics.lag_unknown(&billing("ns"));
        let text = metrics.encode();
        for gone in [
            "quiver_consumer_group_stalled_queues{",
            "quiver_consumer_queue_stalled_since_timestamp_seconds{",
        ] {
            assert!(!text.contains(gone), "{gone} still exported:\n{text}");
        }
        metrics.set_stalled_queues(&billing("ns"), Some(&one));
        metrics.forget_group(&billing("ns"));
        assert!(!metrics.encode().contains(r#"consumer_group="billing""#));
    }

    /// What the operator exports for the real-Prometheus e2e (e2e/prometheus serves this file as
    /// the operator's /metrics): two same-named groups in two namespaces, and a third whose poll
    /// failed.
    fn e2e_exposition() -> String {
        let metrics = Metrics::default();
        let lag_of =
            |committed| group_lag(&[queue("orders", 0, 5_000, Some(committed))], &[], 3_000);
        let warning = Progress::Warning {
            since_ms: 0,
            from: 10,
        };
        metrics.set_group_lag(
            &billing("team-a"),
            &lag_of(4_990),
            Progress::Ok,
            Some(false),
        );
        metrics.set_group_lag(&billing("team-b"), &lag_of(2_000), warning, Some(false));
        let no_queue = StalledQueues::default();
        metrics.set_stalled_queues(&billing("team-a"), Some(&no_queue));
        let one_queue = StalledQueues {
            listed: vec![stalled_queue(3, 1_700_000_000_000)],
            count: 1,
        };
        metrics.set_stalled_queues(&billing("team-b"), Some(&one_queue));
        let unknown = GroupLabels::new("team-c", "qb", "audit");
        metrics.set_group_lag(&unknown, &lag_of(10), Progress::Ok, Some(false));
        metrics.lag_unknown(&unknown);
        metrics.encode()
    }

    /// `text` with each family's samples sorted: a family's order is a hash map's.
    fn sorted_samples(text: &str) -> String {
        let mut out: Vec<String> = Vec::new();
        let mut samples: Vec<&str> = Vec::new();
        for line in text.lines() {
            if line.starts_with('#') {
                samples.sort_unstable();
                out.extend(samples.drain(..).map(str::to_string));
                out.push(line.to_string());
            } else {
                samples.push(line);
            }
        }
        samples.sort_unstable();
        out.extend(samples.into_iter().map(str::to_string));
        out.join("\n") + "\n"
    }

    #[test]
    fn the_e2e_exposition_is_what_the_operator_exports() {
        let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../e2e/prometheus/operator-metrics.txt");
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        let exported = sorted_samples(&e2e_exposition());
        if std::env::var_os("QUIVER_REGENERATE").is_some() {
            std::fs::write(&path, &exported).expect("write the e2e exposition");
            return;
        }
        assert!(
            committed == exported,
            "{} differs from Metrics: rerun with QUIVER_REGENERATE=1",
            path.display()
        );
    }
}
