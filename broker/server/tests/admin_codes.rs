//! Admin codes the CLI and operator use, and consumer management pushes: heartbeats, group
//! listing, NOTIFY_CONSUMER_IDS_CHANGED, stats, reset (with its 220 push) and deletes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ext, ext_u64, test_config, Client, TestBroker};
use quiver_protocol::code::{request, response};

fn heartbeat_body(client_id: &str) -> Bytes {
    // Enums as ordinals, as the C++ client sends them.
    Bytes::from(format!(
        r#"{{"clientID":"{client_id}","consumerDataSet":[{{"consumeFromWhere":0,"consumeType":1,"groupName":"AG","messageModel":1,
        "subscriptionDataSet":[{{"subString":"*","subVersion":"1","topic":"Adm"}}]}}],"producerDataSet":[]}}"#
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_codes_and_consumer_pushes() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut admin = broker.client().await;
    let created = admin.create_topic("Adm", 2).await;
    assert_eq!(created.code, response::SUCCESS);
    for i in 0..4 {
        admin.send("Adm", i % 2, &format!("m{i}"), "A").await;
    }

    // Two members join; the first is told when the second arrives.
    let mut first = broker.client().await;
    let mut second = broker.client().await;
    assert_eq!(
        first
            .call(
                request::HEART_BEAT,
                Default::default(),
                heartbeat_body("c1")
            )
            .await
            .code,
        0
    );
    assert_eq!(
        second
            .call(
                request::HEART_BEAT,
                Default::default(),
                heartbeat_body("c2")
            )
            .await
            .code,
        0
    );
    let pushed = first.read().await.expect("ids-changed push");
    assert_eq!(pushed.code, request::NOTIFY_CONSUMER_IDS_CHANGED);
    assert_eq!(pushed.ext("consumerGroup"), Some("AG"));
    let list = admin
        .call(
            request::GET_CONSUMER_LIST_BY_GROUP,
            ext(&[("consumerGroup", "AG")]),
            Bytes::new(),
        )
        .await;
    let list: serde_json::Value = serde_json::from_slice(&list.body).unwrap();
    assert_eq!(list["consumerIdList"], serde_json::json!(["c1", "c2"]));
    let connections = admin
        .call(
            request::GET_CONSUMER_CONNECTION_LIST,
            ext(&[("consumerGroup", "AG")]),
            Bytes::new(),
        )
        .await;
    let connections: serde_json::Value = serde_json::from_slice(&connections.body).unwrap();
    assert_eq!(connections["connectionSet"].as_array().unwrap().len(), 2);
    assert_eq!(connections["messageModel"], "CLUSTERING");

    // A commit, then stats.
    first.pull("AG", "Adm", 0, 1, 0, Some(1)).await;
    let stats = admin
        .call(
            request::GET_CONSUME_STATS,
            ext(&[("consumerGroup", "AG"), ("topic", "Adm")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(stats.code, response::SUCCESS);
    let text = String::from_utf8_lossy(&stats.body).into_owned();
    assert!(
        text.contains(r#""consumerOffset":1"#) && text.contains(r#""brokerOffset":2"#),
        "{text}"
    );
    let topic_stats = admin
        .call(
            request::GET_TOPIC_STATS_INFO,
            ext(&[("topic", "Adm")]),
            Bytes::new(),
        )
        .await;
    assert!(String::from_utf8_lossy(&topic_stats.body).contains(r#""maxOffset":2"#));

    // Reset to the latest: offsets move and online members get RESET_CONSUMER_CLIENT_OFFSET.
    let reset = admin
        .call(
            request::INVOKE_BROKER_TO_RESET_OFFSET,
            ext(&[
                ("topic", "Adm"),
                ("group", "AG"),
                ("timestamp", "-1"),
                ("isForce", "true"),
            ]),
            Bytes::new(),
        )
        .await;
    assert_eq!(reset.code, response::SUCCESS, "{:?}", reset.remark);
    assert_eq!(
        ext_u64(&admin.query_offset("AG", "Adm", 0).await, "offset"),
        2
    );
    assert_eq!(
        ext_u64(&admin.query_offset("AG", "Adm", 1).await, "offset"),
        2
    );
    let pushed = loop {
        let command = second.read().await.expect("reset push");
        if command.code == request::RESET_CONSUMER_CLIENT_OFFSET {
            break command;
        }
    };
    assert_eq!(pushed.ext("group"), Some("AG"));

    // Broker config: read, then drain to read-only.
    let config = admin
        .call(request::GET_BROKER_CONFIG, Default::default(), Bytes::new())
        .await;
    assert!(String::from_utf8_lossy(&config.body).contains("brokerPermission=6"));
    let bad = admin
        .call(
            request::UPDATE_BROKER_CONFIG,
            Default::default(),
            Bytes::from_static(b"brokerPermission=5"),
        )
        .await;
    assert_eq!(bad.code, response::SYSTEM_ERROR);

    // Subscription groups: create, list, delete (drops the offsets too).
    let group = br#"{"groupName":"AG","retryMaxTimes":2}"#;
    let created = admin
        .call(
            request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            Default::default(),
            Bytes::from_static(group),
        )
        .await;
    assert_eq!(created.code, response::SUCCESS);
    let all = admin
        .call(
            request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let all: serde_json::Value = serde_json::from_slice(&all.body).unwrap();
    assert_eq!(all["subscriptionGroupTable"]["AG"]["retryMaxTimes"], 2);
    let deleted = admin
        .call(
            request::DELETE_SUBSCRIPTIONGROUP,
            ext(&[("groupName", "AG")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(deleted.code, response::SUCCESS);
    assert_eq!(
        admin.query_offset("AG", "Adm", 0).await.code,
        response::QUERY_NOT_FOUND
    );

    // A member leaving is announced to the rest.
    let left = second
        .call(
            request::UNREGISTER_CLIENT,
            ext(&[("clientID", "c2"), ("consumerGroup", "AG")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(left.code, response::SUCCESS);
    let notified = loop {
        let command = first.read().await.expect("push after unregister");
        if command.code == request::NOTIFY_CONSUMER_IDS_CHANGED {
            break command;
        }
    };
    assert_eq!(notified.ext("consumerGroup"), Some("AG"));
    drop(first);
    common::wait_for(
        "the closed member to leave",
        Duration::from_secs(10),
        || async {
            let mut probe = Client::connect(broker.addr).await;
            probe
                .call(
                    request::GET_CONSUMER_LIST_BY_GROUP,
                    ext(&[("consumerGroup", "AG")]),
                    Bytes::new(),
                )
                .await
                .code
                == response::SYSTEM_ERROR
        },
    )
    .await;

    // Topic deletion.
    let deleted = admin
        .call(
            request::DELETE_TOPIC_IN_BROKER,
            ext(&[("topic", "Adm")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(deleted.code, response::SUCCESS, "{:?}", deleted.remark);
    let gone = admin.pull("AG", "Adm", 0, 0, 0, None).await;
    assert_eq!(gone.code, response::TOPIC_NOT_EXIST);
    broker.stop().await;
}

fn topic_list(reply: &quiver_protocol::RemotingCommand) -> Vec<String> {
    assert_eq!(reply.code, response::SUCCESS, "{reply:?}");
    quiver_protocol::body::TopicList::decode(&reply.body)
        .unwrap()
        .topic_list
}

/// The calls of mqadmin and the dashboard: topic lists, name-server deletion, who consumes a
/// topic, producer connections and offset cloning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mqadmin_and_dashboard_calls() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(dir.path());
    let (cluster, broker_name) = (config.cluster.clone(), config.broker_name.clone());
    let broker = TestBroker::start(config).await;
    let mut admin = broker.client().await;
    let created = admin.create_topic("Tl", 2).await;
    assert_eq!(created.code, response::SUCCESS);

    // Topic lists: the cluster's topics, by cluster, and the system topics.
    let all = admin
        .call(
            request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
            Default::default(),
            Bytes::new(),
        )
        .await;
    assert_eq!(topic_list(&all), ["SCHEDULE_TOPIC_XXXX", "TBW102", "Tl"]);
    let by_cluster = |name: &str| ext(&[("cluster", name)]);
    let in_cluster = admin
        .call(
            request::GET_TOPICS_BY_CLUSTER,
            by_cluster(&cluster),
            Bytes::new(),
        )
        .await;
    assert_eq!(topic_list(&in_cluster), topic_list(&all));
    let elsewhere = admin
        .call(
            request::GET_TOPICS_BY_CLUSTER,
            by_cluster("Nope"),
            Bytes::new(),
        )
        .await;
    assert!(topic_list(&elsewhere).is_empty());
    let from_ns = admin
        .call(
            request::GET_SYSTEM_TOPIC_LIST_FROM_NS,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let mut names = vec![cluster.clone(), broker_name.clone()];
    names.sort();
    assert_eq!(topic_list(&from_ns), names);
    let ns_body: serde_json::Value = serde_json::from_slice(&from_ns.body).unwrap();
    assert_eq!(ns_body["brokerAddr"], broker.addr.to_string());
    let from_broker = admin
        .call(
            request::GET_SYSTEM_TOPIC_LIST_FROM_BROKER,
            Default::default(),
            Bytes::new(),
        )
        .await;
    let mut system = vec![
        cluster.clone(),
        broker_name.clone(),
        "SCHEDULE_TOPIC_XXXX".to_string(),
        "TBW102".to_string(),
    ];
    system.sort();
    assert_eq!(topic_list(&from_broker), system);

    // Who consumes Tl: a group with an offset on it and an online subscriber.
    admin.send("Tl", 0, "m0", "A").await;
    admin.pull("Committed", "Tl", 0, 1, 0, Some(1)).await;
    let mut member = broker.client().await;
    let subscriber = r#"{"clientID":"s1","consumerDataSet":[{"groupName":"Online","consumeType":"CONSUME_PASSIVELY","messageModel":"CLUSTERING","consumeFromWhere":"CONSUME_FROM_LAST_OFFSET","subscriptionDataSet":[{"topic":"Tl","subString":"*"}]}],"producerDataSet":[{"groupName":"PG"}]}"#;
    let joined = member
        .call(
            request::HEART_BEAT,
            Default::default(),
            Bytes::from(subscriber),
        )
        .await;
    assert_eq!(joined.code, response::SUCCESS);
    let by_who = admin
        .call(
            request::QUERY_TOPIC_CONSUME_BY_WHO,
            ext(&[("topic", "Tl")]),
            Bytes::new(),
        )
        .await;
    let groups = quiver_protocol::body::GroupList::decode(&by_who.body).unwrap();
    assert_eq!(groups.group_list, ["Committed", "Online"]);

    // The same heartbeat announced producer group PG.
    let producers = |admin_group: &str| ext(&[("producerGroup", admin_group)]);
    let listed = admin
        .call(
            request::GET_PRODUCER_CONNECTION_LIST,
            producers("PG"),
            Bytes::new(),
        )
        .await;
    assert_eq!(listed.code, response::SUCCESS, "{listed:?}");
    let body: serde_json::Value = serde_json::from_slice(&listed.body).unwrap();
    let connections = body["connectionSet"].as_array().unwrap();
    assert_eq!(connections.len(), 1);
    assert_eq!(connections[0]["clientId"], "s1");
    assert_eq!(connections[0]["language"], "RUST");
    assert_eq!(
        connections[0]["clientAddr"],
        member.stream.local_addr().unwrap().to_string()
    );
    let unknown = admin
        .call(
            request::GET_PRODUCER_CONNECTION_LIST,
            producers("Nobody"),
            Bytes::new(),
        )
        .await;
    assert_eq!(unknown.code, response::SYSTEM_ERROR);
    assert!(unknown.remark.unwrap().contains("not exist"));
    let left = member
        .call(
            request::UNREGISTER_CLIENT,
            ext(&[("clientID", "s1"), ("producerGroup", "PG")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(left.code, response::SUCCESS);
    let gone = admin
        .call(
            request::GET_PRODUCER_CONNECTION_LIST,
            producers("PG"),
            Bytes::new(),
        )
        .await;
    assert_eq!(gone.code, response::SYSTEM_ERROR);

    // Offsets cloned from one group to another.
    let clone = ext(&[
        ("srcGroup", "Committed"),
        ("destGroup", "Copy"),
        ("topic", "Tl"),
        ("offline", "true"),
    ]);
    let cloned = admin
        .call(request::CLONE_GROUP_OFFSET, clone, Bytes::new())
        .await;
    assert_eq!(cloned.code, response::SUCCESS, "{cloned:?}");
    assert_eq!(
        ext_u64(&admin.query_offset("Copy", "Tl", 0).await, "offset"),
        1
    );
    assert_eq!(
        admin.query_offset("Copy", "Tl", 1).await.code,
        response::QUERY_NOT_FOUND
    );

    // The name server forgets a topic only once the broker deleted it.
    let forget = || ext(&[("topic", "Tl")]);
    let early = admin
        .call(request::DELETE_TOPIC_IN_NAMESRV, forget(), Bytes::new())
        .await;
    assert_eq!(early.code, response::SYSTEM_ERROR);
    assert!(early.remark.unwrap().contains("DELETE_TOPIC_IN_BROKER"));
    let deleted = admin
        .call(request::DELETE_TOPIC_IN_BROKER, forget(), Bytes::new())
        .await;
    assert_eq!(deleted.code, response::SUCCESS);
    let forgotten = admin
        .call(request::DELETE_TOPIC_IN_NAMESRV, forget(), Bytes::new())
        .await;
    assert_eq!(forgotten.code, response::SUCCESS, "{forgotten:?}");
    let all = admin
        .call(
            request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
            Default::default(),
            Bytes::new(),
        )
        .await;
    assert!(!topic_list(&all).contains(&"Tl".to_string()));
    broker.stop().await;
}
