//! Opening the store (lock, recovery, the dirty checkpoint, the fence's held units, the
//! threads) and its clean shutdown.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use super::fence::{ConfirmFence, PendingUnit};
use super::restart;
use super::shared::{Shared, WriterState};
use crate::checkpoint::{self, Checkpoint};
use crate::config::StoreConfig;
use crate::disk::{self, RefusalReason, WriteGate};
use crate::error::{chain, StoreError};
use crate::flush::{self, FlushControl};
use crate::mapped_file::sync_dir;
use crate::record;
use crate::recovery;
use crate::retention::DeleteReason;
use crate::tally::Tally;

/// Opens the store under `config.data_dir`, running recovery first; returns it with its
/// threads started.
pub(super) fn open(config: StoreConfig) -> Result<(Arc<Shared>, Vec<JoinHandle<()>>), StoreError> {
    config.validate()?;
    std::fs::create_dir_all(&config.data_dir)
        .map_err(|e| StoreError::io("create directory", &config.data_dir, e))?;
    // On a read-only file system the store serves what it has and refuses writes until
    // it is restarted on a writable one.
    let opened_read_only = disk::read_usage(&config.data_dir).is_ok_and(|u| u.read_only);
    let lock = lock_data_dir(&config.data_dir, opened_read_only)?;
    if !opened_read_only {
        restart::finish_interrupted(&config.data_dir, config.segment_size_bytes)?;
    }
    let recovered = recovery::recover(&config)?;
    tracing::info!(data_dir = %config.data_dir.display(), "store recovered: {}", recovered.report);
    let log = recovered.commit_log.writer(recovered.log_end)?;
    if !opened_read_only {
        sync_dir(&config.data_dir)?;
    }
    let indexed_to = recovered
        .index_behind
        .map_or(recovered.log_end, |(from, _)| from);
    // A group member shows only what its group had confirmed before it stopped: the rest
    // may yet be truncated by the group's next epoch.
    let confirmed = if config.publish_on_confirm {
        recovered.confirmed_offset.unwrap_or(0)
    } else {
        recovered.log_end
    };
    let pending = save_dirty_checkpoint(&config, recovered.log_end, indexed_to, confirmed)?;
    let usage = disk::read_usage(&config.data_dir)
        .map_err(|e| StoreError::io("statvfs", &config.data_dir, e))?;
    let shared = Arc::new(Shared {
        gate: WriteGate::new(usage),
        data_dir_identity: disk::dir_identity(&config.data_dir).ok(),
        dirty_checkpoint_pending: AtomicBool::new(pending.is_some()),
        opened_read_only,
        deleted_segments: Tally::new(&DeleteReason::ALL),
        replica_hold: Default::default(),
        flush: FlushControl::new(recovered.log_end),
        commit_log: recovered.commit_log,
        registry: recovered.registry,
        index: recovered.index,
        writer: Mutex::new(WriterState {
            log,
            dispatcher: recovered.dispatcher,
            index: recovered.index_writer,
            index_behind: recovered.index_behind,
        }),
        hook: RwLock::new(None),
        shut_down: AtomicBool::new(false),
        report: recovered.report,
        // Recovery published every unit; `hold_unconfirmed` hides the unconfirmed again.
        fence: ConfirmFence::new(config.publish_on_confirm, recovered.log_end),
        config,
        retention: Mutex::new(()),
        _lock: lock,
        truncations: AtomicU64::new(0),
        checkpoint_lock: Mutex::new(()),
    });
    if let Some((reason, error)) = pending {
        shared
            .gate
            .close(shared.refusal(reason, &format!(" ({})", chain(&error))));
    }
    if confirmed < shared.commit_log.committed() {
        shared.hold_unconfirmed(confirmed)?;
    }
    shared.watch_disk();
    let threads = spawn_threads(&shared)?;
    Ok((shared, threads))
}

impl Shared {
    /// At open: the records from `confirmed` on were not known confirmed when the store
    /// stopped. Their units are hidden again and wait for `confirm`, as a new append's would.
    fn hold_unconfirmed(&self, confirmed: u64) -> Result<(), StoreError> {
        let end = self.commit_log.committed();
        let reader = self.reader();
        let mut held: Vec<PendingUnit> = Vec::new();
        let mut at = confirmed.max(self.commit_log.min_offset());
        while at < end {
            let bytes = self.commit_log.record_at(at)?;
            let next = match record::scan_with(&bytes, record::BodyCrc::Skip) {
                record::Scanned::Message(header) => {
                    if let Some(queue) = reader.queue(header.topic, header.queue_id) {
                        held.push(PendingUnit {
                            queue,
                            max: header.queue_offset.0 + 1,
                            start: at,
                            end: at + u64::from(header.size),
                        });
                    }
                    at + u64::from(header.size)
                }
                // The blank filler that ends a segment: its size is the rest.
                _ => at + bytes.len() as u64,
            };
            if next <= at {
                break;
            }
            at = next;
        }
        tracing::info!(
            confirmed,
            end,
            units = held.len(),
            "records past the checkpointed confirmed offset wait for the group to confirm them"
        );
        self.fence.hold(confirmed, held);
        Ok(())
    }

    /// `MessageStore::shutdown` up to stopping the threads: marks the store shut down and
    /// flushes everything; returns how far the index got and the flush's outcome.
    pub(super) fn stop_writes(&self) -> Option<(Option<u64>, Result<(), StoreError>)> {
        let indexed_to = {
            let writer = self.writer.lock();
            if self.shut_down.swap(true, Ordering::AcqRel) {
                return None;
            }
            writer.index_behind.map(|(from, _)| from)
        };
        Some((indexed_to, self.flush_all()))
    }

    /// Writes the clean-shutdown checkpoint, everything flushed and the threads stopped.
    pub(super) fn save_clean_checkpoint(&self, indexed_to: Option<u64>) -> Result<(), StoreError> {
        if self.data_dir_changed() {
            tracing::warn!(data_dir = %self.config.data_dir.display(), "the data directory was deleted; no checkpoint written");
            return Ok(());
        }
        let end = self.commit_log.committed();
        // A replica's records not dispatched yet are dispatched by the next start.
        let dispatched = self.writer.lock().dispatched_to().min(end);
        let saved = checkpoint::save(
            &self.config.data_dir,
            &Checkpoint {
                clean_shutdown: true,
                commit_log_durable_offset: end,
                consume_queue_durable_offset: self.fence.durable_to(dispatched),
                index_durable_offset: Some(indexed_to.unwrap_or(end).min(dispatched)),
                confirmed_offset: self.fence.checkpointed(end),
            },
        );
        match saved {
            // Everything is flushed: the next start only scans more, as after a crash.
            Err(error)
                if error
                    .io_source()
                    .and_then(RefusalReason::of_io_error)
                    .is_some() =>
            {
                tracing::warn!(error = %chain(&error), "cannot write the clean-shutdown checkpoint; the next start recovers as after a crash");
                Ok(())
            }
            saved => saved,
        }
    }
}

/// Takes an exclusive `flock` on `<data_dir>/lock` (on the directory itself on a read-only
/// file system): two stores on one directory would corrupt each other. The kernel drops it
/// when the process dies, even by kill -9.
fn lock_data_dir(data_dir: &std::path::Path, read_only: bool) -> Result<std::fs::File, StoreError> {
    let path = if read_only {
        data_dir.to_path_buf()
    } else {
        data_dir.join("lock")
    };
    let opened = if read_only {
        std::fs::File::open(&path)
    } else {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
    };
    let file = opened.map_err(|e| StoreError::io("open lock file", &path, e))?;
    let mut attempts = 0;
    loop {
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(file),
            // A child this process is spawning shares the previous holder's lock until it
            // execs, and a stopping process lets go a moment late: wait that moment out.
            Err(rustix::io::Errno::WOULDBLOCK) if attempts < LOCK_ATTEMPTS => {
                attempts += 1;
                std::thread::sleep(LOCK_RETRY);
            }
            Err(errno) => {
                return Err(StoreError::Locked {
                    path,
                    source: errno.into(),
                })
            }
        }
    }
}

/// How long a held data directory lock is waited for before the store refuses to open:
/// `LOCK_ATTEMPTS` x `LOCK_RETRY`, 2 s.
const LOCK_ATTEMPTS: u32 = 20;
const LOCK_RETRY: Duration = Duration::from_millis(100);

/// Writes the checkpoint that marks the store dirty until `shutdown()`. On a full or read-only
/// disk that fails: the store then opens refusing writes until it can be written (the reason
/// and the error are returned for the gate).
fn save_dirty_checkpoint(
    config: &StoreConfig,
    log_end: u64,
    indexed_to: u64,
    confirmed: u64,
) -> Result<Option<(RefusalReason, StoreError)>, StoreError> {
    let saved = checkpoint::save(
        &config.data_dir,
        &Checkpoint {
            clean_shutdown: false,
            commit_log_durable_offset: log_end,
            consume_queue_durable_offset: log_end,
            index_durable_offset: Some(indexed_to),
            confirmed_offset: config.publish_on_confirm.then_some(confirmed),
        },
    );
    match saved {
        Ok(()) => Ok(None),
        Err(error) => match error.io_source().and_then(RefusalReason::of_io_error) {
            Some(reason) => Ok(Some((reason, error))),
            None => Err(error),
        },
    }
}

/// What one of the store's threads runs.
type StoreThread = fn(&Shared);

/// The store's threads: the flusher, the housekeeper and the disk watcher. If one cannot
/// start, those started are stopped and joined.
fn spawn_threads(shared: &Arc<Shared>) -> Result<Vec<JoinHandle<()>>, StoreError> {
    let runs: [(&str, StoreThread); 3] = [
        ("quiver-store-flush", |shared| {
            let config = &shared.config;
            flush::run_flusher(
                &shared.flush,
                shared,
                config.flush_mode,
                Duration::from_millis(config.flush_interval_ms),
                flush::least_bytes(config.flush_least_pages),
            )
        }),
        ("quiver-store-checkpoint", |shared| {
            let interval = Duration::from_millis(shared.config.flush_interval_ms);
            flush::run_housekeeper(&shared.flush, shared, interval)
        }),
        ("quiver-store-disk", |shared| {
            let interval = Duration::from_millis(shared.config.disk_check_interval_ms);
            while shared.flush.wait_while_running(interval) {
                shared.watch_disk();
            }
        }),
    ];
    let mut threads = Vec::with_capacity(runs.len());
    for (name, run) in runs {
        let shared_for_thread = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(&shared_for_thread));
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                shared.flush.stop();
                threads.into_iter().for_each(|thread| drop(thread.join()));
                return Err(StoreError::io("spawn thread", &shared.config.data_dir, e));
            }
        }
    }
    Ok(threads)
}
