//! quiver-store: the broker's storage engine.
//!
//! A CommitLog of memory-mapped segment files holds every message in RocketMQ 4.x's record
//! layout; one ConsumeQueue per (topic, queueId) indexes it with 20-byte units, and the
//! message index finds records by key. The store is
//! synchronous and knows files only: no sockets, no async runtime.

// Every unsafe block says why it is sound (mapped memory: the writer, readers, the bounds).
#![deny(clippy::undocumented_unsafe_blocks)]

mod checkpoint;
mod commit_log;
mod config;
mod consume_queue;
mod disk;
mod dispatch;
mod error;
mod flush;
mod index;
mod json_file;
mod mapped_file;
mod offsets;
mod pop;
mod recovery;
mod retention;
mod store;
mod tail_fill;
mod tally;
mod timer;
mod warm;

pub use config::{ConfigError, FlushMode, StoreConfig, MIN_SEGMENT_SIZE_BYTES};
pub use disk::{DiskStatus, RefusalReason, WriteRefusal};
pub use error::{chain as error_chain, StoreError};
pub use flush::FlushedHook;
pub use index::{IndexProgress, KeyMatch};
pub use json_file::{read_json_with_backup, write_json_atomically};
pub use offsets::ConsumerOffsets;
pub use pop::{Delivery, Inflight, PopKey, PopState, PopStateError, ReadClaim, ReadStart, Removed};
pub use quiver_protocol::offset::{CommitLogOffset, QueueOffset};
/// The record codec lives with the wire: the same bytes travel in pull bodies.
pub use quiver_protocol::record;
pub use quiver_protocol::record::{NewMessage, RecordError};
pub use recovery::RecoveryReport;
pub use retention::{DeleteReason, ReplicaHold, ReplicaHoldStats, RetentionReport};
pub use store::{
    Appended, DispatchEvent, DispatchHook, GetFilter, GetResult, GetStatus, LogChunk, MessageStore,
    PutResult, QueryResult, RecordFilter, ReplicaDispatch, RestartReport, StoreStats,
    TruncateReport,
};
pub use timer::{TimerProgress, TimerRecord, TimerStore};

// Callers share these across threads in an `Arc`: the build fails if that ever breaks.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MessageStore>();
    assert_send_sync::<ConsumerOffsets>();
};
