//! `<data-dir>/replication/epoch.json`: the newest epoch whose data this member's CommitLog
//! holds. A returning member compares it with the group's epoch history to find the tail
//! it must truncate.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::BrokerError;
use crate::persist;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Saved {
    epoch: u64,
}

pub(super) struct EpochFile {
    path: PathBuf,
    epoch: Mutex<u64>,
}

impl EpochFile {
    pub(super) fn open(data_dir: &Path) -> Result<EpochFile, BrokerError> {
        let path = data_dir.join("replication").join("epoch.json");
        let saved = persist::read_json::<Saved>(&path)?.unwrap_or_default();
        Ok(EpochFile {
            path,
            epoch: Mutex::new(saved.epoch),
        })
    }

    pub(super) fn epoch(&self) -> u64 {
        *self.epoch.lock()
    }

    /// Records (durably, before any byte of it is written or taken) that the log now holds
    /// data of `epoch`.
    pub(super) fn advance(&self, epoch: u64) -> Result<(), BrokerError> {
        let mut current = self.epoch.lock();
        if epoch <= *current {
            return Ok(());
        }
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| BrokerError::Io {
                context: format!("creating {}", dir.display()),
                source,
            })?;
        }
        persist::write_json(&self.path, &Saved { epoch })?;
        *current = epoch;
        Ok(())
    }
}
