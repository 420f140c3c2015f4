//! The machine's own ceilings for the same bytes the store writes.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use memmap2::MmapMut;

use crate::measure::{p50, run_bounded, Bounds, Rate};

/// Copying `record` repeatedly into a warm buffer.
pub fn memcpy(record: &[u8], bounds: Bounds) -> anyhow::Result<Rate> {
    const BUFFER_BYTES: usize = 64 << 20;
    let mut buffer = vec![1u8; BUFFER_BYTES];
    let len = record.len();
    let mut at = 0;
    let rate = run_bounded(bounds, len as u64, 256, |n| {
        for _ in 0..n {
            if at + len > BUFFER_BYTES {
                at = 0;
            }
            buffer[at..at + len].copy_from_slice(std::hint::black_box(record));
            at += len;
        }
        Ok(())
    })?;
    std::hint::black_box(&buffer);
    Ok(rate)
}

/// Sequential writes of `record` into a fresh memory-mapped file (page faults included).
pub fn fresh_mmap(
    dir: &Path,
    record: &[u8],
    file_bytes: u64,
    bounds: Bounds,
) -> anyhow::Result<Rate> {
    let path = dir.join("ceiling-mmap");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)?;
    file.set_len(file_bytes)?;
    // SAFETY: a private scratch file nobody else maps or truncates.
    let mut map = unsafe { MmapMut::map_mut(&file)? };
    let len = record.len();
    let mut at = 0usize;
    let fits = file_bytes - file_bytes % len as u64;
    let bounds = Bounds {
        max_bytes: bounds.max_bytes.min(fits),
        ..bounds
    };
    let rate = run_bounded(bounds, len as u64, 256, |n| {
        for _ in 0..n {
            map[at..at + len].copy_from_slice(std::hint::black_box(record));
            at += len;
        }
        Ok(())
    })?;
    drop(map);
    std::fs::remove_file(&path)?;
    Ok(rate)
}

/// Where `write_fdatasync` writes its records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blocks {
    /// Appended to a new file: every fdatasync also allocates blocks.
    Appended,
    /// Into a 64 MiB file written and fdatasynced beforehand, cycled through: no allocation,
    /// as Sync mode's writes into the blocks the store fills ahead.
    Written,
}

/// write(record) + fdatasync, one writer; also the p50 latency of one round.
pub fn write_fdatasync(
    dir: &Path,
    record: &[u8],
    bounds: Bounds,
    blocks: Blocks,
) -> anyhow::Result<(Rate, Duration)> {
    use std::os::unix::fs::FileExt;
    const WRITTEN_BYTES: u64 = 64 << 20;
    let path = dir.join("ceiling-fdatasync");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let len = record.len() as u64;
    let slots = match blocks {
        Blocks::Appended => u64::MAX,
        Blocks::Written => {
            // Only as much as the bounds let the loop write, up to 64 MiB.
            let zeros = vec![0u8; 1 << 20];
            let used = bounds.ops_for(len).saturating_mul(len).min(WRITTEN_BYTES);
            let chunks = used.div_ceil(zeros.len() as u64);
            for _ in 0..chunks {
                file.write_all(&zeros)?;
            }
            file.sync_data()?;
            (chunks * zeros.len() as u64 / len).max(1)
        }
    };
    let mut round = 0;
    let mut latencies = Vec::new();
    let rate = run_bounded(bounds, len, 1, |_| {
        let started = Instant::now();
        file.write_all_at(record, round % slots * len)?;
        file.sync_data()?;
        latencies.push(started.elapsed());
        round += 1;
        Ok(())
    })?;
    drop(file);
    std::fs::remove_file(&path)?;
    Ok((rate, p50(latencies)))
}
