//! The read side: gets from a queue (tags code, then record filters), timestamps, key
//! queries, records by offset and log chunks for replicas. Lock-free over snapshots, but for
//! the fence's lock where it decides what clients may see.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;

use super::fence::ConfirmFence;
use super::types::{GetFilter, GetResult, GetStatus, LogChunk, QueryResult};
use crate::commit_log::CommitLog;
use crate::consume_queue::ConsumeQueue;
use crate::dispatch::QueueRegistry;
use crate::error::StoreError;
use crate::index::{self, KeyMatch, MessageIndex};
use crate::mapped_file::SegmentList;
use crate::record::{self, Record};
use crate::{CommitLogOffset, QueueOffset};

/// Units a single get scans at most, so a selective tag filter cannot stall a pull.
const MAX_UNITS_SCANNED_PER_GET: u64 = 800;

/// The store's files as readers see them, borrowed.
pub(super) struct Reader<'s> {
    pub commit_log: &'s CommitLog,
    pub registry: &'s QueueRegistry,
    pub index: &'s MessageIndex,
    pub fence: &'s ConfirmFence,
}

/// A get's result with no messages.
fn empty(status: GetStatus, next: u64, min: u64, max: u64) -> GetResult {
    GetResult {
        status,
        messages: Vec::new(),
        next_begin_offset: QueueOffset(next),
        min_offset: QueueOffset(min),
        max_offset: QueueOffset(max),
    }
}

impl Reader<'_> {
    pub(super) fn queue(&self, topic: &str, queue_id: u32) -> Option<Arc<ConsumeQueue>> {
        self.registry.read().get(topic)?.get(&queue_id).cloned()
    }

    /// Every (topic, queueId) with a ConsumeQueue, sorted.
    pub(super) fn queues(&self) -> Vec<(String, u32)> {
        let registry = self.registry.read();
        let set: BTreeSet<(String, u32)> = registry
            .iter()
            .flat_map(|(topic, queues)| queues.keys().map(move |q| (topic.clone(), *q)))
            .collect();
        set.into_iter().collect()
    }

    /// `MessageStore::get_filtered`.
    pub(super) fn get_filtered(
        &self,
        topic: &str,
        queue_id: u32,
        offset: QueueOffset,
        max_msgs: u32,
        max_bytes: u64,
        filter: &GetFilter<'_>,
    ) -> GetResult {
        let Some(queue) = self.queue(topic, queue_id) else {
            return empty(GetStatus::NoMessageInQueue, 0, 0, 0);
        };
        match self.position(&queue, offset.0) {
            Ok(bounds) => self.scan(&queue, bounds, offset.0, (max_msgs, max_bytes), filter),
            Err(answer) => answer,
        }
    }

    /// Whether a get may read `queue` from `offset`: its (min, max) offsets when it may,
    /// else the answer (nothing there, or where to go instead).
    fn position(&self, queue: &Arc<ConsumeQueue>, offset: u64) -> Result<(u64, u64), GetResult> {
        let (min, max) = (queue.min_offset(), queue.max_offset());
        if offset > max && self.fence.written_unconfirmed(queue, offset) {
            // Written but not confirmed yet (a restarted member, a replica behind the fence):
            // nothing to read yet, and the reader's position stands.
            return Err(empty(GetStatus::OffsetOverflowOne, offset, min, max));
        }
        if max == 0 {
            return Err(empty(GetStatus::NoMessageInQueue, 0, min, max));
        }
        if offset < min {
            return Err(empty(GetStatus::OffsetTooSmall, min, min, max));
        }
        if offset == max {
            return Err(empty(GetStatus::OffsetOverflowOne, offset, min, max));
        }
        if offset > max {
            // RocketMQ's correction: back to the start of a queue that begins at 0, else the
            // end. A group member's reader past everything written read a tail a failover
            // cut: back to the start, so it receives again rather than skips what follows.
            let next = if min == 0 || self.fence.enabled() {
                min
            } else {
                max
            };
            return Err(empty(GetStatus::OffsetOverflowBadly, next, min, max));
        }
        Ok((min, max))
    }

    /// Reads `queue`'s units from `offset` (within `(min, max)`) and the records that pass,
    /// up to `(max_msgs, max_bytes)`.
    fn scan(
        &self,
        queue: &ConsumeQueue,
        (min, max): (u64, u64),
        offset: u64,
        (max_msgs, max_bytes): (u32, u64),
        filter: &GetFilter<'_>,
    ) -> GetResult {
        let units = queue.snapshot();
        let log = self.commit_log.snapshot();
        let log_min = log.first().map_or(0, |s| s.base());
        let scan_end = max.min(offset + MAX_UNITS_SCANNED_PER_GET.max(u64::from(max_msgs)));
        let mut messages = Vec::new();
        let mut bytes_total = 0u64;
        let mut next = offset;
        while next < scan_end && messages.len() < max_msgs as usize {
            let Some(unit) = queue.unit(&units, next) else {
                break;
            };
            if unit.is_empty()
                || unit.physical_offset < log_min
                || !(filter.tags_code)(unit.tags_code)
            {
                next += 1;
                continue;
            }
            if !messages.is_empty() && bytes_total + u64::from(unit.size) > max_bytes {
                break;
            }
            let size = unit.size as usize;
            let view = self
                .commit_log
                .view_if(&log, unit.physical_offset, size, filter.record);
            if let Some(record) = view {
                bytes_total += u64::from(unit.size);
                messages.push(record);
            }
            next += 1;
        }
        let status = if messages.is_empty() {
            GetStatus::NoMatchedMessage
        } else {
            GetStatus::Found
        };
        GetResult {
            status,
            messages,
            next_begin_offset: QueueOffset(next),
            min_offset: QueueOffset(min),
            max_offset: QueueOffset(max),
        }
    }

    /// Units visible in the queue; 0 when it does not exist.
    pub(super) fn max_offset(&self, topic: &str, queue_id: u32) -> u64 {
        self.queue(topic, queue_id).map_or(0, |q| q.max_offset())
    }

    pub(super) fn min_offset(&self, topic: &str, queue_id: u32) -> u64 {
        self.queue(topic, queue_id).map_or(0, |q| q.min_offset())
    }

    /// `MessageStore::written_max_offset`.
    pub(super) fn written_max_offset(&self, topic: &str, queue_id: u32) -> u64 {
        let Some(queue) = self.queue(topic, queue_id) else {
            return 0;
        };
        let visible = queue.max_offset();
        self.fence
            .pending_end(&queue)
            .map_or(visible, |end| end.max(visible))
    }

    /// `MessageStore::queue_offset_at`.
    pub(super) fn queue_offset_at(&self, topic: &str, queue_id: u32, log_offset: u64) -> u64 {
        let mut low = self.min_offset(topic, queue_id);
        let mut high = self.max_offset(topic, queue_id);
        while low < high {
            let middle = low + (high - low) / 2;
            match self.physical_offset_at(topic, queue_id, middle) {
                Some(at) if at < log_offset => low = middle + 1,
                _ => high = middle,
            }
        }
        low
    }

    /// Where the message at `offset` of a queue lives in the CommitLog, if it is still there.
    pub(super) fn physical_offset_at(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
    ) -> Option<u64> {
        let queue = self.queue(topic, queue_id)?;
        if offset < queue.min_offset() || offset >= queue.max_offset() {
            return None;
        }
        let unit = queue.unit(&queue.snapshot(), offset)?;
        (!unit.is_empty()).then_some(unit.physical_offset)
    }

    /// STORETIMESTAMP of the message at `index` of `queue`, if still readable.
    fn timestamp_at(
        &self,
        queue: &ConsumeQueue,
        units: &SegmentList,
        log: &SegmentList,
        index: u64,
    ) -> Option<i64> {
        let unit = queue.unit(units, index).filter(|u| !u.is_empty())?;
        let record = self
            .commit_log
            .view(log, unit.physical_offset, unit.size as usize)?;
        record::store_timestamp_of(&record)
    }

    /// The first offset whose store time is >= `timestamp_ms` (the max offset if none).
    pub(super) fn search_offset_by_timestamp(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> u64 {
        let Some(queue) = self.queue(topic, queue_id) else {
            return 0;
        };
        let (units, log) = (queue.snapshot(), self.commit_log.snapshot());
        let (mut low, mut high) = (queue.min_offset(), queue.max_offset());
        while low < high {
            let mid = low + (high - low) / 2;
            match self.timestamp_at(&queue, &units, &log, mid) {
                Some(ts) if ts >= timestamp_ms => high = mid,
                _ => low = mid + 1,
            }
        }
        low
    }

    /// Store time of the message at `offset`, `None` if it is not (or no longer) stored.
    pub(super) fn store_timestamp(&self, topic: &str, queue_id: u32, offset: u64) -> Option<i64> {
        let queue = self.queue(topic, queue_id)?;
        if offset < queue.min_offset() || offset >= queue.max_offset() {
            return None;
        }
        let (units, log) = (queue.snapshot(), self.commit_log.snapshot());
        self.timestamp_at(&queue, &units, &log, offset)
    }

    /// `MessageStore::query_by_key`.
    pub(super) fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        key_match: KeyMatch,
        max_messages: usize,
        (begin_ms, end_ms): (i64, i64),
    ) -> QueryResult {
        let mut found: Vec<(u64, Bytes)> = Vec::new();
        if max_messages > 0 {
            self.index
                .lookup(index::key_hash(topic, key), begin_ms, end_ms, |at| {
                    // Another key may share the hash: only records that carry this one count.
                    if !found.iter().any(|(seen, _)| *seen == at) {
                        if let Some(record) = self.record_with_key(at, topic, key, key_match) {
                            found.push((at, record));
                        }
                    }
                    found.len() < max_messages
                });
        }
        found.sort_unstable_by_key(|(at, _)| *at);
        QueryResult {
            messages: found.into_iter().map(|(_, record)| record).collect(),
            index: self.index.progress(),
        }
    }

    /// The record at `offset` if it is still stored, readable, of `topic` and carries `key`.
    fn record_with_key(
        &self,
        offset: u64,
        topic: &str,
        key: &str,
        key_match: KeyMatch,
    ) -> Option<Bytes> {
        let bytes = self.commit_log.record_at(offset).ok()?;
        if !self.fence.readable(offset, bytes.len()) {
            return None;
        }
        let carries = match record::scan_with(&bytes, record::BodyCrc::Skip) {
            record::Scanned::Message(header) => {
                header.topic == topic && key_match.matches(header.properties, key)
            }
            _ => false,
        };
        carries.then_some(bytes)
    }

    /// `MessageStore::message_at`.
    pub(super) fn message_at(&self, offset: CommitLogOffset) -> Result<Bytes, StoreError> {
        let bytes = self.commit_log.record_at(offset.0)?;
        if !self.fence.readable(offset.0, bytes.len()) {
            return Err(StoreError::OffsetOutOfRange {
                offset,
                min: CommitLogOffset(self.commit_log.min_offset()),
                max: CommitLogOffset(self.fence.confirmed()),
            });
        }
        let record = decode(&bytes, offset)?;
        if record.physical_offset != offset {
            return Err(StoreError::BadRecord {
                offset,
                source: record::RecordError::WrongPosition {
                    stored: record.physical_offset.0,
                    actual: offset.0,
                },
            });
        }
        Ok(bytes)
    }

    /// The decoded record at a physical offset.
    pub(super) fn read_record(&self, offset: CommitLogOffset) -> Result<Record, StoreError> {
        decode(&self.commit_log.record_at(offset.0)?, offset)
    }

    /// `MessageStore::read_log`.
    pub(super) fn read_log(
        &self,
        from: CommitLogOffset,
        max_bytes: usize,
    ) -> Result<LogChunk, StoreError> {
        let (bytes, next) = self.commit_log.read_chunk(from.0, max_bytes)?;
        Ok(LogChunk {
            bytes,
            next: CommitLogOffset(next),
        })
    }

    /// Whether a record or a blank filler starts at `offset` (below the log end).
    pub(super) fn is_record_boundary(&self, offset: u64) -> bool {
        let Ok(bytes) = self.commit_log.record_at(offset) else {
            return false;
        };
        match record::scan_with(&bytes, record::BodyCrc::Skip) {
            record::Scanned::Message(header) => header.physical_offset.0 == offset,
            record::Scanned::Blank { .. } => true,
            _ => false,
        }
    }
}

/// Decodes the record read at `offset`.
fn decode(bytes: &[u8], offset: CommitLogOffset) -> Result<Record, StoreError> {
    let (record, _) =
        record::decode(bytes).map_err(|source| StoreError::BadRecord { offset, source })?;
    Ok(record)
}
