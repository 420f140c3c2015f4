//! `quiver-bench store`: the store's append, dispatch and read rates beside the machine's
//! ceilings for the same bytes, printed as a markdown table with ratios.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quiver_bench::percentile;
use quiver_store::record::{self, Placement};
use quiver_store::{
    CommitLogOffset, FlushMode, GetStatus, MessageStore, NewMessage, QueueOffset, StoreConfig,
};

use crate::ceilings::{self, Blocks};
use crate::measure::{run_bounded, Bounds, Rate};

#[derive(clap::Args, Debug)]
pub struct Options {
    /// Seconds each measurement may run at most.
    #[arg(long, default_value_t = 1.5)]
    seconds: f64,
    /// Parent directory for scratch files; a temp dir inside it is removed afterwards.
    /// Default: the current directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A few-second sanity run (CI): tiny bounds and segments; figures are meaningless.
    #[arg(long)]
    smoke: bool,
    /// Concurrent writers for the group-commit (Sync) figure.
    #[arg(long, default_value_t = 16)]
    writers: u32,
    /// Rounds of the fresh-mmap ceiling and Async append (the best of each is shown) and of
    /// Sync with 1 and with `--writers` writers (the pair with the median gain is shown).
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Body sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [128usize, 1024, 16384])]
    sizes: Vec<usize>,
}

const TOPIC: &str = "BenchTopic";
const QUEUES: u32 = 4;
const PROPERTIES: &str = "TAGS\u{1}TagA\u{2}KEYS\u{1}bench\u{2}";

struct Plan {
    bounds: Bounds,
    sync_bounds: Bounds,
    segment_size_bytes: u64,
    rounds: u32,
}

impl Plan {
    fn new(options: &Options) -> Plan {
        if options.smoke {
            let bounds = Bounds {
                duration: Duration::from_millis(50),
                max_ops: 2_000,
                max_bytes: 2 << 20,
            };
            return Plan {
                bounds,
                sync_bounds: Bounds {
                    max_ops: 50,
                    ..bounds
                },
                segment_size_bytes: 1 << 20,
                rounds: 1,
            };
        }
        let duration = Duration::from_secs_f64(options.seconds);
        Plan {
            bounds: Bounds {
                duration,
                max_ops: 20_000_000,
                max_bytes: 3 << 30,
            },
            sync_bounds: Bounds {
                duration,
                max_ops: 500_000,
                max_bytes: 1 << 30,
            },
            segment_size_bytes: 1 << 30,
            rounds: options.rounds.max(1),
        }
    }

    fn config(&self, dir: &Path, flush_mode: FlushMode) -> StoreConfig {
        StoreConfig {
            data_dir: dir.to_path_buf(),
            segment_size_bytes: self.segment_size_bytes,
            flush_mode,
            max_message_size_bytes: 64 * 1024,
            ..StoreConfig::default()
        }
    }
}

fn message(body: &[u8], queue_id: u32) -> NewMessage<'_> {
    let host: SocketAddr = "10.0.0.1:40000".parse().expect("literal address");
    NewMessage {
        topic: TOPIC,
        queue_id,
        flag: 0,
        body,
        properties: PROPERTIES,
        sys_flag: 0,
        born_timestamp_ms: 1_700_000_000_000,
        born_host: host,
        store_host: "10.0.0.2:10911".parse().expect("literal address"),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// One row of the table.
struct Row {
    body: usize,
    figure: String,
    rate: Rate,
    extra: String,
    ratio: Option<(f64, String)>,
}

fn print_row(row: &Row) {
    let ratio = row
        .ratio
        .as_ref()
        .map_or(String::new(), |(r, of)| format!("{:.2} of {of}", r));
    println!(
        "| {:>6} | {:<34} | {:>12.0} | {:>9.1} | {:<36} | {:<36} |",
        size_label(row.body),
        row.figure,
        row.rate.ops_per_sec(),
        row.rate.mb_per_sec(),
        row.extra,
        ratio
    );
}

fn size_label(bytes: usize) -> String {
    if bytes >= 1024 && bytes % 1024 == 0 {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .map(str::to_owned)
        })
        .and_then(|l| {
            l.split_whitespace()
                .nth(1)
                .and_then(|v| v.parse::<u64>().ok())
        })
        .unwrap_or(0);
    format!(
        "{cores} cores, {:.1} GiB memory",
        memory_kib as f64 / 1024.0 / 1024.0
    )
}

pub fn run(options: &Options, scratch: &Path) -> anyhow::Result<()> {
    let plan = Plan::new(options);
    println!(
        "quiver-bench store: {}, scratch {}",
        machine(),
        scratch.display()
    );
    println!(
        "bounds per measurement: {:?} / {} ops / {} MiB; sync: {} ops; {} writers for group commit{}",
        plan.bounds.duration,
        plan.bounds.max_ops,
        plan.bounds.max_bytes >> 20,
        plan.sync_bounds.max_ops,
        options.writers,
        if options.smoke { " (SMOKE: figures meaningless)" } else { "" }
    );
    println!();
    println!("| body   | figure                             |       msgs/s |      MB/s | detail                               | ratio                                |");
    println!("|--------|------------------------------------|--------------|-----------|--------------------------------------|--------------------------------------|");
    let mut verdicts = Vec::new();
    for &size in &options.sizes {
        verdicts.extend(bench_size(&plan, options, scratch, size)?);
    }
    println!();
    if options.smoke {
        println!("smoke run: bounds too small for figures, targets not evaluated");
        return Ok(());
    }
    for verdict in verdicts {
        println!("{verdict}");
    }
    Ok(())
}

fn bench_size(
    plan: &Plan,
    options: &Options,
    scratch: &Path,
    size: usize,
) -> anyhow::Result<Vec<String>> {
    let bench = SizeBench::new(plan, options, scratch, size)?;
    let ceilings = bench.ceilings()?;
    let sync = bench.sync_append_pairs(&ceilings)?;
    let (async_ratio, async_rate, dir) = bench.async_beside_mmap()?;
    bench.rebuild_and_read(&dir, &ceilings)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(bench.verdicts(&ceilings, &sync, async_ratio, async_rate))
}

/// One body size's benchmark: its record and where it writes.
struct SizeBench<'a> {
    plan: &'a Plan,
    options: &'a Options,
    scratch: &'a Path,
    size: usize,
    body: Vec<u8>,
    record: Vec<u8>,
}

/// The machine's figures for this record, measured first.
struct Ceilings {
    memcpy: Rate,
    fdatasync: Rate,
    /// What one write+fdatasync of `writers` records gains over one of a single record.
    disk_gain: f64,
}

/// Sync append: the gain of many writers over one in each round, and the median's.
struct SyncGain {
    gain: f64,
    gains: Vec<String>,
}

impl<'a> SizeBench<'a> {
    fn new(
        plan: &'a Plan,
        options: &'a Options,
        scratch: &'a Path,
        size: usize,
    ) -> anyhow::Result<Self> {
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let record = record::encode(
            &message(&body, 0),
            Placement {
                queue_offset: QueueOffset(0),
                physical_offset: CommitLogOffset(0),
                store_timestamp_ms: 0,
            },
        )?;
        Ok(SizeBench {
            plan,
            options,
            scratch,
            size,
            body,
            record,
        })
    }

    fn record_bytes(&self) -> u64 {
        self.record.len() as u64
    }

    fn print(&self, figure: &str, rate: Rate, extra: String, ratio: Option<(f64, &str)>) {
        print_row(&Row {
            body: self.size,
            figure: figure.to_owned(),
            rate,
            extra,
            ratio: ratio.map(|(value, of)| (value, of.to_owned())),
        });
    }

    fn ceilings(&self) -> anyhow::Result<Ceilings> {
        let (plan, record) = (self.plan, &self.record);
        let memcpy = ceilings::memcpy(record, plan.bounds)?;
        let record_bytes = self.record_bytes();
        self.print(
            "ceiling: memcpy (warm buffer)",
            memcpy,
            format!("{record_bytes} B records"),
            None,
        );
        let (fdatasync, fdatasync_p50) =
            ceilings::write_fdatasync(self.scratch, record, plan.sync_bounds, Blocks::Appended)?;
        let p50 = format!("p50 {} us", fdatasync_p50.as_micros());
        self.print("ceiling: write+fdatasync, 1 writer", fdatasync, p50, None);

        // What group commit can gain on this disk, writing as Sync mode does (into blocks filled
        // ahead): one write of `writers` records per fdatasync against one of a single record.
        let (overwrite, overwrite_p50) =
            ceilings::write_fdatasync(self.scratch, record, plan.sync_bounds, Blocks::Written)?;
        let p50 = format!("p50 {} us", overwrite_p50.as_micros());
        self.print("ceiling: same, into written blocks", overwrite, p50, None);
        let writers = self.options.writers;
        let grouped_record = record.repeat(writers as usize);
        let (grouped, _) = ceilings::write_fdatasync(
            self.scratch,
            &grouped_record,
            plan.sync_bounds,
            Blocks::Written,
        )?;
        let grouped = Rate {
            ops: grouped.ops * u64::from(writers),
            bytes: grouped.bytes,
            elapsed: grouped.elapsed,
        };
        let disk_gain = grouped.ops_per_sec() / overwrite.ops_per_sec();
        let figure = format!("ceiling: {writers} records/write, same");
        self.print(
            &figure,
            grouped,
            format!("{disk_gain:.1}x one record"),
            None,
        );
        Ok(Ceilings {
            memcpy,
            fdatasync,
            disk_gain,
        })
    }

    /// Sync first: the Async run leaves gigabytes for writeback that would slow fsyncs. One
    /// writer and many alternate `rounds` times, and the pair with the median gain is shown:
    /// both halves of a ratio come from the same minutes of a machine whose speed drifts.
    fn sync_append_pairs(&self, ceilings: &Ceilings) -> anyhow::Result<SyncGain> {
        let (plan, writers, record_bytes) = (self.plan, self.options.writers, self.record_bytes());
        let mut pairs = Vec::new();
        for _ in 0..plan.rounds {
            let one = sync_append(plan, self.scratch, &self.body, record_bytes, 1)?;
            let many = sync_append(plan, self.scratch, &self.body, record_bytes, writers)?;
            pairs.push((one, many));
        }
        let gain_of = |(one, many): &((Rate, String), (Rate, String))| {
            many.0.ops_per_sec() / one.0.ops_per_sec()
        };
        let gains: Vec<String> = pairs.iter().map(|p| format!("{:.1}", gain_of(p))).collect();
        pairs.sort_by(|a, b| gain_of(a).total_cmp(&gain_of(b)));
        let ((one, one_latency), (many, many_latency)) = pairs.swap_remove(pairs.len() / 2);
        let of_fdatasync = |rate: Rate| rate.ops_per_sec() / ceilings.fdatasync.ops_per_sec();
        let of = "write+fdatasync msgs/s";
        self.print(
            "store: append Sync, 1 writer",
            one,
            one_latency,
            Some((of_fdatasync(one), of)),
        );
        let gain = many.ops_per_sec() / one.ops_per_sec();
        self.print(
            &format!("store: append Sync, {writers} writers"),
            many,
            format!("{gain:.1}x 1 writer; {many_latency}"),
            Some((of_fdatasync(many), of)),
        );
        Ok(SyncGain { gain, gains })
    }

    /// Async append beside the fresh-mmap ceiling, best of `rounds` each (the machine is
    /// shared; the best round is the one least disturbed). Returns the store's directory.
    fn async_beside_mmap(&self) -> anyhow::Result<(f64, Rate, PathBuf)> {
        let plan = self.plan;
        let dir = self.scratch.join(format!("async-{}", self.size));
        let mut mmap: Option<Rate> = None;
        let mut async_rate: Option<Rate> = None;
        for _ in 0..plan.rounds {
            // Both start from the same state: no earlier round's files in the page cache.
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            let ceiling = ceilings::fresh_mmap(
                self.scratch,
                &self.record,
                plan.segment_size_bytes,
                plan.bounds,
            )?;
            mmap = Some(best(mmap, ceiling));
            let rate = async_append(plan, &dir, &self.body, self.record_bytes())?;
            async_rate = Some(best(async_rate, rate));
        }
        let mmap = mmap.expect("at least one round");
        let async_rate = async_rate.expect("at least one round");
        let rounds = format!("best of {}", plan.rounds);
        self.print("ceiling: fresh mmap sequential", mmap, rounds.clone(), None);
        let async_ratio = async_rate.mb_per_sec() / mmap.mb_per_sec();
        let of = Some((async_ratio, "fresh mmap MB/s"));
        self.print("store: append Async, 1 writer", async_rate, rounds, of);
        Ok((async_ratio, async_rate, dir))
    }

    /// Re-dispatch and sequential read over what the last Async round wrote in `dir`.
    fn rebuild_and_read(&self, dir: &Path, ceilings: &Ceilings) -> anyhow::Result<()> {
        std::fs::remove_dir_all(dir.join("consumequeue"))?;
        for name in ["checkpoint", "checkpoint.bak"] {
            let _ = std::fs::remove_file(dir.join(name));
        }
        let store = MessageStore::open(self.plan.config(dir, FlushMode::Async))?;
        let report = store.recovery_report();
        let dispatch = Rate {
            ops: report.redispatched_units,
            bytes: report.redispatched_units * self.record_bytes(),
            elapsed: report.elapsed,
        };
        let of_memcpy = dispatch.ops_per_sec() / ceilings.memcpy.ops_per_sec();
        let figure = "store: dispatch (recovery rebuild)";
        self.print(
            figure,
            dispatch,
            "validate+index".into(),
            Some((of_memcpy, "memcpy msgs/s")),
        );

        let read = sequential_read(&store, self.plan.bounds)?;
        let of_memcpy = read.mb_per_sec() / ceilings.memcpy.mb_per_sec();
        let figure = "store: sequential read (get x32)";
        self.print(
            figure,
            read,
            "copied out".into(),
            Some((of_memcpy, "memcpy MB/s")),
        );
        store.shutdown()?;
        Ok(())
    }

    fn verdicts(
        &self,
        ceilings: &Ceilings,
        sync: &SyncGain,
        async_ratio: f64,
        async_rate: Rate,
    ) -> Vec<String> {
        let mut verdicts = Vec::new();
        let met = |ok: bool| if ok { "met" } else { "MISSED" };
        if self.size == 16 * 1024 {
            verdicts.push(format!(
                "target: 16 KiB Async append >= 70% of fresh mmap: {:.0}% -> {}",
                async_ratio * 100.0,
                met(async_ratio >= 0.70)
            ));
        }
        if self.size == 128 {
            verdicts.push(format!(
                "target: 128 B Async append >= 1,000,000 msgs/s: {:.0} -> {}",
                async_rate.ops_per_sec(),
                met(async_rate.ops_per_sec() >= 1_000_000.0)
            ));
        }
        let (gain, disk_gain, writers) = (sync.gain, ceilings.disk_gain, self.options.writers);
        verdicts.push(format!(
            "target: {} B Sync with {writers} writers >= 8x 1 writer: {gain:.1}x, the median of \
             {} pairs ({}) -> {} (the disk allows {disk_gain:.1}x: {writers} records per \
             write+fdatasync into written blocks)",
            self.size,
            sync.gains.len(),
            sync.gains.join(", "),
            met(gain >= 8.0),
        ));
        verdicts
    }
}

/// The faster of two measurements.
fn best(previous: Option<Rate>, next: Rate) -> Rate {
    match previous {
        Some(p) if p.mb_per_sec() >= next.mb_per_sec() => p,
        _ => next,
    }
}

/// One writer appending with Async flush into a fresh store until the bounds are reached.
fn async_append(plan: &Plan, dir: &Path, body: &[u8], record_bytes: u64) -> anyhow::Result<Rate> {
    let store = MessageStore::open(plan.config(dir, FlushMode::Async))?;
    let mut n = 0u64;
    let rate = run_bounded(plan.bounds, record_bytes, 256, |batch| {
        for _ in 0..batch {
            store.put(&message(body, (n % u64::from(QUEUES)) as u32), n as i64)?;
            n += 1;
        }
        Ok(())
    })?;
    store.shutdown()?;
    Ok(rate)
}

/// Reads every queue from offset 0 in pulls of 32, copying each record out (as a socket
/// write would), until done or the bounds are reached.
fn sequential_read(store: &MessageStore, bounds: Bounds) -> anyhow::Result<Rate> {
    let started = Instant::now();
    let mut out = Vec::with_capacity(1 << 20);
    let (mut ops, mut bytes) = (0u64, 0u64);
    for queue_id in 0..QUEUES {
        let mut offset = QueueOffset(0);
        while ops < bounds.max_ops
            && bytes < bounds.max_bytes
            && started.elapsed() < bounds.duration
        {
            let got = store.get(TOPIC, queue_id, offset, 32, u64::MAX, &|_| true)?;
            if got.status != GetStatus::Found {
                break;
            }
            out.clear();
            for message in &got.messages {
                out.extend_from_slice(message);
                bytes += message.len() as u64;
            }
            ops += got.messages.len() as u64;
            std::hint::black_box(&out);
            offset = got.next_begin_offset;
        }
    }
    Ok(Rate {
        ops,
        bytes,
        elapsed: started.elapsed(),
    })
}

/// `writers` threads appending with Sync flush until the bounds are reached; also the p50 /
/// p99 latency of a put (until durable), as "p50 N / p99 N us".
fn sync_append(
    plan: &Plan,
    scratch: &Path,
    body: &[u8],
    record_bytes: u64,
    writers: u32,
) -> anyhow::Result<(Rate, String)> {
    let dir = scratch.join(format!("sync-{}-{writers}", body.len()));
    let store = MessageStore::open(plan.config(&dir, FlushMode::Sync))?;
    let bounds = plan.sync_bounds;
    let max_ops = bounds.ops_for(record_bytes);
    let done = AtomicU64::new(0);
    let started = Instant::now();
    let mut micros = std::thread::scope(|scope| -> anyhow::Result<Vec<u64>> {
        let handles: Vec<_> = (0..writers)
            .map(|writer| {
                let (store, done) = (&store, &done);
                scope.spawn(move || -> anyhow::Result<Vec<u64>> {
                    let mut n = 0i64;
                    let mut micros = Vec::new();
                    while started.elapsed() < bounds.duration
                        && done.fetch_add(1, Ordering::Relaxed) < max_ops
                    {
                        let put_at = Instant::now();
                        store.put(&message(body, writer % QUEUES), n)?;
                        micros.push(put_at.elapsed().as_micros() as u64);
                        n += 1;
                    }
                    Ok(micros)
                })
            })
            .collect();
        let mut micros = Vec::new();
        for handle in handles {
            micros.extend(
                handle
                    .join()
                    .map_err(|_| anyhow::anyhow!("a writer panicked"))??,
            );
        }
        Ok(micros)
    })?;
    let elapsed = started.elapsed();
    micros.sort_unstable();
    let latency = format!(
        "p50 {} / p99 {} us",
        percentile(&micros, 0.5),
        percentile(&micros, 0.99)
    );
    // One latency per acknowledged put.
    let ops = micros.len() as u64;
    store.shutdown()?;
    drop(store);
    std::fs::remove_dir_all(&dir)?;
    Ok((
        Rate {
            ops,
            bytes: ops * record_bytes,
            elapsed,
        },
        latency,
    ))
}
