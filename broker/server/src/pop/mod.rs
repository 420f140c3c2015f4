//! POP consumption (RocketMQ 5.x's receive / ack / change invisible): its state and types
//! here, its methods over the broker (what the gRPC endpoint calls) in `service/pop.rs`. A
//! received message is invisible for the requested time and acked on its own; not acked in
//! time, the revive loop (`delivery/revive.rs`) re-puts it to the group's retry topic `%RETRY%<group>_<topic>` (which receives also read) or, after `retryMaxTimes` + 1
//! deliveries, to `%DLQ%<group>`. In-order groups (`consumeMessageOrderly`) get it again in
//! place, and a queue with messages in flight is blocked for them until those are done. The
//! state (`quiver_store::PopState`) lives under `<data>/pop/`; the acked prefix of each queue
//! is committed as the group's consumer offset, so lag shows like a pull consumer's.

mod handle;
mod wakers;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quiver_store::{PopState, PopStateError, StoreError};

pub use handle::Handle;
pub use wakers::Wakers;

use crate::filter::{ConsumerFilter, FilterError};
use crate::topics::RETRY_PREFIX;

/// Most messages one receive returns.
pub const MAX_MESSAGES_PER_RECEIVE: usize = 32;

/// The retry topic of `group`'s subscription to `topic` (Apache 5.x's POP retry topic).
pub fn retry_topic(group: &str, topic: &str) -> String {
    format!("{RETRY_PREFIX}{group}_{topic}")
}

/// A receive request.
pub struct ReceiveRequest<'a> {
    pub group: &'a str,
    /// The topic the client subscribed (never a %RETRY% name).
    pub topic: &'a str,
    pub filter: &'a ConsumerFilter,
    /// At least 1; capped at [`MAX_MESSAGES_PER_RECEIVE`].
    pub max_messages: usize,
    /// How long received messages stay invisible.
    pub invisible: Duration,
    /// ZERO: answer at once; else wait up to this for messages.
    pub long_poll: Duration,
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Popped {
    /// The stored record, `quiver_protocol::record::decode`-able.
    pub record: Bytes,
    /// The topic the client subscribed (the original, also for a retried message).
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    /// Opaque to clients, printable ASCII.
    pub receipt_handle: String,
    /// 1 on first delivery, + 1 per redelivery.
    pub delivery_attempt: u32,
    pub invisible_until_ms: i64,
}

/// Why a POP call failed; never answered as something else.
#[derive(Debug, thiserror::Error)]
pub enum PopError {
    #[error("the receipt handle is not one this broker issued")]
    InvalidHandle,
    #[error("the receipt handle expired: its message was acked, redelivered or changed since")]
    HandleExpired,
    #[error("topic {0} does not exist")]
    TopicNotFound(String),
    #[error("consumer group {0} may not consume (consumeEnable is false)")]
    ConsumeDisabled(String),
    #[error(transparent)]
    Filter(#[from] FilterError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the record at offset {offset} of {topic}/{queue_id} cannot be decoded")]
    BadRecord {
        topic: String,
        queue_id: u32,
        offset: u64,
        #[source]
        source: quiver_store::RecordError,
    },
    #[error("the receive's blocking task failed")]
    Task(#[source] crate::error::BrokerError),
}

impl From<PopStateError> for PopError {
    fn from(error: PopStateError) -> Self {
        match error {
            PopStateError::NotInFlight { .. } | PopStateError::Superseded { .. } => {
                PopError::HandleExpired
            }
            PopStateError::Store(error) => PopError::Store(error),
        }
    }
}

/// Messages revived by the revive loop (or redelivered in place), by where they went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RevivedTo {
    Retry,
    DeadLetter,
    /// In-order groups: redelivered in place.
    InPlace,
}

impl RevivedTo {
    pub const ALL: [RevivedTo; 3] = [RevivedTo::Retry, RevivedTo::DeadLetter, RevivedTo::InPlace];

    /// The `to` label of `quiver_pop_revived_total`.
    pub fn label(self) -> &'static str {
        match self {
            RevivedTo::Retry => "retry",
            RevivedTo::DeadLetter => "dlq",
            RevivedTo::InPlace => "fifo",
        }
    }
}

/// POP consumption of every group: the state, the waiting receives and the counters.
pub struct PopService {
    pub(crate) state: PopState,
    pub(crate) wakers: Arc<Wakers>,
    revived: [AtomicU64; 3],
    pub(crate) receives: AtomicUsize,
}

impl PopService {
    /// Opens the state under `<data>/pop/`. Blocking.
    pub fn open(
        config: &crate::config::BrokerConfig,
        wakers: Arc<Wakers>,
    ) -> Result<PopService, StoreError> {
        let state = PopState::open(&config.data_dir.join("pop"), config.flush_mode)?;
        Ok(PopService {
            state,
            wakers,
            revived: Default::default(),
            receives: AtomicUsize::new(0),
        })
    }

    pub(crate) fn count_revived(&self, to: RevivedTo, count: u64) {
        self.revived[to as usize].fetch_add(count, Ordering::Relaxed);
    }

    /// (to label, messages revived so far) for `quiver_pop_revived_total`.
    pub fn revived_counts(&self) -> [(&'static str, u64); 3] {
        RevivedTo::ALL.map(|to| {
            (
                to.label(),
                self.revived[to as usize].load(Ordering::Relaxed),
            )
        })
    }

    /// Messages in flight per group.
    pub fn inflight_by_group(&self) -> std::collections::BTreeMap<String, u64> {
        self.state.inflight_by_group()
    }

    /// Receives waiting for messages now.
    pub fn waiting_receives(&self) -> usize {
        self.wakers.parked()
    }

    /// Makes the state's log durable (a clean stop, the periodic persist). Blocking.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.state.flush()
    }
}
