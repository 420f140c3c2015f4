//! Timed delivery (RocketMQ 5.x TIMER_DELIVER_MS / TIMER_DELAY_SEC / TIMER_DELAY_MS, after
//! Apache's TimerMessageStore): a timed message waits in [`TIMER_TOPIC`] queue 0 with its
//! real topic and queue in REAL_TOPIC / REAL_QID and its deliver time in TIMER_OUT_MS. One
//! thread enqueues that queue into the store's timer log and wheel, loads each second's slot
//! into a small heap when the second starts, and re-stores due messages to their real queue.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quiver_protocol::message as msg;
use quiver_store::record::{encode_properties, property};
use quiver_store::CommitLogOffset;

/// Apache's `TimerMessageStore.TIMER_TOPIC`.
pub const TIMER_TOPIC: &str = "rmq_sys_wheel_timer";
pub const TIMER_QUEUE: u32 = 0;

/// What the timer service shows the rest of the broker: metrics and retention's floor.
pub struct TimerState {
    pub pending: AtomicU64,
    pub fired_total: AtomicU64,
    /// Lateness of the latest firing batch's latest message, in ms.
    pub last_lateness_ms: AtomicI64,
    /// The timer queue's offset enqueued up to.
    pub enqueued_offset: AtomicU64,
    /// CommitLog offset of the oldest message with a timer pending; u64::MAX: none.
    pub lowest_pending: AtomicU64,
    /// Rung when a message reaches the timer queue (the store's dispatch hook) and at stop.
    pub wake: Arc<TimerWake>,
}

/// Wakes the timer thread from its wait for the next due time: no polling between.
#[derive(Default)]
pub struct TimerWake {
    woken: parking_lot::Mutex<bool>,
    rung: parking_lot::Condvar,
}

impl TimerWake {
    pub fn wake(&self) {
        *self.woken.lock() = true;
        self.rung.notify_one();
    }

    /// Waits at most `timeout`, less if woken (also by a wake since the last wait).
    pub(crate) fn wait(&self, timeout: Duration) {
        let mut woken = self.woken.lock();
        if !*woken {
            self.rung.wait_for(&mut woken, timeout);
        }
        *woken = false;
    }
}

impl Default for TimerState {
    fn default() -> Self {
        TimerState {
            pending: AtomicU64::new(0),
            fired_total: AtomicU64::new(0),
            last_lateness_ms: AtomicI64::new(0),
            enqueued_offset: AtomicU64::new(0),
            lowest_pending: AtomicU64::new(u64::MAX),
            wake: Arc::default(),
        }
    }
}

impl TimerState {
    /// The CommitLog offset retention must keep from, if a timer is pending.
    pub fn lowest_pending(&self) -> Option<CommitLogOffset> {
        match self.lowest_pending.load(Ordering::Acquire) {
            u64::MAX => None,
            offset => Some(CommitLogOffset(offset)),
        }
    }
}

/// When a message with a timer property is due, in ms since the epoch; `Ok(None)` without
/// one. `now` is the broker's receive time, which relative delays count from.
pub fn deliver_ms(properties: &str, now: i64) -> Result<Option<i64>, String> {
    let parse = |name: &str| -> Result<Option<i64>, String> {
        property(properties, name)
            .map(|value| {
                value
                    .trim()
                    .parse::<i64>()
                    .map_err(|_| format!("{name} {value:?} is not a whole number"))
            })
            .transpose()
    };
    if let Some(at) = parse(msg::PROPERTY_TIMER_DELIVER_MS)? {
        return Ok(Some(at));
    }
    if let Some(secs) = parse(msg::PROPERTY_TIMER_DELAY_SEC)? {
        return Ok(Some(now.saturating_add(secs.saturating_mul(1000))));
    }
    Ok(parse(msg::PROPERTY_TIMER_DELAY_MS)?.map(|ms| now.saturating_add(ms)))
}

/// The properties of a message parked in the timer topic until `deliver_ms`.
pub fn timer_properties(
    properties: &str,
    real_topic: &str,
    real_queue_id: u32,
    deliver_ms: i64,
) -> String {
    let mut map = quiver_store::record::parse_properties(properties);
    map.insert(msg::PROPERTY_REAL_TOPIC.into(), real_topic.into());
    map.insert(msg::PROPERTY_REAL_QID.into(), real_queue_id.to_string());
    map.insert(msg::PROPERTY_TIMER_OUT_MS.into(), deliver_ms.to_string());
    encode_properties(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// What a timed message carries until it is re-stored (Apache drops them then too).
pub(crate) const TIMER_PROPERTIES: [&str; 4] = [
    msg::PROPERTY_TIMER_OUT_MS,
    msg::PROPERTY_TIMER_DELIVER_MS,
    msg::PROPERTY_TIMER_DELAY_SEC,
    msg::PROPERTY_TIMER_DELAY_MS,
];

/// What a re-stored timed message drops: the request, not TIMER_OUT_MS, which stays (as in
/// Apache) so a 5.x consumer learns the message's delivery timestamp.
pub(crate) const TIMER_REQUEST_PROPERTIES: [&str; 3] = [
    msg::PROPERTY_TIMER_DELIVER_MS,
    msg::PROPERTY_TIMER_DELAY_SEC,
    msg::PROPERTY_TIMER_DELAY_MS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deliver_time_is_absolute_or_counted_from_receipt() {
        let now = 1_000_000;
        let at = |properties: &str| deliver_ms(properties, now);
        assert_eq!(at(""), Ok(None));
        assert_eq!(at("TIMER_DELIVER_MS\u{1}1234567\u{2}"), Ok(Some(1_234_567)));
        assert_eq!(at("TIMER_DELAY_SEC\u{1}3\u{2}"), Ok(Some(now + 3_000)));
        assert_eq!(at("TIMER_DELAY_MS\u{1} 250 \u{2}"), Ok(Some(now + 250)));
        let malformed = at("TIMER_DELAY_MS\u{1}soon\u{2}").unwrap_err();
        assert!(malformed.contains("TIMER_DELAY_MS"), "{malformed}");
    }

    #[test]
    fn parked_properties_name_the_real_queue_and_the_deliver_time() {
        let parked = timer_properties("KEYS\u{1}k\u{2}", "Orders", 3, 42);
        assert_eq!(property(&parked, msg::PROPERTY_REAL_TOPIC), Some("Orders"));
        assert_eq!(property(&parked, msg::PROPERTY_REAL_QID), Some("3"));
        assert_eq!(property(&parked, msg::PROPERTY_TIMER_OUT_MS), Some("42"));
        assert_eq!(property(&parked, "KEYS"), Some("k"));
    }
}
