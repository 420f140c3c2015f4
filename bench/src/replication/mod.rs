//! `quiver-bench replication`: replicated broker groups (three local members sharing one
//! broker name) against the targets: batch produce with sync replication beside a
//! single broker with async flush, failover after `kill -9` of the master, the handover after
//! SIGTERM of the master (a controlled shutdown), and replication lag at a steady rate.
//! Figures, never pass/fail.

mod failover;
mod group;
mod lag;
mod observe;
mod produce;
mod report;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;

use crate::peers::systems;
use failover::{FailoverPlan, Stop};
use group::GroupSpec;
use lag::LagPlan;
use produce::ProducePlan;

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Messages per produce run (at most --seconds each).
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Seconds one produce run may take at most.
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Producer counts of the produce runs, comma-separated (each its own connection).
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    producers: Vec<u32>,
    /// Messages per batch send of the produce runs.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// Queues per topic.
    #[arg(long, default_value_t = 4)]
    queues: u32,
    /// Kills of the failover run, and SIGTERMs of the shutdown run.
    #[arg(long, default_value_t = 20)]
    rounds: u32,
    /// Rate of the lag run, messages per second.
    #[arg(long, default_value_t = 50_000)]
    lag_rate: u64,
    /// Seconds of the lag run (the first 10% are warm-up, left out).
    #[arg(long, default_value_t = 10.0)]
    lag_seconds: f64,
    /// Messages per batch of the lag run's paced producer (one tick of 1 ms sends what is
    /// due in batches of at most this many).
    #[arg(long, default_value_t = 50)]
    lag_batch: u64,
    /// Producer connections of the lag run; the batches take turns on them.
    #[arg(long, default_value_t = 1)]
    lag_producers: u32,
    /// `--replication` of the group's members (the targets are for sync).
    #[arg(long, default_value = "sync")]
    replication: String,
    /// `--min-in-sync-replicas` of the group's members.
    #[arg(long, default_value_t = 2)]
    min_in_sync_replicas: u32,
    /// One more flag for every group member (repeatable), e.g. `--member-arg=--master-timeout-ms=1000`.
    #[arg(long, allow_hyphen_values = true)]
    member_arg: Vec<String>,
    /// Scenarios to run, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [Scenario::Produce, Scenario::Failover, Scenario::Shutdown, Scenario::Lag])]
    scenarios: Vec<Scenario>,
    /// Threads of the load generator (default 1: a current-thread runtime, as the peers bench).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// The quiver-broker binary; default: next to this binary (same cargo profile).
    #[arg(long)]
    quiver_broker: Option<PathBuf>,
    /// Parent of the temp data dirs (removed afterwards). Default: the system temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the brokers' logs (one file per member start) in this dir.
    #[arg(long)]
    keep_logs: Option<PathBuf>,
    /// A sanity run in seconds (CI): tiny counts, 2 kills; figures are meaningless.
    #[arg(long)]
    smoke: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    Produce,
    Failover,
    /// SIGTERM of the master: its handover to an in-sync replica, round by round.
    Shutdown,
    Lag,
}

/// Every scenario's plan.
#[derive(Clone, Debug)]
pub struct Plans {
    pub produce: ProducePlan,
    pub failover: FailoverPlan,
    pub lag: LagPlan,
}

impl Options {
    fn plans(&self) -> Plans {
        let lag_time = Duration::from_secs_f64(self.lag_seconds);
        let mut plans = Plans {
            produce: ProducePlan {
                messages: self.messages,
                run_time: Duration::from_secs_f64(self.seconds),
                batch: self.batch,
                producers: self.producers.clone(),
                queues: self.queues,
            },
            failover: FailoverPlan {
                rounds: self.rounds,
                ack_bound: Duration::from_secs(30),
                resync_bound: Duration::from_secs(60),
                time_bound: Duration::from_secs(15 * 60),
            },
            lag: LagPlan {
                rate_per_sec: self.lag_rate,
                time: lag_time,
                batch: self.lag_batch,
                warmup: lag_time / 10,
                queues: self.queues,
                producers: self.lag_producers,
            },
        };
        if self.smoke {
            plans.produce.messages = 2_000;
            plans.produce.run_time = Duration::from_secs(1);
            plans.produce.batch = 16;
            plans.failover.rounds = 2;
            plans.failover.time_bound = Duration::from_secs(60);
            plans.lag.rate_per_sec = 2_000;
            plans.lag.time = Duration::from_secs(2);
            plans.lag.warmup = Duration::from_millis(200);
        }
        plans
    }
}

fn log(line: &str) {
    eprintln!("{line}");
}

/// The members' replication settings the options ask for.
fn group_spec(options: &Options) -> anyhow::Result<GroupSpec> {
    let replication: &'static str = match options.replication.as_str() {
        "sync" => "sync",
        "async" => "async",
        other => anyhow::bail!("--replication {other}: sync or async"),
    };
    Ok(GroupSpec {
        replication,
        min_in_sync: options.min_in_sync_replicas,
        extra_args: options.member_arg.clone(),
    })
}

/// The load generator's runtime: one thread, or `threads` workers.
fn client_runtime(threads: usize) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(threads);
        builder
    };
    builder.enable_all().build().context("starting tokio")
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    let plans = options.plans();
    let binary = systems::quiver_broker_binary(options.quiver_broker.as_deref())?;
    let parent = options.dir.clone().unwrap_or_else(std::env::temp_dir);
    let scratch = tempfile::Builder::new()
        .prefix("quiver-bench-replication-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a temp dir in {}", parent.display()))?;
    let log_dir = match &options.keep_logs {
        Some(dir) => dir.clone(),
        None => scratch.path().join("logs"),
    };
    std::fs::create_dir_all(&log_dir)?;
    let spec = group_spec(options)?;
    let runtime = client_runtime(options.client_threads)?;
    let load_before = report::load_average();
    let mut outcomes = report::Outcomes::default();
    for scenario in &options.scenarios {
        let scratch = scratch.path();
        match scenario {
            Scenario::Produce => {
                log("== produce: single broker (async flush) against the group");
                let outcome = runtime.block_on(produce::run(
                    &binary,
                    scratch,
                    &log_dir,
                    &spec,
                    &plans.produce,
                    &log,
                ));
                outcomes.produce = Some(outcome.map_err(|e| report::reason(&e)));
            }
            Scenario::Failover | Scenario::Shutdown => {
                let how = match scenario {
                    Scenario::Shutdown => Stop::Term,
                    _ => Stop::Kill,
                };
                log(&format!(
                    "== {}: {} x {} of the master",
                    format!("{scenario:?}").to_lowercase(),
                    plans.failover.rounds,
                    how.signal()
                ));
                let outcome = runtime.block_on(failover::run(
                    &binary,
                    scratch,
                    &log_dir,
                    &spec,
                    &plans.failover,
                    how,
                    &log,
                ));
                let outcome = Some(outcome.map_err(|e| report::reason(&e)));
                match how {
                    Stop::Kill => outcomes.failover = outcome,
                    Stop::Term => outcomes.shutdown = outcome,
                }
            }
            Scenario::Lag => {
                log(&format!(
                    "== lag: {} msgs/s of 1 KiB for {:?}, consumer on a replica",
                    plans.lag.rate_per_sec, plans.lag.time
                ));
                let outcome = runtime.block_on(lag::run(
                    &binary, scratch, &log_dir, &spec, &plans.lag, &log,
                ));
                outcomes.lag = Some(outcome.map_err(|e| report::reason(&e)));
            }
        }
    }
    let load = format!("{load_before} before, {} after", report::load_average());
    println!("{}", report::render(&plans, &spec, &outcomes, &load));
    if options.smoke {
        println!("(smoke run: figures are meaningless)");
    }
    if options.keep_logs.is_some() {
        log(&format!("broker logs kept in {}", log_dir.display()));
    }
    Ok(())
}
