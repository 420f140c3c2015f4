//! Recovery at open: find where the CommitLog's valid records end, truncate the CommitLog
//! and the ConsumeQueues there, and re-dispatch the records the ConsumeQueues lack.

use std::collections::HashMap;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;

use crate::checkpoint::{self, Checkpoint};
use crate::commit_log::{CommitLog, TailWrites};
use crate::config::StoreConfig;
use crate::consume_queue::ConsumeQueue;
use crate::dispatch::{Dispatcher, QueueRegistry, Redispatch};
use crate::error::StoreError;
use crate::index::{self, IndexWriter, MessageIndex};
use crate::mapped_file::{data_ranges, list_dir, load_segments, sync_dir, MappedSegment};
use crate::record::{self, BodyCrc, RecordError, RecordHeader, Scanned};
use crate::CommitLogOffset;

/// What recovery found and did; `Display` gives one log line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The previous run called `shutdown()`.
    pub clean_shutdown: bool,
    pub checkpoint_found: bool,
    /// Where validation of the CommitLog started.
    pub scanned_from: CommitLogOffset,
    pub records_scanned: u64,
    /// The end of the valid records: the next append goes here.
    pub log_end: CommitLogOffset,
    /// Set when anything at or after `log_end` was removed.
    pub truncated_at: Option<CommitLogOffset>,
    /// Why the scan stopped before the written end, if it did.
    pub damage: Option<RecordError>,
    /// Non-zero bytes zeroed after `log_end`.
    pub truncated_bytes: u64,
    pub deleted_segments: usize,
    /// ConsumeQueue units dropped because they pointed past `log_end`.
    pub dropped_units: u64,
    pub redispatched_from: CommitLogOffset,
    pub redispatched_units: u64,
    /// Units re-dispatched after a hole in their queue (units that could not be rebuilt).
    pub queue_holes: u64,
    pub queues: usize,
    /// Message index entries below this were kept; records from here were re-indexed.
    pub index_rebuilt_from: CommitLogOffset,
    pub index_entries_rebuilt: u64,
    /// Index files deleted: they started past the recovery point, or were damaged.
    pub index_files_dropped: usize,
    /// Hash slots of the last index file that pointed past its entries after a crash.
    pub index_slots_repaired: u64,
    /// Re-indexing stopped here: the disk had no room. The first append once it has catches
    /// up to the log end recovery found.
    pub index_behind_from: Option<CommitLogOffset>,
    pub elapsed: Duration,
}

impl fmt::Display for RecoveryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} shutdown (checkpoint {}), scanned {} records from {}, log end {}",
            if self.clean_shutdown {
                "clean"
            } else {
                "dirty"
            },
            if self.checkpoint_found {
                "found"
            } else {
                "missing"
            },
            self.records_scanned,
            self.scanned_from,
            self.log_end,
        )?;
        if let Some(at) = self.truncated_at {
            write!(
                f,
                ", truncated at {at} ({} bytes, {} segments, {} units)",
                self.truncated_bytes, self.deleted_segments, self.dropped_units
            )?;
        }
        if let Some(damage) = &self.damage {
            write!(f, ", damage: {damage}")?;
        }
        write!(
            f,
            ", re-dispatched {} units from {} ({} after holes), {} queues, \
             re-indexed {} keys from {} ({} index files dropped, {} slots mended), in {} ms",
            self.redispatched_units,
            self.redispatched_from,
            self.queue_holes,
            self.queues,
            self.index_entries_rebuilt,
            self.index_rebuilt_from,
            self.index_files_dropped,
            self.index_slots_repaired,
            self.elapsed.as_millis()
        )?;
        if let Some(at) = self.index_behind_from {
            write!(
                f,
                "; the disk is full: keys from {at} on are indexed once writes resume"
            )?;
        }
        Ok(())
    }
}

/// The recovered state a store starts from.
pub(crate) struct Recovered {
    pub commit_log: CommitLog,
    pub registry: QueueRegistry,
    pub dispatcher: Dispatcher,
    pub index: MessageIndex,
    pub index_writer: IndexWriter,
    /// Records recovery could not index for lack of disk space: `[from, to)`.
    pub index_behind: Option<(u64, u64)>,
    pub log_end: u64,
    pub report: RecoveryReport,
    /// The checkpoint's confirmed offset (`publish_on_confirm`), never past `log_end`.
    pub confirmed_offset: Option<u64>,
}

struct ScanOutcome {
    end: u64,
    records: u64,
    damage: Option<RecordError>,
}

/// Walks valid records from `start`, calling `visit` on each; stops at the first bad one.
fn scan_log(
    segments: &[Arc<MappedSegment>],
    start: u64,
    crc: BodyCrc,
    mut visit: impl FnMut(&RecordHeader<'_>) -> Result<(), StoreError>,
) -> Result<ScanOutcome, StoreError> {
    let mut outcome = ScanOutcome {
        end: start,
        records: 0,
        damage: None,
    };
    let Some(mut index) = segments.iter().position(|s| s.contains(start)) else {
        return Ok(outcome);
    };
    let mut pos = start;
    let mut data = (usize::MAX, Vec::new());
    while index < segments.len() {
        let segment = &segments[index];
        if pos >= segment.end() {
            index += 1;
            continue;
        }
        if data.0 != index {
            data = (index, data_ranges(segment.path(), 0, segment.len()));
        }
        match scan_at(segment, &data.1, pos, crc) {
            Scanned::Message(header) if header.physical_offset.0 != pos => {
                outcome.damage = Some(RecordError::WrongPosition {
                    stored: header.physical_offset.0,
                    actual: pos,
                });
                break;
            }
            Scanned::Message(header) => {
                visit(&header)?;
                outcome.records += 1;
                pos += u64::from(header.size);
            }
            Scanned::Blank { .. } => pos = segment.end(),
            Scanned::End => break,
            Scanned::Damaged(error) => {
                outcome.damage = Some(error);
                break;
            }
        }
        outcome.end = pos;
    }
    outcome.end = pos;
    Ok(outcome)
}

/// Scans the record at `pos`, reading only pages that hold data: on tmpfs, reading a hole
/// through the mapping allocates a page, and on a full disk that is a SIGBUS.
fn scan_at<'a>(
    segment: &'a MappedSegment,
    data: &[(u64, u64)],
    pos: u64,
    crc: BodyCrc,
) -> Scanned<'a> {
    let at = pos - segment.base();
    let Some(&(_, data_end)) = data.iter().find(|(start, end)| *start <= at && at < *end) else {
        return Scanned::End;
    };
    let (readable, rest) = (data_end - at, segment.len() - at);
    // SAFETY: recovery has the files to itself; the bytes hold data.
    let bytes = unsafe { segment.slice(at, readable as usize) };
    // A blank filler spans the rest of the segment, holes included: only its head is read.
    if readable < rest {
        if let Some(head) = record::head(bytes).filter(record::Head::is_blank) {
            if u64::from(head.size as u32) == rest {
                return Scanned::Blank {
                    size: head.size as u32,
                };
            }
        }
    }
    record::scan_with(bytes, crc)
}

/// The segment base at or below `offset`, clamped to the existing segments.
fn segment_start(segments: &[Arc<MappedSegment>], offset: u64) -> u64 {
    segments
        .iter()
        .rev()
        .find(|s| s.base() <= offset)
        .or(segments.first())
        .map_or(0, |s| s.base())
}

fn load_queues(root: &Path, units_per_file: u64) -> Result<Vec<Arc<ConsumeQueue>>, StoreError> {
    std::fs::create_dir_all(root).map_err(|e| StoreError::io("create directory", root, e))?;
    let mut queues = Vec::new();
    for topic_dir in list_dir(root)? {
        let Some(topic) = topic_dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| topic_dir.is_dir())
        else {
            continue;
        };
        for queue_dir in list_dir(&topic_dir)? {
            let name = queue_dir.file_name().and_then(|n| n.to_str());
            match name.and_then(|n| n.parse::<u32>().ok()) {
                Some(queue_id) if queue_dir.is_dir() => {
                    queues.push(Arc::new(ConsumeQueue::open(
                        root,
                        topic,
                        queue_id,
                        units_per_file,
                    )?));
                }
                _ => {
                    tracing::warn!(path = %queue_dir.display(), "ignoring a non-queue entry")
                }
            }
        }
    }
    Ok(queues)
}

/// Maps the files, validates the log, truncates damage and rebuilds what the queues lack.
pub(crate) fn recover(config: &StoreConfig) -> Result<Recovered, StoreError> {
    let started = Instant::now();
    let log_dir = config.data_dir.join("commitlog");
    let queue_root = config.data_dir.join("consumequeue");
    let checkpoint: Option<Checkpoint> = checkpoint::load(&config.data_dir);
    let mut segments = load_segments(&log_dir)?;
    drop_empty_tail(&log_dir, &mut segments)?;

    let mut report = RecoveryReport {
        clean_shutdown: checkpoint.is_some_and(|c| c.clean_shutdown),
        checkpoint_found: checkpoint.is_some(),
        ..RecoveryReport::default()
    };
    let log_min = segments.first().map_or(0, |s| s.base());
    let starts = recovery_starts(&segments, checkpoint);
    let validate_from = starts.validate_from;
    report.scanned_from = CommitLogOffset(validate_from);

    let outcome = scan_log(&segments, validate_from, BodyCrc::Verify, |_| Ok(()))?;
    let log_end = outcome.end;
    report.records_scanned = outcome.records;
    report.log_end = CommitLogOffset(log_end);
    report.damage = outcome.damage;
    truncate_log(&log_dir, &mut segments, log_end, &mut report)?;

    let queues = recover_queues(&queue_root, config, (log_min, log_end), &mut report)?;

    let (registry, dispatcher) = adopt_queues(&queue_root, config, &queues);
    // The index must not point past what the log keeps.
    let index_from = starts.index_from.min(log_end);
    let (index, index_writer) = recover_index(config, index_from, &mut report)?;
    let mut targets = RebuildTargets {
        queues_from: starts.queues_from.min(log_end),
        registry: &registry,
        dispatcher,
        index_from,
        index: &index,
        index_writer,
    };
    report.redispatched_from = CommitLogOffset(targets.queues_from);
    redispatch(&segments, log_end, &mut targets, &mut report)?;
    let RebuildTargets {
        dispatcher,
        index_writer,
        ..
    } = targets;
    report.queues = flush_queues(&registry)?;
    index.flush()?;

    let commit_log = CommitLog::new(
        &log_dir,
        config.segment_size_bytes,
        segments,
        config.warms_segments(),
        TailWrites::for_mode(config.flush_mode),
    );
    // Everything recovery kept is made durable before the checkpoint claims it.
    commit_log
        .flush_range(validate_from, log_end)
        .map_err(|e| StoreError::io("flush commitlog", &log_dir, e))?;
    report.elapsed = started.elapsed();
    Ok(Recovered {
        commit_log,
        registry,
        dispatcher,
        index,
        index_writer,
        index_behind: report.index_behind_from.map(|from| (from.0, log_end)),
        log_end,
        report,
        confirmed_offset: checkpoint
            .and_then(|c| c.confirmed_offset)
            .map(|confirmed| confirmed.min(log_end)),
    })
}

/// Loads the ConsumeQueues and drops their units outside the log's `(min, end)`.
fn recover_queues(
    queue_root: &Path,
    config: &StoreConfig,
    (log_min, log_end): (u64, u64),
    report: &mut RecoveryReport,
) -> Result<Vec<Arc<ConsumeQueue>>, StoreError> {
    let queues = load_queues(queue_root, config.consume_queue_units_per_file)?;
    for queue in &queues {
        report.dropped_units += queue.recover(log_min, log_end)?;
    }
    if report.dropped_units > 0 && report.truncated_at.is_none() {
        report.truncated_at = Some(CommitLogOffset(log_end));
    }
    Ok(queues)
}

/// Opens the index, keeping the entries of records below `index_from`.
fn recover_index(
    config: &StoreConfig,
    index_from: u64,
    report: &mut RecoveryReport,
) -> Result<(MessageIndex, IndexWriter), StoreError> {
    let layout = index::layout(config.index_slots_per_file, config.index_entries_per_file);
    let (index, writer, found) =
        index::recover(&config.data_dir.join("index"), layout, index_from)?;
    report.index_files_dropped = found.dropped_files;
    report.index_slots_repaired = found.repaired_slots;
    report.index_rebuilt_from = CommitLogOffset(index_from);
    Ok((index, writer))
}

/// Where recovery starts reading the log.
struct RecoveryStarts {
    validate_from: u64,
    /// The queues may lack units from here.
    queues_from: u64,
    /// The index may lack entries from here.
    index_from: u64,
}

/// Where the log must be validated from, and where the queues and the index may lack
/// entries: the whole log without a checkpoint, the last segment after a clean shutdown,
/// else from the checkpoint. A checkpoint from before the index builds it from the start.
fn recovery_starts(
    segments: &[Arc<MappedSegment>],
    checkpoint: Option<Checkpoint>,
) -> RecoveryStarts {
    let log_min = segments.first().map_or(0, |s| s.base());
    let written_end = segments.last().map_or(0, |s| s.end());
    let Some(c) = checkpoint else {
        return RecoveryStarts {
            validate_from: log_min,
            queues_from: log_min,
            index_from: log_min,
        };
    };
    let validate_from = if c.clean_shutdown {
        segment_start(segments, written_end.saturating_sub(1))
    } else {
        segment_start(segments, c.commit_log_durable_offset)
    };
    let queues_from = c.consume_queue_durable_offset.clamp(log_min, written_end);
    let index_from = c
        .index_durable_offset
        .unwrap_or(log_min)
        .clamp(log_min, written_end);
    // Validate everything re-dispatch will walk, too.
    RecoveryStarts {
        validate_from: segment_start(segments, validate_from.min(queues_from).min(index_from)),
        queues_from,
        index_from,
    }
}

/// The registry of the queues found on disk and a dispatcher that owns their tails.
fn adopt_queues(
    queue_root: &Path,
    config: &StoreConfig,
    queues: &[Arc<ConsumeQueue>],
) -> (QueueRegistry, Dispatcher) {
    let registry: QueueRegistry = RwLock::new(HashMap::new());
    let mut dispatcher = Dispatcher::new(queue_root, config.consume_queue_units_per_file);
    {
        let mut map = registry.write();
        for queue in queues {
            map.entry(queue.topic().to_owned())
                .or_default()
                .insert(queue.queue_id(), Arc::clone(queue));
            dispatcher.adopt(Arc::clone(queue));
        }
    }
    (registry, dispatcher)
}

/// What re-dispatch rebuilds: the queues' units from `queues_from`, the index's entries
/// from `index_from`.
struct RebuildTargets<'a> {
    queues_from: u64,
    registry: &'a QueueRegistry,
    dispatcher: Dispatcher,
    index_from: u64,
    index: &'a MessageIndex,
    index_writer: IndexWriter,
}

/// Rebuilds the units and index entries the records up to `log_end` lack.
fn redispatch(
    segments: &[Arc<MappedSegment>],
    log_end: u64,
    targets: &mut RebuildTargets<'_>,
    report: &mut RecoveryReport,
) -> Result<(), StoreError> {
    let from = targets.queues_from.min(targets.index_from);
    if from >= log_end {
        return Ok(());
    }
    let start = segment_start(segments, from);
    // The first pass verified every record up to the log end.
    scan_log(segments, start, BodyCrc::Skip, |header| {
        let at = header.physical_offset;
        if at.0 >= targets.index_from && report.index_behind_from.is_none() {
            match targets.index_writer.reindex(targets.index, header) {
                Ok(entries) => report.index_entries_rebuilt += entries,
                // A full disk must not keep the store from opening: the writer catches up.
                Err(error) if is_disk_condition(&error) => {
                    tracing::warn!(error = %crate::error::chain(&error), "re-indexing stopped at {at}: the disk is full");
                    report.index_behind_from = Some(at);
                }
                Err(error) => return Err(error),
            }
        }
        if header.physical_offset.0 < targets.queues_from {
            return Ok(());
        }
        match targets.dispatcher.redispatch(targets.registry, header)? {
            Redispatch::AlreadyIndexed => {}
            Redispatch::Indexed => report.redispatched_units += 1,
            Redispatch::IndexedAfterHole { expected } => {
                tracing::warn!(
                    topic = header.topic,
                    queue_id = header.queue_id,
                    expected,
                    found = header.queue_offset.0,
                    "consume queue has a hole"
                );
                report.redispatched_units += 1;
                report.queue_holes += 1;
            }
        }
        Ok(())
    })?;
    Ok(())
}

/// Whether `error` is the disk refusing writes (full, read-only, failing), not damage.
fn is_disk_condition(error: &StoreError) -> bool {
    error
        .io_source()
        .and_then(crate::disk::RefusalReason::of_io_error)
        .is_some()
}

/// Makes every queue durable; returns how many there are.
fn flush_queues(registry: &QueueRegistry) -> Result<usize, StoreError> {
    let all_queues: Vec<Arc<ConsumeQueue>> = registry
        .read()
        .values()
        .flat_map(|m| m.values().cloned())
        .collect();
    for queue in &all_queues {
        queue.flush()?;
    }
    Ok(all_queues.len())
}

/// Removes a zero-length last file (a crash between create and size).
fn drop_empty_tail(dir: &Path, segments: &mut Vec<Arc<MappedSegment>>) -> Result<(), StoreError> {
    if let Some(last) = segments.last() {
        if last.len() == 0 {
            last.delete()?;
            segments.pop();
            sync_dir(dir)?;
        }
    }
    Ok(())
}

/// Zeroes everything after `log_end` and deletes later segments.
fn truncate_log(
    dir: &Path,
    segments: &mut Vec<Arc<MappedSegment>>,
    log_end: u64,
    report: &mut RecoveryReport,
) -> Result<(), StoreError> {
    let mut kept = Vec::with_capacity(segments.len());
    let mut deleted = 0;
    for segment in segments.drain(..) {
        if segment.end() <= log_end {
            kept.push(segment);
        } else if segment.base() <= log_end {
            let zeroed = segment.clear_from(log_end - segment.base())?;
            if zeroed > 0 {
                report.truncated_bytes += zeroed;
                // Zeroed bytes must reach the disk, or stale records could come back.
                segment
                    .flush_range(0, segment.len())
                    .map_err(|e| StoreError::io("flush commitlog", segment.path(), e))?;
            }
            kept.push(segment);
        } else {
            segment.delete()?;
            deleted += 1;
        }
    }
    *segments = kept;
    if deleted > 0 {
        // Deleted names must stay deleted after a crash.
        sync_dir(dir)?;
    }
    report.deleted_segments = deleted;
    if report.truncated_bytes > 0 || deleted > 0 || report.damage.is_some() {
        report.truncated_at = Some(CommitLogOffset(log_end));
    }
    Ok(())
}
