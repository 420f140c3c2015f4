//! `<data-dir>/replication/epoch.json`: the newest epoch whose data this member's CommitLog
//! holds, and the data directory's incarnation. A returning member compares the epoch with
//! the group's epoch history to find the tail it must truncate; the incarnation, made when
//! the file is first written, tells the group a wiped directory from the one it knew.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::error::BrokerError;
use crate::persist;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Saved {
    epoch: u64,
    /// 0 in files written before incarnations existed: one is made and saved at open.
    #[serde(default)]
    incarnation: u64,
}

pub(super) struct EpochFile {
    path: PathBuf,
    saved: Mutex<Saved>,
}

impl EpochFile {
    /// Opens the file, making and saving (durably) this directory's incarnation if it has
    /// none yet.
    pub(super) fn open(data_dir: &Path) -> Result<EpochFile, BrokerError> {
        let path = data_dir.join("replication").join("epoch.json");
        let mut saved = persist::read_json::<Saved>(&path)?.unwrap_or_default();
        let file = EpochFile {
            path,
            saved: Mutex::new(saved),
        };
        if saved.incarnation == 0 {
            saved.incarnation = rand::random::<u64>().max(1);
            file.save(saved)?;
        }
        Ok(file)
    }

    pub(super) fn epoch(&self) -> u64 {
        self.saved.lock().epoch
    }

    pub(super) fn incarnation(&self) -> u64 {
        self.saved.lock().incarnation
    }

    /// Records (durably, before any byte of it is written or taken) that the log now holds
    /// data of `epoch`.
    pub(super) fn advance(&self, epoch: u64) -> Result<(), BrokerError> {
        let current = *self.saved.lock();
        if epoch <= current.epoch {
            return Ok(());
        }
        self.save(Saved { epoch, ..current })
    }

    fn save(&self, next: Saved) -> Result<(), BrokerError> {
        let mut saved = self.saved.lock();
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| BrokerError::Io {
                context: format!("creating {}", dir.display()),
                source,
            })?;
        }
        persist::write_json(&self.path, &next)?;
        *saved = next;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_keeps_its_incarnation_and_a_wiped_one_gets_another() {
        let dir = tempfile::tempdir().unwrap();
        let first = EpochFile::open(dir.path()).unwrap();
        assert_ne!(first.incarnation(), 0);
        first.advance(3).unwrap();
        let reopened = EpochFile::open(dir.path()).unwrap();
        assert_eq!(reopened.incarnation(), first.incarnation());
        assert_eq!(reopened.epoch(), 3);
        std::fs::remove_dir_all(dir.path().join("replication")).unwrap();
        let wiped = EpochFile::open(dir.path()).unwrap();
        assert_ne!(wiped.incarnation(), first.incarnation());
        assert_eq!(wiped.epoch(), 0);
    }
}
