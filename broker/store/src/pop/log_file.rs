//! The POP log's files: `log.<20-digit generation>` names, listing, opening for append, and
//! reading the whole records back (a torn tail cut off).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::{Path, PathBuf};

use super::LogRecord;
use crate::error::StoreError;

pub(super) fn log_path(dir: &Path, generation: u64) -> PathBuf {
    dir.join(format!("log.{generation:020}"))
}

/// The logs in `dir`, oldest generation first.
pub(super) fn log_files(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StoreError> {
    let mut logs = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| StoreError::io("read dir", dir, e))?;
    for entry in entries {
        let path = entry
            .map_err(|e| StoreError::io("read dir", dir, e))?
            .path();
        let generation = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix("log."))
            .and_then(|digits| digits.parse::<u64>().ok());
        if let Some(generation) = generation {
            logs.push((generation, path));
        }
    }
    logs.sort();
    Ok(logs)
}

pub(super) fn is_read_only(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(libc::EROFS)
}

/// Opens a log for appending, creating it (and making its name durable).
pub(super) fn open_log(dir: &Path, generation: u64) -> Result<File, StoreError> {
    let path = log_path(dir, generation);
    let existed = path.exists();
    let file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .map_err(|e| StoreError::io("open", &path, e))?;
    if !existed {
        // A new file's directory entry must survive a crash like its records.
        crate::mapped_file::sync_dir(dir)?;
    }
    Ok(file)
}

/// What one position of a log holds.
#[derive(Debug, PartialEq)]
enum Framed {
    Record(LogRecord, usize),
    /// The log ends here: nothing, or a record cut short or damaged.
    End,
}

fn parse_frame(bytes: &[u8]) -> Framed {
    let Some(header) = bytes.get(..8) else {
        return Framed::End;
    };
    let len = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(header[4..8].try_into().unwrap_or_default());
    let Some(payload) = bytes.get(8..8 + len) else {
        return Framed::End;
    };
    if len == 0 || crc32fast::hash(payload) != crc {
        return Framed::End;
    }
    match serde_json::from_slice(payload) {
        Ok(record) => Framed::Record(record, 8 + len),
        Err(_) => Framed::End,
    }
}

/// The whole records of a log; a torn or damaged tail is cut off the file.
pub(super) fn read_log(path: &Path) -> Result<Vec<LogRecord>, StoreError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut file| file.read_to_end(&mut bytes))
        .map_err(|e| StoreError::io("read", path, e))?;
    let mut records = Vec::new();
    let mut at = 0;
    while let Framed::Record(record, len) = parse_frame(&bytes[at..]) {
        records.push(record);
        at += len;
    }
    if at < bytes.len() {
        tracing::warn!(path = %path.display(), kept = at, dropped = bytes.len() - at, "pop log tail torn: cut off");
        let cut = OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|file| file.set_len(at as u64).and_then(|()| file.sync_all()));
        match cut {
            // Read-only: nothing is appended after the torn tail, so it needs no cutting.
            Err(e) if is_read_only(&e) => {}
            cut => cut.map_err(|e| StoreError::io("truncate", path, e))?,
        }
    }
    Ok(records)
}
