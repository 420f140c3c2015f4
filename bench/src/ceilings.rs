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

/// write(record) + fdatasync, one writer; also the p50 latency of one round.
pub fn write_fdatasync(
    dir: &Path,
    record: &[u8],
    bounds: Bounds,
) -> anyhow::Result<(Rate, Duration)> {
    let path = dir.join("ceiling-fdatasync");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let mut latencies = Vec::new();
    let rate = run_bounded(bounds, record.len() as u64, 1, |_| {
        let started = Instant::now();
        file.write_all(record)?;
        file.sync_data()?;
        latencies.push(started.elapsed());
        Ok(())
    })?;
    drop(file);
    std::fs::remove_file(&path)?;
    Ok((rate, p50(latencies)))
}

/// pwrite(record) + fdatasync into blocks written and fdatasynced beforehand, one writer:
/// what Sync mode's writes cost, since the store fills its tail ahead (no block allocation
/// in the fsync). Cycles through a 64 MiB file; also the p50 latency of one round.
pub fn overwrite_fdatasync(
    dir: &Path,
    record: &[u8],
    bounds: Bounds,
) -> anyhow::Result<(Rate, Duration)> {
    use std::os::unix::fs::FileExt;
    const FILE_BYTES: usize = 64 << 20;
    let path = dir.join("ceiling-overwrite");
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..FILE_BYTES / zeros.len() {
        file.write_all(&zeros)?;
    }
    file.sync_data()?;
    let slots = (FILE_BYTES / record.len()).max(1) as u64;
    let mut slot = 0;
    let mut latencies = Vec::new();
    let rate = run_bounded(bounds, record.len() as u64, 1, |_| {
        let started = Instant::now();
        file.write_all_at(record, slot % slots * record.len() as u64)?;
        file.sync_data()?;
        latencies.push(started.elapsed());
        slot += 1;
        Ok(())
    })?;
    drop(file);
    std::fs::remove_file(&path)?;
    Ok((rate, p50(latencies)))
}
