//! The gRPC port against the real binary, with the crate's own tonic client: routes name
//! every broker's gRPC endpoint; the Telemetry handshake answers the group's settings;
//! normal, FIFO, delayed and transactional sends (commit, rollback, check-back over
//! Telemetry) land where a 4.x consumer reads them with their ids, tags, keys and
//! properties; ACL and TLS use the remoting port's accounts and certificate; calls Quiver
//! does not serve are refused at once.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use common::{ext, wait_for, BrokerProcess, Client};
use quiver_grpc_proto::tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use quiver_grpc_proto::tonic::{self, Code as RpcCode, Request};
use quiver_grpc_proto::v2::messaging_service_client::MessagingServiceClient;
use quiver_grpc_proto::v2::{self, Code, MessageType};
use quiver_protocol::code::{request, response};
use quiver_store::record::Record;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Bound on any one call (a hang fails the test instead of stalling it).
const CALL_BOUND: Duration = Duration::from_secs(20);
const QUEUES: u32 = 4;

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// The binary with its remoting, HTTP and gRPC ports.
struct Broker {
    process: BrokerProcess,
    grpc: SocketAddr,
}

/// Starts the binary over `dir` on the given remoting and gRPC addresses, `extra` flags.
async fn spawn(dir: &Path, addr: SocketAddr, grpc: SocketAddr, extra: &[&str]) -> Broker {
    try_spawn(dir, addr, grpc, extra)
        .await
        .unwrap_or_else(|| panic!("a port of {addr} / {grpc} was taken"))
}

/// As `spawn`; None when another test took one of the ports between `free_port` and the bind.
async fn try_spawn(
    dir: &Path,
    addr: SocketAddr,
    grpc: SocketAddr,
    extra: &[&str],
) -> Option<Broker> {
    let http = free_port();
    std::fs::create_dir_all(dir).unwrap();
    let log = dir.join("broker.log");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .args(["--data-dir", dir.join("data").to_str().unwrap()])
        .args(["--listen", &addr.to_string()])
        .args(["--http-listen", &http.to_string()])
        .args(["--grpc-listen", &grpc.to_string()])
        .args(["--segment-size", "1048576", "--max-message-size", "65536"])
        .args(["--disk-high-water-ratio", "1", "--disk-clean-ratio", "1"])
        .args(["--disk-force-clean-ratio", "1"])
        .args(["--default-queue-nums", &QUEUES.to_string()])
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut process = BrokerProcess { child, addr, http };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while common::http_get(http, "/readyz")
        .await
        .is_none_or(|(status, _)| status != 200)
    {
        if process.child.try_wait().unwrap().is_some() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                log.contains("Address already in use"),
                "broker exited early: {log}"
            );
            return None;
        }
        assert!(std::time::Instant::now() < deadline, "broker not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(Broker { process, grpc })
}

/// A broker on fresh ports (tests run in parallel: a port `free_port` found may be taken
/// before the broker binds it, then fresh ones are tried).
async fn start(dir: &Path, extra: &[&str]) -> Broker {
    for _ in 0..5 {
        if let Some(broker) = try_spawn(dir, free_port(), free_port(), extra).await {
            return broker;
        }
    }
    panic!("no free ports for a broker in five tries");
}

async fn connect(grpc: SocketAddr) -> MessagingServiceClient<Channel> {
    let channel = Endpoint::from_shared(format!("http://{grpc}"))
        .unwrap()
        .timeout(CALL_BOUND)
        .connect()
        .await
        .expect("connect to the gRPC port");
    MessagingServiceClient::new(channel)
}

/// A request with the metadata every 5.x client sends.
fn call<T>(message: T, client_id: &str) -> Request<T> {
    let mut request = Request::new(message);
    let metadata = request.metadata_mut();
    metadata.insert("x-mq-client-id", client_id.parse().unwrap());
    metadata.insert("x-mq-language", "RUST".parse().unwrap());
    metadata.insert("x-mq-protocol", "GRPC_V2".parse().unwrap());
    request
}

fn resource(name: &str) -> Option<v2::Resource> {
    Some(v2::Resource {
        resource_namespace: String::new(),
        name: name.into(),
    })
}

fn message(topic: &str, id: &str, body: &str) -> v2::Message {
    v2::Message {
        topic: resource(topic),
        user_properties: [("origin".to_owned(), "grpc".to_owned())].into(),
        system_properties: Some(v2::SystemProperties {
            message_id: id.into(),
            tag: Some("TagA".into()),
            keys: vec!["k1".into(), "k2".into()],
            message_type: MessageType::Normal as i32,
            born_timestamp: Some(now_timestamp(0)),
            ..Default::default()
        }),
        body: body.as_bytes().to_vec().into(),
    }
}

fn now_timestamp(ahead_ms: i64) -> quiver_grpc_proto::prost_types::Timestamp {
    let ms = quiver_broker::now_ms() + ahead_ms;
    quiver_grpc_proto::prost_types::Timestamp {
        seconds: ms / 1000,
        nanos: i32::try_from(ms % 1000).unwrap() * 1_000_000,
    }
}

async fn send(
    client: &mut MessagingServiceClient<Channel>,
    messages: Vec<v2::Message>,
) -> v2::SendMessageResponse {
    client
        .send_message(call(v2::SendMessageRequest { messages }, "producer-1"))
        .await
        .expect("SendMessage answers")
        .into_inner()
}

fn code_of(status: Option<&v2::Status>) -> Code {
    Code::try_from(status.expect("a status").code).expect("a known code")
}

/// Every record of `topic`'s queues, read by a 4.x pull.
async fn pull_all(addr: SocketAddr, topic: &str) -> Vec<Record> {
    let mut client = Client::connect(addr).await;
    let mut records = Vec::new();
    for queue in 0..QUEUES {
        let pulled = client.pull("Pullers", topic, queue, 0, 0, None).await;
        if pulled.code == response::SUCCESS {
            records.extend(quiver_store::record::decode_all(&pulled.body).unwrap());
        }
    }
    records
}

fn property<'r>(record: &'r Record, key: &str) -> Option<&'r str> {
    quiver_store::record::property(&record.properties, key)
}

#[tokio::test]
async fn routes_name_the_grpc_endpoint_of_every_broker() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (free_port(), free_port());
    let (a_grpc, b_grpc) = (free_port(), free_port());
    let peers_of_a = format!("{b}");
    let peers_of_b = format!("{a}");
    let first = spawn(
        &dir.path().join("a"),
        a,
        a_grpc,
        &["--broker-name", "a", "--peers", &peers_of_a],
    )
    .await;
    let second = spawn(
        &dir.path().join("b"),
        b,
        b_grpc,
        &["--broker-name", "b", "--peers", &peers_of_b],
    )
    .await;
    let mut admin = Client::connect(second.process.addr).await;
    assert_eq!(
        admin.create_topic("Shared", QUEUES).await.code,
        response::SUCCESS
    );
    let mut client = connect(first.grpc).await;
    let query = v2::QueryRouteRequest {
        topic: resource("Shared"),
        endpoints: Some(v2::Endpoints::default()),
    };
    let mut brokers = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while brokers.len() < 2 && tokio::time::Instant::now() < deadline {
        let route = client
            .query_route(call(query.clone(), "c"))
            .await
            .unwrap()
            .into_inner();
        brokers = route
            .message_queues
            .iter()
            .filter_map(|q| q.broker.as_ref())
            .map(|b| {
                (
                    b.name.clone(),
                    b.endpoints.as_ref().unwrap().addresses[0].port,
                )
            })
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expected = vec![
        ("a".to_owned(), i32::from(a_grpc.port())),
        ("b".to_owned(), i32::from(b_grpc.port())),
    ];
    assert_eq!(
        brokers, expected,
        "each broker's gRPC port, not its remoting port"
    );
    let route = client
        .query_route(call(query, "c"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(route.status.as_ref()), Code::Ok);
    let first_queue = &route.message_queues[0];
    assert_eq!(
        first_queue.accept_message_types.len(),
        4,
        "every message type"
    );
    assert_eq!(first_queue.permission, v2::Permission::ReadWrite as i32);
    drop((first, second));
}

#[tokio::test]
async fn telemetry_answers_the_groups_fifo_flag_and_retry_policy() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    create_orderly_group(broker.process.addr, "Ordered").await;
    let mut client = connect(broker.grpc).await;
    let settings = v2::Settings {
        client_type: Some(v2::ClientType::SimpleConsumer as i32),
        pub_sub: Some(v2::settings::PubSub::Subscription(v2::Subscription {
            group: resource("Ordered"),
            ..Default::default()
        })),
        ..Default::default()
    };
    let (mut answers, _commands) = open_telemetry(&mut client, "consumer-1", settings).await;
    let answer = next_command(&mut answers).await;
    assert_eq!(code_of(answer.status.as_ref()), Code::Ok);
    let Some(v2::telemetry_command::Command::Settings(settings)) = answer.command else {
        panic!("a Settings answer, got {answer:?}");
    };
    let Some(v2::settings::PubSub::Subscription(subscription)) = settings.pub_sub else {
        panic!("a subscription");
    };
    assert_eq!(subscription.fifo, Some(true));
    assert_eq!(
        settings.backoff_policy.unwrap().max_attempts,
        4,
        "retryMaxTimes + 1"
    );
    let (_, metrics) = common::http_get(broker.process.http, "/metrics")
        .await
        .expect("metrics");
    assert!(
        metrics.contains("quiver_grpc_telemetry_sessions{cluster=\"DefaultCluster\"} 1"),
        "the open stream counts: {metrics}"
    );
}

/// Creates subscription group `name` with consumeMessageOrderly (a FIFO group for 5.x).
async fn create_orderly_group(addr: SocketAddr, name: &str) {
    let mut admin = Client::connect(addr).await;
    let group = serde_json::json!({
        "groupName": name, "consumeEnable": true, "consumeMessageOrderly": true,
        "retryMaxTimes": 3, "retryQueueNums": 1
    });
    let created = admin
        .call(
            request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            ext(&[]),
            Bytes::from(group.to_string()),
        )
        .await;
    assert_eq!(created.code, response::SUCCESS, "{created:?}");
}

/// Opens a Telemetry stream as `client_id` and sends `settings` first.
async fn open_telemetry(
    client: &mut MessagingServiceClient<Channel>,
    client_id: &str,
    settings: v2::Settings,
) -> (
    tonic::Streaming<v2::TelemetryCommand>,
    mpsc::Sender<v2::TelemetryCommand>,
) {
    let (commands, outgoing) = mpsc::channel(8);
    commands
        .send(v2::TelemetryCommand {
            status: None,
            command: Some(v2::telemetry_command::Command::Settings(settings)),
        })
        .await
        .unwrap();
    let answers = client
        .telemetry(call(ReceiverStream::new(outgoing), client_id))
        .await
        .expect("Telemetry opens")
        .into_inner();
    (answers, commands)
}

async fn next_command(
    answers: &mut tonic::Streaming<v2::TelemetryCommand>,
) -> v2::TelemetryCommand {
    tokio::time::timeout(CALL_BOUND, answers.message())
        .await
        .expect("a command in time")
        .expect("the stream is healthy")
        .expect("the stream is open")
}

#[tokio::test]
async fn a_grpc_message_reaches_a_4x_consumer_with_id_tag_keys_and_properties() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    let sent = send(&mut client, vec![message("Plain", "ID-PLAIN-1", "hello")]).await;
    assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    assert_eq!(sent.entries[0].message_id, "ID-PLAIN-1");
    let records = pull_all(broker.process.addr, "Plain").await;
    assert_eq!(records.len(), 1);
    let record = &records[0];
    assert_eq!(&record.body[..], b"hello");
    assert_eq!(property(record, "UNIQ_KEY"), Some("ID-PLAIN-1"));
    assert_eq!(property(record, "TAGS"), Some("TagA"));
    assert_eq!(property(record, "KEYS"), Some("k1 k2"));
    assert_eq!(property(record, "origin"), Some("grpc"));
    let metrics = common::http_get(broker.process.http, "/metrics")
        .await
        .unwrap()
        .1;
    assert!(
        metrics.contains("call=\"SendMessage\",code=\"OK\"} 1"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_message_group_keeps_to_one_queue_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    for index in 0..8 {
        let mut fifo = message("Fifo", &format!("ID-FIFO-{index}"), &format!("m{index}"));
        let system = fifo.system_properties.as_mut().unwrap();
        system.message_group = Some("order-42".into());
        system.message_type = MessageType::Fifo as i32;
        let sent = send(&mut client, vec![fifo]).await;
        assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    }
    let records = pull_all(broker.process.addr, "Fifo").await;
    let queues: std::collections::BTreeSet<u32> = records.iter().map(|r| r.queue_id).collect();
    assert_eq!(queues.len(), 1, "one queue for the group: {queues:?}");
    let bodies: Vec<&[u8]> = records.iter().map(|r| &r.body[..]).collect();
    let expected: Vec<String> = (0..8).map(|i| format!("m{i}")).collect();
    assert_eq!(
        bodies,
        expected.iter().map(|b| b.as_bytes()).collect::<Vec<_>>()
    );
    assert_eq!(property(&records[0], "__SHARDINGKEY"), Some("order-42"));
}

#[tokio::test]
async fn a_delivery_timestamp_holds_the_message_until_then() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    let mut delayed = message("Later", "ID-LATER", "later");
    let system = delayed.system_properties.as_mut().unwrap();
    system.message_type = MessageType::Delay as i32;
    system.delivery_timestamp = Some(now_timestamp(3_000));
    let mut now = message("Later", "ID-NOW", "now");
    now.system_properties.as_mut().unwrap().message_type = MessageType::Normal as i32;
    let sent = send(&mut client, vec![delayed]).await;
    assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    let sent = send(&mut client, vec![now]).await;
    assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    let ids = |records: Vec<Record>| -> Vec<String> {
        records
            .iter()
            .filter_map(|r| property(r, "UNIQ_KEY").map(str::to_owned))
            .collect()
    };
    let first = ids(pull_all(broker.process.addr, "Later").await);
    assert_eq!(first, ["ID-NOW"], "the delayed one is not there yet");
    let addr = broker.process.addr;
    wait_for(
        "the delayed message is delivered",
        Duration::from_secs(30),
        || async move { ids(pull_all(addr, "Later").await).contains(&"ID-LATER".to_owned()) },
    )
    .await;
}

#[tokio::test]
async fn transactions_commit_roll_back_and_are_checked_back_over_telemetry() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(
        dir.path(),
        &[
            "--transaction-timeout-ms",
            "300",
            "--transaction-check-interval-ms",
            "100",
        ],
    )
    .await;
    let mut client = connect(broker.grpc).await;
    let settings = v2::Settings {
        client_type: Some(v2::ClientType::Producer as i32),
        pub_sub: Some(v2::settings::PubSub::Publishing(v2::Publishing {
            topics: vec![resource("Tx").unwrap()],
            ..Default::default()
        })),
        ..Default::default()
    };
    let (mut commands, _keep_open) = open_telemetry(&mut client, "producer-1", settings).await;
    next_command(&mut commands).await;
    let half = |id: &str| {
        let mut half = message("Tx", id, id);
        half.system_properties.as_mut().unwrap().message_type = MessageType::Transaction as i32;
        half
    };
    // Ended by the producer: kept from the check-back however slowly the test runs (else a
    // check could take them first and the ends would find them settled).
    let ended_half = |id: &str| {
        let mut half = half(id);
        let system = half.system_properties.as_mut().unwrap();
        system.orphaned_transaction_recovery_duration =
            Some(proto_duration(Duration::from_secs(600)));
        half
    };
    let mut transaction_ids = Vec::new();
    for id in ["TX-COMMIT", "TX-ROLLBACK"] {
        let sent = send(&mut client, vec![ended_half(id)]).await;
        assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
        assert!(!sent.entries[0].transaction_id.is_empty());
        transaction_ids.push(sent.entries[0].transaction_id.clone());
    }
    assert!(
        pull_all(broker.process.addr, "Tx").await.is_empty(),
        "half messages stay hidden"
    );
    for (id, transaction_id, resolution) in [
        (
            "TX-COMMIT",
            &transaction_ids[0],
            v2::TransactionResolution::Commit,
        ),
        (
            "TX-ROLLBACK",
            &transaction_ids[1],
            v2::TransactionResolution::Rollback,
        ),
    ] {
        let end = end_transaction(
            &mut client,
            id,
            transaction_id,
            resolution,
            v2::TransactionSource::SourceClient,
        )
        .await;
        assert_eq!(code_of(end.status.as_ref()), Code::Ok, "{end:?}");
    }
    let ids: Vec<String> = pull_all(broker.process.addr, "Tx")
        .await
        .iter()
        .filter_map(|r| property(r, "UNIQ_KEY").map(str::to_owned))
        .collect();
    assert_eq!(ids, ["TX-COMMIT"]);

    // Left open: the broker asks the producer over its Telemetry stream.
    let sent = send(&mut client, vec![half("TX-CHECKED")]).await;
    assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    let recover = loop {
        let command = next_command(&mut commands).await;
        if let Some(v2::telemetry_command::Command::RecoverOrphanedTransactionCommand(recover)) =
            command.command
        {
            break recover;
        }
    };
    let orphan = recover.message.expect("the orphaned message");
    assert_eq!(
        orphan.system_properties.as_ref().unwrap().message_id,
        "TX-CHECKED"
    );
    assert_eq!(orphan.body, &b"TX-CHECKED"[..]);
    assert_eq!(orphan.topic.unwrap().name, "Tx");
    let end = end_transaction(
        &mut client,
        "TX-CHECKED",
        &recover.transaction_id,
        v2::TransactionResolution::Commit,
        v2::TransactionSource::SourceServerCheck,
    )
    .await;
    assert_eq!(code_of(end.status.as_ref()), Code::Ok, "{end:?}");
    let addr = broker.process.addr;
    wait_for(
        "the checked-back message is committed",
        Duration::from_secs(20),
        || async move {
            pull_all(addr, "Tx")
                .await
                .iter()
                .any(|r| property(r, "UNIQ_KEY") == Some("TX-CHECKED"))
        },
    )
    .await;
    let bogus = end_transaction(
        &mut client,
        "X",
        "not-a-transaction",
        v2::TransactionResolution::Commit,
        v2::TransactionSource::SourceClient,
    )
    .await;
    assert_eq!(code_of(bogus.status.as_ref()), Code::InvalidTransactionId);
}

async fn end_transaction(
    client: &mut MessagingServiceClient<Channel>,
    message_id: &str,
    transaction_id: &str,
    resolution: v2::TransactionResolution,
    source: v2::TransactionSource,
) -> v2::EndTransactionResponse {
    let request = v2::EndTransactionRequest {
        topic: resource("Tx"),
        message_id: message_id.into(),
        transaction_id: transaction_id.into(),
        resolution: resolution as i32,
        source: source as i32,
        trace_context: String::new(),
    };
    client
        .end_transaction(call(request, "producer-1"))
        .await
        .expect("EndTransaction answers")
        .into_inner()
}

const ACCOUNTS: &str = r#"
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
"#;

/// `Credential=..., Signature=hex(HMAC-SHA1(secret, date))` as the Python 5.x client signs.
fn signed<T>(message: T, access_key: &str, secret_key: &str) -> Request<T> {
    use hmac::Mac as _;
    let date_time = "20261203T080000Z";
    let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(secret_key.as_bytes()).unwrap();
    mac.update(date_time.as_bytes());
    let signature: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    let mut request = call(message, "producer-1");
    let authorization = format!(
        "MQv2-HMAC-SHA1 Credential={access_key}, SignedHeaders=x-mq-date-time, Signature={signature}"
    );
    request
        .metadata_mut()
        .insert("authorization", authorization.parse().unwrap());
    request
        .metadata_mut()
        .insert("x-mq-date-time", date_time.parse().unwrap());
    request
}

#[tokio::test]
async fn acl_refuses_unsigned_wrongly_signed_and_unpermitted_calls() {
    let dir = tempfile::tempdir().unwrap();
    let acl_file = dir.path().join("plain_acl.yml");
    std::fs::write(&acl_file, ACCOUNTS).unwrap();
    let broker = start(dir.path(), &["--acl-file", acl_file.to_str().unwrap()]).await;
    let mut client = connect(broker.grpc).await;
    let request = |topic: &str| v2::SendMessageRequest {
        messages: vec![message(topic, "ID-ACL", "secret")],
    };
    let cases = [
        (call(request("Orders"), "p"), Code::Unauthorized),
        (
            signed(request("Orders"), "producer1", "wrong-secret"),
            Code::Unauthorized,
        ),
        (
            signed(request("Orders"), "nobody", "producer-secret"),
            Code::Unauthorized,
        ),
        (
            signed(request("Payments"), "producer1", "producer-secret"),
            Code::Forbidden,
        ),
        (
            signed(request("Orders"), "producer1", "producer-secret"),
            Code::Ok,
        ),
    ];
    for (index, (request, expected)) in cases.into_iter().enumerate() {
        let answer = client.send_message(request).await.unwrap().into_inner();
        assert_eq!(
            code_of(answer.status.as_ref()),
            expected,
            "case {index}: {answer:?}"
        );
    }
    let metrics = common::http_get(broker.process.http, "/metrics")
        .await
        .unwrap()
        .1;
    assert!(
        metrics.contains("reason=\"signature-mismatch\"} 1"),
        "gRPC refusals are counted with the remoting port's: {metrics}"
    );
}

#[tokio::test]
async fn tls_serves_the_remoting_ports_certificate_and_refuses_plain_when_enforcing() {
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let cert_file = dir.path().join("tls.crt");
    let key_file = dir.path().join("tls.key");
    std::fs::write(&cert_file, certified.cert.pem()).unwrap();
    std::fs::write(&key_file, certified.key_pair.serialize_pem()).unwrap();
    let broker = start(
        dir.path(),
        &[
            "--tls-mode",
            "enforcing",
            "--tls-cert-file",
            cert_file.to_str().unwrap(),
            "--tls-key-file",
            key_file.to_str().unwrap(),
        ],
    )
    .await;
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(certified.cert.pem()))
        .domain_name("localhost");
    let channel = Endpoint::from_shared(format!("https://{}", broker.grpc))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .timeout(CALL_BOUND)
        .connect()
        .await
        .expect("TLS connect");
    let mut client = MessagingServiceClient::new(channel);
    let route = client
        .query_route(call(
            v2::QueryRouteRequest {
                topic: resource("Secure"),
                endpoints: None,
            },
            "c",
        ))
        .await
        .expect("QueryRoute over TLS")
        .into_inner();
    assert_eq!(code_of(route.status.as_ref()), Code::Ok);
    let plain = Endpoint::from_shared(format!("http://{}", broker.grpc))
        .unwrap()
        .timeout(CALL_BOUND)
        .connect()
        .await;
    if let Ok(channel) = plain {
        let answer = MessagingServiceClient::new(channel)
            .query_route(call(v2::QueryRouteRequest::default(), "c"))
            .await;
        assert!(answer.is_err(), "a plain connection is closed: {answer:?}");
    }
}

#[tokio::test]
async fn calls_quiver_does_not_serve_are_refused_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    let pull = tokio::time::timeout(
        CALL_BOUND,
        client.pull_message(call(v2::PullMessageRequest::default(), "c")),
    )
    .await
    .expect("answered, not hung");
    let refused = pull.expect_err("PullMessage is refused");
    assert_eq!(refused.code(), RpcCode::Unimplemented);
    assert!(
        refused.message().contains("ReceiveMessage"),
        "{}",
        refused.message()
    );
    let offset = client
        .update_offset(call(v2::UpdateOffsetRequest::default(), "c"))
        .await
        .expect_err("UpdateOffset is refused");
    assert_eq!(offset.code(), RpcCode::Unimplemented);
    // A call newer than this contract (RecallMessage, lite topics...).
    let channel = Endpoint::from_shared(format!("http://{}", broker.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/apache.rocketmq.v2.MessagingService/RecallMessage",
    );
    let codec = quiver_grpc_proto::tonic_prost::ProstCodec::<
        v2::HeartbeatRequest,
        v2::HeartbeatResponse,
    >::default();
    let recall = tokio::time::timeout(
        CALL_BOUND,
        grpc.unary(Request::new(v2::HeartbeatRequest::default()), path, codec),
    )
    .await
    .expect("answered, not hung");
    assert_eq!(
        recall.expect_err("unknown call").code(),
        RpcCode::Unimplemented
    );
    let (_, metrics) = common::http_get(broker.process.http, "/metrics")
        .await
        .expect("metrics");
    for call in ["PullMessage", "UpdateOffset"] {
        assert!(
            metrics.contains(&format!("call=\"{call}\",code=\"NOT_IMPLEMENTED\"}} 1")),
            "{call} refusal counted: {metrics}"
        );
    }
}

/// Receives from `topic` as `group`: (status code, messages).
async fn receive(
    client: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible: Duration,
    long_poll: Duration,
) -> (Code, Vec<v2::Message>) {
    let as_client = ("consumer-1", false);
    receive_as(client, as_client, group, topic, invisible, long_poll).await
}

/// Receives as `client_id`, asking the broker to renew what it hands out when `auto_renew`.
async fn receive_as(
    client: &mut MessagingServiceClient<Channel>,
    (client_id, auto_renew): (&str, bool),
    group: &str,
    topic: &str,
    invisible: Duration,
    long_poll: Duration,
) -> (Code, Vec<v2::Message>) {
    let request = v2::ReceiveMessageRequest {
        group: resource(group),
        message_queue: Some(v2::MessageQueue {
            topic: resource(topic),
            id: -1,
            ..Default::default()
        }),
        filter_expression: Some(v2::FilterExpression {
            r#type: v2::FilterType::Tag as i32,
            expression: "*".into(),
        }),
        batch_size: 32,
        invisible_duration: Some(proto_duration(invisible)),
        auto_renew,
        long_polling_timeout: Some(proto_duration(long_poll)),
        attempt_id: None,
    };
    let mut request = call(request, client_id);
    request.set_timeout(long_poll + Duration::from_secs(5));
    let mut stream = client
        .receive_message(request)
        .await
        .expect("ReceiveMessage answers")
        .into_inner();
    let mut code = None;
    let mut messages = Vec::new();
    while let Some(response) = stream.message().await.expect("a healthy stream") {
        match response.content {
            Some(v2::receive_message_response::Content::Status(status)) => {
                code = Some(Code::try_from(status.code).unwrap())
            }
            Some(v2::receive_message_response::Content::Message(message)) => messages.push(message),
            _ => {}
        }
    }
    (code.expect("a status"), messages)
}

fn proto_duration(of: Duration) -> quiver_grpc_proto::prost_types::Duration {
    quiver_grpc_proto::prost_types::Duration {
        seconds: i64::try_from(of.as_secs()).unwrap(),
        nanos: i32::try_from(of.subsec_nanos()).unwrap(),
    }
}

fn system(message: &v2::Message) -> &v2::SystemProperties {
    message
        .system_properties
        .as_ref()
        .expect("system properties")
}

async fn ack(
    client: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    message: &v2::Message,
) -> Code {
    let request = v2::AckMessageRequest {
        group: resource(group),
        topic: resource(topic),
        entries: vec![v2::AckMessageEntry {
            message_id: system(message).message_id.clone(),
            receipt_handle: system(message).receipt_handle.clone().unwrap(),
        }],
    };
    let answer = client
        .ack_message(call(request, "consumer-1"))
        .await
        .expect("AckMessage answers")
        .into_inner();
    code_of(answer.status.as_ref())
}

/// Receives until `wanted` messages came or the bound passes.
async fn receive_until(
    client: &mut MessagingServiceClient<Channel>,
    group: &str,
    topic: &str,
    invisible: Duration,
    wanted: usize,
) -> Vec<v2::Message> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < wanted && tokio::time::Instant::now() < deadline {
        let (_, messages) = receive(client, group, topic, invisible, Duration::from_secs(2)).await;
        got.extend(messages);
    }
    got
}

#[tokio::test]
async fn received_messages_are_acked_redelivered_renewed_and_dead_lettered() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    for (id, body) in [("ID-W1", "first"), ("ID-W2", "second"), ("ID-W3", "third")] {
        let sent = send(&mut client, vec![message("Work", id, body)]).await;
        assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    }
    let invisible = Duration::from_secs(2);
    let mut received = receive_until(&mut client, "Workers", "Work", invisible, 3).await;
    received.sort_by_key(|m| system(m).message_id.clone());
    let ids: Vec<&str> = received
        .iter()
        .map(|m| system(m).message_id.as_str())
        .collect();
    assert_eq!(ids, ["ID-W1", "ID-W2", "ID-W3"]);
    for message in &received {
        assert_eq!(system(message).delivery_attempt, Some(1));
        assert_eq!(system(message).tag.as_deref(), Some("TagA"));
        assert_eq!(
            message.user_properties.get("origin").map(String::as_str),
            Some("grpc")
        );
    }
    let (first, second, third) = (&received[0], &received[1], &received[2]);
    assert_eq!(ack(&mut client, "Workers", "Work", first).await, Code::Ok);
    assert_eq!(
        ack(&mut client, "Workers", "Work", first).await,
        Code::InvalidReceiptHandle,
        "a handle acks once"
    );
    // Third: dead-lettered by the client's request.
    let forwarded = client
        .forward_message_to_dead_letter_queue(call(
            v2::ForwardMessageToDeadLetterQueueRequest {
                group: resource("Workers"),
                topic: resource("Work"),
                receipt_handle: system(third).receipt_handle.clone().unwrap(),
                message_id: system(third).message_id.clone(),
                delivery_attempt: 1,
                max_delivery_attempts: 16,
            },
            "consumer-1",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        code_of(forwarded.status.as_ref()),
        Code::Ok,
        "{forwarded:?}"
    );
    // Second: not acked in time, so delivered again, one attempt more.
    let again = receive_until(&mut client, "Workers", "Work", Duration::from_secs(30), 1).await;
    assert_eq!(again.len(), 1, "only the unacked one comes back: {again:?}");
    assert_eq!(system(&again[0]).message_id, system(second).message_id);
    assert_eq!(system(&again[0]).delivery_attempt, Some(2));
    let renewed = client
        .change_invisible_duration(call(
            v2::ChangeInvisibleDurationRequest {
                group: resource("Workers"),
                topic: resource("Work"),
                receipt_handle: system(&again[0]).receipt_handle.clone().unwrap(),
                invisible_duration: Some(proto_duration(Duration::from_secs(60))),
                message_id: system(&again[0]).message_id.clone(),
            },
            "consumer-1",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(code_of(renewed.status.as_ref()), Code::Ok, "{renewed:?}");
    assert_eq!(
        ack(&mut client, "Workers", "Work", &again[0]).await,
        Code::InvalidReceiptHandle,
        "the old handle stopped working"
    );
    let mut renewed_message = again[0].clone();
    renewed_message
        .system_properties
        .as_mut()
        .unwrap()
        .receipt_handle = Some(renewed.receipt_handle);
    assert_eq!(
        ack(&mut client, "Workers", "Work", &renewed_message).await,
        Code::Ok
    );
    let dead = pull_dlq(broker.process.addr, "Workers").await;
    assert_eq!(dead, ["ID-W3"]);
}

async fn pull_dlq(addr: SocketAddr, group: &str) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    let pulled = client
        .pull("DlqReader", &format!("%DLQ%{group}"), 0, 0, 0, None)
        .await;
    if pulled.code != response::SUCCESS {
        return Vec::new();
    }
    quiver_store::record::decode_all(&pulled.body)
        .unwrap()
        .iter()
        .filter_map(|r| property(r, "UNIQ_KEY").map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn an_empty_receive_answers_before_the_clients_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    let mut admin = Client::connect(broker.process.addr).await;
    assert_eq!(
        admin.create_topic("Quiet", QUEUES).await.code,
        response::SUCCESS
    );
    let request = v2::ReceiveMessageRequest {
        group: resource("Listeners"),
        message_queue: Some(v2::MessageQueue {
            topic: resource("Quiet"),
            id: -1,
            ..Default::default()
        }),
        batch_size: 1,
        invisible_duration: Some(proto_duration(Duration::from_secs(10))),
        // Far longer than the deadline below: the broker must cut it short.
        long_polling_timeout: Some(proto_duration(Duration::from_secs(120))),
        ..Default::default()
    };
    let mut request = call(request, "consumer-1");
    request.set_timeout(Duration::from_secs(3));
    let answered = client.receive_message(request).await;
    let mut stream = answered
        .expect("answered, not DEADLINE_EXCEEDED")
        .into_inner();
    let first = stream
        .message()
        .await
        .expect("a healthy stream")
        .expect("a status");
    let Some(v2::receive_message_response::Content::Status(status)) = first.content else {
        panic!("a status first: {first:?}");
    };
    assert_eq!(Code::try_from(status.code).unwrap(), Code::MessageNotFound);
    let missing = receive(
        &mut client,
        "Listeners",
        "NoSuchTopic",
        Duration::from_secs(10),
        Duration::ZERO,
    )
    .await;
    assert_eq!(missing.0, Code::TopicNotFound);
}

#[tokio::test]
async fn messages_cross_between_4x_and_5x_clients_both_ways() {
    use quiver_client::{ClientConfig, Message as RemotingMessage, Producer, ProducerConfig};
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut admin = Client::connect(broker.process.addr).await;
    assert_eq!(
        admin.create_topic("Bridge", QUEUES).await.code,
        response::SUCCESS
    );
    // 4.x -> 5.x.
    let producer = Producer::new(ProducerConfig::new(&broker.process.addr.to_string()));
    let sent = producer
        .send(
            RemotingMessage::new("Bridge", "from-4x")
                .with_tags("Old")
                .with_keys(["order-1", "order-2"])
                .with_property("region", "eu"),
        )
        .await
        .expect("4.x send");
    producer.shutdown().await;
    let mut client = connect(broker.grpc).await;
    let received = receive_until(
        &mut client,
        "Bridgers",
        "Bridge",
        Duration::from_secs(30),
        1,
    )
    .await;
    assert_eq!(received.len(), 1);
    let from_4x = &received[0];
    assert_eq!(
        system(from_4x).message_id,
        sent.msg_id,
        "the UNIQ_KEY is the 5.x message id"
    );
    assert_eq!(system(from_4x).tag.as_deref(), Some("Old"));
    assert_eq!(system(from_4x).keys, ["order-1", "order-2"]);
    assert_eq!(
        from_4x.user_properties.get("region").map(String::as_str),
        Some("eu")
    );
    assert_eq!(from_4x.body, &b"from-4x"[..]);
    assert_eq!(
        ack(&mut client, "Bridgers", "Bridge", from_4x).await,
        Code::Ok
    );
    // 5.x -> 4.x.
    let sent = send(
        &mut client,
        vec![message("Bridge", "ID-FROM-5X", "from-5x")],
    )
    .await;
    assert_eq!(code_of(sent.status.as_ref()), Code::Ok);
    let consumer = quiver_client::PullConsumer::new(
        ClientConfig::new(&broker.process.addr.to_string()),
        "OldReaders",
    );
    let subscription = quiver_client::Subscription::new("Bridge", "*");
    let mut found = Vec::new();
    for queue in consumer.queues("Bridge").await.unwrap() {
        let pulled = consumer
            .pull(
                &queue,
                quiver_client::QueueOffset(0),
                32,
                &subscription,
                None,
            )
            .await
            .unwrap();
        if let quiver_client::PullStatus::Found(messages) = pulled.status {
            found.extend(messages);
        }
    }
    let from_5x = found
        .iter()
        .find(|m| m.properties.get("UNIQ_KEY").map(String::as_str) == Some("ID-FROM-5X"))
        .expect("the 5.x message, by its id");
    assert_eq!(&from_5x.body[..], b"from-5x");
    assert_eq!(
        from_5x.properties.get("TAGS").map(String::as_str),
        Some("TagA")
    );
    assert_eq!(
        from_5x.properties.get("KEYS").map(String::as_str),
        Some("k1 k2")
    );
    assert_eq!(
        from_5x.properties.get("origin").map(String::as_str),
        Some("grpc")
    );
}

#[tokio::test]
async fn an_orderly_group_gets_a_message_groups_messages_in_order_one_batch_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    create_orderly_group(broker.process.addr, "Sequencers").await;
    let mut client = connect(broker.grpc).await;
    let fifo = |index: usize| {
        let mut fifo = message("Seq", &format!("ID-SEQ-{index}"), &format!("s{index}"));
        let system = fifo.system_properties.as_mut().unwrap();
        system.message_group = Some("account-7".into());
        system.message_type = MessageType::Fifo as i32;
        fifo
    };
    for index in 0..4 {
        let sent = send(&mut client, vec![fifo(index)]).await;
        assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    }
    let invisible = Duration::from_secs(30);
    let batch = receive_until(&mut client, "Sequencers", "Seq", invisible, 4).await;
    let bodies: Vec<&[u8]> = batch.iter().map(|m| &m.body[..]).collect();
    assert_eq!(bodies, [b"s0", b"s1", b"s2", b"s3"], "the group's order");
    assert_eq!(
        system(&batch[0]).message_group.as_deref(),
        Some("account-7")
    );
    let sent = send(&mut client, vec![fifo(4)]).await;
    assert_eq!(code_of(sent.status.as_ref()), Code::Ok);
    let (blocked, none) =
        receive(&mut client, "Sequencers", "Seq", invisible, Duration::ZERO).await;
    assert_eq!(
        (blocked, none.len()),
        (Code::MessageNotFound, 0),
        "the queue waits for its batch's acks"
    );
    for message in &batch {
        assert_eq!(
            ack(&mut client, "Sequencers", "Seq", message).await,
            Code::Ok
        );
    }
    let next = receive_until(&mut client, "Sequencers", "Seq", invisible, 1).await;
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].body, &b"s4"[..]);
}

#[tokio::test]
async fn auto_renew_holds_a_message_while_its_client_is_connected_and_acks_by_the_first_handle() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    for (id, body) in [("ID-R1", "kept"), ("ID-R2", "let go")] {
        let sent = send(&mut client, vec![message("Renew", id, body)]).await;
        assert_eq!(code_of(sent.status.as_ref()), Code::Ok, "{sent:?}");
    }
    let settings = v2::Settings {
        client_type: Some(v2::ClientType::PushConsumer as i32),
        pub_sub: Some(v2::settings::PubSub::Subscription(v2::Subscription {
            group: resource("Renewers"),
            ..Default::default()
        })),
        ..Default::default()
    };
    // The holder's Telemetry stream is open: it is connected.
    let (_answers, holder_stream) = open_telemetry(&mut client, "holder", settings).await;
    let invisible = Duration::from_secs(2);
    let long_poll = Duration::from_secs(2);
    let mut held = Vec::new();
    for _ in 0..10 {
        let holder = ("holder", true);
        let (_, got) = receive_as(
            &mut client,
            holder,
            "Renewers",
            "Renew",
            invisible,
            long_poll,
        )
        .await;
        held.extend(got);
        if held.len() == 2 {
            break;
        }
    }
    held.sort_by_key(|m| system(m).message_id.clone());
    assert_eq!(held.len(), 2, "both received");
    // Two and a half invisible times later, nobody else gets them: they were renewed.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let other = ("other", false);
    let (code, again) = receive_as(
        &mut client,
        other,
        "Renewers",
        "Renew",
        invisible,
        long_poll,
    )
    .await;
    assert_eq!(code, Code::MessageNotFound, "{again:?}");
    // The handle the holder received still acks (the renewed one is applied).
    assert_eq!(
        ack(&mut client, "Renewers", "Renew", &held[0]).await,
        Code::Ok
    );
    // The holder goes away: the other message comes back once its invisible time passes.
    drop(holder_stream);
    let back = receive_until(&mut client, "Renewers", "Renew", Duration::from_secs(30), 1).await;
    let ids: Vec<&str> = back.iter().map(|m| system(m).message_id.as_str()).collect();
    assert_eq!(ids, ["ID-R2"]);
    assert_eq!(system(&back[0]).delivery_attempt, Some(2));
    let (code, after) = receive_as(
        &mut client,
        other,
        "Renewers",
        "Renew",
        invisible,
        long_poll,
    )
    .await;
    assert_eq!(
        code,
        Code::MessageNotFound,
        "the acked one never comes back: {after:?}"
    );
}

#[tokio::test]
async fn grpc_connections_share_the_remoting_ports_connection_limit() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &["--max-connections", "1"]).await;
    let heartbeat = || v2::HeartbeatRequest {
        group: resource("G"),
        client_type: v2::ClientType::Producer as i32,
    };
    // The one slot goes to a remoting client (a call proves it was accepted).
    let mut remoting = Client::connect(broker.process.addr).await;
    let body = Bytes::from_static(br#"{"clientID":"c","producerDataSet":[],"consumerDataSet":[]}"#);
    let answered = remoting.call(request::HEART_BEAT, ext(&[]), body).await;
    assert_eq!(answered.code, response::SUCCESS, "{answered:?}");
    let endpoint = Endpoint::from_shared(format!("http://{}", broker.grpc)).unwrap();
    let mut refused = MessagingServiceClient::new(endpoint.connect_lazy());
    let attempt = tokio::time::timeout(CALL_BOUND, refused.heartbeat(call(heartbeat(), "c")));
    attempt
        .await
        .expect("answered, not hung")
        .expect_err("closed on accept: no slot left");
    // The remoting client leaves: its slot serves a gRPC connection.
    drop(remoting);
    wait_for(
        "a gRPC call once the slot is free",
        Duration::from_secs(10),
        || async {
            let mut client = MessagingServiceClient::new(endpoint.connect_lazy());
            client.heartbeat(call(heartbeat(), "c")).await.is_ok()
        },
    )
    .await;
    let (_, metrics) = common::http_get(broker.process.http, "/metrics")
        .await
        .expect("metrics");
    let closed = metrics
        .lines()
        .find(|l| {
            l.starts_with("quiver_connections_closed_total") && l.contains("max-connections\"")
        })
        .unwrap_or_default();
    assert!(!closed.ends_with(" 0") && !closed.is_empty(), "{metrics}");
}

#[tokio::test]
async fn a_5x_consumer_is_a_member_of_its_group_while_its_telemetry_stream_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start(dir.path(), &[]).await;
    let mut client = connect(broker.grpc).await;
    let mut remoting = Client::connect(broker.process.addr).await;
    let settings = v2::Settings {
        client_type: Some(v2::ClientType::SimpleConsumer as i32),
        user_agent: Some(v2::Ua {
            language: v2::Language::Python as i32,
            ..Default::default()
        }),
        pub_sub: Some(v2::settings::PubSub::Subscription(v2::Subscription {
            group: resource("Watchers"),
            ..Default::default()
        })),
        ..Default::default()
    };
    let (mut answers, stream) = open_telemetry(&mut client, "watcher-1", settings).await;
    next_command(&mut answers).await;
    let header = ext(&[("consumerGroup", "Watchers")]);
    let listed = remoting
        .call(
            request::GET_CONSUMER_CONNECTION_LIST,
            header.clone(),
            Bytes::new(),
        )
        .await;
    assert_eq!(listed.code, response::SUCCESS, "{listed:?}");
    let body = quiver_protocol::body::ConsumerConnection::decode(&listed.body).unwrap();
    let members: Vec<(&str, &str)> = body
        .connection_set
        .iter()
        .map(|c| (c.client_id.as_str(), c.language.as_str()))
        .collect();
    assert_eq!(members, [("watcher-1", "PYTHON")]);
    assert_eq!(
        body.consume_type,
        quiver_protocol::body::ConsumeType::ConsumePop
    );
    // The stream ends: no member is left.
    drop((stream, answers));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let listed = remoting
            .call(
                request::GET_CONSUMER_CONNECTION_LIST,
                header.clone(),
                Bytes::new(),
            )
            .await;
        if listed.code == response::CONSUMER_NOT_ONLINE {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still listed: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
