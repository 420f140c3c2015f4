//! Broker metrics (docs/METRICS.md): counters kept here, gauges computed at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};

use parking_lot::Mutex;
use quiver_store::QueueOffset;

use crate::broker::Broker;

#[derive(Default, Clone, Copy)]
struct Flow {
    messages: u64,
    body_bytes: u64,
}

/// Counters of traffic, labelled by topic (in) and topic + group (out).
#[derive(Default)]
pub struct Metrics {
    inbound: Mutex<BTreeMap<String, Flow>>,
    outbound: Mutex<BTreeMap<(String, String), Flow>>,
    pub connections: AtomicI64,
}

impl Metrics {
    pub fn record_in(&self, topic: &str, messages: u64, body_bytes: u64) {
        let mut inbound = self.inbound.lock();
        // A topic's key is allocated once, on its first message, not on every send.
        let flow = match inbound.get_mut(topic) {
            Some(flow) => flow,
            None => inbound.entry(topic.to_owned()).or_default(),
        };
        flow.messages += messages;
        flow.body_bytes += body_bytes;
    }

    pub fn record_out(&self, topic: &str, group: &str, messages: u64, body_bytes: u64) {
        let mut outbound = self.outbound.lock();
        let flow = outbound
            .entry((topic.to_string(), group.to_string()))
            .or_default();
        flow.messages += messages;
        flow.body_bytes += body_bytes;
    }
}

/// Escapes a label value for the Prometheus text format.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Per (group, topic) lag: messages, age of the oldest unconsumed message, committed sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupTopicLag {
    pub lag_messages: u64,
    pub lag_latency_ms: i64,
    pub committed_sum: u64,
}

/// Lag of every (group, topic) with a commit; blocking (reads store timestamps).
pub fn consumer_lag(broker: &Broker, now_ms: i64) -> BTreeMap<(String, String), GroupTopicLag> {
    let mut result = BTreeMap::new();
    for group in broker.offsets.groups() {
        for topic in broker.offsets.topics_of(&group) {
            let mut lag = GroupTopicLag::default();
            for (queue_id, QueueOffset(committed)) in broker.offsets.table(&group, &topic) {
                let QueueOffset(max) = broker.store.max_offset(&topic, queue_id);
                lag.committed_sum += committed;
                lag.lag_messages += max.saturating_sub(committed);
                if committed < max {
                    if let Ok(Some(stored_ms)) =
                        broker
                            .store
                            .store_timestamp(&topic, queue_id, QueueOffset(committed))
                    {
                        lag.lag_latency_ms = lag.lag_latency_ms.max((now_ms - stored_ms).max(0));
                    }
                }
            }
            result.insert((group.clone(), topic), lag);
        }
    }
    result
}

/// The exposition while the store recovers: not ready, nothing else known yet.
pub fn render_recovering(cluster: &str) -> String {
    let mut out = String::new();
    header(
        &mut out,
        "quiver_broker_ready",
        "gauge",
        "1 once recovery finished and the broker serves.",
    );
    let _ = writeln!(
        out,
        "quiver_broker_ready{{cluster=\"{}\"}} 0",
        label(cluster)
    );
    out
}

/// The Prometheus text exposition of the broker; blocking (reads the store).
pub fn render(broker: &Broker, now_ms: i64) -> String {
    let cluster = label(&broker.config.cluster);
    let mut out = String::new();
    let inbound = broker.metrics.inbound.lock().clone();
    header(
        &mut out,
        "rocketmq_messages_in_total",
        "counter",
        "Messages stored.",
    );
    for (topic, flow) in &inbound {
        let _ = writeln!(
            out,
            "rocketmq_messages_in_total{{cluster=\"{cluster}\",topic=\"{}\"}} {}",
            label(topic),
            flow.messages
        );
    }
    header(
        &mut out,
        "rocketmq_throughput_in_total",
        "counter",
        "Body bytes stored.",
    );
    for (topic, flow) in &inbound {
        let _ = writeln!(
            out,
            "rocketmq_throughput_in_total{{cluster=\"{cluster}\",topic=\"{}\"}} {}",
            label(topic),
            flow.body_bytes
        );
    }
    let outbound = broker.metrics.outbound.lock().clone();
    header(
        &mut out,
        "rocketmq_messages_out_total",
        "counter",
        "Messages returned by pulls.",
    );
    for ((topic, group), flow) in &outbound {
        let _ = writeln!(
            out,
            "rocketmq_messages_out_total{{cluster=\"{cluster}\",topic=\"{}\",consumer_group=\"{}\"}} {}",
            label(topic),
            label(group),
            flow.messages
        );
    }
    header(
        &mut out,
        "rocketmq_throughput_out_total",
        "counter",
        "Body bytes returned by pulls.",
    );
    for ((topic, group), flow) in &outbound {
        let _ = writeln!(
            out,
            "rocketmq_throughput_out_total{{cluster=\"{cluster}\",topic=\"{}\",consumer_group=\"{}\"}} {}",
            label(topic),
            label(group),
            flow.body_bytes
        );
    }
    let lag = consumer_lag(broker, now_ms);
    header(
        &mut out,
        "rocketmq_consumer_lag_messages",
        "gauge",
        "Sum over queues with a commit of max(0, maxOffset - committedOffset).",
    );
    for ((group, topic), value) in &lag {
        let _ = writeln!(
            out,
            "rocketmq_consumer_lag_messages{{cluster=\"{cluster}\",consumer_group=\"{}\",topic=\"{}\"}} {}",
            label(group),
            label(topic),
            value.lag_messages
        );
    }
    header(
        &mut out,
        "rocketmq_consumer_lag_latency",
        "gauge",
        "Milliseconds since the oldest unconsumed message was stored; 0 when caught up.",
    );
    for ((group, topic), value) in &lag {
        let _ = writeln!(
            out,
            "rocketmq_consumer_lag_latency{{cluster=\"{cluster}\",consumer_group=\"{}\",topic=\"{}\"}} {}",
            label(group),
            label(topic),
            value.lag_latency_ms
        );
    }
    header(
        &mut out,
        "quiver_consumer_committed_offset",
        "gauge",
        "Sum over queues of committed offsets.",
    );
    for ((group, topic), value) in &lag {
        let _ = writeln!(
            out,
            "quiver_consumer_committed_offset{{cluster=\"{cluster}\",consumer_group=\"{}\",topic=\"{}\"}} {}",
            label(group),
            label(topic),
            value.committed_sum
        );
    }
    let stats = broker.store.stats();
    let gauges: [(&str, &str, u64); 7] = [
        (
            "quiver_store_disk_used_bytes",
            "Bytes used on the store's file system.",
            stats.disk_used_bytes,
        ),
        (
            "quiver_store_disk_total_bytes",
            "Size of the store's file system.",
            stats.disk_total_bytes,
        ),
        (
            "quiver_store_commitlog_bytes",
            "Bytes held by CommitLog segment files.",
            stats.commitlog_bytes,
        ),
        (
            "quiver_broker_ready",
            "1 once recovery finished and the broker serves.",
            u64::from(broker.is_ready()),
        ),
        (
            "quiver_broker_writable",
            "1 when brokerPermission allows writes.",
            u64::from(broker.is_writable()),
        ),
        (
            "quiver_connections",
            "Open client connections.",
            u64::try_from(broker.metrics.connections.load(Ordering::Relaxed)).unwrap_or(0),
        ),
        (
            "quiver_parked_pulls",
            "Pull requests parked for long polling.",
            broker.long_poll.parked_count() as u64,
        ),
    ];
    for (name, help, value) in gauges {
        header(&mut out, name, "gauge", help);
        let _ = writeln!(out, "{name}{{cluster=\"{cluster}\"}} {value}");
    }
    render_disk(broker, &cluster, &mut out);
    out
}

/// The data disk, the write gate and retention's deletions.
fn render_disk(broker: &Broker, cluster: &str, out: &mut String) {
    let store = &broker.store;
    let disk = store.disk_status();
    let gauges: [(&str, &str, f64); 4] = [
        (
            "quiver_store_disk_used_ratio",
            "Used share of the store's file system.",
            disk.used_ratio,
        ),
        (
            "quiver_store_disk_free_bytes",
            "Bytes of the store's file system the broker may still use.",
            disk.available_bytes as f64,
        ),
        (
            "quiver_store_disk_high_water_ratio",
            "disk-high-water-ratio: above it sends are refused.",
            disk.high_water_ratio,
        ),
        (
            "quiver_store_writable",
            "1 while the store takes writes; 0 while a full or failed disk refuses them.",
            if disk.refusal.is_none() { 1.0 } else { 0.0 },
        ),
    ];
    for (name, help, value) in gauges {
        header(out, name, "gauge", help);
        let _ = writeln!(out, "{name}{{cluster=\"{cluster}\"}} {value}");
    }
    header(
        out,
        "quiver_store_write_refusal",
        "gauge",
        "1 for the reason the store refuses writes now; absent while it takes them.",
    );
    if let Some(refusal) = &disk.refusal {
        let _ = writeln!(
            out,
            "quiver_store_write_refusal{{cluster=\"{cluster}\",reason=\"{}\"}} 1",
            refusal.reason.as_str()
        );
    }
    let refusals = store
        .write_refusals()
        .into_iter()
        .map(|(reason, count)| (reason.as_str(), count));
    counter_by_reason(
        out,
        cluster,
        "quiver_store_write_refusals_total",
        "Writes (sends, retries, scheduled deliveries) refused by the store, by reason.",
        refusals,
    );
    let deletions = store
        .deleted_segments()
        .into_iter()
        .map(|(reason, count)| (reason.as_str(), count));
    counter_by_reason(
        out,
        cluster,
        "quiver_store_segments_deleted_total",
        "CommitLog files deleted by retention, by reason.",
        deletions,
    );
}

/// One counter family labelled by `reason`, every reason listed (0 included).
fn counter_by_reason(
    out: &mut String,
    cluster: &str,
    name: &str,
    help: &str,
    counts: impl Iterator<Item = (&'static str, u64)>,
) {
    header(out, name, "counter", help);
    for (reason, count) in counts {
        let _ = writeln!(
            out,
            "{name}{{cluster=\"{cluster}\",reason=\"{reason}\"}} {count}"
        );
    }
}
