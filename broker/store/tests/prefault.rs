//! Prefaulting: a background thread has the kernel allocate the CommitLog's page-cache pages
//! a window ahead of the writer; it never changes what the log holds or what recovery finds.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{body, message};
use quiver_store::{MessageStore, StoreConfig};

const TOPIC: &str = "PrefaultTopic";
const SEGMENT_BYTES: u64 = 64 * 1024 * 1024;
const WINDOW_BYTES: u64 = 16 * 1024 * 1024;
/// Pages this far past the writer lie beyond the kernel's own read-around of a faulting
/// write (half of `read_ahead_kb`, at most 4 MiB with the 8 MiB here), so only prefaulting
/// makes them resident.
const BEYOND_READAHEAD: u64 = 12 * 1024 * 1024;
const PAGE_BYTES: u64 = 4096;

fn store_config(dir: &Path, prefault_window_bytes: u64) -> StoreConfig {
    StoreConfig {
        segment_size_bytes: SEGMENT_BYTES,
        prefault_window_bytes,
        ..common::config(dir)
    }
}

/// Which 4 KiB pages of `path` in `[from, to)` are in the page cache (mincore).
fn resident_pages(path: &Path, from: u64, to: u64) -> Vec<bool> {
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only view of a test file; only its residency is asked for.
    let map = unsafe { memmap2::Mmap::map(&file).unwrap() };
    let pages = ((to - from) / PAGE_BYTES) as usize;
    let mut residency = vec![0u8; pages];
    // SAFETY: `from` is page aligned and the range lies inside the mapping.
    let rc = unsafe {
        libc::mincore(
            map.as_ptr().add(from as usize) as *mut libc::c_void,
            (to - from) as usize,
            residency.as_mut_ptr(),
        )
    };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    residency.iter().map(|r| r & 1 == 1).collect()
}

/// The first page boundary past the last record written.
fn page_after(store: &MessageStore) -> u64 {
    store.stats().max_physical_offset.0.div_ceil(PAGE_BYTES) * PAGE_BYTES
}

#[test]
fn pages_ahead_of_the_writer_are_populated_and_the_log_is_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(store_config(dir.path(), WINDOW_BYTES)).unwrap();
    let mut bodies = Vec::new();
    for n in 0..200u64 {
        bodies.push(body(n));
        store
            .put(&message(TOPIC, 0, &bodies[n as usize], ""), n as i64)
            .unwrap();
    }
    let segment = common::segment_path(dir.path(), 0);
    let from = page_after(&store) + BEYOND_READAHEAD;
    let to = from + WINDOW_BYTES / 4;
    // The thread runs in the background: wait (bounded) for it to get there.
    let deadline = Instant::now() + Duration::from_secs(10);
    while resident_pages(&segment, from, to).contains(&false) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let residency = resident_pages(&segment, from, to);
    assert!(
        residency.iter().all(|r| *r),
        "{} of {} pages ahead of the writer not populated",
        residency.iter().filter(|r| !**r).count(),
        residency.len()
    );
    // Populating never wrote anything: the log still ends where the writer stopped.
    let end = store.stats().max_physical_offset.0;
    store.shutdown().unwrap();
    drop(store);
    let bytes = std::fs::read(&segment).unwrap();
    assert!(bytes[end as usize..].iter().all(|b| *b == 0));
    let store = MessageStore::open(store_config(dir.path(), WINDOW_BYTES)).unwrap();
    assert_eq!(store.stats().max_physical_offset.0, end);
    for (n, expected) in bodies.iter().enumerate() {
        let got = store
            .get(
                TOPIC,
                0,
                quiver_store::QueueOffset(n as u64),
                1,
                u64::MAX,
                &|_| true,
            )
            .unwrap();
        let (record, _) = quiver_store::record::decode(&got.messages[0]).unwrap();
        assert_eq!(record.body, expected.as_slice());
    }
}

#[test]
fn a_roll_moves_prefaulting_to_the_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    let store = MessageStore::open(store_config(dir.path(), WINDOW_BYTES)).unwrap();
    let big = vec![b'r'; 15 * 1024];
    let mut n = 0i64;
    while store.stats().max_physical_offset.0 < SEGMENT_BYTES {
        store.put(&message(TOPIC, 1, &big, ""), n).unwrap();
        n += 1;
    }
    let second = common::segment_path(dir.path(), SEGMENT_BYTES);
    let from = page_after(&store) - SEGMENT_BYTES + BEYOND_READAHEAD;
    let to = from + WINDOW_BYTES / 4;
    let deadline = Instant::now() + Duration::from_secs(10);
    while resident_pages(&second, from, to).contains(&false) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(resident_pages(&second, from, to).iter().all(|r| *r));
    store.shutdown().unwrap();
}
