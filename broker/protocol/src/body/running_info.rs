//! GET_CONSUMER_RUNNING_INFO (307) answer: Apache's `ConsumerRunningInfo`, as `mqadmin
//! consumerStatus` and the dashboard read it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{lenient, message_queue_map, MessageQueue, SubscriptionData};

/// Keys of `ConsumerRunningInfo.properties` (Apache's constants).
pub mod prop {
    pub const NAMESERVER_ADDR: &str = "PROP_NAMESERVER_ADDR";
    pub const THREADPOOL_CORE_SIZE: &str = "PROP_THREADPOOL_CORE_SIZE";
    pub const CONSUME_ORDERLY: &str = "PROP_CONSUMEORDERLY";
    pub const CONSUME_TYPE: &str = "PROP_CONSUME_TYPE";
    pub const CLIENT_VERSION: &str = "PROP_CLIENT_VERSION";
}

/// One assigned queue of a consumer: where it committed and what it holds.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessQueueInfo {
    #[serde(deserialize_with = "lenient::i64")]
    pub commit_offset: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub cached_msg_min_offset: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub cached_msg_max_offset: i64,
    #[serde(deserialize_with = "lenient::i32")]
    pub cached_msg_count: i32,
    #[serde(deserialize_with = "lenient::i32")]
    pub cached_msg_size_in_mi_b: i32,
    #[serde(deserialize_with = "lenient::bool")]
    pub locked: bool,
    /// Apache's spelling.
    #[serde(deserialize_with = "lenient::bool")]
    pub droped: bool,
}

/// GET_CONSUMER_RUNNING_INFO (307) response body.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerRunningInfo {
    #[serde(deserialize_with = "lenient::or_default")]
    pub properties: BTreeMap<String, String>,
    #[serde(deserialize_with = "lenient::or_default")]
    pub subscription_set: Vec<SubscriptionData>,
    #[serde(with = "message_queue_map")]
    pub mq_table: BTreeMap<MessageQueue, ProcessQueueInfo>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jstack: Option<String>,
}
