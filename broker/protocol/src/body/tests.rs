use super::*;
use serde_json::Value;

#[test]
fn consume_stats_reads_java_fastjson_with_object_keys() {
    let java = br#"{"consumeTps":1.5,"offsetTable":{{"brokerName":"broker-a","queueId":0,"topic":"T"}:{"brokerOffset":10,"consumerOffset":4,"lastTimestamp":1700000000000},{"brokerName":"broker-a","queueId":1,"topic":"T"}:{"brokerOffset":"3","consumerOffset":3,"lastTimestamp":0}}}"#;
    let stats = ConsumeStats::decode(java).unwrap();
    assert_eq!(stats.consume_tps, 1.5);
    let queue0 = MessageQueue::new("T", "broker-a", 0);
    assert_eq!(stats.offset_table[&queue0].broker_offset, 10);
    assert_eq!(stats.offset_table[&queue0].consumer_offset, 4);
    assert_eq!(
        stats.offset_table[&MessageQueue::new("T", "broker-a", 1)].broker_offset,
        3
    );
    assert_eq!(stats.total_diff(), 6);
}

#[test]
fn consume_stats_encodes_object_keys_like_fastjson_and_reads_them_back() {
    let mut stats = ConsumeStats::default();
    stats.offset_table.insert(
        MessageQueue::new("T", "b", 2),
        OffsetWrapper {
            broker_offset: 9,
            consumer_offset: 7,
            last_timestamp: 5,
        },
    );
    let encoded = stats.encode();
    assert_eq!(
        std::str::from_utf8(&encoded).unwrap(),
        r#"{"consumeTps":0.0,"offsetTable":{{"brokerName":"b","queueId":2,"topic":"T"}:{"brokerOffset":9,"consumerOffset":7,"lastTimestamp":5}}}"#
    );
    assert_eq!(ConsumeStats::decode(&encoded).unwrap(), stats);
}

#[test]
fn reset_offset_body_and_topic_stats_round_trip_through_fastjson_form() {
    let mut reset = ResetOffsetBody::default();
    reset
        .offset_table
        .insert(MessageQueue::new("T", "b", 0), 42);
    reset.offset_table.insert(MessageQueue::new("T", "b", 1), 0);
    let encoded = reset.encode();
    assert!(encoded.starts_with(br#"{"offsetTable":{{"brokerName""#));
    assert_eq!(ResetOffsetBody::decode(&encoded).unwrap(), reset);

    let mut stats = TopicStatsTable::default();
    stats.offset_table.insert(
        MessageQueue::new("T", "b", 3),
        TopicOffset {
            min_offset: 1,
            max_offset: 8,
            last_update_timestamp: 99,
        },
    );
    assert_eq!(TopicStatsTable::decode(&stats.encode()).unwrap(), stats);
}

#[test]
fn unquoted_integer_keys_are_read_and_can_be_written() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct OffsetTable {
        offset_table: BTreeMap<String, BTreeMap<u32, i64>>,
    }
    let java = br#"{"offsetTable":{"T@g":{0:250,1:7}}}"#;
    let table: OffsetTable = decode_json(java, "offsets").unwrap();
    assert_eq!(table.offset_table["T@g"][&0], 250);
    assert_eq!(table.offset_table["T@g"][&1], 7);
    let written = encode_json(&table, IntegerKeys::Unquoted, "offsets").unwrap();
    assert_eq!(&written[..], java);
    let quoted = encode_json(&table, IntegerKeys::Quoted, "offsets").unwrap();
    assert_eq!(&quoted[..], br#"{"offsetTable":{"T@g":{"0":250,"1":7}}}"#);
}

#[test]
fn route_data_is_standard_json_with_quoted_broker_ids() {
    let route = TopicRouteData {
        order_topic_conf: None,
        queue_datas: vec![QueueData {
            broker_name: "broker-a".into(),
            read_queue_nums: 4,
            write_queue_nums: 4,
            perm: perm::READ_WRITE,
            topic_sys_flag: 0,
        }],
        broker_datas: vec![BrokerData {
            cluster: "DefaultCluster".into(),
            broker_name: "broker-a".into(),
            broker_addrs: BTreeMap::from([(0, "127.0.0.1:10911".into())]),
            enable_acting_master: false,
        }],
        filter_server_table: HashMap::new(),
    };
    let encoded = route.encode();
    let text = std::str::from_utf8(&encoded).unwrap();
    assert!(
        text.contains(r#""brokerAddrs":{"0":"127.0.0.1:10911"}"#),
        "{text}"
    );
    assert!(text.contains(r#""enableActingMaster":false"#), "{text}");
    serde_json::from_str::<Value>(text).expect("standard JSON for jsoncpp");
    let decoded = TopicRouteData::decode(&encoded).unwrap();
    assert_eq!(decoded, route);
    assert_eq!(
        decoded.broker_datas[0].master_addr(),
        Some("127.0.0.1:10911")
    );
}

#[test]
fn route_data_accepts_old_spelling_and_unquoted_ids() {
    let java = br#"{"queueDatas":[{"brokerName":"b","readQueueNums":"8","writeQueueNums":8,"perm":4,"topicSynFlag":0}],"brokerDatas":[{"cluster":"c","brokerName":"b","brokerAddrs":{0:"h:1",1:"h:2"}}],"filterServerTable":null}"#;
    let route = TopicRouteData::decode(java).unwrap();
    assert_eq!(route.queue_datas[0].read_queue_nums, 8);
    assert!(!perm::is_writeable(route.queue_datas[0].perm));
    assert!(perm::is_readable(route.queue_datas[0].perm));
    assert_eq!(route.broker_datas[0].broker_addrs[&1], "h:2");
    assert!(route.filter_server_table.is_empty());
}

#[test]
fn heartbeat_accepts_enum_names_ordinals_and_string_numbers() {
    let java = br#"{"clientID":"10.0.0.1@123","producerDataSet":[{"groupName":"PG"}],
        "consumerDataSet":[{"groupName":"G","consumeType":"CONSUME_PASSIVELY",
        "messageModel":"BROADCASTING","consumeFromWhere":"CONSUME_FROM_TIMESTAMP",
        "subscriptionDataSet":[{"classFilterMode":false,"topic":"T","subString":"a||b",
        "tagsSet":["a","b"],"codeSet":[97,"98"],"subVersion":"17","expressionType":"TAG"}],
        "unitMode":false}],"heartbeatFingerprint":1}"#;
    let heartbeat = HeartbeatData::decode(java).unwrap();
    assert_eq!(heartbeat.client_id, "10.0.0.1@123");
    assert_eq!(heartbeat.producer_data_set[0].group_name, "PG");
    let consumer = &heartbeat.consumer_data_set[0];
    assert_eq!(consumer.consume_type, ConsumeType::ConsumePassively);
    assert_eq!(consumer.message_model, MessageModel::Broadcasting);
    assert_eq!(consumer.consume_from_where, ConsumeFromWhere::Timestamp);
    assert_eq!(consumer.subscription_data_set[0].code_set, vec![97, 98]);
    assert_eq!(consumer.subscription_data_set[0].sub_version, 17);

    let cpp = br#"{"clientID":"c","consumerDataSet":[{"consumeFromWhere":4,"consumeType":1,"groupName":"G","messageModel":"1"}]}"#;
    let heartbeat = HeartbeatData::decode(cpp).unwrap();
    let consumer = &heartbeat.consumer_data_set[0];
    assert_eq!(consumer.consume_from_where, ConsumeFromWhere::FirstOffset);
    assert_eq!(consumer.message_model, MessageModel::Clustering);
    assert!(heartbeat.producer_data_set.is_empty());
    assert!(consumer.subscription_data_set.is_empty());

    let encoded = heartbeat.encode();
    assert!(std::str::from_utf8(&encoded)
        .unwrap()
        .contains(r#""consumeFromWhere":"CONSUME_FROM_FIRST_OFFSET""#));
    assert_eq!(HeartbeatData::decode(&encoded).unwrap(), heartbeat);
}

#[test]
fn unknown_enum_values_are_errors() {
    let error =
        HeartbeatData::decode(br#"{"consumerDataSet":[{"messageModel":"SIDEWAYS"}]}"#).unwrap_err();
    assert!(error.to_string().contains("HeartbeatData"), "{error}");
    assert!(HeartbeatData::decode(br#"{"consumerDataSet":[{"consumeType":9}]}"#).is_err());
}

#[test]
fn invalid_json_and_utf8_are_typed_errors() {
    assert!(matches!(
        HeartbeatData::decode(b"{not json"),
        Err(BodyError::Json { .. })
    ));
    assert!(matches!(
        HeartbeatData::decode(&[0xff, 0xfe]),
        Err(BodyError::Utf8 { .. })
    ));
}

#[test]
fn lock_bodies_match_java_names() {
    let request = LockBatchRequestBody {
        consumer_group: "G".into(),
        client_id: "c".into(),
        mq_set: vec![MessageQueue::new("T", "b", 1)],
        only_this_broker: false,
    };
    let text = String::from_utf8(request.encode().to_vec()).unwrap();
    assert!(
        text.contains(r#""mqSet":[{"brokerName":"b","queueId":1,"topic":"T"}]"#),
        "{text}"
    );
    assert_eq!(
        LockBatchRequestBody::decode(text.as_bytes()).unwrap(),
        request
    );
    let response = LockBatchResponseBody {
        lock_ok_mq_set: request.mq_set.clone(),
    };
    let text = String::from_utf8(response.encode().to_vec()).unwrap();
    assert!(text.starts_with(r#"{"lockOKMQSet":["#), "{text}");
}

#[test]
fn subscription_group_defaults_match_rocketmq() {
    let config = SubscriptionGroupConfig::decode(br#"{"groupName":"G"}"#).unwrap();
    assert_eq!(config, SubscriptionGroupConfig::named("G"));
    assert_eq!(config.retry_max_times, 16);
    assert!(config.consume_enable);
    let topic = TopicConfig::decode(br#"{"topicName":"T","order":"true"}"#).unwrap();
    assert_eq!(topic.perm, 6);
    assert!(topic.order);
}

#[test]
fn cluster_info_round_trips() {
    let broker = BrokerData {
        cluster: "c".into(),
        broker_name: "b".into(),
        broker_addrs: BTreeMap::from([(0, "h:1".into())]),
        enable_acting_master: false,
    };
    let info = ClusterInfo {
        broker_addr_table: BTreeMap::from([("b".into(), broker)]),
        cluster_addr_table: BTreeMap::from([("c".into(), BTreeSet::from(["b".into()]))]),
    };
    assert_eq!(ClusterInfo::decode(&info.encode()).unwrap(), info);
}

#[test]
fn properties_text_round_trips_and_skips_comments() {
    let properties = BTreeMap::from([
        ("brokerPermission".to_owned(), "4".to_owned()),
        ("flushDiskType".to_owned(), "ASYNC_FLUSH".to_owned()),
    ]);
    let encoded = encode_properties_text(&properties);
    assert_eq!(
        &encoded[..],
        b"brokerPermission=4\nflushDiskType=ASYNC_FLUSH\n"
    );
    assert_eq!(decode_properties_text(&encoded).unwrap(), properties);
    let java = b"#comment\r\nbrokerPermission = 6\r\n\r\nurl=a=b\n";
    let decoded = decode_properties_text(java).unwrap();
    assert_eq!(decoded["brokerPermission"], "6");
    assert_eq!(decoded["url"], "a=b");
    assert!(decode_properties_text(b"novalue\n").is_err());
}

#[test]
fn encode_json_reports_unserializable_keys() {
    let tuple_keys = HashMap::from([((1, 2), 3)]);
    assert!(matches!(
        encode_json(&tuple_keys, IntegerKeys::Quoted, "tuples"),
        Err(BodyError::Json { what: "tuples", .. })
    ));
}

#[test]
fn reset_offset_body_for_the_cpp_client_is_an_array_with_offsets() {
    let reset = ResetOffsetBody {
        offset_table: BTreeMap::from([
            (MessageQueue::new("T", "b", 0), 42),
            (MessageQueue::new("T", "b", 1), 7),
        ]),
    };
    let cpp = reset.encode_for_language("CPP");
    assert_eq!(
        std::str::from_utf8(&cpp).unwrap(),
        r#"{"offsetTable":[{"brokerName":"b","offset":42,"queueId":0,"topic":"T"},{"brokerName":"b","offset":7,"queueId":1,"topic":"T"}]}"#
    );
    assert_eq!(ResetOffsetBody::decode(&cpp).unwrap(), reset);
    assert_eq!(reset.encode_for_language("JAVA"), reset.encode());
    assert_eq!(ResetOffsetBody::decode(&reset.encode()).unwrap(), reset);
    assert!(ResetOffsetBody::decode(br#"{"offsetTable":5}"#).is_err());
    assert!(ResetOffsetBody::decode(br#"{"offsetTable":null}"#)
        .unwrap()
        .offset_table
        .is_empty());
}

#[test]
fn kv_table_reads_apache_runtime_info_and_round_trips() {
    let java = br#"{"table":{"commitLogDiskRatio":"0.93","commitLogDirCapacity":"Total : 48.0 MiB, Free : 3.1 MiB."}}"#;
    let table = KvTable::decode(java).unwrap();
    assert_eq!(table.table["commitLogDiskRatio"], "0.93");
    assert_eq!(KvTable::decode(&table.encode()).unwrap(), table);
}
