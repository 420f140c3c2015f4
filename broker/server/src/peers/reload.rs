//! The config file's `peers`, followed while the broker runs: the operator lists a Broker's
//! other groups there and rewrites the file (a mounted ConfigMap) when groups come or go, so a
//! scale-out or scale-in reaches the running brokers without a restart. Only `peers` applies
//! live; any other setting changed in the file is logged once and waits for the next start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use super::PeerView;
use crate::acl::{stamp_of, FileStamp};
use crate::config::{is_host_port, BrokerConfig};

/// How often the file's metadata is looked at for a change.
pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// The file the peers come from, what it held last and the counters of its re-reads.
pub struct PeersFile {
    path: PathBuf,
    stamp: Mutex<FileStamp>,
    /// The file's settings but `peers` as last read: a change among them is logged once.
    others: Mutex<Option<serde_json::Value>>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

impl PeersFile {
    /// Follows `path` from its current version on (the one the broker started from). Blocking.
    pub fn open(path: &Path) -> PeersFile {
        let stamp = stamp_of(path);
        let others = read(path).ok().map(|config| others_of(&config));
        PeersFile {
            path: path.to_path_buf(),
            stamp: Mutex::new(stamp),
            others: Mutex::new(others),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        }
    }

    /// Reads the file again if it changed since last time and gives `view` its `peers`; a file
    /// that does not parse, or names a peer that is not host:port, keeps the peers in force, is
    /// logged and counted. Blocking.
    pub fn reload_if_changed(&self, view: &PeerView) {
        let stamp = stamp_of(&self.path);
        {
            let mut last = self.stamp.lock();
            if *last == stamp {
                return;
            }
            *last = stamp;
        }
        match read(&self.path) {
            Ok(config) => {
                self.note_other_changes(&config);
                if view.set_addresses(&config.peers) {
                    tracing::info!(path = %self.path.display(), peers = ?config.peers, "peers reloaded from the config file");
                }
                self.reloads.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::error!(path = %self.path.display(), %error, "config file not reloaded; the previous peers stay in force");
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Logs the settings other than `peers` that differ from the file's last version: they
    /// cannot change under a running broker and take effect at its next start.
    fn note_other_changes(&self, config: &BrokerConfig) {
        let now = others_of(config);
        let before = self.others.lock().replace(now.clone());
        let Some(before) = before else { return };
        let changed: Vec<&String> = match (before.as_object(), now.as_object()) {
            (Some(before), Some(now)) => now
                .iter()
                .filter(|(key, value)| before.get(*key) != Some(value))
                .map(|(key, _)| key)
                .collect(),
            _ => return,
        };
        if !changed.is_empty() {
            tracing::warn!(path = %self.path.display(), settings = ?changed, "config file settings changed that apply only at the next start; until then they are ignored");
        }
    }

    /// (reloads that took, reloads that failed) since start.
    pub fn reload_counts(&self) -> (u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_failures.load(Ordering::Relaxed),
        )
    }
}

fn read(path: &Path) -> Result<BrokerConfig, String> {
    let config = BrokerConfig::from_file(path).map_err(|error| crate::error::chain(&error))?;
    match config.peers.iter().find(|peer| !is_host_port(peer)) {
        Some(bad) => Err(format!("{}: peer `{bad}` is not host:port", path.display())),
        None => Ok(config),
    }
}

/// The settings of `config` but `peers`, as the file's keys.
fn others_of(config: &BrokerConfig) -> serde_json::Value {
    let mut value = serde_json::to_value(config).expect("config serializes");
    if let Some(settings) = value.as_object_mut() {
        settings.remove("peers");
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peers(list: &[&str]) -> Vec<String> {
        list.iter().map(|peer| peer.to_string()).collect()
    }

    #[test]
    fn a_rewritten_file_changes_the_peers_and_a_bad_one_keeps_them_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qb-0.json");
        std::fs::write(&path, r#"{"broker-name": "qb-0", "peers": ["a:1"]}"#).unwrap();
        let view = PeerView::new(&peers(&["a:1"]));
        let file = PeersFile::open(&path);
        file.reload_if_changed(&view);
        assert_eq!(file.reload_counts(), (0, 0), "the file as started from");

        let grown = r#"{"broker-name": "qb-0", "peers": ["a:1", "b:22"]}"#;
        std::fs::write(&path, grown).unwrap();
        file.reload_if_changed(&view);
        assert_eq!(view.addresses(), peers(&["a:1", "b:22"]));
        assert_eq!(file.reload_counts(), (1, 0));

        std::fs::write(&path, r#"{"peers": ["a:1""#).unwrap();
        file.reload_if_changed(&view);
        assert_eq!(view.addresses(), peers(&["a:1", "b:22"]), "kept");
        assert_eq!(file.reload_counts(), (1, 1));
        // The same bad file is not read (nor counted) again until it changes.
        file.reload_if_changed(&view);
        assert_eq!(file.reload_counts(), (1, 1));
        std::fs::write(&path, r#"{"peers": ["no-port"]}"#).unwrap();
        file.reload_if_changed(&view);
        assert_eq!(view.addresses(), peers(&["a:1", "b:22"]), "kept");
        assert_eq!(file.reload_counts(), (1, 2));
        std::fs::remove_file(&path).unwrap();
        file.reload_if_changed(&view);
        assert_eq!(file.reload_counts(), (1, 3), "a missing file fails too");

        // Shrunk, with another setting changed (logged, not applied): the peers still follow.
        let shrunk = r#"{"broker-name": "qb-0", "flush-mode": "sync", "peers": ["b:22"]}"#;
        std::fs::write(&path, shrunk).unwrap();
        file.reload_if_changed(&view);
        assert_eq!(view.addresses(), peers(&["b:22"]));
        assert_eq!(file.reload_counts(), (2, 3));
    }
}
