//! Typed positions: a byte offset in the CommitLog and a message index in one ConsumeQueue.

use std::fmt;

/// A byte position in the CommitLog, counted from the first byte ever written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CommitLogOffset(pub u64);

/// A message index inside one (topic, queueId) ConsumeQueue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct QueueOffset(pub u64);

impl fmt::Display for CommitLogOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Display for QueueOffset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}
