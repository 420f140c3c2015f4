//! What a client connection costs the broker: anonymous memory per idle connection, and per
//! connection that declared a large frame and sent only its first bytes (issue 24's targets).

use std::io::Write as _;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::peers::server::{free_port, ServerProcess};
use crate::peers::systems::quiver_broker_binary;

/// The target: an idle connection costs at most this.
const IDLE_TARGET_KIB: f64 = 16.0;

#[derive(clap::Args)]
pub struct Options {
    /// Idle connections opened (each sends nothing).
    #[arg(long, default_value_t = 10_000)]
    idle: usize,
    /// Connections that each declare a 4 MiB frame and send 10 bytes of it.
    #[arg(long, default_value_t = 1_000)]
    half_sent: usize,
    /// The quiver-broker binary (default: next to this one).
    #[arg(long)]
    quiver_broker: Option<PathBuf>,
    /// Where the broker's data and log go (a temp dir under it).
    #[arg(long)]
    dir: Option<PathBuf>,
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    let limit = rlimit::increase_nofile_limit(u64::MAX)?;
    let wanted = (options.idle + options.half_sent) as u64 + 256;
    anyhow::ensure!(
        limit >= wanted,
        "needs {wanted} open files; the hard limit is {limit}"
    );
    let scratch = tempfile::Builder::new()
        .prefix("quiver-bench-connections-")
        .tempdir_in(options.dir.clone().unwrap_or_else(std::env::temp_dir))?;
    let binary = quiver_broker_binary(options.quiver_broker.as_deref())?;
    // A fresh broker for each: memory freed by the first is kept by the allocator for reuse.
    let broker = start(&binary, &scratch.path().join("idle"), options.idle)?;
    let idle = measure(&broker, "idle", options.idle, Ok)?;
    drop(broker);
    let broker = start(
        &binary,
        &scratch.path().join("half-sent"),
        options.half_sent,
    )?;
    let half = measure(
        &broker,
        "half-sent 4 MiB frame",
        options.half_sent,
        |mut stream| {
            let mut start = (4u32 << 20).to_be_bytes().to_vec();
            start.extend_from_slice(b"\0\0\0\x10{\"co");
            stream.write_all(&start)?;
            Ok(stream)
        },
    )?;
    println!("| connections | count | anonymous KiB each | target | ratio to target |");
    println!("|---|---:|---:|---|---:|");
    println!(
        "| idle | {} | {:.1} | <= {IDLE_TARGET_KIB} KiB | {:.2}x |",
        options.idle,
        idle,
        idle / IDLE_TARGET_KIB
    );
    println!(
        "| half-sent frame (declared 4 MiB, 10 B sent) | {} | {half:.1} | held bytes within the in-flight budget (was the whole declared frame) | - |",
        options.half_sent
    );
    drop(broker);
    Ok(())
}

struct Broker {
    process: ServerProcess,
    addr: SocketAddr,
}

fn start(binary: &Path, dir: &Path, connections: usize) -> anyhow::Result<Broker> {
    std::fs::create_dir_all(dir)?;
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let http = format!("127.0.0.1:{}", free_port()?);
    let room = (connections + 100).to_string();
    let args: Vec<String> = [
        "--data-dir",
        &dir.join("data").display().to_string(),
        "--listen",
        &addr.to_string(),
        "--http-listen",
        &http,
        "--grpc-listen",
        "off",
        "--max-connections",
        &room,
        "--max-connections-per-address",
        &room,
    ]
    .map(str::to_owned)
    .to_vec();
    let mut process = ServerProcess::spawn("quiver", binary, &args, dir, &[("RUST_LOG", "warn")])?;
    process.wait_listening(addr, Duration::from_secs(30))?;
    Ok(Broker { process, addr })
}

/// Anonymous KiB the broker gains per connection opened with `open` (kept open while read).
fn measure(
    broker: &Broker,
    what: &str,
    count: usize,
    open: impl Fn(TcpStream) -> std::io::Result<TcpStream>,
) -> anyhow::Result<f64> {
    let anon = || {
        broker
            .process
            .anon_rss_bytes()
            .context("reading the broker's RssAnon")
    };
    std::thread::sleep(Duration::from_secs(1));
    let before = anon()?;
    let started = Instant::now();
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        let stream = TcpStream::connect_timeout(&broker.addr, Duration::from_secs(10))?;
        held.push(open(stream)?);
    }
    // Until the broker has accepted and read them all: its memory stops growing.
    let mut last = anon()?;
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = anon()?;
        if now <= last + 64 * 1024 || started.elapsed() > Duration::from_secs(60) {
            last = now;
            break;
        }
        last = now;
    }
    eprintln!(
        "{count} {what} connections opened in {:?}",
        started.elapsed()
    );
    let per_connection = last.saturating_sub(before) as f64 / 1024.0 / count as f64;
    drop(held);
    Ok(per_connection)
}
