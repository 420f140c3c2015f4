//! JSON bodies exactly as RocketMQ 4.x peers read and write them (Java fastjson, C++ jsoncpp).
//!
//! Every body type has `decode(&[u8])`, which accepts standard JSON, the fastjson form
//! (object and unquoted integer keys), numbers as strings, enums as names or ordinals, nulls
//! and unknown keys; and `encode()`, which writes what Java peers read (MessageQueue-keyed maps
//! in fastjson form, everything else standard JSON with camelCase keys).

pub mod fastjson;
pub mod lenient;
mod replication;
mod running_info;

pub use replication::{ReplicaRole, ReplicaStatus, ReplicationMembers, ReplicationStatus};
pub use running_info::{prop as running_info_prop, ConsumerRunningInfo, ProcessQueueInfo};

use std::collections::{BTreeMap, BTreeSet, HashMap};

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::BodyError;
use fastjson::IntegerKeys;
use lenient::java_enum;

/// Decodes any body type from standard or fastjson-style JSON.
pub fn decode_json<T: DeserializeOwned>(body: &[u8], what: &'static str) -> Result<T, BodyError> {
    let text = std::str::from_utf8(body).map_err(|source| BodyError::Utf8 { what, source })?;
    let standard = fastjson::normalize(text)?;
    serde_json::from_str(&standard).map_err(|source| BodyError::Json { what, source })
}

/// Encodes a body: MessageQueue-keyed maps in fastjson form, the rest standard JSON.
pub fn encode_json<T: Serialize>(
    value: &T,
    integer_keys: IntegerKeys,
    what: &'static str,
) -> Result<Bytes, BodyError> {
    let tree = serde_json::to_value(value).map_err(|source| BodyError::Json { what, source })?;
    Ok(Bytes::from(fastjson::write(&tree, integer_keys)))
}

macro_rules! json_body {
    ($($name:ident),* $(,)?) => {$(
        impl $name {
            /// Reads the body from standard or fastjson-style JSON.
            pub fn decode(body: &[u8]) -> Result<Self, BodyError> {
                decode_json(body, stringify!($name))
            }

            /// Writes the body as RocketMQ peers expect it.
            pub fn encode(&self) -> Bytes {
                // Cannot fail: these types only have string and integer map keys.
                encode_json(self, IntegerKeys::Quoted, stringify!($name)).unwrap_or_default()
            }
        }
    )*};
}

java_enum! {
    /// How a consumer fetches: pull (ACTIVELY) or push (PASSIVELY).
    pub enum ConsumeType {
        ConsumeActively = 0 => "CONSUME_ACTIVELY",
        ConsumePassively = 1 => "CONSUME_PASSIVELY",
        /// RocketMQ 5.x POP consumers (gRPC ReceiveMessage).
        ConsumePop = 2 => "CONSUME_POP",
    }
    default ConsumePassively
}

java_enum! {
    /// Each message to one member of the group (clustering) or to all (broadcasting).
    pub enum MessageModel {
        Broadcasting = 0 => "BROADCASTING",
        Clustering = 1 => "CLUSTERING",
    }
    default Clustering
}

java_enum! {
    /// Where a group with no committed offset starts (Java ordinals, deprecated ones kept).
    pub enum ConsumeFromWhere {
        LastOffset = 0 => "CONSUME_FROM_LAST_OFFSET",
        LastOffsetAndFromMinWhenBootFirst = 1 => "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
        MinOffset = 2 => "CONSUME_FROM_MIN_OFFSET",
        MaxOffset = 3 => "CONSUME_FROM_MAX_OFFSET",
        FirstOffset = 4 => "CONSUME_FROM_FIRST_OFFSET",
        Timestamp = 5 => "CONSUME_FROM_TIMESTAMP",
    }
    default LastOffset
}

/// One queue of a topic on a broker. Field order is fastjson's (alphabetical), so the JSON
/// text of a key is byte-identical to what Java writes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MessageQueue {
    #[serde(deserialize_with = "lenient::string")]
    pub broker_name: String,
    #[serde(deserialize_with = "lenient::u32")]
    pub queue_id: u32,
    #[serde(deserialize_with = "lenient::string")]
    pub topic: String,
}

impl MessageQueue {
    pub fn new(topic: impl Into<String>, broker_name: impl Into<String>, queue_id: u32) -> Self {
        MessageQueue {
            broker_name: broker_name.into(),
            queue_id,
            topic: topic.into(),
        }
    }
}

impl std::fmt::Display for MessageQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}#{}", self.topic, self.broker_name, self.queue_id)
    }
}

/// serde for `BTreeMap<MessageQueue, V>`: keys are the MessageQueue's JSON text, which
/// [`fastjson::write`] emits as raw object keys and [`fastjson::normalize`] reads back.
pub mod message_queue_map {
    use super::*;
    use serde::de::Error as _;
    use serde::ser::Error as _;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S, V>(
        map: &BTreeMap<MessageQueue, V>,
        serializer: S,
    ) -> Result<S::Ok, S::Error>
    where
        S: Serializer,
        V: Serialize,
    {
        let mut keyed = BTreeMap::new();
        for (queue, value) in map {
            let key = serde_json::to_string(queue).map_err(S::Error::custom)?;
            keyed.insert(key, value);
        }
        keyed.serialize(serializer)
    }

    pub fn deserialize<'de, D, V>(deserializer: D) -> Result<BTreeMap<MessageQueue, V>, D::Error>
    where
        D: Deserializer<'de>,
        V: DeserializeOwned,
    {
        let keyed: Option<BTreeMap<String, V>> = Option::deserialize(deserializer)?;
        keyed
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| {
                serde_json::from_str::<MessageQueue>(&key)
                    .map(|queue| (queue, value))
                    .map_err(|error| {
                        D::Error::custom(format!("bad MessageQueue key {key}: {error}"))
                    })
            })
            .collect()
    }
}

/// A topic subscription inside a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionData {
    #[serde(deserialize_with = "lenient::bool")]
    pub class_filter_mode: bool,
    #[serde(deserialize_with = "lenient::string")]
    pub topic: String,
    /// The expression as written: `*`, `TagA || TagB`, or SQL92.
    #[serde(deserialize_with = "lenient::string")]
    pub sub_string: String,
    #[serde(deserialize_with = "lenient::string_list")]
    pub tags_set: Vec<String>,
    /// Java `String.hashCode()` of each tag.
    #[serde(deserialize_with = "lenient::i32_list")]
    pub code_set: Vec<i32>,
    #[serde(deserialize_with = "lenient::i64")]
    pub sub_version: i64,
    /// "TAG" when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expression_type: Option<String>,
}

/// A producer group announced in a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProducerData {
    #[serde(deserialize_with = "lenient::string")]
    pub group_name: String,
}

/// A consumer group announced in a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerData {
    #[serde(deserialize_with = "lenient::string")]
    pub group_name: String,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
    #[serde(deserialize_with = "lenient::or_default")]
    pub subscription_data_set: Vec<SubscriptionData>,
    #[serde(deserialize_with = "lenient::bool")]
    pub unit_mode: bool,
}

/// HEART_BEAT (34) body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HeartbeatData {
    #[serde(rename = "clientID", deserialize_with = "lenient::string")]
    pub client_id: String,
    #[serde(deserialize_with = "lenient::or_default")]
    pub producer_data_set: Vec<ProducerData>,
    #[serde(deserialize_with = "lenient::or_default")]
    pub consumer_data_set: Vec<ConsumerData>,
}

/// Topic permission bits (QueueData.perm, brokerPermission).
pub mod perm {
    pub const INHERIT: i32 = 1;
    pub const WRITE: i32 = 1 << 1;
    pub const READ: i32 = 1 << 2;
    /// 6: the normal state.
    pub const READ_WRITE: i32 = READ | WRITE;
    /// 4: a broker being drained keeps serving pulls but takes no sends.
    pub const READ_ONLY: i32 = READ;
    /// 2: takes sends, serves no pulls.
    pub const WRITE_ONLY: i32 = WRITE;

    /// The values a whole broker's brokerPermission may take.
    pub fn is_broker_permission(perm: i32) -> bool {
        matches!(perm, READ_WRITE | READ_ONLY | WRITE_ONLY)
    }

    pub fn is_readable(perm: i32) -> bool {
        perm & READ != 0
    }
    pub fn is_writeable(perm: i32) -> bool {
        perm & WRITE != 0
    }
}

/// One broker's queues of a topic in a route.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct QueueData {
    #[serde(deserialize_with = "lenient::string")]
    pub broker_name: String,
    #[serde(deserialize_with = "lenient::u32")]
    pub read_queue_nums: u32,
    #[serde(deserialize_with = "lenient::u32")]
    pub write_queue_nums: u32,
    #[serde(deserialize_with = "lenient::i32")]
    pub perm: i32,
    /// Older peers spell it "topicSynFlag".
    #[serde(alias = "topicSynFlag", deserialize_with = "lenient::i32")]
    pub topic_sys_flag: i32,
}

/// One broker (name, cluster, addresses by broker id; 0 is the master).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BrokerData {
    #[serde(deserialize_with = "lenient::string")]
    pub cluster: String,
    #[serde(deserialize_with = "lenient::string")]
    pub broker_name: String,
    /// Broker id -> "host:port"; written with quoted keys ("0"), which jsoncpp requires.
    #[serde(deserialize_with = "lenient::or_default")]
    pub broker_addrs: BTreeMap<i64, String>,
    #[serde(deserialize_with = "lenient::bool")]
    pub enable_acting_master: bool,
}

/// The master broker id in `BrokerData::broker_addrs`.
pub const MASTER_BROKER_ID: i64 = 0;

impl BrokerData {
    /// The master's address, if listed.
    pub fn master_addr(&self) -> Option<&str> {
        self.broker_addrs.get(&MASTER_BROKER_ID).map(String::as_str)
    }
}

/// GET_ROUTEINFO_BY_TOPIC (105) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicRouteData {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order_topic_conf: Option<String>,
    #[serde(deserialize_with = "lenient::or_default")]
    pub queue_datas: Vec<QueueData>,
    #[serde(deserialize_with = "lenient::or_default")]
    pub broker_datas: Vec<BrokerData>,
    #[serde(deserialize_with = "lenient::or_default")]
    pub filter_server_table: HashMap<String, Vec<String>>,
}

/// GET_BROKER_CLUSTER_INFO (106) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ClusterInfo {
    /// Broker name -> broker.
    #[serde(deserialize_with = "lenient::or_default")]
    pub broker_addr_table: BTreeMap<String, BrokerData>,
    /// Cluster name -> broker names.
    #[serde(deserialize_with = "lenient::or_default")]
    pub cluster_addr_table: BTreeMap<String, BTreeSet<String>>,
}

/// GET_CONSUMER_LIST_BY_GROUP (38) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GetConsumerListByGroupResponseBody {
    #[serde(deserialize_with = "lenient::string_list")]
    pub consumer_id_list: Vec<String>,
}

/// Per queue of GET_CONSUME_STATS: the broker's max offset, the group's committed offset,
/// and the store time of the last consumed message.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OffsetWrapper {
    #[serde(deserialize_with = "lenient::i64")]
    pub broker_offset: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub consumer_offset: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub last_timestamp: i64,
}

/// GET_CONSUME_STATS (208) response body.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumeStats {
    #[serde(with = "message_queue_map")]
    pub offset_table: BTreeMap<MessageQueue, OffsetWrapper>,
    #[serde(deserialize_with = "lenient::f64")]
    pub consume_tps: f64,
}

impl ConsumeStats {
    /// Sum over queues of `max(0, broker_offset - consumer_offset)`.
    pub fn total_diff(&self) -> i64 {
        self.offset_table
            .values()
            .map(|wrapper| (wrapper.broker_offset - wrapper.consumer_offset).max(0))
            .sum()
    }
}

/// Per queue of GET_TOPIC_STATS_INFO.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicOffset {
    #[serde(deserialize_with = "lenient::i64")]
    pub min_offset: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub max_offset: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub last_update_timestamp: i64,
}

/// GET_TOPIC_STATS_INFO (202) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicStatsTable {
    #[serde(with = "message_queue_map")]
    pub offset_table: BTreeMap<MessageQueue, TopicOffset>,
}

/// One live client connection of a group.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Connection {
    #[serde(deserialize_with = "lenient::string")]
    pub client_id: String,
    #[serde(deserialize_with = "lenient::string")]
    pub client_addr: String,
    /// "JAVA", "CPP", ...
    #[serde(deserialize_with = "lenient::string")]
    pub language: String,
    #[serde(deserialize_with = "lenient::i32")]
    pub version: i32,
}

/// GET_CONSUMER_CONNECTION_LIST (203) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ConsumerConnection {
    #[serde(deserialize_with = "lenient::or_default")]
    pub connection_set: Vec<Connection>,
    /// Topic -> subscription.
    #[serde(deserialize_with = "lenient::or_default")]
    pub subscription_table: BTreeMap<String, SubscriptionData>,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
}

/// GET_PRODUCER_CONNECTION_LIST (204) response body: Apache's `ProducerConnection`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProducerConnection {
    #[serde(deserialize_with = "lenient::or_default")]
    pub connection_set: Vec<Connection>,
}

/// LOCK_BATCH_MQ (41) / UNLOCK_BATCH_MQ (42) request body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LockBatchRequestBody {
    #[serde(deserialize_with = "lenient::string")]
    pub consumer_group: String,
    #[serde(deserialize_with = "lenient::string")]
    pub client_id: String,
    #[serde(deserialize_with = "lenient::or_default")]
    pub mq_set: Vec<MessageQueue>,
    #[serde(deserialize_with = "lenient::bool")]
    pub only_this_broker: bool,
}

/// UNLOCK_BATCH_MQ (42) carries the same fields as a lock request.
pub type UnlockBatchRequestBody = LockBatchRequestBody;

/// LOCK_BATCH_MQ response body: the queues now locked by the requester.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LockBatchResponseBody {
    #[serde(rename = "lockOKMQSet", deserialize_with = "lenient::or_default")]
    pub lock_ok_mq_set: Vec<MessageQueue>,
}

/// RESET_CONSUMER_CLIENT_OFFSET (220) body: the offset each queue resumes from.
///
/// Java clients read the fastjson map (`encode`); the C++ client reads
/// `{"offsetTable":[{"brokerName","queueId","topic","offset"},..]}` instead
/// ([`ResetOffsetBody::encode_for_language`]). `decode` accepts both.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ResetOffsetBody {
    #[serde(
        serialize_with = "message_queue_map::serialize",
        deserialize_with = "reset_offset_table"
    )]
    pub offset_table: BTreeMap<MessageQueue, i64>,
}

/// One entry of the C++ client's reset body.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CppResetEntry<'a> {
    broker_name: &'a str,
    queue_id: u32,
    topic: &'a str,
    offset: i64,
}

impl ResetOffsetBody {
    /// The form the client of this language reads: an array for "CPP", fastjson otherwise.
    pub fn encode_for_language(&self, language: &str) -> Bytes {
        if !language.eq_ignore_ascii_case("CPP") {
            return self.encode();
        }
        let entries: Vec<CppResetEntry<'_>> = self
            .offset_table
            .iter()
            .map(|(queue, &offset)| CppResetEntry {
                broker_name: &queue.broker_name,
                queue_id: queue.queue_id,
                topic: &queue.topic,
                offset,
            })
            .collect();
        let body = serde_json::json!({ "offsetTable": entries });
        Bytes::from(body.to_string())
    }
}

/// The reset table as a MessageQueue-keyed map or as the C++ client's array of entries.
fn reset_offset_table<'de, D>(deserializer: D) -> Result<BTreeMap<MessageQueue, i64>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error as _;
    use serde::de::IntoDeserializer as _;

    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Entry {
        #[serde(flatten)]
        queue: MessageQueue,
        #[serde(deserialize_with = "lenient::i64")]
        offset: i64,
    }

    let value = serde_json::Value::deserialize(deserializer)?;
    match value {
        serde_json::Value::Null => Ok(BTreeMap::new()),
        serde_json::Value::Array(items) => items
            .into_iter()
            .map(|item| {
                Entry::deserialize(item)
                    .map(|entry| (entry.queue, entry.offset))
                    .map_err(D::Error::custom)
            })
            .collect(),
        map @ serde_json::Value::Object(_) => {
            message_queue_map::deserialize(map.into_deserializer()).map_err(D::Error::custom)
        }
        other => Err(D::Error::custom(format!(
            "offsetTable is neither a map nor a list: {other}"
        ))),
    }
}

/// A subscription group's broker-side settings (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP body).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionGroupConfig {
    #[serde(deserialize_with = "lenient::string")]
    pub group_name: String,
    #[serde(deserialize_with = "lenient::bool")]
    pub consume_enable: bool,
    #[serde(deserialize_with = "lenient::bool")]
    pub consume_from_min_enable: bool,
    #[serde(deserialize_with = "lenient::bool")]
    pub consume_broadcast_enable: bool,
    #[serde(deserialize_with = "lenient::i32")]
    pub retry_queue_nums: i32,
    /// Deliveries before a message goes to `%DLQ%<group>`; 16 by default.
    #[serde(deserialize_with = "lenient::i32")]
    pub retry_max_times: i32,
    #[serde(deserialize_with = "lenient::i64")]
    pub broker_id: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub which_broker_when_consume_slowly: i64,
    #[serde(deserialize_with = "lenient::bool")]
    pub notify_consumer_ids_changed_enable: bool,
    /// FIFO consumption for 5.x clients (POP): a queue's messages go out one batch at a time,
    /// in order, redelivered in place until acked.
    #[serde(deserialize_with = "lenient::bool")]
    pub consume_message_orderly: bool,
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
            consume_message_orderly: false,
        }
    }
}

impl SubscriptionGroupConfig {
    /// The defaults RocketMQ applies to an auto-created group.
    pub fn named(group_name: impl Into<String>) -> Self {
        SubscriptionGroupConfig {
            group_name: group_name.into(),
            ..Default::default()
        }
    }
}

/// RocketMQ's config version stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DataVersion {
    #[serde(deserialize_with = "lenient::i64")]
    pub timestamp: i64,
    #[serde(deserialize_with = "lenient::i64")]
    pub counter: i64,
}

/// GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SubscriptionGroupWrapper {
    #[serde(deserialize_with = "lenient::or_default")]
    pub subscription_group_table: BTreeMap<String, SubscriptionGroupConfig>,
    pub data_version: DataVersion,
}

/// A topic's broker-side settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicConfig {
    #[serde(deserialize_with = "lenient::string")]
    pub topic_name: String,
    #[serde(deserialize_with = "lenient::u32")]
    pub read_queue_nums: u32,
    #[serde(deserialize_with = "lenient::u32")]
    pub write_queue_nums: u32,
    #[serde(deserialize_with = "lenient::i32")]
    pub perm: i32,
    /// "SINGLE_TAG" or "MULTI_TAG".
    #[serde(deserialize_with = "lenient::string")]
    pub topic_filter_type: String,
    #[serde(deserialize_with = "lenient::i32")]
    pub topic_sys_flag: i32,
    #[serde(deserialize_with = "lenient::bool")]
    pub order: bool,
}

impl Default for TopicConfig {
    fn default() -> Self {
        TopicConfig {
            topic_name: String::new(),
            read_queue_nums: 16,
            write_queue_nums: 16,
            perm: perm::READ_WRITE,
            topic_filter_type: "SINGLE_TAG".to_owned(),
            topic_sys_flag: 0,
            order: false,
        }
    }
}

/// GET_ALL_TOPIC_CONFIG (21) response body, also the admin's topic dump.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicConfigSerializeWrapper {
    #[serde(deserialize_with = "lenient::or_default")]
    pub topic_config_table: BTreeMap<String, TopicConfig>,
    pub data_version: DataVersion,
}

/// GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206) and similar topic listings.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TopicList {
    #[serde(deserialize_with = "lenient::string_list")]
    pub topic_list: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub broker_addr: Option<String>,
}

/// QUERY_TOPIC_CONSUME_BY_WHO (300) response body.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GroupList {
    #[serde(deserialize_with = "lenient::string_list")]
    pub group_list: Vec<String>,
}

/// GET_BROKER_RUNTIME_INFO (28) response body: Apache's `KVTable`, string keys to string
/// values (`commitLogDiskRatio`, `commitLogDirCapacity`, ...), as `mqadmin brokerStatus` reads.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KvTable {
    pub table: BTreeMap<String, String>,
}

/// CHECK_CLIENT_CONFIG (46) request body: a subscription the broker is asked to validate.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CheckClientRequestBody {
    #[serde(deserialize_with = "lenient::string")]
    pub client_id: String,
    #[serde(deserialize_with = "lenient::string")]
    pub group: String,
    pub subscription_data: SubscriptionData,
}

json_body!(
    KvTable,
    GroupList,
    CheckClientRequestBody,
    HeartbeatData,
    TopicRouteData,
    ClusterInfo,
    GetConsumerListByGroupResponseBody,
    ConsumeStats,
    TopicStatsTable,
    ConsumerConnection,
    ProducerConnection,
    ConsumerRunningInfo,
    LockBatchRequestBody,
    LockBatchResponseBody,
    ResetOffsetBody,
    SubscriptionGroupConfig,
    SubscriptionGroupWrapper,
    TopicConfig,
    TopicConfigSerializeWrapper,
    TopicList,
    ReplicationStatus,
);

/// UPDATE_BROKER_CONFIG / GET_BROKER_CONFIG bodies: Java `Properties` text, `key=value` lines.
pub fn encode_properties_text(properties: &BTreeMap<String, String>) -> Bytes {
    let mut text = String::new();
    for (key, value) in properties {
        text.push_str(key);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    Bytes::from(text)
}

/// Reads `key=value` lines (also `key:value`); blank lines and `#`/`!` comments are skipped.
pub fn decode_properties_text(body: &[u8]) -> Result<BTreeMap<String, String>, BodyError> {
    let text = std::str::from_utf8(body).map_err(|source| BodyError::Utf8 {
        what: "broker config properties",
        source,
    })?;
    let mut properties = BTreeMap::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let split_at = line.find(['=', ':']).ok_or_else(|| BodyError::Shape {
            what: "broker config properties",
            reason: format!("line without '=': {line}"),
        })?;
        let (key, value) = line.split_at(split_at);
        properties.insert(key.trim().to_owned(), value[1..].trim().to_owned());
    }
    Ok(properties)
}

#[cfg(test)]
mod tests;
