//! `quiver-broker-bench`: produce and consume 1 KiB messages over loopback against an
//! in-process broker (single and batch sends, 1 and 4 producers), reporting msgs/s, MB/s and
//! end-to-end p50/p99 latency, beside store-only figures of the same run; then a catch-up
//! read of stored messages, unfiltered and through a SQL92 filter matching 10%.
//!
//! `--mode timers` measures timed delivery instead (see `timers.rs`); `--mode grpc` the
//! RocketMQ 5.x gRPC path beside the remoting path (see `grpc.rs`), both against a
//! `quiver-broker` process of their own (`process.rs`).
//!
//! Run: `cargo run --release -p quiver-bench --bin quiver-broker-bench -- --messages 20000`;
//! `--tls` runs the broker with `--tls-mode enforcing` and connects with TLS, `--acl` with an
//! ACL file of one account whose keys sign every request, to compare with a plain run.

#![forbid(unsafe_code)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::sync::Arc;

use anyhow::bail;
use clap::Parser;
use quiver_broker::FlushMode;

mod grpc;
mod harness;
mod process;
mod throughput;
mod timers;

use harness::Security;

/// What to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    /// Produce, consume and catch-up read throughput and latency.
    Throughput,
    /// Timed delivery: RSS with many timers pending, and fire lateness.
    Timers,
    /// The gRPC (5.x) path beside the remoting path: produce, receive+ack, paced latency.
    Grpc,
}

#[derive(Parser, Debug)]
#[command(about = "Network and store benchmark of quiver-broker on loopback")]
struct Args {
    /// Messages per scenario.
    #[arg(long, default_value_t = 20_000)]
    messages: u64,
    /// Body size in bytes.
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages per SEND_BATCH_MESSAGE request.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Flush mode of the broker and the store.
    #[arg(long, default_value_t = FlushMode::Async)]
    flush_mode: FlushMode,
    /// Messages stored for the filtered catch-up read (0 skips it).
    #[arg(long, default_value_t = 100_000)]
    catch_up_messages: u64,
    /// The broker enforces TLS (a certificate made with rcgen) and every connection is TLS.
    #[arg(long)]
    tls: bool,
    /// The broker has ACL on (one account) and every request is signed with it.
    #[arg(long)]
    acl: bool,
    #[arg(long, value_enum, default_value_t = Mode::Throughput)]
    mode: Mode,
    /// Timers mode: timers parked minutes ahead before RSS is read again.
    #[arg(long, default_value_t = 1_000_000)]
    timers: u64,
    /// Timers mode: timers sent (each due 3 s later) per second while lateness is measured.
    #[arg(long, default_value_t = 5_000)]
    fire_rate: u64,
    /// Timers mode: seconds of sending at --fire-rate.
    #[arg(long, default_value_t = 10)]
    fire_secs: u64,
    /// gRPC mode: messages per second of the paced latency scenario.
    #[arg(long, default_value_t = 5_000)]
    paced_rate: u64,
    /// gRPC mode: seconds of the paced latency scenario.
    #[arg(long, default_value_t = 5)]
    paced_secs: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    harness::epoch();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.mode == Mode::Timers {
        println!(
            "quiver-broker-bench timers: {} parked, then {}/s for {} s, bodies of {} B",
            args.timers, args.fire_rate, args.fire_secs, args.size
        );
        return runtime.block_on(timers::run(&args));
    }
    let security = Arc::new(Security::new(&args)?);
    if args.mode == Mode::Grpc {
        if args.tls || args.acl {
            bail!("--mode grpc measures the plain paths: drop --tls and --acl");
        }
        println!(
            "quiver-broker-bench grpc: {} messages of {} B per produce scenario, {} for \
             catch-up, paced {}/s for {} s, flush {:?}",
            args.messages,
            args.size,
            args.catch_up_messages,
            args.paced_rate,
            args.paced_secs,
            args.flush_mode
        );
        return runtime.block_on(grpc::run(&args, &security));
    }
    throughput::run(&args, &security, &runtime)
}
