//! The connection layer: one [`Connection`] per broker address, opened on first use and
//! again on the next use after it died.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use quiver_protocol::acl::Credentials;
use quiver_protocol::{code, RemotingCommand, SerializeType};
use quiver_remoting::tls::{AnyRead, TlsClientConfig as TlsConfig};
use quiver_remoting::{Connection, ConnectionError, Incoming, Options};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::{ClientError, Result};

/// How long establishing a TCP connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

/// A request the broker sent us (NOTIFY_CONSUMER_IDS_CHANGED, RESET_CONSUMER_CLIENT_OFFSET, ...).
#[derive(Debug)]
pub struct InboundRequest {
    pub addr: String,
    pub command: RemotingCommand,
}

type LinkSlot = tokio::sync::Mutex<Option<Arc<Link>>>;

/// An open connection and the task reading it; dropping it closes both.
struct Link {
    connection: Connection,
    reader: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.connection.close();
        self.reader.abort();
    }
}

impl Link {
    async fn open(
        addr: &str,
        inbound: Option<mpsc::UnboundedSender<InboundRequest>>,
        credentials: Option<Arc<Credentials>>,
        tls: Option<&TlsConfig>,
    ) -> Result<Self> {
        let tls_error = |reason: String| ClientError::Tls {
            addr: addr.to_owned(),
            reason,
        };
        // Read at each connect, so renewed files are picked up by the next connection.
        let connector = tls
            .map(TlsConfig::connector)
            .transpose()
            .map_err(tls_error)?;
        let connect_error = |source| ClientError::Connect {
            addr: addr.to_owned(),
            source,
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|elapsed| {
                connect_error(std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed))
            })?
            .map_err(connect_error)?;
        // Requests are small and latency-bound: never wait for Nagle.
        stream.set_nodelay(true).map_err(|source| ClientError::Io {
            addr: addr.to_owned(),
            source,
        })?;
        let options = Options {
            credentials,
            ..Options::new(addr)
        };
        let (connection, incoming) =
            quiver_remoting::tls::start(stream, addr, connector.as_ref(), options)
                .await
                .map_err(|error| tls_error(error.to_string()))?;
        let reader = tokio::spawn(hand_over_inbound(
            addr.to_owned(),
            incoming,
            connection.clone(),
            inbound,
        ));
        Ok(Link { connection, reader })
    }
}

/// Reads the connection (which routes responses) and hands broker-initiated requests to
/// `inbound`, or refuses them when nobody takes them.
async fn hand_over_inbound(
    addr: String,
    mut incoming: Incoming<AnyRead>,
    connection: Connection,
    inbound: Option<mpsc::UnboundedSender<InboundRequest>>,
) {
    loop {
        let command = match incoming.next().await {
            Ok(Some(request)) => request.command,
            Ok(None) => return,
            Err(error) => {
                tracing::debug!(%addr, %error, "connection closed");
                return;
            }
        };
        match &inbound {
            Some(inbound) => {
                let addr = addr.clone();
                let _ = inbound.send(InboundRequest { addr, command });
            }
            None => {
                if let Some(response) = not_handled(&command, "this client") {
                    let _ = connection.respond(response).await;
                }
            }
        }
    }
}

/// The REQUEST_CODE_NOT_SUPPORTED answer to a broker request `handler` does not handle;
/// None for a oneway request (it gets no answer).
pub(crate) fn not_handled(command: &RemotingCommand, handler: &str) -> Option<RemotingCommand> {
    let remark = format!("request code {} is not handled by {handler}", command.code);
    (!command.is_oneway())
        .then(|| command.response_to(code::response::REQUEST_CODE_NOT_SUPPORTED, Some(remark)))
}

/// The client's error for a connection's.
fn client_error(addr: &str, error: ConnectionError) -> ClientError {
    let addr = addr.to_owned();
    match error {
        ConnectionError::Closed { .. } => ClientError::ConnectionClosed { addr },
        ConnectionError::Timeout {
            code, timeout_ms, ..
        } => ClientError::Timeout {
            addr,
            code,
            timeout_ms,
        },
        ConnectionError::Encode { code, source, .. } => ClientError::Encode { addr, code, source },
        ConnectionError::Io { source, .. } => ClientError::Io { addr, source },
        ConnectionError::Malformed { .. } | ConnectionError::FrameTimedOut { .. } => {
            ClientError::ConnectionClosed { addr }
        }
    }
}

/// Shared by every producer, consumer and admin of one client instance.
pub struct RemotingClient {
    /// One slot per address, locked while connecting, so a slow or dead broker never
    /// delays requests to the others.
    links: Mutex<HashMap<String, Arc<LinkSlot>>>,
    inbound: Option<mpsc::UnboundedSender<InboundRequest>>,
    serialize_type: SerializeType,
    /// Signs every request (RocketMQ ACL) when set.
    credentials: Option<Arc<Credentials>>,
    /// Every connection is TLS when set.
    tls: Option<TlsConfig>,
}

impl RemotingClient {
    /// A client that answers broker-initiated requests with REQUEST_CODE_NOT_SUPPORTED.
    pub fn new() -> Self {
        Self::build(None)
    }

    /// A client that hands broker-initiated requests to `inbound`; reply with [`Self::reply`].
    pub fn with_inbound(inbound: mpsc::UnboundedSender<InboundRequest>) -> Self {
        Self::build(Some(inbound))
    }

    fn build(inbound: Option<mpsc::UnboundedSender<InboundRequest>>) -> Self {
        Self {
            links: Mutex::new(HashMap::new()),
            inbound,
            serialize_type: SerializeType::RocketMq,
            credentials: None,
            tls: None,
        }
    }

    /// Opens every connection with TLS when `tls` is given.
    pub fn with_tls(mut self, tls: Option<TlsConfig>) -> Self {
        self.tls = tls;
        self
    }

    /// Signs every request with the account's keys, as RocketMQ's ACL hook does; a broker
    /// with ACL on refuses unsigned requests.
    pub fn with_credentials(mut self, credentials: Option<Credentials>) -> Self {
        self.credentials = credentials.map(Arc::new);
        self
    }

    /// How request headers are encoded. Default: RocketMQ's binary header, which every 4.x
    /// broker and name server decodes and which costs far less than JSON; brokers answer in kind.
    pub fn with_serialize_type(mut self, serialize_type: SerializeType) -> Self {
        self.serialize_type = serialize_type;
        self
    }

    async fn connection(&self, addr: &str) -> Result<Connection> {
        let slot = self
            .links
            .lock()
            .entry(addr.to_owned())
            .or_default()
            .clone();
        let mut current = slot.lock().await;
        if let Some(existing) = current.as_ref() {
            if !existing.connection.is_closed() {
                return Ok(existing.connection.clone());
            }
        }
        // Drop the dead connection now, even if reconnecting fails.
        *current = None;
        let link = Link::open(
            addr,
            self.inbound.clone(),
            self.credentials.clone(),
            self.tls.as_ref(),
        )
        .await?;
        let link = Arc::new(link);
        let connection = link.connection.clone();
        *current = Some(link);
        Ok(connection)
    }

    /// Sends a request and waits for its response (any response code: callers interpret it).
    pub async fn invoke(
        &self,
        addr: &str,
        mut request: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand> {
        request.serialize_type = self.serialize_type;
        let connection = self.connection(addr).await?;
        connection
            .request(request, timeout)
            .await
            .map_err(|error| client_error(addr, error))
    }

    /// Sends a request that gets no response.
    pub async fn invoke_oneway(&self, addr: &str, request: RemotingCommand) -> Result<()> {
        let connection = self.connection(addr).await?;
        connection
            .send_oneway(request)
            .await
            .map_err(|error| client_error(addr, error))
    }

    /// Answers a broker-initiated request on the connection it came from.
    pub async fn reply(&self, addr: &str, response: RemotingCommand) -> Result<()> {
        let connection = self.connection(addr).await?;
        connection
            .respond(response)
            .await
            .map_err(|error| client_error(addr, error))
    }

    /// Closes every connection (pending requests fail with ConnectionClosed).
    pub async fn close_all(&self) {
        self.links.lock().clear();
    }
}

impl Default for RemotingClient {
    fn default() -> Self {
        Self::new()
    }
}

/// Turns a non-SUCCESS response into the matching error.
pub fn expect_success(
    addr: &str,
    request_code: i32,
    response: RemotingCommand,
) -> Result<RemotingCommand> {
    expect_codes(addr, request_code, response, &[code::response::SUCCESS])
}

/// Accepts any of `accepted` codes; maps the rest to typed errors.
pub fn expect_codes(
    addr: &str,
    request_code: i32,
    response: RemotingCommand,
    accepted: &[i32],
) -> Result<RemotingCommand> {
    if accepted.contains(&response.code) {
        return Ok(response);
    }
    Err(response_error(addr, request_code, &response))
}

/// The typed error for a response code the caller does not accept.
pub fn response_error(addr: &str, request_code: i32, response: &RemotingCommand) -> ClientError {
    let remark = response.remark.clone().unwrap_or_default();
    match response.code {
        code::response::SYSTEM_BUSY => ClientError::BrokerBusy {
            addr: addr.to_owned(),
            remark,
        },
        _ => ClientError::Broker {
            addr: addr.to_owned(),
            request_code,
            code: response.code,
            remark,
        },
    }
}
