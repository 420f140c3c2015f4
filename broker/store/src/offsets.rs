//! Consumer offsets (RocketMQ's ConsumerOffsetManager): `"topic@group" -> queueId -> offset`,
//! the next queue offset each group will consume, persisted to `consumerOffset.json`.
//!
//! The broker keeps every change as a record of its state log (an internal topic of the
//! CommitLog): the file is a snapshot that names the state log position it covers
//! ([`ConsumerOffsets::log_position`]), and a start replays the records after it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::{Mutex, MutexGuard, RwLock};
use serde::{Deserialize, Serialize};

use crate::error::StoreError;
use crate::json_file::{read_with_backup, write_json_atomically};
use crate::QueueOffset;

/// Separates topic and group in a table key, as RocketMQ does.
const TOPIC_GROUP_SEPARATOR: char = '@';
pub const CONSUMER_OFFSET_FILE: &str = "consumerOffset.json";

type Table = BTreeMap<String, BTreeMap<u32, u64>>;

#[derive(Serialize, Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct OffsetFile {
    #[serde(default)]
    offset_table: BTreeMap<String, BTreeMap<u32, i64>>,
    /// The state log's next record whose change this table lacks (absent in Apache's files).
    #[serde(default)]
    quiver_state_log_offset: u64,
}

pub struct ConsumerOffsets {
    path: PathBuf,
    table: RwLock<Table>,
    /// The state log's next record (its queue offset) whose change is not in the table.
    /// Held across a record's append and its change, so a snapshot never names a position
    /// past a change it lacks.
    log_position: Mutex<u64>,
    /// The position the file on disk covers: retention keeps the records past it.
    persisted_position: AtomicU64,
    /// Group deletions so far: a copy of another member's table taken before one must not
    /// bring the deleted group back.
    deletions: AtomicU64,
    /// Serialises writers of the file (they share one temp file).
    persist_lock: Mutex<()>,
}

fn key(group: &str, topic: &str) -> String {
    format!("{topic}{TOPIC_GROUP_SEPARATOR}{group}")
}

/// Splits a table key into (topic, group).
fn split_key(key: &str) -> Option<(&str, &str)> {
    key.split_once(TOPIC_GROUP_SEPARATOR)
}

impl ConsumerOffsets {
    /// Loads `<config_dir>/consumerOffset.json` (or its `.bak`); empty when neither exists.
    pub fn load(config_dir: &Path) -> Result<ConsumerOffsets, StoreError> {
        let path = config_dir.join(CONSUMER_OFFSET_FILE);
        let file = read_with_backup(&path, parse_offset_file)?.unwrap_or_default();
        let log_position = file.quiver_state_log_offset;
        let table = file
            .offset_table
            .into_iter()
            .map(|(key, queues)| {
                // RocketMQ writes -1 for "nothing committed"; that is the same as absent.
                let queues = queues
                    .into_iter()
                    .filter_map(|(queue, offset)| u64::try_from(offset).ok().map(|o| (queue, o)))
                    .collect();
                (key, queues)
            })
            .collect();
        Ok(ConsumerOffsets {
            path,
            table: RwLock::new(table),
            log_position: Mutex::new(log_position),
            persisted_position: AtomicU64::new(log_position),
            deletions: AtomicU64::new(0),
            persist_lock: Mutex::new(()),
        })
    }

    /// The state log position the table covers, locked: whoever appends or applies a record
    /// holds it across the change and moves it past the record.
    pub fn log_position(&self) -> MutexGuard<'_, u64> {
        self.log_position.lock()
    }

    /// The state log position the file on disk covers: a start replays the records from
    /// there, so they must outlive retention until a later snapshot.
    pub fn persisted_position(&self) -> u64 {
        self.persisted_position.load(Ordering::Acquire)
    }

    /// How many group deletions this table has applied since it was loaded.
    pub fn deletions(&self) -> u64 {
        self.deletions.load(Ordering::Acquire)
    }

    /// Sets the offsets of queues that have none here, leaving committed ones alone (a
    /// replica filling in what its state log no longer holds). Returns how many were set.
    pub fn insert_absent(&self, group: &str, topic: &str, offsets: &[(u32, QueueOffset)]) -> usize {
        let mut table = self.table.write();
        let queues = table.entry(key(group, topic)).or_default();
        let mut inserted = 0;
        for (queue_id, offset) in offsets {
            if let std::collections::btree_map::Entry::Vacant(entry) = queues.entry(*queue_id) {
                entry.insert(offset.0);
                inserted += 1;
            }
        }
        inserted
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn commit(&self, group: &str, topic: &str, queue_id: u32, offset: QueueOffset) {
        self.table
            .write()
            .entry(key(group, topic))
            .or_default()
            .insert(queue_id, offset.0);
    }

    pub fn query(&self, group: &str, topic: &str, queue_id: u32) -> Option<QueueOffset> {
        self.table
            .read()
            .get(&key(group, topic))?
            .get(&queue_id)
            .copied()
            .map(QueueOffset)
    }

    pub fn reset(&self, group: &str, topic: &str, offsets: &[(u32, QueueOffset)]) {
        let mut table = self.table.write();
        let queues = table.entry(key(group, topic)).or_default();
        for (queue_id, offset) in offsets {
            queues.insert(*queue_id, offset.0);
        }
    }

    pub fn delete_group(&self, group: &str) {
        self.deletions.fetch_add(1, Ordering::AcqRel);
        self.table
            .write()
            .retain(|key, _| split_key(key).is_none_or(|(_, g)| g != group));
    }

    pub fn groups(&self) -> Vec<String> {
        let table = self.table.read();
        let mut groups: Vec<String> = table
            .keys()
            .filter_map(|k| split_key(k))
            .map(|(_, g)| g.to_owned())
            .collect();
        groups.sort();
        groups.dedup();
        groups
    }

    pub fn topics_of(&self, group: &str) -> Vec<String> {
        self.table
            .read()
            .keys()
            .filter_map(|k| split_key(k))
            .filter(|(_, g)| *g == group)
            .map(|(t, _)| t.to_owned())
            .collect()
    }

    pub fn table(&self, group: &str, topic: &str) -> BTreeMap<u32, QueueOffset> {
        self.table
            .read()
            .get(&key(group, topic))
            .map_or_else(BTreeMap::new, |queues| {
                queues.iter().map(|(q, o)| (*q, QueueOffset(*o))).collect()
            })
    }

    /// Writes the table and the state log position it covers atomically (temp, fsync,
    /// rename, previous kept as `.bak`).
    pub fn persist(&self) -> Result<(), StoreError> {
        let _writer = self.persist_lock.lock();
        let (table, position) = {
            let position = self.log_position.lock();
            (self.table.read().clone(), *position)
        };
        let file = OffsetFile {
            quiver_state_log_offset: position,
            offset_table: table
                .iter()
                .map(|(k, queues)| {
                    (
                        k.clone(),
                        queues.iter().map(|(q, o)| (*q, *o as i64)).collect(),
                    )
                })
                .collect(),
        };
        write_json_atomically(&self.path, &file)?;
        self.persisted_position.store(position, Ordering::Release);
        Ok(())
    }
}

/// Parses standard JSON, or RocketMQ's own form with unquoted integer keys.
fn parse_offset_file(bytes: &[u8]) -> Result<OffsetFile, serde_json::Error> {
    serde_json::from_slice(bytes).or_else(|first_error| {
        let text = std::str::from_utf8(bytes).map_err(|_| first_error)?;
        serde_json::from_str(&quote_integer_keys(text))
    })
}

/// Quotes object keys that are bare integers (`{0:250}` -> `{"0":250}`), outside strings.
fn quote_integer_keys(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len() + 16);
    let (mut i, mut in_string, mut escaped) = (0, false, false);
    while i < chars.len() {
        let c = chars[i];
        out.push(c);
        i += 1;
        if in_string {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '{' | ',' => {
                while i < chars.len() && chars[i].is_whitespace() {
                    out.push(chars[i]);
                    i += 1;
                }
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_digit() || (i == start && chars[i] == '-'))
                {
                    i += 1;
                }
                let token: String = chars[start..i].iter().collect();
                let mut look = i;
                while look < chars.len() && chars[look].is_whitespace() {
                    look += 1;
                }
                if !token.is_empty() && chars.get(look) == Some(&':') {
                    out.push('"');
                    out.push_str(&token);
                    out.push('"');
                } else {
                    out.push_str(&token);
                }
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_snapshot_names_the_state_log_position_it_covers() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = ConsumerOffsets::load(dir.path()).unwrap();
        assert_eq!(*offsets.log_position(), 0);
        offsets.commit("g", "T", 1, QueueOffset(42));
        *offsets.log_position() = 7;
        // Retention keeps what the file on disk lacks: the position moves only with it.
        assert_eq!(offsets.persisted_position(), 0);
        offsets.persist().unwrap();
        assert_eq!(offsets.persisted_position(), 7);
        let loaded = ConsumerOffsets::load(dir.path()).unwrap();
        assert_eq!(*loaded.log_position(), 7);
        assert_eq!(loaded.persisted_position(), 7);
        assert_eq!(loaded.query("g", "T", 1), Some(QueueOffset(42)));
    }

    #[test]
    fn apache_files_without_a_position_start_the_state_log_at_zero() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(CONSUMER_OFFSET_FILE),
            r#"{"offsetTable":{"T@g":{0:250}}}"#,
        )
        .unwrap();
        let loaded = ConsumerOffsets::load(dir.path()).unwrap();
        assert_eq!(*loaded.log_position(), 0);
        assert_eq!(loaded.query("g", "T", 0), Some(QueueOffset(250)));
    }

    #[test]
    fn insert_absent_keeps_what_is_committed() {
        let dir = tempfile::tempdir().unwrap();
        let offsets = ConsumerOffsets::load(dir.path()).unwrap();
        offsets.commit("g", "T", 0, QueueOffset(5));
        let copied = [(0, QueueOffset(3)), (1, QueueOffset(9))];
        assert_eq!(offsets.insert_absent("g", "T", &copied), 1);
        assert_eq!(offsets.query("g", "T", 0), Some(QueueOffset(5)));
        assert_eq!(offsets.query("g", "T", 1), Some(QueueOffset(9)));
    }

    #[test]
    fn quotes_only_bare_integer_keys() {
        assert_eq!(
            quote_integer_keys(r#"{"offsetTable":{"T@g":{0:250, 12 :7},"a{1:2}":[1,2]}}"#),
            r#"{"offsetTable":{"T@g":{"0":250, "12" :7},"a{1:2}":[1,2]}}"#
        );
    }
}
