//! The consumer's local table of offsets to commit (RocketMQ's `RemoteBrokerOffsetStore`):
//! written by consumption, read when pulling (piggy-backed commit) and by the 5 s persister.

use std::collections::HashMap;
use std::hash::Hash;

use parking_lot::Mutex;
use quiver_protocol::offset::QueueOffset;

/// How an offset update treats a smaller value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateMode {
    /// Consumption progress: an offset never moves backwards.
    IncreaseOnly,
    /// A reset or a fresh assignment: take the value as it is.
    Overwrite,
}

#[derive(Debug)]
pub struct OffsetTable<Q> {
    offsets: Mutex<HashMap<Q, QueueOffset>>,
}

impl<Q> Default for OffsetTable<Q> {
    fn default() -> Self {
        Self {
            offsets: Mutex::new(HashMap::new()),
        }
    }
}

impl<Q: Clone + Eq + Hash> OffsetTable<Q> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Returns the offset now stored for `queue`.
    pub fn update(&self, queue: &Q, offset: QueueOffset, mode: UpdateMode) -> QueueOffset {
        let mut offsets = self.offsets.lock();
        let entry = offsets.entry(queue.clone()).or_insert(offset);
        if mode == UpdateMode::Overwrite || offset > *entry {
            *entry = offset;
        }
        *entry
    }

    pub fn read(&self, queue: &Q) -> Option<QueueOffset> {
        self.offsets.lock().get(queue).copied()
    }

    pub fn remove(&self, queue: &Q) -> Option<QueueOffset> {
        self.offsets.lock().remove(queue)
    }

    /// Every (queue, offset) to persist.
    pub fn snapshot(&self) -> Vec<(Q, QueueOffset)> {
        self.offsets
            .lock()
            .iter()
            .map(|(q, o)| (q.clone(), *o))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increase_only_never_moves_back() {
        let table = OffsetTable::new();
        assert_eq!(
            table.update(&1u32, QueueOffset(10), UpdateMode::IncreaseOnly),
            QueueOffset(10)
        );
        assert_eq!(
            table.update(&1u32, QueueOffset(7), UpdateMode::IncreaseOnly),
            QueueOffset(10)
        );
        assert_eq!(
            table.update(&1u32, QueueOffset(12), UpdateMode::IncreaseOnly),
            QueueOffset(12)
        );
        assert_eq!(table.read(&1), Some(QueueOffset(12)));
    }

    #[test]
    fn overwrite_resets_and_remove_forgets() {
        let table = OffsetTable::new();
        table.update(&1u32, QueueOffset(10), UpdateMode::IncreaseOnly);
        assert_eq!(
            table.update(&1u32, QueueOffset(0), UpdateMode::Overwrite),
            QueueOffset(0)
        );
        assert_eq!(table.snapshot(), vec![(1, QueueOffset(0))]);
        assert_eq!(table.remove(&1), Some(QueueOffset(0)));
        assert_eq!(table.read(&1), None);
    }
}
