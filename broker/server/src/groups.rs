//! Subscription group configs, persisted in `config/subscriptionGroup.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::error::BrokerError;
use crate::persist;
use parking_lot::RwLock;

/// One group's settings: quiver-protocol's SubscriptionGroupConfig, RocketMQ's JSON form.
pub use quiver_protocol::body::SubscriptionGroupConfig;
use quiver_protocol::body::SubscriptionGroupWrapper;

/// All subscription groups known to this broker (created explicitly or on first heartbeat).
pub struct GroupManager {
    path: PathBuf,
    default_max_reconsume_times: i32,
    groups: RwLock<BTreeMap<String, SubscriptionGroupConfig>>,
    /// Serialises writers: the periodic persist and admin requests share one temp file.
    persist_lock: parking_lot::Mutex<()>,
}

impl GroupManager {
    pub fn load(
        data_dir: &std::path::Path,
        default_max_reconsume_times: i32,
    ) -> Result<GroupManager, BrokerError> {
        let path = data_dir.join("config").join("subscriptionGroup.json");
        let file: SubscriptionGroupWrapper = persist::read_json(&path)?.unwrap_or_default();
        Ok(GroupManager {
            path,
            default_max_reconsume_times,
            groups: RwLock::new(file.subscription_group_table),
            persist_lock: parking_lot::Mutex::new(()),
        })
    }

    pub fn get(&self, group: &str) -> Option<SubscriptionGroupConfig> {
        self.groups.read().get(group).cloned()
    }

    /// The group's config, created with defaults when missing (auto-create on heartbeat).
    pub fn get_or_create(&self, group: &str) -> SubscriptionGroupConfig {
        if let Some(existing) = self.get(group) {
            return existing;
        }
        self.groups
            .write()
            .entry(group.to_string())
            .or_insert_with(|| self.defaults_for(group))
            .clone()
    }

    /// The group's config, or the one it would be created with, without creating it (a
    /// replica's copy of a new group may not have arrived yet).
    pub fn get_or_default(&self, group: &str) -> SubscriptionGroupConfig {
        self.get(group).unwrap_or_else(|| self.defaults_for(group))
    }

    fn defaults_for(&self, group: &str) -> SubscriptionGroupConfig {
        SubscriptionGroupConfig {
            group_name: group.to_string(),
            retry_max_times: self.default_max_reconsume_times,
            ..SubscriptionGroupConfig::default()
        }
    }

    pub fn upsert(&self, config: SubscriptionGroupConfig) {
        self.groups
            .write()
            .insert(config.group_name.clone(), config);
    }

    pub fn remove(&self, group: &str) -> Option<SubscriptionGroupConfig> {
        self.groups.write().remove(group)
    }

    pub fn all(&self) -> BTreeMap<String, SubscriptionGroupConfig> {
        self.groups.read().clone()
    }

    /// The groups in RocketMQ's wrapper form: the GET_ALL_SUBSCRIPTIONGROUP_CONFIG body and the file.
    pub fn wrapper(&self) -> SubscriptionGroupWrapper {
        SubscriptionGroupWrapper {
            subscription_group_table: self.all(),
            ..SubscriptionGroupWrapper::default()
        }
    }

    pub fn persist(&self) -> Result<(), BrokerError> {
        let _writer = self.persist_lock.lock();
        persist::write_json(&self.path, &self.wrapper())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_group_reads_as_its_defaults_without_being_created() {
        let dir = tempfile::tempdir().unwrap();
        let groups = GroupManager::load(dir.path(), 7).unwrap();
        let config = groups.get_or_default("new");
        assert_eq!(config.group_name, "new");
        assert_eq!(config.retry_max_times, 7);
        assert!(groups.get("new").is_none());
        assert_eq!(groups.get_or_create("new"), config);
        assert!(groups.get("new").is_some());
    }
}
