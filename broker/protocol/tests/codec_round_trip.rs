//! For every request code the broker serves or pushes: typed header -> extFields -> frame
//! (JSON and binary headers) -> decode -> typed header, and the same for typed bodies and the
//! responses that carry a typed header.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;

use bytes::{Bytes, BytesMut};
use quiver_protocol::body::*;
use quiver_protocol::code::{request, response};
use quiver_protocol::header::*;
use quiver_protocol::message::{decode_batch, encode_batch, BatchMessage};
use quiver_protocol::{frame, ExtFields, RemotingCommand, SerializeType};

const BOTH: [SerializeType; 2] = [SerializeType::Json, SerializeType::RocketMq];

/// Encodes and decodes `command` as a frame, asserting nothing changed on the way.
fn through_frame(command: &RemotingCommand) -> RemotingCommand {
    let mut buf = BytesMut::new();
    frame::encode(command, &mut buf).unwrap();
    let decoded = frame::decode(&mut buf).unwrap().expect("a whole frame");
    assert!(buf.is_empty());
    assert_eq!(&decoded, command);
    decoded
}

/// Tracks which request codes were exercised.
#[derive(Default)]
struct Coverage(BTreeSet<i32>);

impl Coverage {
    fn request<H>(&mut self, code: i32, header: &H, body: Bytes) -> Vec<RemotingCommand>
    where
        H: CommandHeader + PartialEq + Debug,
    {
        self.0.insert(code);
        BOTH.iter()
            .map(|&serialize_type| {
                let command = RemotingCommand::request(code, header.to_ext())
                    .with_opaque(code * 7)
                    .with_body(body.clone())
                    .with_serialize_type(serialize_type);
                let decoded = through_frame(&command);
                assert_eq!(
                    &H::from_ext(&decoded.ext_fields).unwrap(),
                    header,
                    "code {code}"
                );
                decoded
            })
            .collect()
    }

    fn body_only(&mut self, code: i32, body: Bytes) -> Vec<RemotingCommand> {
        self.0.insert(code);
        BOTH.iter()
            .map(|&serialize_type| {
                let command = RemotingCommand::request(code, ExtFields::default())
                    .with_opaque(code)
                    .with_body(body.clone())
                    .with_serialize_type(serialize_type);
                through_frame(&command)
            })
            .collect()
    }
}

/// A response carrying a typed header, for both serialize types.
fn response_round_trip<H>(code: i32, header: &H, body: Bytes) -> Vec<RemotingCommand>
where
    H: CommandHeader + PartialEq + Debug,
{
    BOTH.iter()
        .map(|&serialize_type| {
            let request = RemotingCommand::request(request::PULL_MESSAGE, ExtFields::default())
                .with_opaque(41)
                .with_serialize_type(serialize_type);
            let command = request
                .response_to(code, Some("remark".into()))
                .with_ext_fields(header.to_ext())
                .with_body(body.clone());
            let decoded = through_frame(&command);
            assert!(decoded.is_response());
            assert_eq!(decoded.opaque, 41);
            assert_eq!(&H::from_ext(&decoded.ext_fields).unwrap(), header);
            decoded
        })
        .collect()
}

fn mq(queue_id: u32) -> MessageQueue {
    MessageQueue::new("TopicTest", "broker-a", queue_id)
}

fn send_header(batch: bool) -> SendMessageRequestHeader {
    SendMessageRequestHeader {
        producer_group: "PG".into(),
        topic: "TopicTest".into(),
        default_topic: "TBW102".into(),
        default_topic_queue_nums: 4,
        queue_id: 3,
        sys_flag: 2,
        born_timestamp: 1_700_000_000_123,
        flag: 9,
        properties: Some("TAGS\u{1}TagA\u{2}KEYS\u{1}k1 k2\u{2}".into()),
        reconsume_times: Some(2),
        unit_mode: Some(false),
        batch: Some(batch),
        max_reconsume_times: Some(16),
    }
}

fn subscription() -> SubscriptionData {
    SubscriptionData {
        class_filter_mode: false,
        topic: "TopicTest".into(),
        sub_string: "TagA || TagB".into(),
        tags_set: vec!["TagA".into(), "TagB".into()],
        code_set: vec![2_598_919, 2_598_920],
        sub_version: 1_700_000_000_000,
        expression_type: Some("TAG".into()),
    }
}

#[test]
fn every_code_round_trips() {
    let mut coverage = Coverage::default();

    // Sends: V1 long names, V2 short names, batch.
    let body = Bytes::from_static(b"payload");
    coverage.request(request::SEND_MESSAGE, &send_header(false), body.clone());
    for serialize_type in BOTH {
        for (code, header) in [
            (request::SEND_MESSAGE_V2, send_header(false)),
            (request::SEND_BATCH_MESSAGE, send_header(true)),
        ] {
            coverage.0.insert(code);
            let batch = vec![
                BatchMessage {
                    flag: 1,
                    body: Bytes::from_static(b"one"),
                    properties: "TAGS\u{1}A\u{2}".into(),
                },
                BatchMessage {
                    flag: 2,
                    body: Bytes::from_static(b"two"),
                    properties: String::new(),
                },
            ];
            let command = RemotingCommand::request(code, header.to_v2_ext())
                .with_body(encode_batch(&batch))
                .with_serialize_type(serialize_type);
            assert!(command.ext("b").is_some() && command.ext("topic").is_none());
            let decoded = through_frame(&command);
            assert_eq!(
                SendMessageRequestHeader::from_request(&decoded).unwrap(),
                header
            );
            if code == request::SEND_BATCH_MESSAGE {
                assert_eq!(decode_batch(&decoded.body).unwrap(), batch);
            }
        }
    }
    response_round_trip(
        response::SUCCESS,
        &SendMessageResponseHeader {
            msg_id: "7F00000100002A9F0000000000000100".into(),
            queue_id: 3,
            queue_offset: 77,
            transaction_id: None,
        },
        Bytes::new(),
    );

    // Pull and its response (the body is store records, opaque here).
    coverage.request(
        request::PULL_MESSAGE,
        &PullMessageRequestHeader {
            consumer_group: "G".into(),
            topic: "TopicTest".into(),
            queue_id: 1,
            queue_offset: 100,
            max_msg_nums: 32,
            sys_flag: PULL_FLAG_COMMIT_OFFSET | PULL_FLAG_SUSPEND | PULL_FLAG_SUBSCRIPTION,
            commit_offset: 90,
            suspend_timeout_millis: 15_000,
            subscription: Some("TagA".into()),
            sub_version: 5,
            expression_type: Some("TAG".into()),
            quiver_epoch: Some(3),
        },
        Bytes::new(),
    );
    for status in [
        response::SUCCESS,
        response::PULL_NOT_FOUND,
        response::PULL_RETRY_IMMEDIATELY,
        response::PULL_OFFSET_MOVED,
    ] {
        response_round_trip(
            status,
            &PullMessageResponseHeader {
                suggest_which_broker_id: 0,
                next_begin_offset: 132,
                min_offset: 3,
                max_offset: 500,
                quiver_epoch: Some(4),
            },
            Bytes::from_static(b"records"),
        );
    }

    // Offsets.
    coverage.request(
        request::QUERY_CONSUMER_OFFSET,
        &QueryConsumerOffsetRequestHeader {
            consumer_group: "G".into(),
            topic: "T".into(),
            queue_id: 2,
            set_zero_if_not_found: None,
        },
        Bytes::new(),
    );
    response_round_trip(
        response::SUCCESS,
        &QueryConsumerOffsetResponseHeader { offset: 250 },
        Bytes::new(),
    );
    let update = UpdateConsumerOffsetRequestHeader {
        consumer_group: "G".into(),
        topic: "T".into(),
        queue_id: 2,
        commit_offset: 251,
    };
    for command in coverage.request(request::UPDATE_CONSUMER_OFFSET, &update, Bytes::new()) {
        assert!(!command.is_oneway());
    }
    let oneway =
        RemotingCommand::request(request::UPDATE_CONSUMER_OFFSET, update.to_ext()).into_oneway();
    assert!(through_frame(&oneway).is_oneway());
    coverage.request(
        request::GET_MAX_OFFSET,
        &GetMaxOffsetRequestHeader {
            topic: "T".into(),
            queue_id: 1,
        },
        Bytes::new(),
    );
    response_round_trip(
        response::SUCCESS,
        &GetMaxOffsetResponseHeader { offset: 1000 },
        Bytes::new(),
    );
    coverage.request(
        request::GET_MIN_OFFSET,
        &GetMinOffsetRequestHeader {
            topic: "T".into(),
            queue_id: 1,
        },
        Bytes::new(),
    );
    response_round_trip(
        response::SUCCESS,
        &GetMinOffsetResponseHeader { offset: 10 },
        Bytes::new(),
    );
    coverage.request(
        request::SEARCH_OFFSET_BY_TIMESTAMP,
        &SearchOffsetRequestHeader {
            topic: "T".into(),
            queue_id: 1,
            timestamp: 1_700_000_000_000,
        },
        Bytes::new(),
    );
    response_round_trip(
        response::SUCCESS,
        &SearchOffsetResponseHeader { offset: 42 },
        Bytes::new(),
    );
    coverage.request(
        request::GET_EARLIEST_MSG_STORETIME,
        &GetEarliestMsgStoretimeRequestHeader {
            topic: "T".into(),
            queue_id: 0,
        },
        Bytes::new(),
    );
    response_round_trip(
        response::SUCCESS,
        &GetEarliestMsgStoretimeResponseHeader {
            timestamp: 1_700_000_000_000,
        },
        Bytes::new(),
    );
    coverage.request(
        request::VIEW_MESSAGE_BY_ID,
        &ViewMessageRequestHeader { offset: 4096 },
        Bytes::new(),
    );

    // Clients and groups.
    let heartbeat = HeartbeatData {
        client_id: "10.0.0.1@4242".into(),
        producer_data_set: vec![ProducerData {
            group_name: "PG".into(),
        }],
        consumer_data_set: vec![ConsumerData {
            group_name: "G".into(),
            consume_type: ConsumeType::ConsumePassively,
            message_model: MessageModel::Clustering,
            consume_from_where: ConsumeFromWhere::FirstOffset,
            subscription_data_set: vec![subscription()],
            unit_mode: false,
        }],
    };
    for command in coverage.body_only(request::HEART_BEAT, heartbeat.encode()) {
        assert_eq!(HeartbeatData::decode(&command.body).unwrap(), heartbeat);
    }
    coverage.request(
        request::UNREGISTER_CLIENT,
        &UnregisterClientRequestHeader {
            client_id: "10.0.0.1@4242".into(),
            producer_group: None,
            consumer_group: Some("G".into()),
        },
        Bytes::new(),
    );
    coverage.request(
        request::CONSUMER_SEND_MSG_BACK,
        &ConsumerSendMsgBackRequestHeader {
            offset: 123_456,
            group: "G".into(),
            delay_level: 0,
            origin_msg_id: Some("7F00000100002A9F000000000001E240".into()),
            origin_topic: Some("TopicTest".into()),
            unit_mode: Some(false),
            max_reconsume_times: Some(3),
        },
        Bytes::new(),
    );
    coverage.request(
        request::GET_CONSUMER_LIST_BY_GROUP,
        &GetConsumerListByGroupRequestHeader {
            consumer_group: "G".into(),
        },
        Bytes::new(),
    );
    let members = GetConsumerListByGroupResponseBody {
        consumer_id_list: vec!["c1".into(), "c2".into()],
    };
    assert_eq!(
        GetConsumerListByGroupResponseBody::decode(&members.encode()).unwrap(),
        members
    );
    coverage.request(
        request::NOTIFY_CONSUMER_IDS_CHANGED,
        &NotifyConsumerIdsChangedRequestHeader {
            consumer_group: "G".into(),
        },
        Bytes::new(),
    );
    let lock = LockBatchRequestBody {
        consumer_group: "G".into(),
        client_id: "c1".into(),
        mq_set: vec![mq(0), mq(1)],
        only_this_broker: true,
    };
    for code in [request::LOCK_BATCH_MQ, request::UNLOCK_BATCH_MQ] {
        for command in coverage.body_only(code, lock.encode()) {
            assert_eq!(LockBatchRequestBody::decode(&command.body).unwrap(), lock);
        }
    }
    let locked = LockBatchResponseBody {
        lock_ok_mq_set: vec![mq(1)],
    };
    assert_eq!(
        LockBatchResponseBody::decode(&locked.encode()).unwrap(),
        locked
    );

    // Topics and routes.
    coverage.request(
        request::UPDATE_AND_CREATE_TOPIC,
        &CreateTopicRequestHeader {
            topic: "NewTopic".into(),
            default_topic: Some("TBW102".into()),
            read_queue_nums: 8,
            write_queue_nums: 8,
            perm: perm::READ_WRITE,
            topic_filter_type: Some("SINGLE_TAG".into()),
            topic_sys_flag: Some(0),
            order: Some(true),
        },
        Bytes::new(),
    );
    coverage.request(
        request::DELETE_TOPIC_IN_BROKER,
        &DeleteTopicRequestHeader {
            topic: "OldTopic".into(),
        },
        Bytes::new(),
    );
    coverage.request(
        request::GET_ROUTEINFO_BY_TOPIC,
        &GetRouteInfoRequestHeader {
            topic: "TopicTest".into(),
        },
        Bytes::new(),
    );
    let broker = |name: &str, port: u16| BrokerData {
        cluster: "quiver".into(),
        broker_name: name.into(),
        broker_addrs: BTreeMap::from([(0, format!("127.0.0.1:{port}"))]),
        enable_acting_master: false,
    };
    let route = TopicRouteData {
        order_topic_conf: None,
        queue_datas: vec![
            QueueData {
                broker_name: "broker-0".into(),
                read_queue_nums: 4,
                write_queue_nums: 4,
                perm: perm::READ_WRITE,
                topic_sys_flag: 0,
            },
            QueueData {
                broker_name: "broker-1".into(),
                read_queue_nums: 4,
                write_queue_nums: 4,
                perm: perm::READ_ONLY,
                topic_sys_flag: 0,
            },
        ],
        broker_datas: vec![broker("broker-0", 10911), broker("broker-1", 10921)],
        filter_server_table: HashMap::new(),
    };
    for command in response_round_trip(response::SUCCESS, &NoHeader, route.encode()) {
        assert_eq!(TopicRouteData::decode(&command.body).unwrap(), route);
    }
    coverage.body_only(request::GET_BROKER_CLUSTER_INFO, Bytes::new());
    let cluster = ClusterInfo {
        broker_addr_table: BTreeMap::from([
            ("broker-0".into(), broker("broker-0", 10911)),
            ("broker-1".into(), broker("broker-1", 10921)),
        ]),
        cluster_addr_table: BTreeMap::from([(
            "quiver".into(),
            BTreeSet::from(["broker-0".into(), "broker-1".into()]),
        )]),
    };
    for command in response_round_trip(response::SUCCESS, &NoHeader, cluster.encode()) {
        assert_eq!(ClusterInfo::decode(&command.body).unwrap(), cluster);
    }

    // Admin: stats, connections, groups, broker config, resets.
    coverage.request(
        request::GET_CONSUME_STATS,
        &GetConsumeStatsRequestHeader {
            consumer_group: "G".into(),
            topic: Some("TopicTest".into()),
            mark_uncommitted: None,
        },
        Bytes::new(),
    );
    let stats = ConsumeStats {
        offset_table: BTreeMap::from([(
            mq(0),
            OffsetWrapper {
                broker_offset: 10,
                consumer_offset: 8,
                last_timestamp: 1_700_000_000_000,
            },
        )]),
        consume_tps: 2.5,
    };
    for command in response_round_trip(response::SUCCESS, &NoHeader, stats.encode()) {
        assert_eq!(ConsumeStats::decode(&command.body).unwrap(), stats);
    }
    coverage.request(
        request::GET_TOPIC_STATS_INFO,
        &GetTopicStatsInfoRequestHeader {
            topic: "TopicTest".into(),
        },
        Bytes::new(),
    );
    let topic_stats = TopicStatsTable {
        offset_table: BTreeMap::from([(
            mq(2),
            TopicOffset {
                min_offset: 0,
                max_offset: 12,
                last_update_timestamp: 1_700_000_000_000,
            },
        )]),
    };
    assert_eq!(
        TopicStatsTable::decode(&topic_stats.encode()).unwrap(),
        topic_stats
    );
    coverage.request(
        request::GET_CONSUMER_CONNECTION_LIST,
        &GetConsumerConnectionListRequestHeader {
            consumer_group: "G".into(),
        },
        Bytes::new(),
    );
    let connections = ConsumerConnection {
        connection_set: vec![Connection {
            client_id: "c1".into(),
            client_addr: "127.0.0.1:50000".into(),
            language: "CPP".into(),
            version: 63,
        }],
        subscription_table: BTreeMap::from([("TopicTest".into(), subscription())]),
        consume_type: ConsumeType::ConsumePassively,
        message_model: MessageModel::Clustering,
        consume_from_where: ConsumeFromWhere::LastOffset,
    };
    assert_eq!(
        ConsumerConnection::decode(&connections.encode()).unwrap(),
        connections
    );
    let group = SubscriptionGroupConfig {
        retry_max_times: 3,
        ..SubscriptionGroupConfig::named("G")
    };
    for command in coverage.body_only(request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, group.encode())
    {
        assert_eq!(
            SubscriptionGroupConfig::decode(&command.body).unwrap(),
            group
        );
    }
    coverage.body_only(request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG, Bytes::new());
    let groups = SubscriptionGroupWrapper {
        subscription_group_table: BTreeMap::from([("G".into(), group.clone())]),
        data_version: DataVersion {
            timestamp: 1_700_000_000_000,
            counter: 3,
        },
    };
    assert_eq!(
        SubscriptionGroupWrapper::decode(&groups.encode()).unwrap(),
        groups
    );
    coverage.request(
        request::DELETE_SUBSCRIPTIONGROUP,
        &DeleteSubscriptionGroupRequestHeader {
            group_name: "G".into(),
            clean_offset: Some(true),
        },
        Bytes::new(),
    );
    let settings = BTreeMap::from([("brokerPermission".to_owned(), "4".to_owned())]);
    for command in coverage.body_only(
        request::UPDATE_BROKER_CONFIG,
        encode_properties_text(&settings),
    ) {
        assert_eq!(decode_properties_text(&command.body).unwrap(), settings);
    }
    coverage.body_only(request::GET_BROKER_CONFIG, Bytes::new());
    for command in response_round_trip(
        response::SUCCESS,
        &GetBrokerConfigResponseHeader {
            version: "{\"counter\":1}".into(),
        },
        encode_properties_text(&settings),
    ) {
        assert_eq!(decode_properties_text(&command.body).unwrap(), settings);
    }
    coverage.request(
        request::INVOKE_BROKER_TO_RESET_OFFSET,
        &ResetOffsetRequestHeader {
            topic: "TopicTest".into(),
            group: "G".into(),
            timestamp: 1_700_000_000_000,
            is_force: true,
        },
        Bytes::new(),
    );
    let reset = ResetOffsetBody {
        offset_table: BTreeMap::from([(mq(0), 5), (mq(1), 9)]),
    };
    for command in coverage.request(
        request::RESET_CONSUMER_CLIENT_OFFSET,
        &ResetOffsetClientHeader {
            topic: "TopicTest".into(),
            group: "G".into(),
            timestamp: 1_700_000_000_000,
            is_force: false,
        },
        reset.encode(),
    ) {
        assert_eq!(ResetOffsetBody::decode(&command.body).unwrap(), reset);
    }
    coverage.request(
        request::GET_CONSUMER_STATUS_FROM_CLIENT,
        &GetConsumerStatusRequestHeader {
            topic: "TopicTest".into(),
            group: "G".into(),
            client_addr: Some("127.0.0.1:50000".into()),
        },
        Bytes::new(),
    );
    coverage.request(
        request::GET_CONSUMER_RUNNING_INFO,
        &GetConsumerRunningInfoRequestHeader {
            consumer_group: "G".into(),
            client_id: "c1".into(),
            jstack_enable: Some(false),
        },
        Bytes::new(),
    );
    coverage.request(
        request::QUERY_MESSAGE,
        &QueryMessageRequestHeader {
            topic: "T".into(),
            key: "k1".into(),
            max_num: 32,
            begin_timestamp: 0,
            end_timestamp: 1_700_000_000_000,
        },
        Bytes::new(),
    );

    coverage.request(
        request::GET_KV_CONFIG,
        &GetKvConfigRequestHeader {
            namespace: "ORDER_TOPIC_CONFIG".into(),
            key: "TopicTest".into(),
        },
        Bytes::new(),
    );
    response_round_trip(
        response::SUCCESS,
        &GetKvConfigResponseHeader {
            value: Some("broker-a:4".into()),
        },
        Bytes::new(),
    );
    coverage.request(
        request::GET_TOPICS_BY_CLUSTER,
        &GetTopicsByClusterRequestHeader {
            cluster: "quiver".into(),
        },
        Bytes::new(),
    );
    let topics = TopicList {
        topic_list: vec!["A".into(), "B".into()],
        broker_addr: None,
    };
    assert_eq!(TopicList::decode(&topics.encode()).unwrap(), topics);
    coverage.request(
        request::QUERY_TOPIC_CONSUME_BY_WHO,
        &QueryTopicConsumeByWhoRequestHeader {
            topic: "TopicTest".into(),
        },
        Bytes::new(),
    );
    let consumers_of_topic = GroupList {
        group_list: vec!["G".into()],
    };
    assert_eq!(
        GroupList::decode(&consumers_of_topic.encode()).unwrap(),
        consumers_of_topic
    );
    let check = CheckClientRequestBody {
        client_id: "c1".into(),
        group: "G".into(),
        subscription_data: subscription(),
    };
    for command in coverage.body_only(request::CHECK_CLIENT_CONFIG, check.encode()) {
        assert_eq!(
            CheckClientRequestBody::decode(&command.body).unwrap(),
            check
        );
    }

    let issue_codes = [
        10, 310, 320, 11, 14, 15, 30, 31, 29, 34, 35, 36, 38, 41, 42, 17, 105, 106, 208, 25, 26,
        200, 201, 207, 202, 203, 215, 222, 220, 40, 221, 307, 46,
    ];
    let missing: Vec<i32> = issue_codes
        .iter()
        .copied()
        .filter(|code| !coverage.0.contains(code))
        .collect();
    assert!(
        missing.is_empty(),
        "codes without a round trip: {missing:?}"
    );
}

/// A response whose payload is all in the body.
#[derive(Debug, PartialEq)]
struct NoHeader;

impl CommandHeader for NoHeader {
    fn from_ext(ext: &ExtFields) -> Result<Self, quiver_protocol::HeaderError> {
        assert!(ext.is_empty());
        Ok(NoHeader)
    }
    fn to_ext(&self) -> ExtFields {
        ExtFields::default()
    }
}

#[test]
fn request_code_not_supported_response_names_the_code() {
    let request = RemotingCommand::request(9999, ExtFields::default()).with_opaque(5);
    let name = request::name(request.code).unwrap_or("unknown");
    let response = request.response_to(
        response::REQUEST_CODE_NOT_SUPPORTED,
        Some(format!(
            "request code {} ({name}) is not supported",
            request.code
        )),
    );
    let decoded = through_frame(&response);
    assert_eq!(decoded.code, 3);
    assert!(decoded.remark.unwrap().contains("9999"));
}

/// The headers and bodies of the mqadmin calls, the relayed requests and request-reply.
#[test]
fn tools_relay_and_reply_codes_round_trip() {
    let mut coverage = Coverage::default();
    coverage.request(
        request::GET_PRODUCER_CONNECTION_LIST,
        &GetProducerConnectionListRequestHeader {
            producer_group: "PG".into(),
        },
        Bytes::new(),
    );
    let producers = ProducerConnection {
        connection_set: vec![Connection {
            client_id: "127.0.0.1@1".into(),
            client_addr: "127.0.0.1:5000".into(),
            language: "JAVA".into(),
            version: 401,
        }],
    };
    assert_eq!(
        ProducerConnection::decode(&producers.encode()).unwrap(),
        producers
    );
    coverage.request(
        request::DELETE_TOPIC_IN_NAMESRV,
        &DeleteTopicFromNamesrvRequestHeader {
            topic: "TopicTest".into(),
        },
        Bytes::new(),
    );
    coverage.request(
        request::CLONE_GROUP_OFFSET,
        &CloneGroupOffsetRequestHeader {
            src_group: "A".into(),
            dest_group: "B".into(),
            topic: None,
            offline: Some(true),
        },
        Bytes::new(),
    );
    coverage.request(
        request::CONSUME_MESSAGE_DIRECTLY,
        &ConsumeMessageDirectlyResultRequestHeader {
            consumer_group: "G".into(),
            client_id: Some("c1".into()),
            msg_id: Some("7F0000010000271100000000000003E8".into()),
            broker_name: Some("broker-a".into()),
        },
        Bytes::new(),
    );
    coverage.request(
        request::PUSH_REPLY_MESSAGE_TO_CLIENT,
        &ReplyMessageRequestHeader {
            producer_group: "PG".into(),
            topic: "DefaultCluster_REPLY_TOPIC".into(),
            default_topic: "TBW102".into(),
            default_topic_queue_nums: 4,
            queue_id: 0,
            sys_flag: 0,
            born_timestamp: 1_700_000_000_000,
            flag: 0,
            properties: Some("CORRELATION_ID\u{1}c\u{2}".into()),
            reconsume_times: Some(0),
            unit_mode: Some(false),
            born_host: "127.0.0.1:5000".into(),
            store_host: "127.0.0.1:10911".into(),
            store_timestamp: 1_700_000_000_001,
        },
        Bytes::from_static(b"reply"),
    );
    let info = ConsumerRunningInfo {
        properties: BTreeMap::from([("PROP_CONSUME_TYPE".into(), "CONSUME_PASSIVELY".into())]),
        subscription_set: vec![subscription()],
        mq_table: BTreeMap::from([(
            mq(1),
            ProcessQueueInfo {
                commit_offset: 5,
                cached_msg_min_offset: 5,
                cached_msg_max_offset: 9,
                cached_msg_count: 5,
                cached_msg_size_in_mi_b: 0,
                locked: false,
                droped: false,
            },
        )]),
        jstack: None,
    };
    let encoded = info.encode();
    let text = std::str::from_utf8(&encoded).unwrap();
    // Apache's field names, and the queue as a fastjson object key.
    for field in [
        "mqTable",
        "cachedMsgSizeInMiB",
        "droped",
        "subscriptionSet",
        "{\"brokerName\"",
    ] {
        assert!(text.contains(field), "{field} in {text}");
    }
    assert_eq!(ConsumerRunningInfo::decode(&encoded).unwrap(), info);
}
