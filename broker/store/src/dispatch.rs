//! Dispatch (RocketMQ's ReputMessageService): every appended record becomes a 20-byte unit
//! in the ConsumeQueue of its (topic, queueId). Runs under the store's write lock: for a put
//! as it appends, so it is visible to pulls as soon as it returns; for a replica's chunks
//! behind the append (`store/reput.rs`); recovery re-dispatches what the queues lack.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

use crate::consume_queue::{ConsumeQueue, QueueTail, Unit};
use crate::error::StoreError;
use crate::record::{RecordHeader, FIXED_OVERHEAD_BYTES};

/// Every ConsumeQueue, as readers see it.
pub(crate) type QueueRegistry = RwLock<HashMap<String, HashMap<u32, Arc<ConsumeQueue>>>>;

/// The writer's side of one ConsumeQueue.
pub(crate) struct QueueWriter {
    pub cq: Arc<ConsumeQueue>,
    /// Queue offset the next record of this queue gets (= units written).
    pub next_offset: u64,
    pub tail: QueueTail,
}

impl QueueWriter {
    /// Writes and publishes the unit for the record at `next_offset` (prepared beforehand).
    pub(crate) fn index(&mut self, unit: Unit) {
        self.stage(unit);
        self.cq.publish(self.next_offset);
    }

    /// Writes the unit for the record at `next_offset` (prepared beforehand) without
    /// publishing it: the caller publishes once the record itself is.
    pub(crate) fn stage(&mut self, unit: Unit) {
        self.cq.write(&self.tail, self.next_offset, unit);
        self.next_offset += 1;
    }

    /// Takes back staged units from `offset` on (their records were never written).
    pub(crate) fn unstage(&mut self, offset: u64) {
        debug_assert!(offset >= self.cq.max_offset(), "unstaging a published unit");
        self.next_offset = offset;
    }
}

/// The topic names a directory under `consumequeue/`: it must stay one path component.
pub(crate) fn is_safe_topic_dir(topic: &str) -> bool {
    !topic.is_empty() && topic != "." && topic != ".." && !topic.contains(['/', '\\', '\0'])
}

/// What re-dispatching one record during recovery did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Redispatch {
    Indexed,
    AlreadyIndexed,
    /// The queue lacked units before this one; they stay holes that pulls skip.
    IndexedAfterHole {
        expected: u64,
    },
}

/// The writer-owned map of queue writers.
pub(crate) struct Dispatcher {
    root: PathBuf,
    units_per_file: u64,
    queues: HashMap<String, HashMap<u32, QueueWriter>>,
    /// Replicated records from here to the log end are appended but not dispatched yet.
    behind_from: Option<u64>,
}

impl Dispatcher {
    pub(crate) fn new(root: &Path, units_per_file: u64) -> Self {
        Dispatcher {
            root: root.to_path_buf(),
            units_per_file,
            queues: HashMap::new(),
            behind_from: None,
        }
    }

    /// Where the appended records still to dispatch start, if any are.
    pub(crate) fn behind_from(&self) -> Option<u64> {
        self.behind_from
    }

    /// Records appended from `at` on wait for dispatch (an earlier start stays).
    pub(crate) fn mark_behind(&mut self, at: u64) {
        self.behind_from.get_or_insert(at);
    }

    /// Records up to `at` are dispatched; `log_end`: where the appended ones end.
    pub(crate) fn dispatched_to(&mut self, at: u64, log_end: u64) {
        self.behind_from = (at < log_end).then_some(at);
    }

    /// Adopts a queue loaded by recovery.
    pub(crate) fn adopt(&mut self, cq: Arc<ConsumeQueue>) {
        let writer = QueueWriter {
            next_offset: cq.max_offset(),
            cq: Arc::clone(&cq),
            tail: QueueTail::default(),
        };
        self.queues
            .entry(cq.topic().to_owned())
            .or_default()
            .insert(cq.queue_id(), writer);
    }

    /// The writer of (topic, queueId), creating the queue (and registering it) on first use.
    pub(crate) fn queue(
        &mut self,
        registry: &QueueRegistry,
        topic: &str,
        queue_id: u32,
    ) -> Result<&mut QueueWriter, StoreError> {
        let exists = self
            .queues
            .get(topic)
            .is_some_and(|queues| queues.contains_key(&queue_id));
        if !exists {
            if !is_safe_topic_dir(topic) {
                return Err(StoreError::InvalidTopic {
                    topic: topic.to_owned(),
                });
            }
            let cq = Arc::new(ConsumeQueue::open(
                &self.root,
                topic,
                queue_id,
                self.units_per_file,
            )?);
            registry
                .write()
                .entry(topic.to_owned())
                .or_default()
                .insert(queue_id, Arc::clone(&cq));
            self.adopt(cq);
        }
        Ok(self
            .queues
            .get_mut(topic)
            .and_then(|queues| queues.get_mut(&queue_id))
            .expect("inserted above"))
    }

    /// Truncation to `log_end`: every queue drops the units of records past it and hands
    /// out their offsets again. Returns the units dropped per queue (only queues that lost
    /// some).
    pub(crate) fn truncate_past(
        &mut self,
        log_end: u64,
    ) -> Result<Vec<(String, u32, u64)>, StoreError> {
        let mut dropped = Vec::new();
        self.behind_from = self.behind_from.filter(|from| *from < log_end);
        for (topic, queues) in &mut self.queues {
            for (queue_id, writer) in queues.iter_mut() {
                let kept = writer.cq.truncate_past(log_end, writer.next_offset)?;
                if kept < writer.next_offset {
                    dropped.push((topic.clone(), *queue_id, writer.next_offset - kept));
                    writer.next_offset = kept;
                }
            }
        }
        dropped.sort();
        Ok(dropped)
    }

    /// Forgets a topic's queues (for `delete_topic`).
    pub(crate) fn remove_topic(&mut self, topic: &str) {
        self.queues.remove(topic);
    }

    /// Recovery: indexes `record` unless its queue already has it.
    pub(crate) fn redispatch(
        &mut self,
        registry: &QueueRegistry,
        record: &RecordHeader<'_>,
    ) -> Result<Redispatch, StoreError> {
        let offset = record.queue_offset.0;
        // Every earlier record of the queue lies before this one, each at least a bare record
        // long: a larger offset is a flipped header bit (the CRC covers the body only).
        if offset > record.physical_offset.0 / FIXED_OVERHEAD_BYTES as u64 {
            return Err(StoreError::ImpossibleQueueOffset {
                offset: record.physical_offset,
                topic: record.topic.to_owned(),
                queue_id: record.queue_id,
                queue_offset: offset,
            });
        }
        let writer = self.queue(registry, record.topic, record.queue_id)?;
        let unit = Unit {
            physical_offset: record.physical_offset.0,
            size: record.size,
            tags_code: record.tags_code(),
        };
        if offset < writer.next_offset {
            return Ok(Redispatch::AlreadyIndexed);
        }
        let expected = writer.next_offset;
        if offset > expected && writer.cq.min_offset() == writer.cq.max_offset() {
            // An empty queue whose earlier messages were deleted: it starts at this record.
            writer.cq.start_at(offset);
            writer.next_offset = offset;
        }
        writer.next_offset = writer.next_offset.max(offset);
        writer.cq.prepare(&mut writer.tail, offset)?;
        writer.index(unit);
        Ok(if offset == expected || writer.cq.min_offset() == offset {
            Redispatch::Indexed
        } else {
            Redispatch::IndexedAfterHole { expected }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_must_be_one_path_component() {
        assert!(is_safe_topic_dir("%RETRY%group-1"));
        for bad in ["", ".", "..", "a/b", "../etc", "a\\b"] {
            assert!(!is_safe_topic_dir(bad), "{bad:?}");
        }
    }
}
