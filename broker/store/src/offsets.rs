//! Consumer offsets (RocketMQ's ConsumerOffsetManager): `"topic@group" -> queueId -> offset`,
//! the next queue offset each group will consume, persisted to `consumerOffset.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use parking_lot::{Mutex, RwLock};
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
}

pub struct ConsumerOffsets {
    path: PathBuf,
    table: RwLock<Table>,
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
            persist_lock: Mutex::new(()),
        })
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

    /// Writes the table atomically (temp, fsync, rename, previous kept as `.bak`).
    pub fn persist(&self) -> Result<(), StoreError> {
        let _writer = self.persist_lock.lock();
        let file = OffsetFile {
            offset_table: self
                .table
                .read()
                .iter()
                .map(|(k, queues)| {
                    (
                        k.clone(),
                        queues.iter().map(|(q, o)| (*q, *o as i64)).collect(),
                    )
                })
                .collect(),
        };
        write_json_atomically(&self.path, &file)
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
    fn quotes_only_bare_integer_keys() {
        assert_eq!(
            quote_integer_keys(r#"{"offsetTable":{"T@g":{0:250, 12 :7},"a{1:2}":[1,2]}}"#),
            r#"{"offsetTable":{"T@g":{"0":250, "12" :7},"a{1:2}":[1,2]}}"#
        );
    }
}
