//! The broker's traffic counters (docs/METRICS.md), kept on atomics; `exposition.rs` exports
//! them with everything else read at scrape time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

/// Messages and body bytes of one series.
#[derive(Default)]
struct Flow {
    messages: AtomicU64,
    body_bytes: AtomicU64,
}

impl Flow {
    fn add(&self, messages: u64, body_bytes: u64) {
        self.messages.fetch_add(messages, Ordering::Relaxed);
        self.body_bytes.fetch_add(body_bytes, Ordering::Relaxed);
    }

    fn load(&self) -> (u64, u64) {
        (
            self.messages.load(Ordering::Relaxed),
            self.body_bytes.load(Ordering::Relaxed),
        )
    }
}

/// Traffic series by one label value, looked up by `&str` (no allocation once it exists).
type FlowsBy = foldhash::HashMap<Box<str>, Flow>;

/// Counters of traffic, labelled by topic (in) and topic + group (out). A series is inserted
/// under the write lock on its first message only; after that sends and pulls share the read
/// lock and add to atomics, so they do not exclude one another.
#[derive(Default)]
pub struct Metrics {
    /// By topic.
    inbound: RwLock<FlowsBy>,
    /// By topic, then consumer group.
    outbound: RwLock<foldhash::HashMap<Box<str>, FlowsBy>>,
    /// Connections the broker closed, by [`ClosedBecause`].
    closed: [AtomicU64; ClosedBecause::ALL.len()],
}

/// Why the broker closed a client's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClosedBecause {
    /// No frame and no request in flight for `idle-connection-timeout-ms`.
    Idle,
    /// `max-connections` reached: closed on accept.
    ConnectionLimit,
    /// A frame started and not finished within `frame-read-timeout-ms`.
    FrameReadTimeout,
    /// `max-connections-per-address` reached for the source address: closed on accept.
    AddressLimit,
    /// A plain (not TLS) connection with `tls-mode enforcing`.
    TlsRequired,
    /// A TLS handshake that failed or did not finish in time.
    TlsHandshake,
}

impl ClosedBecause {
    const ALL: [ClosedBecause; 6] = [
        ClosedBecause::Idle,
        ClosedBecause::ConnectionLimit,
        ClosedBecause::FrameReadTimeout,
        ClosedBecause::AddressLimit,
        ClosedBecause::TlsRequired,
        ClosedBecause::TlsHandshake,
    ];

    /// The `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            ClosedBecause::Idle => "idle",
            ClosedBecause::ConnectionLimit => "max-connections",
            ClosedBecause::FrameReadTimeout => "frame-read-timeout",
            ClosedBecause::AddressLimit => "max-connections-per-address",
            ClosedBecause::TlsRequired => "tls-required",
            ClosedBecause::TlsHandshake => "tls-handshake",
        }
    }
}

impl Metrics {
    pub fn connection_closed(&self, because: ClosedBecause) {
        self.closed[because as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// (reason, connections closed so far) for every reason.
    pub fn connections_closed(&self) -> Vec<(&'static str, u64)> {
        ClosedBecause::ALL
            .iter()
            .map(|&because| {
                let count = self.closed[because as usize].load(Ordering::Relaxed);
                (because.label(), count)
            })
            .collect()
    }

    pub fn record_in(&self, topic: &str, messages: u64, body_bytes: u64) {
        if let Some(flow) = self.inbound.read().get(topic) {
            return flow.add(messages, body_bytes);
        }
        let mut inbound = self.inbound.write();
        let flow = inbound.entry(topic.into()).or_default();
        flow.add(messages, body_bytes);
    }

    pub fn record_out(&self, topic: &str, group: &str, messages: u64, body_bytes: u64) {
        if let Some(flow) = self.outbound.read().get(topic).and_then(|by| by.get(group)) {
            return flow.add(messages, body_bytes);
        }
        let mut outbound = self.outbound.write();
        let flow = outbound
            .entry(topic.into())
            .or_default()
            .entry(group.into())
            .or_default();
        flow.add(messages, body_bytes);
    }

    /// (topic) -> (messages, body bytes), sorted so scrapes list series in a stable order.
    pub(crate) fn inbound_totals(&self) -> BTreeMap<String, (u64, u64)> {
        let inbound = self.inbound.read();
        inbound
            .iter()
            .map(|(topic, flow)| (topic.to_string(), flow.load()))
            .collect()
    }

    /// (topic, group) -> (messages, body bytes), sorted.
    pub(crate) fn outbound_totals(&self) -> BTreeMap<(String, String), (u64, u64)> {
        let outbound = self.outbound.read();
        let series = outbound.iter().flat_map(|(topic, groups)| {
            groups
                .iter()
                .map(move |(group, flow)| ((topic.to_string(), group.to_string()), flow.load()))
        });
        series.collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traffic_adds_up_per_topic_and_group() {
        let metrics = Metrics::default();
        metrics.record_in("b", 1, 10);
        metrics.record_in("a", 2, 20);
        metrics.record_in("b", 3, 30);
        metrics.record_out("b", "g", 1, 10);
        metrics.record_out("b", "g", 1, 5);
        metrics.record_out("b", "h", 4, 40);
        let inbound: Vec<_> = metrics.inbound_totals().into_iter().collect();
        assert_eq!(inbound, [("a".into(), (2, 20)), ("b".into(), (4, 40))]);
        let outbound = metrics.outbound_totals();
        assert_eq!(outbound[&("b".into(), "g".into())], (2, 15));
        assert_eq!(outbound[&("b".into(), "h".into())], (4, 40));
    }
}
