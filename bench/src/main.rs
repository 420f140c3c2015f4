//! `quiver-bench`: benchmarks that print figures (never pass/fail).
//!
//! `cargo run --release -p quiver-bench -- store [--seconds S] [--dir DIR] [--smoke]`

mod ceilings;
mod measure;
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
    }
    Ok(())
}
