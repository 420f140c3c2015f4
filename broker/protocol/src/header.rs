//! Typed per-code headers, read from and written to a command's extFields.
//!
//! Every header has `from_ext(&ExtFields) -> Result<Self, HeaderError>` and `to_ext()`. Values
//! are parsed leniently: surrounding whitespace is ignored, booleans accept `true`/`false` and
//! `1`/`0` (the C++ client sends `"batch":"0"`), and an empty string counts as absent for
//! optional text. Unknown keys (signatures, `AccessKey`, `OnsChannel`, ...) are ignored.

use crate::error::HeaderError;
use crate::{ExtFields, RemotingCommand};

/// A value type that can travel in extFields.
pub trait ExtValue: Sized {
    fn parse_ext(field: &'static str, raw: &str) -> Result<Self, HeaderError>;
    fn render_ext(&self) -> String;
}

macro_rules! numeric_ext_value {
    ($($ty:ty),*) => {$(
        impl ExtValue for $ty {
            fn parse_ext(field: &'static str, raw: &str) -> Result<Self, HeaderError> {
                raw.trim().parse().map_err(|_| HeaderError::Invalid { field, value: raw.to_owned() })
            }
            fn render_ext(&self) -> String {
                self.to_string()
            }
        }
    )*};
}
numeric_ext_value!(i32, i64, u32, u64);

impl ExtValue for bool {
    fn parse_ext(field: &'static str, raw: &str) -> Result<Self, HeaderError> {
        match raw.trim() {
            value if value.eq_ignore_ascii_case("true") || value == "1" => Ok(true),
            value if value.eq_ignore_ascii_case("false") || value == "0" => Ok(false),
            _ => Err(HeaderError::Invalid {
                field,
                value: raw.to_owned(),
            }),
        }
    }
    fn render_ext(&self) -> String {
        self.to_string()
    }
}

impl ExtValue for String {
    fn parse_ext(_field: &'static str, raw: &str) -> Result<Self, HeaderError> {
        Ok(raw.to_owned())
    }
    fn render_ext(&self) -> String {
        self.clone()
    }
}

/// Reads a required field.
pub fn required<T: ExtValue>(ext: &ExtFields, field: &'static str) -> Result<T, HeaderError> {
    required_at(ext, field, field)
}

/// Reads a required field stored under `key` (V2's short names); errors name `field`.
fn required_at<T: ExtValue>(
    ext: &ExtFields,
    key: &str,
    field: &'static str,
) -> Result<T, HeaderError> {
    match ext.get(key) {
        Some(raw) => T::parse_ext(field, raw),
        None => Err(HeaderError::Missing { field }),
    }
}

/// Reads an optional field; absent, empty and "null" all read as `None`.
pub fn optional<T: ExtValue>(
    ext: &ExtFields,
    field: &'static str,
) -> Result<Option<T>, HeaderError> {
    optional_at(ext, field, field)
}

/// Reads an optional field stored under `key`; errors name `field`.
fn optional_at<T: ExtValue>(
    ext: &ExtFields,
    key: &str,
    field: &'static str,
) -> Result<Option<T>, HeaderError> {
    match ext.get(key) {
        None | Some("") | Some("null") => Ok(None),
        Some(raw) => T::parse_ext(field, raw).map(Some),
    }
}

/// How a field is read: `Required` fails when absent, `Optional` yields `Option<T>`.
/// Fields are read from and written under `key`; errors name the long `field` name.
trait FieldKind<T> {
    fn read(ext: &ExtFields, key: &str, field: &'static str) -> Result<T, HeaderError>;
    fn write(value: &T, key: &str, ext: &mut ExtFields);
}

struct Required;
struct Optional;

impl<T: ExtValue> FieldKind<T> for Required {
    fn read(ext: &ExtFields, key: &str, field: &'static str) -> Result<T, HeaderError> {
        required_at(ext, key, field)
    }
    fn write(value: &T, key: &str, ext: &mut ExtFields) {
        ext.push_distinct(key, &value.render_ext());
    }
}

impl<T: ExtValue> FieldKind<Option<T>> for Optional {
    fn read(ext: &ExtFields, key: &str, field: &'static str) -> Result<Option<T>, HeaderError> {
        optional_at(ext, key, field)
    }
    fn write(value: &Option<T>, key: &str, ext: &mut ExtFields) {
        if let Some(value) = value {
            ext.push_distinct(key, &value.render_ext());
        }
    }
}

/// Declares a header struct with `from_ext` / `to_ext`; each field names its wire key and
/// whether it is `req`uired or `opt`ional (then its type is `Option<_>`).
macro_rules! header {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$field_meta:meta])* $kind:ident $field:ident : $ty:ty = $wire:literal, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Default)]
        pub struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
        }

        impl $name {
            /// Reads the header from a request's extFields.
            pub fn from_ext(ext: &ExtFields) -> Result<Self, HeaderError> {
                Self::from_ext_keyed(ext, |field| field)
            }

            /// Reads the header with each field under `key(wire name)` (V2's short names);
            /// errors still name the wire name.
            pub fn from_ext_keyed(
                ext: &ExtFields,
                key: impl Fn(&'static str) -> &'static str,
            ) -> Result<Self, HeaderError> {
                Ok($name {
                    $( $field: <header!(@kind $kind) as FieldKind<$ty>>::read(ext, key($wire), $wire)?, )*
                })
            }

            /// The extFields carrying this header.
            pub fn to_ext(&self) -> ExtFields {
                self.to_ext_keyed(|field| field)
            }

            /// The extFields carrying this header, each field under `key(wire name)`.
            pub fn to_ext_keyed(&self, key: impl Fn(&'static str) -> &'static str) -> ExtFields {
                const FIELDS: usize = [$($wire),*].len();
                let mut ext = ExtFields::with_capacity(FIELDS);
                $( <header!(@kind $kind) as FieldKind<$ty>>::write(&self.$field, key($wire), &mut ext); )*
                ext
            }

            /// Reads the header from a command's extFields.
            pub fn from_command(command: &RemotingCommand) -> Result<Self, HeaderError> {
                Self::from_ext(&command.ext_fields)
            }
        }

        impl CommandHeader for $name {
            fn from_ext(ext: &ExtFields) -> Result<Self, HeaderError> {
                $name::from_ext(ext)
            }
            fn to_ext(&self) -> ExtFields {
                $name::to_ext(self)
            }
        }
    };
    (@kind req) => { Required };
    (@kind opt) => { Optional };
}

mod replication;
mod tools;
mod transaction;
pub use replication::*;
pub use tools::*;
pub use transaction::*;

/// Every typed header: generic code (tests, dispatch tables) can use this trait.
pub trait CommandHeader: Sized {
    fn from_ext(ext: &ExtFields) -> Result<Self, HeaderError>;
    fn to_ext(&self) -> ExtFields;
}

/// SEND_MESSAGE (10) long names, SEND_MESSAGE_V2 (310) / SEND_BATCH_MESSAGE (320) short names.
const SEND_V2_NAMES: [(&str, &str); 13] = [
    ("producerGroup", "a"),
    ("topic", "b"),
    ("defaultTopic", "c"),
    ("defaultTopicQueueNums", "d"),
    ("queueId", "e"),
    ("sysFlag", "f"),
    ("bornTimestamp", "g"),
    ("flag", "h"),
    ("properties", "i"),
    ("reconsumeTimes", "j"),
    ("unitMode", "k"),
    ("maxReconsumeTimes", "l"),
    ("batch", "m"),
];

/// The V2 short name of a SEND_MESSAGE long name.
fn v2_name(long_name: &'static str) -> &'static str {
    SEND_V2_NAMES
        .iter()
        .find(|(long, _)| *long == long_name)
        .map_or(long_name, |(_, short)| short)
}

header! {
    /// SEND_MESSAGE (10); also SEND_MESSAGE_V2 (310) and SEND_BATCH_MESSAGE (320) via the
    /// `*_v2_ext` forms.
    pub struct SendMessageRequestHeader {
        req producer_group: String = "producerGroup",
        req topic: String = "topic",
        /// The template topic for auto-creation (RocketMQ's "TBW102").
        req default_topic: String = "defaultTopic",
        req default_topic_queue_nums: i32 = "defaultTopicQueueNums",
        /// May be negative when the client lets the broker choose.
        req queue_id: i32 = "queueId",
        req sys_flag: i32 = "sysFlag",
        req born_timestamp: i64 = "bornTimestamp",
        req flag: i32 = "flag",
        /// Message properties, `k\u{1}v\u{2}` pairs.
        opt properties: Option<String> = "properties",
        opt reconsume_times: Option<i32> = "reconsumeTimes",
        opt unit_mode: Option<bool> = "unitMode",
        /// True for SEND_BATCH_MESSAGE: the body holds several encoded messages.
        opt batch: Option<bool> = "batch",
        opt max_reconsume_times: Option<i32> = "maxReconsumeTimes",
    }
}

impl SendMessageRequestHeader {
    /// Reads the V2 short names (a..m) of SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE.
    pub fn from_v2_ext(ext: &ExtFields) -> Result<Self, HeaderError> {
        Self::from_ext_keyed(ext, v2_name)
    }

    /// The V2 short-name extFields (a..m).
    pub fn to_v2_ext(&self) -> ExtFields {
        self.to_ext_keyed(v2_name)
    }

    /// Reads the header in the form the command's code implies (V1 names for 10, V2 for
    /// 310/320); a batch code marks the header as a batch even if `m` is missing.
    pub fn from_request(command: &RemotingCommand) -> Result<Self, HeaderError> {
        match command.code {
            crate::code::request::SEND_MESSAGE_V2 => Self::from_v2_ext(&command.ext_fields),
            crate::code::request::SEND_BATCH_MESSAGE => {
                let mut header = Self::from_v2_ext(&command.ext_fields)?;
                header.batch = Some(true);
                Ok(header)
            }
            _ => Self::from_ext(&command.ext_fields),
        }
    }

    pub fn is_batch(&self) -> bool {
        self.batch.unwrap_or(false)
    }

    pub fn reconsume_times_or_zero(&self) -> i32 {
        self.reconsume_times.unwrap_or(0)
    }
}

header! {
    /// Response to SEND_MESSAGE / V2 / batch: `msgId` is the offset message id (or the
    /// comma-joined ids of a batch).
    pub struct SendMessageResponseHeader {
        req msg_id: String = "msgId",
        req queue_id: i32 = "queueId",
        req queue_offset: i64 = "queueOffset",
        /// A half message's transaction id (its UNIQ_KEY), as Apache answers it.
        opt transaction_id: Option<String> = "transactionId",
    }
}

/// PULL_MESSAGE sysFlag bit 0: commit `commitOffset` for the group (piggy-back).
pub const PULL_FLAG_COMMIT_OFFSET: i32 = 1;
/// PULL_MESSAGE sysFlag bit 1: park the request when nothing is there (long polling).
pub const PULL_FLAG_SUSPEND: i32 = 1 << 1;
/// PULL_MESSAGE sysFlag bit 2: the request carries its subscription expression.
pub const PULL_FLAG_SUBSCRIPTION: i32 = 1 << 2;
/// PULL_MESSAGE sysFlag bit 3: class filter mode.
pub const PULL_FLAG_CLASS_FILTER: i32 = 1 << 3;

header! {
    /// PULL_MESSAGE (11).
    pub struct PullMessageRequestHeader {
        req consumer_group: String = "consumerGroup",
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
        req queue_offset: i64 = "queueOffset",
        req max_msg_nums: i32 = "maxMsgNums",
        req sys_flag: i32 = "sysFlag",
        /// The group's offset to commit when sysFlag has the commit bit; -1 when none.
        req commit_offset: i64 = "commitOffset",
        req suspend_timeout_millis: i64 = "suspendTimeoutMillis",
        /// Tag expression such as `TagA || TagB` or `*`.
        opt subscription: Option<String> = "subscription",
        req sub_version: i64 = "subVersion",
        /// "TAG" (default) or "SQL92".
        opt expression_type: Option<String> = "expressionType",
        /// Quiver's replicated groups: the group epoch the reader last pulled in (the
        /// answer's `quiverEpoch`). A member of a later epoch moves a reader positioned past
        /// where that epoch's data ends (a tail a failover cut) back to there (Kafka's
        /// KIP-320); stock clients send none.
        opt quiver_epoch: Option<u64> = "quiverEpoch",
    }
}

impl PullMessageRequestHeader {
    pub fn has_commit_offset(&self) -> bool {
        self.sys_flag & PULL_FLAG_COMMIT_OFFSET != 0
    }
    pub fn has_suspend(&self) -> bool {
        self.sys_flag & PULL_FLAG_SUSPEND != 0
    }
    pub fn has_subscription(&self) -> bool {
        self.sys_flag & PULL_FLAG_SUBSCRIPTION != 0
    }
    pub fn has_class_filter(&self) -> bool {
        self.sys_flag & PULL_FLAG_CLASS_FILTER != 0
    }

    /// The offset to commit for the group: set only with the commit bit and a non-negative
    /// `commitOffset` (clients send -1 when they have nothing to commit).
    pub fn offset_to_commit(&self) -> Option<u64> {
        if !self.has_commit_offset() {
            return None;
        }
        u64::try_from(self.commit_offset).ok()
    }
}

header! {
    /// Response to PULL_MESSAGE; with PULL_OFFSET_MOVED `next_begin_offset` is where to resume.
    pub struct PullMessageResponseHeader {
        req suggest_which_broker_id: i64 = "suggestWhichBrokerId",
        req next_begin_offset: i64 = "nextBeginOffset",
        req min_offset: i64 = "minOffset",
        req max_offset: i64 = "maxOffset",
        /// On a replicated group's member: the group's epoch when it answered.
        opt quiver_epoch: Option<u64> = "quiverEpoch",
    }
}

header! {
    /// QUERY_CONSUMER_OFFSET (14). `setZeroIfNotFound` (Apache 5.x) false asks for
    /// QUERY_NOT_FOUND when nothing is committed, instead of 0 for a queue still in memory.
    pub struct QueryConsumerOffsetRequestHeader {
        req consumer_group: String = "consumerGroup",
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
        opt set_zero_if_not_found: Option<bool> = "setZeroIfNotFound",
    }
}

header! {
    /// Response to QUERY_CONSUMER_OFFSET (code 0; 22 QUERY_NOT_FOUND carries no header).
    pub struct QueryConsumerOffsetResponseHeader {
        req offset: i64 = "offset",
    }
}

header! {
    /// UPDATE_CONSUMER_OFFSET (15), oneway or two-way.
    pub struct UpdateConsumerOffsetRequestHeader {
        req consumer_group: String = "consumerGroup",
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
        req commit_offset: i64 = "commitOffset",
    }
}

header! {
    /// GET_MAX_OFFSET (30).
    pub struct GetMaxOffsetRequestHeader {
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
    }
}

header! {
    /// Response to GET_MAX_OFFSET.
    pub struct GetMaxOffsetResponseHeader {
        req offset: i64 = "offset",
    }
}

header! {
    /// GET_MIN_OFFSET (31).
    pub struct GetMinOffsetRequestHeader {
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
    }
}

header! {
    /// Response to GET_MIN_OFFSET.
    pub struct GetMinOffsetResponseHeader {
        req offset: i64 = "offset",
    }
}

header! {
    /// SEARCH_OFFSET_BY_TIMESTAMP (29).
    pub struct SearchOffsetRequestHeader {
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
        /// Milliseconds since the epoch.
        req timestamp: i64 = "timestamp",
    }
}

header! {
    /// Response to SEARCH_OFFSET_BY_TIMESTAMP.
    pub struct SearchOffsetResponseHeader {
        req offset: i64 = "offset",
    }
}

header! {
    /// GET_EARLIEST_MSG_STORETIME (32).
    pub struct GetEarliestMsgStoretimeRequestHeader {
        req topic: String = "topic",
        req queue_id: i32 = "queueId",
    }
}

header! {
    /// Response to GET_EARLIEST_MSG_STORETIME.
    pub struct GetEarliestMsgStoretimeResponseHeader {
        req timestamp: i64 = "timestamp",
    }
}

header! {
    /// VIEW_MESSAGE_BY_ID (33): the CommitLog offset decoded from an offset message id.
    pub struct ViewMessageRequestHeader {
        req offset: i64 = "offset",
    }
}

header! {
    /// CONSUMER_SEND_MSG_BACK (36): `offset` is the message's CommitLog offset.
    pub struct ConsumerSendMsgBackRequestHeader {
        req offset: i64 = "offset",
        req group: String = "group",
        /// 0 lets the broker pick 3 + reconsumeTimes; -1 sends straight to the DLQ.
        req delay_level: i32 = "delayLevel",
        opt origin_msg_id: Option<String> = "originMsgId",
        opt origin_topic: Option<String> = "originTopic",
        opt unit_mode: Option<bool> = "unitMode",
        opt max_reconsume_times: Option<i32> = "maxReconsumeTimes",
    }
}

/// Where CONSUMER_SEND_MSG_BACK asks the broker to put a failed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendBackDelay {
    /// `delayLevel` 0: the broker picks level 3 + reconsumeTimes.
    BrokerChooses,
    /// A negative `delayLevel`: straight to `%DLQ%<group>`.
    DeadLetter,
    /// An explicit delay level (1 = 1 s, 2 = 5 s, ...).
    Level(i32),
}

impl ConsumerSendMsgBackRequestHeader {
    pub fn delay(&self) -> SendBackDelay {
        match self.delay_level {
            0 => SendBackDelay::BrokerChooses,
            level if level < 0 => SendBackDelay::DeadLetter,
            level => SendBackDelay::Level(level),
        }
    }
}

header! {
    /// GET_CONSUMER_LIST_BY_GROUP (38).
    pub struct GetConsumerListByGroupRequestHeader {
        req consumer_group: String = "consumerGroup",
    }
}

header! {
    /// UNREGISTER_CLIENT (35); the C++ client sends the unused group as "" (read as None).
    pub struct UnregisterClientRequestHeader {
        req client_id: String = "clientID",
        opt producer_group: Option<String> = "producerGroup",
        opt consumer_group: Option<String> = "consumerGroup",
    }
}

header! {
    /// NOTIFY_CONSUMER_IDS_CHANGED (40), broker -> client.
    pub struct NotifyConsumerIdsChangedRequestHeader {
        req consumer_group: String = "consumerGroup",
    }
}

header! {
    /// GET_ROUTEINFO_BY_TOPIC (105).
    pub struct GetRouteInfoRequestHeader {
        req topic: String = "topic",
    }
}

header! {
    /// UPDATE_AND_CREATE_TOPIC (17).
    pub struct CreateTopicRequestHeader {
        req topic: String = "topic",
        opt default_topic: Option<String> = "defaultTopic",
        req read_queue_nums: i32 = "readQueueNums",
        req write_queue_nums: i32 = "writeQueueNums",
        /// 6 read-write, 4 read-only, 2 write-only.
        req perm: i32 = "perm",
        /// "SINGLE_TAG" or "MULTI_TAG".
        opt topic_filter_type: Option<String> = "topicFilterType",
        opt topic_sys_flag: Option<i32> = "topicSysFlag",
        opt order: Option<bool> = "order",
    }
}

header! {
    /// DELETE_TOPIC_IN_BROKER (215).
    pub struct DeleteTopicRequestHeader {
        req topic: String = "topic",
    }
}

header! {
    /// GET_CONSUME_STATS (208); without a topic, every topic the group consumes.
    /// `markUncommitted` (Quiver's own, ignored by Apache brokers) asks for consumerOffset -1
    /// on queues the group never committed on, where Apache answers 0.
    pub struct GetConsumeStatsRequestHeader {
        req consumer_group: String = "consumerGroup",
        opt topic: Option<String> = "topic",
        opt mark_uncommitted: Option<bool> = "markUncommitted",
    }
}

header! {
    /// GET_TOPIC_STATS_INFO (202).
    pub struct GetTopicStatsInfoRequestHeader {
        req topic: String = "topic",
    }
}

header! {
    /// GET_CONSUMER_CONNECTION_LIST (203).
    pub struct GetConsumerConnectionListRequestHeader {
        req consumer_group: String = "consumerGroup",
    }
}

header! {
    /// DELETE_SUBSCRIPTIONGROUP (207).
    pub struct DeleteSubscriptionGroupRequestHeader {
        req group_name: String = "groupName",
        /// RocketMQ 5 flag; Quiver always drops the group's offsets.
        opt clean_offset: Option<bool> = "cleanOffset",
    }
}

header! {
    /// INVOKE_BROKER_TO_RESET_OFFSET (222): reset a group's offsets on a topic to a time.
    pub struct ResetOffsetRequestHeader {
        req topic: String = "topic",
        req group: String = "group",
        /// Milliseconds since the epoch; see [`ResetTarget`] for 0 and -1.
        req timestamp: i64 = "timestamp",
        req is_force: bool = "isForce",
    }
}

/// What INVOKE_BROKER_TO_RESET_OFFSET moves a group's offsets to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    /// Each queue's min offset (sent as timestamp 0, which every store time follows).
    Earliest,
    /// Each queue's max offset (sent as timestamp -1, as RocketMQ's Broker2Client reads it).
    Latest,
    /// The first message stored at or after this time, in ms since the epoch.
    Timestamp(i64),
}

impl ResetTarget {
    /// The `timestamp` header value that carries this target; a time is at least 1, since 0
    /// and negative values name the ends.
    pub fn wire_timestamp(self) -> i64 {
        match self {
            ResetTarget::Earliest => 0,
            ResetTarget::Latest => -1,
            ResetTarget::Timestamp(timestamp) => timestamp.max(1),
        }
    }

    /// Reads a `timestamp` header value; other negative values also mean the latest.
    pub fn from_wire_timestamp(timestamp: i64) -> Self {
        match timestamp {
            0 => ResetTarget::Earliest,
            timestamp if timestamp < 0 => ResetTarget::Latest,
            timestamp => ResetTarget::Timestamp(timestamp),
        }
    }
}

impl ResetOffsetRequestHeader {
    pub fn target(&self) -> ResetTarget {
        ResetTarget::from_wire_timestamp(self.timestamp)
    }
}

header! {
    /// RESET_CONSUMER_CLIENT_OFFSET (220), broker -> client; the body is a `ResetOffsetBody`.
    pub struct ResetOffsetClientHeader {
        req topic: String = "topic",
        req group: String = "group",
        req timestamp: i64 = "timestamp",
        req is_force: bool = "isForce",
    }
}

header! {
    /// GET_CONSUMER_STATUS_FROM_CLIENT (221) and INVOKE_BROKER_TO_GET_CONSUMER_STATUS (223).
    pub struct GetConsumerStatusRequestHeader {
        req topic: String = "topic",
        req group: String = "group",
        opt client_addr: Option<String> = "clientAddr",
    }
}

header! {
    /// GET_CONSUMER_RUNNING_INFO (307), broker -> client.
    pub struct GetConsumerRunningInfoRequestHeader {
        req consumer_group: String = "consumerGroup",
        req client_id: String = "clientId",
        opt jstack_enable: Option<bool> = "jstackEnable",
    }
}

header! {
    /// Response to GET_BROKER_CONFIG (26); the body is the `key=value` properties text.
    pub struct GetBrokerConfigResponseHeader {
        req version: String = "version",
    }
}

header! {
    /// GET_KV_CONFIG (101), a name-server request some clients and tools send.
    pub struct GetKvConfigRequestHeader {
        req namespace: String = "namespace",
        req key: String = "key",
    }
}

header! {
    /// Response to GET_KV_CONFIG (22 QUERY_NOT_FOUND when the key is unknown).
    pub struct GetKvConfigResponseHeader {
        opt value: Option<String> = "value",
    }
}

header! {
    /// GET_TOPICS_BY_CLUSTER (224).
    pub struct GetTopicsByClusterRequestHeader {
        req cluster: String = "cluster",
    }
}

header! {
    /// QUERY_TOPIC_CONSUME_BY_WHO (300): the groups with offsets on a topic.
    pub struct QueryTopicConsumeByWhoRequestHeader {
        req topic: String = "topic",
    }
}

header! {
    /// QUERY_MESSAGE (12): by key within a time range.
    pub struct QueryMessageRequestHeader {
        req topic: String = "topic",
        req key: String = "key",
        req max_num: i32 = "maxNum",
        req begin_timestamp: i64 = "beginTimestamp",
        req end_timestamp: i64 = "endTimestamp",
    }
}

/// The extFields key (value "true") that makes QUERY_MESSAGE a query by unique key (message
/// id), Java's `MixAll.UNIQUE_MSG_QUERY_FLAG`.
pub const UNIQUE_KEY_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";

header! {
    /// Response to QUERY_MESSAGE: how far the broker's index has got.
    pub struct QueryMessageResponseHeader {
        /// Store time (ms) of the newest message indexed.
        req index_last_update_timestamp: i64 = "indexLastUpdateTimestamp",
        /// CommitLog offset of the newest message indexed.
        req index_last_update_phyoffset: i64 = "indexLastUpdatePhyoffset",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(pairs: &[(&str, &str)]) -> ExtFields {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn missing_required_field_is_named() {
        let error = PullMessageRequestHeader::from_ext(&ext(&[("topic", "T")])).unwrap_err();
        assert_eq!(
            error,
            HeaderError::Missing {
                field: "consumerGroup"
            }
        );
    }

    #[test]
    fn invalid_number_is_reported_with_its_value() {
        let error = GetMaxOffsetRequestHeader::from_ext(&ext(&[("topic", "T"), ("queueId", "x")]))
            .unwrap_err();
        assert_eq!(
            error,
            HeaderError::Invalid {
                field: "queueId",
                value: "x".into()
            }
        );
    }

    #[test]
    fn booleans_accept_words_and_digits() {
        for (raw, expected) in [
            ("true", true),
            ("TRUE", true),
            ("1", true),
            ("0", false),
            ("false", false),
        ] {
            let header = ResetOffsetRequestHeader::from_ext(&ext(&[
                ("topic", "T"),
                ("group", "G"),
                ("timestamp", "5"),
                ("isForce", raw),
            ]))
            .unwrap();
            assert_eq!(header.is_force, expected, "{raw}");
        }
        assert!(bool::parse_ext("isForce", "yes").is_err());
    }

    #[test]
    fn empty_optional_text_is_absent() {
        let header = UnregisterClientRequestHeader::from_ext(&ext(&[
            ("clientID", "c1"),
            ("producerGroup", ""),
            ("consumerGroup", "G"),
        ]))
        .unwrap();
        assert_eq!(header.producer_group, None);
        assert_eq!(header.consumer_group.as_deref(), Some("G"));
    }

    #[test]
    fn send_header_v2_short_names_map_to_long_names() {
        let v2 = ext(&[
            ("a", "PG"),
            ("b", "T"),
            ("c", "TBW102"),
            ("d", "4"),
            ("e", "2"),
            ("f", "0"),
            ("g", "1700000000000"),
            ("h", "0"),
            ("i", "TAGS\u{1}A\u{2}"),
            ("j", "0"),
            ("k", "false"),
            ("l", "16"),
            ("m", "true"),
        ]);
        let header = SendMessageRequestHeader::from_v2_ext(&v2).unwrap();
        assert_eq!(header.producer_group, "PG");
        assert_eq!(header.queue_id, 2);
        assert!(header.is_batch());
        assert_eq!(header.max_reconsume_times, Some(16));
        assert_eq!(header.to_v2_ext(), v2);
    }

    #[test]
    fn send_header_v2_errors_name_the_long_field() {
        let missing_topic = ext(&[("a", "PG"), ("c", "TBW102"), ("d", "4")]);
        assert!(matches!(
            SendMessageRequestHeader::from_v2_ext(&missing_topic),
            Err(HeaderError::Missing { field: "topic" })
        ));
        let mut bad_queue = SendMessageRequestHeader::default().to_v2_ext();
        bad_queue.insert("e", "two");
        assert!(matches!(
            SendMessageRequestHeader::from_v2_ext(&bad_queue),
            Err(HeaderError::Invalid {
                field: "queueId",
                ..
            })
        ));
        // The long names are not read as V2.
        let long = SendMessageRequestHeader::default().to_ext();
        assert!(SendMessageRequestHeader::from_v2_ext(&long).is_err());
    }

    #[test]
    fn commit_offset_needs_the_flag_and_a_real_offset() {
        let mut header = PullMessageRequestHeader {
            sys_flag: PULL_FLAG_SUSPEND,
            commit_offset: 5,
            ..Default::default()
        };
        assert_eq!(header.offset_to_commit(), None);
        header.sys_flag |= PULL_FLAG_COMMIT_OFFSET;
        assert_eq!(header.offset_to_commit(), Some(5));
        header.commit_offset = -1;
        assert_eq!(header.offset_to_commit(), None);
    }

    #[test]
    fn send_back_delay_levels() {
        let delay = |delay_level| {
            ConsumerSendMsgBackRequestHeader {
                delay_level,
                ..Default::default()
            }
            .delay()
        };
        assert_eq!(delay(0), SendBackDelay::BrokerChooses);
        assert_eq!(delay(-1), SendBackDelay::DeadLetter);
        assert_eq!(delay(4), SendBackDelay::Level(4));
    }

    #[test]
    fn reset_targets_travel_as_timestamps() {
        for target in [
            ResetTarget::Earliest,
            ResetTarget::Latest,
            ResetTarget::Timestamp(1_700_000_000_000),
        ] {
            assert_eq!(
                ResetTarget::from_wire_timestamp(target.wire_timestamp()),
                target
            );
        }
        assert_eq!(ResetTarget::from_wire_timestamp(-7), ResetTarget::Latest);
        // A time never travels as an end's encoding.
        assert_eq!(ResetTarget::Timestamp(0).wire_timestamp(), 1);
        assert_eq!(ResetTarget::Timestamp(-5).wire_timestamp(), 1);
        let header = ResetOffsetRequestHeader {
            timestamp: -1,
            ..Default::default()
        };
        assert_eq!(header.target(), ResetTarget::Latest);
    }

    #[test]
    fn pull_sys_flag_bits() {
        let header = PullMessageRequestHeader {
            sys_flag: PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUSPEND,
            ..Default::default()
        };
        assert!(header.has_commit_offset());
        assert!(header.has_suspend());
        assert!(!header.has_subscription());
        assert!(!header.has_class_filter());
    }
}
