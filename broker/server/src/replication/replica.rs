//! The replica's side: truncating what the group's new epoch never acknowledged, then
//! mirroring the master's CommitLog and moving the read fence to the master's confirmed
//! offset. Several fetches are in flight as one stream; a fetched chunk is appended with
//! framing checks only and acknowledged by the next fetch at once; its records are dispatched (body CRC, queues, index) behind it on the
//! replica's own thread, and a record dispatch refuses cuts the log back to it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesOrdered, StreamExt};
use parking_lot::{Condvar, Mutex};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::{ReplicaFetchRequestHeader, ReplicaFetchResponseHeader};
use quiver_protocol::RemotingCommand;
use quiver_store::{CommitLogOffset, MessageStore, StoreError};
use tokio::sync::watch;

use super::Member;
use super::Replication;

/// Bytes asked for per fetch.
const FETCH_BYTES: u32 = 4 * 1024 * 1024;
/// Fetches kept in flight once the master names the stream.
const FETCHES_IN_FLIGHT: usize = 3;
/// How long the master may hold a fetch that finds nothing new.
const FETCH_WAIT_MS: u64 = 500;
/// A fetch not answered in this long is abandoned and the connection reopened.
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a failed fetch.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// Chunks up to this size are appended on the fetching task (a copy into mapped memory);
/// larger ones on a blocking thread.
const APPEND_INLINE_BYTES: usize = 512 * 1024;
/// Bytes dispatched per hold of the store's write lock, so appends interleave.
const DISPATCH_STEP_BYTES: u64 = 256 * 1024;
/// How long the dispatch thread sleeps when nothing wakes it (it retries a failing disk).
const DISPATCH_IDLE: Duration = Duration::from_millis(500);

/// Why following stopped for a moment.
#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(transparent)]
    Link(#[from] super::links::LinkError),
    #[error("the master answered code {code}: {remark}")]
    Refused { code: i32, remark: String },
    #[error("the master's answer has a bad header: {0}")]
    Header(#[from] quiver_protocol::HeaderError),
    #[error("the master's segment size {master} differs from this member's {mine}: the log cannot be mirrored")]
    SegmentSize { master: u64, mine: u64 },
    #[error("cannot store the master's bytes")]
    Store(#[from] quiver_store::StoreError),
    #[error("the master answered from {served} (or from another stream) where this member's log ends at {expected}; opening a new stream")]
    OutOfPlace { expected: u64, served: u64 },
    #[error("dispatch refused the record at {offset} ({reason}); cut the log back to it and fetching it again, acknowledging nothing past it meanwhile")]
    Dispatch { offset: u64, reason: String },
}

/// Follows `master` of `epoch` until `stop` flips (the caller drops this future when the
/// group's state changes).
pub(super) async fn follow(
    broker: &Arc<dyn Member>,
    replication: &Replication,
    epoch: u64,
    master: u64,
    stop: &mut watch::Receiver<bool>,
) {
    if let Err(error) = truncate_unacknowledged(&**broker, replication, epoch) {
        tracing::error!(error = %crate::error::chain(&*error), "cannot truncate the tail the group did not acknowledge; not following");
        let _ = stop.changed().await;
        return;
    }
    // Only a master keeps files for replicas.
    replication.hold_for_replicas(broker.store());
    let address = replication.address_of(master);
    tracing::info!(epoch, master, %address, end = broker.store().log_end().0, "following the group's master");
    let dispatch = match Dispatch::start(broker.store()) {
        Ok(dispatch) => dispatch,
        Err(error) => {
            tracing::error!(%error, "cannot start the replica's dispatch thread; not following");
            let _ = stop.changed().await;
            return;
        }
    };
    // A master that is restarting fails every fetch for a moment: logged when it starts,
    // changes and ends, not every round.
    let mut failures = crate::error::FailureLog::default();
    loop {
        let fetched = tokio::select! {
            _ = stop.changed() => return,
            fetched = follow_stream(&**broker, replication, epoch, &address, &dispatch) => fetched,
        };
        let failure = fetched
            .as_ref()
            .err()
            .map(|error| crate::error::chain(error));
        failures.record("replicating from the master", failure);
        if fetched.is_err() {
            tokio::select! {
                _ = stop.changed() => return,
                _ = tokio::time::sleep(RETRY_AFTER) => {}
            }
        }
    }
}

/// Cuts this member's log back to where the group's history says its data stops being the
/// group's, then records that the log now follows `epoch`.
fn truncate_unacknowledged(
    broker: &dyn Member,
    replication: &Replication,
    epoch: u64,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let state = replication.state();
    let end = broker.store().log_end().0;
    let local_epoch = replication.epoch_file.epoch();
    let Some(point) = state.truncation_point(local_epoch, end) else {
        return Err(
            format!("the group's history has no agreed start after epoch {local_epoch}").into(),
        );
    };
    if point < end {
        let report = broker.store().truncate_to(CommitLogOffset(point))?;
        tracing::warn!(
            from = point,
            end,
            local_epoch,
            epoch,
            ?report,
            "truncated the tail the group's new epoch never acknowledged"
        );
    }
    replication.epoch_file.advance(epoch)?;
    Ok(())
}

/// Follows the master as one stream of fetches, until one fails or the stream has to start
/// again (a rebuild, a record dispatch refused). Up to `FETCHES_IN_FLIGHT` are in flight
/// once the master names the stream: each answer is appended while the next ones are served,
/// and the fetch sent after an append acknowledges it.
async fn follow_stream(
    broker: &dyn Member,
    replication: &Replication,
    epoch: u64,
    address: &str,
    dispatch: &Dispatch,
) -> Result<(), FollowError> {
    if let Some(refused) = dispatch.refusal() {
        cut_back_to(broker.store(), &refused).await?;
        dispatch.resume();
        return Err(FollowError::Dispatch {
            offset: refused.offset,
            reason: refused.reason,
        });
    }
    let store = broker.store();
    // Where the next answer starts: the master serves a stream's fetches in order.
    let mut reads_from = store.log_end().0;
    let mut stream = None;
    let mut next_seq = 0;
    let mut in_flight = FuturesOrdered::new();
    let mut appended = false;
    loop {
        let window = if stream.is_some() {
            FETCHES_IN_FLIGHT
        } else {
            1
        };
        while in_flight.len() < window {
            let header = fetch_header(broker, replication, epoch, reads_from, stream, next_seq);
            in_flight.push_back(fetch(replication, address, header));
            next_seq += 1;
        }
        // Polled once first, so the new fetches (the acknowledgement among them) are sent
        // before the dispatch thread competes for a core.
        let first_look = futures_util::poll!(in_flight.next());
        if std::mem::take(&mut appended) {
            dispatch.wake();
        }
        let answer = match first_look {
            std::task::Poll::Ready(answer) => answer,
            std::task::Poll::Pending => in_flight.next().await,
        };
        let Some(answer) = answer else {
            continue;
        };
        let (served, body) = answer?;
        check_answer(store, &served, reads_from, stream)?;
        if let Some(oldest) = served.oldest.filter(|oldest| *oldest > reads_from) {
            replication.rebuild_from(broker, reads_from, oldest).await?;
            return Ok(());
        }
        // A master that serves streams names it; one that does not is fetched from alone.
        stream = served.stream;
        if !body.is_empty() {
            reads_from = append(store, reads_from, body).await?;
            appended = true;
        }
        // Readable here once the master says every in-sync member holds it.
        replication.confirm(store, served.confirmed.min(reads_from));
        if reads_from >= served.master_end {
            // Caught up with a master: whatever an unclean stop cost, it holds the log again.
            replication.unclean.store(false, Ordering::Release);
            replication.rebuild_caught_up(reads_from);
        }
        if dispatch.refusal().is_some() {
            dispatch.wake();
            // Answered fetches were recorded: none acknowledges past the cut that follows.
            while in_flight.next().await.is_some() {}
            return Ok(());
        }
    }
}

/// Fetch `seq` of `stream` (none: one that opens a stream at `reads_from`), acknowledging
/// what this member has appended.
fn fetch_header(
    broker: &dyn Member,
    replication: &Replication,
    epoch: u64,
    reads_from: u64,
    stream: Option<u64>,
    seq: u64,
) -> ReplicaFetchRequestHeader {
    ReplicaFetchRequestHeader {
        broker_name: broker.config().broker_name.clone(),
        replica_id: replication.id,
        epoch,
        offset: reads_from,
        max_bytes: FETCH_BYTES,
        max_wait_ms: FETCH_WAIT_MS,
        incarnation: Some(replication.epoch_file.incarnation()),
        unclean: Some(replication.unclean.load(Ordering::Acquire)),
        // Never more than is appended: the master counts it as held.
        held: Some(broker.store().log_end().0),
        stream,
        seq: Some(if stream.is_some() { seq } else { 0 }),
    }
}

/// Sends one fetch; its answer's header and bytes.
async fn fetch(
    replication: &Replication,
    address: &str,
    header: ReplicaFetchRequestHeader,
) -> Result<(ReplicaFetchResponseHeader, bytes::Bytes), FollowError> {
    let request = RemotingCommand::request(request::QUIVER_REPLICA_FETCH, header.to_ext());
    let answer = replication
        .links
        .request(address, request, FETCH_TIMEOUT)
        .await?;
    if answer.code != response::SUCCESS {
        return Err(FollowError::Refused {
            code: answer.code,
            remark: answer.remark.clone().unwrap_or_default(),
        });
    }
    let served = ReplicaFetchResponseHeader::from_command(&answer)?;
    Ok((served, answer.body.clone()))
}

/// Refuses an answer this member cannot append where its log ends.
fn check_answer(
    store: &MessageStore,
    served: &ReplicaFetchResponseHeader,
    reads_from: u64,
    stream: Option<u64>,
) -> Result<(), FollowError> {
    let mine = store.segment_size();
    if served.segment_size != mine {
        return Err(FollowError::SegmentSize {
            master: served.segment_size,
            mine,
        });
    }
    let same_stream = stream.is_none() || served.stream == stream;
    if served.offset != reads_from || !same_stream {
        return Err(FollowError::OutOfPlace {
            expected: reads_from,
            served: served.offset,
        });
    }
    Ok(())
}

/// Appends a fetched chunk at `offset` (framing checks only); returns the new log end.
async fn append(
    store: &Arc<MessageStore>,
    offset: u64,
    body: bytes::Bytes,
) -> Result<u64, FollowError> {
    if body.len() <= APPEND_INLINE_BYTES {
        return Ok(store.append_replicated(CommitLogOffset(offset), &body)?.0);
    }
    let store = store.clone();
    let appended = tokio::task::spawn_blocking(move || {
        store.append_replicated(CommitLogOffset(offset), &body)
    })
    .await
    .map_err(|_| FollowError::Refused {
        code: response::SYSTEM_ERROR,
        remark: "the append task stopped".into(),
    })??;
    Ok(appended.0)
}

/// Cuts the log back to the record dispatch refused, so the next fetch asks for it again
/// (the master sees this replica hold less, and it leaves the in-sync set until it has
/// caught up again).
async fn cut_back_to(store: &Arc<MessageStore>, refused: &Refused) -> Result<(), FollowError> {
    tracing::error!(
        offset = refused.offset,
        reason = %refused.reason,
        end = store.log_end().0,
        "dispatch refused a replicated record: cutting the log back to it"
    );
    let store = store.clone();
    let at = CommitLogOffset(refused.offset);
    tokio::task::spawn_blocking(move || store.truncate_to(at))
        .await
        .map_err(|_| FollowError::Refused {
            code: response::SYSTEM_ERROR,
            remark: "the truncation task stopped".into(),
        })??;
    Ok(())
}

/// A record dispatch refused: where, and why.
#[derive(Clone, Debug)]
struct Refused {
    offset: u64,
    reason: String,
}

/// What the fetching task and the dispatch thread share.
#[derive(Default)]
struct DispatchState {
    /// Chunks were appended since the thread last looked.
    appended: bool,
    /// The follower stopped: the thread dispatches what is appended, then ends.
    stopping: bool,
    /// A record dispatch refused; the thread waits until the fetching task cut the log
    /// back below it.
    refused: Option<Refused>,
}

/// The replica's dispatch thread (RocketMQ's ReputMessageService): dispatches what fetches
/// appended, behind the acknowledgements. Dropping it dispatches what is appended (so a
/// member that stops following, to become master, serves every record it holds) and ends
/// the thread.
struct Dispatch {
    shared: Arc<(Mutex<DispatchState>, Condvar)>,
    store: Arc<MessageStore>,
}

impl Dispatch {
    fn start(store: &Arc<MessageStore>) -> std::io::Result<Dispatch> {
        let shared = Arc::new((Mutex::new(DispatchState::default()), Condvar::new()));
        let for_thread = (Arc::clone(&shared), Arc::clone(store));
        std::thread::Builder::new()
            .name("quiver-replica-dispatch".into())
            .spawn(move || run_dispatch(&for_thread.0, &for_thread.1))?;
        Ok(Dispatch {
            shared,
            store: Arc::clone(store),
        })
    }

    /// A chunk was appended: dispatch it.
    fn wake(&self) {
        self.shared.0.lock().appended = true;
        self.shared.1.notify_one();
    }

    /// The record dispatch refused, if any: the thread waits for `resume`.
    fn refusal(&self) -> Option<Refused> {
        self.shared.0.lock().refused.clone()
    }

    /// The log was cut back below the refused record: dispatch goes on.
    fn resume(&self) {
        let mut state = self.shared.0.lock();
        state.refused = None;
        state.appended = true;
        self.shared.1.notify_one();
    }
}

impl Drop for Dispatch {
    fn drop(&mut self) {
        self.shared.0.lock().stopping = true;
        self.shared.1.notify_one();
        // Bounded by what the thread has not reached yet: little, as it keeps up.
        if let Err(error) = dispatch_all(&self.store) {
            if !matches!(error, StoreError::ShutDown) {
                tracing::warn!(error = %crate::error::chain(&error), "replicated records left undispatched as following stopped; the next local append or start dispatches them");
            }
        }
    }
}

/// The dispatch thread's loop: dispatches in steps until caught up, then waits to be woken.
fn run_dispatch(shared: &(Mutex<DispatchState>, Condvar), store: &MessageStore) {
    let (state, wake) = shared;
    let mut failures = crate::error::FailureLog::default();
    loop {
        let stopping = {
            let mut state = state.lock();
            loop {
                let refused = state.refused.is_some();
                if refused && state.stopping {
                    return;
                }
                if !refused && (state.appended || state.stopping) {
                    break;
                }
                let timed_out = wake.wait_for(&mut state, DISPATCH_IDLE).timed_out();
                // Idle: a failing disk is tried again.
                if timed_out && state.refused.is_none() {
                    break;
                }
            }
            state.appended = false;
            state.stopping
        };
        match dispatch_all(store) {
            Ok(()) => failures.record("dispatching replicated records", None),
            Err(StoreError::ShutDown) => return,
            Err(error) => match refusal(store, &error) {
                Some(refused) => state.lock().refused = Some(refused),
                // A failing disk: tried again when woken or idle.
                None => failures.record(
                    "dispatching replicated records",
                    Some(crate::error::chain(&error)),
                ),
            },
        }
        if stopping {
            return;
        }
    }
}

/// Dispatches everything appended, a step per hold of the write lock.
fn dispatch_all(store: &MessageStore) -> Result<(), StoreError> {
    while !store.dispatch_replicated(DISPATCH_STEP_BYTES)?.caught_up() {}
    Ok(())
}

/// The record dispatch refused, when `error` says the record itself is wrong (damaged, or
/// the logs diverged), not the disk: then the replica must not keep it. Dispatch stopped
/// before it, so it starts where dispatch stands.
fn refusal(store: &MessageStore, error: &StoreError) -> Option<Refused> {
    let wrong_record = matches!(
        error,
        StoreError::BadRecord { .. }
            | StoreError::ReplicaBadChunk { .. }
            | StoreError::ReplicaQueueOffsetMismatch { .. }
            | StoreError::ReplicaOffsetMismatch { .. }
            | StoreError::ImpossibleQueueOffset { .. }
            | StoreError::InvalidTopic { .. }
    );
    wrong_record.then(|| Refused {
        offset: store.dispatched_to().0,
        reason: crate::error::chain(error),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use quiver_store::record::{self, NewMessage, Placement};
    use quiver_store::{QueueOffset, StoreConfig};

    use super::*;

    fn store(dir: &std::path::Path) -> Arc<MessageStore> {
        let config = StoreConfig {
            data_dir: dir.to_path_buf(),
            segment_size_bytes: quiver_store::MIN_SEGMENT_SIZE_BYTES,
            consume_queue_units_per_file: 64,
            index_slots_per_file: 64,
            index_entries_per_file: 512,
            max_message_size_bytes: 16 * 1024,
            // The machine's own disk usage must not refuse writes here.
            disk_high_water_ratio: 1.0,
            disk_clean_ratio: 1.0,
            disk_force_clean_ratio: 1.0,
            publish_on_confirm: true,
            ..StoreConfig::default()
        };
        Arc::new(MessageStore::open(config).unwrap())
    }

    /// A record of queue `T`/0 as the master stored it at `at`.
    fn stored_at(at: u64, queue_offset: u64, body: &[u8]) -> Vec<u8> {
        let msg = NewMessage {
            topic: "T",
            queue_id: 0,
            flag: 0,
            body,
            properties: "",
            sys_flag: 0,
            born_timestamp_ms: 1,
            born_host: "10.0.0.1:40000".parse().unwrap(),
            store_host: "10.0.0.2:10911".parse().unwrap(),
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        let placement = Placement {
            queue_offset: QueueOffset(queue_offset),
            physical_offset: CommitLogOffset(at),
            store_timestamp_ms: 1,
        };
        record::encode(&msg, placement).unwrap()
    }

    #[tokio::test]
    async fn a_record_dispatch_refuses_is_reported_and_the_next_fetch_acknowledges_only_what_precedes_it(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = store(dir.path());
        let dispatch = Dispatch::start(&store).unwrap();
        let good = stored_at(0, 0, b"good");
        let bad_at = good.len() as u64;
        let mut damaged = stored_at(bad_at, 1, b"body");
        // Inside the body: the framing holds, only the body CRC tells.
        let in_body = damaged.len() - 12;
        damaged[in_body] ^= 1;
        let mut chunk = good;
        chunk.extend(&damaged);
        let end = append(&store, 0, chunk.into()).await.unwrap();
        dispatch.wake();
        assert_eq!(end, store.log_end().0, "appended whole, before dispatch");

        let deadline = Instant::now() + Duration::from_secs(30);
        let refused = loop {
            if let Some(refused) = dispatch.refusal() {
                break refused;
            }
            assert!(
                Instant::now() < deadline,
                "dispatch never refused the record"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(refused.offset, bad_at);
        assert!(refused.reason.contains("bad record"), "{}", refused.reason);
        cut_back_to(&store, &refused).await.unwrap();
        dispatch.resume();
        // The next fetch asks from (and acknowledges) the bad record's offset.
        assert_eq!(store.log_end().0, bad_at);
        // The master's good bytes go in and are dispatched.
        let resent = stored_at(bad_at, 1, b"body");
        append(&store, bad_at, resent.into()).await.unwrap();
        dispatch.wake();
        store.confirm(store.log_end());
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.max_offset("T", 0) != QueueOffset(2) {
            assert!(Instant::now() < deadline, "dispatch never caught up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(dispatch);
        store.shutdown().unwrap();
    }
}
