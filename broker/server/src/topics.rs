//! Topic configs: created by UPDATE_AND_CREATE_TOPIC, on first use, or from the file;
//! persisted in `config/topics.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::BrokerError;
use crate::persist;
use parking_lot::RwLock;

/// Topics every broker has: the auto-create template and the delay-level schedule.
pub const DEFAULT_TOPIC: &str = "TBW102";
pub const SCHEDULE_TOPIC: &str = "SCHEDULE_TOPIC_XXXX";
pub const RETRY_PREFIX: &str = "%RETRY%";
pub const DLQ_PREFIX: &str = "%DLQ%";
/// Topic names at most this long (RocketMQ rule).
pub const MAX_TOPIC_NAME_CHARS: usize = 127;

/// Why a topic name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopicNameError {
    #[error("topic name is empty")]
    Empty,
    #[error("topic name `{name}` is longer than 127 characters")]
    TooLong { name: String },
    #[error("topic name `{name}` has characters outside [%|a-zA-Z0-9_-]")]
    BadCharacters { name: String },
}

/// The internal topic of the state log (`crate::state_log`): never in routes or topic lists
/// (it has no topic config), named like Apache's own system topics.
pub const STATE_TOPIC: &str = "rmq_sys_quiver_state";
pub const STATE_QUEUE: u32 = 0;

/// RocketMQ rules: `^[%|a-zA-Z0-9_-]+$`, at most 127 chars.
pub fn validate_topic_name(name: &str) -> Result<(), TopicNameError> {
    if name.is_empty() {
        return Err(TopicNameError::Empty);
    }
    if name.len() > MAX_TOPIC_NAME_CHARS {
        return Err(TopicNameError::TooLong { name: name.into() });
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '%' | '|' | '_' | '-'))
    {
        return Err(TopicNameError::BadCharacters { name: name.into() });
    }
    Ok(())
}

/// One topic's settings: quiver-protocol's TopicConfig, the form RocketMQ peers and files use.
pub use quiver_protocol::body::TopicConfig;
use quiver_protocol::body::TopicConfigSerializeWrapper;

/// A read-write topic with `queues` read and write queues.
pub fn new_topic_config(name: &str, queues: u32) -> TopicConfig {
    TopicConfig {
        topic_name: name.into(),
        read_queue_nums: queues,
        write_queue_nums: queues,
        ..TopicConfig::default()
    }
}

/// All topics of this broker.
pub struct TopicManager {
    path: PathBuf,
    topics: RwLock<BTreeMap<String, TopicConfig>>,
    /// Serialises writers: the periodic persist and admin requests share one temp file.
    persist_lock: parking_lot::Mutex<()>,
}

impl TopicManager {
    /// Loads `config/topics.json` (or its .bak) under `data_dir` and adds the system topics.
    pub fn load(data_dir: &std::path::Path) -> Result<TopicManager, BrokerError> {
        let path = data_dir.join("config").join("topics.json");
        let file: TopicConfigSerializeWrapper = persist::read_json(&path)?.unwrap_or_default();
        let mut topics = file.topic_config_table;
        topics
            .entry(DEFAULT_TOPIC.into())
            .or_insert_with(|| new_topic_config(DEFAULT_TOPIC, 8));
        topics.entry(SCHEDULE_TOPIC.into()).or_insert_with(|| {
            new_topic_config(
                SCHEDULE_TOPIC,
                crate::schedule::DELAY_LEVELS_MS.len() as u32,
            )
        });
        Ok(TopicManager {
            path,
            topics: RwLock::new(topics),
            persist_lock: parking_lot::Mutex::new(()),
        })
    }

    pub fn get(&self, name: &str) -> Option<TopicConfig> {
        self.topics.read().get(name).cloned()
    }

    pub fn all(&self) -> Vec<TopicConfig> {
        self.topics.read().values().cloned().collect()
    }

    /// Creates or replaces a topic; returns the previous config.
    pub fn upsert(&self, config: TopicConfig) -> Option<TopicConfig> {
        self.topics
            .write()
            .insert(config.topic_name.clone(), config)
    }

    /// Returns the topic, creating it with `queues` queues when missing.
    pub fn get_or_create(&self, name: &str, queues: u32) -> (TopicConfig, bool) {
        if let Some(existing) = self.get(name) {
            return (existing, false);
        }
        let mut topics = self.topics.write();
        let mut created = false;
        let config = topics
            .entry(name.to_string())
            .or_insert_with(|| {
                created = true;
                new_topic_config(name, queues)
            })
            .clone();
        (config, created)
    }

    pub fn remove(&self, name: &str) -> Option<TopicConfig> {
        self.topics.write().remove(name)
    }

    /// The table in RocketMQ's wrapper form: the GET_ALL_TOPIC_CONFIG body and the file.
    pub fn wrapper(&self) -> TopicConfigSerializeWrapper {
        TopicConfigSerializeWrapper {
            topic_config_table: self.topics.read().clone(),
            ..TopicConfigSerializeWrapper::default()
        }
    }

    /// Writes the table atomically.
    pub fn persist(&self) -> Result<(), BrokerError> {
        let _writer = self.persist_lock.lock();
        persist::write_json(&self.path, &self.wrapper())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names_follow_rocketmq_rules() {
        assert!(validate_topic_name("Orders_1-%RETRY%|x").is_ok());
        assert_eq!(validate_topic_name(""), Err(TopicNameError::Empty));
        assert!(matches!(
            validate_topic_name("a b"),
            Err(TopicNameError::BadCharacters { .. })
        ));
        assert!(matches!(
            validate_topic_name(&"a".repeat(128)),
            Err(TopicNameError::TooLong { .. })
        ));
        assert!(validate_topic_name(&"a".repeat(127)).is_ok());
    }
}
