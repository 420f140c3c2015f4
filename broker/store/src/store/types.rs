//! What the store's API takes and returns.

use std::sync::Arc;

use bytes::Bytes;

use crate::index::IndexProgress;
use crate::{CommitLogOffset, QueueOffset};

/// Where an appended message landed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PutResult {
    pub physical_offset: CommitLogOffset,
    pub queue_offset: QueueOffset,
    pub size: u32,
    pub store_timestamp_ms: i64,
}

/// Messages appended by [`crate::MessageStore::append`], not yet known to be durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Appended {
    pub results: Vec<PutResult>,
    /// The CommitLog end after them: they are durable once bytes below it are.
    pub end: CommitLogOffset,
}

/// The outcome of a pull from one queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GetStatus {
    Found,
    /// Units were scanned but none passed the tag filter (or their records are gone).
    NoMatchedMessage,
    /// The queue is empty or does not exist.
    NoMessageInQueue,
    /// The offset is the max offset: nothing new yet (long-poll territory).
    OffsetOverflowOne,
    /// The offset is beyond the max offset.
    OffsetOverflowBadly,
    /// The offset is below the min offset (its files were deleted).
    OffsetTooSmall,
}

#[derive(Clone, Debug)]
pub struct GetResult {
    pub status: GetStatus,
    /// Whole encoded records, byte-exact: the pull body is their concatenation. Zero-copy
    /// views of the mapped CommitLog.
    pub messages: Vec<Bytes>,
    pub next_begin_offset: QueueOffset,
    pub min_offset: QueueOffset,
    pub max_offset: QueueOffset,
}

/// Which records a get returns: first by the ConsumeQueue unit's tags code (no CommitLog
/// read), then, if set, by the record's own bytes (in the mapping, before a view is made).
pub struct GetFilter<'a> {
    pub tags_code: &'a dyn Fn(i64) -> bool,
    pub record: Option<RecordFilter<'a>>,
}

pub use crate::commit_log::RecordFilter;

/// Messages found by key (QUERY_MESSAGE).
#[derive(Clone, Debug)]
pub struct QueryResult {
    /// Whole encoded records, oldest first: the response body is their concatenation.
    pub messages: Vec<Bytes>,
    /// How far the index has got.
    pub index: IndexProgress,
}

/// Tells the server a queue grew (to wake long polls).
#[derive(Clone, Copy, Debug)]
pub struct DispatchEvent<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub max_offset: QueueOffset,
}

/// Called after units are written; must be cheap and never block.
pub type DispatchHook = Arc<dyn Fn(&DispatchEvent<'_>) + Send + Sync>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes between the min and max physical offsets.
    pub commitlog_bytes: u64,
    pub min_physical_offset: CommitLogOffset,
    pub max_physical_offset: CommitLogOffset,
    /// CommitLog bytes below this are durable.
    pub flushed_physical_offset: CommitLogOffset,
    pub consume_queues: usize,
    /// Of the data directory's file system.
    pub disk_used_bytes: u64,
    pub disk_total_bytes: u64,
}

/// A run of published CommitLog bytes for a replica ([`crate::MessageStore::read_log`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    /// Whole records (or the blank filler that closes a segment), byte-exact: a zero-copy
    /// view of the mapped CommitLog. Empty at the log end.
    pub bytes: Bytes,
    /// Where the next chunk starts: after these bytes, or the next segment's base after a
    /// filler.
    pub next: CommitLogOffset,
}

/// What [`crate::MessageStore::truncate_to`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TruncateReport {
    /// The log end before.
    pub old_end: CommitLogOffset,
    /// The log end now (the offset truncated to).
    pub new_end: CommitLogOffset,
    /// `old_end - new_end`.
    pub bytes: u64,
    /// CommitLog files deleted (wholly past the new end).
    pub deleted_segments: usize,
    /// Messages removed from each queue that lost some: (topic, queue id, count), sorted.
    pub messages: Vec<(String, u32, u64)>,
    /// Message index entries removed.
    pub index_entries: u64,
}
