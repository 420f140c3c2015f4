//! Warm CommitLog segments (`FlushMode::Sync` with `warm-segments`), like RocketMQ's
//! `warmMappedFileEnable` + `AllocateMappedFileService`.
//!
//! An fsync that covers blocks written for the first time must also commit the file system's
//! journal (block allocation). So the next segment is zero-written and fsynced ahead of time,
//! in the background: `<name>.warm.tmp` is filled with plain writes in 1 MiB chunks, fdatasynced,
//! renamed to `<name>.warm` and the directory fsynced. A roll renames `<name>.warm` to `<name>`
//! (all zeros: a valid empty segment); when it is not ready the roll creates a sparse file
//! as without warming and never waits for a preparation in flight.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

use crate::error::StoreError;
use crate::mapped_file::{segment_name, sync_dir, SEGMENT_NAME_DIGITS};

const WARM_SUFFIX: &str = ".warm";
const WARM_TMP_SUFFIX: &str = ".warm.tmp";
/// Zeros are written in chunks of this size; the stop flag is checked between chunks.
const CHUNK_BYTES: usize = 1024 * 1024;
/// Fdatasync this often while filling, so at most this much is dirty (and a stop waits less).
const SYNC_EVERY_BYTES: u64 = 64 * 1024 * 1024;

pub(crate) fn warm_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{}{WARM_SUFFIX}", segment_name(base)))
}

fn tmp_path(dir: &Path, base: u64) -> PathBuf {
    dir.join(format!("{}{WARM_TMP_SUFFIX}", segment_name(base)))
}

/// The base of `<20 digits><suffix>`.
fn parse_with_suffix(path: &Path, suffix: &str) -> Option<u64> {
    let digits = path.file_name()?.to_str()?.strip_suffix(suffix)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The base of a prepared segment `<20 digits>.warm`.
pub(crate) fn parse_warm_name(path: &Path) -> Option<u64> {
    parse_with_suffix(path, WARM_SUFFIX)
}

/// True for `<20 digits>.warm.tmp`: a preparation that did not finish.
pub(crate) fn is_warm_tmp(path: &Path) -> bool {
    parse_with_suffix(path, WARM_TMP_SUFFIX).is_some()
}

fn is_warm(path: &Path, len: u64) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.len() == len)
}

/// Removes every `.warm` in `dir` except the one for `keep` (if it has the segment length).
pub(crate) fn remove_stale(dir: &Path, keep: Option<u64>, len: u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.filter_map(|e| e.ok()).map(|e| e.path()) {
        let Some(base) = parse_warm_name(&path) else {
            continue;
        };
        if Some(base) == keep && is_warm(&path, len) {
            continue;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => tracing::debug!(path = %path.display(), "removed a stale prepared segment"),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a stale prepared segment")
            }
        }
    }
}

/// Writes `len` zero bytes into a new `path` with plain writes and fdatasyncs it. `Ok(false)`
/// when `keep_going` said stop between two chunks (the file is left for the caller).
fn write_zeros(path: &Path, len: u64, keep_going: &dyn Fn() -> bool) -> std::io::Result<bool> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)?;
    let zeros = vec![0u8; CHUNK_BYTES];
    let mut written = 0u64;
    while written < len {
        if !keep_going() {
            return Ok(false);
        }
        let n = (len - written).min(CHUNK_BYTES as u64) as usize;
        file.write_all(&zeros[..n])?;
        written += n as u64;
        if written % SYNC_EVERY_BYTES == 0 {
            file.sync_data()?;
        }
    }
    file.sync_data()?;
    Ok(true)
}

fn discard(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove a partial prepared segment");
        }
    }
}

#[derive(Default)]
struct State {
    /// The base the worker should prepare next; cleared when done or claimed by a roll.
    target: Option<u64>,
    stopped: bool,
}

struct Shared {
    dir: PathBuf,
    len: u64,
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn wanted(&self, base: u64) -> bool {
        let state = self.state.lock();
        !state.stopped && state.target == Some(base)
    }

    fn finish(&self, base: u64) {
        let mut state = self.state.lock();
        if state.target == Some(base) {
            state.target = None;
        }
    }

    /// The worker: prepares each requested base until stopped.
    fn run(&self) {
        loop {
            let base = {
                let mut state = self.state.lock();
                loop {
                    if state.stopped {
                        return;
                    }
                    if let Some(base) = state.target {
                        break base;
                    }
                    self.wake.wait(&mut state);
                }
            };
            self.prepare(base);
            self.finish(base);
        }
    }

    fn prepare(&self, base: u64) {
        let warm = warm_path(&self.dir, base);
        if is_warm(&warm, self.len) {
            return;
        }
        let tmp = tmp_path(&self.dir, base);
        match write_zeros(&tmp, self.len, &|| self.wanted(base)) {
            Ok(true) => {}
            Ok(false) => return discard(&tmp),
            Err(e) => {
                tracing::warn!(path = %tmp.display(), error = %e, "cannot prepare the next commitlog segment; it will be created sparse");
                return discard(&tmp);
            }
        }
        // Renamed under the lock, so a roll that claimed this base never misses nor races it.
        let renamed = {
            let mut state = self.state.lock();
            if state.target == Some(base) && !state.stopped {
                state.target = None;
                Some(std::fs::rename(&tmp, &warm))
            } else {
                None
            }
        };
        match renamed {
            None => discard(&tmp),
            Some(Err(e)) => {
                tracing::warn!(path = %tmp.display(), error = %e, "cannot rename a prepared commitlog segment");
                discard(&tmp);
            }
            Some(Ok(())) => {
                if let Err(e) = sync_dir(&self.dir) {
                    tracing::warn!(error = %e, "cannot fsync the commitlog directory after preparing a segment");
                }
            }
        }
    }
}

/// Prepares the next CommitLog segment on the `quiver-store-warm` thread (one at most,
/// started on the first request, joined by [`Warmer::stop`]).
pub(crate) struct Warmer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Warmer {
    pub(crate) fn new(dir: &Path, segment_len: u64) -> Self {
        Warmer {
            shared: Arc::new(Shared {
                dir: dir.to_path_buf(),
                len: segment_len,
                state: Mutex::new(State::default()),
                wake: Condvar::new(),
            }),
            thread: Mutex::new(None),
        }
    }

    /// Asks the background thread to prepare `<base>.warm`; returns at once.
    pub(crate) fn request(&self, base: u64) {
        {
            let mut state = self.shared.state.lock();
            if state.stopped {
                return;
            }
            state.target = Some(base);
        }
        self.shared.wake.notify_one();
        let mut thread = self.thread.lock();
        if thread.is_some() {
            return;
        }
        let shared = Arc::clone(&self.shared);
        match std::thread::Builder::new()
            .name("quiver-store-warm".to_owned())
            .spawn(move || shared.run())
        {
            Ok(handle) => *thread = Some(handle),
            Err(e) => {
                tracing::warn!(error = %e, "cannot start the segment warming thread; segments stay sparse")
            }
        }
    }

    /// Prepares `<base>.warm` on the calling thread (a fresh log's first segment).
    pub(crate) fn prepare_now(&self, base: u64) {
        self.shared.state.lock().target = Some(base);
        self.shared.prepare(base);
        self.shared.finish(base);
    }

    /// Claims `<base>.warm` for a roll: renames it to the segment name and fsyncs the
    /// directory. `Ok(false)` when it is not ready (the caller creates a sparse file); a
    /// preparation of `base` still in flight is abandoned, never waited for.
    pub(crate) fn take(&self, base: u64) -> Result<bool, StoreError> {
        self.shared.finish(base);
        let dir = &self.shared.dir;
        let warm = warm_path(dir, base);
        if !is_warm(&warm, self.shared.len) {
            if warm.exists() {
                discard(&warm);
            }
            return Ok(false);
        }
        let segment = dir.join(segment_name(base));
        if let Err(e) = std::fs::rename(&warm, &segment) {
            tracing::warn!(path = %warm.display(), error = %e, "cannot use a prepared commitlog segment; creating it sparse");
            discard(&warm);
            return Ok(false);
        }
        // The new name must survive a crash, or recovery would miss the file.
        sync_dir(dir)?;
        Ok(true)
    }

    /// Stops the thread (between two chunks) and joins it. Idempotent.
    pub(crate) fn stop(&self) {
        self.shared.state.lock().stopped = true;
        self.shared.wake.notify_all();
        if let Some(handle) = self.thread.lock().take() {
            if handle.join().is_err() {
                tracing::error!("a store thread panicked");
            }
        }
    }
}

impl Drop for Warmer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let dir = Path::new("/d");
        assert_eq!(
            warm_path(dir, 65536),
            Path::new("/d/00000000000000065536.warm")
        );
        assert_eq!(parse_warm_name(&warm_path(dir, 65536)), Some(65536));
        assert!(is_warm_tmp(&tmp_path(dir, 7)));
        assert!(!is_warm_tmp(&warm_path(dir, 7)));
        assert_eq!(parse_warm_name(&tmp_path(dir, 7)), None);
        assert_eq!(parse_warm_name(Path::new("/d/0.warm")), None);
        assert_eq!(parse_warm_name(&dir.join(segment_name(7))), None);
    }

    #[test]
    fn background_preparation_and_take() {
        let dir = tempfile::tempdir().unwrap();
        let len = 3 * CHUNK_BYTES as u64 / 2;
        let warmer = Warmer::new(dir.path(), len);
        warmer.request(len);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !is_warm(&warm_path(dir.path(), len), len) {
            assert!(std::time::Instant::now() < deadline, "no .warm after 10 s");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(warmer.take(len).unwrap());
        let segment = dir.path().join(segment_name(len));
        assert_eq!(std::fs::metadata(&segment).unwrap().len(), len);
        assert!(!warm_path(dir.path(), len).exists());
        // Nothing prepared for this base: the roll goes sparse.
        assert!(!warmer.take(2 * len).unwrap());
        warmer.stop();
        warmer.request(3 * len);
        assert!(!tmp_path(dir.path(), 3 * len).exists());
    }
}
