//! `quiver-bench`: benchmarks that print figures (never pass/fail).
//!
//! `cargo run --release -p quiver-bench -- store [--seconds S] [--dir DIR] [--smoke]`
//! `cargo run --release -p quiver-bench -- peers [--systems quiver,nats,redis,rocketmq-rust]
//!     [--messages N] [--sizes 1024,128,16384] [--smoke] [--write-benchmarks-md]
//! `cargo run --release -p quiver-bench -- connections [--idle N] [--half-sent N]``
//! `cargo run --release -p quiver-bench -- replication [--rounds 20] [--lag-rate 50000] [--smoke]`

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod ceilings;
mod connections;
mod http;
mod measure;
mod minimal_server;
mod peers;
mod replication;
mod store;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "quiver-bench",
    about = "Quiver benchmarks: figures, not pass/fail"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The storage engine: append (async, sync, 16 sync writers), dispatch and sequential
    /// read for 128 B, 1 KiB and 16 KiB bodies, each beside the machine's own ceilings.
    Store(store::Options),
    /// Quiver beside NATS JetStream, Redis Streams and rocketmq-rust: each installed if
    /// missing, started on 127.0.0.1 with persistence on, driven by the same workloads.
    Peers(peers::Options),
    /// What a client connection costs the broker: anonymous memory per idle connection and
    /// per half-sent large frame, beside the targets.
    Connections(connections::Options),
    /// Replicated broker groups (3 local members, sync replication): batch produce beside a
    /// single broker, failover after kill -9 of the master, replication lag at a steady rate.
    Replication(replication::Options),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Store(options) => {
            let parent = options.dir.clone().unwrap_or_else(|| PathBuf::from("."));
            // Scratch files live under a temp dir that is removed when it drops.
            let scratch = tempfile::Builder::new()
                .prefix("quiver-bench-")
                .tempdir_in(&parent)?;
            store::run(&options, scratch.path())?;
        }
        Command::Peers(options) => peers::run(&options)?,
        Command::Connections(options) => connections::run(&options)?,
        Command::Replication(options) => replication::run(&options)?,
    }
    Ok(())
}
