//! The connection layer: one TCP connection per broker address, requests matched to
//! responses by opaque, timeouts, and reconnect-on-next-use after a connection dies.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use quiver_protocol::{code, frame, RemotingCommand, SerializeType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
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

type Pending = Arc<Mutex<HashMap<i32, oneshot::Sender<RemotingCommand>>>>;
type ConnectionSlot = tokio::sync::Mutex<Option<Arc<Connection>>>;

struct Connection {
    outbound: mpsc::UnboundedSender<Bytes>,
    pending: Pending,
    closed: Arc<AtomicBool>,
    tasks: [JoinHandle<()>; 2],
}

impl Drop for Connection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Connection {
    async fn open(
        addr: &str,
        inbound: Option<mpsc::UnboundedSender<InboundRequest>>,
    ) -> Result<Self> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr))
            .await
            .map_err(|elapsed| ClientError::Connect {
                addr: addr.to_owned(),
                source: std::io::Error::new(std::io::ErrorKind::TimedOut, elapsed),
            })?
            .map_err(|source| ClientError::Connect {
                addr: addr.to_owned(),
                source,
            })?;
        // Requests are small and latency-bound: never wait for Nagle.
        stream.set_nodelay(true).map_err(|source| ClientError::Io {
            addr: addr.to_owned(),
            source,
        })?;
        let (mut reader, mut writer) = stream.into_split();
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));
        let (outbound, mut outbound_rx) = mpsc::unbounded_channel::<Bytes>();

        let writer_closed = closed.clone();
        let writer_addr = addr.to_owned();
        let writer_task = tokio::spawn(async move {
            while let Some(frame_bytes) = outbound_rx.recv().await {
                if let Err(error) = writer.write_all(&frame_bytes).await {
                    tracing::debug!(addr = %writer_addr, %error, "write failed; connection closed");
                    break;
                }
            }
            writer_closed.store(true, Ordering::Release);
        });

        let reader_closed = closed.clone();
        let reader_pending = pending.clone();
        let reader_addr = addr.to_owned();
        let reply = outbound.clone();
        let reader_task = tokio::spawn(async move {
            let mut buffer = BytesMut::with_capacity(64 * 1024);
            'read: loop {
                // A frame's length prefix says how big it is: room for all of it at once, so a
                // large answer (a pull's messages) is read into one allocation, not a doubling
                // series of copies. A bad prefix is reported by `decode` below.
                if let Ok(Some(frame_bytes)) = frame::frame_len(&buffer) {
                    buffer.reserve(frame_bytes.saturating_sub(buffer.len()));
                }
                match reader.read_buf(&mut buffer).await {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(addr = %reader_addr, %error, "read failed; connection closed");
                        break;
                    }
                }
                loop {
                    let command = match frame::decode(&mut buffer) {
                        Ok(Some(command)) => command,
                        Ok(None) => break,
                        Err(error) => {
                            tracing::warn!(addr = %reader_addr, %error, "undecodable frame; closing connection");
                            break 'read;
                        }
                    };
                    if command.is_response() {
                        if let Some(waiter) = reader_pending.lock().remove(&command.opaque) {
                            let _ = waiter.send(command);
                        }
                        continue;
                    }
                    match &inbound {
                        Some(inbound) => {
                            let _ = inbound.send(InboundRequest {
                                addr: reader_addr.clone(),
                                command,
                            });
                        }
                        None if !command.is_oneway() => {
                            let response = command.response_to(
                                code::response::REQUEST_CODE_NOT_SUPPORTED,
                                Some(format!(
                                    "request code {} is not handled by this client",
                                    command.code
                                )),
                            );
                            let mut out = BytesMut::new();
                            if frame::encode(&response, &mut out).is_ok() {
                                let _ = reply.send(out.freeze());
                            }
                        }
                        None => {}
                    }
                }
            }
            reader_closed.store(true, Ordering::Release);
            // Dropping the waiters wakes every pending request with "connection closed".
            reader_pending.lock().clear();
        });

        Ok(Connection {
            outbound,
            pending,
            closed,
            tasks: [writer_task, reader_task],
        })
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.outbound.is_closed()
    }
}

/// Shared by every producer, consumer and admin of one client instance.
pub struct RemotingClient {
    /// One slot per address, locked while connecting, so a slow or dead broker never
    /// delays requests to the others.
    connections: Mutex<HashMap<String, Arc<ConnectionSlot>>>,
    next_opaque: AtomicI32,
    inbound: Option<mpsc::UnboundedSender<InboundRequest>>,
    serialize_type: SerializeType,
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
            connections: Mutex::new(HashMap::new()),
            next_opaque: AtomicI32::new(1),
            inbound,
            serialize_type: SerializeType::RocketMq,
        }
    }

    /// How request headers are encoded. Default: RocketMQ's binary header, which every 4.x
    /// broker and name server decodes and which costs far less than JSON; brokers answer in kind.
    pub fn with_serialize_type(mut self, serialize_type: SerializeType) -> Self {
        self.serialize_type = serialize_type;
        self
    }

    async fn connection(&self, addr: &str) -> Result<Arc<Connection>> {
        let slot = self
            .connections
            .lock()
            .entry(addr.to_owned())
            .or_default()
            .clone();
        let mut current = slot.lock().await;
        if let Some(existing) = current.as_ref() {
            if !existing.is_closed() {
                return Ok(existing.clone());
            }
        }
        // Drop the dead connection now, even if reconnecting fails.
        *current = None;
        let connection = Arc::new(Connection::open(addr, self.inbound.clone()).await?);
        *current = Some(connection.clone());
        Ok(connection)
    }

    fn encode(addr: &str, command: &RemotingCommand) -> Result<Bytes> {
        let mut out = BytesMut::new();
        frame::encode(command, &mut out).map_err(|source| ClientError::Encode {
            addr: addr.to_owned(),
            code: command.code,
            source,
        })?;
        Ok(out.freeze())
    }

    /// Sends a request and waits for its response (any response code: callers interpret it).
    pub async fn invoke(
        &self,
        addr: &str,
        mut request: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand> {
        let request_code = request.code;
        request.opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        request.serialize_type = self.serialize_type;
        let opaque = request.opaque;
        let bytes = Self::encode(addr, &request)?;
        let connection = self.connection(addr).await?;
        let (waiter, response) = oneshot::channel();
        connection.pending.lock().insert(opaque, waiter);
        if connection.outbound.send(bytes).is_err() {
            connection.pending.lock().remove(&opaque);
            return Err(ClientError::ConnectionClosed {
                addr: addr.to_owned(),
            });
        }
        match tokio::time::timeout(timeout, response).await {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(_)) => Err(ClientError::ConnectionClosed {
                addr: addr.to_owned(),
            }),
            Err(_) => {
                connection.pending.lock().remove(&opaque);
                Err(ClientError::Timeout {
                    addr: addr.to_owned(),
                    code: request_code,
                    timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                })
            }
        }
    }

    /// Sends a request that gets no response.
    pub async fn invoke_oneway(&self, addr: &str, request: RemotingCommand) -> Result<()> {
        let mut request = request.into_oneway();
        request.opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        let bytes = Self::encode(addr, &request)?;
        let connection = self.connection(addr).await?;
        connection
            .outbound
            .send(bytes)
            .map_err(|_| ClientError::ConnectionClosed {
                addr: addr.to_owned(),
            })
    }

    /// Answers a broker-initiated request on the connection it came from.
    pub async fn reply(&self, addr: &str, response: RemotingCommand) -> Result<()> {
        let bytes = Self::encode(addr, &response)?;
        let connection = self.connection(addr).await?;
        connection
            .outbound
            .send(bytes)
            .map_err(|_| ClientError::ConnectionClosed {
                addr: addr.to_owned(),
            })
    }

    /// Closes every connection (pending requests fail with ConnectionClosed).
    pub async fn close_all(&self) {
        self.connections.lock().clear();
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
