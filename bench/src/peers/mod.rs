//! `quiver-bench peers`: Quiver beside NATS JetStream, Redis Streams and rocketmq-rust, each
//! started in turn on 127.0.0.1 with persistence on and driven by the same workloads.

mod hog;
mod nats;
mod redis;
mod report;
pub mod rocketmq;
pub mod server;
mod stages;
pub mod systems;
mod tail;
pub mod workload;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;

use crate::measure::Bounds;
use report::Outcome;
use systems::Running;
use workload::{end_to_end_name, Beside, Figure, ParkedPullPlan, Plan, System};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SystemKind {
    Quiver,
    Nats,
    Redis,
    #[value(name = "rocketmq-rust")]
    RocketmqRust,
}

impl SystemKind {
    fn name(self) -> &'static str {
        match self {
            SystemKind::Quiver => "quiver",
            SystemKind::Nats => "nats",
            SystemKind::Redis => "redis",
            SystemKind::RocketmqRust => "rocketmq-rust",
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Systems to run, in this order, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',',
          default_values_t = [SystemKind::Quiver, SystemKind::Nats, SystemKind::Redis, SystemKind::RocketmqRust])]
    systems: Vec<SystemKind>,
    /// Messages per produce run (fewer for large bodies: at most 256 MiB per run).
    #[arg(long, default_value_t = 200_000)]
    messages: u64,
    /// Body sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 128, 16384])]
    sizes: Vec<usize>,
    /// Seconds one produce or consume run may take at most.
    #[arg(long, default_value_t = 4.0)]
    seconds: f64,
    /// Producer counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1u32, 4])]
    producers: Vec<u32>,
    /// Messages per batch send.
    #[arg(long, default_value_t = 128)]
    batch: usize,
    /// In-flight single sends per producer.
    #[arg(long, default_value_t = 32)]
    window: usize,
    /// Threads of the load generator, the same for every system. Default 1 (one thread runs
    /// everything): on a 2-core box that leaves a core to the server, and every peer measured
    /// faster so.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Messages asked for per pull / fetch / XRANGE.
    #[arg(long, default_value_t = 256)]
    read_batch: u32,
    /// Queues per topic on the RocketMQ-protocol brokers.
    #[arg(long, default_value_t = 4)]
    queues: u32,
    /// Rate of the fixed-rate end-to-end run, messages per second.
    #[arg(long, default_value_t = 5_000)]
    e2e_rate: u64,
    /// Seconds of the fixed-rate end-to-end run (the first 10% are warm-up, left out).
    #[arg(long, default_value_t = 5.0)]
    e2e_seconds: f64,
    /// Skip the second end-to-end run, the one beside a CPU hog (one nice-19 busy thread per
    /// core: a busy node).
    #[arg(long)]
    no_cpu_hog: bool,
    /// Parked pulls of the wake-latency run (RocketMQ-protocol brokers; at most 10 s).
    #[arg(long, default_value_t = 2_000)]
    parked_pulls: u64,
    /// 1 KiB messages each system holds before its memory is read: batches (at most 60 s) top
    /// up what the produce runs stored. The broker's anonymous RSS is rated against them.
    #[arg(long, default_value_t = 1_000_000)]
    stored_before_memory: u64,
    /// When the RocketMQ-protocol brokers (Quiver, rocketmq-rust) acknowledge a send: once
    /// in the page cache (async) or once flushed (sync, group commit). NATS and Redis keep
    /// their own defaults (JetStream file store; Redis appendfsync everysec).
    #[arg(long, value_enum, default_value_t = systems::Flush::Async)]
    flush: systems::Flush,
    /// The quiver-broker binary; default: next to this binary (same cargo profile).
    #[arg(long)]
    quiver_broker: Option<PathBuf>,
    /// Parent of the temp data dirs (removed afterwards). Default: the system temp dir.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Never install a missing system: it is reported as not available.
    #[arg(long)]
    no_install: bool,
    /// A few-second sanity run (CI): tiny counts, nothing installed; figures are meaningless.
    #[arg(long)]
    smoke: bool,
    /// Replace the generated table in the "## Peers" section of BENCHMARKS.md.
    #[arg(long)]
    write_benchmarks_md: bool,
}

impl Options {
    fn plan(&self) -> Plan {
        if self.smoke {
            return Plan {
                sizes: self.sizes.clone(),
                messages: 200,
                max_bytes_per_run: 1 << 20,
                run_time: Duration::from_secs(2),
                producer_counts: self.producers.clone(),
                batch: 16,
                window: 4,
                e2e_rate_per_sec: 500,
                e2e_body_bytes: 1024,
                e2e_time: Duration::from_millis(400),
                e2e_warmup: Duration::from_millis(40),
                parked_pull: ParkedPullPlan {
                    repeats: 20,
                    ..parked_pull_plan(self.parked_pulls)
                },
                cpu_hog: !self.no_cpu_hog,
                group_commit: false,
                fsync_ceiling: Bounds {
                    duration: Duration::from_millis(300),
                    max_ops: 200,
                    max_bytes: u64::MAX,
                },
                stored_before_memory: 1_000,
                top_up_time: Duration::from_secs(2),
            };
        }
        let e2e_time = Duration::from_secs_f64(self.e2e_seconds);
        Plan {
            sizes: self.sizes.clone(),
            messages: self.messages,
            max_bytes_per_run: 256 << 20,
            run_time: Duration::from_secs_f64(self.seconds),
            producer_counts: self.producers.clone(),
            batch: self.batch,
            window: self.window,
            e2e_rate_per_sec: self.e2e_rate,
            e2e_body_bytes: 1024,
            e2e_time,
            e2e_warmup: e2e_time / 10,
            parked_pull: parked_pull_plan(self.parked_pulls),
            cpu_hog: !self.no_cpu_hog,
            group_commit: false,
            fsync_ceiling: Bounds {
                duration: Duration::from_secs(2),
                max_ops: 2_000,
                max_bytes: u64::MAX,
            },
            stored_before_memory: self.stored_before_memory,
            top_up_time: TOP_UP_TIME,
        }
    }
}

/// Time bound of the top-up to `--stored-before-memory` (rocketmq-rust needs about 10 s).
const TOP_UP_TIME: Duration = Duration::from_secs(60);

/// `repeats` parked pulls of 1 KiB, each long-polling 1 s; the send follows 2 ms after the
/// pull was issued (time for it to reach the broker and be parked); at most 10 s in all.
fn parked_pull_plan(repeats: u64) -> ParkedPullPlan {
    ParkedPullPlan {
        repeats,
        time_bound: Duration::from_secs(10),
        suspend: Duration::from_secs(1),
        park_pause: Duration::from_millis(2),
        body_bytes: 1024,
    }
}

fn log(line: &str) {
    eprintln!("{line}");
}

pub fn run(options: &Options) -> anyhow::Result<()> {
    let plan = options.plan();
    let may_install = !options.no_install && !options.smoke;
    let parent = options.dir.clone().unwrap_or_else(std::env::temp_dir);
    // One client thread means one: a multi-thread runtime with one worker still drives the
    // workload on this thread and hands every task it spawns across to that worker.
    let mut builder = if options.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(options.client_threads);
        builder
    };
    let runtime = builder
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let load_before = load_average();
    let mut outcomes = Vec::new();
    for &kind in &options.systems {
        log(&format!("== {}", kind.name()));
        let scratch = tempfile::Builder::new()
            .prefix(&format!("quiver-bench-{}-", kind.name()))
            .tempdir_in(&parent)
            .with_context(|| format!("creating a temp dir in {}", parent.display()))?;
        let figures = run_system(kind, options, may_install, &plan, scratch.path(), &runtime)
            .map_err(|error| format!("{error:#}").replace('\n', " "));
        if let Err(reason) = &figures {
            log(&format!("  not available: {reason}"));
        }
        outcomes.push(Outcome {
            system: kind.name(),
            figures,
        });
    }
    let table = report::table(&outcomes);
    println!("{table}");
    println!(
        "Targets (issue 7), this run:\n\n{}",
        targets(&plan, &outcomes)
    );
    if options.write_benchmarks_md {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../BENCHMARKS.md");
        let load = format!("{load_before} before, {} after", load_average());
        report::write_section(
            &path,
            options.flush.name(),
            &section(options, &plan, &outcomes, &table, &load),
        )?;
        log(&format!("wrote the Peers table to {}", path.display()));
    }
    Ok(())
}

/// Installs if needed, starts, measures and stops one system.
fn run_system(
    kind: SystemKind,
    options: &Options,
    may_install: bool,
    plan: &Plan,
    scratch: &Path,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<Figure>> {
    let data_dir = scratch.join("data");
    std::fs::create_dir_all(&data_dir)?;
    let running = match kind {
        SystemKind::Quiver => {
            let binary = systems::quiver_broker_binary(options.quiver_broker.as_deref())?;
            systems::start_quiver(&binary, options.flush, &data_dir, scratch)?
        }
        SystemKind::Nats => systems::start_nats(
            &systems::nats_server_binary(may_install)?,
            &data_dir,
            scratch,
        )?,
        SystemKind::Redis => systems::start_redis(
            &systems::redis_server_binary(may_install)?,
            &data_dir,
            scratch,
        )?,
        SystemKind::RocketmqRust => {
            let (namesrv, broker) = systems::rocketmq_rust_binaries(may_install)?;
            systems::start_rocketmq_rust((&namesrv, &broker), options.flush, &data_dir, scratch)?
        }
    };
    let addr = running.addr;
    // Group commit against the fsync ceiling: only where sends wait for the flush.
    let plan = &Plan {
        group_commit: options.flush == systems::Flush::Sync
            && matches!(kind, SystemKind::Quiver | SystemKind::RocketmqRust),
        ..plan.clone()
    };
    let outcome = match kind {
        SystemKind::Quiver | SystemKind::RocketmqRust => {
            let system = rocketmq::RocketMqSystem {
                name_server: addr.to_string(),
                queues_per_topic: options.queues,
                pull_batch: options.read_batch,
            };
            measure(system, plan, &data_dir, &running, runtime)
        }
        SystemKind::Nats => {
            let system = nats::NatsSystem {
                url: format!("nats://{addr}"),
                pull_batch: options.read_batch as usize,
            };
            measure(system, plan, &data_dir, &running, runtime)
        }
        SystemKind::Redis => {
            let system = redis::RedisSystem {
                url: format!("redis://{addr}/"),
                read_batch: options.read_batch as usize,
            };
            measure(system, plan, &data_dir, &running, runtime)
        }
    };
    outcome.map_err(|error| {
        let tail = running.server().log_tail(3);
        error.context(format!("server log tail: {tail}"))
    })
}

fn measure<S: System>(
    system: S,
    plan: &Plan,
    data_dir: &Path,
    running: &Running,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<Vec<Figure>> {
    let system = Arc::new(system);
    let server = running.server();
    runtime.block_on(workload::run_all(
        system,
        plan,
        data_dir,
        || workload::ServerMemory {
            peak_rss_bytes: server.peak_rss_bytes(),
            anon_rss_bytes: server.anon_rss_bytes(),
        },
        running.stages,
        server.pid(),
        log,
    ))
}

/// The 1-minute load average, a measure of how quiet the machine was.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

/// The generated part of BENCHMARKS.md "## Peers": when, where, how, the table, the targets.
fn section(
    options: &Options,
    plan: &Plan,
    outcomes: &[Outcome],
    table: &str,
    load: &str,
) -> String {
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(format!("{:.1} GiB", kib / (1024.0 * 1024.0)))
        })
        .unwrap_or_else(|| "unknown".into());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            let line = info.lines().find(|l| l.starts_with("model name"))?;
            Some(line.split(':').nth(1)?.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let args: Vec<String> = std::env::args().skip(1).collect();
    let profile = if cfg!(debug_assertions) {
        ""
    } else {
        " --release"
    };
    format!(
        "Run {date} on {cores} cores ({cpu}), {memory} memory; client and servers on the same \
         machine (load average {load}: other work on the machine skews the figures); \
         RocketMQ-protocol brokers with {} flush.\n\n```\ncargo run{profile} -p quiver-bench -- {}\n```\n\n\
         Each system runs alone, in turn, from an empty temp data dir with persistence on. \
         Per produce run: at most {} messages, 256 MiB or {:?}; consume is a catch-up read of \
         the 1-producer batch run; end-to-end sends {} msgs/s for {:?} (first 10% left out), \
         then again beside a CPU hog (one nice-19 busy thread per core) unless --no-cpu-hog; \
         parked pull (RocketMQ-protocol brokers): up to {} pulls (10 s), each long-polling at the \
         max offset of a one-queue topic, one 1 KiB send {:?} later, answer minus send issued; \
         with sync flush, 16 producers with one 1 KiB send in flight each, beside write(16 x \
         1194 B) + fdatasync rounds/s x 16 on the same file system just before and just after, \
         and the simplest group-commit server (bench/src/minimal_server.rs) with the same \
         clients; then 1 KiB batches until {} 1 KiB messages are stored (at most {:?}), and the \
         server's memory is read. \
         Ratios are quiver/peer: above 1 is better for throughput, worse for latency, disk and \
         RSS.\n\n{table}\n### Targets (issues 7 and 22), this run\n\n{}",
        options.flush.name(),
        args.join(" "),
        plan.messages,
        plan.run_time,
        plan.e2e_rate_per_sec,
        plan.e2e_time,
        plan.parked_pull.repeats,
        plan.parked_pull.park_pause,
        plan.stored_before_memory,
        plan.top_up_time,
        targets(plan, outcomes),
    ) + if options.smoke {
        "\n(smoke run: figures are meaningless)\n"
    } else {
        ""
    }
}

/// The issue's targets beside this run's figures (1 KiB rows, the end-to-end p99, the
/// parked pull p99, group commit against the fsync ceiling, anonymous RSS against the data).
fn targets(plan: &Plan, outcomes: &[Outcome]) -> String {
    let size = 1024;
    let produce: Vec<String> = plan
        .producer_counts
        .iter()
        .map(|producers| {
            format!(
                "produce {size} B, {producers} producer(s), batch {}",
                plan.batch
            )
        })
        .collect();
    let consume = format!("consume {size} B (catch-up)");
    let p99 = |beside| format!("{}, p99 latency", end_to_end_name(plan, beside));
    report::targets(
        outcomes,
        (&produce, &consume),
        (&p99(Beside::Nothing), &p99(Beside::CpuHog)),
        plan.stored_before_memory,
    )
}
