//! The store's error type: one enum for the layer, each variant with its context.

use std::path::PathBuf;
use std::sync::Arc;

use crate::config::ConfigError;
use crate::disk::WriteRefusal;
use crate::record::RecordError;
use crate::CommitLogOffset;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Config(#[from] ConfigError),

    #[error("{op} {}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("message rejected")]
    InvalidMessage(#[source] RecordError),

    #[error("topic {topic:?} cannot name a consume queue directory")]
    InvalidTopic { topic: String },

    #[error("message of {size} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge { size: u64, max: u32 },

    #[error("bad record at commitlog offset {offset}")]
    BadRecord {
        offset: CommitLogOffset,
        #[source]
        source: RecordError,
    },

    #[error(
        "record at commitlog offset {offset} claims queue offset {queue_offset} of {topic}/{queue_id}: \
         more records than the log holds before it (a damaged header)"
    )]
    ImpossibleQueueOffset {
        offset: CommitLogOffset,
        topic: String,
        queue_id: u32,
        queue_offset: u64,
    },

    #[error("commitlog offset {offset} is outside the readable range [{min}, {max})")]
    OffsetOutOfRange {
        offset: CommitLogOffset,
        min: CommitLogOffset,
        max: CommitLogOffset,
    },

    #[error("segment {} starts at {found} but {expected} was expected", path.display())]
    SegmentGap {
        path: PathBuf,
        expected: u64,
        found: u64,
    },

    #[error("consume queue file {} of {len} bytes does not hold whole 20-byte units", path.display())]
    BadQueueFile { path: PathBuf, len: u64 },

    #[error("index file {} is unusable: {reason}", path.display())]
    BadIndexFile { path: PathBuf, reason: String },

    #[error("malformed segment file name {}", path.display())]
    BadSegmentName { path: PathBuf },

    #[error("cannot parse {}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("flush of the commitlog failed, {offset} may not be durable")]
    FlushFailed {
        offset: CommitLogOffset,
        #[source]
        source: Arc<std::io::Error>,
    },

    #[error("another store holds {}", path.display())]
    Locked {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("replica log ends at {expected}, but the chunk starts at {found}")]
    ReplicaOffsetMismatch {
        expected: CommitLogOffset,
        found: CommitLogOffset,
    },

    #[error(
        "replicated record at {offset} is queue offset {found} of {topic}/{queue_id}, \
         but the replica's queue is at {expected}: the logs diverged"
    )]
    ReplicaQueueOffsetMismatch {
        offset: CommitLogOffset,
        topic: String,
        queue_id: u32,
        expected: u64,
        found: u64,
    },

    #[error(
        "replicated bytes at {offset} do not fit the replica's segments (segment size {segment_size}): \
         {reason}; master and replica must use the same segment size"
    )]
    ReplicaSegmentMismatch {
        offset: CommitLogOffset,
        segment_size: u64,
        reason: String,
    },

    #[error("replicated chunk is malformed at {offset}: {reason}")]
    ReplicaBadChunk {
        offset: CommitLogOffset,
        reason: String,
    },

    #[error("commitlog offset {offset} is not a record boundary (log end {end})")]
    NotARecordBoundary {
        offset: CommitLogOffset,
        end: CommitLogOffset,
    },

    #[error("the store is shut down")]
    ShutDown,

    #[error("writes refused: {0}")]
    WritesRefused(#[source] WriteRefusal),
}

impl StoreError {
    /// The I/O error behind this one, if it is one.
    pub(crate) fn io_source(&self) -> Option<&std::io::Error> {
        match self {
            StoreError::Io { source, .. } => Some(source),
            StoreError::FlushFailed { source, .. } => Some(source),
            _ => None,
        }
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StoreError::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// An error and its sources on one line, for logs and remarks.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
