//! Subscription group configs, persisted in `config/subscriptionGroup.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::error::BrokerError;
use crate::persist;

/// One group's settings, in RocketMQ's SubscriptionGroupConfig JSON form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionGroupConfig {
    pub group_name: String,
    pub consume_enable: bool,
    pub consume_from_min_enable: bool,
    pub consume_broadcast_enable: bool,
    pub retry_queue_nums: u32,
    pub retry_max_times: i32,
    pub broker_id: u64,
    pub which_broker_when_consume_slowly: u64,
    pub notify_consumer_ids_changed_enable: bool,
}

impl Default for SubscriptionGroupConfig {
    fn default() -> Self {
        SubscriptionGroupConfig {
            group_name: String::new(),
            consume_enable: true,
            consume_from_min_enable: true,
            consume_broadcast_enable: true,
            retry_queue_nums: 1,
            retry_max_times: 16,
            broker_id: 0,
            which_broker_when_consume_slowly: 1,
            notify_consumer_ids_changed_enable: true,
        }
    }
}

#[derive(Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct GroupsFile {
    subscription_group_table: BTreeMap<String, SubscriptionGroupConfig>,
}

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
        let file: GroupsFile = persist::read_json(&path)?.unwrap_or_default();
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
            .or_insert_with(|| SubscriptionGroupConfig {
                group_name: group.to_string(),
                retry_max_times: self.default_max_reconsume_times,
                ..SubscriptionGroupConfig::default()
            })
            .clone()
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

    /// The admin listing body (GET_ALL_SUBSCRIPTIONGROUP_CONFIG), RocketMQ wrapper form.
    pub fn wrapper_json(&self) -> serde_json::Value {
        serde_json::json!({
            "subscriptionGroupTable": self.all(),
            "dataVersion": { "timestamp": 0, "counter": 0 },
        })
    }

    pub fn persist(&self) -> Result<(), BrokerError> {
        let _writer = self.persist_lock.lock();
        let file = GroupsFile {
            subscription_group_table: self.all(),
        };
        persist::write_json(&self.path, &file)
    }
}
