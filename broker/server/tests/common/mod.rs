//! Shared test harness: an in-process broker on free loopback ports and a minimal client.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quiver_broker::broker::BrokerSlot;
use quiver_broker::{BrokerConfig, BrokerError};
use quiver_protocol::acl::Credentials;
use quiver_protocol::code::request;
use quiver_protocol::{frame, ExtFields, RemotingCommand, SerializeType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Bound on any single request in tests.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// A broker running in this process.
pub struct TestBroker {
    pub addr: SocketAddr,
    pub http: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), BrokerError>>>,
}

/// A config for tests: tiny segments, fast persistence, this directory.
pub fn test_config(dir: &Path) -> BrokerConfig {
    BrokerConfig {
        data_dir: dir.to_path_buf(),
        listen: "127.0.0.1:0".into(),
        http_listen: "127.0.0.1:0".into(),
        segment_size: 1024 * 1024,
        max_message_size: 256 * 1024,
        persist_interval_ms: 200,
        shutdown_timeout_ms: 5_000,
        // The machine's own disk usage must not refuse sends or delete files here.
        disk_high_water_ratio: 1.0,
        disk_clean_ratio: 1.0,
        disk_force_clean_ratio: 1.0,
        ..BrokerConfig::default()
    }
}

impl TestBroker {
    pub async fn start(mut config: BrokerConfig) -> TestBroker {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
        let addr = listener.local_addr().unwrap();
        let http_addr = http.local_addr().unwrap();
        config.listen = addr.to_string();
        config.http_listen = http_addr.to_string();
        config.advertise = Some(addr.to_string());
        Self::start_on(config, listener, http).await
    }

    /// Starts on listeners the caller bound (to know every address before any broker runs).
    pub async fn start_on(
        config: BrokerConfig,
        listener: TcpListener,
        http: TcpListener,
    ) -> TestBroker {
        Self::start_on_slot(config, listener, http, BrokerSlot::default()).await
    }

    /// Starts on free ports and hands out the broker itself (its services, such as `pop`).
    pub async fn start_with_broker(
        mut config: BrokerConfig,
    ) -> (TestBroker, std::sync::Arc<quiver_broker::broker::Broker>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
        config.listen = listener.local_addr().unwrap().to_string();
        config.http_listen = http.local_addr().unwrap().to_string();
        config.advertise = Some(config.listen.clone());
        let slot = BrokerSlot::default();
        let started = Self::start_on_slot(config, listener, http, slot.clone()).await;
        let broker = slot
            .get()
            .expect("the broker opened before it was ready")
            .clone();
        (started, broker)
    }

    async fn start_on_slot(
        config: BrokerConfig,
        listener: TcpListener,
        http: TcpListener,
        slot: BrokerSlot,
    ) -> TestBroker {
        let addr = listener.local_addr().unwrap();
        let http_addr = http.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = tokio::spawn(quiver_broker::server::run_with_slot(
            config,
            listener,
            Some(http),
            shutdown,
            slot,
        ));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while http_get(http_addr, "/readyz")
            .await
            .is_none_or(|(status, _)| status != 200)
        {
            if task.is_finished() {
                panic!("broker exited before ready: {:?}", task.await);
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "broker not ready in time"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        TestBroker {
            addr,
            http: http_addr,
            stop: Some(stop),
            task: Some(task),
        }
    }

    /// Stops the broker and waits for its clean exit.
    pub async fn stop(mut self) {
        self.stop.take().unwrap().send(()).ok();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(20), task)
            .await
            .expect("broker stops within its bound")
            .expect("broker task did not panic")
            .expect("broker exits cleanly");
    }

    pub async fn client(&self) -> Client {
        Client::connect(self.addr).await
    }

    pub async fn metrics(&self) -> String {
        http_get(self.http, "/metrics")
            .await
            .expect("metrics answered")
            .1
    }
}

/// Polls `check` until it holds; panics after `limit`.
pub async fn wait_for<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A GET over HTTP/1.1: (status, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

impl TestBroker {
    /// Waits (at most 10 s) until exactly `count` pulls are parked.
    pub async fn wait_parked(&self, count: usize) {
        let gauge = format!("quiver_parked_pulls{{cluster=\"DefaultCluster\"}} {count}\n");
        wait_for(
            &format!("{count} parked pulls"),
            Duration::from_secs(10),
            || async { self.metrics().await.contains(&gauge) },
        )
        .await;
    }
}

/// A minimal remoting client.
pub struct Client {
    pub stream: TcpStream,
    buf: BytesMut,
    next_opaque: i32,
    /// Requests the broker pushed to us (e.g. NOTIFY_CONSUMER_IDS_CHANGED).
    pub pushed: Vec<RemotingCommand>,
    /// Signs every request of [`Client::call`] (RocketMQ ACL) when set.
    pub credentials: Option<Credentials>,
    /// How [`Client::call`] encodes request headers.
    pub serialize_type: SerializeType,
}

pub fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        Client::over(TcpStream::connect(addr).await.expect("connect"))
    }

    /// A client whose connection comes from `source` (any 127.0.0.0/8 address works on
    /// loopback), to stand for another host.
    pub async fn connect_from(source: std::net::IpAddr, addr: SocketAddr) -> Client {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::new(source, 0))
            .expect("bind the source");
        Client::over(socket.connect(addr).await.expect("connect"))
    }

    fn over(stream: TcpStream) -> Client {
        Client {
            stream,
            buf: BytesMut::new(),
            next_opaque: 1,
            pushed: Vec::new(),
            credentials: None,
            serialize_type: SerializeType::Json,
        }
    }

    /// This client, signing its calls as the account `access_key`.
    pub fn signing(mut self, access_key: &str, secret_key: &str) -> Client {
        self.credentials = Some(Credentials::new(access_key, secret_key));
        self
    }

    pub async fn write(&mut self, command: &RemotingCommand) {
        let mut out = BytesMut::new();
        frame::encode(command, &mut out).expect("encode");
        self.stream.write_all(&out).await.expect("write");
    }

    /// Reads the next frame; None when the broker closed the connection.
    pub async fn read(&mut self) -> Option<RemotingCommand> {
        loop {
            if let Some(command) = frame::decode(&mut self.buf).expect("broker frames decode") {
                return Some(command);
            }
            let read = tokio::time::timeout(CALL_TIMEOUT, self.stream.read_buf(&mut self.buf))
                .await
                .expect("broker answers in time");
            match read {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Sends a request and returns its response.
    pub async fn call(&mut self, code: i32, fields: ExtFields, body: Bytes) -> RemotingCommand {
        let opaque = self.next_opaque;
        self.next_opaque += 1;
        let mut request = RemotingCommand::request(code, fields)
            .with_opaque(opaque)
            .with_body(body)
            .with_serialize_type(self.serialize_type);
        if let Some(credentials) = &self.credentials {
            credentials.sign(&mut request);
        }
        self.write(&request).await;
        loop {
            let command = self.read().await.expect("connection open");
            if command.is_response() && command.opaque == opaque {
                return command;
            }
            if !command.is_response() {
                self.pushed.push(command);
            }
        }
    }

    pub async fn send(
        &mut self,
        topic: &str,
        queue_id: u32,
        body: &str,
        tags: &str,
    ) -> RemotingCommand {
        let properties = format!("TAGS\u{1}{tags}\u{2}KEYS\u{1}key-{body}\u{2}");
        let queue = queue_id.to_string();
        let born = quiver_broker::now_ms().to_string();
        self.call(
            request::SEND_MESSAGE,
            ext(&[
                ("producerGroup", "P"),
                ("topic", topic),
                ("defaultTopic", "TBW102"),
                ("defaultTopicQueueNums", "4"),
                ("queueId", &queue),
                ("sysFlag", "0"),
                ("bornTimestamp", &born),
                ("flag", "0"),
                ("properties", &properties),
                ("reconsumeTimes", "0"),
            ]),
            Bytes::from(body.to_string()),
        )
        .await
    }

    /// UPDATE_AND_CREATE_TOPIC with `queues` read and write queues, read-write; the answer.
    pub async fn create_topic(&mut self, topic: &str, queues: u32) -> RemotingCommand {
        let queues = queues.to_string();
        let fields = ext(&[
            ("topic", topic),
            ("readQueueNums", &queues),
            ("writeQueueNums", &queues),
            ("perm", "6"),
        ]);
        self.call(request::UPDATE_AND_CREATE_TOPIC, fields, Bytes::new())
            .await
    }

    /// A pull; `suspend_ms` > 0 sets the suspend flag; `commit` piggy-backs an offset.
    pub async fn pull(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        offset: u64,
        suspend_ms: u64,
        commit: Option<u64>,
    ) -> RemotingCommand {
        let mut sys_flag = 0;
        if suspend_ms > 0 {
            sys_flag |= 2;
        }
        if commit.is_some() {
            sys_flag |= 1;
        }
        let fields = ext(&[
            ("consumerGroup", group),
            ("topic", topic),
            ("queueId", &queue_id.to_string()),
            ("queueOffset", &offset.to_string()),
            ("maxMsgNums", "32"),
            ("sysFlag", &sys_flag.to_string()),
            ("commitOffset", &commit.map_or(-1, |c| c as i64).to_string()),
            ("suspendTimeoutMillis", &suspend_ms.to_string()),
            ("subscription", "*"),
            ("subVersion", "0"),
        ]);
        self.call(request::PULL_MESSAGE, fields, Bytes::new()).await
    }

    /// The committed offset, QUERY_NOT_FOUND when none (`setZeroIfNotFound=false`).
    pub async fn query_offset(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
    ) -> RemotingCommand {
        self.query_offset_with(group, topic, queue_id, &[("setZeroIfNotFound", "false")])
            .await
    }

    /// QUERY_CONSUMER_OFFSET with extra header fields (none: as 4.x clients send it).
    pub async fn query_offset_with(
        &mut self,
        group: &str,
        topic: &str,
        queue_id: u32,
        extra: &[(&str, &str)],
    ) -> RemotingCommand {
        let queue = queue_id.to_string();
        let mut fields = ext(&[
            ("consumerGroup", group),
            ("topic", topic),
            ("queueId", &queue),
        ]);
        fields.extend(ext(extra));
        self.call(request::QUERY_CONSUMER_OFFSET, fields, Bytes::new())
            .await
    }
}

/// Bodies of the records in a pull response.
pub fn pulled_bodies(response: &RemotingCommand) -> Vec<String> {
    quiver_store::record::decode_all(&response.body)
        .expect("pull body decodes")
        .into_iter()
        .map(|record| String::from_utf8_lossy(&record.body).into_owned())
        .collect()
}

/// SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE header fields (V2's one-letter names).
pub fn v2_send_fields(
    topic: &str,
    queue_id: &str,
    sys_flag: &str,
    properties: &str,
    batch: bool,
) -> ExtFields {
    let born = quiver_broker::now_ms().to_string();
    let batch = batch.to_string();
    ext(&[
        ("a", "P"),
        ("b", topic),
        ("c", "TBW102"),
        ("d", "4"),
        ("e", queue_id),
        ("f", sys_flag),
        ("g", &born),
        ("h", "0"),
        ("i", properties),
        ("j", "0"),
        ("k", "false"),
        ("m", &batch),
    ])
}

pub fn ext_u64(command: &RemotingCommand, key: &str) -> u64 {
    command
        .ext(key)
        .unwrap_or_else(|| panic!("{key} missing in {command:?}"))
        .parse()
        .expect("number")
}

/// A half message (sysFlag PREPARED, TRAN_MSG, PGROUP `group`) for `topic` queue `queue_id`;
/// `extra` properties are appended as `k\u{1}v\u{2}` pairs.
pub async fn send_half(
    client: &mut Client,
    group: &str,
    topic: &str,
    queue_id: u32,
    body: &str,
    extra: &[(&str, &str)],
) -> RemotingCommand {
    let mut properties =
        format!("TRAN_MSG\u{1}true\u{2}PGROUP\u{1}{group}\u{2}UNIQ_KEY\u{1}U-{body}\u{2}");
    for (key, value) in extra {
        properties.push_str(&format!("{key}\u{1}{value}\u{2}"));
    }
    let mut fields = v2_send_fields(topic, &queue_id.to_string(), "4", &properties, false);
    fields.insert("a", group);
    client
        .call(
            request::SEND_MESSAGE_V2,
            fields,
            Bytes::from(body.to_string()),
        )
        .await
}

/// END_TRANSACTION header fields for the half message a send answered.
pub fn end_fields(
    group: &str,
    half_reply: &RemotingCommand,
    outcome: i32,
    from_check: bool,
) -> ExtFields {
    let (_, commit_log_offset) =
        quiver_protocol::message::decode_offset_msg_id(half_reply.ext("msgId").expect("msgId"))
            .expect("offset msg id");
    end_fields_at(
        group,
        ext_u64(half_reply, "queueOffset"),
        commit_log_offset,
        outcome,
        from_check,
    )
}

/// END_TRANSACTION header fields for the half message at these offsets.
pub fn end_fields_at(
    group: &str,
    half_queue_offset: u64,
    commit_log_offset: u64,
    outcome: i32,
    from_check: bool,
) -> ExtFields {
    ext(&[
        ("producerGroup", group),
        ("tranStateTableOffset", &half_queue_offset.to_string()),
        ("commitLogOffset", &commit_log_offset.to_string()),
        ("commitOrRollback", &outcome.to_string()),
        ("fromTransactionCheck", &from_check.to_string()),
        ("msgId", "unused"),
    ])
}

/// A heartbeat announcing `client_id` as a producer of `group` on this connection.
pub async fn producer_heartbeat(client: &mut Client, client_id: &str, group: &str) {
    let body = format!(
        r#"{{"clientID":"{client_id}","producerDataSet":[{{"groupName":"{group}"}}],"consumerDataSet":[]}}"#
    );
    let reply = client
        .call(request::HEART_BEAT, ExtFields::default(), Bytes::from(body))
        .await;
    assert_eq!(reply.code, 0, "{reply:?}");
}

/// The records a pull answered.
pub fn pulled_records(response: &RemotingCommand) -> Vec<quiver_store::record::Record> {
    if response.body.is_empty() {
        return Vec::new();
    }
    quiver_store::record::decode_all(&response.body).expect("pull body decodes")
}

/// `quiver_connections_closed_total{reason}` in a scrape; panics when the series is missing.
pub fn connections_closed(metrics: &str, reason: &str) -> u64 {
    let labels = format!(r#"reason="{reason}""#);
    metrics
        .lines()
        .filter(|line| line.starts_with("quiver_connections_closed_total{"))
        .find(|line| line.contains(&labels))
        .and_then(|line| line.rsplit_once(' '))
        .map(|(_, value)| value.parse().unwrap())
        .unwrap_or_else(|| panic!("no {reason} series in\n{metrics}"))
}

/// Whether a new connection to `addr` gets a request answered (false when it is closed at
/// accept): a GET_MAX_OFFSET of `topic`'s queue 0.
pub async fn new_connection_answers(addr: SocketAddr, topic: &str) -> bool {
    let mut client = Client::connect(addr).await;
    let opaque = 77;
    let request = RemotingCommand::request(
        request::GET_MAX_OFFSET,
        ext(&[("topic", topic), ("queueId", "0")]),
    )
    .with_opaque(opaque);
    client.write(&request).await;
    client
        .read()
        .await
        .is_some_and(|reply| reply.opaque == opaque)
}

/// The `quiver-broker` binary as a child process (for kill -9 tests); killed when dropped.
pub struct BrokerProcess {
    pub child: std::process::Child,
    pub addr: SocketAddr,
    pub http: SocketAddr,
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

/// Starts the binary on free ports over `data_dir` (small segments, no disk limits, `extra`
/// flags), its stderr in `log`, and waits until it is ready.
pub async fn start_binary(data_dir: &Path, log: &Path, extra: &[&str]) -> BrokerProcess {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http_port = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = port.local_addr().unwrap();
    let http = http_port.local_addr().unwrap();
    drop((port, http_port));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .args(["--data-dir", data_dir.to_str().unwrap()])
        .args(["--listen", &addr.to_string()])
        .args(["--http-listen", &http.to_string()])
        .args(["--segment-size", "1048576", "--max-message-size", "65536"])
        .args(["--disk-high-water-ratio", "1", "--disk-clean-ratio", "1"])
        .args(["--disk-force-clean-ratio", "1"])
        // Brokers of parallel tests must not all bind the default gRPC port.
        .args(if extra.contains(&"--grpc-listen") {
            &[][..]
        } else {
            &["--grpc-listen", "off"][..]
        })
        .args(extra)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut broker = BrokerProcess { child, addr, http };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while http_get(http, "/readyz")
        .await
        .is_none_or(|(status, _)| status != 200)
    {
        assert!(
            broker.child.try_wait().unwrap().is_none(),
            "broker exited early: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        assert!(std::time::Instant::now() < deadline, "broker not ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    broker
}
