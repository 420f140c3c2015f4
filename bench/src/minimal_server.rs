//! The simplest group-commit server this machine can run: the bound that its scheduler, its
//! loopback and its disk put on any broker's sync group commit, measured beside Quiver's.
//!
//! A thread per connection reads a fixed-size request, `pwrite`s it into blocks written before
//! (as Quiver's fill thread prepares them), and answers 8 bytes once an `fdatasync` covers it.
//! One flusher thread gathers writers as Quiver's does: once one waits, it waits up to the last
//! flush's duration for as many as the last flush served. No protocol, no parsing, no index:
//! what is left is the round trip, the wake-ups and the disk.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::measure::Rate;

/// Bytes of the file region the requests cycle through (written and synced beforehand).
const REGION_BYTES: u64 = 16 << 20;
/// The longest a gathering flusher waits for stragglers, as in Quiver's store.
const MAX_GATHER: Duration = Duration::from_millis(2);
const ANSWER: [u8; 8] = *b"stored\r\n";

struct Log {
    file: std::fs::File,
    /// Bytes appended so far (the file offset wraps within `REGION_BYTES`).
    end: AtomicU64,
    state: Mutex<FlushState>,
    /// Wakes the flusher: the first writer of a round, or the one that completes it.
    work: Condvar,
    /// Wakes the writers: a flush finished.
    flushed_cv: Condvar,
}

struct FlushState {
    flushed: u64,
    arrivals: u64,
    target: u64,
    stopping: bool,
    failed: Option<String>,
}

/// Runs `clients` connections, each with one `request_bytes` request in flight, for
/// `duration` against a fresh file under `dir`; returns the requests answered.
pub fn group_commit(
    dir: &Path,
    request_bytes: usize,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Rate> {
    let path = dir.join("ceiling-minimal-server");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    let outcome = run(file, request_bytes, clients, duration);
    std::fs::remove_file(&path)?;
    outcome
}

fn run(
    file: std::fs::File,
    request_bytes: usize,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Rate> {
    let zeros = vec![0u8; 1 << 20];
    for chunk in 0..REGION_BYTES / zeros.len() as u64 {
        file.write_all_at(&zeros, chunk * zeros.len() as u64)?;
    }
    file.sync_all()?;
    let log = Arc::new(Log {
        file,
        end: AtomicU64::new(0),
        state: Mutex::new(FlushState {
            flushed: 0,
            arrivals: 0,
            target: 1,
            stopping: false,
            failed: None,
        }),
        work: Condvar::new(),
        flushed_cv: Condvar::new(),
    });
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let flusher = {
        let log = log.clone();
        std::thread::Builder::new()
            .name("minimal-flusher".into())
            .spawn(move || flush_loop(&log))?
    };
    let acceptor = {
        let log = log.clone();
        std::thread::Builder::new()
            .name("minimal-accept".into())
            .spawn(move || accept_loop(&listener, &log, request_bytes, clients))?
    };
    let driven = drive(addr, request_bytes, clients, duration);
    // A load that failed before opening all its connections leaves the acceptor waiting:
    // connections that close at once release it (refused once it has stopped listening).
    if driven.is_err() {
        for _ in 0..clients {
            let _ = TcpStream::connect(addr);
        }
    }
    {
        let mut state = log.state.lock().expect("flush state");
        state.stopping = true;
        log.work.notify_all();
        log.flushed_cv.notify_all();
    }
    let _ = flusher.join();
    let _ = acceptor.join();
    if let Some(error) = log.state.lock().expect("flush state").failed.take() {
        anyhow::bail!("minimal server's fdatasync failed: {error}");
    }
    driven
}

/// The load: one thread, one task per connection, one request in flight each.
fn drive(
    addr: SocketAddr,
    request_bytes: usize,
    clients: usize,
    duration: Duration,
) -> anyhow::Result<Rate> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut streams = Vec::with_capacity(clients);
        for _ in 0..clients {
            let stream = tokio::net::TcpStream::connect(addr).await?;
            stream.set_nodelay(true)?;
            streams.push(stream);
        }
        let started = Instant::now();
        let stop_at = started + duration;
        let mut tasks = tokio::task::JoinSet::new();
        for mut stream in streams {
            tasks.spawn(async move {
                let request = vec![7u8; request_bytes];
                let mut answer = [0u8; ANSWER.len()];
                let mut answered = 0u64;
                while Instant::now() < stop_at {
                    stream.write_all(&request).await?;
                    stream.read_exact(&mut answer).await?;
                    answered += 1;
                }
                anyhow::Ok(answered)
            });
        }
        let mut ops = 0;
        while let Some(joined) = tasks.join_next().await {
            ops += joined.context("minimal server client panicked")??;
        }
        let elapsed = started.elapsed();
        Ok(Rate {
            ops,
            bytes: ops * request_bytes as u64,
            elapsed,
        })
    })
}

fn accept_loop(listener: &TcpListener, log: &Arc<Log>, request_bytes: usize, clients: usize) {
    let mut servers = Vec::with_capacity(clients);
    for _ in 0..clients {
        let Ok((stream, _)) = listener.accept() else {
            break;
        };
        let log = log.clone();
        servers.push(std::thread::spawn(move || {
            serve(stream, &log, request_bytes)
        }));
    }
    for server in servers {
        let _ = server.join();
    }
}

fn serve(mut stream: TcpStream, log: &Log, request_bytes: usize) {
    let _ = stream.set_nodelay(true);
    let mut request = vec![0u8; request_bytes];
    while stream.read_exact(&mut request).is_ok() {
        let at = log.end.fetch_add(request_bytes as u64, Ordering::SeqCst);
        if log
            .file
            .write_all_at(&request, at % (REGION_BYTES - request_bytes as u64))
            .is_err()
        {
            return;
        }
        let end = at + request_bytes as u64;
        let mut state = log.state.lock().expect("flush state");
        state.arrivals += 1;
        if state.arrivals == 1 || state.arrivals >= state.target {
            log.work.notify_one();
        }
        while state.flushed < end && !state.stopping && state.failed.is_none() {
            state = log.flushed_cv.wait(state).expect("flush state");
        }
        if state.flushed < end {
            return;
        }
        drop(state);
        if stream.write_all(&ANSWER).is_err() {
            return;
        }
    }
}

fn flush_loop(log: &Log) {
    let mut gather = Duration::ZERO;
    loop {
        let mut state = log.state.lock().expect("flush state");
        while state.arrivals == 0 && !state.stopping {
            state = log.work.wait(state).expect("flush state");
        }
        if state.stopping {
            return;
        }
        let gathered_by = Instant::now() + gather;
        while state.arrivals < state.target && !state.stopping {
            let now = Instant::now();
            if now >= gathered_by {
                break;
            }
            state = log
                .work
                .wait_timeout(state, gathered_by - now)
                .expect("flush state")
                .0;
        }
        let served = std::mem::take(&mut state.arrivals);
        drop(state);
        let end = log.end.load(Ordering::SeqCst);
        let started = Instant::now();
        let synced = log.file.sync_data();
        gather = started.elapsed().min(MAX_GATHER);
        let mut state = log.state.lock().expect("flush state");
        match synced {
            Ok(()) => state.flushed = end,
            Err(error) => state.failed = Some(error.to_string()),
        }
        state.target = served.max(1);
        log.flushed_cv.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_requests_and_removes_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let rate = group_commit(dir.path(), 1194, 4, Duration::from_millis(200)).unwrap();
        assert!(rate.ops > 0, "no request was answered");
        assert_eq!(rate.bytes, rate.ops * 1194);
        // The scratch file is gone afterwards.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
