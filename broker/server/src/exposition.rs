//! The `/metrics` exposition (docs/METRICS.md): the broker's traffic counters ([`Metrics`])
//! and everything else read from the broker at scrape time, through one prometheus-client
//! collector.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use quiver_store::QueueOffset;

use crate::broker::{Broker, BrokerSlot};
use crate::metrics::Metrics;
use crate::tls::TlsServer;

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
    for group in broker.offsets().groups() {
        for topic in broker.offsets().topics_of(&group) {
            let mut lag = GroupTopicLag::default();
            for (queue_id, QueueOffset(committed)) in broker.offsets().table(&group, &topic) {
                let QueueOffset(max) = broker.store().max_offset(&topic, queue_id);
                lag.committed_sum += committed;
                lag.lag_messages += max.saturating_sub(committed);
                if committed < max {
                    if let Ok(Some(stored_ms)) =
                        broker
                            .store()
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

/// The registry of the HTTP port: the broker's collector, every series labelled `cluster`.
pub fn registry(cluster: &str, broker: BrokerSlot, tls: Option<Arc<TlsServer>>) -> Registry {
    let cluster_label = (Cow::Borrowed("cluster"), Cow::Owned(cluster.to_owned()));
    let mut registry = Registry::with_labels(std::iter::once(cluster_label));
    registry.register_collector(Box::new(BrokerCollector { broker }));
    if let Some(tls) = tls {
        registry.register_collector(Box::new(TlsCollector { tls }));
    }
    registry
}

/// Handshake failures and certificate reloads, with TLS on.
struct TlsCollector {
    tls: Arc<TlsServer>,
}

impl fmt::Debug for TlsCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsCollector").finish_non_exhaustive()
    }
}

impl Collector for TlsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let failures = self.tls.handshake_failures();
        counter_family(
            &mut encoder,
            "quiver_tls_handshake_failures_total",
            "TLS handshakes that failed on the remoting and HTTP ports, by reason.",
            failures
                .iter()
                .map(|&(reason, count)| ([("reason", reason)], count)),
        )?;
        let (reloaded, failed) = self.tls.reload_counts();
        counter_family(
            &mut encoder,
            "quiver_tls_reloads_total",
            "Re-reads of the TLS certificate files after they changed, by result (a failed one keeps the certificate in force).",
            [([("result", "ok")], reloaded), ([("result", "failed")], failed)],
        )
    }
}

/// The Prometheus text exposition (format 0.0.4, the one the broker always served; counters
/// keep their `_total` names in TYPE lines); blocking (the collector reads the store).
pub fn encode(registry: &Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut text, registry)
        .expect("writing to a String cannot fail");
    text
}

/// The Content-Type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

const READY_HELP: &str = "1 once recovery finished and the broker serves.";

/// Reads every series at scrape time; while the store recovers only `quiver_broker_ready 0`.
struct BrokerCollector {
    broker: BrokerSlot,
}

impl fmt::Debug for BrokerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BrokerCollector").finish_non_exhaustive()
    }
}

impl Collector for BrokerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
        let Some(broker) = self.broker.get() else {
            return gauge(&mut encoder, "quiver_broker_ready", READY_HELP, 0u64);
        };
        encode_traffic(&mut encoder, broker.metrics())?;
        encode_lag(&mut encoder, &consumer_lag(broker, crate::now_ms()))?;
        encode_broker(&mut encoder, broker)?;
        encode_transactions(&mut encoder, broker)?;
        encode_timers(&mut encoder, broker.timers())?;
        encode_pop(&mut encoder, broker.pop())?;
        encode_disk(&mut encoder, broker)?;
        encode_grpc(&mut encoder, broker)?;
        if let Some(replication) = &broker.replication() {
            encode_replication(&mut encoder, &replication.status(broker.store()))?;
            encode_rebuilds(&mut encoder, replication, broker.store())?;
            gauge(
                &mut encoder,
                "quiver_replication_consensus_leader",
                "1 while this member leads its group's consensus (and so decides elections).",
                u64::from(replication.leads_consensus()),
            )?;
            counter_family(
                &mut encoder,
                "quiver_replication_switchovers_total",
                "Mastership changes this member had the group agree, by cause: planned \
                 (QUIVER_SWITCHOVER) and shutdown (SIGTERM) on the old master, failover (an \
                 election replacing a master that did not hand over) on the consensus leader; \
                 sum over the group's members.",
                replication
                    .switchovers()
                    .into_iter()
                    .map(|(cause, count)| ([("cause", cause)], count)),
            )?;
        }
        if let Some(file) = broker.peers_file() {
            let (reloaded, failed) = file.reload_counts();
            counter_family(
                &mut encoder,
                "quiver_peers_reloads_total",
                "Re-reads of the config file's peers after it changed, by result (a failed one keeps the peers in force).",
                [([("result", "ok")], reloaded), ([("result", "failed")], failed)],
            )?;
        }
        match &broker.acl() {
            Some(acl) => encode_acl(&mut encoder, acl),
            None => Ok(()),
        }
    }
}

fn encode_traffic(encoder: &mut DescriptorEncoder<'_>, metrics: &Metrics) -> fmt::Result {
    let inbound = metrics.inbound_totals();
    let by_topic = |pick: fn((u64, u64)) -> u64| {
        inbound
            .iter()
            .map(move |(topic, &flow)| ([("topic", topic.as_str())], pick(flow)))
    };
    counter_family(
        encoder,
        "rocketmq_messages_in_total",
        "Messages stored.",
        by_topic(|(messages, _)| messages),
    )?;
    counter_family(
        encoder,
        "rocketmq_throughput_in_total",
        "Body bytes stored.",
        by_topic(|(_, body_bytes)| body_bytes),
    )?;
    let outbound = metrics.outbound_totals();
    let by_topic_group = |pick: fn((u64, u64)) -> u64| {
        outbound.iter().map(move |((topic, group), &flow)| {
            let labels = [
                ("topic", topic.as_str()),
                ("consumer_group", group.as_str()),
            ];
            (labels, pick(flow))
        })
    };
    counter_family(
        encoder,
        "rocketmq_messages_out_total",
        "Messages returned by pulls.",
        by_topic_group(|(messages, _)| messages),
    )?;
    counter_family(
        encoder,
        "rocketmq_throughput_out_total",
        "Body bytes returned by pulls.",
        by_topic_group(|(_, body_bytes)| body_bytes),
    )?;
    let closed = metrics.connections_closed();
    counter_family(
        encoder,
        "quiver_connections_closed_total",
        "Client connections the broker closed, by reason.",
        closed
            .iter()
            .map(|&(reason, count)| ([("reason", reason)], count)),
    )
}

fn encode_lag(
    encoder: &mut DescriptorEncoder<'_>,
    lag: &BTreeMap<(String, String), GroupTopicLag>,
) -> fmt::Result {
    let by_group_topic = |pick: fn(&GroupTopicLag) -> u64| {
        lag.iter().map(move |((group, topic), value)| {
            let labels = [
                ("consumer_group", group.as_str()),
                ("topic", topic.as_str()),
            ];
            (labels, pick(value))
        })
    };
    gauge_family(
        encoder,
        "rocketmq_consumer_lag_messages",
        "Sum over queues with a commit of max(0, maxOffset - committedOffset).",
        by_group_topic(|lag| lag.lag_messages),
    )?;
    gauge_family(
        encoder,
        "rocketmq_consumer_lag_latency",
        "Milliseconds since the oldest unconsumed message was stored; 0 when caught up.",
        by_group_topic(|lag| u64::try_from(lag.lag_latency_ms).unwrap_or(0)),
    )?;
    gauge_family(
        encoder,
        "quiver_consumer_committed_offset",
        "Sum over queues of committed offsets.",
        by_group_topic(|lag| lag.committed_sum),
    )
}

/// The store's sizes and the broker's own state, one unlabelled (but `cluster`) gauge each.
fn encode_broker(encoder: &mut DescriptorEncoder<'_>, broker: &Broker) -> fmt::Result {
    let stats = broker.store().stats();
    let gauges: [(&str, &str, u64); 8] = [
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
            READY_HELP,
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
            u64::try_from(broker.connection_slots().open()).unwrap_or(0),
        ),
        (
            "quiver_parked_pulls",
            "Pull requests parked for long polling.",
            broker.long_poll().parked_count() as u64,
        ),
        (
            "quiver_inflight_bytes",
            "Bytes of client requests being read or processed (max-inflight-bytes counts them).",
            {
                let budget = &broker.read_budgets().shared;
                (budget.total - budget.semaphore.available_permits()) as u64
            },
        ),
    ];
    for (name, help, value) in gauges {
        gauge(encoder, name, help, value)?;
    }
    let budgets = broker.read_budgets();
    counter_family(
        encoder,
        "quiver_read_waits_total",
        "Times reading a connection paused because an in-flight byte budget was spent, by budget.",
        [
            ("broker", budgets.shared.waits.load(Ordering::Relaxed)),
            (
                "connection",
                budgets.per_connection.waits.load(Ordering::Relaxed),
            ),
        ]
        .map(|(budget, count)| ([("budget", budget)], count)),
    )?;
    counter_family(
        encoder,
        "quiver_parked_pulls_refused_total",
        "Long-polling pulls not parked because a bound was reached, by bound.",
        broker
            .long_poll()
            .refused_counts()
            .map(|(reason, count)| ([("reason", reason)], count)),
    )
}

/// The check-back service: checks sent (or without a live producer), half messages discarded.
fn encode_transactions(encoder: &mut DescriptorEncoder<'_>, broker: &Broker) -> fmt::Result {
    let (sent, unsent, discarded) = broker.transactions().counts();
    counter_family(
        encoder,
        "quiver_transaction_checks_total",
        "CHECK_TRANSACTION_STATE requests for half messages, by whether a producer connection took it.",
        [([("result", "sent")], sent), ([("result", "no_producer")], unsent)],
    )?;
    counter_family(
        encoder,
        "quiver_transaction_discarded_total",
        "Half messages checked back transaction-check-max times, moved to TRANS_CHECK_MAX_TIME_TOPIC.",
        [([("topic", crate::transaction::CHECK_MAX_TIME_TOPIC)], discarded)],
    )
}

/// The gRPC port (when on): calls by result, and the clients' open Telemetry streams.
fn encode_grpc(encoder: &mut DescriptorEncoder<'_>, broker: &Broker) -> fmt::Result {
    if broker.grpc().advertised.get().is_none() {
        return Ok(());
    }
    gauge(
        encoder,
        "quiver_grpc_telemetry_sessions",
        "RocketMQ 5.x clients with a Telemetry stream open to this broker.",
        broker.grpc().sessions.len() as u64,
    )?;
    counter_family(
        encoder,
        "quiver_grpc_calls_total",
        "gRPC calls answered, by call and apache.rocketmq.v2 result code.",
        broker
            .grpc()
            .call_counts()
            .into_iter()
            .map(|((call, code), count)| ([("call", call), ("code", code)], count)),
    )
}

/// A group member's replication: its role and epoch, the in-sync set, and (on the master)
/// each replica's lag.
fn encode_replication(
    encoder: &mut DescriptorEncoder<'_>,
    status: &quiver_protocol::body::ReplicationStatus,
) -> fmt::Result {
    use quiver_protocol::body::ReplicaRole;
    let me = status
        .replicas
        .iter()
        .find(|r| r.replica_id == status.replica_id);
    let role = me.map_or(ReplicaRole::Unknown, |r| r.role);
    gauge_family(
        encoder,
        "quiver_replication_role",
        "1 for this member's role in its broker group (master, replica, unknown).",
        [
            ReplicaRole::Master,
            ReplicaRole::Replica,
            ReplicaRole::Unknown,
        ]
        .map(|r| {
            let name = match r {
                ReplicaRole::Master => "master",
                ReplicaRole::Replica => "replica",
                ReplicaRole::Unknown => "unknown",
            };
            ([("role", name)], u64::from(r == role))
        }),
    )?;
    gauge(
        encoder,
        "quiver_replication_epoch",
        "The group's current epoch (one per master).",
        status.epoch,
    )?;
    gauge(
        encoder,
        "quiver_replication_in_sync_replicas",
        "Members of the group's in-sync set, the master included.",
        status.in_sync_replicas.len() as u64,
    )?;
    gauge(
        encoder,
        "quiver_replication_min_in_sync_replicas",
        "Sends are refused while fewer members than this are in sync.",
        u64::from(status.min_in_sync_replicas),
    )?;
    gauge(
        encoder,
        "quiver_replication_members",
        "Members of the group's agreed membership (consensus voters and learners), this one \
         included; follows `quiver replication members` changes.",
        status.replicas.len() as u64,
    )?;
    let members: Vec<(String, &str)> = status
        .replicas
        .iter()
        .map(|r| (r.replica_id.to_string(), r.address.as_str()))
        .collect();
    gauge_family(
        encoder,
        "quiver_replication_member",
        "1 for each member of the group's agreed membership, with its remoting address.",
        members
            .iter()
            .map(|(id, address)| ([("replica_id", id.as_str()), ("address", *address)], 1u64)),
    )?;
    gauge(
        encoder,
        "quiver_replication_confirmed_offset",
        "CommitLog bytes below this are held by every in-sync member (readable).",
        status.confirmed_offset,
    )?;
    if role != ReplicaRole::Master {
        return Ok(());
    }
    encode_replica_lags(encoder, status)
}

/// Rebuilds past the master's retention on this member, and what its retention keeps for
/// in-sync replicas (as master).
fn encode_rebuilds(
    encoder: &mut DescriptorEncoder<'_>,
    replication: &crate::replication::Replication,
    store: &quiver_store::MessageStore,
) -> fmt::Result {
    let rebuilds = replication.rebuild_stats();
    let hold = store.replica_hold_stats();
    gauge(
        encoder,
        "quiver_replication_rebuilding",
        "1 while this member rebuilds from its master's oldest retained segment (its own next \
         bytes were deleted by the master's retention) and has not caught up.",
        u64::from(rebuilds.rebuilding),
    )?;
    counter_family(
        encoder,
        "quiver_replication_rebuilds_total",
        "Times this member dropped its log to rebuild from its master's oldest segment.",
        [(Vec::<(&str, &str)>::new(), rebuilds.rebuilds)],
    )?;
    gauge(
        encoder,
        "quiver_replication_retention_held_bytes",
        "CommitLog bytes the master's last retention run kept only because in-sync replicas \
         had not copied them yet (at most --replica-retention-cap-bytes).",
        hold.held_bytes,
    )?;
    counter_family(
        encoder,
        "quiver_replication_retention_cap_hits_total",
        "CommitLog files the master's retention deleted although in-sync replicas still \
         needed them, by cause: cap (past --replica-retention-cap-bytes), force-clean (the \
         disk above --disk-force-clean-ratio).",
        [("cap", hold.cap_hits), ("force-clean", hold.forced)]
            .map(|(cause, count)| ([("cause", cause)], count)),
    )
}

/// On the master: how far behind each replica is, in bytes and in time.
fn encode_replica_lags(
    encoder: &mut DescriptorEncoder<'_>,
    status: &quiver_protocol::body::ReplicationStatus,
) -> fmt::Result {
    let replicas: Vec<_> = status
        .replicas
        .iter()
        .filter(|r| r.replica_id != status.replica_id)
        .map(|r| {
            (
                r.replica_id.to_string(),
                r.lag_bytes,
                r.lag_ms as f64 / 1000.0,
            )
        })
        .collect();
    gauge_family(
        encoder,
        "quiver_replication_lag_bytes",
        "CommitLog bytes each replica is behind the master.",
        replicas
            .iter()
            .map(|(id, bytes, _)| ([("replica_id", id.as_str())], *bytes)),
    )?;
    gauge_family(
        encoder,
        "quiver_replication_lag_seconds",
        "How long each replica has been behind the master's log end.",
        replicas
            .iter()
            .map(|(id, _, seconds)| ([("replica_id", id.as_str())], *seconds)),
    )
}

/// POP consumption: messages in flight per group, revived messages, waiting receives.
fn encode_pop(encoder: &mut DescriptorEncoder<'_>, pop: &crate::pop::PopService) -> fmt::Result {
    let inflight = pop.inflight_by_group();
    gauge_family(
        encoder,
        "quiver_pop_inflight_messages",
        "POP-received messages neither acked nor revived yet, by consumer group.",
        inflight
            .iter()
            .map(|(group, &count)| ([("group", group.as_str())], count)),
    )?;
    counter_family(
        encoder,
        "quiver_pop_revived_total",
        "POP messages not acked in time: re-put to the retry topic, to the DLQ, or redelivered in place (in-order groups).",
        pop.revived_counts()
            .map(|(to, count)| ([("to", to)], count)),
    )?;
    gauge(
        encoder,
        "quiver_pop_waiting_receives",
        "POP receives long polling for messages.",
        pop.waiting_receives() as u64,
    )
}

/// Timed delivery: timers waiting, fired, and how late the latest firing was.
fn encode_timers(
    encoder: &mut DescriptorEncoder<'_>,
    timers: &crate::timer::TimerState,
) -> fmt::Result {
    gauge(
        encoder,
        "quiver_timers_pending",
        "Timed messages enqueued in the timer log and not fired yet.",
        timers.pending.load(Ordering::Relaxed),
    )?;
    counter_family(
        encoder,
        "quiver_timers_fired_total",
        "Timed messages re-stored to their real topic once due.",
        [(
            [("topic", crate::timer::TIMER_TOPIC)],
            timers.fired_total.load(Ordering::Relaxed),
        )],
    )?;
    gauge(
        encoder,
        "quiver_timers_fire_lateness_ms",
        "Store time minus deliver time of the latest fired timer, in ms.",
        timers.last_lateness_ms.load(Ordering::Relaxed),
    )
}

/// The data disk, the write gate and retention's deletions.
fn encode_disk(encoder: &mut DescriptorEncoder<'_>, broker: &Broker) -> fmt::Result {
    let store = broker.store();
    let disk = store.disk_status();
    gauge(
        encoder,
        "quiver_store_disk_used_ratio",
        "Used share of the store's file system.",
        disk.used_ratio,
    )?;
    gauge(
        encoder,
        "quiver_store_disk_free_bytes",
        "Bytes of the store's file system the broker may still use.",
        disk.available_bytes,
    )?;
    gauge(
        encoder,
        "quiver_store_disk_high_water_ratio",
        "disk-high-water-ratio: above it sends are refused.",
        disk.high_water_ratio,
    )?;
    gauge(
        encoder,
        "quiver_store_writable",
        "1 while the store takes writes; 0 while a full or failed disk refuses them.",
        u64::from(disk.refusal.is_none()),
    )?;
    let refusal = disk
        .refusal
        .as_ref()
        .map(|r| ([("reason", r.reason.as_str())], 1u64));
    gauge_family(
        encoder,
        "quiver_store_write_refusal",
        "1 for the reason the store refuses writes now; absent while it takes them.",
        refusal,
    )?;
    let by_reason = |(reason, count): (&'static str, u64)| ([("reason", reason)], count);
    let refusals = store.write_refusals().into_iter();
    counter_family(
        encoder,
        "quiver_store_write_refusals_total",
        "Writes (sends, retries, scheduled deliveries) refused by the store, by reason.",
        refusals.map(|(reason, count)| by_reason((reason.as_str(), count))),
    )?;
    let deletions = store.deleted_segments().into_iter();
    counter_family(
        encoder,
        "quiver_store_segments_deleted_total",
        "CommitLog files deleted by retention, by reason.",
        deletions.map(|(reason, count)| by_reason((reason.as_str(), count))),
    )
}

/// Refused requests, file reloads and accounts, with ACL on.
fn encode_acl(encoder: &mut DescriptorEncoder<'_>, acl: &crate::acl::Acl) -> fmt::Result {
    let refusals = acl.refusals();
    counter_family(
        encoder,
        "quiver_acl_refusals_total",
        "Requests refused by ACL (NO_PERMISSION), by reason.",
        refusals
            .iter()
            .map(|&(reason, count)| ([("reason", reason)], count)),
    )?;
    let (reloaded, failed) = acl.reload_counts();
    counter_family(
        encoder,
        "quiver_acl_reloads_total",
        "Re-reads of the ACL file after it changed, by result (a failed one keeps the accounts in force).",
        [([("result", "ok")], reloaded), ([("result", "failed")], failed)],
    )?;
    gauge(
        encoder,
        "quiver_acl_accounts",
        "Accounts of the ACL file in force.",
        acl.account_count() as u64,
    )
}

/// One gauge without labels of its own.
fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: impl EncodeGaugeValue,
) -> fmt::Result {
    let metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(metric)
}

/// One gauge family: a sample per label set.
fn gauge_family<L: EncodeLabelSet, V: EncodeGaugeValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in series {
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// One counter family, named as exposed (`..._total`): the encoder appends the suffix itself.
fn counter_family<L: EncodeLabelSet, V: EncodeCounterValue>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    series: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result {
    let family = name.strip_suffix("_total").unwrap_or(name);
    let mut metric = encoder.encode_descriptor(family, help, None, MetricType::Counter)?;
    for (labels, value) in series {
        ConstCounter::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovering_exposition_is_not_ready_only() {
        let registry = registry("C\"1", BrokerSlot::default(), None);
        assert_eq!(
            encode(&registry),
            "# HELP quiver_broker_ready 1 once recovery finished and the broker serves.\n\
             # TYPE quiver_broker_ready gauge\n\
             quiver_broker_ready{cluster=\"C\\\"1\"} 0\n"
        );
    }

    #[test]
    fn counters_keep_their_total_names_in_type_lines() {
        let mut text = String::new();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(TestCounter));
        prometheus_client::encoding::prometheus_text::encode(&mut text, &registry).unwrap();
        assert_eq!(
            text,
            "# HELP x_total X.\n# TYPE x_total counter\nx_total{reason=\"r\"} 7\n"
        );
    }

    #[derive(Debug)]
    struct TestCounter;

    impl Collector for TestCounter {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> fmt::Result {
            counter_family(&mut encoder, "x_total", "X.", [([("reason", "r")], 7u64)])
        }
    }
}
