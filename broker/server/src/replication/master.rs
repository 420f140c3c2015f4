//! The master's side: serving replica fetches, counting what each replica holds, moving the
//! confirmed offset and keeping the in-sync set.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use quiver_consensus::{Command, GroupState};
use quiver_protocol::body::{ReplicaRole, ReplicaStatus};
use quiver_protocol::header::{ReplicaFetchRequestHeader, ReplicaFetchResponseHeader};
use quiver_store::{CommitLogOffset, MessageStore};

use super::{Replication, Role};
use crate::config::ReplicationMode;

/// A fetch is answered with at most this many bytes.
const MAX_FETCH_BYTES: u32 = 4 * 1024 * 1024;
/// A fetch is held at most this long when there is nothing new.
const MAX_FETCH_WAIT: Duration = Duration::from_millis(500);

/// How many recent fetches' log ends a follower's catching up is judged against (more than
/// a replica keeps in flight).
const RECENT_FETCHES: usize = 8;

/// What the master knows of one replica.
#[derive(Clone, Copy, Debug)]
pub(super) struct Follower {
    /// It holds every byte below this (what its latest fetch said it holds).
    pub acked: u64,
    /// The master's log end at its recent fetches, oldest overwritten first.
    recent: [Option<(Instant, u64)>; RECENT_FETCHES],
    next_recent: usize,
    /// When it last held every byte the master had (Kafka's lastCaughtUpTime).
    pub caught_up_at: Option<Instant>,
    /// Its data directory's incarnation, as its fetches name it (0: not named).
    pub incarnation: u64,
    /// It said it recovered from an unclean stop and has not caught up since.
    pub unclean: bool,
    /// The confirmed offset its last answer carried: a fetch is not held while it lacks a
    /// newer one, so its readers learn it without waiting for new bytes.
    confirmed_sent: u64,
}

impl Follower {
    fn new(fetcher: Fetcher, held: u64) -> Follower {
        Follower {
            acked: held,
            recent: [None; RECENT_FETCHES],
            next_recent: 0,
            caught_up_at: None,
            incarnation: fetcher.incarnation,
            unclean: fetcher.unclean,
            confirmed_sent: 0,
        }
    }

    /// When the master's log ended at or below `held`, by the latest fetch that saw it so.
    fn last_time_held(&self, held: u64) -> Option<Instant> {
        self.recent
            .iter()
            .flatten()
            .filter(|(_, end)| *end <= held)
            .map(|(at, _)| *at)
            .max()
    }

    fn remember(&mut self, now: Instant, end: u64) {
        self.recent[self.next_recent] = Some((now, end));
        self.next_recent = (self.next_recent + 1) % RECENT_FETCHES;
    }
}

/// Who is fetching: the replica's id, its incarnation, and whether it stopped uncleanly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fetcher {
    pub id: u64,
    pub incarnation: u64,
    pub unclean: bool,
}

/// The master's view of its replicas in one epoch.
#[derive(Debug, Default)]
pub(super) struct Progress {
    since: Option<Instant>,
    pub followers: BTreeMap<u64, Follower>,
}

impl Progress {
    /// Starts counting afresh for a new epoch.
    pub(super) fn reset(&mut self) {
        *self = Progress {
            since: Some(Instant::now()),
            followers: BTreeMap::new(),
        };
    }

    /// A fetch from `fetcher`, which holds the log below `held`, arrived while the log
    /// ended at `end`. Only a fetch that `opens` a stream (or a lone fetch) may say it
    /// holds less than before: the fetches of a stream may be recorded out of order.
    fn on_fetch(&mut self, fetcher: Fetcher, held: u64, opens: bool, end: u64, now: Instant) {
        let follower = self
            .followers
            .entry(fetcher.id)
            .or_insert_with(|| Follower::new(fetcher, held));
        let held = if opens {
            held
        } else {
            held.max(follower.acked)
        };
        let replaced = follower.incarnation != fetcher.incarnation;
        follower.incarnation = fetcher.incarnation;
        follower.unclean = fetcher.unclean && held < end;
        if held >= end {
            follower.caught_up_at = Some(now);
        } else if held < follower.acked || replaced || fetcher.unclean {
            // Back lower than it held, with another disk, or possibly short after an
            // unclean stop: it must catch up again.
            follower.caught_up_at = None;
            follower.recent = [None; RECENT_FETCHES];
        } else if let Some(at) = follower.last_time_held(held) {
            // Kafka's rule, over the fetches in flight: it holds what the master had then.
            follower.caught_up_at = follower.caught_up_at.max(Some(at));
        }
        // A replica that lost its disk comes back lower: it holds only what it says now.
        follower.acked = held;
        follower.remember(now, end);
    }

    /// The log end every member of `in_sync` and `joining` holds (the master `me` holds
    /// `end`): members being added count before the group can elect them.
    pub(super) fn held_by_all(
        &self,
        me: u64,
        end: u64,
        in_sync: &BTreeSet<u64>,
        joining: &BTreeSet<u64>,
    ) -> u64 {
        in_sync
            .union(joining)
            .filter(|id| **id != me)
            .map(|id| self.followers.get(id).map_or(0, |f| f.acked))
            .fold(end, u64::min)
    }

    /// How many members of `in_sync` (the master `me` among them) hold the log below `end`.
    pub(super) fn holders(&self, me: u64, end: u64, in_sync: &BTreeSet<u64>) -> usize {
        in_sync
            .iter()
            .filter(|id| **id == me || self.followers.get(id).is_some_and(|f| f.acked >= end))
            .count()
    }

    /// How long `id` has been behind; since the epoch started if it never caught up.
    fn behind_for(&self, id: u64, now: Instant) -> Duration {
        let since = self.followers.get(&id).and_then(|f| f.caught_up_at);
        since
            .or(self.since)
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }

    /// The in-sync set the master wants: itself, and the members caught up within
    /// `lag_max` that hold at least `confirmed` (a member that lost its disk would move the
    /// fence back). A member of the current set not heard from yet keeps its place for
    /// `lag_max` after the epoch started.
    pub(super) fn wanted_in_sync(
        &self,
        me: u64,
        current: &BTreeSet<u64>,
        members: &BTreeSet<u64>,
        lag_max: Duration,
        confirmed: u64,
        now: Instant,
    ) -> BTreeSet<u64> {
        members
            .iter()
            .copied()
            .filter(|id| {
                let holds = match self.followers.get(id) {
                    Some(follower) => follower.acked >= confirmed && !follower.unclean,
                    None => current.contains(id),
                };
                *id == me || holds && self.behind_for(*id, now) <= lag_max
            })
            .collect()
    }

    /// The incarnations of `in_sync` as the fetches named them; `agreed` ones for members
    /// not heard from in this epoch; `mine` for the master.
    pub(super) fn incarnations(
        &self,
        me: (u64, u64),
        in_sync: &BTreeSet<u64>,
        agreed: &BTreeMap<u64, u64>,
    ) -> BTreeMap<u64, u64> {
        in_sync
            .iter()
            .filter_map(|id| {
                let seen = self
                    .followers
                    .get(id)
                    .map(|f| f.incarnation)
                    .filter(|i| *i != 0);
                let known = if *id == me.0 { Some(me.1) } else { seen };
                known
                    .or_else(|| agreed.get(id).copied())
                    .map(|incarnation| (*id, incarnation))
            })
            .collect()
    }

    pub(super) fn statuses(
        &self,
        replication: &Replication,
        state: &GroupState,
        log_end: u64,
    ) -> Vec<ReplicaStatus> {
        let now = Instant::now();
        replication
            .members
            .iter()
            .map(|(id, address)| {
                let mine = *id == replication.id;
                let acked = if mine {
                    log_end
                } else {
                    self.followers.get(id).map_or(0, |f| f.acked)
                };
                ReplicaStatus {
                    replica_id: *id,
                    address: address.clone(),
                    role: if mine {
                        ReplicaRole::Master
                    } else {
                        ReplicaRole::Replica
                    },
                    in_sync: state.in_sync.contains(id),
                    log_end: acked,
                    lag_bytes: log_end.saturating_sub(acked),
                    lag_ms: if mine || acked >= log_end {
                        0
                    } else {
                        self.behind_for(*id, now).as_millis() as u64
                    },
                }
            })
            .collect()
    }
}

/// A fetch answered: its header and the bytes.
pub(crate) struct FetchServed {
    pub header: ReplicaFetchResponseHeader,
    pub body: Bytes,
}

/// Why a fetch is refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FetchRefusal {
    #[error("broker {name} member {id} is not the master of epoch {epoch} ({role:?})")]
    NotMaster {
        name: String,
        id: u64,
        epoch: u64,
        role: Role,
    },
    #[error("member {replica} of broker {expected} fetched as broker {found}")]
    WrongGroup {
        expected: String,
        found: String,
        replica: u64,
    },
    #[error("replica {replica} asks from offset {offset}, past the master's end {end}: it must truncate first")]
    Ahead { replica: u64, offset: u64, end: u64 },
    #[error("cannot read the CommitLog at {offset}: {reason}")]
    Read { offset: u64, reason: String },
    #[error("a fetch numbered in a stream names no stream")]
    NoStream,
    #[error(transparent)]
    Stream(#[from] super::stream::StreamError),
}

impl Replication {
    /// Answers one QUIVER_REPLICA_FETCH: records the replica's acknowledgement, then, in its
    /// turn in the replica's stream, returns the bytes from where it reads, waiting up to
    /// its `maxWaitMs` for new ones.
    pub(crate) async fn serve_fetch(
        &self,
        store: &MessageStore,
        request: &ReplicaFetchRequestHeader,
    ) -> Result<FetchServed, FetchRefusal> {
        self.check_fetcher(request)?;
        let end = store.log_end().0;
        let held = request.held.unwrap_or(request.offset);
        let opens = request.seq.unwrap_or(0) == 0;
        if held.max(request.offset) > end {
            return Err(FetchRefusal::Ahead {
                replica: request.replica_id,
                offset: held.max(request.offset),
                end,
            });
        }
        let fetcher = Fetcher {
            id: request.replica_id,
            incarnation: request.incarnation.unwrap_or(0),
            unclean: request.unclean.unwrap_or(false),
        };
        self.progress
            .lock()
            .on_fetch(fetcher, held, opens, end, Instant::now());
        self.fetch_recorded.notify_waiters();
        self.advance_confirmed(store);
        self.hold_for_replicas(store);
        let turn = match (request.seq, request.stream) {
            (None, _) => None,
            (Some(0), _) => Some(self.streams.open(fetcher.id, request.offset)),
            (Some(seq), Some(stream)) => {
                Some(self.streams.wait_turn(fetcher.id, stream, seq).await?)
            }
            (Some(_), None) => return Err(FetchRefusal::NoStream),
        };
        let from = turn.as_ref().map_or(request.offset, |turn| turn.read_from);
        let stream = turn.as_ref().map(|turn| turn.stream);
        let oldest = store.log_min().0;
        if from < oldest {
            let answer = self.answer_below_oldest(store, request, from, oldest, stream);
            if let Some(turn) = turn {
                turn.served(from);
            }
            return Ok(answer);
        }
        let wait = Duration::from_millis(request.max_wait_ms).min(MAX_FETCH_WAIT);
        self.wait_for_news(store, from, fetcher.id, wait).await;
        let max_bytes = request.max_bytes.clamp(1, MAX_FETCH_BYTES) as usize;
        let chunk = store
            .read_log(CommitLogOffset(from), max_bytes)
            .map_err(|error| FetchRefusal::Read {
                offset: from,
                reason: crate::error::chain(&error),
            })?;
        if let Some(turn) = turn {
            turn.served(from + chunk.bytes.len() as u64);
        }
        Ok(FetchServed {
            header: ReplicaFetchResponseHeader {
                epoch: request.epoch,
                offset: from,
                master_end: store.log_end().0,
                confirmed: self.confirmed_sent_to(fetcher.id),
                segment_size: store.segment_size(),
                oldest: Some(oldest),
                stream,
            },
            body: chunk.bytes,
        })
    }

    /// Refuses a fetch from another group, or one this member cannot serve as the master
    /// of the epoch it names.
    fn check_fetcher(&self, request: &ReplicaFetchRequestHeader) -> Result<(), FetchRefusal> {
        if request.broker_name != self.broker_name {
            return Err(FetchRefusal::WrongGroup {
                expected: self.broker_name.clone(),
                found: request.broker_name.clone(),
                replica: request.replica_id,
            });
        }
        let role = self.role();
        if role
            != (Role::Master {
                epoch: request.epoch,
            })
        {
            return Err(FetchRefusal::NotMaster {
                name: self.broker_name.clone(),
                id: self.id,
                epoch: request.epoch,
                role,
            });
        }
        Ok(())
    }

    /// Holds a fetch reading from the log's end, up to `wait`, until the log grows or the
    /// confirmed offset moves past what `replica` last heard.
    async fn wait_for_news(&self, store: &MessageStore, from: u64, replica: u64, wait: Duration) {
        if from < store.log_end().0 || self.has_news_for(replica) {
            return;
        }
        let grew = self.log_grew.notified();
        tokio::pin!(grew);
        grew.as_mut().enable();
        if store.log_end().0 == from && !self.has_news_for(replica) {
            let _ = tokio::time::timeout(wait, grew).await;
        }
    }

    /// Whether the confirmed offset moved past what `replica` last heard.
    fn has_news_for(&self, replica: u64) -> bool {
        let sent = self
            .progress
            .lock()
            .followers
            .get(&replica)
            .map(|f| f.confirmed_sent);
        sent.is_some_and(|sent| self.confirmed() > sent)
    }

    /// The confirmed offset, recorded as the last `replica` heard.
    fn confirmed_sent_to(&self, replica: u64) -> u64 {
        let confirmed = self.confirmed();
        if let Some(follower) = self.progress.lock().followers.get_mut(&replica) {
            follower.confirmed_sent = follower.confirmed_sent.max(confirmed);
        }
        confirmed
    }

    /// On the master: the confirmed offset becomes the least log end among the in-sync
    /// members (and those being added), and the store's read fence follows.
    pub(super) fn advance_confirmed(&self, store: &MessageStore) {
        let Role::Master { .. } = self.role() else {
            return;
        };
        // In both modes readers see what every in-sync member holds (Kafka's high
        // watermark): async mode acknowledges sooner, never shows a tail a failover cuts.
        let end = store.log_end().0;
        let in_sync = self.state.borrow().in_sync.clone();
        let joining = self.expanding.lock().clone();
        let confirmed = self
            .progress
            .lock()
            .held_by_all(self.id, end, &in_sync, &joining);
        self.confirm(store, confirmed);
    }

    /// Moves the read fence (never backwards).
    pub(super) fn confirm(&self, store: &MessageStore, offset: u64) {
        let moved = self.confirmed.send_if_modified(|confirmed| {
            let moves = offset > *confirmed;
            if moves {
                *confirmed = offset;
            }
            moves
        });
        if moved {
            store.confirm(CommitLogOffset(offset));
            // Parked replica fetches carry the new fence to their readers now, not when
            // their wait ends.
            self.log_grew.notify_waiters();
        } else if store.confirmed().0 < offset.min(self.confirmed()) {
            // A replica that cut its log back (and its fence with it) shows again what the
            // group confirmed as it copies it.
            store.confirm(CommitLogOffset(offset.min(self.confirmed())));
        }
    }

    /// The in-sync set change the master should propose now, if any.
    pub(super) fn in_sync_change(&self, store: &MessageStore) -> Option<Command> {
        let Role::Master { epoch } = self.role() else {
            return None;
        };
        let state = self.state();
        // In async mode sends do not wait for replicas, so a replica's place is judged by
        // catching up within the lag bound alone.
        let floor = match self.mode {
            ReplicationMode::Sync => self.confirmed().min(store.log_end().0),
            ReplicationMode::Async => 0,
        };
        let progress = self.progress.lock();
        let wanted = progress.wanted_in_sync(
            self.id,
            &state.in_sync,
            &self.member_ids(),
            self.lag_max,
            floor,
            Instant::now(),
        );
        if state.epoch != epoch || state.master != Some(self.id) {
            return None;
        }
        let me = (self.id, self.epoch_file.incarnation());
        let incarnations = progress.incarnations(me, &wanted, &state.incarnations);
        let agreed_incarnations = progress.incarnations(me, &state.in_sync, &state.incarnations);
        if wanted == state.in_sync && agreed_incarnations == state.incarnations {
            return None;
        }
        state.alter_in_sync(wanted, incarnations)
    }

    /// Before proposing `change`: its new members count for acknowledgements from now on
    /// (and the fence waits for them); members it drops stop counting only once agreed.
    pub(super) fn count_joining(&self, change: &Command, store: &MessageStore) {
        let Command::AlterInSync { in_sync, .. } = change else {
            return;
        };
        let joining: BTreeSet<u64> = in_sync
            .difference(&self.state.borrow().in_sync)
            .copied()
            .collect();
        *self.expanding.lock() = joining;
        self.advance_confirmed(store);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LAG_MAX: Duration = Duration::from_secs(3);

    fn members() -> BTreeSet<u64> {
        BTreeSet::from([0, 1, 2])
    }

    fn fetcher(id: u64) -> Fetcher {
        Fetcher {
            id,
            incarnation: 1,
            unclean: false,
        }
    }

    #[test]
    fn a_replica_that_keeps_up_stays_in_sync_and_one_that_stops_leaves() {
        let start = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.since = Some(start);
        progress.on_fetch(fetcher(1), 100, true, 100, start);
        progress.on_fetch(fetcher(2), 100, true, 100, start);
        // Replica 1 keeps fetching what the master had at its previous fetch.
        let later = start + Duration::from_secs(5);
        progress.on_fetch(
            fetcher(1),
            100,
            true,
            500,
            later - Duration::from_millis(10),
        );
        progress.on_fetch(fetcher(1), 500, true, 900, later);
        let wanted = progress.wanted_in_sync(0, &members(), &members(), LAG_MAX, 100, later);
        assert_eq!(wanted, BTreeSet::from([0, 1]));
    }

    #[test]
    fn a_replica_below_the_fence_is_not_in_sync_even_if_recent() {
        let now = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.on_fetch(fetcher(1), 0, true, 0, now);
        let current = BTreeSet::from([0, 1]);
        let wanted = progress.wanted_in_sync(0, &current, &members(), LAG_MAX, 10, now);
        assert_eq!(wanted, BTreeSet::from([0]));
    }

    #[test]
    fn a_replica_that_lost_its_disk_holds_only_what_it_says_now() {
        let now = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.on_fetch(fetcher(1), 1000, true, 1000, now);
        progress.on_fetch(fetcher(1), 0, true, 1000, now);
        assert_eq!(progress.followers[&1].acked, 0);
    }

    #[test]
    fn a_member_not_heard_from_keeps_its_place_only_for_the_lag_bound() {
        let start = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.since = Some(start);
        let current = BTreeSet::from([0, 1]);
        let early = progress.wanted_in_sync(0, &current, &members(), LAG_MAX, 0, start);
        assert_eq!(
            early, current,
            "member 2 was not in the set, member 1 keeps its place"
        );
        let late =
            progress.wanted_in_sync(0, &current, &members(), LAG_MAX, 0, start + LAG_MAX * 2);
        assert_eq!(late, BTreeSet::from([0]));
    }

    #[test]
    fn a_replica_back_with_another_incarnation_catches_up_before_it_is_in_sync() {
        let start = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.since = Some(start);
        progress.on_fetch(fetcher(1), 100, true, 100, start);
        // Same offset, new disk (it copied back up to 100 already): not caught up again.
        let wiped = Fetcher {
            incarnation: 2,
            ..fetcher(1)
        };
        let later = start + Duration::from_millis(100);
        progress.on_fetch(wiped, 100, true, 200, later);
        assert_eq!(progress.followers[&1].caught_up_at, None);
        let much_later = later + LAG_MAX * 2;
        let current = BTreeSet::from([0, 1]);
        let wanted = progress.wanted_in_sync(0, &current, &members(), LAG_MAX, 100, much_later);
        assert_eq!(wanted, BTreeSet::from([0]));
        let agreed = BTreeMap::from([(0, 9), (1, 1)]);
        assert_eq!(
            progress.incarnations((0, 9), &current, &agreed),
            BTreeMap::from([(0, 9), (1, 2)]),
            "the master proposes the incarnation it sees"
        );
    }

    #[test]
    fn an_unclean_replica_is_out_of_sync_until_it_catches_up() {
        let now = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        let unclean = Fetcher {
            unclean: true,
            ..fetcher(1)
        };
        progress.on_fetch(unclean, 100, true, 150, now);
        let current = BTreeSet::from([0, 1]);
        assert_eq!(
            progress.wanted_in_sync(0, &current, &members(), LAG_MAX, 50, now),
            BTreeSet::from([0])
        );
        progress.on_fetch(unclean, 150, true, 150, now);
        assert_eq!(
            progress.wanted_in_sync(0, &current, &members(), LAG_MAX, 50, now),
            current
        );
    }

    #[test]
    fn a_joining_member_counts_for_acknowledgements_before_it_is_agreed() {
        let now = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.on_fetch(fetcher(1), 500, true, 500, now);
        progress.on_fetch(fetcher(2), 300, true, 500, now);
        let in_sync = BTreeSet::from([0, 1]);
        assert_eq!(
            progress.held_by_all(0, 500, &in_sync, &BTreeSet::new()),
            500
        );
        // Member 2 is being added: nothing past what it holds is confirmed meanwhile.
        assert_eq!(
            progress.held_by_all(0, 500, &in_sync, &BTreeSet::from([2])),
            300
        );
    }

    #[test]
    fn holders_count_only_in_sync_members_that_hold_the_message() {
        let now = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.on_fetch(fetcher(1), 500, true, 500, now);
        progress.on_fetch(fetcher(2), 300, true, 500, now);
        let all = BTreeSet::from([0, 1, 2]);
        assert_eq!(progress.holders(0, 400, &all), 2);
        assert_eq!(progress.holders(0, 300, &all), 3);
        // The set shrank to the master while the send waited: one holder, below a minimum of 2.
        assert_eq!(progress.holders(0, 400, &BTreeSet::from([0])), 1);
    }

    #[test]
    fn a_stream_s_fetches_recorded_out_of_order_never_move_the_acknowledgement_back() {
        let now = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.on_fetch(fetcher(1), 100, true, 300, now);
        progress.on_fetch(fetcher(1), 300, false, 300, now);
        // An earlier fetch of the stream, recorded late.
        progress.on_fetch(fetcher(1), 200, false, 300, now);
        assert_eq!(progress.followers[&1].acked, 300);
        assert!(progress.followers[&1].caught_up_at.is_some());
        // A new stream may say less (it cut its log back).
        progress.on_fetch(fetcher(1), 150, true, 300, now);
        assert_eq!(progress.followers[&1].acked, 150);
        assert_eq!(progress.followers[&1].caught_up_at, None);
    }

    #[test]
    fn a_replica_with_fetches_in_flight_that_keeps_up_stays_caught_up() {
        let start = Instant::now();
        let mut progress = Progress::default();
        progress.reset();
        progress.since = Some(start);
        progress.on_fetch(fetcher(1), 0, true, 0, start);
        // The log grows 100 per fetch; every fetch acknowledges what the master had three
        // fetches before (the chunks in flight), never all of it.
        for step in 1..=50u64 {
            let at = start + Duration::from_millis(100 * step);
            let held = step.saturating_sub(3) * 100;
            progress.on_fetch(fetcher(1), held, false, step * 100, at);
        }
        let now = start + Duration::from_millis(5_000);
        let wanted = progress.wanted_in_sync(0, &members(), &members(), LAG_MAX, 0, now);
        assert!(wanted.contains(&1), "{wanted:?}");
        let behind = progress.behind_for(1, now);
        assert!(behind <= Duration::from_millis(400), "{behind:?}");
    }

    fn streamed(seq: u64, stream: Option<u64>, held: u64) -> ReplicaFetchRequestHeader {
        ReplicaFetchRequestHeader {
            broker_name: "broker-0".into(),
            replica_id: 1,
            epoch: 1,
            offset: 0,
            max_bytes: 20 * 1024,
            max_wait_ms: 0,
            incarnation: Some(7),
            unclean: Some(false),
            held: Some(held),
            stream,
            seq: Some(seq),
        }
    }

    #[tokio::test]
    async fn a_stream_of_fetches_reads_the_log_back_to_back_in_their_order() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::BrokerConfig {
            data_dir: dir.path().join("member"),
            ..Default::default()
        };
        let replication = super::super::fixture::member_0(config, &[0, 1], true);
        let store = super::super::fixture::store_of(&dir.path().join("store"), 2);
        let opened = replication
            .serve_fetch(&store, &streamed(0, None, 0))
            .await
            .unwrap();
        let stream = opened.header.stream;
        assert!(stream.is_some(), "the master names the stream");
        // Sent together, started last first: each is served where the one before it ended.
        let requests = [1, 2, 3].map(|seq| streamed(seq, stream, 0));
        let serve = |seq: usize| replication.serve_fetch(&store, &requests[seq - 1]);
        let (third, second, first) = tokio::join!(serve(3), serve(2), serve(1));
        let mut at = opened.body.len() as u64;
        for served in [first, second, third] {
            let served = served.unwrap();
            assert_eq!(served.header.offset, at);
            assert_eq!(served.header.stream, stream);
            let expected = store.read_log(CommitLogOffset(at), 20 * 1024).unwrap();
            assert_eq!(served.body, expected.bytes);
            at += served.body.len() as u64;
        }
        assert!(at > opened.body.len() as u64 * 3);
        // The replica said it appended nothing: nothing is counted as held.
        assert_eq!(replication.progress.lock().followers[&1].acked, 0);
        // A fetch of a stream the master did not open is refused, not served from 0.
        let refused = replication
            .serve_fetch(&store, &streamed(4, Some(9_999), 0))
            .await
            .err();
        assert!(
            matches!(refused, Some(FetchRefusal::Stream(_))),
            "{refused:?}"
        );
        store.shutdown().unwrap();
    }
}
