//! A full disk, on real small file systems: a tmpfs each test mounts (root only; CI runs as
//! root). Writes are refused with a reason before any byte reaches an unbacked page (which
//! would be a SIGBUS), reads keep working, a store opens on the full disk, and writes resume
//! by themselves once there is room.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{config, message};
use quiver_store::{
    FlushMode, GetStatus, MessageStore, PutResult, QueueOffset, RefusalReason, StoreConfig,
    StoreError,
};

/// A tmpfs of a known size, unmounted on drop.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size_mib: u64) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mib}m"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(
            mounted.success(),
            "mounting a {size_mib} MiB tmpfs failed: these tests need root (CI runs as root)"
        );
        Tmpfs { dir }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    fn resize(&self, size_mib: u64) {
        self.remount(&format!("remount,size={size_mib}m"));
    }

    fn remount(&self, options: &str) {
        let remounted = Command::new("mount")
            .args(["-o", options])
            .arg(self.dir.path())
            .status()
            .expect("run mount");
        assert!(remounted.success(), "mount -o {options} failed");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

const TOPIC: &str = "FullDisk";
const BODY: [u8; 1000] = [7; 1000];
const QUEUES: u32 = 4;

/// 1 MiB segments; the high-water mark at `high_water`, retention never deleting.
fn small_disk_config(dir: &Path, mode: FlushMode, high_water: f64) -> StoreConfig {
    StoreConfig {
        segment_size_bytes: 1024 * 1024,
        flush_mode: mode,
        disk_high_water_ratio: high_water,
        disk_check_interval_ms: 20,
        ..config(dir)
    }
}

/// Puts 1 KB messages until one is refused; every acknowledged one (with its queue) and the
/// refusal.
fn fill(store: &MessageStore) -> (Vec<(u32, PutResult)>, StoreError) {
    let mut acked = Vec::new();
    for n in 0..200_000u32 {
        let queue_id = n % QUEUES;
        match store.put(&message(TOPIC, queue_id, &BODY, ""), 1) {
            Ok(put) => acked.push((queue_id, put)),
            Err(error) => return (acked, error),
        }
    }
    panic!("200,000 messages fit on a small disk");
}

fn refusal_reason(error: &StoreError) -> RefusalReason {
    match error {
        StoreError::WritesRefused(refusal) => refusal.reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Every acknowledged message is indexed where its put said and reads back whole; nothing
/// else was stored.
fn assert_all_readable(store: &MessageStore, acked: &[(u32, PutResult)]) {
    for (queue_id, put) in acked {
        let indexed = store.physical_offset_at(TOPIC, *queue_id, put.queue_offset);
        assert_eq!(indexed, Some(put.physical_offset), "{put:?}");
        let record = store.read_record(put.physical_offset).unwrap();
        assert_eq!(&record.body[..], &BODY[..]);
    }
    let stored: u64 = (0..QUEUES).map(|q| store.max_offset(TOPIC, q).0).sum();
    assert_eq!(
        stored,
        acked.len() as u64,
        "every acknowledged message, no more"
    );
    let first = store
        .get(TOPIC, 0, QueueOffset(0), 16, u64::MAX, &|_| true)
        .unwrap();
    assert_eq!(first.status, GetStatus::Found);
}

/// Waits until a put to queue 0 goes through again: the watcher's next reading (every
/// 20 ms) reopens the gate. The 60 s bound only turns a gate that never reopens into a
/// failure instead of a hang; no machine is that slow.
fn wait_writable(store: &MessageStore) -> (u32, PutResult) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match store.put(&message(TOPIC, 0, &BODY, ""), 1) {
            Ok(put) => return (0, put),
            Err(error) if Instant::now() < deadline => {
                refusal_reason(&error);
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(error) => panic!("still refused 60 s after space was added: {error}"),
        }
    }
}

fn enospc_is_refused_then_writes_resume(mode: FlushMode) {
    let disk = Tmpfs::mount(6);
    let store = MessageStore::open(small_disk_config(&disk.path(), mode, 1.0)).unwrap();
    let (acked, refused) = fill(&store);
    assert_eq!(refusal_reason(&refused), RefusalReason::NoSpace);
    assert!(acked.len() > 1000, "only {} fit", acked.len());
    // The gate is closed: the next put is refused before anything is written, and counted.
    let again = store.put(&message(TOPIC, 1, &BODY, ""), 1).unwrap_err();
    assert_eq!(refusal_reason(&again), RefusalReason::NoSpace);
    let status = store.disk_status();
    let text = status.refusal.expect("refusing").message;
    assert!(
        text.contains("no space left") && text.contains(&disk.path().display().to_string()),
        "{text}"
    );
    let refused: u64 = store.write_refusals().iter().map(|(_, n)| n).sum();
    assert!(refused >= 2, "{refused} refusals counted");
    assert_all_readable(&store, &acked);
    disk.resize(12);
    let resumed = wait_writable(&store);
    assert_eq!(store.disk_status().refusal, None);
    let mut all = acked;
    all.push(resumed);
    assert_all_readable(&store, &all);
    store.shutdown().unwrap();
}

#[test]
fn async_writes_on_a_full_disk_are_refused_then_resume() {
    enospc_is_refused_then_writes_resume(FlushMode::Async);
}

#[test]
fn sync_writes_on_a_full_disk_are_refused_then_resume() {
    enospc_is_refused_then_writes_resume(FlushMode::Sync);
}

/// Fills an 8 MiB disk with the mark at 50%, the watcher reading it every
/// `disk_check_interval_ms`: the fill is refused for the mark, before the disk fills, however
/// fast the fill and however late the watcher (the writer reads the disk itself each time it
/// creates a file); the store and its refusal; every acknowledged message is readable.
fn fill_to_the_high_water_mark(disk: &Tmpfs, disk_check_interval_ms: u64) -> MessageStore {
    let config = StoreConfig {
        disk_check_interval_ms,
        ..small_disk_config(&disk.path(), FlushMode::Async, 0.5)
    };
    let store = MessageStore::open(config).unwrap();
    let (acked, refused) = fill(&store);
    assert_eq!(refusal_reason(&refused), RefusalReason::DiskHighWater);
    let status = store.disk_status();
    assert!(
        status.used_ratio > 0.5 && status.used_ratio < 0.9,
        "{status:?}"
    );
    let text = status.refusal.unwrap().message;
    assert!(text.contains("high-water mark of 50.0%"), "{text}");
    assert_all_readable(&store, &acked);
    store
}

#[test]
fn above_the_high_water_mark_writes_are_refused_before_the_disk_fills() {
    let disk = Tmpfs::mount(8);
    let store = fill_to_the_high_water_mark(&disk, 20);
    disk.resize(32);
    wait_writable(&store);
    store.shutdown().unwrap();
}

/// The watcher reads the disk once, at open, while it is empty: the refusal is the writer's
/// own, so it does not depend on when the watcher would have looked.
#[test]
fn above_the_high_water_mark_the_writer_refuses_without_the_watcher() {
    let disk = Tmpfs::mount(8);
    let store = fill_to_the_high_water_mark(&disk, 3_600_000);
    store.shutdown().unwrap();
}

#[test]
fn a_store_opens_on_a_full_disk_refusing_writes_and_serving_reads() {
    let disk = Tmpfs::mount(6);
    let config = small_disk_config(&disk.path(), FlushMode::Async, 1.0);
    let store = MessageStore::open(config.clone()).unwrap();
    let (acked, _) = fill(&store);
    // No shutdown: the next open recovers as after a crash, on a disk with no room.
    drop(store);
    let started = Instant::now();
    let store = MessageStore::open(config.clone()).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    let refusal = store.disk_status().refusal.expect("opened refusing writes");
    assert_eq!(
        refusal.reason,
        RefusalReason::NoSpace,
        "{}",
        refusal.message
    );
    let refused = store.put(&message(TOPIC, 0, &BODY, ""), 1).unwrap_err();
    assert_eq!(refusal_reason(&refused), RefusalReason::NoSpace);
    assert_all_readable(&store, &acked);
    store.shutdown().unwrap();
    drop(store);
    // A clean stop on the full disk opens the same way, then takes writes once there is room.
    let store = MessageStore::open(config).unwrap();
    assert!(store.disk_status().refusal.is_some());
    disk.resize(12);
    let resumed = wait_writable(&store);
    let mut all = acked;
    all.push(resumed);
    assert_all_readable(&store, &all);
}

#[test]
fn an_atomic_json_write_on_a_full_disk_fails_and_keeps_the_old_file() {
    let disk = Tmpfs::mount(1);
    let dir = disk.path();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    quiver_store::write_json_atomically(&path, &vec![1u32; 10]).unwrap();
    // Take the rest of the space.
    let filler = dir.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 2 << 20]);
    let big = vec![123_456_789u32; 100_000];
    let error = quiver_store::write_json_atomically(&path, &big).unwrap_err();
    assert!(error.to_string().contains("state.json"), "{error}");
    let kept: Vec<u32> = quiver_store::read_json_with_backup(&path).unwrap().unwrap();
    assert_eq!(kept, vec![1u32; 10]);
    assert!(
        !dir.join("state.json.tmp").exists(),
        "the partial copy is removed"
    );
}

#[test]
fn a_store_opens_on_a_read_only_file_system_serving_reads() {
    let disk = Tmpfs::mount(8);
    let config = small_disk_config(&disk.path(), FlushMode::Async, 1.0);
    let store = MessageStore::open(config.clone()).unwrap();
    let acked: Vec<_> = (0..500u32)
        .map(|n| {
            let queue_id = n % QUEUES;
            let put = store.put(&message(TOPIC, queue_id, &BODY, ""), 1).unwrap();
            (queue_id, put)
        })
        .collect();
    store.shutdown().unwrap();
    drop(store);
    disk.remount("remount,ro");
    let store = MessageStore::open(config.clone()).unwrap();
    let refusal = store.disk_status().refusal.expect("opened refusing writes");
    assert_eq!(refusal.reason, RefusalReason::ReadOnlyFs);
    assert!(refusal.message.contains("read-only"), "{}", refusal.message);
    let refused = store.put(&message(TOPIC, 0, &BODY, ""), 1).unwrap_err();
    assert_eq!(refusal_reason(&refused), RefusalReason::ReadOnlyFs);
    assert_all_readable(&store, &acked);
    // Writable again: this store stays read-only (its files are mapped so) until reopened.
    disk.remount("remount,rw");
    std::thread::sleep(Duration::from_millis(100));
    assert!(store.disk_status().refusal.is_some());
    store.shutdown().unwrap();
    drop(store);
    let store = MessageStore::open(config).unwrap();
    let resumed = wait_writable(&store);
    let mut all = acked;
    all.push(resumed);
    assert_all_readable(&store, &all);
}
