//! POP consumption's durable state: per (group, topic, queue) the next offset to read and the
//! messages in flight (received, neither acked nor revived), each with its delivery attempt,
//! the time it becomes visible again and the revision its receipt handle names. Everything
//! below the lowest in-flight offset (or the next offset, none in flight) is done: acked,
//! revived elsewhere or skipped by a filter, so that is the acked prefix the broker commits.
//!
//! On disk, under `<data>/pop/`:
//! - `snapshot` (JSON, written atomically with a `.bak`): the state when log `generation`
//!   started, and the revision counter;
//! - `log.<20-digit generation>`: records appended since, each `len u32 LE | crc32 u32 LE |
//!   JSON payload` (a [`LogRecord`]). Every record sets cells to absolute values, so replaying
//!   a log over a snapshot taken while the log was already being written gives the same state.
//!
//! Recovery reads the snapshot (or its `.bak`), then every log from its generation on, in
//! order; a log ends at its first record that is not whole (a torn tail is cut off).
//! Time is passed in (`now_ms`): this module reads no clock.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use crate::config::FlushMode;
use crate::error::StoreError;
use crate::json_file::{read_json_with_backup, write_json_atomically};

mod log_file;
use log_file::{is_read_only, log_files, log_path, open_log, read_log};

/// One POP-consumed queue of one group. `topic` is the queue's own topic (a retry topic's
/// name for its queues).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PopKey {
    #[serde(rename = "g")]
    pub group: String,
    #[serde(rename = "t")]
    pub topic: String,
    #[serde(rename = "q")]
    pub queue_id: u32,
}

impl PopKey {
    pub fn new(group: &str, topic: &str, queue_id: u32) -> PopKey {
        PopKey {
            group: group.to_owned(),
            topic: topic.to_owned(),
            queue_id,
        }
    }
}

/// A message in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inflight {
    /// Deliveries so far, this one included (1 on the first).
    #[serde(rename = "a")]
    pub attempt: u32,
    /// Invisible until then (ms since the epoch); due for redelivery or revival after.
    #[serde(rename = "u")]
    pub invisible_until_ms: i64,
    /// The revision receipt handles name; a renewal makes older handles stale.
    #[serde(rename = "r")]
    pub revision: u64,
}

/// A message received now: its queue offset and its delivery attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub offset: u64,
    pub entry: Inflight,
}

/// One log record: each sets state to absolute values (replays are idempotent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op")]
enum LogRecord {
    /// A read: the next offset moved to `next` and these offsets went in flight.
    Read {
        key: PopKey,
        next: u64,
        entries: Vec<(u64, Inflight)>,
    },
    /// An in-flight message got a new deadline, attempt or revision.
    Renew {
        key: PopKey,
        offset: u64,
        entry: Inflight,
    },
    /// An in-flight message is done (acked, revived or dead-lettered).
    Remove { key: PopKey, offset: u64 },
}

/// What [`PopState::remove_many`] did: each entry's result, in order, and the queue's acked
/// prefix before and after.
pub type Removed = (Vec<Result<(), PopStateError>>, (u64, u64));

/// Why a handle's message cannot be acted on.
#[derive(Debug, thiserror::Error)]
pub enum PopStateError {
    #[error("offset {offset} of {key:?} is not in flight (acked, revived or never received)")]
    NotInFlight { key: PopKey, offset: u64 },
    #[error("offset {offset} of {key:?} was received again or changed since (revision {current}, not {given})")]
    Superseded {
        key: PopKey,
        offset: u64,
        given: u64,
        current: u64,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
struct QueueState {
    next_offset: u64,
    inflight: BTreeMap<u64, Inflight>,
    /// A receive is reading this queue (memory only): others skip it.
    #[serde(skip)]
    reading: bool,
}

impl QueueState {
    fn acked_prefix(&self) -> u64 {
        self.inflight
            .keys()
            .next()
            .copied()
            .unwrap_or(self.next_offset)
    }

    fn apply(&mut self, record: &LogRecord) {
        match record {
            LogRecord::Read { next, entries, .. } => {
                self.next_offset = self.next_offset.max(*next);
                self.inflight.extend(entries.iter().copied());
            }
            LogRecord::Renew { offset, entry, .. } => {
                self.inflight.insert(*offset, *entry);
            }
            LogRecord::Remove { offset, .. } => {
                self.inflight.remove(offset);
            }
        }
    }
}

/// The snapshot file's content.
#[derive(Default, Serialize, Deserialize)]
struct Snapshot {
    /// Logs from this generation on apply on top.
    generation: u64,
    next_revision: u64,
    queues: Vec<(PopKey, QueueState)>,
}

/// The log being appended to.
struct LogWriter {
    generation: u64,
    /// None on a read-only file system: the state is served as recovered, changes refused.
    file: Option<Arc<File>>,
}

/// What [`PopState::begin_read`] found.
pub enum ReadStart<'a> {
    /// Another receive is reading the queue right now.
    Busy,
    /// In-order group: messages are in flight and not yet visible again.
    Blocked,
    /// In-order group: these in-flight messages became visible again and are delivered anew
    /// (attempt + 1, new deadline and revision, already logged).
    Redeliver(Vec<Delivery>),
    /// Read the queue from `claim.from()`, then [`ReadClaim::finish`].
    Read(ReadClaim<'a>),
}

/// The right to read one queue for one group; dropping it without finishing reads nothing.
pub struct ReadClaim<'a> {
    state: &'a PopState,
    key: PopKey,
    queue: Arc<Mutex<QueueState>>,
    from: u64,
}

impl ReadClaim<'_> {
    /// The offset to read from.
    pub fn from(&self) -> u64 {
        self.from
    }

    /// Records the read: the queue was read up to `next` and `received` (offset, attempt)
    /// are now in flight until `invisible_until_ms`. Returns them with their revisions.
    pub fn finish(
        self,
        next: u64,
        received: &[(u64, u32)],
        invisible_until_ms: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        if received.is_empty() && next <= self.from {
            return Ok(Vec::new());
        }
        let deliveries: Vec<Delivery> = received
            .iter()
            .map(|&(offset, attempt)| Delivery {
                offset,
                entry: Inflight {
                    attempt,
                    invisible_until_ms,
                    revision: self.state.revision(),
                },
            })
            .collect();
        let record = LogRecord::Read {
            key: self.key.clone(),
            next: next.max(self.from),
            entries: deliveries.iter().map(|d| (d.offset, d.entry)).collect(),
        };
        let file = {
            let mut queue = self.queue.lock();
            let file = self.state.append(&record)?;
            queue.apply(&record);
            file
        };
        self.state.sync(&file)?;
        Ok(deliveries)
    }
}

impl Drop for ReadClaim<'_> {
    fn drop(&mut self) {
        self.queue.lock().reading = false;
    }
}

/// Log records after which the revive loop writes a snapshot and starts a new log.
pub const SNAPSHOT_EVERY_RECORDS: u64 = 100_000;

/// The POP state of every group, as [`PopState::open`] recovered it from `<data>/pop/`.
/// Hears the JSON payload of every record the state logs, under the log's lock (so in log
/// order). It must not block: a group's master hands the payloads on to its replicas.
pub type RecordHook = Box<dyn Fn(&[u8]) + Send + Sync>;

pub struct PopState {
    dir: PathBuf,
    flush_mode: FlushMode,
    queues: Mutex<HashMap<PopKey, Arc<Mutex<QueueState>>>>,
    log: Mutex<LogWriter>,
    next_revision: AtomicU64,
    /// Records appended since the last snapshot.
    since_snapshot: AtomicU64,
    /// One snapshot at a time.
    snapshotting: Mutex<()>,
    record_hook: std::sync::OnceLock<RecordHook>,
}

impl PopState {
    /// Opens (creating) `dir` and recovers the state: snapshot, then the logs after it.
    pub fn open(dir: &Path, flush_mode: FlushMode) -> Result<PopState, StoreError> {
        if let Err(e) = std::fs::create_dir_all(dir) {
            if !is_read_only(&e) {
                return Err(StoreError::io("create", dir, e));
            }
        }
        let snapshot: Snapshot = read_json_with_backup(&dir.join("snapshot"))?.unwrap_or_default();
        let mut queues: HashMap<PopKey, QueueState> = snapshot.queues.into_iter().collect();
        let mut next_revision = snapshot.next_revision.max(1);
        let mut generation = snapshot.generation;
        let mut replayed = 0;
        let logs = if dir.exists() {
            log_files(dir)?
        } else {
            Vec::new()
        };
        for (log_generation, path) in logs {
            if log_generation < snapshot.generation {
                continue;
            }
            generation = log_generation;
            for record in read_log(&path)? {
                next_revision = next_revision.max(max_revision(&record) + 1);
                let key = record_key(&record).clone();
                queues.entry(key).or_default().apply(&record);
                replayed += 1;
            }
        }
        let opened = if dir.exists() {
            open_log(dir, generation)
        } else {
            // Only a read-only file system leaves it missing after create_dir_all.
            let read_only = std::io::Error::from_raw_os_error(libc::EROFS);
            Err(StoreError::io("create", dir, read_only))
        };
        let file = match opened {
            Ok(file) => Some(Arc::new(file)),
            Err(StoreError::Io { source, .. }) if is_read_only(&source) => {
                tracing::warn!(dir = %dir.display(), "pop state on a read-only file system: 5.x receives, acks and changes are refused until the broker restarts on a writable one");
                None
            }
            Err(error) => return Err(error),
        };
        tracing::info!(
            queues = queues.len(),
            replayed,
            generation,
            "pop state recovered"
        );
        Ok(PopState {
            dir: dir.to_path_buf(),
            flush_mode,
            queues: Mutex::new(
                queues
                    .into_iter()
                    .map(|(key, state)| (key, Arc::new(Mutex::new(state))))
                    .collect(),
            ),
            log: Mutex::new(LogWriter { generation, file }),
            next_revision: AtomicU64::new(next_revision),
            since_snapshot: AtomicU64::new(replayed),
            snapshotting: Mutex::new(()),
            record_hook: std::sync::OnceLock::new(),
        })
    }

    fn revision(&self) -> u64 {
        self.next_revision.fetch_add(1, Ordering::Relaxed)
    }

    fn queue(&self, key: &PopKey) -> Arc<Mutex<QueueState>> {
        let mut queues = self.queues.lock();
        if let Some(queue) = queues.get(key) {
            return queue.clone();
        }
        queues.entry(key.clone()).or_default().clone()
    }

    /// Every queue's state, taken out of the map so each is locked on its own.
    fn all_queues(&self) -> Vec<(PopKey, Arc<Mutex<QueueState>>)> {
        self.queues
            .lock()
            .iter()
            .map(|(key, queue)| (key.clone(), queue.clone()))
            .collect()
    }

    fn existing(&self, key: &PopKey) -> Option<Arc<Mutex<QueueState>>> {
        self.queues.lock().get(key).cloned()
    }

    /// [`PopState::existing`], or `NotInFlight` for `offset` when `key` was never read.
    fn existing_with(
        &self,
        key: &PopKey,
        offset: u64,
    ) -> Result<Arc<Mutex<QueueState>>, PopStateError> {
        self.existing(key)
            .ok_or_else(|| PopStateError::NotInFlight {
                key: key.clone(),
                offset,
            })
    }

    /// Sets the hook that hears every record this state logs from now on (once).
    pub fn set_record_hook(&self, hook: RecordHook) {
        let _ = self.record_hook.set(hook);
    }

    /// Applies and logs a record another member's state logged (its hook's payload): a
    /// replica keeps its master's POP state, so as master it knows what is in flight.
    /// Records set absolute values, so applying one twice changes nothing.
    pub fn apply_replicated(&self, payload: &[u8]) -> Result<(), StoreError> {
        let record: LogRecord =
            serde_json::from_slice(payload).map_err(|source| StoreError::Json {
                path: self.dir.clone(),
                source,
            })?;
        // Handles the master issued stay distinct from the ones this member issues later.
        self.next_revision
            .fetch_max(max_revision(&record) + 1, Ordering::Relaxed);
        let queue_arc = self.queue(record_key(&record));
        let queue = queue_arc.lock();
        let file = self.write_record(&record, false)?;
        let mut queue = queue;
        queue.apply(&record);
        drop(queue);
        self.sync(&file)
    }

    /// Appends one record (a write, no fsync) and lets the hook hear it; the file to sync
    /// once the caller's locks are released.
    fn append(&self, record: &LogRecord) -> Result<Arc<File>, StoreError> {
        self.write_record(record, true)
    }

    fn write_record(&self, record: &LogRecord, to_hook: bool) -> Result<Arc<File>, StoreError> {
        self.write_records(std::slice::from_ref(record), to_hook)
    }

    /// Appends `records` with one write (one syscall for a batch), each its own frame as
    /// [`PopState::write_record`] writes it, and lets the hook hear each.
    fn write_records(&self, records: &[LogRecord], to_hook: bool) -> Result<Arc<File>, StoreError> {
        let mut frames = Vec::new();
        let mut payloads = Vec::with_capacity(records.len());
        for record in records {
            let payload = serde_json::to_vec(record).map_err(|source| StoreError::Json {
                path: self.dir.clone(),
                source,
            })?;
            frames.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            frames.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
            frames.extend_from_slice(&payload);
            payloads.push(payload);
        }
        let log = self.log.lock();
        let path = || log_path(&self.dir, log.generation);
        let Some(file) = &log.file else {
            let read_only = std::io::Error::from_raw_os_error(libc::EROFS);
            return Err(StoreError::io("append to", path(), read_only));
        };
        (&**file)
            .write_all(&frames)
            .map_err(|e| StoreError::io("append to", path(), e))?;
        self.since_snapshot
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        if let Some(hook) = self.record_hook.get().filter(|_| to_hook) {
            for payload in &payloads {
                hook(payload);
            }
        }
        Ok(file.clone())
    }

    /// Sync flush mode: the record is on disk before the call that wrote it returns.
    fn sync(&self, file: &File) -> Result<(), StoreError> {
        if self.flush_mode == FlushMode::Sync {
            file.sync_data()
                .map_err(|e| StoreError::io("fsync", self.dir.join("log"), e))?;
        }
        Ok(())
    }

    /// Logs `record` and applies it to `queue` (held), then syncs per the flush mode.
    fn commit(
        &self,
        mut queue: parking_lot::MutexGuard<'_, QueueState>,
        record: LogRecord,
    ) -> Result<(), StoreError> {
        let file = self.append(&record)?;
        queue.apply(&record);
        drop(queue);
        self.sync(&file)
    }

    /// Starts a receive on `key`'s queue. `fifo`: in-order delivery (a batch in flight blocks
    /// the queue; expired ones are redelivered in place, at most `max`). `initial` is the
    /// offset a queue never read starts from.
    pub fn begin_read(
        &self,
        key: &PopKey,
        fifo: bool,
        now_ms: i64,
        invisible_until_ms: i64,
        max: usize,
        initial: impl FnOnce() -> u64,
    ) -> Result<ReadStart<'_>, StoreError> {
        let queue_arc = match self.existing(key) {
            Some(queue) => queue,
            None => {
                let start = initial();
                let queue = self.queue(key);
                let mut state = queue.lock();
                if state.next_offset == 0 && state.inflight.is_empty() {
                    state.next_offset = start;
                }
                drop(state);
                queue
            }
        };
        let mut queue = queue_arc.lock();
        if queue.reading {
            return Ok(ReadStart::Busy);
        }
        if fifo && !queue.inflight.is_empty() {
            let due: Vec<(u64, Inflight)> = queue
                .inflight
                .iter()
                .filter(|(_, entry)| entry.invisible_until_ms <= now_ms)
                .take(max)
                .map(|(&offset, &entry)| (offset, entry))
                .collect();
            if due.is_empty() {
                return Ok(ReadStart::Blocked);
            }
            return self
                .redeliver(key, queue, &due, invisible_until_ms)
                .map(ReadStart::Redeliver);
        }
        queue.reading = true;
        let from = queue.next_offset;
        drop(queue);
        Ok(ReadStart::Read(ReadClaim {
            state: self,
            key: key.clone(),
            queue: queue_arc,
            from,
        }))
    }

    fn redeliver(
        &self,
        key: &PopKey,
        mut queue: parking_lot::MutexGuard<'_, QueueState>,
        due: &[(u64, Inflight)],
        invisible_until_ms: i64,
    ) -> Result<Vec<Delivery>, StoreError> {
        let mut deliveries = Vec::with_capacity(due.len());
        let mut file = None;
        for &(offset, entry) in due {
            let renewed = Inflight {
                attempt: entry.attempt + 1,
                invisible_until_ms,
                revision: self.revision(),
            };
            let record = LogRecord::Renew {
                key: key.clone(),
                offset,
                entry: renewed,
            };
            file = Some(self.append(&record)?);
            queue.apply(&record);
            deliveries.push(Delivery {
                offset,
                entry: renewed,
            });
        }
        drop(queue);
        if let Some(file) = file {
            self.sync(&file)?;
        }
        Ok(deliveries)
    }

    /// The in-flight entry of `offset` if `revision` is still its revision.
    fn check(
        key: &PopKey,
        queue: &QueueState,
        offset: u64,
        revision: u64,
    ) -> Result<Inflight, PopStateError> {
        let entry =
            queue
                .inflight
                .get(&offset)
                .copied()
                .ok_or_else(|| PopStateError::NotInFlight {
                    key: key.clone(),
                    offset,
                })?;
        if entry.revision != revision {
            return Err(PopStateError::Superseded {
                key: key.clone(),
                offset,
                given: revision,
                current: entry.revision,
            });
        }
        Ok(entry)
    }

    /// Removes an in-flight message whose handle names `revision` (an ack). Returns the acked
    /// prefix before and after.
    pub fn remove(
        &self,
        key: &PopKey,
        offset: u64,
        revision: u64,
    ) -> Result<(u64, u64), PopStateError> {
        let queue_arc = self.existing_with(key, offset)?;
        let queue = queue_arc.lock();
        Self::check(key, &queue, offset, revision)?;
        let before = queue.acked_prefix();
        let record = LogRecord::Remove {
            key: key.clone(),
            offset,
        };
        let file = self.append(&record)?;
        let mut queue = queue;
        queue.apply(&record);
        let after = queue.acked_prefix();
        drop(queue);
        self.sync(&file)?;
        Ok((before, after))
    }

    /// Removes several in-flight messages of one queue (a batched ack): one lock of the
    /// queue, one append of their `Remove` records (the same records [`PopState::remove`]
    /// logs, so the log's format does not change), one sync. `entries` are (offset, revision)
    /// pairs; each gets its own result, in order, as [`PopState::remove`] would answer it;
    /// a failed append fails them all. Returns the results and the acked prefix before and
    /// after.
    pub fn remove_many(&self, key: &PopKey, entries: &[(u64, u64)]) -> Result<Removed, StoreError> {
        let Some(queue_arc) = self.existing(key) else {
            let never_read = |&(offset, _): &(u64, u64)| {
                Err(PopStateError::NotInFlight {
                    key: key.clone(),
                    offset,
                })
            };
            return Ok((entries.iter().map(never_read).collect(), (0, 0)));
        };
        let mut queue = queue_arc.lock();
        let before = queue.acked_prefix();
        let mut removing = std::collections::BTreeSet::new();
        let results: Vec<Result<(), PopStateError>> = entries
            .iter()
            .map(|&(offset, revision)| {
                Self::check(key, &queue, offset, revision)?;
                // The same handle twice in one batch: the second finds it acked, as it
                // would one call later.
                if !removing.insert(offset) {
                    return Err(PopStateError::NotInFlight {
                        key: key.clone(),
                        offset,
                    });
                }
                Ok(())
            })
            .collect();
        if removing.is_empty() {
            return Ok((results, (before, before)));
        }
        let records: Vec<LogRecord> = removing
            .into_iter()
            .map(|offset| LogRecord::Remove {
                key: key.clone(),
                offset,
            })
            .collect();
        let file = self.write_records(&records, true)?;
        for record in &records {
            queue.apply(record);
        }
        let after = queue.acked_prefix();
        drop(queue);
        self.sync(&file)?;
        Ok((results, (before, after)))
    }

    /// Gives an in-flight message a new deadline (and a new revision: the old handle stops
    /// working); `next_attempt` counts it as a delivery.
    pub fn renew(
        &self,
        key: &PopKey,
        offset: u64,
        revision: u64,
        invisible_until_ms: i64,
    ) -> Result<Inflight, PopStateError> {
        let queue_arc = self.existing_with(key, offset)?;
        let queue = queue_arc.lock();
        let entry = Self::check(key, &queue, offset, revision)?;
        let renewed = Inflight {
            invisible_until_ms,
            revision: self.revision(),
            ..entry
        };
        self.commit(
            queue,
            LogRecord::Renew {
                key: key.clone(),
                offset,
                entry: renewed,
            },
        )?;
        Ok(renewed)
    }

    /// In-flight messages visible again at `now_ms` (at most `limit`), oldest deadline first.
    pub fn expired(&self, now_ms: i64, limit: usize) -> Vec<(PopKey, Delivery)> {
        let queues = self.all_queues();
        let mut due = Vec::new();
        for (key, queue) in queues {
            let queue = queue.lock();
            let expired = queue
                .inflight
                .iter()
                .filter(|(_, entry)| entry.invisible_until_ms <= now_ms);
            for (&offset, &entry) in expired {
                due.push((key.clone(), Delivery { offset, entry }));
            }
        }
        due.sort_by_key(|(_, delivery)| delivery.entry.invisible_until_ms);
        due.truncate(limit);
        due
    }

    /// The acked prefix of `key` (None: never read): offsets below it are done.
    pub fn acked_prefix(&self, key: &PopKey) -> Option<u64> {
        self.existing(key).map(|queue| queue.lock().acked_prefix())
    }

    /// The in-flight entry at `offset`, if any.
    pub fn inflight(&self, key: &PopKey, offset: u64) -> Option<Inflight> {
        self.existing(key)
            .and_then(|queue| queue.lock().inflight.get(&offset).copied())
    }

    /// Messages in flight in `key`'s queue.
    pub fn inflight_count(&self, key: &PopKey) -> usize {
        self.existing(key)
            .map_or(0, |queue| queue.lock().inflight.len())
    }

    /// Messages in flight per group.
    pub fn inflight_by_group(&self) -> BTreeMap<String, u64> {
        let queues = self.all_queues();
        let mut counts = BTreeMap::new();
        for (key, queue) in queues {
            *counts.entry(key.group).or_default() += queue.lock().inflight.len() as u64;
        }
        counts
    }

    /// Writes a snapshot and starts a new log when enough records accumulated (or `force`).
    /// Blocking: fsyncs and renames.
    pub fn snapshot_if_due(&self, force: bool) -> Result<bool, StoreError> {
        let due = force || self.since_snapshot.load(Ordering::Relaxed) >= SNAPSHOT_EVERY_RECORDS;
        if !due || self.log.lock().file.is_none() {
            return Ok(false);
        }
        let _one = self.snapshotting.lock();
        let generation = self.start_new_log()?;
        // Taken after the switch: the new log replays over it idempotently.
        let revision = self.next_revision.load(Ordering::Relaxed);
        let queues = self.all_queues();
        let mut states = Vec::with_capacity(queues.len());
        for (key, queue) in queues {
            let state = queue.lock().clone();
            if state.next_offset > 0 || !state.inflight.is_empty() {
                states.push((key, state));
            }
        }
        let snapshot = Snapshot {
            generation,
            next_revision: revision,
            queues: states,
        };
        write_json_atomically(&self.dir.join("snapshot"), &snapshot)?;
        // The `.bak` snapshot starts at the generation before: keep its log too.
        for (old, path) in log_files(&self.dir)? {
            if old + 1 < generation {
                std::fs::remove_file(&path).map_err(|e| StoreError::io("remove", &path, e))?;
            }
        }
        Ok(true)
    }

    fn start_new_log(&self) -> Result<u64, StoreError> {
        let mut log = self.log.lock();
        let generation = log.generation + 1;
        let file = open_log(&self.dir, generation)?;
        // The records before the switch must be durable before a snapshot replaces them.
        if let Some(old) = &log.file {
            old.sync_data()
                .map_err(|e| StoreError::io("fsync", log_path(&self.dir, log.generation), e))?;
        }
        *log = LogWriter {
            generation,
            file: Some(Arc::new(file)),
        };
        self.since_snapshot.store(0, Ordering::Relaxed);
        Ok(generation)
    }

    /// Flushes the log (a clean stop).
    pub fn flush(&self) -> Result<(), StoreError> {
        let log = self.log.lock();
        let Some(file) = &log.file else {
            return Ok(());
        };
        file.sync_data()
            .map_err(|e| StoreError::io("fsync", log_path(&self.dir, log.generation), e))
    }
}

fn record_key(record: &LogRecord) -> &PopKey {
    match record {
        LogRecord::Read { key, .. }
        | LogRecord::Renew { key, .. }
        | LogRecord::Remove { key, .. } => key,
    }
}

fn max_revision(record: &LogRecord) -> u64 {
    match record {
        LogRecord::Read { entries, .. } => {
            entries.iter().map(|(_, e)| e.revision).max().unwrap_or(0)
        }
        LogRecord::Renew { entry, .. } => entry.revision,
        LogRecord::Remove { .. } => 0,
    }
}

#[cfg(test)]
mod tests {
    use std::fs::OpenOptions;

    use super::*;

    fn key(queue_id: u32) -> PopKey {
        PopKey::new("g", "t", queue_id)
    }

    /// Reads `count` new messages of `key` (all pass the filter), in flight until `until`.
    fn read(state: &PopState, key: &PopKey, count: u64, until: i64) -> Vec<Delivery> {
        let ReadStart::Read(claim) = state.begin_read(key, false, 0, until, 32, || 0).unwrap()
        else {
            panic!("the queue is free");
        };
        let from = claim.from();
        let received: Vec<(u64, u32)> = (from..from + count).map(|o| (o, 1)).collect();
        claim.finish(from + count, &received, until).unwrap()
    }

    #[test]
    fn a_replica_applying_the_masters_records_knows_what_is_in_flight() {
        let (master_dir, replica_dir) =
            (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let master = PopState::open(master_dir.path(), FlushMode::Async).unwrap();
        let heard = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let sink = heard.clone();
        master.set_record_hook(Box::new(move |payload| sink.lock().push(payload.to_vec())));
        let got = read(&master, &key(0), 3, 1_000);
        master.remove(&key(0), 0, got[0].entry.revision).unwrap();
        let replica = PopState::open(replica_dir.path(), FlushMode::Async).unwrap();
        let payloads = heard.lock().clone();
        for payload in payloads.iter().chain(payloads.iter()) {
            replica.apply_replicated(payload).unwrap();
        }
        assert_eq!(
            replica.acked_prefix(&key(0)),
            Some(1),
            "applied twice, same state"
        );
        assert_eq!(replica.inflight(&key(0), 2), Some(got[2].entry));
        // An ack of a handle the master issued works on the replica become master.
        replica.remove(&key(0), 1, got[1].entry.revision).unwrap();
        let fresh = read(&replica, &key(0), 1, 1_000);
        assert_eq!(fresh[0].offset, 3);
        assert!(
            fresh[0].entry.revision > got[2].entry.revision,
            "revisions never repeat"
        );
        drop(replica);
        let reopened = PopState::open(replica_dir.path(), FlushMode::Async).unwrap();
        assert_eq!(
            reopened.inflight(&key(0), 2),
            Some(got[2].entry),
            "logged locally"
        );
    }

    #[test]
    fn a_batch_of_removes_is_one_append_with_each_entrys_result() {
        let dir = tempfile::tempdir().unwrap();
        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        let heard = Arc::new(Mutex::new(Vec::<Vec<u8>>::new()));
        let sink = heard.clone();
        state.set_record_hook(Box::new(move |payload| sink.lock().push(payload.to_vec())));
        let got = read(&state, &key(0), 4, 1_000);
        let (_, log) = log_files(dir.path()).unwrap().pop().unwrap();
        let before = std::fs::metadata(&log).unwrap().len();
        heard.lock().clear();
        let revision = |i: usize| got[i].entry.revision;
        let entries = [
            (1, revision(1)),
            (0, revision(0)),
            (2, revision(2) + 1), // a stale revision
            (1, revision(1)),     // the same handle twice
            (9, 1),               // never received
        ];
        let (results, (prefix_before, prefix_after)) =
            state.remove_many(&key(0), &entries).unwrap();
        assert!(results[0].is_ok() && results[1].is_ok());
        assert!(matches!(results[2], Err(PopStateError::Superseded { .. })));
        assert!(matches!(
            results[3],
            Err(PopStateError::NotInFlight { offset: 1, .. })
        ));
        assert!(matches!(
            results[4],
            Err(PopStateError::NotInFlight { offset: 9, .. })
        ));
        assert_eq!((prefix_before, prefix_after), (0, 2));
        // The same Remove records as two single removes, written together.
        assert_eq!(heard.lock().len(), 2, "one record per removed offset");
        let written = std::fs::metadata(&log).unwrap().len() - before;
        let singles: u64 = heard.lock().iter().map(|p| p.len() as u64 + 8).sum();
        assert_eq!(written, singles);
        assert_eq!(state.inflight(&key(0), 2), Some(got[2].entry));
        let (results, _) = state.remove_many(&key(1), &[(0, 1)]).unwrap();
        assert!(
            matches!(results[0], Err(PopStateError::NotInFlight { .. })),
            "a queue never read"
        );
        drop(state);
        let reopened = PopState::open(dir.path(), FlushMode::Async).unwrap();
        assert_eq!(reopened.acked_prefix(&key(0)), Some(2), "replayed");
    }

    #[test]
    fn state_survives_reopen_and_a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let got = {
            let state = PopState::open(dir.path(), FlushMode::Sync).unwrap();
            let got = read(&state, &key(0), 3, 1_000);
            state.remove(&key(0), 0, got[0].entry.revision).unwrap();
            got
        };
        let (_, log) = log_files(dir.path()).unwrap().pop().unwrap();
        let whole = std::fs::metadata(&log).unwrap().len();
        // Half a record more: a write cut short by a crash.
        let mut file = OpenOptions::new().append(true).open(&log).unwrap();
        file.write_all(&[40, 0, 0, 0, 1, 2, 3, 4, b'{']).unwrap();
        drop(file);

        let state = PopState::open(dir.path(), FlushMode::Sync).unwrap();
        assert_eq!(
            std::fs::metadata(&log).unwrap().len(),
            whole,
            "tail cut off"
        );
        assert_eq!(state.acked_prefix(&key(0)), Some(1));
        assert_eq!(state.inflight(&key(0), 1), Some(got[1].entry));
        assert!(state.inflight(&key(0), 0).is_none());
        let fresh = read(&state, &key(0), 1, 1_000);
        assert_eq!(fresh[0].offset, 3);
        assert!(
            fresh[0].entry.revision > got[2].entry.revision,
            "revisions never repeat"
        );
    }

    #[test]
    fn a_snapshot_replaces_old_logs_and_a_damaged_middle_record_ends_that_log() {
        let dir = tempfile::tempdir().unwrap();
        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        let first = read(&state, &key(0), 2, 1_000);
        assert!(state.snapshot_if_due(true).unwrap());
        let second = read(&state, &key(1), 1, 1_000);
        state.remove(&key(0), 1, first[1].entry.revision).unwrap();
        assert!(state.snapshot_if_due(true).unwrap());
        state.remove(&key(1), 0, second[0].entry.revision).unwrap();
        let generations: Vec<u64> = log_files(dir.path())
            .unwrap()
            .iter()
            .map(|(g, _)| *g)
            .collect();
        assert_eq!(
            generations,
            [1, 2],
            "logs older than the .bak snapshot's are deleted"
        );
        drop(state);

        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        assert_eq!(
            state.acked_prefix(&key(0)),
            Some(0),
            "offset 0 still in flight"
        );
        assert_eq!(state.inflight(&key(0), 0), Some(first[0].entry));
        assert_eq!(state.acked_prefix(&key(1)), Some(1));
        drop(state);

        // A flipped byte in the last log: its records from there on are not replayed.
        let (_, log) = log_files(dir.path()).unwrap().pop().unwrap();
        let mut bytes = std::fs::read(&log).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0xff;
        std::fs::write(&log, &bytes).unwrap();
        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        assert_eq!(
            state.acked_prefix(&key(1)),
            Some(0),
            "the removal was lost, not invented"
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), 0);
    }

    #[test]
    fn in_order_queues_block_then_redeliver_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        let got = read(&state, &key(0), 2, 100);
        assert!(matches!(
            state.begin_read(&key(0), true, 50, 200, 32, || 0).unwrap(),
            ReadStart::Blocked
        ));
        let ReadStart::Redeliver(again) =
            state.begin_read(&key(0), true, 100, 300, 1, || 0).unwrap()
        else {
            panic!("expired entries come back");
        };
        assert_eq!(again.len(), 1, "at most max");
        assert_eq!((again[0].offset, again[0].entry.attempt), (0, 2));
        assert!(matches!(
            state.remove(&key(0), 0, got[0].entry.revision),
            Err(PopStateError::Superseded { .. })
        ));
        state.remove(&key(0), 0, again[0].entry.revision).unwrap();
        assert!(matches!(
            state.remove(&key(0), 0, again[0].entry.revision),
            Err(PopStateError::NotInFlight { .. })
        ));
    }

    #[test]
    fn a_queue_being_read_is_busy_for_other_receives() {
        let dir = tempfile::tempdir().unwrap();
        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        let claim = state.begin_read(&key(0), false, 0, 10, 32, || 5).unwrap();
        assert!(matches!(claim, ReadStart::Read(ref c) if c.from() == 5));
        assert!(matches!(
            state.begin_read(&key(0), false, 0, 10, 32, || 0).unwrap(),
            ReadStart::Busy
        ));
        drop(claim);
        assert!(matches!(
            state.begin_read(&key(0), false, 0, 10, 32, || 0).unwrap(),
            ReadStart::Read(_)
        ));
    }
}
