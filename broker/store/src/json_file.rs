//! Small JSON files written atomically, with the previous version kept as `.bak`.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::StoreError;
use crate::mapped_file::sync_dir;

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// The backup kept beside `path`.
pub fn backup_path(path: &Path) -> PathBuf {
    with_suffix(path, ".bak")
}

/// Writes `value` to `path`: temp file, fsync, previous file renamed to `.bak`, rename,
/// fsync of the directory. A crash leaves either the old or the new file (or `.bak`).
pub fn write_json_atomically(path: &Path, value: &impl Serialize) -> Result<(), StoreError> {
    let dir = parent_dir(path);
    std::fs::create_dir_all(dir).map_err(|e| StoreError::io("create directory", dir, e))?;
    write_json_into_existing_dir(path, value)
}

/// As [`write_json_atomically`], into a directory that must exist: a file of a data directory
/// deleted under a running store fails to write (its temp file cannot be created) instead of
/// bringing the directory back.
pub(crate) fn write_json_into_existing_dir(
    path: &Path,
    value: &impl Serialize,
) -> Result<(), StoreError> {
    let bytes = serde_json::to_vec_pretty(value).map_err(|e| StoreError::Json {
        path: path.to_path_buf(),
        source: e,
    })?;
    write_atomically(path, &bytes)
}

fn parent_dir(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Serialises atomic writes in this process: two writers of one file would share its temp
/// file and interleave their renames.
static ATOMIC_WRITES: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let _one_at_a_time = ATOMIC_WRITES.lock();
    let dir = parent_dir(path);
    let tmp = with_suffix(path, ".tmp");
    if let Err(error) = write_synced(&tmp, bytes) {
        // A full disk: the old file stays as it was, and the partial copy frees its blocks.
        let _ = std::fs::remove_file(&tmp);
        return Err(error);
    }
    if path.exists() {
        let bak = backup_path(path);
        std::fs::rename(path, &bak).map_err(|e| StoreError::io("rename to backup", path, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| StoreError::io("rename", &tmp, e))?;
    // The renames are directory entries: fsync the directory so they survive a crash.
    sync_dir(dir)
}

/// Creates (or truncates) `path` with `bytes` and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .map_err(|e| StoreError::io("create", path, e))?;
    file.write_all(bytes)
        .map_err(|e| StoreError::io("write", path, e))?;
    // The content must be on disk before the rename makes it the current version.
    file.sync_all()
        .map_err(|e| StoreError::io("fsync", path, e))
}

/// Reads `path`, falling back to `.bak` when the main file is missing or unparsable.
/// `Ok(None)` when neither exists.
pub fn read_json_with_backup<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, StoreError> {
    read_with_backup(path, |bytes| serde_json::from_slice(bytes))
}

pub(crate) fn read_with_backup<T>(
    path: &Path,
    parse: impl Fn(&[u8]) -> Result<T, serde_json::Error>,
) -> Result<Option<T>, StoreError> {
    let read = |p: &Path| -> Result<Option<Vec<u8>>, StoreError> {
        match std::fs::read(p) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(StoreError::io("read", p, e)),
        }
    };
    let main_error = match read(path)? {
        Some(bytes) => match parse(&bytes) {
            Ok(value) => return Ok(Some(value)),
            Err(e) => Some(StoreError::Json {
                path: path.to_path_buf(),
                source: e,
            }),
        },
        None => None,
    };
    let bak = backup_path(path);
    match read(&bak)? {
        Some(bytes) => {
            let value = parse(&bytes).map_err(|e| StoreError::Json {
                path: bak.clone(),
                source: e,
            })?;
            match &main_error {
                Some(error) => tracing::warn!(
                    path = %path.display(), error = %crate::error::chain(error),
                    "main file is corrupt, loaded the backup"
                ),
                None => {
                    tracing::warn!(path = %path.display(), "main file is missing, loaded the backup")
                }
            }
            Ok(Some(value))
        }
        None => main_error.map_or(Ok(None), Err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_keeps_backup_and_read_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config").join("topics.json");
        assert_eq!(read_json_with_backup::<Vec<u32>>(&path).unwrap(), None);
        write_json_atomically(&path, &vec![1u32]).unwrap();
        write_json_atomically(&path, &vec![2u32]).unwrap();
        assert_eq!(
            read_json_with_backup::<Vec<u32>>(&path).unwrap(),
            Some(vec![2])
        );
        std::fs::write(&path, b"{ not json").unwrap();
        assert_eq!(
            read_json_with_backup::<Vec<u32>>(&path).unwrap(),
            Some(vec![1])
        );
        std::fs::remove_file(backup_path(&path)).unwrap();
        assert!(matches!(
            read_json_with_backup::<Vec<u32>>(&path),
            Err(StoreError::Json { .. })
        ));
    }

    #[test]
    fn concurrent_writers_of_one_file_all_succeed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topics.json");
        std::thread::scope(|scope| {
            for writer in 0..4u32 {
                let path = &path;
                scope.spawn(move || {
                    for round in 0..10u32 {
                        write_json_atomically(path, &vec![writer, round]).unwrap();
                    }
                });
            }
        });
        let last: Vec<u32> = read_json_with_backup(&path).unwrap().unwrap();
        assert_eq!(
            last[1], 9,
            "some writer's last round is the current version"
        );
    }
}
