//! The one append pipeline. Local sends and replicated chunks both become [`Incoming`]
//! records: a local message is encoded straight into the log's destination (no copy of its
//! own), a replica's record is its bytes passed through. Every record then takes the same
//! path under the one write lock: its queue, room for its unit and index entries, the
//! CommitLog append, the unit and entries staged; [`Shared::publish_appended`] writes the
//! staged records, publishes them and then their units (or leaves those to the fence).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::fence::PendingUnit;
use super::shared::{Shared, WriterState};
use super::types::PutResult;
use crate::consume_queue::{ConsumeQueue, Unit};
use crate::error::StoreError;
use crate::index;
use crate::record::{self, NewMessage, Placement, BLANK_FILLER_BYTES};
use crate::{CommitLogOffset, QueueOffset};

/// How a record's bytes reach the log.
#[derive(Clone, Copy)]
enum Source<'a> {
    /// Encoded in place, at the offsets the append assigns.
    Encode(&'a NewMessage<'a>),
    /// A replicated record, copied as it is.
    Verbatim(&'a [u8]),
}

/// A record on its way into the log: what dispatch needs, and its bytes.
struct Incoming<'a> {
    topic: &'a str,
    queue_id: u32,
    properties: &'a str,
    size: usize,
    store_timestamp_ms: i64,
    /// A replicated record's own queue offset: it must be its queue's next.
    queue_offset: Option<QueueOffset>,
    tags_code: i64,
    source: Source<'a>,
}

/// What one replicated record or filler became.
pub(super) enum Replicated {
    Message(PutResult, Arc<ConsumeQueue>),
    Filler(usize),
}

/// The records of one append, `queues[i]` holding `results[i]`.
#[derive(Default)]
pub(super) struct Batch {
    pub results: Vec<PutResult>,
    pub queues: Vec<Arc<ConsumeQueue>>,
}

impl Batch {
    pub(super) fn with_capacity(n: usize) -> Batch {
        Batch {
            results: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
        }
    }

    fn push(&mut self, (result, queue): (PutResult, Arc<ConsumeQueue>)) {
        self.results.push(result);
        self.queues.push(queue);
    }
}

impl Shared {
    /// Runs one append under the write lock: the shut-down check, `check` (nothing written
    /// yet), the records the index still lacks, then `each` appending records into `batch`
    /// until it returns an error (the records before it stay) or is done, then publishes.
    /// Returns the log end and the error that stopped `each`, already past the write gate's
    /// judgement.
    pub(super) fn append_locked(
        &self,
        batch: &mut Batch,
        check: impl FnOnce(&WriterState) -> Result<(), StoreError>,
        each: impl FnOnce(&Shared, &mut WriterState, &mut Batch) -> Result<(), StoreError>,
    ) -> Result<(u64, Option<StoreError>), StoreError> {
        let mut writer = self.writer.lock();
        if self.shut_down.load(Ordering::Acquire) {
            return Err(StoreError::ShutDown);
        }
        check(&writer)?;
        self.catch_up_index(&mut writer)
            .map_err(|error| self.refuse_on_disk_error(error))?;
        let failure = each(self, &mut writer, batch)
            .err()
            .map(|error| self.refuse_on_disk_error(error));
        // The records before a failure stay stored.
        self.publish_appended(&mut writer, batch)
            .map_err(|error| self.refuse_on_disk_error(error))?;
        Ok((writer.log.write_pos(), failure))
    }

    /// Appends local messages (`in_batch`: more than one) into `batch`.
    pub(super) fn append_messages(
        &self,
        writer: &mut WriterState,
        batch: &mut Batch,
        msgs: &[NewMessage<'_>],
        now_ms: i64,
    ) -> Result<(), StoreError> {
        for msg in msgs {
            let incoming = Incoming {
                topic: msg.topic,
                queue_id: msg.queue_id,
                properties: msg.properties,
                size: self.check_size(msg)?,
                store_timestamp_ms: now_ms,
                queue_offset: None,
                tags_code: record::property(msg.properties, record::TAGS_PROPERTY)
                    .map_or(0, record::tags_code),
                source: Source::Encode(msg),
            };
            batch.push(self.append_one(writer, &incoming, msgs.len() > 1)?);
        }
        Ok(())
    }

    /// Appends a chunk read from the master into `batch`, record by record.
    pub(super) fn append_chunk(
        &self,
        writer: &mut WriterState,
        batch: &mut Batch,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let mut pos = 0;
        while pos < bytes.len() {
            match self.append_replicated_one(writer, &bytes[pos..])? {
                Replicated::Message(result, queue) => {
                    pos += result.size as usize;
                    batch.push((result, queue));
                }
                Replicated::Filler(size) => pos += size,
            }
        }
        Ok(())
    }

    /// Appends one record of a chunk read from the master (`rest` starts with it), or the
    /// blank filler that ends the chunk; the caller holds the write lock and publishes.
    fn append_replicated_one(
        &self,
        writer: &mut WriterState,
        rest: &[u8],
    ) -> Result<Replicated, StoreError> {
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
            return Ok(Replicated::Filler(size as usize));
        }
        let size = usize::try_from(head.size)
            .ok()
            .filter(|s| *s > BLANK_FILLER_BYTES && *s <= rest.len())
            .ok_or_else(|| bad("record size out of range"))?;
        let bytes = &rest[..size];
        let header = match record::scan_with(bytes, record::BodyCrc::Verify) {
            record::Scanned::Message(header) => header,
            record::Scanned::Damaged(source) => {
                return Err(StoreError::BadRecord { offset, source })
            }
            _ => return Err(bad("not a message record")),
        };
        if header.physical_offset != offset {
            return Err(StoreError::ReplicaOffsetMismatch {
                expected: offset,
                found: header.physical_offset,
            });
        }
        if remaining > 0 && (size + BLANK_FILLER_BYTES) as u64 > remaining {
            return Err(segment_mismatch(format!(
                "a record of {size} bytes does not fit the {remaining} bytes left in the replica's segment"
            )));
        }
        let incoming = Incoming {
            topic: header.topic,
            queue_id: header.queue_id,
            properties: header.properties,
            size,
            store_timestamp_ms: header.store_timestamp_ms,
            queue_offset: Some(header.queue_offset),
            tags_code: header.tags_code(),
            source: Source::Verbatim(bytes),
        };
        // The same segment size makes the same fill-or-roll decision as on the master.
        let (result, queue) = self.append_one(writer, &incoming, true)?;
        assert_eq!(
            result.physical_offset, offset,
            "replicated record placed elsewhere than checked"
        );
        Ok(Replicated::Message(result, queue))
    }

    /// Appends one record and writes its unit and index entries, all unpublished until
    /// `publish_appended`; the caller holds the write lock. Returns the queue for
    /// `publish_appended`.
    fn append_one(
        &self,
        writer: &mut WriterState,
        incoming: &Incoming<'_>,
        in_batch: bool,
    ) -> Result<(PutResult, Arc<ConsumeQueue>), StoreError> {
        let WriterState {
            log,
            dispatcher,
            index: index_writer,
            ..
        } = writer;
        let queue = dispatcher.queue(&self.registry, incoming.topic, incoming.queue_id)?;
        if let Some(found) = incoming.queue_offset {
            // A rebuilt replica's queues start at their first record's offset.
            super::restart::start_empty_queue_at(queue, found.0, self.commit_log.min_offset());
        }
        let queue_offset = QueueOffset(queue.next_offset);
        if let Some(found) = incoming.queue_offset.filter(|found| *found != queue_offset) {
            return Err(StoreError::ReplicaQueueOffsetMismatch {
                offset: CommitLogOffset(log.write_pos()),
                topic: incoming.topic.to_owned(),
                queue_id: incoming.queue_id,
                expected: queue_offset.0,
                found: found.0,
            });
        }
        let keys = index::index_keys(incoming.properties)
            .take(index_writer.max_entries_per_record() as usize);
        let entries = keys.clone().count() as u32;
        // Where disk use grows in steps, the disk is read first (no syscall otherwise).
        if !log.fits(incoming.size)
            || queue.cq.needs_file(&queue.tail, queue_offset.0)
            || index_writer.needs_file(entries)
        {
            self.ensure_room()?;
        }
        queue.cq.prepare(&mut queue.tail, queue_offset.0)?;
        index_writer.prepare(&self.index, log.write_pos(), entries)?;
        let store_timestamp_ms = incoming.store_timestamp_ms;
        let physical_offset =
            self.commit_log
                .append(
                    log,
                    incoming.size,
                    in_batch,
                    |dst, physical_offset| match incoming.source {
                        Source::Encode(msg) => {
                            let placement = Placement {
                                queue_offset,
                                physical_offset,
                                store_timestamp_ms,
                            };
                            record::encode_into(dst, msg, placement)
                                .map(drop)
                                .map_err(StoreError::InvalidMessage)
                        }
                        Source::Verbatim(bytes) => {
                            dst.copy_from_slice(bytes);
                            Ok(())
                        }
                    },
                )?;
        queue.stage(Unit {
            physical_offset: physical_offset.0,
            size: incoming.size as u32,
            tags_code: incoming.tags_code,
        });
        for key in keys {
            index_writer.stage(incoming.topic, key, physical_offset.0, store_timestamp_ms);
        }
        let result = PutResult {
            physical_offset,
            queue_offset,
            size: incoming.size as u32,
            store_timestamp_ms,
        };
        Ok((result, Arc::clone(&queue.cq)))
    }

    /// Writes the staged records, then publishes them, then their units: a reader who sees a
    /// unit sees its record. Records a failed write left out are not published, and their
    /// queues hand out the same offsets again.
    fn publish_appended(&self, writer: &mut WriterState, batch: &Batch) -> Result<(), StoreError> {
        let written = self.commit_log.write_staged(&mut writer.log);
        let log_end = writer.log.write_pos();
        let appended = || batch.results.iter().zip(&batch.queues);
        for (result, queue) in appended().rev() {
            if result.physical_offset.0 >= log_end {
                writer
                    .dispatcher
                    .queue(&self.registry, queue.topic(), queue.queue_id())?
                    .unstage(result.queue_offset.0);
            }
        }
        writer.index.unstage_from(&self.index, log_end);
        self.commit_log.publish(log_end);
        let kept = appended().filter(|(result, _)| result.physical_offset.0 < log_end);
        if self.fence.enabled() {
            // Visible once confirmed (`release_confirmed`); the records themselves are
            // published above, for replicas.
            self.fence.pend(kept.map(|(result, queue)| PendingUnit {
                queue: Arc::clone(queue),
                max: result.queue_offset.0 + 1,
                start: result.physical_offset.0,
                end: result.physical_offset.0 + u64::from(result.size),
            }));
        } else {
            for (result, queue) in kept {
                queue.publish(result.queue_offset.0 + 1);
            }
        }
        writer.index.publish();
        written
    }

    /// Tells the hook about the queues `batch` grew (with the fence: those it released).
    pub(super) fn notify_appended(&self, batch: &Batch) {
        if self.fence.enabled() {
            self.release_confirmed();
            return;
        }
        let queues = &batch.queues;
        for (i, (result, queue)) in batch.results.iter().zip(queues).enumerate() {
            let next_same_queue = queues.get(i + 1).is_some_and(|n| Arc::ptr_eq(n, queue));
            if !next_same_queue {
                self.notify(queue.topic(), queue.queue_id(), result.queue_offset.0 + 1);
            }
        }
    }

    /// Indexes the records recovery could not (the disk was full), before any new one.
    fn catch_up_index(&self, writer: &mut WriterState) -> Result<(), StoreError> {
        while let Some((from, to)) = writer.index_behind {
            // Retention may have deleted records since.
            let at = from.max(self.commit_log.min_offset());
            if at >= to {
                writer.index_behind = None;
                break;
            }
            let bytes = self.commit_log.record_at(at)?;
            let next = match record::scan_with(&bytes, record::BodyCrc::Skip) {
                record::Scanned::Message(header) => {
                    writer.index.reindex(&self.index, &header)?;
                    at + u64::from(header.size)
                }
                // The blank filler that ends a segment: its size is the rest.
                _ => at + bytes.len() as u64,
            };
            if next <= at {
                tracing::warn!(at, "cannot read on to index the records recovery could not");
                writer.index_behind = None;
                break;
            }
            writer.index_behind = Some((next, to));
        }
        Ok(())
    }

    pub(super) fn check_size(&self, msg: &NewMessage<'_>) -> Result<usize, StoreError> {
        let size = record::encoded_len(msg).map_err(StoreError::InvalidMessage)?;
        if size > self.config.max_message_size_bytes as usize {
            return Err(StoreError::MessageTooLarge {
                size: size as u64,
                max: self.config.max_message_size_bytes,
            });
        }
        Ok(size)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{message, open_store, read, record_events, TOPIC};
    use crate::record::{self, Placement};
    use crate::{CommitLogOffset, QueueOffset, StoreError};

    /// A record encoded as a master would have stored it at `at`.
    fn stored_at(queue_id: u32, body: &[u8], queue_offset: u64, at: CommitLogOffset) -> Vec<u8> {
        let placement = Placement {
            queue_offset: QueueOffset(queue_offset),
            physical_offset: at,
            store_timestamp_ms: 77,
        };
        record::encode(&message(queue_id, body, "KEYS\u{1}k"), placement).unwrap()
    }

    #[test]
    fn a_local_batch_is_encoded_in_place_published_and_announced_once_per_queue_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let events = record_events(&store);
        let msgs = [
            message(0, b"a", ""),
            message(0, b"bb", ""),
            message(1, b"c", ""),
        ];
        let appended = store.append(&msgs, 5).unwrap();
        let offsets: Vec<_> = appended.results.iter().map(|r| r.queue_offset.0).collect();
        assert_eq!(offsets, [0, 1, 0]);
        assert_eq!(appended.end, store.log_end());
        assert_eq!(*events.lock(), [(0, 2), (1, 1)]);
        for (msg, result) in msgs.iter().zip(&appended.results) {
            let placement = Placement {
                queue_offset: result.queue_offset,
                physical_offset: result.physical_offset,
                store_timestamp_ms: 5,
            };
            let bytes = store.read_record_bytes(result.physical_offset).unwrap();
            assert_eq!(bytes, record::encode(msg, placement).unwrap());
        }
        store.shutdown().unwrap();
    }

    #[test]
    fn replicated_records_pass_through_byte_for_byte_and_are_dispatched() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let events = record_events(&store);
        let first = stored_at(2, b"one", 0, store.log_end());
        let end = store.append_replicated(store.log_end(), &first).unwrap();
        let second = stored_at(2, b"two", 1, end);
        let end = store.append_replicated(end, &second).unwrap();
        assert_eq!(end, store.log_end());
        let got = read(&store, 2, 0);
        assert_eq!(got.messages, [first.clone(), second]);
        assert_eq!(*events.lock(), [(2, 1), (2, 2)]);
        // Index entries carry the record's own store time.
        let found = store.query_by_key(TOPIC, "k", crate::KeyMatch::AnyKey, 10, 77, 77);
        assert_eq!(found.messages.len(), 2);
        store.shutdown().unwrap();
    }

    #[test]
    fn a_replicated_record_that_does_not_fit_is_refused_and_those_before_it_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let start = store.log_end();
        let good = stored_at(0, b"good", 0, start);
        let next = CommitLogOffset(start.0 + good.len() as u64);
        // Not where the log ends.
        let wrong_at = store.append_replicated(next, &good).unwrap_err();
        assert!(matches!(wrong_at, StoreError::ReplicaOffsetMismatch { .. }));
        // Not its queue's next offset: nothing of it is written.
        let mut chunk = good.clone();
        chunk.extend(stored_at(0, b"skips", 3, next));
        let error = store.append_replicated(start, &chunk).unwrap_err();
        assert!(matches!(
            error,
            StoreError::ReplicaQueueOffsetMismatch {
                expected: 1,
                found: 3,
                ..
            }
        ));
        assert_eq!(store.log_end(), next);
        assert_eq!(read(&store, 0, 0).messages, [good]);
        // Damaged, or too short for a head.
        let mut damaged = stored_at(0, b"body", 1, next);
        // Inside the body (then topic and properties, 10 bytes): the CRC fails.
        let in_body = damaged.len() - 12;
        damaged[in_body] ^= 1;
        let error = store.append_replicated(next, &damaged).unwrap_err();
        assert!(matches!(error, StoreError::BadRecord { .. }), "{error}");
        let error = store.append_replicated(next, &[0; 7]).unwrap_err();
        assert!(matches!(error, StoreError::ReplicaBadChunk { .. }));
        assert_eq!(store.log_end(), next);
        store.shutdown().unwrap();
    }
}
