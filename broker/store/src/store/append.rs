//! The one append pipeline. Local sends and replicated records both become [`Incoming`]
//! records: a local message is encoded straight into the log's destination (no copy of its
//! own); a replica's chunk is copied into the log with framing checks only, and its records
//! are dispatched behind it (`reput.rs`) through the same [`Shared::append_one`]. Every
//! record takes the same path under the one write lock: its queue, room for its unit and
//! index entries, the CommitLog append (unless already there), the unit and entries staged;
//! [`Shared::publish_appended`] writes the staged records, publishes them and then their
//! units (or leaves those to the fence).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::fence::PendingUnit;
use super::shared::{Shared, WriterState};
use super::types::PutResult;
use crate::consume_queue::{ConsumeQueue, Unit};
use crate::error::StoreError;
use crate::index;
use crate::record::{self, NewMessage, Placement};
use crate::{CommitLogOffset, QueueOffset};

/// How a record's bytes reach the log.
#[derive(Clone, Copy)]
pub(super) enum Source<'a> {
    /// Encoded in place, at the offsets the append assigns.
    Encode(&'a NewMessage<'a>),
    /// A replicated record already in the log at this offset: dispatch only.
    Appended(u64),
}

/// A record on its way into the log: what dispatch needs, and its bytes.
pub(super) struct Incoming<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub properties: &'a str,
    pub size: usize,
    pub store_timestamp_ms: i64,
    /// A replicated record's own queue offset: it must be its queue's next.
    pub queue_offset: Option<QueueOffset>,
    pub tags_code: i64,
    pub source: Source<'a>,
}

/// The records of one append, `queues[i]` holding `results[i]`.
#[derive(Default)]
pub(super) struct Batch {
    pub results: Vec<PutResult>,
    pub queues: Vec<Arc<ConsumeQueue>>,
    /// Replicated records a local append dispatched first (published already, to announce).
    pub caught_up: Option<Box<Batch>>,
}

impl Batch {
    pub(super) fn with_capacity(n: usize) -> Batch {
        Batch {
            results: Vec::with_capacity(n),
            queues: Vec::with_capacity(n),
            caught_up: None,
        }
    }

    pub(super) fn push(&mut self, (result, queue): (PutResult, Arc<ConsumeQueue>)) {
        self.results.push(result);
        self.queues.push(queue);
    }

    pub(super) fn is_empty(&self) -> bool {
        self.results.is_empty()
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
        // A replica becoming master: its queues must hold every replicated record before a
        // local one takes the next queue offset.
        if writer.dispatcher.behind_from().is_some() {
            let mut caught_up = Batch::default();
            let dispatched = self.dispatch_behind(writer, &mut caught_up, u64::MAX);
            let published = self.publish_appended(writer, &caught_up);
            batch.caught_up = Some(Box::new(caught_up));
            dispatched?;
            published?;
        }
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

    /// Dispatch, the one place for local and replicated records: appends one record (unless
    /// it is there already) and writes its unit and index entries, all unpublished until
    /// `publish_appended`; the caller holds the write lock. Returns the queue for
    /// `publish_appended`.
    pub(super) fn append_one(
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
        let appends = !matches!(incoming.source, Source::Appended(_));
        // Where disk use grows in steps, the disk is read first (no syscall otherwise).
        if appends && !log.fits(incoming.size)
            || queue.cq.needs_file(&queue.tail, queue_offset.0)
            || index_writer.needs_file(entries)
        {
            self.ensure_room()?;
        }
        let store_timestamp_ms = incoming.store_timestamp_ms;
        let physical_offset = match incoming.source {
            Source::Encode(msg) => {
                queue.cq.prepare(&mut queue.tail, queue_offset.0)?;
                index_writer.prepare(&self.index, log.write_pos(), entries)?;
                self.commit_log
                    .append(log, incoming.size, in_batch, |dst, physical_offset| {
                        let placement = Placement {
                            queue_offset,
                            physical_offset,
                            store_timestamp_ms,
                        };
                        record::encode_into(dst, msg, placement)
                            .map(drop)
                            .map_err(StoreError::InvalidMessage)
                    })?
            }
            Source::Appended(at) => {
                queue.cq.prepare(&mut queue.tail, queue_offset.0)?;
                index_writer.prepare(&self.index, at, entries)?;
                CommitLogOffset(at)
            }
        };
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
    pub(super) fn publish_appended(
        &self,
        writer: &mut WriterState,
        batch: &Batch,
    ) -> Result<(), StoreError> {
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
        if let Some(caught_up) = &batch.caught_up {
            self.notify_appended(caught_up);
        }
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
        // Appended, not dispatched yet: dispatch runs behind.
        assert_eq!(store.max_offset(TOPIC, 2), QueueOffset(0));
        assert!(store.dispatch_replicated(u64::MAX).unwrap().caught_up());
        let got = read(&store, 2, 0);
        assert_eq!(got.messages, [first.clone(), second]);
        // One announcement for the queue's run of records dispatched together.
        assert_eq!(*events.lock(), [(2, 2)]);
        // Index entries carry the record's own store time.
        let found = store.query_by_key(TOPIC, "k", crate::KeyMatch::AnyKey, 10, 77, 77);
        assert_eq!(found.messages.len(), 2);
        store.shutdown().unwrap();
    }

    #[test]
    fn a_replicated_chunk_that_does_not_frame_is_refused_and_those_before_it_stay() {
        let dir = tempfile::tempdir().unwrap();
        let store = open_store(dir.path(), false);
        let start = store.log_end();
        let good = stored_at(0, b"good", 0, start);
        let next = CommitLogOffset(start.0 + good.len() as u64);
        // Not where the log ends.
        let wrong_at = store.append_replicated(next, &good).unwrap_err();
        assert!(matches!(wrong_at, StoreError::ReplicaOffsetMismatch { .. }));
        // A record stamped with another position: nothing of it is written.
        let mut chunk = good.clone();
        chunk.extend(stored_at(0, b"elsewhere", 1, CommitLogOffset(next.0 + 64)));
        let error = store.append_replicated(start, &chunk).unwrap_err();
        assert!(
            matches!(error, StoreError::ReplicaOffsetMismatch { found, .. } if found.0 == next.0 + 64),
            "{error}"
        );
        assert_eq!(store.log_end(), next);
        store.dispatch_replicated(u64::MAX).unwrap();
        assert_eq!(read(&store, 0, 0).messages, [good]);
        // Too short for a head, or a bad magic.
        let error = store.append_replicated(next, &[0; 7]).unwrap_err();
        assert!(matches!(error, StoreError::ReplicaBadChunk { .. }));
        let mut bad_magic = stored_at(0, b"body", 1, next);
        bad_magic[4] ^= 1;
        let error = store.append_replicated(next, &bad_magic).unwrap_err();
        assert!(
            matches!(error, StoreError::ReplicaBadChunk { .. }),
            "{error}"
        );
        assert_eq!(store.log_end(), next);
        store.shutdown().unwrap();
    }
}
