//! The checkpoint: how far the CommitLog and ConsumeQueues are known durable, and whether
//! the last run shut down cleanly. Written atomically as `<data_dir>/checkpoint`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::json_file::{read_json_with_backup, write_json_into_existing_dir};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Checkpoint {
    /// Set by `shutdown()`, cleared as soon as a store opens.
    pub clean_shutdown: bool,
    /// CommitLog bytes below this were fsynced.
    pub commit_log_durable_offset: u64,
    /// ConsumeQueue units for every record below this CommitLog offset were fsynced.
    pub consume_queue_durable_offset: u64,
    /// Message index entries for every record below this CommitLog offset were fsynced with
    /// their slots. Absent in checkpoints written before the index: it is built from the
    /// start of the log once.
    #[serde(default)]
    pub index_durable_offset: Option<u64>,
    /// With `publish_on_confirm`: records below this were confirmed (a lower bound of the
    /// read fence when written). A reopened store shows only these until `confirm` moves;
    /// absent (older checkpoints, standalone stores): nothing is known confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmed_offset: Option<u64>,
}

pub(crate) fn checkpoint_path(data_dir: &Path) -> PathBuf {
    data_dir.join("checkpoint")
}

/// The last checkpoint; `None` when missing or unreadable (recovery then scans everything).
pub(crate) fn load(data_dir: &Path) -> Option<Checkpoint> {
    match read_json_with_backup(&checkpoint_path(data_dir)) {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, "checkpoint unreadable, recovering from the whole log");
            None
        }
    }
}

/// Writes the checkpoint; never re-creates a data directory deleted under the store.
pub(crate) fn save(data_dir: &Path, checkpoint: &Checkpoint) -> Result<(), StoreError> {
    write_json_into_existing_dir(&checkpoint_path(data_dir), checkpoint)
}
