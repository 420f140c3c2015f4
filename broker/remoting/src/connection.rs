//! [`Connection`] (the sending side, cheap to clone) and [`Incoming`] (the reading side).

use std::collections::HashMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use quiver_protocol::acl::Credentials;
use quiver_protocol::{FrameError, RemotingCommand};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Semaphore};
use tokio::task::JoinHandle;

use crate::budget::{ByteBudget, HeldBytes, PerConnectionBudget};
use crate::plain::Direct;
use crate::reader::{FrameReader, ReadFailure};
use crate::writer::FrameWriter;

/// Frames queued for the writer before senders wait.
pub const DEFAULT_OUTBOUND_QUEUE: usize = 1024;
/// Requests of ours awaiting their responses at once, per connection.
pub const DEFAULT_MAX_PENDING_REQUESTS: usize = 4096;

/// How a connection behaves; [`Options::new`] gives the defaults.
#[derive(Clone, Debug)]
pub struct Options {
    /// Who is at the other end, as errors and logs name it.
    pub peer: String,
    /// Written into every outgoing frame when set; otherwise each frame keeps its own.
    pub language: Option<&'static str>,
    pub outbound_queue: usize,
    /// Requests beyond this wait (within their timeout) for an earlier one to be answered.
    pub max_pending_requests: usize,
    /// Counts buffered and handed-out inbound bytes; reading waits while it is spent.
    pub read_budget: Option<ByteBudget>,
    /// As `read_budget`, for this connection alone: a connection at it stops being read from
    /// (TCP pushes back on its sender) while other connections go on.
    pub connection_read_budget: Option<PerConnectionBudget>,
    /// Stamp each inbound frame with when its last bytes were read ([`Inbound::read_at`]).
    pub stamp_reads: bool,
    /// Where the reader (a [`crate::StampedRead`]) leaves when the bytes of each read reached
    /// the socket; with `stamp_reads`, frames carry it as [`Inbound::arrived_at`].
    pub arrivals: Option<crate::Arrivals>,
    /// A frame whose first bytes arrived must be whole within this, or reading fails with
    /// [`ConnectionError::FrameTimedOut`] (slow or stalled senders); None: no bound.
    pub frame_read_timeout: Option<Duration>,
    /// Signs every request and oneway frame sent (RocketMQ ACL); responses are not signed.
    pub credentials: Option<Arc<Credentials>>,
}

impl Options {
    pub fn new(peer: impl Into<String>) -> Options {
        Options {
            peer: peer.into(),
            language: None,
            outbound_queue: DEFAULT_OUTBOUND_QUEUE,
            max_pending_requests: DEFAULT_MAX_PENDING_REQUESTS,
            read_budget: None,
            connection_read_budget: None,
            stamp_reads: false,
            arrivals: None,
            frame_read_timeout: None,
            credentials: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("connection to {peer} closed: {reason}")]
    Closed { peer: String, reason: String },
    #[error("request code {code} to {peer} got no response within {timeout_ms} ms")]
    Timeout {
        peer: String,
        code: i32,
        timeout_ms: u64,
    },
    #[error("cannot encode request code {code} for {peer}")]
    Encode {
        peer: String,
        code: i32,
        #[source]
        source: FrameError,
    },
    #[error("reading from {peer} failed")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{peer} started a frame and did not finish it within {timeout:?}")]
    FrameTimedOut { peer: String, timeout: Duration },
    #[error("{peer} sent a malformed frame")]
    Malformed {
        peer: String,
        #[source]
        source: FrameError,
    },
}

type Waiter = oneshot::Sender<Result<RemotingCommand, ConnectionError>>;

#[derive(Default)]
struct Pending {
    waiters: HashMap<i32, Waiter>,
    /// Set once no response can arrive any more: why.
    ended: Option<String>,
}

/// What both halves and every clone share.
pub(crate) struct Shared {
    pub(crate) peer: String,
    next_opaque: AtomicI32,
    pending: Mutex<Pending>,
    request_slots: Semaphore,
    closing: watch::Sender<bool>,
    credentials: Option<Arc<Credentials>>,
}

impl Shared {
    fn closed_error(&self, reason: &str) -> ConnectionError {
        ConnectionError::Closed {
            peer: self.peer.clone(),
            reason: reason.to_owned(),
        }
    }

    /// No response can arrive any more: fails every pending request, and later ones at once.
    pub(crate) fn end(&self, reason: &str) {
        let (reason, waiters) = {
            let mut pending = self.pending.lock();
            let reason = pending
                .ended
                .get_or_insert_with(|| reason.to_owned())
                .clone();
            let waiters: Vec<Waiter> = pending.waiters.drain().map(|(_, w)| w).collect();
            (reason, waiters)
        };
        for waiter in waiters {
            let _ = waiter.send(Err(self.closed_error(&reason)));
        }
    }

    /// Adds the account's AccessKey and Signature to a request, when this side signs.
    fn sign(&self, request: &mut RemotingCommand) {
        if let Some(credentials) = &self.credentials {
            credentials.sign(request);
        }
    }

    fn ended(&self) -> Option<String> {
        self.pending.lock().ended.clone()
    }

    fn is_ended(&self) -> bool {
        self.pending.lock().ended.is_some()
    }

    fn register(&self, opaque: i32, waiter: Waiter) -> Result<(), ConnectionError> {
        let mut pending = self.pending.lock();
        if let Some(reason) = &pending.ended {
            return Err(self.closed_error(reason));
        }
        pending.waiters.insert(opaque, waiter);
        Ok(())
    }

    fn unregister(&self, opaque: i32) {
        self.pending.lock().waiters.remove(&opaque);
    }

    /// Hands a response to the request with its opaque; late or unasked-for ones are dropped.
    fn complete(&self, response: RemotingCommand) {
        let waiter = self.pending.lock().waiters.remove(&response.opaque);
        match waiter {
            Some(waiter) => {
                let _ = waiter.send(Ok(response));
            }
            None => {
                tracing::trace!(peer = %self.peer, opaque = response.opaque, "response nobody awaits")
            }
        }
    }

    pub(crate) fn fail_encode(&self, opaque: i32, code: i32, source: FrameError) {
        let waiter = self.pending.lock().waiters.remove(&opaque);
        if let Some(waiter) = waiter {
            let peer = self.peer.clone();
            let _ = waiter.send(Err(ConnectionError::Encode { peer, code, source }));
        }
    }
}

/// Removes a request's waiter however the request ends (answered, timed out, dropped).
struct Registered<'a> {
    shared: &'a Shared,
    opaque: i32,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.shared.unregister(self.opaque);
    }
}

/// The sending side of one connection: requests, oneway frames and responses. Clones share it;
/// the socket's write side is shut once every clone is dropped or [`Connection::close`] is called.
#[derive(Clone)]
pub struct Connection {
    shared: Arc<Shared>,
    outbound: mpsc::Sender<Outbound>,
    /// A plain TCP connection's write side, for answers written on the answering thread
    /// while the writer task is idle ([`Connection::start_plain`]).
    direct: Option<Arc<Direct>>,
}

/// Called by the writer with the time the frame's bytes were handed to the socket.
pub type OnWritten = Box<dyn FnOnce(Instant) + Send>;

/// A frame queued for the writer, and who wants to know when it was written.
pub struct Outbound {
    /// Boxed: the queue's blocks hold 32 entries from the start, so an idle connection's
    /// queue costs 32 pointers rather than 32 commands.
    pub command: Box<RemotingCommand>,
    pub on_written: Option<OnWritten>,
}

/// A reserved place in a connection's writer queue ([`Connection::try_reserve`]).
pub struct OutboundSlot<'a> {
    permit: mpsc::Permit<'a, Outbound>,
    connection: &'a Connection,
}

impl OutboundSlot<'_> {
    /// Sends `command` without waiting: written at once on this thread when the writer is
    /// idle and nothing else is queued (the reserved place aside), else queued in the
    /// reserved place. Cannot fail.
    pub fn send(self, command: RemotingCommand, on_written: Option<OnWritten>) {
        let OutboundSlot { permit, connection } = self;
        let outbound = Outbound {
            command: Box::new(command),
            on_written,
        };
        let outbound = match &connection.direct {
            // Only this slot's place is taken: the queue is otherwise empty.
            Some(direct) => match direct.try_write_now(outbound, || {
                connection.outbound.capacity() + 1 == connection.outbound.max_capacity()
            }) {
                Ok(()) => return,
                Err(back) => back,
            },
            None => outbound,
        };
        permit.send(outbound);
    }
}

impl From<RemotingCommand> for Outbound {
    fn from(command: RemotingCommand) -> Self {
        Outbound {
            command: Box::new(command),
            on_written: None,
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.shared.peer)
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// A request the other side sent, and the budget bytes its frame holds until dropped.
#[derive(Debug)]
pub struct Inbound {
    pub command: RemotingCommand,
    pub held_bytes: HeldBytes,
    /// When the read that completed the frame returned, if [`Options::stamp_reads`].
    pub read_at: Option<Instant>,
    /// When the bytes that completed the frame reached the socket (the kernel's receive
    /// timestamp), if [`Options::arrivals`] is set and the kernel gave one.
    pub arrived_at: Option<Instant>,
}

/// The reading side: yields the other side's requests, and routes responses to [`Connection::request`].
pub struct Incoming<R = OwnedReadHalf> {
    reader: FrameReader<R>,
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    direct: Option<Arc<Direct>>,
}

impl Connection {
    /// Splits `stream` into a [`Connection`] and its [`Incoming`]; the writer runs on its own task.
    pub fn start(stream: TcpStream, options: Options) -> (Connection, Incoming) {
        let (reader, writer) = stream.into_split();
        Connection::from_parts(reader, writer, options)
    }

    /// As [`Connection::start`], over any reader and writer (e.g. an in-memory duplex).
    pub fn from_parts<R, W>(reader: R, writer: W, options: Options) -> (Connection, Incoming<R>)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        Connection::assemble(reader, writer, options, None)
    }

    /// As [`Connection::from_parts`] over a TCP stream's halves, with one more way out for
    /// responses: while the writer task is idle and nothing is queued, a response is
    /// written by the thread that answers ([`Connection::respond`]), sparing the writer
    /// task's wake-up.
    pub fn start_plain<R>(
        reader: R,
        writer: OwnedWriteHalf,
        options: Options,
    ) -> (Connection, Incoming<R>)
    where
        R: AsyncRead + Unpin,
    {
        let (writer, direct) = crate::plain::share(writer, options.language);
        Connection::assemble(reader, writer, options, Some(direct))
    }

    fn assemble<R, W>(
        reader: R,
        writer: W,
        options: Options,
        direct: Option<Arc<Direct>>,
    ) -> (Connection, Incoming<R>)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (mut connection, outbound_rx, closing) = Connection::unstarted(&options);
        connection.direct = direct.clone();
        let frame_writer = FrameWriter::new(
            writer,
            options.language,
            connection.shared.clone(),
            direct.clone(),
        );
        let writer_task = tokio::spawn(frame_writer.run(outbound_rx, closing));
        let incoming = Incoming {
            reader: FrameReader::new(
                reader,
                (
                    options.read_budget,
                    options.connection_read_budget.map(|own| own.budget()),
                ),
                (options.stamp_reads, options.arrivals),
                options.frame_read_timeout,
            ),
            shared: connection.shared.clone(),
            writer: Some(writer_task),
            direct,
        };
        (connection, incoming)
    }

    /// A connection with no socket: what is sent arrives on the receiver (for testing code
    /// that sends on a connection).
    pub fn detached(
        peer: impl Into<String>,
        outbound_queue: usize,
    ) -> (Connection, mpsc::Receiver<Outbound>) {
        let options = Options {
            outbound_queue,
            ..Options::new(peer)
        };
        let (connection, outbound_rx, _) = Connection::unstarted(&options);
        (connection, outbound_rx)
    }

    fn unstarted(
        options: &Options,
    ) -> (Connection, mpsc::Receiver<Outbound>, watch::Receiver<bool>) {
        let (outbound, outbound_rx) = mpsc::channel(options.outbound_queue.max(1));
        let (closing, closing_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            peer: options.peer.clone(),
            next_opaque: AtomicI32::new(1),
            pending: Mutex::default(),
            request_slots: Semaphore::new(options.max_pending_requests.max(1)),
            closing,
            credentials: options.credentials.clone(),
        });
        let connection = Connection {
            shared,
            outbound,
            direct: None,
        };
        (connection, outbound_rx, closing_rx)
    }

    pub fn peer(&self) -> &str {
        &self.shared.peer
    }

    /// Sends `request` with a fresh opaque and waits at most `timeout` (queueing included)
    /// for the response with that opaque, whatever its code.
    pub async fn request(
        &self,
        request: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, ConnectionError> {
        let code = request.code;
        match tokio::time::timeout(timeout, self.exchange(request)).await {
            Ok(answered) => answered,
            Err(_) => Err(ConnectionError::Timeout {
                peer: self.shared.peer.clone(),
                code,
                timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    async fn exchange(
        &self,
        mut request: RemotingCommand,
    ) -> Result<RemotingCommand, ConnectionError> {
        let shared = &*self.shared;
        // Never closed, so the error is only for form's sake.
        let _slot = (shared.request_slots.acquire().await)
            .map_err(|_| shared.closed_error("the request slots were closed"))?;
        request.opaque = shared.next_opaque.fetch_add(1, Ordering::Relaxed);
        shared.sign(&mut request);
        let (waiter, response) = oneshot::channel();
        shared.register(request.opaque, waiter)?;
        let _registered = Registered {
            shared,
            opaque: request.opaque,
        };
        self.queue(request.into()).await?;
        match response.await {
            Ok(answered) => answered,
            Err(_) => Err(shared.closed_error("the connection was dropped")),
        }
    }

    /// Sends `request` as a oneway frame (no response) with a fresh opaque.
    pub async fn send_oneway(&self, request: RemotingCommand) -> Result<(), ConnectionError> {
        let mut request = request.into_oneway();
        request.opaque = self.shared.next_opaque.fetch_add(1, Ordering::Relaxed);
        self.shared.sign(&mut request);
        self.queue(request.into()).await
    }

    /// Sends a frame as it is: a response to the other side's request (same opaque).
    pub async fn respond(&self, response: RemotingCommand) -> Result<(), ConnectionError> {
        self.answer(response, None).await
    }

    /// As [`Connection::respond`], calling `on_written` once the frame is written (not when
    /// the connection fails first).
    pub async fn respond_then(
        &self,
        response: RemotingCommand,
        on_written: OnWritten,
    ) -> Result<(), ConnectionError> {
        self.answer(response, Some(on_written)).await
    }

    /// Writes `response` on this thread when the writer is idle and nothing is queued (a
    /// plain connection), else queues it.
    async fn answer(
        &self,
        response: RemotingCommand,
        on_written: Option<OnWritten>,
    ) -> Result<(), ConnectionError> {
        let outbound = Outbound {
            command: Box::new(response),
            on_written,
        };
        let outbound = match &self.direct {
            Some(direct) if !self.outbound.is_closed() => {
                let queue_empty = || self.outbound.capacity() == self.outbound.max_capacity();
                match direct.try_write_now(outbound, queue_empty) {
                    Ok(()) => return Ok(()),
                    Err(back) => back,
                }
            }
            _ => outbound,
        };
        self.queue(outbound).await
    }

    /// Sends a frame as it is without waiting; false when the queue is full or the connection
    /// closed (for advisory pushes that must never hold their sender up).
    pub fn try_send(&self, command: RemotingCommand) -> bool {
        self.outbound.try_send(command.into()).is_ok()
    }

    /// A place in the writer's queue, taken without waiting; None when the queue is full or
    /// the connection closed. For a caller that must know it can send before it commits.
    pub fn try_reserve(&self) -> Option<OutboundSlot<'_>> {
        let permit = self.outbound.try_reserve().ok()?;
        Some(OutboundSlot {
            permit,
            connection: self,
        })
    }

    async fn queue(&self, command: Outbound) -> Result<(), ConnectionError> {
        self.outbound.send(command).await.map_err(|_| {
            let reason = self.shared.ended();
            self.shared
                .closed_error(reason.as_deref().unwrap_or("the writer stopped"))
        })
    }

    /// Fails pending requests, refuses new frames, writes what is queued and shuts the
    /// socket's write side down.
    pub fn close(&self) {
        self.shared.end("closed by this side");
        self.shared.closing.send_replace(true);
    }

    /// True once no more responses can arrive or frames be sent: open a new connection.
    pub fn is_closed(&self) -> bool {
        self.outbound.is_closed() || self.shared.is_ended()
    }
}

impl<R: AsyncRead + Unpin> Incoming<R> {
    /// The other side's next request; responses to ours are routed on the way. `Ok(None)` once
    /// the other side closed. After `None` or an error, pending requests have failed.
    pub async fn next(&mut self) -> Result<Option<Inbound>, ConnectionError> {
        loop {
            let (command, held_bytes, (read_at, arrived_at)) = match self.reader.next_frame().await
            {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    self.shared.end("the peer closed the connection");
                    return Ok(None);
                }
                Err(failure) => return Err(self.failed(failure)),
            };
            if let Some(direct) = &self.direct {
                direct.set_more_to_read(self.reader.has_buffered());
            }
            if command.is_response() {
                self.shared.complete(command);
                continue;
            }
            return Ok(Some(Inbound {
                command,
                held_bytes,
                read_at,
                arrived_at,
            }));
        }
    }

    fn failed(&self, failure: ReadFailure) -> ConnectionError {
        let peer = self.shared.peer.clone();
        let error = match failure {
            ReadFailure::Io(source) => ConnectionError::Io { peer, source },
            ReadFailure::Malformed(source) => ConnectionError::Malformed { peer, source },
            ReadFailure::FrameTimedOut(timeout) => ConnectionError::FrameTimedOut { peer, timeout },
        };
        self.shared.end(&error.to_string());
        error
    }

    /// Stops reading and waits until the writer has sent what is queued and shut the socket
    /// down, which it does once every [`Connection`] clone is dropped or one is closed.
    pub async fn finish(mut self) {
        self.shared.end("reading stopped");
        if let Some(writer) = self.writer.take() {
            let _ = writer.await;
        }
    }
}

impl<R> Drop for Incoming<R> {
    fn drop(&mut self) {
        // Nobody reads responses any more.
        self.shared.end("reading stopped");
    }
}
