//! A replica's two halves of an append (RocketMQ's ReputMessageService): the master's chunk
//! is copied into the CommitLog with framing checks only (size, magic, the physical offset
//! continuing the log), so the replica can acknowledge it at once; its records are
//! dispatched behind it (body CRC, queue offsets, ConsumeQueue units, index keys) by
//! [`MessageStore::dispatch_replicated`], on the replica's own thread. Checkpoints claim
//! queues and the index only up to the first record not dispatched, so recovery dispatches
//! the rest after a crash.

use super::append::{Batch, Incoming, Source};
use super::shared::{Shared, WriterState};
use super::MessageStore;
use crate::error::StoreError;
use crate::record::{self, BLANK_FILLER_BYTES};
use crate::CommitLogOffset;

/// Byte position of PHYSICALOFFSET in a message record.
const PHYSICAL_OFFSET_AT: usize = 28;

/// Where a replica's dispatch stands ([`MessageStore::dispatch_replicated`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaDispatch {
    /// Every record below this is dispatched.
    pub dispatched_to: CommitLogOffset,
    /// The log end when the step ended.
    pub log_end: CommitLogOffset,
}

impl ReplicaDispatch {
    /// Whether nothing appended waits for dispatch.
    pub fn caught_up(&self) -> bool {
        self.dispatched_to >= self.log_end
    }
}

impl MessageStore {
    /// Dispatches up to about `max_bytes` of the replicated records appended but not yet
    /// dispatched, in log order, under the write lock: each record's body CRC, its queue
    /// offset (its queue's next), its unit and index keys, then the dispatch hook (with
    /// `publish_on_confirm`, its units wait for `confirm` as a put's would). A record that
    /// fails (damaged, or the logs diverged) stops dispatch before it: the error names its
    /// offset, and later calls fail on it again until the log is truncated below it.
    pub fn dispatch_replicated(&self, max_bytes: u64) -> Result<ReplicaDispatch, StoreError> {
        let shared = &*self.shared;
        let mut batch = Batch::default();
        let (dispatched, progress) = {
            let mut writer = shared.writer.lock();
            if shared.shut_down.load(std::sync::atomic::Ordering::Acquire) {
                return Err(StoreError::ShutDown);
            }
            let dispatched = shared.dispatch_behind(&mut writer, &mut batch, max_bytes);
            let published = shared.publish_appended(&mut writer, &batch);
            let progress = ReplicaDispatch {
                dispatched_to: CommitLogOffset(writer.dispatched_to()),
                log_end: CommitLogOffset(writer.log.write_pos()),
            };
            (dispatched.and(published), progress)
        };
        shared.notify_appended(&batch);
        dispatched.map(|()| progress)
    }

    /// Every record below this is dispatched (the log end unless replicated records wait).
    pub fn dispatched_to(&self) -> CommitLogOffset {
        CommitLogOffset(self.shared.writer.lock().dispatched_to())
    }
}

impl Shared {
    /// Appends a chunk read from the master with framing checks only, record by record,
    /// leaving its records to `dispatch_behind`; the caller holds the write lock and
    /// publishes.
    pub(super) fn append_chunk(
        &self,
        writer: &mut WriterState,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        writer.dispatcher.mark_behind(writer.log.write_pos());
        let mut pos = 0;
        while pos < bytes.len() {
            pos += self.append_framed(writer, &bytes[pos..])?;
        }
        Ok(())
    }

    /// Appends one record of a chunk (`rest` starts with it), or the blank filler that ends
    /// the chunk, after checking its size, magic and physical offset; returns its size.
    fn append_framed(&self, writer: &mut WriterState, rest: &[u8]) -> Result<usize, StoreError> {
        let offset = CommitLogOffset(writer.log.write_pos());
        let bad = |reason: &str| StoreError::ReplicaBadChunk {
            offset,
            reason: reason.to_owned(),
        };
        let segment_mismatch = |reason: String| StoreError::ReplicaSegmentMismatch {
            offset,
            segment_size: self.commit_log.segment_size(),
            reason,
        };
        let Some(head) = record::head(rest) else {
            return Err(bad("shorter than a record header"));
        };
        let remaining = writer.log.tail_remaining();
        if head.is_blank() {
            let size = head.size;
            if i64::from(size) != remaining as i64 {
                return Err(segment_mismatch(format!(
                    "the master's blank filler is {size} bytes, the replica's segment has {remaining} left"
                )));
            }
            if rest.len() != size as usize {
                return Err(bad("a blank filler must end the chunk, whole"));
            }
            self.ensure_room()?;
            self.commit_log.close_tail(&mut writer.log)?;
            return Ok(size as usize);
        }
        if !head.is_message() {
            return Err(bad("not a message record (bad magic)"));
        }
        let size = usize::try_from(head.size)
            .ok()
            .filter(|s| *s >= record::FIXED_OVERHEAD_BYTES && *s <= rest.len())
            .ok_or_else(|| bad("record size out of range"))?;
        let bytes = &rest[..size];
        let found = physical_offset(bytes);
        if found != offset {
            return Err(StoreError::ReplicaOffsetMismatch {
                expected: offset,
                found,
            });
        }
        if remaining > 0 && (size + BLANK_FILLER_BYTES) as u64 > remaining {
            return Err(segment_mismatch(format!(
                "a record of {size} bytes does not fit the {remaining} bytes left in the replica's segment"
            )));
        }
        if !writer.log.fits(size) {
            self.ensure_room()?;
        }
        // The same segment size makes the same fill-or-roll decision as on the master.
        let at = self
            .commit_log
            .append(&mut writer.log, size, true, |dst, _| {
                dst.copy_from_slice(bytes);
                Ok::<(), StoreError>(())
            })?;
        assert_eq!(
            at, offset,
            "replicated record placed elsewhere than checked"
        );
        Ok(size)
    }

    /// Dispatches the appended records from where dispatch stands, up to about `max_bytes`
    /// of them, into `batch`; the caller holds the write lock and publishes. Stops before a
    /// record that fails.
    pub(super) fn dispatch_behind(
        &self,
        writer: &mut WriterState,
        batch: &mut Batch,
        max_bytes: u64,
    ) -> Result<(), StoreError> {
        let Some(from) = writer.dispatcher.behind_from() else {
            return Ok(());
        };
        let end = writer.log.write_pos();
        // Retention may have deleted records since (nothing reads them then).
        let mut at = from.max(self.commit_log.min_offset());
        let stop = at.saturating_add(max_bytes);
        while at < end && (at < stop || batch.is_empty()) {
            match self.dispatch_at(writer, batch, at) {
                Ok(next) => at = next,
                Err(error) => {
                    writer.dispatcher.dispatched_to(at, end);
                    return Err(error);
                }
            }
        }
        writer.dispatcher.dispatched_to(at, end);
        Ok(())
    }

    /// Dispatches the record (or blank filler) at `at`; returns where the next starts.
    fn dispatch_at(
        &self,
        writer: &mut WriterState,
        batch: &mut Batch,
        at: u64,
    ) -> Result<u64, StoreError> {
        let offset = CommitLogOffset(at);
        let bytes = self.commit_log.record_at(at)?;
        let header = match record::scan_with(&bytes, record::BodyCrc::Verify) {
            record::Scanned::Message(header) => header,
            // The blank filler that ends a segment: its size is the rest.
            record::Scanned::Blank { .. } => return Ok(at + bytes.len() as u64),
            record::Scanned::Damaged(source) => {
                return Err(StoreError::BadRecord { offset, source })
            }
            record::Scanned::End => {
                return Err(StoreError::ReplicaBadChunk {
                    offset,
                    reason: "zeroes where a record was appended".into(),
                })
            }
        };
        if header.physical_offset != offset {
            return Err(StoreError::ReplicaOffsetMismatch {
                expected: offset,
                found: header.physical_offset,
            });
        }
        let incoming = Incoming {
            topic: header.topic,
            queue_id: header.queue_id,
            properties: header.properties,
            size: bytes.len(),
            store_timestamp_ms: header.store_timestamp_ms,
            queue_offset: Some(header.queue_offset),
            tags_code: header.tags_code(),
            source: Source::Appended(at),
        };
        batch.push(self.append_one(writer, &incoming, true)?);
        Ok(at + bytes.len() as u64)
    }
}

/// PHYSICALOFFSET of a message record at least `FIXED_OVERHEAD_BYTES` long.
fn physical_offset(record: &[u8]) -> CommitLogOffset {
    let field: [u8; 8] = record[PHYSICAL_OFFSET_AT..PHYSICAL_OFFSET_AT + 8]
        .try_into()
        .expect("8 bytes");
    CommitLogOffset(i64::from_be_bytes(field) as u64)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message, open_store, read, TOPIC};
    use crate::flush::FlushTarget;
    use crate::record::{self, Placement};
    use crate::{CommitLogOffset, KeyMatch, MessageStore, QueueOffset, StoreError};

    /// Records a master would have stored from `at` on, one per body, in queue 1 from
    /// queue offset `first`.
    fn chunk_at(at: CommitLogOffset, first: u64, bodies: &[&[u8]]) -> Vec<u8> {
        let mut chunk = Vec::new();
        for (n, body) in bodies.iter().enumerate() {
            let placement = Placement {
                queue_offset: QueueOffset(first + n as u64),
                physical_offset: CommitLogOffset(at.0 + chunk.len() as u64),
                store_timestamp_ms: 77,
            };
            let msg = message(1, body, "KEYS\u{1}k");
            chunk.extend(record::encode(&msg, placement).unwrap());
        }
        chunk
    }

    fn keyed(store: &MessageStore) -> usize {
        let found = store.query_by_key(TOPIC, "k", KeyMatch::AnyKey, 10, 0, i64::MAX);
        found.messages.len()
    }

    #[test]
    fn records_appended_but_not_dispatched_are_dispatched_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let first = chunk_at(store.log_end(), 0, &[b"one"]);
        let end = store.append_replicated(store.log_end(), &first).unwrap();
        store.dispatch_replicated(u64::MAX).unwrap();
        let second = chunk_at(end, 1, &[b"two", b"three"]);
        let end = store.append_replicated(end, &second).unwrap();
        assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(1));
        assert_eq!(store.dispatched_to().0, end.0 - second.len() as u64);
        // The housekeeper's checkpoint, then a crash (no shutdown).
        store.flush().unwrap();
        store.shared.housekeeping().unwrap();
        drop(store);

        let store = open_store(dir.path(), false);
        assert_eq!(store.log_end(), end);
        assert_eq!(store.dispatched_to(), end);
        assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(3));
        assert_eq!(read(&store, 1, 0).messages.len(), 3);
        assert_eq!(keyed(&store), 3);
        store.shutdown().unwrap();
    }

    #[test]
    fn a_clean_shutdown_leaves_what_was_not_dispatched_to_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let chunk = chunk_at(store.log_end(), 0, &[b"one", b"two"]);
        let end = store.append_replicated(store.log_end(), &chunk).unwrap();
        store.shutdown().unwrap();
        drop(store);

        let store = open_store(dir.path(), false);
        assert_eq!(store.log_end(), end);
        assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(2));
        assert_eq!(keyed(&store), 2);
        store.shutdown().unwrap();
    }

    #[test]
    fn a_corrupt_body_stops_dispatch_before_it_until_the_log_is_cut_back() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), true);
        let start = store.log_end();
        let good = chunk_at(start, 0, &[b"good"]);
        let bad_at = CommitLogOffset(start.0 + good.len() as u64);
        let mut damaged = chunk_at(bad_at, 1, &[b"body"]);
        // Inside the body (then topic and properties, 10 bytes): only the CRC can tell.
        let in_body = damaged.len() - 12;
        damaged[in_body] ^= 1;
        let after = CommitLogOffset(bad_at.0 + damaged.len() as u64);
        let later = chunk_at(after, 2, &[b"later"]);
        let mut chunk = good.clone();
        chunk.extend(&damaged);
        chunk.extend(&later);
        // Framing holds: the whole chunk is appended.
        let end = store.append_replicated(start, &chunk).unwrap();
        assert_eq!(end.0, start.0 + chunk.len() as u64);
        store.confirm(end);
        for _ in 0..2 {
            let error = store.dispatch_replicated(u64::MAX).unwrap_err();
            assert!(
                matches!(error, StoreError::BadRecord { offset, .. } if offset == bad_at),
                "{error}"
            );
            assert_eq!(store.dispatched_to(), bad_at);
        }
        // Readers see only what came before it.
        assert_eq!(read(&store, 1, 0).messages, [good]);
        assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(1));
        // Cut back to the bad record, the master's good bytes go in and dispatch.
        store.truncate_to(bad_at).unwrap();
        assert_eq!(store.dispatched_to(), bad_at);
        let mut resent = chunk_at(bad_at, 1, &[b"body"]);
        resent.extend(chunk_at(
            CommitLogOffset(bad_at.0 + resent.len() as u64),
            2,
            &[b"later"],
        ));
        let end = store.append_replicated(bad_at, &resent).unwrap();
        store.confirm(end);
        assert!(store.dispatch_replicated(u64::MAX).unwrap().caught_up());
        assert_eq!(store.max_offset(TOPIC, 1), QueueOffset(3));
        store.shutdown().unwrap();
    }

    #[test]
    fn an_unparsable_record_stops_dispatch_and_the_log_is_cut_back_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let start = store.log_end();
        let mut chunk = chunk_at(start, 0, &[b"body"]);
        // The property length (the last field before the properties) runs past the record.
        let properties_len_at = chunk.len() - "KEYS\u{1}k".len() - 2;
        chunk[properties_len_at] = 0x7f;
        let end = store.append_replicated(start, &chunk).unwrap();
        let error = store.dispatch_replicated(u64::MAX).unwrap_err();
        assert!(
            matches!(error, StoreError::BadRecord { offset, .. } if offset == start),
            "{error}"
        );
        assert_eq!(store.dispatched_to(), start);
        assert_eq!(store.log_end(), end);
        // Not a record a reader could walk to, yet where dispatch stands: it can be cut.
        store.truncate_to(start).unwrap();
        assert_eq!(store.log_end(), start);
        assert!(store.dispatch_replicated(u64::MAX).unwrap().caught_up());
        store.shutdown().unwrap();
    }

    #[test]
    fn a_local_append_dispatches_the_replicated_records_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let chunk = chunk_at(store.log_end(), 0, &[b"one", b"two"]);
        store.append_replicated(store.log_end(), &chunk).unwrap();
        let put = store.put(&message(1, b"mine", ""), 5).unwrap();
        assert_eq!(put.queue_offset, QueueOffset(2));
        assert_eq!(read(&store, 1, 0).messages.len(), 3);
        assert_eq!(store.dispatched_to(), store.log_end());
        store.shutdown().unwrap();
    }
}
