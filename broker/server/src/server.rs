//! The accept loop, one task per connection, and the broker lifecycle.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use quiver_protocol::{frame, RemotingCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch, AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::broker::{blocking, Broker};
use crate::config::BrokerConfig;
use crate::consumers::ConnectionHandle;
use crate::error::BrokerError;
use crate::processor::{self, Ctx};

/// Responses and pushes queued per connection before the writer applies back-pressure.
const OUTBOUND_QUEUE: usize = 1024;
/// Bytes a connection may read beyond the frame it is receiving (or when between frames).
const READ_AHEAD: usize = 64 * 1024;
/// Bodies of at least this many bytes (pull answers) are written from where they are,
/// after their frame head, instead of being copied into the write buffer first.
const VECTORED_BODY_BYTES: usize = 16 * 1024;
/// writev takes at most this many buffers (Linux IOV_MAX).
const MAX_IOVECS: usize = 1024;
/// How often silent clients are looked for.
const CLIENT_SCAN_INTERVAL: Duration = Duration::from_secs(10);
/// How often retention looks for expired CommitLog segments, and for read ones to delete
/// early under disk pressure (Apache cleans every 10 s too).
const RETENTION_INTERVAL: Duration = Duration::from_secs(10);

/// Runs a broker on `listener` (remoting + name server) and `http_listener` (metrics, health)
/// until `shutdown` resolves; then stops accepting, answers parked pulls, persists and flushes.
pub async fn run(
    config: BrokerConfig,
    listener: TcpListener,
    http_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), BrokerError> {
    config.validate()?;
    let bound = listener.local_addr().map_err(|source| BrokerError::Io {
        context: "reading the listen address".into(),
        source,
    })?;
    let shutdown_timeout = Duration::from_millis(config.shutdown_timeout_ms);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut background = JoinSet::new();
    let slot: crate::broker::BrokerSlot = Arc::default();
    if let Some(http_listener) = http_listener {
        background.spawn(crate::http::serve(
            http_listener,
            slot.clone(),
            Arc::from(config.cluster.as_str()),
            stop_rx.clone(),
        ));
    }
    let opened = {
        let config = config.clone();
        tokio::task::spawn_blocking(move || Broker::open(config, bound))
            .await
            .map_err(BrokerError::Blocking)
    };
    let broker = match opened {
        Ok(Ok(broker)) => Arc::new(broker),
        Ok(Err(error)) | Err(error) => {
            let _ = stop_tx.send(true);
            while background.join_next().await.is_some() {}
            return Err(error);
        }
    };
    let _ = slot.set(broker.clone());
    background.spawn(persist_loop(broker.clone(), stop_rx.clone()));
    background.spawn(client_expiry_loop(broker.clone(), stop_rx.clone()));
    background.spawn(retention_loop(broker.clone(), stop_rx.clone()));
    background.spawn(crate::schedule::run(broker.clone(), stop_rx.clone()));
    background.spawn(crate::peers::run(broker.clone(), stop_rx.clone()));
    broker.set_ready(true);
    tracing::info!(
        listen = %bound,
        advertise = %broker.advertised,
        broker = %broker.config.broker_name,
        cluster = %broker.config.cluster,
        "quiver-broker serving"
    );

    let connections = accept_loop(&broker, listener, stop_rx.clone(), shutdown).await;

    tracing::info!("shutting down: answering parked pulls and closing connections");
    broker.set_ready(false);
    broker.long_poll.shutdown();
    let _ = stop_tx.send(true);
    let mut tasks = connections;
    let drained = tokio::time::timeout(shutdown_timeout, async {
        while tasks.join_next().await.is_some() {}
        while background.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            ?shutdown_timeout,
            "tasks still running at the shutdown bound; stopping them"
        );
    }
    blocking(&broker, |broker| {
        let persisted = broker.persist_all().or_else(|error| {
            // A full or read-only disk: what could not be written is lost with the process
            // (consumers redeliver from the last persisted offsets); the store still stops.
            match broker.store.disk_status().refusal {
                Some(refusal) => {
                    tracing::warn!(error = %crate::error::chain(&error), reason = refusal.reason.as_str(),
                        "cannot persist offsets, topics and groups at shutdown");
                    Ok(())
                }
                None => Err(error),
            }
        });
        let stopped = broker
            .store
            .shutdown()
            .map_err(BrokerError::store("shutdown"));
        persisted.and(stopped)
    })
    .await??;
    tracing::info!("quiver-broker stopped cleanly");
    Ok(())
}

async fn accept_loop(
    broker: &Arc<Broker>,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> JoinSet<()> {
    let connection_slots = Arc::new(Semaphore::new(broker.config.max_connections));
    let inflight_bytes = Arc::new(Semaphore::new(broker.config.max_inflight_bytes));
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
                let Ok(slot) = connection_slots.clone().try_acquire_owned() else {
                    tracing::warn!(%remote, max = broker.config.max_connections, "connection limit reached; closing");
                    drop(stream);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let broker = broker.clone();
                let stop = stop.clone();
                let inflight_bytes = inflight_bytes.clone();
                connections.spawn(async move {
                    broker.metrics.connections.fetch_add(1, Ordering::Relaxed);
                    serve_connection(stream, remote, id, broker.clone(), inflight_bytes, stop).await;
                    broker.metrics.connections.fetch_sub(1, Ordering::Relaxed);
                    drop(slot);
                });
            }
        }
    }
    connections
}

/// Writes `chunks` in order with vectored writes and empties it.
async fn write_chunks(
    writer: &mut tokio::net::tcp::OwnedWriteHalf,
    chunks: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    chunks.retain(|chunk| !chunk.is_empty());
    let mut first = 0;
    while first < chunks.len() {
        let slices: Vec<std::io::IoSlice<'_>> = chunks[first..]
            .iter()
            .take(MAX_IOVECS)
            .map(|chunk| std::io::IoSlice::new(chunk))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let len = chunks[first].len();
            if written >= len {
                written -= len;
                first += 1;
            } else {
                chunks[first].advance(written);
                written = 0;
            }
        }
    }
    chunks.clear();
    Ok(())
}

async fn serve_connection(
    stream: TcpStream,
    remote: std::net::SocketAddr,
    id: u64,
    broker: Arc<Broker>,
    inflight_bytes: Arc<Semaphore>,
    mut stop: watch::Receiver<bool>,
) {
    let (mut reader, mut writer) = stream.into_split();
    let (outbound, mut outbound_rx) = mpsc::channel::<RemotingCommand>(OUTBOUND_QUEUE);
    let writer_task = tokio::spawn(async move {
        let mut buf = BytesMut::with_capacity(64 * 1024);
        let mut chunks: Vec<Bytes> = Vec::new();
        while let Some(command) = outbound_rx.recv().await {
            let mut queued = 0;
            let mut next = Some(command);
            // Coalesce whatever is queued into one write.
            while let Some(mut command) = next {
                // Apache brokers speak as JAVA in every frame (the buffer is reused: 4 bytes).
                command.language.clear();
                command.language.push_str(quiver_protocol::LANGUAGE_JAVA);
                let body_len = command.body_len();
                let encoded = if body_len >= VECTORED_BODY_BYTES {
                    frame::encode_head(&command, &mut buf).map(|()| {
                        chunks.push(buf.split().freeze());
                        chunks.push(command.body);
                        chunks.extend(command.body_chain);
                    })
                } else {
                    frame::encode(&command, &mut buf)
                };
                if let Err(error) = encoded {
                    tracing::error!(%error, "cannot encode a response");
                }
                queued += body_len;
                next = if queued < 1024 * 1024 {
                    outbound_rx.try_recv().ok()
                } else {
                    None
                };
            }
            if !buf.is_empty() {
                chunks.push(buf.split().freeze());
            }
            if write_chunks(&mut writer, &mut chunks).await.is_err() {
                return;
            }
        }
        let _ = writer.shutdown().await;
    });
    let ctx = Ctx {
        broker: broker.clone(),
        connection: ConnectionHandle {
            id,
            remote,
            outbound: outbound.clone(),
        },
    };
    let inflight = Arc::new(Semaphore::new(broker.config.max_inflight_per_connection));
    let mut requests = JoinSet::new();
    let mut budget = ReadBudget::new(inflight_bytes, broker.config.max_inflight_bytes);
    let mut buf = BytesMut::with_capacity(READ_AHEAD);
    'read: loop {
        loop {
            let buffered = buf.len();
            match frame::decode(&mut buf) {
                Ok(Some(command)) => {
                    // The frame's bytes were counted while buffered; the request keeps them.
                    let bytes_permit = budget.hand_over(buffered - buf.len());
                    if command.is_response() {
                        // Answers to our pushes (e.g. 220) carry nothing we act on.
                        continue;
                    }
                    if processor::answers_at_once(&broker, &command) {
                        if let Some(response) = processor::dispatch(&ctx, command).await {
                            let _ = outbound.send(response).await;
                        }
                        drop(bytes_permit);
                        continue;
                    }
                    let Ok(permit) = inflight.clone().acquire_owned().await else {
                        break 'read;
                    };
                    let ctx = ctx.clone();
                    let outbound = outbound.clone();
                    requests.spawn(async move {
                        if let Some(response) = processor::dispatch(&ctx, command).await {
                            let _ = outbound.send(response).await;
                        }
                        drop(bytes_permit);
                        drop(permit);
                    });
                }
                Ok(None) => break,
                Err(error) => {
                    tracing::warn!(%remote, %error, "malformed frame; closing the connection");
                    break 'read;
                }
            }
        }
        while requests.try_join_next().is_some() {}
        // The frame being received (its length prefix says how big), or a read-ahead chunk.
        let wanted = match frame::frame_len(&buf) {
            Ok(Some(frame_bytes)) => frame_bytes.max(READ_AHEAD),
            Ok(None) => READ_AHEAD,
            Err(error) => {
                tracing::warn!(%remote, %error, "malformed frame; closing the connection");
                break 'read;
            }
        };
        budget.release_above(wanted.max(buf.len()));
        tokio::select! {
            _ = stop.changed() => break,
            held = budget.hold(wanted) => if held.is_err() { break },
        }
        // At most what is counted; a frame larger than the whole budget still gets read.
        let room = match budget.held().saturating_sub(buf.len()) {
            0 => wanted.saturating_sub(buf.len()).max(1),
            room => room,
        };
        buf.reserve(room);
        let mut window = (&mut buf).limit(room);
        tokio::select! {
            _ = stop.changed() => break,
            read = reader.read_buf(&mut window) => match read {
                Ok(0) | Err(_) => {
                    // Nobody is left to answer: parked pulls of this client are dropped.
                    requests.abort_all();
                    break;
                }
                Ok(_) => {}
            },
        }
    }
    // Let in-flight requests (including parked pulls, answered on shutdown) finish.
    while requests.join_next().await.is_some() {}
    // The consumer manager holds a sender to this connection: drop it so the writer can end.
    for group in broker.consumers.connection_closed(id) {
        broker.consumers.notify_ids_changed(&group);
    }
    drop(ctx);
    drop(outbound);
    let _ = writer_task.await;
}

/// A connection's share of the broker-wide in-flight byte budget: its read buffer is counted
/// while bytes arrive, and each decoded request takes its frame's bytes along until answered.
struct ReadBudget {
    budget: Arc<Semaphore>,
    /// The whole budget: a frame larger than it waits for all of it, not for the impossible.
    total: usize,
    held: Option<OwnedSemaphorePermit>,
}

impl ReadBudget {
    fn new(budget: Arc<Semaphore>, total: usize) -> ReadBudget {
        ReadBudget {
            budget,
            total,
            held: None,
        }
    }

    fn held(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Waits until `bytes` (capped at the whole budget) are counted for this buffer.
    async fn hold(&mut self, bytes: usize) -> Result<(), AcquireError> {
        let bytes = bytes.min(self.total);
        let held = self.held();
        if held >= bytes {
            return Ok(());
        }
        let more = u32::try_from(bytes - held).unwrap_or(u32::MAX);
        if let Ok(extra) = self.budget.clone().try_acquire_many_owned(more) {
            self.merge(extra);
            return Ok(());
        }
        // Wait for the whole amount holding nothing: two connections each holding part of
        // the budget while waiting for the rest would wait forever.
        self.held = None;
        let all = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.held = Some(self.budget.clone().acquire_many_owned(all).await?);
        Ok(())
    }

    fn merge(&mut self, extra: OwnedSemaphorePermit) {
        match self.held.as_mut() {
            Some(held) => held.merge(extra),
            None => self.held = Some(extra),
        }
    }

    /// Moves `bytes` of what is held to a decoded request (None if nothing is held).
    fn hand_over(&mut self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let held = self.held.as_mut()?;
        let moved = bytes.min(held.num_permits());
        if moved == held.num_permits() {
            return self.held.take();
        }
        held.split(moved)
    }

    /// Gives back what is held beyond `bytes` (after a large frame went to its request).
    fn release_above(&mut self, bytes: usize) {
        if let Some(held) = self.held.as_mut() {
            let excess = held.num_permits().saturating_sub(bytes);
            if excess > 0 {
                drop(held.split(excess));
            }
        }
    }
}

async fn persist_loop(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(broker.config.persist_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // On a full disk the offsets stay in memory and are written once there is room.
    let mut failures = crate::error::FailureLog::default();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                let failure = match blocking(&broker, |broker| broker.persist_all()).await {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) | Err(error) => Some(crate::error::chain(&error)),
                };
                failures.record("periodic persist of offsets, topics and groups", failure);
            }
        }
    }
}

async fn retention_loop(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(RETENTION_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let ran = blocking(&broker, |broker| {
            broker
                .store
                .run_retention(crate::now_ms(), broker.lowest_unread())
        })
        .await;
        match ran {
            Ok(Ok(report)) if !report.deleted_segments.is_empty() => tracing::info!(
                segments = report.deleted_segments.len(),
                queue_files = report.deleted_queue_files,
                min_physical_offset = %report.min_physical_offset,
                disk_used_ratio = report.disk_used_ratio,
                "retention deleted CommitLog segments"
            ),
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                tracing::error!(error = %crate::error::chain(&error), "retention failed")
            }
            Err(error) => {
                tracing::error!(error = %crate::error::chain(&error), "retention task failed")
            }
        }
    }
}

async fn client_expiry_loop(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(CLIENT_SCAN_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                for group in broker.consumers.expire(crate::now_ms(), broker.config.client_expiry_ms) {
                    tracing::info!(group, "client expired without heartbeat");
                    broker.consumers.notify_ids_changed(&group);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_read_buffer_counts_against_the_budget_and_hands_frames_to_requests() {
        let semaphore = Arc::new(Semaphore::new(1000));
        let mut budget = ReadBudget::new(semaphore.clone(), 1000);
        budget.hold(300).await.unwrap();
        assert_eq!(semaphore.available_permits(), 700);
        // A decoded 120-byte frame keeps its bytes counted until its request is answered.
        let request = budget.hand_over(120).expect("held");
        assert_eq!((budget.held(), semaphore.available_permits()), (180, 700));
        drop(request);
        assert_eq!(semaphore.available_permits(), 820);
        budget.release_above(100);
        assert_eq!((budget.held(), semaphore.available_permits()), (100, 900));
        // More than the whole budget is capped at it, so it can still be granted.
        budget.hold(5000).await.unwrap();
        assert_eq!((budget.held(), semaphore.available_permits()), (1000, 0));
        drop(budget);
        assert_eq!(semaphore.available_permits(), 1000);
    }

    #[tokio::test]
    async fn connections_waiting_for_more_do_not_hold_part_of_the_budget() {
        let semaphore = Arc::new(Semaphore::new(1000));
        let mut first = ReadBudget::new(semaphore.clone(), 1000);
        let mut second = ReadBudget::new(semaphore.clone(), 1000);
        first.hold(600).await.unwrap();
        second.hold(400).await.unwrap();
        // Both now want the whole budget; holding their parts while waiting would never end.
        let growers = [first, second].map(|mut budget| {
            tokio::spawn(async move {
                budget.hold(1000).await.unwrap();
                budget.held()
            })
        });
        let all = tokio::time::timeout(Duration::from_secs(20), async {
            let mut held = Vec::new();
            for grower in growers {
                held.push(grower.await.unwrap());
            }
            held
        })
        .await
        .expect("both get the whole budget in turn");
        assert_eq!(all, vec![1000, 1000]);
    }
}
