//! The accept loop, one task per connection, and the broker lifecycle.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_protocol::RemotingCommand;
use quiver_remoting::tls::HANDSHAKE_TIMEOUT;
use quiver_remoting::{Connection, ConnectionError, Inbound, Incoming, Options, StampedRead};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::broker::{blocking, Broker};
use crate::config::{BrokerConfig, TlsMode};
use crate::consumers::ConnectionHandle;
use crate::error::BrokerError;
use crate::metrics::ClosedBecause;
use crate::periodic::Background;
use crate::processor::{self, Ctx};
use crate::slots::ConnectionSlot;
use crate::tls::{classify, peek_first_byte, FirstByte, HandshakeFailure, Port, TlsServer};

/// Responses and pushes queued per connection before the writer applies back-pressure.
const OUTBOUND_QUEUE: usize = 1024;

/// Runs a broker on `listener` (remoting + name server) and `http_listener` (metrics, health)
/// until `shutdown` resolves; then stops accepting, answers parked pulls, persists and flushes.
pub async fn run(
    config: BrokerConfig,
    listener: TcpListener,
    http_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    run_with_slot(config, listener, http_listener, shutdown, Arc::default()).await
}

/// [`run`], filling `slot` with the broker once it has opened (tests and embedders reach the
/// broker's services, such as `pop`, through it).
pub async fn run_with_slot(
    config: BrokerConfig,
    listener: TcpListener,
    http_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    slot: crate::broker::BrokerSlot,
) -> Result<(), BrokerError> {
    serve(config, listener, http_listener, None, shutdown, slot).await
}

/// [`run`], serving RocketMQ 5.x clients (`apache.rocketmq.v2.MessagingService`) on
/// `grpc_listener` too.
pub async fn run_with_grpc(
    config: BrokerConfig,
    listener: TcpListener,
    http_listener: Option<TcpListener>,
    grpc_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    serve(
        config,
        listener,
        http_listener,
        grpc_listener,
        shutdown,
        Arc::default(),
    )
    .await
}

async fn serve(
    config: BrokerConfig,
    listener: TcpListener,
    http_listener: Option<TcpListener>,
    grpc_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
    slot: crate::broker::BrokerSlot,
) -> Result<(), BrokerError> {
    config.validate()?;
    let bound = listener.local_addr().map_err(|source| BrokerError::Io {
        context: "reading the listen address".into(),
        source,
    })?;
    let shutdown_timeout = Duration::from_millis(config.shutdown_timeout_ms);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut background = Background::new(stop_rx.clone());
    let tls = TlsServer::load(&config)?;
    if let Some(tls) = &tls {
        crate::background::spawn_tls_reload(&mut background, tls);
    }
    if let Some(http_listener) = http_listener {
        background.spawn(crate::http::serve(
            http_listener,
            slot.clone(),
            Arc::from(config.cluster.as_str()),
            stop_rx.clone(),
            tls.clone(),
            config.http_tls,
        ));
    }
    let broker = match open(config, bound).await {
        Ok(broker) => broker,
        Err(error) => {
            let _ = stop_tx.send(true);
            background.join().await;
            return Err(error);
        }
    };
    let _ = slot.set(broker.clone());
    crate::background::spawn_broker_loops(&mut background, &broker);
    if let Some(grpc_listener) = grpc_listener {
        serve_grpc(&mut background, &broker, grpc_listener, tls.clone())?;
    }
    broker.set_ready(true);
    tracing::info!(
        listen = %bound,
        advertise = %broker.advertised(),
        broker = %broker.config().broker_name,
        cluster = %broker.config().cluster,
        "quiver-broker serving"
    );

    let remoting_tls = tls.filter(|_| broker.config().tls_mode != TlsMode::Disabled);
    let shutdown = hand_over_after(broker.clone(), shutdown);
    let connections = accept_loop(&broker, listener, remoting_tls, stop_rx, shutdown).await;

    tracing::info!("shutting down: answering parked pulls and closing connections");
    broker.set_ready(false);
    broker.long_poll().shutdown();
    let _ = stop_tx.send(true);
    let mut tasks = connections;
    let drained = tokio::time::timeout(shutdown_timeout, async {
        while tasks.join_next().await.is_some() {}
        background.join().await;
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            ?shutdown_timeout,
            "tasks still running at the shutdown bound; stopping them"
        );
    }
    blocking(&broker, persist_and_stop).await??;
    tracing::info!("quiver-broker stopped cleanly");
    Ok(())
}

/// Resolves once `shutdown` has and, on the master of a group, mastership was handed over
/// or the handover given up (`--shutdown-switchover-timeout-ms`). The ports serve on
/// meanwhile: the successor still fetches, the group still agrees.
async fn hand_over_after(broker: Arc<Broker>, shutdown: impl Future<Output = ()>) {
    shutdown.await;
    if let Some(replication) = broker.replication() {
        let timeout = Duration::from_millis(broker.config().shutdown_switchover_timeout_ms);
        replication
            .hand_over_for_shutdown(broker.store(), timeout)
            .await;
    }
}

/// Opens the broker (the store's recovery) off the async workers.
async fn open(config: BrokerConfig, bound: SocketAddr) -> Result<Arc<Broker>, BrokerError> {
    tokio::task::spawn_blocking(move || Broker::open(config, bound))
        .await
        .map_err(BrokerError::Blocking)?
        .map(Arc::new)
}

/// Serves the gRPC port (RocketMQ 5.x clients) on `listener` until the stop.
fn serve_grpc(
    background: &mut Background,
    broker: &Arc<Broker>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
) -> Result<(), BrokerError> {
    let grpc_bound = listener.local_addr().map_err(|source| BrokerError::Io {
        context: "reading the gRPC listen address".into(),
        source,
    })?;
    let endpoint = broker
        .config()
        .grpc_advertised_addr(grpc_bound, broker.advertised());
    tracing::info!(listen = %grpc_bound, advertise = %endpoint, "gRPC (RocketMQ 5.x) serving");
    let _ = broker.grpc().advertised.set(endpoint);
    let stop = background.stop();
    background.spawn(crate::grpc::serve(broker.clone(), listener, tls, stop));
    Ok(())
}

/// Persists offsets, topics and groups, then stops the store. Blocking.
fn persist_and_stop(broker: &Broker) -> Result<(), BrokerError> {
    let persisted = broker.persist_all().or_else(|error| {
        // A full or read-only disk: what could not be written is lost with the process
        // (consumers redeliver from the last persisted offsets); the store still stops.
        match broker.store().disk_status().refusal {
            Some(refusal) => {
                tracing::warn!(error = %crate::error::chain(&error), reason = refusal.reason.as_str(),
                    "cannot persist offsets, topics and groups at shutdown");
                Ok(())
            }
            None => Err(error),
        }
    });
    let stopped = broker
        .store()
        .shutdown()
        .map_err(BrokerError::store("shutdown"));
    persisted.and(stopped)
}

async fn accept_loop(
    broker: &Arc<Broker>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    stop: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinSet<()> {
    let next_id = AtomicU64::new(1);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let (stream, remote) = match accepted {
                    Ok(pair) => pair,
                    Err(error) => {
                        // Out of file descriptors and similar: back off instead of spinning.
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Some(slot) = take_slot(broker, remote) else {
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let broker = broker.clone();
                let stop = stop.clone();
                let tls = tls.clone();
                connections.spawn(async move {
                    let served = Served { remote, id, broker: broker.clone(), stop };
                    match tls {
                        None => serve_plain(stream, served).await,
                        Some(tls) => serve_tls_port(stream, &tls, served).await,
                    }
                    drop(slot);
                });
            }
        }
    }
    connections
}

/// A connection slot for `remote` (of either port), or None, logged and counted, at a limit.
pub(crate) fn take_slot(broker: &Broker, remote: SocketAddr) -> Option<ConnectionSlot> {
    match broker.connection_slots().take(remote.ip()) {
        Ok(slot) => Some(slot),
        Err(refused) => {
            let config = broker.config();
            let (limit, max) = match refused {
                ClosedBecause::AddressLimit => (
                    "max-connections-per-address",
                    config.max_connections_per_address,
                ),
                _ => ("max-connections", config.max_connections),
            };
            tracing::warn!(%remote, limit, max, "connection limit reached; closing");
            broker.metrics().connection_closed(refused);
            None
        }
    }
}

/// Who a connection serves and what it shares with the others.
struct Served {
    remote: std::net::SocketAddr,
    id: u64,
    broker: Arc<Broker>,
    stop: watch::Receiver<bool>,
}

/// A connection to a port with TLS on: a ClientHello is handshaken, a plain frame is served
/// in permissive mode and closed in enforcing mode. Other connections are unaffected; a
/// handshake still going on at shutdown is dropped.
async fn serve_tls_port(stream: TcpStream, tls: &TlsServer, served: Served) {
    let metrics = served.broker.metrics();
    let mut stop = served.stop.clone();
    let peeked = tokio::select! {
        _ = stop.changed() => return,
        peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, peek_first_byte(&stream)) => peeked,
    };
    let first = match peeked {
        Ok(Ok(Some(first))) => first,
        Ok(Ok(None) | Err(_)) => return,
        Err(_) => {
            tls.count_failure(HandshakeFailure::Timeout);
            metrics.connection_closed(ClosedBecause::TlsHandshake);
            return;
        }
    };
    match (classify(first), served.broker.config().tls_mode) {
        (FirstByte::Tls, _) => {
            let accepted = tokio::select! {
                _ = stop.changed() => return,
                accepted = tls.accept(stream, Port::Remoting) => accepted,
            };
            match accepted {
                Ok(stream) => {
                    let (reader, writer) = tokio::io::split(stream);
                    serve_connection(reader, Writer::Any(writer), served, None).await;
                }
                Err(_) => metrics.connection_closed(ClosedBecause::TlsHandshake),
            }
        }
        (FirstByte::Plain, TlsMode::Enforcing) => {
            tracing::debug!(remote = %served.remote, "plain connection with tls-mode enforcing; closing");
            metrics.connection_closed(ClosedBecause::TlsRequired);
        }
        (FirstByte::Plain, _) => serve_plain(stream, served).await,
    }
}

/// A plain TCP client: answers may be written by the thread that built them while the
/// connection's writer is idle; while stages are sampled, its reads also note when their
/// bytes reached the socket (the reader's scheduling delay).
async fn serve_plain(stream: TcpStream, served: Served) {
    let (reader, writer) = stream.into_split();
    let writer: Writer<OwnedWriteHalf> = Writer::Plain(writer);
    if !served.broker.stages().is_on() {
        return serve_connection(reader, writer, served, None).await;
    }
    let (reader, arrivals) = StampedRead::new(reader);
    serve_connection(reader, writer, served, Some(arrivals)).await
}

/// How a connection's frames are written: a TCP write half shared with the answering
/// threads, or any writer (TLS) through the writer task alone.
enum Writer<W> {
    Plain(OwnedWriteHalf),
    Any(W),
}

/// Serves one client: its requests are read and dispatched here (the reader half); the
/// connection's writer task sends the responses and pushes (the writer half).
async fn serve_connection<R, W>(
    reader: R,
    writer: Writer<W>,
    served: Served,
    arrivals: Option<quiver_remoting::Arrivals>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let Served {
        remote,
        id,
        broker,
        stop,
    } = served;
    let options = Options {
        // Apache brokers speak as JAVA in every frame.
        language: Some(quiver_protocol::LANGUAGE_JAVA),
        outbound_queue: OUTBOUND_QUEUE,
        read_budget: Some(broker.read_budgets().shared.clone()),
        connection_read_budget: Some(broker.read_budgets().per_connection.clone()),
        stamp_reads: broker.stages().is_on(),
        arrivals,
        frame_read_timeout: broker.config().frame_read_timeout(),
        ..Options::new(remote.to_string())
    };
    let (remoting, mut incoming) = match writer {
        Writer::Plain(writer) => Connection::start_plain(reader, writer, options),
        Writer::Any(writer) => Connection::from_parts(reader, writer, options),
    };
    let ctx = Ctx {
        broker: broker.clone(),
        connection: ConnectionHandle {
            id,
            remote,
            remoting,
        },
    };
    serve_requests(&ctx, &mut incoming, stop).await;
    // The consumer manager holds this connection: drop it so the writer can end.
    for group in broker.consumers().connection_closed(id) {
        broker.consumers().notify_ids_changed(&group);
    }
    broker.producers().connection_closed(id);
    drop(ctx);
    incoming.finish().await;
}

/// Sends answered on the reader's task before it lets the connection's writer run: the client
/// gets the first answers of a pipelined run (and sends its next requests) while the broker
/// stores the rest. 1 producer with 32 in flight: 1.5-1.7x the rate of answering the whole run
/// at once; 8 cost 4 producers 5-10% in writes (BENCHMARKS.md).
const INLINE_ANSWERS_BEFORE_YIELD: u32 = 16;

/// Dispatches requests until the client leaves, sends garbage or `stop` flips; then waits for
/// the requests still running (parked pulls are answered on shutdown).
async fn serve_requests<R: AsyncRead + Unpin>(
    ctx: &Ctx,
    incoming: &mut Incoming<R>,
    mut stop: watch::Receiver<bool>,
) {
    let inflight = Arc::new(Semaphore::new(
        ctx.broker.config().max_inflight_per_connection,
    ));
    let mut requests = JoinSet::new();
    let idle_timeout = ctx.broker.config().idle_connection_timeout();
    // One timer, looked at once per timeout rather than reset per frame.
    let idle_check = tokio::time::sleep(idle_timeout.unwrap_or_default());
    tokio::pin!(idle_check);
    let mut last_frame = Instant::now();
    let mut answered_inline = 0u32;
    loop {
        while requests.try_join_next().is_some() {}
        let next = tokio::select! {
            _ = stop.changed() => break,
            () = &mut idle_check, if idle_timeout.is_some() => {
                let timeout = idle_timeout.unwrap_or_default();
                while requests.try_join_next().is_some() {}
                // A request in flight (a parked pull) means the client is waiting, not idle.
                let quiet_for = if requests.is_empty() { last_frame.elapsed() } else { Duration::ZERO };
                if quiet_for >= timeout {
                    tracing::debug!(remote = %ctx.connection.remote, "idle connection; closing");
                    ctx.broker.metrics().connection_closed(ClosedBecause::Idle);
                    break;
                }
                idle_check.as_mut().reset(tokio::time::Instant::now() + (timeout - quiet_for));
                continue;
            }
            next = incoming.next() => next,
        };
        last_frame = Instant::now();
        let Inbound {
            command,
            held_bytes,
            read_at,
            arrived_at,
        } = match next {
            Ok(Some(inbound)) => inbound,
            Ok(None) | Err(ConnectionError::Io { .. }) => {
                // Nobody is left to answer: parked pulls of this client are dropped.
                requests.abort_all();
                break;
            }
            Err(error @ ConnectionError::FrameTimedOut { .. }) => {
                tracing::warn!(remote = %ctx.connection.remote, %error, "frame not finished in time; closing the connection");
                ctx.broker
                    .metrics()
                    .connection_closed(ClosedBecause::FrameReadTimeout);
                requests.abort_all();
                break;
            }
            Err(error) => {
                tracing::warn!(remote = %ctx.connection.remote, %error, "malformed frame; closing the connection");
                break;
            }
        };
        if processor::answers_at_once(&ctx.broker, &command) {
            answer(ctx, command, (read_at, arrived_at)).await;
            drop(held_bytes);
            answered_inline += 1;
            if answered_inline == INLINE_ANSWERS_BEFORE_YIELD {
                // The writer sends this run's answers while the rest of the read is stored.
                answered_inline = 0;
                tokio::task::yield_now().await;
            }
            continue;
        }
        let Ok(permit) = inflight.clone().acquire_owned().await else {
            break;
        };
        let ctx = ctx.clone();
        requests.spawn(async move {
            answer(&ctx, command, (read_at, arrived_at)).await;
            // The request's frame bytes count against the budget until it is answered.
            drop(held_bytes);
            drop(permit);
        });
    }
    while requests.join_next().await.is_some() {}
}

async fn answer(ctx: &Ctx, request: RemotingCommand, stamps: crate::stages::ReadStamps) {
    let stages = ctx.broker.stages();
    let mut trace = stages.start(request.code, stamps);
    let Some(response) = processor::dispatch(ctx, request, &mut trace).await else {
        return;
    };
    let remoting = &ctx.connection.remoting;
    let _ = match stages.answered(trace) {
        Some(on_written) => remoting.respond_then(response, on_written).await,
        None => remoting.respond(response).await,
    };
}
