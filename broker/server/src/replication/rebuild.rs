//! Rebuilding a replica past its master's retention (RocketMQ's syncFromLastFile): when the
//! master's oldest retained segment starts past this member's log end (an empty data
//! directory, or one too far behind), the store restarts empty at that segment, each queue
//! at its first record's offset, and copies on from there; out of sync until caught up. The
//! master's side: answering such a fetch, and holding the files its in-sync replicas still
//! need (up to `--replica-retention-cap-bytes`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use quiver_protocol::header::{ReplicaFetchRequestHeader, ReplicaFetchResponseHeader};
use quiver_store::{CommitLogOffset, MessageStore, ReplicaHold, StoreError};

use super::master::FetchServed;
use super::{Member, Replication, Role};

/// A member's rebuilds: whether one is in progress, how many there were, and the cap of what
/// its retention keeps for replicas while it is master.
#[derive(Debug)]
pub(super) struct Rebuilds {
    cap_bytes: u64,
    in_progress: AtomicBool,
    started: AtomicU64,
}

impl Rebuilds {
    pub(super) fn new(config: &crate::config::BrokerConfig) -> Self {
        Rebuilds {
            cap_bytes: config.replica_retention_cap_bytes,
            in_progress: AtomicBool::new(false),
            started: AtomicU64::new(0),
        }
    }
}

/// What `quiver_replication_rebuilding` and `quiver_replication_rebuilds_total` report.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RebuildStats {
    /// This member restarted its log at its master's oldest segment and has not caught up.
    pub rebuilding: bool,
    /// Rebuilds since the process started.
    pub rebuilds: u64,
}

impl Replication {
    pub fn rebuild_stats(&self) -> RebuildStats {
        RebuildStats {
            rebuilding: self.rebuilds.in_progress.load(Ordering::Acquire),
            rebuilds: self.rebuilds.started.load(Ordering::Acquire),
        }
    }

    /// Sets the store's replica hold: on the master, from the least offset its in-sync
    /// replicas (and those being added) hold, so retention keeps what they have yet to copy;
    /// lifted on any other member, or with a cap of 0.
    pub(super) fn hold_for_replicas(&self, store: &MessageStore) {
        let master = matches!(self.role(), Role::Master { .. });
        if !master || self.rebuilds.cap_bytes == 0 {
            store.set_replica_hold(None);
            return;
        }
        let in_sync = self.state.borrow().in_sync.clone();
        let joining = self.expanding.lock().clone();
        let end = store.log_end().0;
        let from = self
            .progress
            .lock()
            .held_by_all(self.id, end, &in_sync, &joining);
        store.set_replica_hold(Some(ReplicaHold {
            from: CommitLogOffset(from),
            cap_bytes: self.rebuilds.cap_bytes,
        }));
    }

    /// The master's answer to a fetch of bytes its retention deleted: no bytes, and where
    /// its log starts now, so the replica rebuilds from there.
    pub(super) fn answer_below_oldest(
        &self,
        store: &MessageStore,
        request: &ReplicaFetchRequestHeader,
        from: u64,
        oldest: u64,
        stream: Option<u64>,
    ) -> FetchServed {
        tracing::warn!(
            replica = request.replica_id,
            offset = from,
            oldest,
            "a replica asks for CommitLog bytes retention deleted: it rebuilds from the oldest segment"
        );
        FetchServed {
            header: ReplicaFetchResponseHeader {
                epoch: request.epoch,
                offset: from,
                master_end: store.log_end().0,
                confirmed: self.confirmed(),
                segment_size: store.segment_size(),
                oldest: Some(oldest),
                stream,
            },
            body: bytes::Bytes::new(),
        }
    }

    /// On a replica whose next byte `end` the master deleted: drops its log, queues and
    /// index and starts the log at the master's `oldest` segment. Out of sync (the master
    /// sees it behind) until it has caught up.
    pub(super) async fn rebuild_from(
        &self,
        broker: &dyn Member,
        end: u64,
        oldest: u64,
    ) -> Result<(), StoreError> {
        self.rebuilds.in_progress.store(true, Ordering::Release);
        self.rebuilds.started.fetch_add(1, Ordering::AcqRel);
        let store = Arc::clone(broker.store());
        let discarded = store.log_end().0 - store.log_min().0;
        tracing::warn!(
            end,
            oldest,
            discarded_bytes = discarded,
            "the master's retention deleted this member's next bytes: discarding its log and rebuilding from the master's oldest segment"
        );
        let restart_store = Arc::clone(&store);
        let report =
            tokio::task::spawn_blocking(move || restart_store.restart_at(CommitLogOffset(oldest)))
                .await
                .map_err(|_| StoreError::ShutDown)??;
        // The fence dropped with the log: what the group confirmed still stands.
        store.confirm(CommitLogOffset(self.confirmed()));
        tracing::info!(?report, "the log restarted at the master's oldest segment");
        Ok(())
    }

    /// On a replica that holds everything its master had: a rebuild in progress is done.
    pub(super) fn rebuild_caught_up(&self, end: u64) {
        if self.rebuilds.in_progress.swap(false, Ordering::AcqRel) {
            tracing::info!(end, "rebuilt: caught up with the master");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::fixture::{member_0, store_of};

    /// Member 0, master of epoch 1 of the group {0, 1, 2} with in-sync set {0, 1}, and its
    /// store of five and a bit 64 KiB segments.
    fn master(dir: &std::path::Path, cap_bytes: u64) -> (Arc<Replication>, MessageStore) {
        let config = crate::config::BrokerConfig {
            data_dir: dir.join("member"),
            replica_retention_cap_bytes: cap_bytes,
            ..Default::default()
        };
        (
            member_0(config, &[0, 1], true),
            store_of(&dir.join("store"), 5),
        )
    }

    fn fetch(replication: &Replication, replica_id: u64, offset: u64) -> ReplicaFetchRequestHeader {
        ReplicaFetchRequestHeader {
            broker_name: replication.broker_name.clone(),
            replica_id,
            epoch: 1,
            offset,
            max_bytes: 1024,
            max_wait_ms: 0,
            incarnation: Some(7),
            unclean: Some(false),
            held: None,
            stream: None,
            seq: None,
        }
    }

    /// A year from now: every segment is past `file-reserved-hours`.
    fn a_year_on() -> i64 {
        crate::now_ms() + 365 * 24 * 3_600_000
    }

    #[tokio::test]
    async fn the_master_keeps_what_its_in_sync_replica_needs_and_sends_others_to_its_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let (replication, store) = master(dir.path(), u64::MAX);
        let segment = store.segment_size();
        let needed = store
            .read_log(CommitLogOffset(2 * segment), 1)
            .unwrap()
            .next
            .0;
        let served = replication
            .serve_fetch(&store, &fetch(&replication, 1, needed))
            .await
            .unwrap();
        assert_eq!(served.header.oldest, Some(0));
        store.run_retention(a_year_on(), None).unwrap();
        assert_eq!(
            store.log_min().0,
            2 * segment,
            "the file replica 1 reads stays"
        );
        assert_eq!(store.replica_hold_stats().held_bytes, 3 * segment);

        // Member 2 (out of sync, its disk lost) asks from 0: no bytes, the oldest offset.
        let served = replication
            .serve_fetch(&store, &fetch(&replication, 2, 0))
            .await
            .unwrap();
        assert!(served.body.is_empty());
        assert_eq!(served.header.oldest, Some(2 * segment));
        assert_eq!(replication.rebuild_stats(), RebuildStats::default());

        // Not master any more: the hold is lifted.
        replication.role.send_replace(Role::Unknown);
        replication.hold_for_replicas(&store);
        store.run_retention(a_year_on(), None).unwrap();
        assert_eq!(store.log_min().0, 5 * segment);
        store.shutdown().unwrap();
    }

    #[tokio::test]
    async fn a_cap_of_zero_keeps_nothing_for_replicas() {
        let dir = tempfile::tempdir().unwrap();
        let (replication, store) = master(dir.path(), 0);
        replication
            .serve_fetch(&store, &fetch(&replication, 1, 0))
            .await
            .unwrap();
        store.run_retention(a_year_on(), None).unwrap();
        assert_eq!(store.log_min().0, 5 * store.segment_size());
        store.shutdown().unwrap();
    }
}
