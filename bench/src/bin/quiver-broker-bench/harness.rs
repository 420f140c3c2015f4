//! What every mode's scenarios share: the `--tls`/`--acl` setup, an in-process broker with
//! the bench topic, a client connection that reads its own answers, and the request fields
//! of a send and of a pull.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_broker::{BrokerConfig, TlsMode};
use quiver_protocol::acl::Credentials;
use quiver_protocol::code::{request, response};
use quiver_protocol::{ExtFields, RemotingCommand};
use quiver_remoting::tls::{self, AnyRead, TlsClient, TlsClientConfig};
use quiver_remoting::{Connection, Incoming, Options};
use tokio::net::{TcpListener, TcpStream};

use crate::Args;

/// What `--tls` and `--acl` set up once: the files the broker reads and what clients use.
pub(crate) struct Security {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) tls: Option<TlsClient>,
    pub(crate) credentials: Option<Arc<Credentials>>,
}

pub(crate) const BENCH_ACCESS_KEY: &str = "bench01";
pub(crate) const BENCH_SECRET_KEY: &str = "bench-secret";

impl Security {
    pub(crate) fn new(args: &Args) -> anyhow::Result<Security> {
        let dir = tempfile::tempdir()?;
        let mut tls = None;
        if args.tls {
            let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()])?;
            std::fs::write(dir.path().join("tls.crt"), certified.cert.pem())?;
            std::fs::write(
                dir.path().join("tls.key"),
                certified.key_pair.serialize_pem(),
            )?;
            let client = TlsClientConfig {
                ca_file: Some(dir.path().join("tls.crt")),
                server_name: Some("localhost".into()),
                ..TlsClientConfig::default()
            };
            tls = Some(client.connector().map_err(anyhow::Error::msg)?);
        }
        let mut credentials = None;
        if args.acl {
            let accounts = format!(
                "accounts:\n  - accessKey: {BENCH_ACCESS_KEY}\n    secretKey: {BENCH_SECRET_KEY}\n    admin: true\n"
            );
            std::fs::write(dir.path().join("plain_acl.yml"), accounts)?;
            credentials = Some(Arc::new(Credentials::new(
                BENCH_ACCESS_KEY,
                BENCH_SECRET_KEY,
            )));
        }
        Ok(Security {
            dir,
            tls,
            credentials,
        })
    }

    /// Neither TLS nor ACL (the timers mode's child broker).
    pub(crate) fn none() -> anyhow::Result<Security> {
        Ok(Security {
            dir: tempfile::tempdir()?,
            tls: None,
            credentials: None,
        })
    }

    /// The broker side of the same settings.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) {
        if self.tls.is_some() {
            config.tls_mode = TlsMode::Enforcing;
            config.tls_cert_file = Some(self.dir.path().join("tls.crt"));
            config.tls_key_file = Some(self.dir.path().join("tls.key"));
        }
        if self.credentials.is_some() {
            config.acl_file = Some(self.dir.path().join("plain_acl.yml"));
        }
    }

    pub(crate) fn describe(&self) -> &'static str {
        match (self.tls.is_some(), self.credentials.is_some()) {
            (false, false) => "plain",
            (true, false) => "TLS enforcing",
            (false, true) => "ACL on",
            (true, true) => "TLS enforcing + ACL on",
        }
    }
}

pub(crate) const QUEUES: u32 = 8;
pub(crate) const TOPIC: &str = "Bench";

pub(crate) fn epoch() -> Instant {
    static START: OnceLock<Instant> = OnceLock::new();
    *START.get_or_init(Instant::now)
}

pub(crate) fn stamp_nanos() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// A body whose first 8 bytes carry the send time, for end-to-end latency.
pub(crate) fn body(size: usize) -> Bytes {
    let mut body = vec![b'x'; size.max(8)];
    body[..8].copy_from_slice(&stamp_nanos().to_be_bytes());
    Bytes::from(body)
}

/// Bounds one request, long polls included.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A client connection whose answers are read by the task waiting for them.
pub(crate) struct Conn {
    pub(crate) connection: Connection,
    pub(crate) incoming: Incoming<AnyRead>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.connection.close();
    }
}

impl Conn {
    /// A plain, unsigned connection.
    pub(crate) async fn connect_plain(addr: SocketAddr) -> anyhow::Result<Conn> {
        Conn::connect(addr, &Security::none()?).await
    }

    pub(crate) async fn connect(addr: SocketAddr, security: &Security) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let options = Options {
            credentials: security.credentials.clone(),
            ..Options::new(addr.to_string())
        };
        let (connection, incoming) =
            tls::start(stream, "localhost:0", security.tls.as_ref(), options).await?;
        Ok(Conn {
            connection,
            incoming,
        })
    }

    /// One request at a time, so the caller reads too: its answer arrives without a task
    /// switch, as the hand-written loop this replaced did (the figures are the broker's).
    pub(crate) async fn call(
        &mut self,
        code: i32,
        ext: ExtFields,
        body: Bytes,
    ) -> anyhow::Result<RemotingCommand> {
        let request = RemotingCommand::request(code, ext).with_body(body);
        let answer = self.connection.request(request, CALL_TIMEOUT);
        tokio::pin!(answer);
        loop {
            tokio::select! {
                biased;
                answered = &mut answer => return Ok(answered?),
                // Routes the answer; the broker pushes nothing to these connections.
                read = self.incoming.next() => if read?.is_none() {
                    bail!("broker closed the connection");
                },
            }
        }
    }
}

pub(crate) fn send_ext(queue_id: u32, batch: bool) -> ExtFields {
    [
        ("a", "BenchProducer".to_string()),
        ("b", TOPIC.to_string()),
        ("c", "TBW102".to_string()),
        ("d", "8".to_string()),
        ("e", queue_id.to_string()),
        ("f", "0".to_string()),
        ("g", quiver_broker::now_ms().to_string()),
        ("h", "0".to_string()),
        ("i", "TAGS\u{1}bench\u{2}".to_string()),
        ("j", "0".to_string()),
        ("k", "false".to_string()),
        ("m", batch.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// PULL_MESSAGE's fields: up to `max` messages of `topic`'s queue `queue_id` from `offset`
/// for `group`, with `sys_flag` and a long poll of up to `suspend_ms` (0: none).
pub(crate) fn pull_ext(
    group: &str,
    topic: &str,
    queue_id: u32,
    offset: u64,
    max: u32,
    sys_flag: u32,
    suspend_ms: u64,
) -> ExtFields {
    [
        ("consumerGroup", group.to_string()),
        ("topic", topic.to_string()),
        ("queueId", queue_id.to_string()),
        ("queueOffset", offset.to_string()),
        ("maxMsgNums", max.to_string()),
        ("sysFlag", sys_flag.to_string()),
        ("commitOffset", "-1".to_string()),
        ("suspendTimeoutMillis", suspend_ms.to_string()),
        ("subVersion", "0".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// An in-process broker with the bench topic, and a connection to it.
pub(crate) struct RunningBroker {
    pub(crate) addr: SocketAddr,
    pub(crate) conn: Conn,
    pub(crate) stop: tokio::sync::oneshot::Sender<()>,
    pub(crate) task: tokio::task::JoinHandle<Result<(), quiver_broker::BrokerError>>,
}

impl RunningBroker {
    pub(crate) async fn stop(self) -> anyhow::Result<()> {
        drop(self.conn);
        self.stop.send(()).ok();
        self.task.await?.context("broker run")?;
        Ok(())
    }
}

/// Starts a broker on a free loopback port over `dir` and creates the bench topic.
pub(crate) async fn start_broker(
    args: &Args,
    security: &Security,
    dir: &std::path::Path,
) -> anyhow::Result<RunningBroker> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let mut config = BrokerConfig {
        data_dir: dir.to_path_buf(),
        listen: addr.to_string(),
        http_listen: "127.0.0.1:0".into(),
        advertise: Some(addr.to_string()),
        flush_mode: args.flush_mode,
        segment_size: 256 * 1024 * 1024,
        ..BrokerConfig::default()
    };
    security.apply(&mut config);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let broker = tokio::spawn(quiver_broker::run_with_grpc(
        config,
        listener,
        None,
        None,
        async move {
            let _ = stopped.await;
        },
    ));
    let mut setup = loop {
        match Conn::connect(addr, security).await {
            Ok(conn) => break conn,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    create_topic(&mut setup, TOPIC).await?;
    Ok(RunningBroker {
        addr,
        conn: setup,
        stop,
        task: broker,
    })
}

/// UPDATE_AND_CREATE_TOPIC with QUEUES read and write queues.
pub(crate) async fn create_topic(conn: &mut Conn, topic: &str) -> anyhow::Result<()> {
    let queues = QUEUES.to_string();
    let ext = [
        ("topic", topic),
        ("readQueueNums", &queues),
        ("writeQueueNums", &queues),
        ("perm", "6"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let reply = conn
        .call(request::UPDATE_AND_CREATE_TOPIC, ext, Bytes::new())
        .await?;
    if reply.code != response::SUCCESS {
        bail!("creating {topic} failed: {} {:?}", reply.code, reply.remark);
    }
    Ok(())
}
