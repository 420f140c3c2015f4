//! The replica's side: truncating what the group's new epoch never acknowledged, then
//! mirroring the master's CommitLog and moving the read fence to the master's confirmed
//! offset.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use quiver_protocol::code::{request, response};
use quiver_protocol::header::{ReplicaFetchRequestHeader, ReplicaFetchResponseHeader};
use quiver_protocol::RemotingCommand;
use quiver_store::CommitLogOffset;
use tokio::sync::watch;

use super::Member;
use super::Replication;

/// Bytes asked for per fetch.
const FETCH_BYTES: u32 = 4 * 1024 * 1024;
/// How long the master may hold a fetch that finds nothing new.
const FETCH_WAIT_MS: u64 = 500;
/// A fetch not answered in this long is abandoned and the connection reopened.
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause after a failed fetch.
const RETRY_AFTER: Duration = Duration::from_millis(100);

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
    // A master that is restarting fails every fetch for a moment: logged when it starts,
    // changes and ends, not every round.
    let mut failures = crate::error::FailureLog::default();
    loop {
        let fetched = tokio::select! {
            _ = stop.changed() => return,
            fetched = fetch_once(&**broker, replication, epoch, &address) => fetched,
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

async fn fetch_once(
    broker: &dyn Member,
    replication: &Replication,
    epoch: u64,
    address: &str,
) -> Result<(), FollowError> {
    let offset = broker.store().log_end().0;
    let header = ReplicaFetchRequestHeader {
        broker_name: broker.config().broker_name.clone(),
        replica_id: replication.id,
        epoch,
        offset,
        max_bytes: FETCH_BYTES,
        max_wait_ms: FETCH_WAIT_MS,
        incarnation: Some(replication.epoch_file.incarnation()),
        unclean: Some(replication.unclean.load(Ordering::Acquire)),
    };
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
    let mine = broker.store().segment_size();
    if served.segment_size != mine {
        return Err(FollowError::SegmentSize {
            master: served.segment_size,
            mine,
        });
    }
    if let Some(oldest) = served.oldest.filter(|oldest| *oldest > offset) {
        replication.rebuild_from(broker, offset, oldest).await?;
        return Ok(());
    }
    let end = if answer.body.is_empty() {
        offset
    } else {
        let store = broker.store().clone();
        let body = answer.body.clone();
        let appended = tokio::task::spawn_blocking(move || {
            store.append_replicated(CommitLogOffset(offset), &body)
        })
        .await
        .map_err(|_| FollowError::Refused {
            code: response::SYSTEM_ERROR,
            remark: "the append task stopped".into(),
        })??;
        appended.0
    };
    // Readable here once the master says every in-sync member holds it.
    replication.confirm(broker.store(), served.confirmed.min(end));
    if end >= served.master_end {
        // Caught up with a master: whatever an unclean stop cost, it holds the log again.
        replication.unclean.store(false, Ordering::Release);
        replication.rebuild_caught_up(end);
    }
    Ok(())
}
