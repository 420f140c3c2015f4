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

    /// `MessageStore::get_filtered` from `offset` of `queue` (topic, id), within `limits`
    /// (messages, bytes).
    pub(super) fn get(
        &self,
        (topic, queue_id): (&str, u32),
        offset: u64,
        limits: (u32, u64),
        filter: &GetFilter<'_>,
    ) -> GetResult {
        let Some(queue) = self.queue(topic, queue_id) else {
            return empty(GetStatus::NoMessageInQueue, 0, 0, 0);
        };
        match self.position(&queue, offset) {
            Ok(bounds) => self.scan(&queue, bounds, offset, limits, filter),
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

#[cfg(test)]
mod tests {
    use super::super::tests::{any, message, open_store, read, TOPIC};
    use super::*;
    use crate::record::property;

    #[test]
    fn get_answers_where_a_reader_stands_and_stops_at_its_limits() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        assert_eq!(read(&store, 0, 0).status, GetStatus::NoMessageInQueue);
        for n in 0..5u8 {
            let tags = format!("TAGS\u{1}{}", if n % 2 == 0 { "even" } else { "odd" });
            store
                .put(&message(0, &[n; 10], &tags), 1_000 + i64::from(n))
                .unwrap();
        }
        let at = |offset| read(&store, 0, offset);
        assert_eq!(at(5).status, GetStatus::OffsetOverflowOne);
        let badly = at(9);
        assert_eq!(badly.status, GetStatus::OffsetOverflowBadly);
        assert_eq!(badly.next_begin_offset, QueueOffset(0));
        let all = at(0);
        assert_eq!((all.status, all.messages.len()), (GetStatus::Found, 5));
        assert_eq!(all.next_begin_offset, QueueOffset(5));

        let two = store
            .get(TOPIC, 0, QueueOffset(1), 2, u64::MAX, &any)
            .unwrap();
        assert_eq!(two.messages.len(), 2);
        assert_eq!(two.next_begin_offset, QueueOffset(3));
        // At least one record, however small the byte limit.
        let one = store.get(TOPIC, 0, QueueOffset(0), 10, 1, &any).unwrap();
        assert_eq!(one.messages.len(), 1);

        // A record filter's skips count towards neither limit.
        let odd = |bytes: &[u8]| {
            record::properties_of(bytes).and_then(|p| property(p, "TAGS")) == Some("odd")
        };
        let filter = GetFilter {
            tags_code: &any,
            record: Some(&odd),
        };
        let got = store
            .get_filtered(TOPIC, 0, QueueOffset(0), 2, u64::MAX, &filter)
            .unwrap();
        assert_eq!(got.messages.len(), 2);
        assert_eq!(got.next_begin_offset, QueueOffset(4));
        let none = GetFilter {
            tags_code: &|_| false,
            record: None,
        };
        let got = store
            .get_filtered(TOPIC, 0, QueueOffset(0), 2, u64::MAX, &none)
            .unwrap();
        assert_eq!(
            (got.status, got.next_begin_offset),
            (GetStatus::NoMatchedMessage, QueueOffset(5))
        );
        store.shutdown().unwrap();
    }

    #[test]
    fn offsets_are_found_by_store_time_and_by_log_position() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let results: Vec<_> = (0..4)
            .map(|n| store.put(&message(1, b"x", ""), 100 * (n + 1)).unwrap())
            .collect();
        let by_time = |ms| store.search_offset_by_timestamp(TOPIC, 1, ms).unwrap().0;
        assert_eq!(
            [by_time(0), by_time(200), by_time(201), by_time(999)],
            [0, 1, 2, 4]
        );
        assert_eq!(
            store.store_timestamp(TOPIC, 1, QueueOffset(2)).unwrap(),
            Some(300)
        );
        assert_eq!(store.earliest_store_timestamp(TOPIC, 1).unwrap(), Some(100));
        assert_eq!(
            store.store_timestamp(TOPIC, 1, QueueOffset(4)).unwrap(),
            None
        );
        let at = results[2].physical_offset;
        assert_eq!(store.physical_offset_at(TOPIC, 1, QueueOffset(2)), Some(at));
        assert_eq!(store.queue_offset_at(TOPIC, 1, at), QueueOffset(2));
        assert_eq!(
            store.queue_offset_at(TOPIC, 1, CommitLogOffset(at.0 + 1)),
            QueueOffset(3)
        );
        assert_eq!(
            store.queue_offset_at(TOPIC, 1, store.log_end()),
            QueueOffset(4)
        );
        store.shutdown().unwrap();
    }

    #[test]
    fn records_are_read_by_offset_key_and_in_log_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let first = store
            .put(&message(0, b"a", "UNIQ_KEY\u{1}id-1\u{2}KEYS\u{1}k1 k2"), 5)
            .unwrap();
        let second = store.put(&message(0, b"b", "KEYS\u{1}k2"), 6).unwrap();
        let by_key = |key, key_match| {
            store
                .query_by_key(TOPIC, key, key_match, 10, 0, 10)
                .messages
        };
        assert_eq!(by_key("k2", KeyMatch::AnyKey).len(), 2);
        assert_eq!(by_key("id-1", KeyMatch::UniqueKey).len(), 1);
        assert!(by_key("k1", KeyMatch::UniqueKey).is_empty());
        assert!(store
            .query_by_key("other", "k2", KeyMatch::AnyKey, 10, 0, 10)
            .messages
            .is_empty());

        assert_eq!(
            store.read_record(second.physical_offset).unwrap().body,
            &b"b"[..]
        );
        let inside = CommitLogOffset(first.physical_offset.0 + 8);
        assert!(store.message_at(inside).is_err());

        let chunk = store.read_log(first.physical_offset, 1).unwrap();
        assert_eq!(chunk.bytes.len(), first.size as usize);
        assert_eq!(chunk.next, second.physical_offset);
        let rest = store.read_log(chunk.next, usize::MAX).unwrap();
        assert_eq!(rest.next, store.log_end());
        assert!(store
            .read_log(rest.next, usize::MAX)
            .unwrap()
            .bytes
            .is_empty());
        store.shutdown().unwrap();
    }
}
