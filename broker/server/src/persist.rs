//! Atomic JSON config files (`config/topics.json`, `config/subscriptionGroup.json`).

use std::path::Path;

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::BrokerError;

/// Writes `value` as JSON: temp file, fsync, previous kept as `.bak`, rename, fsync dir.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), BrokerError> {
    quiver_store::write_json_atomically(path, value).map_err(|source| BrokerError::Persist {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads a JSON file written by [`write_json`], falling back to its `.bak`; None if neither exists.
pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, BrokerError> {
    quiver_store::read_json_with_backup(path).map_err(|source| BrokerError::Persist {
        path: path.to_path_buf(),
        source,
    })
}
