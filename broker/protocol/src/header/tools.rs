//! Headers of the calls `mqadmin` and the dashboard make (producer connections, name-server
//! topic deletion, offset cloning), of the broker's requests relayed to a consumer
//! (CONSUME_MESSAGE_DIRECTLY) and of request-reply (PUSH_REPLY_MESSAGE_TO_CLIENT), named as
//! Apache's header classes name their fields.

use super::{CommandHeader, FieldKind, Optional, Required};
use crate::error::HeaderError;
use crate::{ExtFields, RemotingCommand};

header! {
    /// GET_PRODUCER_CONNECTION_LIST (204).
    pub struct GetProducerConnectionListRequestHeader {
        req producer_group: String = "producerGroup",
    }
}

header! {
    /// DELETE_TOPIC_IN_NAMESRV (216).
    pub struct DeleteTopicFromNamesrvRequestHeader {
        req topic: String = "topic",
    }
}

header! {
    /// CLONE_GROUP_OFFSET (314): without a topic, every topic the source group has offsets on;
    /// unless `offline`, topics an online source group does not subscribe to are skipped.
    pub struct CloneGroupOffsetRequestHeader {
        req src_group: String = "srcGroup",
        req dest_group: String = "destGroup",
        opt topic: Option<String> = "topic",
        opt offline: Option<bool> = "offline",
    }
}

header! {
    /// CONSUME_MESSAGE_DIRECTLY (309), admin -> broker -> the consumer `clientId`.
    pub struct ConsumeMessageDirectlyResultRequestHeader {
        req consumer_group: String = "consumerGroup",
        opt client_id: Option<String> = "clientId",
        opt msg_id: Option<String> = "msgId",
        opt broker_name: Option<String> = "brokerName",
    }
}

header! {
    /// PUSH_REPLY_MESSAGE_TO_CLIENT (326): a reply, broker -> the requesting producer.
    pub struct ReplyMessageRequestHeader {
        req producer_group: String = "producerGroup",
        req topic: String = "topic",
        req default_topic: String = "defaultTopic",
        req default_topic_queue_nums: i32 = "defaultTopicQueueNums",
        req queue_id: i32 = "queueId",
        req sys_flag: i32 = "sysFlag",
        req born_timestamp: i64 = "bornTimestamp",
        req flag: i32 = "flag",
        opt properties: Option<String> = "properties",
        opt reconsume_times: Option<i32> = "reconsumeTimes",
        opt unit_mode: Option<bool> = "unitMode",
        req born_host: String = "bornHost",
        req store_host: String = "storeHost",
        req store_timestamp: i64 = "storeTimestamp",
    }
}
