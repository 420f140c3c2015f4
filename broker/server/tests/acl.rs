//! ACL on: signed requests of an allowed account pass; a wrong secret, a missing permission,
//! a non-admin account calling an admin code and an unsigned request are refused with
//! NO_PERMISSION (16) and a remark, counted, and change nothing; the file is re-read when
//! it changes.

mod common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{ext, ext_u64, pulled_bodies, test_config, wait_for, Client, TestBroker};
use quiver_protocol::code::{request, response};
use quiver_protocol::{RemotingCommand, SerializeType};

const ACCOUNTS: &str = r#"
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
  - accessKey: consumer1
    secretKey: consumer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=SUB
    groupPerms:
      - Readers=SUB
  - accessKey: operator1
    secretKey: operator-secret
    admin: true
"#;

async fn start_with_acl(dir: &Path, accounts: &str) -> TestBroker {
    let acl_file = dir.join("plain_acl.yml");
    std::fs::write(&acl_file, accounts).unwrap();
    let mut config = test_config(&dir.join("data"));
    config.acl_file = Some(acl_file);
    TestBroker::start(config).await
}

/// A broker with [`ACCOUNTS`] and topic "Orders", and a client of the admin account.
async fn start_with_orders(dir: &Path, queues: u32) -> (TestBroker, Client) {
    let broker = start_with_acl(dir, ACCOUNTS).await;
    let mut admin = broker.client().await;
    admin = admin.signing("operator1", "operator-secret");
    let created = admin.create_topic("Orders", queues).await;
    assert_eq!(created.code, response::SUCCESS, "{created:?}");
    (broker, admin)
}

fn assert_refused(answer: &RemotingCommand, remark: &str) {
    assert_eq!(answer.code, response::NO_PERMISSION, "{answer:?}");
    let got = answer.remark.as_deref().unwrap_or_default();
    assert!(got.contains(remark), "remark `{got}` lacks `{remark}`");
}

/// Sum of the max offsets of the topic's queues, asked by the admin.
async fn stored(admin: &mut Client, topic: &str, queues: u32) -> u64 {
    let mut total = 0;
    for queue in 0..queues {
        let fields = ext(&[("topic", topic), ("queueId", &queue.to_string())]);
        let answer = admin
            .call(request::GET_MAX_OFFSET, fields, Bytes::new())
            .await;
        assert_eq!(answer.code, response::SUCCESS, "{answer:?}");
        total += ext_u64(&answer, "offset");
    }
    total
}

fn metric_value(metrics: &str, series: &str) -> u64 {
    metrics
        .lines()
        .find(|line| line.starts_with(series))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("{series} missing in\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_store_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, mut admin) = start_with_orders(dir.path(), 2).await;

    let mut producer = broker
        .client()
        .await
        .signing("producer1", "producer-secret");
    let sent = producer.send("Orders", 0, "allowed", "A").await;
    assert_eq!(sent.code, response::SUCCESS, "{sent:?}");
    // The binary (ROCKETMQ) header carries the same signed fields.
    producer.serialize_type = SerializeType::RocketMq;
    let sent = producer.send("Orders", 1, "allowed-binary", "A").await;
    assert_eq!(sent.code, response::SUCCESS, "{sent:?}");

    let mut wrong_secret = broker.client().await.signing("producer1", "not-the-secret");
    assert_refused(
        &wrong_secret.send("Orders", 0, "wrong", "A").await,
        "signature mismatch for access key \"producer1\"",
    );
    let mut consumer = broker
        .client()
        .await
        .signing("consumer1", "consumer-secret");
    assert_refused(
        &consumer.send("Orders", 0, "no-pub", "A").await,
        "access key \"consumer1\" has no PUB permission on topic \"Orders\"",
    );
    let mut unsigned = broker.client().await;
    assert_refused(
        &unsigned.send("Orders", 0, "unsigned", "A").await,
        "no signature",
    );
    let mut stranger = broker
        .client()
        .await
        .signing("stranger1", "whatever-secret");
    assert_refused(
        &stranger.send("Orders", 0, "stranger", "A").await,
        "no account has access key \"stranger1\"",
    );
    assert_eq!(stored(&mut admin, "Orders", 2).await, 2);

    refuse_admin_codes_to(&mut consumer).await;
    admin_sees_nothing_changed(&mut admin).await;

    // The consumer reads in its own group; another group is refused.
    let pulled = consumer.pull("Readers", "Orders", 0, 0, 0, None).await;
    assert_eq!(pulled_bodies(&pulled), ["allowed"]);
    assert_refused(
        &consumer.pull("Writers", "Orders", 0, 0, 0, None).await,
        "has no SUB permission on group \"Writers\"",
    );

    let metrics = broker.metrics().await;
    for (reason, count) in [
        ("signature-mismatch", 1),
        ("no-permission", 2),
        ("no-signature", 1),
        ("unknown-account", 1),
        ("admin-required", 5),
    ] {
        let series =
            format!("quiver_acl_refusals_total{{cluster=\"DefaultCluster\",reason=\"{reason}\"}}");
        assert_eq!(metric_value(&metrics, &series), count, "{reason}");
    }
    broker.stop().await;
}

/// Topic create and delete, broker config, offset reset and group delete: admin only.
async fn refuse_admin_codes_to(consumer: &mut Client) {
    let needs_admin = "needs an admin account; access key \"consumer1\" is not admin";
    assert_refused(&consumer.create_topic("Created", 1).await, needs_admin);
    let calls = [
        (
            request::DELETE_TOPIC_IN_BROKER,
            ext(&[("topic", "Orders")]),
            Bytes::new(),
        ),
        (
            request::UPDATE_BROKER_CONFIG,
            ext(&[]),
            Bytes::from_static(b"brokerPermission=4\n"),
        ),
        (
            request::INVOKE_BROKER_TO_RESET_OFFSET,
            ext(&[
                ("topic", "Orders"),
                ("group", "Readers"),
                ("timestamp", "0"),
                ("isForce", "true"),
            ]),
            Bytes::new(),
        ),
        (
            request::DELETE_SUBSCRIPTIONGROUP,
            ext(&[("groupName", "Readers")]),
            Bytes::new(),
        ),
    ];
    for (code, fields, body) in calls {
        assert_refused(&consumer.call(code, fields, body).await, needs_admin);
    }
}

async fn admin_sees_nothing_changed(admin: &mut Client) {
    let topics = admin
        .call(request::GET_ALL_TOPIC_CONFIG, ext(&[]), Bytes::new())
        .await;
    let topics = String::from_utf8_lossy(&topics.body).into_owned();
    assert!(topics.contains("\"Orders\""), "{topics}");
    assert!(!topics.contains("Created"), "{topics}");
    let config = admin
        .call(request::GET_BROKER_CONFIG, ext(&[]), Bytes::new())
        .await;
    let config = String::from_utf8_lossy(&config.body).into_owned();
    assert!(config.contains("brokerPermission=6"), "{config}");
    assert!(config.contains("aclEnable=true"), "{config}");
}

/// The answer code of a route lookup of "Orders".
async fn route_code(client: &mut Client) -> i32 {
    let fields = ext(&[("topic", "Orders")]);
    let answer = client
        .call(request::GET_ROUTEINFO_BY_TOPIC, fields, Bytes::new())
        .await;
    answer.code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn route_lookups_are_open_but_create_topics_only_for_publishers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_with_acl(dir.path(), ACCOUNTS).await;
    let mut unsigned = broker.client().await;
    let not_found = response::TOPIC_NOT_EXIST;
    assert_eq!(route_code(&mut unsigned).await, not_found, "unsigned");
    let mut consumer = broker.client().await;
    consumer = consumer.signing("consumer1", "consumer-secret");
    assert_eq!(route_code(&mut consumer).await, not_found, "without PUB");
    let mut producer = broker.client().await;
    producer = producer.signing("producer1", "producer-secret");
    let created = route_code(&mut producer).await;
    assert_eq!(created, response::SUCCESS, "created for a publisher");
    // An existing route is answered to anyone.
    assert_eq!(route_code(&mut unsigned).await, response::SUCCESS);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_is_read_again_when_it_changes() {
    let dir = tempfile::tempdir().unwrap();
    let (broker, mut admin) = start_with_orders(dir.path(), 1).await;
    let mut newcomer = broker
        .client()
        .await
        .signing("newcomer1", "newcomer-secret");
    assert_refused(
        &newcomer.send("Orders", 0, "early", "A").await,
        "no account has access key \"newcomer1\"",
    );

    let grown = format!(
        "{ACCOUNTS}  - accessKey: newcomer1\n    secretKey: newcomer-secret\n    defaultTopicPerm: PUB\n"
    );
    std::fs::write(dir.path().join("plain_acl.yml"), grown).unwrap();
    wait_for(
        "the new account accepted",
        Duration::from_secs(10),
        || async {
            let mut attempt = broker
                .client()
                .await
                .signing("newcomer1", "newcomer-secret");
            attempt.send("Orders", 0, "late", "A").await.code == response::SUCCESS
        },
    )
    .await;

    // A broken file keeps the accounts in force and is counted.
    std::fs::write(
        dir.path().join("plain_acl.yml"),
        "accounts: [ {accessKey: x",
    )
    .unwrap();
    let failed = "quiver_acl_reloads_total{cluster=\"DefaultCluster\",result=\"failed\"}";
    wait_for(
        "the failed reload counted",
        Duration::from_secs(10),
        || async { metric_value(&broker.metrics().await, failed) == 1 },
    )
    .await;
    let answer = newcomer.send("Orders", 0, "still", "A").await;
    assert_eq!(answer.code, response::SUCCESS, "{answer:?}");
    assert_eq!(stored(&mut admin, "Orders", 1).await, 2);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn globally_white_addresses_need_no_signature() {
    let dir = tempfile::tempdir().unwrap();
    let accounts = format!("globalWhiteRemoteAddresses:\n  - 127.0.0.*\n{ACCOUNTS}");
    let broker = start_with_acl(dir.path(), &accounts).await;
    let mut unsigned = broker.client().await;
    assert_eq!(
        unsigned.create_topic("Anything", 1).await.code,
        response::SUCCESS
    );
    assert_eq!(
        unsigned.send("Anything", 0, "m", "A").await.code,
        response::SUCCESS
    );
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn brokers_sign_their_peer_polls() {
    let dirs: Vec<_> = (0..2).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut listeners = Vec::new();
    for _ in 0..2 {
        let remoting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listeners.push((remoting, http));
    }
    let addrs: Vec<String> = listeners
        .iter()
        .map(|(remoting, _)| remoting.local_addr().unwrap().to_string())
        .collect();
    let mut brokers = Vec::new();
    for (i, (remoting, http)) in listeners.into_iter().enumerate() {
        let acl_file = dirs[i].path().join("plain_acl.yml");
        std::fs::write(&acl_file, ACCOUNTS).unwrap();
        let config = quiver_broker::BrokerConfig {
            broker_name: format!("broker-{i}"),
            advertise: Some(addrs[i].clone()),
            listen: addrs[i].clone(),
            http_listen: http.local_addr().unwrap().to_string(),
            peers: addrs.clone(),
            acl_file: Some(acl_file),
            // Any account may read a peer's config and topics.
            peer_access_key: Some("consumer1".into()),
            peer_secret_key: Some("consumer-secret".into()),
            ..test_config(&dirs[i].path().join("data"))
        };
        brokers.push(TestBroker::start_on(config, remoting, http).await);
    }
    let mut admin = brokers[1].client().await;
    admin = admin.signing("operator1", "operator-secret");
    let created = admin.create_topic("Orders", 1).await;
    assert_eq!(created.code, response::SUCCESS, "{created:?}");
    // broker-0 learns broker-1's topic from its signed polls.
    wait_for(
        "broker-0 to route Orders to broker-1",
        Duration::from_secs(15),
        || async { route_code(&mut brokers[0].client().await).await == response::SUCCESS },
    )
    .await;
    let refusals = brokers[1].metrics().await;
    let series = "quiver_acl_refusals_total{cluster=\"DefaultCluster\",reason=\"no-signature\"}";
    assert_eq!(
        metric_value(&refusals, series),
        0,
        "peer polls went unsigned"
    );
    for broker in brokers {
        broker.stop().await;
    }
}
