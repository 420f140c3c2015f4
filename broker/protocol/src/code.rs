//! Request and response codes (Java `RequestCode` / `ResponseCode`).

/// Request codes a broker serves or a client is sent.
pub mod request {
    pub const SEND_MESSAGE: i32 = 10;
    pub const PULL_MESSAGE: i32 = 11;
    pub const QUERY_MESSAGE: i32 = 12;
    pub const QUERY_BROKER_OFFSET: i32 = 13;
    pub const QUERY_CONSUMER_OFFSET: i32 = 14;
    pub const UPDATE_CONSUMER_OFFSET: i32 = 15;
    pub const UPDATE_AND_CREATE_TOPIC: i32 = 17;
    pub const GET_ALL_TOPIC_CONFIG: i32 = 21;
    pub const GET_TOPIC_CONFIG_LIST: i32 = 22;
    pub const GET_TOPIC_NAME_LIST: i32 = 23;
    pub const UPDATE_BROKER_CONFIG: i32 = 25;
    pub const GET_BROKER_CONFIG: i32 = 26;
    pub const TRIGGER_DELETE_FILES: i32 = 27;
    pub const GET_BROKER_RUNTIME_INFO: i32 = 28;
    pub const SEARCH_OFFSET_BY_TIMESTAMP: i32 = 29;
    pub const GET_MAX_OFFSET: i32 = 30;
    pub const GET_MIN_OFFSET: i32 = 31;
    pub const GET_EARLIEST_MSG_STORETIME: i32 = 32;
    pub const VIEW_MESSAGE_BY_ID: i32 = 33;
    pub const HEART_BEAT: i32 = 34;
    pub const UNREGISTER_CLIENT: i32 = 35;
    pub const CONSUMER_SEND_MSG_BACK: i32 = 36;
    pub const END_TRANSACTION: i32 = 37;
    pub const GET_CONSUMER_LIST_BY_GROUP: i32 = 38;
    pub const CHECK_TRANSACTION_STATE: i32 = 39;
    /// Broker -> client push: the group's membership changed, rebalance now.
    pub const NOTIFY_CONSUMER_IDS_CHANGED: i32 = 40;
    pub const LOCK_BATCH_MQ: i32 = 41;
    pub const UNLOCK_BATCH_MQ: i32 = 42;
    pub const GET_ALL_CONSUMER_OFFSET: i32 = 43;
    pub const GET_ALL_DELAY_OFFSET: i32 = 45;
    pub const CHECK_CLIENT_CONFIG: i32 = 46;
    pub const GET_CLIENT_CONFIG: i32 = 47;
    pub const PUT_KV_CONFIG: i32 = 100;
    pub const GET_KV_CONFIG: i32 = 101;
    pub const DELETE_KV_CONFIG: i32 = 102;
    pub const REGISTER_BROKER: i32 = 103;
    pub const UNREGISTER_BROKER: i32 = 104;
    pub const GET_ROUTEINFO_BY_TOPIC: i32 = 105;
    pub const GET_BROKER_CLUSTER_INFO: i32 = 106;
    pub const UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: i32 = 200;
    pub const GET_ALL_SUBSCRIPTIONGROUP_CONFIG: i32 = 201;
    pub const GET_TOPIC_STATS_INFO: i32 = 202;
    pub const GET_CONSUMER_CONNECTION_LIST: i32 = 203;
    pub const GET_PRODUCER_CONNECTION_LIST: i32 = 204;
    pub const WIPE_WRITE_PERM_OF_BROKER: i32 = 205;
    pub const GET_ALL_TOPIC_LIST_FROM_NAMESERVER: i32 = 206;
    pub const DELETE_SUBSCRIPTIONGROUP: i32 = 207;
    pub const GET_CONSUME_STATS: i32 = 208;
    pub const SUSPEND_CONSUMER: i32 = 209;
    pub const RESUME_CONSUMER: i32 = 210;
    pub const RESET_CONSUMER_OFFSET_IN_CONSUMER: i32 = 211;
    pub const RESET_CONSUMER_OFFSET_IN_BROKER: i32 = 212;
    pub const ADJUST_CONSUMER_THREAD_POOL: i32 = 213;
    pub const WHO_CONSUME_THE_MESSAGE: i32 = 214;
    pub const DELETE_TOPIC_IN_BROKER: i32 = 215;
    pub const DELETE_TOPIC_IN_NAMESRV: i32 = 216;
    pub const GET_KVLIST_BY_NAMESPACE: i32 = 219;
    /// Broker -> client push: move the group's offsets (after INVOKE_BROKER_TO_RESET_OFFSET).
    pub const RESET_CONSUMER_CLIENT_OFFSET: i32 = 220;
    /// Broker -> client request: report the client's offsets for a topic.
    pub const GET_CONSUMER_STATUS_FROM_CLIENT: i32 = 221;
    pub const INVOKE_BROKER_TO_RESET_OFFSET: i32 = 222;
    pub const INVOKE_BROKER_TO_GET_CONSUMER_STATUS: i32 = 223;
    pub const GET_TOPICS_BY_CLUSTER: i32 = 224;
    pub const QUERY_TOPIC_CONSUME_BY_WHO: i32 = 300;
    pub const QUERY_CONSUME_TIME_SPAN: i32 = 303;
    pub const GET_SYSTEM_TOPIC_LIST_FROM_NS: i32 = 304;
    pub const GET_SYSTEM_TOPIC_LIST_FROM_BROKER: i32 = 305;
    pub const CLEAN_EXPIRED_CONSUMEQUEUE: i32 = 306;
    /// Broker -> client request (admin tools): the consumer's running info.
    pub const GET_CONSUMER_RUNNING_INFO: i32 = 307;
    pub const QUERY_CORRECTION_OFFSET: i32 = 308;
    pub const CONSUME_MESSAGE_DIRECTLY: i32 = 309;
    pub const SEND_MESSAGE_V2: i32 = 310;
    pub const GET_UNIT_TOPIC_LIST: i32 = 311;
    pub const CLONE_GROUP_OFFSET: i32 = 314;
    pub const VIEW_BROKER_STATS_DATA: i32 = 315;
    pub const CLEAN_UNUSED_TOPIC: i32 = 316;
    pub const GET_BROKER_CONSUME_STATS: i32 = 317;
    pub const UPDATE_NAMESRV_CONFIG: i32 = 318;
    pub const GET_NAMESRV_CONFIG: i32 = 319;
    pub const SEND_BATCH_MESSAGE: i32 = 320;
    pub const QUERY_CONSUME_QUEUE: i32 = 321;
    pub const QUERY_DATA_VERSION: i32 = 322;
    /// Request-reply: a consumer's reply (V1 and V2 send headers), pushed on to the requester.
    pub const SEND_REPLY_MESSAGE: i32 = 324;
    pub const SEND_REPLY_MESSAGE_V2: i32 = 325;
    /// Broker -> the requesting producer: the reply to its request().
    pub const PUSH_REPLY_MESSAGE_TO_CLIENT: i32 = 326;

    // Quiver's replicated broker groups (not Apache codes: Apache's HA port has its own
    // framing; Quiver carries replication over the remoting port). Below 32768: the binary
    // (ROCKETMQ) header holds a code in 16 bits.
    /// Replica -> master: CommitLog bytes from an offset (the offset acknowledges all below).
    pub const QUIVER_REPLICA_FETCH: i32 = 30001;
    /// Group member -> group member: one consensus (openraft) message, JSON both ways.
    pub const QUIVER_CONSENSUS: i32 = 30002;
    /// Admin -> any group member: the group's roles, epoch, in-sync set and lag (JSON).
    pub const QUIVER_REPLICATION_STATUS: i32 = 30003;
    /// Admin -> the master: hand mastership to a named in-sync replica.
    pub const QUIVER_SWITCHOVER: i32 = 30004;
    /// Admin -> any group member: add, remove or replace a member of the group's consensus
    /// membership (forwarded to the consensus leader); answers the new membership (JSON).
    pub const QUIVER_REPLICATION_MEMBERS: i32 = 30005;

    /// The Java constant name of a request code, for logs and "not supported" remarks.
    pub fn name(code: i32) -> Option<&'static str> {
        super::ALL_REQUESTS
            .iter()
            .find(|(value, _)| *value == code)
            .map(|(_, name)| *name)
    }
}

/// Response codes.
pub mod response {
    pub const SUCCESS: i32 = 0;
    pub const SYSTEM_ERROR: i32 = 1;
    pub const SYSTEM_BUSY: i32 = 2;
    pub const REQUEST_CODE_NOT_SUPPORTED: i32 = 3;
    pub const TRANSACTION_FAILED: i32 = 4;
    pub const FLUSH_DISK_TIMEOUT: i32 = 10;
    pub const SLAVE_NOT_AVAILABLE: i32 = 11;
    pub const FLUSH_SLAVE_TIMEOUT: i32 = 12;
    pub const MESSAGE_ILLEGAL: i32 = 13;
    pub const SERVICE_NOT_AVAILABLE: i32 = 14;
    pub const VERSION_NOT_SUPPORTED: i32 = 15;
    pub const NO_PERMISSION: i32 = 16;
    pub const TOPIC_NOT_EXIST: i32 = 17;
    pub const TOPIC_EXIST_ALREADY: i32 = 18;
    pub const PULL_NOT_FOUND: i32 = 19;
    pub const PULL_RETRY_IMMEDIATELY: i32 = 20;
    pub const PULL_OFFSET_MOVED: i32 = 21;
    pub const QUERY_NOT_FOUND: i32 = 22;
    pub const SUBSCRIPTION_PARSE_FAILED: i32 = 23;
    pub const SUBSCRIPTION_NOT_EXIST: i32 = 24;
    pub const SUBSCRIPTION_NOT_LATEST: i32 = 25;
    pub const SUBSCRIPTION_GROUP_NOT_EXIST: i32 = 26;
    pub const FILTER_DATA_NOT_EXIST: i32 = 27;
    pub const FILTER_DATA_NOT_LATEST: i32 = 28;
    pub const TRANSACTION_SHOULD_COMMIT: i32 = 200;
    pub const TRANSACTION_SHOULD_ROLLBACK: i32 = 201;
    pub const TRANSACTION_STATE_UNKNOW: i32 = 202;
    pub const TRANSACTION_STATE_GROUP_WRONG: i32 = 203;
    pub const NO_BUYER_ID: i32 = 204;
    pub const NOT_IN_CURRENT_UNIT: i32 = 205;
    pub const CONSUMER_NOT_ONLINE: i32 = 206;
    pub const CONSUME_MSG_TIMEOUT: i32 = 207;
    pub const NO_MESSAGE: i32 = 208;
}

macro_rules! named {
    ($($name:ident),* $(,)?) => { &[$((request::$name, stringify!($name))),*] };
}

/// Every request code with its Java name.
pub const ALL_REQUESTS: &[(i32, &str)] = named![
    SEND_MESSAGE,
    PULL_MESSAGE,
    QUERY_MESSAGE,
    QUERY_BROKER_OFFSET,
    QUERY_CONSUMER_OFFSET,
    UPDATE_CONSUMER_OFFSET,
    UPDATE_AND_CREATE_TOPIC,
    GET_ALL_TOPIC_CONFIG,
    GET_TOPIC_CONFIG_LIST,
    GET_TOPIC_NAME_LIST,
    UPDATE_BROKER_CONFIG,
    GET_BROKER_CONFIG,
    TRIGGER_DELETE_FILES,
    GET_BROKER_RUNTIME_INFO,
    SEARCH_OFFSET_BY_TIMESTAMP,
    GET_MAX_OFFSET,
    GET_MIN_OFFSET,
    GET_EARLIEST_MSG_STORETIME,
    VIEW_MESSAGE_BY_ID,
    HEART_BEAT,
    UNREGISTER_CLIENT,
    CONSUMER_SEND_MSG_BACK,
    END_TRANSACTION,
    GET_CONSUMER_LIST_BY_GROUP,
    CHECK_TRANSACTION_STATE,
    NOTIFY_CONSUMER_IDS_CHANGED,
    LOCK_BATCH_MQ,
    UNLOCK_BATCH_MQ,
    GET_ALL_CONSUMER_OFFSET,
    GET_ALL_DELAY_OFFSET,
    CHECK_CLIENT_CONFIG,
    GET_CLIENT_CONFIG,
    PUT_KV_CONFIG,
    GET_KV_CONFIG,
    DELETE_KV_CONFIG,
    REGISTER_BROKER,
    UNREGISTER_BROKER,
    GET_ROUTEINFO_BY_TOPIC,
    GET_BROKER_CLUSTER_INFO,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    GET_TOPIC_STATS_INFO,
    GET_CONSUMER_CONNECTION_LIST,
    GET_PRODUCER_CONNECTION_LIST,
    WIPE_WRITE_PERM_OF_BROKER,
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
    DELETE_SUBSCRIPTIONGROUP,
    GET_CONSUME_STATS,
    SUSPEND_CONSUMER,
    RESUME_CONSUMER,
    RESET_CONSUMER_OFFSET_IN_CONSUMER,
    RESET_CONSUMER_OFFSET_IN_BROKER,
    ADJUST_CONSUMER_THREAD_POOL,
    WHO_CONSUME_THE_MESSAGE,
    DELETE_TOPIC_IN_BROKER,
    DELETE_TOPIC_IN_NAMESRV,
    GET_KVLIST_BY_NAMESPACE,
    RESET_CONSUMER_CLIENT_OFFSET,
    GET_CONSUMER_STATUS_FROM_CLIENT,
    INVOKE_BROKER_TO_RESET_OFFSET,
    INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
    GET_TOPICS_BY_CLUSTER,
    QUERY_TOPIC_CONSUME_BY_WHO,
    QUERY_CONSUME_TIME_SPAN,
    GET_SYSTEM_TOPIC_LIST_FROM_NS,
    GET_SYSTEM_TOPIC_LIST_FROM_BROKER,
    CLEAN_EXPIRED_CONSUMEQUEUE,
    GET_CONSUMER_RUNNING_INFO,
    QUERY_CORRECTION_OFFSET,
    CONSUME_MESSAGE_DIRECTLY,
    SEND_MESSAGE_V2,
    GET_UNIT_TOPIC_LIST,
    CLONE_GROUP_OFFSET,
    VIEW_BROKER_STATS_DATA,
    CLEAN_UNUSED_TOPIC,
    GET_BROKER_CONSUME_STATS,
    UPDATE_NAMESRV_CONFIG,
    GET_NAMESRV_CONFIG,
    SEND_BATCH_MESSAGE,
    QUERY_CONSUME_QUEUE,
    QUERY_DATA_VERSION,
    SEND_REPLY_MESSAGE,
    SEND_REPLY_MESSAGE_V2,
    PUSH_REPLY_MESSAGE_TO_CLIENT,
    QUIVER_REPLICA_FETCH,
    QUIVER_CONSENSUS,
    QUIVER_REPLICATION_STATUS,
    QUIVER_SWITCHOVER,
    QUIVER_REPLICATION_MEMBERS,
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_codes_are_unique_and_named() {
        let mut values: Vec<i32> = ALL_REQUESTS.iter().map(|(value, _)| *value).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), ALL_REQUESTS.len());
        // Every code fits the binary header's 16-bit field.
        assert!(
            values.iter().all(|code| i16::try_from(*code).is_ok()),
            "{values:?}"
        );
        assert_eq!(request::name(310), Some("SEND_MESSAGE_V2"));
        assert_eq!(request::name(222), Some("INVOKE_BROKER_TO_RESET_OFFSET"));
        assert_eq!(request::name(9999), None);
    }
}
