//! The in-flight messages of one assigned queue (RocketMQ's `ProcessQueue`): it decides the
//! offset a group may commit, which is never past a message that is still being consumed.

use std::collections::BTreeMap;

use quiver_protocol::offset::QueueOffset;

/// What removing consumed messages means for the committed offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CommitPoint {
    /// Nothing was in flight, so the committed offset must not move.
    Unchanged,
    /// Everything below this offset is consumed: the smallest offset still in flight, or one
    /// past the highest offset ever taken in when none is left.
    Advance(QueueOffset),
}

/// Messages of one queue that were pulled but not yet fully consumed, ordered by queue offset.
#[derive(Debug)]
pub struct ProcessQueue<M> {
    in_flight: BTreeMap<QueueOffset, (u64, M)>,
    /// Orderly mode: messages taken out for consumption but not yet committed.
    consuming: BTreeMap<QueueOffset, (u64, M)>,
    highest_offset: Option<QueueOffset>,
    bytes_in_flight: u64,
    dropped: bool,
}

impl<M> Default for ProcessQueue<M> {
    fn default() -> Self {
        Self {
            in_flight: BTreeMap::new(),
            consuming: BTreeMap::new(),
            highest_offset: None,
            bytes_in_flight: 0,
            dropped: false,
        }
    }
}

impl<M: Clone> ProcessQueue<M> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes in pulled messages; returns how many were new (a re-pulled offset is ignored).
    pub fn put_messages(
        &mut self,
        messages: impl IntoIterator<Item = (QueueOffset, u64, M)>,
    ) -> usize {
        let mut added = 0;
        for (offset, size_bytes, message) in messages {
            if self.in_flight.contains_key(&offset) || self.consuming.contains_key(&offset) {
                continue;
            }
            self.in_flight.insert(offset, (size_bytes, message));
            self.bytes_in_flight += size_bytes;
            self.highest_offset = Some(self.highest_offset.map_or(offset, |h| h.max(offset)));
            added += 1;
        }
        added
    }

    /// Concurrent mode: forgets consumed (or sent-back) messages and says where the
    /// committed offset may move.
    pub fn remove_messages(&mut self, offsets: &[QueueOffset]) -> CommitPoint {
        if self.in_flight.is_empty() {
            return CommitPoint::Unchanged;
        }
        for offset in offsets {
            if let Some((size_bytes, _)) = self.in_flight.remove(offset) {
                self.bytes_in_flight -= size_bytes;
            }
        }
        CommitPoint::Advance(self.next_unconsumed())
    }

    /// Smallest offset still in flight, else one past the highest offset taken in.
    fn next_unconsumed(&self) -> QueueOffset {
        match self.in_flight.keys().next() {
            Some(first) => *first,
            None => QueueOffset(self.highest_offset.map_or(0, |h| h.0 + 1)),
        }
    }

    /// Orderly mode: takes out up to `batch` messages in offset order for consumption.
    pub fn take_messages(&mut self, batch: usize) -> Vec<(QueueOffset, M)> {
        let mut taken = Vec::with_capacity(batch.min(self.in_flight.len()));
        while taken.len() < batch {
            let Some((offset, entry)) = self.in_flight.pop_first() else {
                break;
            };
            taken.push((offset, entry.1.clone()));
            self.consuming.insert(offset, entry);
        }
        taken
    }

    /// Orderly mode: the taken messages are consumed; returns the offset to commit.
    pub fn commit_taken(&mut self) -> CommitPoint {
        let Some((last, _)) = self.consuming.last_key_value() else {
            return CommitPoint::Unchanged;
        };
        let next = QueueOffset(last.0 + 1);
        let consumed: u64 = self.consuming.values().map(|(size, _)| *size).sum();
        self.bytes_in_flight -= consumed;
        self.consuming.clear();
        CommitPoint::Advance(next)
    }

    /// Orderly mode: the taken messages failed and go back to be consumed again first.
    pub fn return_taken(&mut self) {
        let consuming = std::mem::take(&mut self.consuming);
        self.in_flight.extend(consuming);
    }

    /// Orderly mode: like [`Self::return_taken`], updating each message first (attempt count).
    pub fn return_taken_with(&mut self, mut update: impl FnMut(&mut M)) {
        let mut consuming = std::mem::take(&mut self.consuming);
        for (_, message) in consuming.values_mut() {
            update(message);
        }
        self.in_flight.extend(consuming);
    }

    pub fn message_count(&self) -> usize {
        self.in_flight.len() + self.consuming.len()
    }

    pub fn bytes_in_flight(&self) -> u64 {
        self.bytes_in_flight
    }

    /// Distance between the lowest and highest in-flight offsets (RocketMQ's span check).
    pub fn offset_span(&self) -> u64 {
        match (
            self.in_flight.keys().next(),
            self.in_flight.keys().next_back(),
        ) {
            (Some(first), Some(last)) => last.0 - first.0,
            _ => 0,
        }
    }

    /// Lowest and highest offsets held (pulled, not yet committed), if any.
    pub fn offset_range(&self) -> Option<(QueueOffset, QueueOffset)> {
        let held = || self.in_flight.keys().chain(self.consuming.keys());
        Some((*held().min()?, *held().max()?))
    }

    pub fn is_dropped(&self) -> bool {
        self.dropped
    }

    /// Marks the queue as taken away: in-flight results no longer move its offset.
    pub fn mark_dropped(&mut self) {
        self.dropped = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(pq: &mut ProcessQueue<u32>, offsets: &[u64]) {
        pq.put_messages(offsets.iter().map(|o| (QueueOffset(*o), 10, *o as u32)));
    }

    #[test]
    fn removing_from_an_empty_queue_keeps_the_offset() {
        let mut pq = ProcessQueue::<u32>::new();
        assert_eq!(
            pq.remove_messages(&[QueueOffset(3)]),
            CommitPoint::Unchanged
        );
    }

    #[test]
    fn commit_point_is_the_smallest_offset_still_in_flight() {
        let mut pq = ProcessQueue::new();
        put(&mut pq, &[10, 11, 12, 13]);
        assert_eq!(
            pq.remove_messages(&[QueueOffset(11), QueueOffset(13)]),
            CommitPoint::Advance(QueueOffset(10))
        );
        assert_eq!(
            pq.remove_messages(&[QueueOffset(10)]),
            CommitPoint::Advance(QueueOffset(12))
        );
        assert_eq!(pq.message_count(), 1);
        assert_eq!(pq.bytes_in_flight(), 10);
    }

    #[test]
    fn commit_point_is_max_plus_one_when_everything_is_consumed() {
        let mut pq = ProcessQueue::new();
        put(&mut pq, &[5, 6, 7]);
        assert_eq!(
            pq.remove_messages(&[QueueOffset(7), QueueOffset(5), QueueOffset(6)]),
            CommitPoint::Advance(QueueOffset(8))
        );
        assert_eq!(pq.bytes_in_flight(), 0);
        // A second batch after draining keeps counting from the highest offset seen.
        put(&mut pq, &[8]);
        assert_eq!(
            pq.remove_messages(&[QueueOffset(8)]),
            CommitPoint::Advance(QueueOffset(9))
        );
    }

    #[test]
    fn repulled_offsets_are_not_counted_twice() {
        let mut pq = ProcessQueue::new();
        put(&mut pq, &[1, 2]);
        assert_eq!(
            pq.put_messages([(QueueOffset(2), 10, 2), (QueueOffset(3), 10, 3)]),
            1
        );
        assert_eq!(pq.bytes_in_flight(), 30);
        assert_eq!(pq.offset_span(), 2);
    }

    #[test]
    fn orderly_take_commit_and_return() {
        let mut pq = ProcessQueue::new();
        put(&mut pq, &[20, 21, 22]);
        let taken = pq.take_messages(2);
        assert_eq!(
            taken.iter().map(|(o, _)| o.0).collect::<Vec<_>>(),
            vec![20, 21]
        );
        pq.return_taken();
        assert_eq!(pq.take_messages(2).len(), 2);
        assert_eq!(pq.commit_taken(), CommitPoint::Advance(QueueOffset(22)));
        assert_eq!(pq.message_count(), 1);
        assert_eq!(pq.commit_taken(), CommitPoint::Unchanged);
        assert_eq!(pq.take_messages(5).len(), 1);
        assert_eq!(pq.commit_taken(), CommitPoint::Advance(QueueOffset(23)));
        assert_eq!(pq.bytes_in_flight(), 0);
    }
}
