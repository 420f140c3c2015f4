//! RemotingAdmin against a real quiver-broker in-process on loopback: every BrokerAdmin call.

use quiver_operator::admin::{
    AdminError, BrokerAccess, BrokerAddr, BrokerAdmin, BrokerPermission, ResetTarget,
    SubscriptionGroup, TopicConfig,
};
use quiver_operator::remoting_admin::RemotingAdmin;
use quiver_protocol::code::{request, response};
use quiver_protocol::{ExtFields, RemotingCommand};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;

struct RunningBroker {
    addr: BrokerAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), quiver_broker::BrokerError>>,
    _data: tempfile::TempDir,
}

async fn start_broker() -> RunningBroker {
    start_broker_with(|_| {}).await
}

async fn start_broker_with(adjust: impl FnOnce(&mut quiver_broker::BrokerConfig)) -> RunningBroker {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind remoting");
    let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
    let addr = listener.local_addr().expect("addr").to_string();
    let data = tempfile::tempdir().expect("temp dir");
    let mut config = quiver_broker::BrokerConfig {
        data_dir: data.path().to_path_buf(),
        listen: addr.clone(),
        http_listen: http.local_addr().expect("http addr").to_string(),
        advertise: Some(addr.clone()),
        broker_name: "qb-0".into(),
        segment_size: 8 * 1024 * 1024,
        ..quiver_broker::BrokerConfig::default()
    };
    adjust(&mut config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(quiver_broker::run(
        config,
        listener,
        Some(http),
        async move {
            stopped.await.ok();
        },
    ));
    RunningBroker {
        addr: BrokerAddr(addr),
        stop,
        task,
        _data: data,
    }
}

/// One SEND_MESSAGE to an explicit queue, the way a RocketMQ 4.x producer sends it.
/// A running broker, an admin client, and topic orders (2 queues) created through it.
async fn broker_with_orders() -> (RunningBroker, RemotingAdmin) {
    let broker = start_broker().await;
    let admin = RemotingAdmin::new(Duration::from_secs(5));
    let topic_config = TopicConfig {
        name: "orders".into(),
        queues: 2,
    };
    admin
        .create_topic(&broker.addr, &topic_config)
        .await
        .expect("create topic");
    (broker, admin)
}

async fn send(addr: &BrokerAddr, queue_id: i32, body: &str) {
    send_with_properties(addr, queue_id, body, "").await;
}

/// SEND_MESSAGE with message properties in RocketMQ's `key\x01value\x02` encoding.
async fn send_with_properties(addr: &BrokerAddr, queue_id: i32, body: &str, properties: &str) {
    let fields: ExtFields = [
        ("producerGroup", "test-producer".to_string()),
        ("topic", "orders".to_string()),
        ("defaultTopic", "TBW102".to_string()),
        ("defaultTopicQueueNums", "4".to_string()),
        ("queueId", queue_id.to_string()),
        ("sysFlag", "0".to_string()),
        ("bornTimestamp", now_ms().to_string()),
        ("flag", "0".to_string()),
        ("properties", properties.to_string()),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value))
    .collect();
    let command = RemotingCommand::request(request::SEND_MESSAGE, fields)
        .with_body(body.as_bytes().to_vec().into());
    let reply = raw_call(addr, command).await.expect("send");
    assert_eq!(
        reply.code,
        response::SUCCESS,
        "send refused: {:?}",
        reply.remark
    );
}

/// A consumer's HEART_BEAT on a connection that stays open (membership ends with it).
async fn heartbeat(addr: &BrokerAddr, group: &str, client_id: &str) -> tokio::net::TcpStream {
    use quiver_protocol::body::{ConsumerData, HeartbeatData, SubscriptionData};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let data = HeartbeatData {
        client_id: client_id.to_string(),
        producer_data_set: Vec::new(),
        consumer_data_set: vec![ConsumerData {
            group_name: group.to_string(),
            subscription_data_set: vec![SubscriptionData {
                topic: "orders".to_string(),
                sub_string: "*".to_string(),
                ..SubscriptionData::default()
            }],
            ..ConsumerData::default()
        }],
    };
    let command = RemotingCommand::request(request::HEART_BEAT, ExtFields::default())
        .with_body(data.encode())
        .with_opaque(7);
    let mut stream = tokio::net::TcpStream::connect(&addr.0)
        .await
        .expect("connect");
    let frame = quiver_protocol::frame::encode_to_bytes(&command).expect("encode");
    stream.write_all(&frame).await.expect("send heartbeat");
    let mut buffer = bytes::BytesMut::new();
    let reply = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match quiver_protocol::frame::decode(&mut buffer).expect("frame") {
                Some(reply) if reply.is_response() && reply.opaque == 7 => return reply,
                // The broker also pushes NOTIFY_CONSUMER_IDS_CHANGED to members.
                Some(_) => continue,
                None => {}
            }
            assert!(
                stream.read_buf(&mut buffer).await.expect("read") > 0,
                "closed"
            );
        }
    })
    .await
    .expect("heartbeat answered within 5 s");
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
    stream
}

/// `brokerPermission` as GET_BROKER_CONFIG reports it.
async fn broker_permission(addr: &BrokerAddr) -> String {
    let command = RemotingCommand::request(request::GET_BROKER_CONFIG, ExtFields::default());
    let reply = raw_call(addr, command).await.expect("broker config");
    let text = String::from_utf8(reply.body.to_vec()).expect("utf-8 properties");
    text.lines()
        .find_map(|line| line.strip_prefix("brokerPermission="))
        .unwrap_or_else(|| panic!("no brokerPermission in {text}"))
        .trim()
        .to_string()
}

/// One request as any RocketMQ client sends it, over quiver-client's connection.
async fn raw_call(
    addr: &BrokerAddr,
    command: RemotingCommand,
) -> quiver_client::Result<RemotingCommand> {
    quiver_client::ClientCore::new(quiver_client::ClientConfig::new(""))
        .invoke(&addr.0, command)
        .await
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after epoch")
        .as_millis() as i64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_call_works_against_a_real_broker() {
    let (broker, admin) = broker_with_orders().await;
    let addr = broker.addr.clone();
    let group = SubscriptionGroup {
        group: "billing".into(),
        consume_enable: true,
        consume_from_min_enable: true,
        retry_queue_nums: 1,
        max_reconsume_times: 3,
    };
    admin
        .upsert_group(&addr, &group)
        .await
        .expect("upsert group");
    assert!(admin
        .groups(&addr)
        .await
        .expect("groups")
        .contains(&"billing".to_string()));

    let members = admin.members(&addr, "billing").await.expect("members");
    assert!(members.is_empty(), "no consumer online: {members:?}");
    let member = heartbeat(&addr, "billing", "10.0.0.7@worker-1").await;
    let members = admin.members(&addr, "billing").await.expect("members");
    assert_eq!(members, vec!["10.0.0.7@worker-1".to_string()]);
    drop(member);

    let before_send_ms = now_ms();
    for index in 0..10 {
        send(&addr, index % 2, &format!("m{index}")).await;
    }
    let topic = admin
        .topic_stats(&addr, "orders")
        .await
        .expect("topic stats");
    assert_eq!(topic.queues.len(), 2);
    assert!(topic.queues.iter().all(|queue| queue.broker_name == "qb-0"));
    let missing = admin.topic_stats(&addr, "no-such-topic").await;
    assert!(
        matches!(missing, Err(AdminError::Rejected { .. })),
        "{missing:?}"
    );
    assert_eq!(topic.queues.iter().map(|q| q.max_offset.0).sum::<u64>(), 10);

    // Nothing committed yet: the group's stats have no known lag.
    let stats = admin
        .consume_stats(&addr, "billing")
        .await
        .expect("consume stats");
    assert!(
        stats.queues.iter().all(|q| q.consumer_offset.is_none()),
        "{stats:?}"
    );

    admin
        .reset_offsets(&addr, "billing", "orders", ResetTarget::Earliest)
        .await
        .expect("reset earliest");
    let stats = admin
        .consume_stats(&addr, "billing")
        .await
        .expect("consume stats");
    assert_eq!(stats.queues.len(), 2, "{stats:?}");
    for queue in &stats.queues {
        assert_eq!(queue.broker_name, "qb-0");
        assert_eq!(queue.consumer_offset.map(|o| o.0), Some(0));
        if queue.broker_offset.0 > 0 {
            let stored = queue
                .oldest_unconsumed_store_ms
                .expect("store time of the first unconsumed message");
            assert!(
                stored >= before_send_ms - 1_000 && stored <= now_ms() + 1_000,
                "stored at {stored}"
            );
        }
    }
    assert_eq!(
        stats.queues.iter().map(|q| q.broker_offset.0).sum::<u64>(),
        10
    );

    admin
        .reset_offsets(&addr, "billing", "orders", ResetTarget::Latest)
        .await
        .expect("reset latest");
    let stats = admin
        .consume_stats(&addr, "billing")
        .await
        .expect("consume stats");
    assert!(
        stats
            .queues
            .iter()
            .all(|q| q.consumer_offset == Some(q.broker_offset)),
        "{stats:?}"
    );
    assert!(stats
        .queues
        .iter()
        .all(|q| q.oldest_unconsumed_store_ms.is_none()));

    admin
        .set_permission(&addr, BrokerPermission::ReadOnly)
        .await
        .expect("read-only");
    assert_eq!(broker_permission(&addr).await, "4");
    admin
        .set_permission(&addr, BrokerPermission::ReadWrite)
        .await
        .expect("read-write");
    assert_eq!(broker_permission(&addr).await, "6");

    admin
        .delete_group(&addr, "billing")
        .await
        .expect("delete group");
    assert!(!admin
        .groups(&addr)
        .await
        .expect("groups")
        .contains(&"billing".to_string()));
    let stats = admin
        .consume_stats(&addr, "billing")
        .await
        .expect("consume stats");
    assert!(
        stats.queues.iter().all(|q| q.consumer_offset.is_none()),
        "offsets dropped: {stats:?}"
    );

    stop(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_broker_lists_its_topics_and_what_they_hold() {
    use quiver_operator::controller::drain::{backlog, SCHEDULE_TOPIC};
    let (broker, admin) = broker_with_orders().await;
    let addr = broker.addr.clone();
    for index in 0..6 {
        send(&addr, index % 2, &format!("m{index}")).await;
    }
    // Delay level 18 (two hours): parked in SCHEDULE_TOPIC_XXXX queue 17.
    send_with_properties(&addr, 0, "later", "DELAY\u{1}18\u{2}").await;

    let topics = admin.topics(&addr).await.expect("topics");
    for expected in ["orders", "TBW102", SCHEDULE_TOPIC] {
        assert!(
            topics.contains(&expected.to_string()),
            "{expected} not in {topics:?}"
        );
    }
    let mut stats = Vec::new();
    for topic in &topics {
        let topic_stats = admin.topic_stats(&addr, topic).await.expect("topic stats");
        stats.push((topic.clone(), topic_stats));
    }
    let orders = &stats.iter().find(|(name, _)| name == "orders").unwrap().1;
    assert_eq!(orders.queues.iter().map(|q| q.max_offset.0).sum::<u64>(), 6);
    let schedule = &stats
        .iter()
        .find(|(name, _)| name == SCHEDULE_TOPIC)
        .unwrap()
        .1;
    let level_18 = schedule
        .queues
        .iter()
        .find(|q| q.queue_id == 17)
        .expect("level 18 queue");
    assert_eq!(
        level_18.max_offset.0 - level_18.min_offset.0,
        1,
        "{schedule:?}"
    );
    assert!(level_18.last_update_ms.is_some());

    let pending = backlog(&[], &stats, now_ms(), false);
    assert_eq!(pending.messages_without_group, 6, "{pending:?}");
    assert_eq!(
        pending.pending_topics.into_iter().collect::<Vec<_>>(),
        vec!["SCHEDULE_TOPIC_XXXX".to_string(), "orders".to_string()]
    );
    stop(broker).await;
}

/// The raw GET_BROKER_RUNTIME_INFO table.
async fn runtime_table(addr: &BrokerAddr) -> std::collections::BTreeMap<String, String> {
    let command = RemotingCommand::request(request::GET_BROKER_RUNTIME_INFO, ExtFields::default());
    let reply = raw_call(addr, command)
        .await
        .expect("runtime info answered");
    assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
    quiver_protocol::body::KvTable::decode(&reply.body)
        .expect("a KVTable body")
        .table
}

async fn stop(broker: RunningBroker) {
    broker.stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(15), broker.task)
        .await
        .expect("broker stops within 15 s")
        .expect("broker task joins")
        .expect("broker exits cleanly");
}

const RUNTIME_KEYS: [&str; 6] = [
    "commitLogDiskRatio",
    "commitLogDirCapacity",
    "quiverDiskHighWaterRatio",
    "quiverWritable",
    "quiverWriteRefusal",
    "quiverWriteRefusalMessage",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_info_reports_the_disk_of_a_writable_broker() {
    let broker = start_broker_with(|config| config.disk_high_water_ratio = 1.0).await;
    let admin = RemotingAdmin::new(Duration::from_secs(5));
    let table = runtime_table(&broker.addr).await;
    for key in RUNTIME_KEYS {
        assert!(table.contains_key(key), "{key} missing from {table:?}");
    }
    assert_eq!(table["quiverWritable"], "true", "{table:?}");
    assert_eq!(table["quiverWriteRefusal"], "", "{table:?}");
    assert_eq!(table["quiverWriteRefusalMessage"], "", "{table:?}");
    assert!(
        table["commitLogDirCapacity"].starts_with("Total : "),
        "{table:?}"
    );

    let info = admin
        .runtime_info(&broker.addr)
        .await
        .expect("runtime info");
    let used = info.disk_used_ratio.expect("commitLogDiskRatio");
    assert!(used > 0.0 && used <= 1.0, "{info:?}");
    assert_eq!(info.high_water_ratio, Some(1.0), "{info:?}");
    assert_eq!(info.writable, Some(true));
    assert_eq!(info.write_refusal, None);
    stop(broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_info_reports_why_a_broker_above_high_water_refuses_sends() {
    // Any file system holding a temp dir is more than 1% used: the broker starts read-only.
    let broker = start_broker_with(|config| config.disk_high_water_ratio = 0.01).await;
    let admin = RemotingAdmin::new(Duration::from_secs(5));
    let info = admin
        .runtime_info(&broker.addr)
        .await
        .expect("runtime info");
    assert!(
        info.disk_used_ratio.is_some_and(|used| used >= 0.01),
        "{info:?}"
    );
    assert_eq!(info.high_water_ratio, Some(0.01), "{info:?}");
    assert_eq!(info.writable, Some(false), "{info:?}");
    assert_eq!(info.write_refusal.as_deref(), Some("disk-high-water"));
    assert!(info.write_refusal_message.is_some(), "{info:?}");
    stop(broker).await;
}

#[tokio::test]
async fn a_closed_port_is_unreachable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = BrokerAddr(listener.local_addr().expect("addr").to_string());
    drop(listener);
    let error = RemotingAdmin::new(Duration::from_secs(2))
        .groups(&addr)
        .await
        .expect_err("nothing listens");
    assert!(matches!(error, AdminError::Unreachable { .. }), "{error:?}");
}

/// A broker with ACL on (the file an operator mounts from `spec.security.acl`) refuses the
/// operator's unsigned admin calls with NO_PERMISSION, and takes them signed with the admin
/// account `spec.security.adminCredentials` names; a non-admin account is refused admin codes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_are_signed_with_the_brokers_admin_account() {
    use quiver_operator::admin::account_scope;
    use quiver_protocol::acl::Credentials;
    let acl_dir = tempfile::tempdir().expect("temp dir");
    let acl_file = acl_dir.path().join("plain_acl.yml");
    std::fs::write(
        &acl_file,
        "accounts:\n  - accessKey: quiver-operator\n    secretKey: operator-secret\n    admin: true\n  \
         - accessKey: orders-app\n    secretKey: orders-secret\n    admin: false\n",
    )
    .expect("write acl file");
    let broker = start_broker_with(|config| config.acl_file = Some(acl_file)).await;
    let admin = RemotingAdmin::new(Duration::from_secs(5));
    let topic = TopicConfig {
        name: "orders".into(),
        queues: 2,
    };
    let refused = |result: Result<(), AdminError>| match result {
        Err(AdminError::Rejected { code, remark, .. }) => {
            assert_eq!(code, response::NO_PERMISSION, "{remark}");
            remark
        }
        other => panic!("expected NO_PERMISSION, got {other:?}"),
    };
    let unsigned = refused(admin.create_topic(&broker.addr, &topic).await);
    assert!(unsigned.contains("ACL"), "{unsigned}");
    let scope = account_scope(&broker.addr).to_string();
    let signed_by = |access_key: &str, secret_key: &str| BrokerAccess {
        account: Some(Credentials::new(access_key, secret_key)),
        tls: None,
    };
    admin.use_access(&scope, signed_by("orders-app", "orders-secret"));
    let not_admin = refused(admin.create_topic(&broker.addr, &topic).await);
    assert!(not_admin.contains("admin"), "{not_admin}");
    admin.use_access(&scope, signed_by("quiver-operator", "operator-secret"));
    admin
        .create_topic(&broker.addr, &topic)
        .await
        .expect("the admin account may create topics");
    let topics = admin.topics(&broker.addr).await.expect("topics");
    assert!(topics.contains(&"orders".to_string()), "{topics:?}");
    stop(broker).await;
}

/// A CA's PEM and a server certificate it signed for 127.0.0.1 (server and client auth usage,
/// as the chart's example Certificate asks for), as a cert-manager Secret holds them.
struct TlsSecret {
    ca_pem: String,
    cert_pem: String,
    key_pem: String,
}

impl TlsSecret {
    fn new(tag: &str) -> TlsSecret {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        };
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("operator test CA {tag}"));
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("params");
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &ca_cert, &ca_key).expect("signed");
        TlsSecret {
            ca_pem: ca_cert.pem(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The operator's TLS from this Secret's bytes: its CA, and its certificate when asked.
    fn access(&self, present_certificate: bool) -> BrokerAccess {
        let pem = |text: &String| present_certificate.then(|| text.clone().into_bytes());
        BrokerAccess {
            account: None,
            tls: Some(quiver_client::TlsConfig {
                ca_pem: Some(self.ca_pem.clone().into_bytes()),
                cert_pem: pem(&self.cert_pem),
                key_pem: pem(&self.key_pem),
                ..quiver_client::TlsConfig::default()
            }),
        }
    }

    /// A broker serving this certificate from files (the Secret mounted), TLS enforced.
    async fn serve(
        &self,
        client_auth: quiver_broker::ClientAuth,
    ) -> (RunningBroker, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write PEM");
            path
        };
        let (cert, key, ca) = (
            file("tls.crt", &self.cert_pem),
            file("tls.key", &self.key_pem),
            file("ca.crt", &self.ca_pem),
        );
        let broker = start_broker_with(|config| {
            config.tls_mode = quiver_broker::TlsMode::Enforcing;
            config.tls_cert_file = Some(cert);
            config.tls_key_file = Some(key);
            config.tls_ca_file = Some(ca);
            config.tls_client_auth = client_auth;
        })
        .await;
        (broker, dir)
    }
}

/// A broker enforcing TLS (`spec.security.tls.mode: Enforcing`) takes the operator's calls over
/// TLS trusting its Secret's ca.crt, refuses plain ones, and a client trusting another CA fails
/// its handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_use_tls_with_the_brokers_ca() {
    let secret = TlsSecret::new("broker");
    let (broker, _pem_dir) = secret.serve(quiver_broker::ClientAuth::None).await;
    let scope = quiver_operator::admin::account_scope(&broker.addr).to_string();
    let plain = RemotingAdmin::new(Duration::from_secs(5));
    match plain.topics(&broker.addr).await {
        Err(AdminError::Unreachable { .. }) => {}
        other => panic!("a plain call to an enforcing broker must fail: {other:?}"),
    }
    let stranger = RemotingAdmin::new(Duration::from_secs(5));
    stranger.use_access(&scope, TlsSecret::new("other").access(false));
    match stranger.topics(&broker.addr).await {
        Err(error @ AdminError::Unreachable { .. }) => {
            let text = format!("{error:?}").to_lowercase();
            assert!(text.contains("certificate"), "not a TLS error: {text}");
        }
        other => panic!("another CA must not be trusted: {other:?}"),
    }
    let admin = RemotingAdmin::new(Duration::from_secs(5));
    admin.use_access(&scope, secret.access(false));
    let topic = TopicConfig {
        name: "orders".into(),
        queues: 2,
    };
    admin
        .create_topic(&broker.addr, &topic)
        .await
        .expect("created over TLS");
    let topics = admin.topics(&broker.addr).await.expect("topics over TLS");
    assert!(topics.contains(&"orders".to_string()), "{topics:?}");
    // Dropping the access makes the calls plain again: refused.
    admin.use_access(&scope, BrokerAccess::default());
    assert!(admin.topics(&broker.addr).await.is_err());
    stop(broker).await;
}

/// With `clientAuth: Require` the operator presents the Secret's certificate, which needs the
/// client auth usage; without one the broker refuses the handshake.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_present_the_secrets_certificate_when_required() {
    let secret = TlsSecret::new("require");
    let (broker, _pem_dir) = secret.serve(quiver_broker::ClientAuth::Require).await;
    let scope = quiver_operator::admin::account_scope(&broker.addr).to_string();
    let anonymous = RemotingAdmin::new(Duration::from_secs(5));
    anonymous.use_access(&scope, secret.access(false));
    assert!(anonymous.topics(&broker.addr).await.is_err());
    let admin = RemotingAdmin::new(Duration::from_secs(5));
    admin.use_access(&scope, secret.access(true));
    admin
        .topics(&broker.addr)
        .await
        .expect("answered to the certified operator");
    stop(broker).await;
}
