//! The workloads every system runs, written once against the [`System`] trait.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_bench::percentile;
use tokio::sync::mpsc;

use crate::ceilings;
use crate::measure::{Bounds, Rate};
use crate::minimal_server;
use crate::peers::hog::CpuHog;
use crate::peers::server::disk_usage_bytes;
use crate::peers::stages::BrokerStages;
use crate::peers::tail::{self, CpuWait, SendTimes};

/// One message's arrival at a consumer: (send stamp, arrival stamp), nanoseconds.
pub type Arrival = (u64, u64);

/// A system under test, seen from its load generator.
pub trait System: Send + Sync + 'static {
    type Producer: ProducerHandle;

    /// Creates the stream (topic) `stream`, persisted, empty.
    fn prepare(&self, stream: &str) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// A new producer with its own connection.
    fn producer(&self) -> impl Future<Output = anyhow::Result<Self::Producer>> + Send;

    /// Reads the first `count` messages of `stream` (a catch-up read); returns the messages
    /// and body bytes read, stopping early at `deadline`.
    fn read_back(
        &self,
        stream: &str,
        count: u64,
        deadline: Instant,
    ) -> impl Future<Output = anyhow::Result<(u64, u64)>> + Send;

    /// Receives messages of `stream` as they arrive until `count` came or `deadline`,
    /// calling [`record_arrival`] with each body into `arrivals`.
    fn follow(
        &self,
        stream: &str,
        count: u64,
        deadline: Instant,
        arrivals: mpsc::UnboundedSender<Arrival>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Parked-pull wake latency on a fresh one-queue `stream` (see [`ParkedPullPlan`]);
    /// `None` for a system without long-polling pulls at an offset.
    fn parked_pulls(
        &self,
        _stream: &str,
        _plan: ParkedPullPlan,
    ) -> impl Future<Output = anyhow::Result<Option<ParkedPulls>>> + Send {
        async { Ok(None) }
    }
}

/// The parked-pull run: `repeats` times (at most `time_bound` in all), a pull long-polls
/// (`suspend`) at the queue's max offset, `park_pause` later one message of `body_bytes` is
/// sent; each latency is the pull's answer minus the moment the send was issued.
#[derive(Clone, Copy, Debug)]
pub struct ParkedPullPlan {
    pub repeats: u64,
    pub time_bound: Duration,
    pub suspend: Duration,
    pub park_pause: Duration,
    pub body_bytes: usize,
}

/// What the parked-pull run measured: one latency per answered pull, one line per failure
/// (a pull that came back without the message, or answered before the send).
#[derive(Clone, Debug, Default)]
pub struct ParkedPulls {
    pub latencies_micros: Vec<u64>,
    pub failures: Vec<String>,
}

/// Name of the parked-pull latency figures (", p50 latency" and so on follow).
pub const PARKED_PULL: &str = "parked pull answered after the send";
/// Body size of the messages counted before the memory figures are read (issue 7: broker RSS
/// for 1M stored 1 KiB messages).
pub const STORED_BODY_BYTES: usize = 1024;
/// How many 1 KiB messages the produce runs and the top-up stored before the memory was read
/// (the end-to-end, parked-pull and group-commit runs store more, uncounted).
pub const STORED_1K: &str = "1 KiB messages stored before the memory was read";
/// The anonymous-memory figure: heap and stacks, not the page cache holding the data.
pub const ANON_RSS: &str = "server anonymous RSS at the end";
/// Producers of the group-commit run, each with one single send in flight.
pub const GROUP_COMMIT_PRODUCERS: u32 = 16;
/// Body size of the group-commit run.
pub const GROUP_COMMIT_BODY_BYTES: usize = 1024;
/// Bytes one stored message takes beside its body (record header and properties), roughly.
pub const RECORD_OVERHEAD_BYTES: usize = 170;
/// The group-commit producer figure (sync flush only).
pub const GROUP_COMMIT: &str =
    "produce 1024 B, 16 producer(s), 1 in flight each (sync group commit)";
/// The fsync ceiling beside it: fdatasync rounds per second times 16 messages, measured
/// just before and just after the producers' run (the disk's rate moves from second to second).
pub const FSYNC_CEILING: &str =
    "fsync ceiling: write 16 x (1024 + 170) B + fdatasync per round, x 16 msgs (allowed; before + after)";
/// What the simplest server reaches with the same 16 one-in-flight clients (`minimal_server`):
/// the bound this machine puts on group commit over loopback, protocol and index aside.
pub const MINIMAL_SERVER: &str =
    "group commit, simplest server: thread per connection, pwrite + shared fdatasync, 16 x 1 in flight";

/// One producer connection; clones share it (a window of in-flight sends).
pub trait ProducerHandle: Clone + Send + Sync + 'static {
    /// Sends one message and waits until the system acknowledged it as stored.
    fn send_one(
        &self,
        stream: &str,
        body: Bytes,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Sends messages as one batch (the system's native form) and waits for the acknowledgement.
    fn send_batch(
        &self,
        stream: &str,
        bodies: Vec<Bytes>,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;

    fn close(self) -> impl Future<Output = ()> + Send;
}

/// How much each workload does and how long it may take.
#[derive(Clone, Debug)]
pub struct Plan {
    pub sizes: Vec<usize>,
    /// Messages per produce run (fewer for large bodies, see `max_bytes_per_run`).
    pub messages: u64,
    pub max_bytes_per_run: u64,
    /// Time bound of one produce or consume run.
    pub run_time: Duration,
    pub producer_counts: Vec<u32>,
    pub batch: usize,
    /// In-flight single sends per producer.
    pub window: usize,
    pub e2e_rate_per_sec: u64,
    pub e2e_body_bytes: usize,
    pub e2e_time: Duration,
    /// Leading part of the end-to-end run left out of the percentiles.
    pub e2e_warmup: Duration,
    pub parked_pull: ParkedPullPlan,
    /// Run the end-to-end workload a second time beside a [`CpuHog`].
    pub cpu_hog: bool,
    /// Run the group-commit workload and its fsync ceiling (sync-flush RocketMQ brokers).
    pub group_commit: bool,
    /// Bounds of the write + fdatasync ceiling.
    pub fsync_ceiling: Bounds,
    /// 1 KiB messages stored before the memory figures: batches top the workloads' count up.
    pub stored_before_memory: u64,
    /// Time bound of that top-up.
    pub top_up_time: Duration,
}

impl Plan {
    fn messages_for(&self, size: usize) -> u64 {
        self.messages
            .min(self.max_bytes_per_run / size.max(1) as u64)
            .max(1)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendMode {
    Batch,
    Single,
}

/// What a figure measures, which fixes its unit and whether higher is better.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Measure {
    Throughput {
        mb_per_sec: f64,
    },
    LatencyMicros,
    BytesPerMessage,
    MemoryBytes,
    Count,
    /// A broker stage's p99 (the value) with its p50 and p999 beside it.
    StageMicros {
        p50: f64,
        p999: f64,
    },
    /// A share, in percent.
    Percent,
    /// Milliseconds per second of a run, with the mean of each occurrence beside it.
    MillisPerSecond {
        mean_us: f64,
    },
}

/// One measured figure of one system.
#[derive(Clone, Debug)]
pub struct Figure {
    pub workload: String,
    pub value: f64,
    pub measure: Measure,
}

fn throughput(workload: String, rate: &Rate) -> Figure {
    Figure {
        workload,
        value: rate.ops_per_sec(),
        measure: Measure::Throughput {
            mb_per_sec: rate.mb_per_sec(),
        },
    }
}

/// Nanoseconds since the first call in this process: the clock of send and arrival stamps.
pub fn now_nanos() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Records a received end-to-end message (its first 8 bytes are the send stamp).
pub fn record_arrival(arrivals: &mpsc::UnboundedSender<Arrival>, body: &[u8]) {
    let arrived = now_nanos();
    if let Some(stamp) = body.get(..8) {
        let sent = u64::from_le_bytes(stamp.try_into().expect("8 bytes"));
        // The follower may outlive the receiver after the run's deadline: nothing to record.
        let _ = arrivals.send((sent, arrived));
    }
}

/// A body of `size` bytes of a fixed non-repeating pattern (nothing compresses it away).
pub fn pattern_body(size: usize) -> Bytes {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let bytes: Vec<u8> = (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    Bytes::from(bytes)
}

/// Memory of the server process, read after the workloads.
#[derive(Clone, Copy, Debug)]
pub struct ServerMemory {
    pub peak_rss_bytes: Option<u64>,
    pub anon_rss_bytes: Option<u64>,
}

/// Runs every workload against `system`; `server_memory` is read at the end.
pub async fn run_all<S: System>(
    system: Arc<S>,
    plan: &Plan,
    data_dir: &Path,
    server_memory: impl Fn() -> ServerMemory,
    stages: BrokerStages,
    server_pid: u32,
    log: impl Fn(&str),
) -> anyhow::Result<Vec<Figure>> {
    let mut figures = Vec::new();
    let mut stored_1k = 0;
    for &size in &plan.sizes {
        let (size_figures, stored) = size_workloads(&system, plan, size, data_dir, &log).await?;
        figures.extend(size_figures);
        if size == STORED_BODY_BYTES {
            stored_1k += stored;
        }
    }
    // The stages, as the end-to-end percentiles, leave the warm-up out.
    let warmup_ns = u64::try_from(plan.e2e_warmup.as_nanos()).unwrap_or(u64::MAX);
    let after_warmup = |mark: Option<u64>| mark.map(|at| at.saturating_add(warmup_ns));
    let mark = stages.mark().await?;
    figures.extend(end_to_end(&system, plan, (Beside::Nothing, server_pid), &log).await?);
    let run = end_to_end_name(plan, Beside::Nothing);
    figures.extend(stages.figures(after_warmup(mark), &run, &log).await?);
    if plan.cpu_hog {
        let limit = plan.e2e_time + Duration::from_secs(20);
        let hog = CpuHog::start(CpuHog::threads_per_core(), limit)?;
        let mark = stages.mark().await;
        let figures_under_hog = end_to_end(&system, plan, (Beside::CpuHog, server_pid), &log).await;
        let run = end_to_end_name(plan, Beside::CpuHog);
        let stage_figures = stages.figures(after_warmup(mark?), &run, &log).await;
        let name = hog.name().to_owned();
        log(&format!(
            "  (CPU hog threads {name}*: {} rounds of work)",
            hog.stop()
        ));
        figures.extend(figures_under_hog?);
        figures.extend(stage_figures?);
    }
    let mark = stages.mark().await?;
    figures.extend(parked_pulls(&system, plan, &log).await?);
    figures.extend(stages.figures(mark, PARKED_PULL, &log).await?);
    if plan.group_commit {
        let scratch = data_dir.parent().unwrap_or(data_dir).to_path_buf();
        figures.extend(group_commit(&system, plan, scratch, &log).await?);
    }
    stored_1k += top_up(&system, plan, stored_1k, &log).await?;
    figures.push(Figure {
        workload: STORED_1K.into(),
        value: stored_1k as f64,
        measure: Measure::Count,
    });
    figures.extend(memory_figures(server_memory()));
    Ok(figures)
}

/// Produce with each producer count and send mode, the catch-up read of the first stream, and
/// the disk used per message, for one body size; returns the figures and messages stored.
async fn size_workloads<S: System>(
    system: &Arc<S>,
    plan: &Plan,
    size: usize,
    data_dir: &Path,
    log: &impl Fn(&str),
) -> anyhow::Result<(Vec<Figure>, u64)> {
    let disk_before = disk_usage_bytes(data_dir);
    let mut figures = Vec::new();
    let mut stored = 0;
    let mut catch_up_stream = None;
    for &producers in &plan.producer_counts {
        for mode in [SendMode::Batch, SendMode::Single] {
            let (mode_name, suffix) = match mode {
                SendMode::Batch => (format!("batch {}", plan.batch), "b"),
                SendMode::Single => (format!("single, window {}", plan.window), "s"),
            };
            let stream = format!("bench_{size}_{producers}_{suffix}");
            system.prepare(&stream).await?;
            let rate = produce(system, &stream, size, producers, mode, plan)
                .await
                .with_context(|| format!("producing to {stream}"))?;
            let workload = format!("produce {size} B, {producers} producer(s), {mode_name}");
            log(&format!("  {workload}: {:.0} msgs/s", rate.ops_per_sec()));
            stored += rate.ops;
            catch_up_stream.get_or_insert((stream, rate.ops));
            figures.push(throughput(workload, &rate));
        }
    }
    if let Some((stream, count)) = catch_up_stream {
        figures.push(catch_up(system, plan, size, &stream, count, log).await?);
    }
    let disk_after = disk_usage_bytes(data_dir);
    figures.push(Figure {
        workload: format!("disk bytes per {size} B message"),
        value: disk_after.saturating_sub(disk_before) as f64 / stored.max(1) as f64,
        measure: Measure::BytesPerMessage,
    });
    Ok((figures, stored))
}

/// Reads `count` messages of `stream` back from the start, as a consumer catching up would.
async fn catch_up<S: System>(
    system: &Arc<S>,
    plan: &Plan,
    size: usize,
    stream: &str,
    count: u64,
    log: &impl Fn(&str),
) -> anyhow::Result<Figure> {
    let started = Instant::now();
    let (read, bytes) = system
        .read_back(stream, count, started + plan.run_time)
        .await
        .with_context(|| format!("reading back {stream}"))?;
    let rate = Rate {
        ops: read,
        bytes,
        elapsed: started.elapsed(),
    };
    // The count differs between systems (each stored what it could), so not in the name.
    let workload = format!("consume {size} B (catch-up)");
    log(&format!(
        "  {workload} of {count}: {:.0} msgs/s",
        rate.ops_per_sec()
    ));
    if read < count {
        log(&format!(
            "  (read {read} of {count} within {:?})",
            plan.run_time
        ));
    }
    Ok(throughput(workload, &rate))
}

/// The server's peak and anonymous RSS, where they could be read.
fn memory_figures(memory: ServerMemory) -> Vec<Figure> {
    [
        (
            "server peak RSS (VmHWM, mapped files included)",
            memory.peak_rss_bytes,
        ),
        (ANON_RSS, memory.anon_rss_bytes),
    ]
    .into_iter()
    .filter_map(|(workload, bytes)| {
        bytes.map(|bytes| Figure {
            workload: workload.into(),
            value: bytes as f64,
            measure: Measure::MemoryBytes,
        })
    })
    .collect()
}

/// Stores batches of 1 KiB until `stored` reaches `plan.stored_before_memory` (or its time
/// bound passes), with the most producers of the plan; returns how many it stored.
async fn top_up<S: System>(
    system: &Arc<S>,
    plan: &Plan,
    stored: u64,
    log: &impl Fn(&str),
) -> anyhow::Result<u64> {
    let missing = plan.stored_before_memory.saturating_sub(stored);
    if missing == 0 {
        return Ok(0);
    }
    let stream = "bench_1024_top_up";
    system.prepare(stream).await?;
    let producers = plan.producer_counts.iter().copied().max().unwrap_or(1);
    let top_up_plan = Plan {
        messages: missing,
        max_bytes_per_run: u64::MAX,
        run_time: plan.top_up_time,
        ..plan.clone()
    };
    let rate = produce(
        system,
        stream,
        STORED_BODY_BYTES,
        producers,
        SendMode::Batch,
        &top_up_plan,
    )
    .await
    .with_context(|| format!("topping up {stream}"))?;
    log(&format!(
        "  topped up with {} 1 KiB messages in {:.1} s: {} stored",
        rate.ops,
        rate.elapsed.as_secs_f64(),
        stored + rate.ops
    ));
    Ok(rate.ops)
}

/// Produce run: `producers` connections, each sending batches one at a time or single
/// messages with a window in flight, until the count or the time bound is reached.
pub async fn produce<S: System>(
    system: &Arc<S>,
    stream: &str,
    size: usize,
    producers: u32,
    mode: SendMode,
    plan: &Plan,
) -> anyhow::Result<Rate> {
    let body = pattern_body(size);
    let total = plan.messages_for(size);
    let senders_per_producer = match mode {
        SendMode::Batch => 1,
        SendMode::Single => plan.window.max(1) as u64,
    };
    let senders = u64::from(producers) * senders_per_producer;
    let per_sender = total.div_ceil(senders);
    let mut handles = Vec::new();
    for _ in 0..producers {
        handles.push(system.producer().await?);
    }
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + plan.run_time;
    let mut tasks = tokio::task::JoinSet::new();
    for handle in &handles {
        for _ in 0..senders_per_producer {
            let (handle, stream, body, sent) = (
                handle.clone(),
                stream.to_owned(),
                body.clone(),
                sent.clone(),
            );
            let batch = plan.batch.max(1) as u64;
            tasks.spawn(async move {
                let mut done = 0;
                while done < per_sender && Instant::now() < deadline {
                    let n = match mode {
                        SendMode::Batch => {
                            let n = batch.min(per_sender - done);
                            let bodies = (0..n).map(|_| body.clone()).collect();
                            handle.send_batch(&stream, bodies).await?;
                            n
                        }
                        SendMode::Single => {
                            handle.send_one(&stream, body.clone()).await?;
                            1
                        }
                    };
                    done += n;
                    sent.fetch_add(n, Ordering::Relaxed);
                }
                anyhow::Ok(())
            });
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.context("sender task panicked")??;
    }
    let elapsed = started.elapsed();
    for handle in handles {
        handle.close().await;
    }
    let ops = sent.load(Ordering::Relaxed);
    Ok(Rate {
        ops,
        bytes: ops * size as u64,
        elapsed,
    })
}

/// Sends `total` timestamped bodies at `plan.e2e_rate_per_sec`, each on its own task; returns
/// (sent, failed) and the load generator's stamps of each acknowledged send.
async fn send_paced<P: ProducerHandle>(
    producer: &P,
    stream: &'static str,
    plan: &Plan,
    total: u64,
) -> ((u64, u64), Vec<SendTimes>) {
    let failures = Arc::new(AtomicU64::new(0));
    let times = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(total as usize)));
    let template = pattern_body(plan.e2e_body_bytes.max(8));
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut sent = 0u64;
    let mut sends = tokio::task::JoinSet::new();
    while sent < total && started.elapsed() < plan.e2e_time + Duration::from_secs(5) {
        ticker.tick().await;
        let due =
            ((started.elapsed().as_secs_f64() * plan.e2e_rate_per_sec as f64) as u64).min(total);
        while sent < due {
            let mut body = template.to_vec();
            let stamp = now_nanos();
            body[..8].copy_from_slice(&stamp.to_le_bytes());
            let (producer, failures, times) = (producer.clone(), failures.clone(), times.clone());
            sends.spawn(async move {
                let task_ran = now_nanos();
                if producer.send_one(stream, Bytes::from(body)).await.is_err() {
                    failures.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                let acknowledged = now_nanos();
                times.lock().push(SendTimes {
                    stamp,
                    task_ran,
                    acknowledged,
                });
            });
            sent += 1;
        }
        while sends.try_join_next().is_some() {}
    }
    while sends.join_next().await.is_some() {}
    let times = std::mem::take(&mut *times.lock());
    ((sent, failures.load(Ordering::Relaxed)), times)
}

/// (sent, arrived) times of up to `sent` messages, as they arrive before `deadline`.
async fn collect_arrivals(
    arrivals: &mut mpsc::UnboundedReceiver<Arrival>,
    sent: u64,
    deadline: Instant,
) -> Vec<Arrival> {
    let mut latencies = Vec::with_capacity(sent as usize);
    while (latencies.len() as u64) < sent {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, arrivals.recv()).await {
            Ok(Some(arrival)) => latencies.push(arrival),
            Ok(None) | Err(_) => break,
        }
    }
    latencies
}

/// What else runs on the machine during an end-to-end run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Beside {
    Nothing,
    /// A [`CpuHog`]: one nice-19 busy thread per core.
    CpuHog,
}

impl Beside {
    fn stream(self) -> &'static str {
        match self {
            Beside::Nothing => "bench_e2e",
            Beside::CpuHog => "bench_e2e_hog",
        }
    }
}

/// The workload name of an end-to-end run, before ", pNN latency".
pub fn end_to_end_name(plan: &Plan, beside: Beside) -> String {
    let under = match beside {
        Beside::Nothing => "",
        Beside::CpuHog => " under a CPU hog",
    };
    format!(
        "end-to-end {} B at {}/s{under}",
        plan.e2e_body_bytes, plan.e2e_rate_per_sec
    )
}

/// Fixed-rate end-to-end run: one producer sends at `e2e_rate_per_sec` (each send in its
/// own task so a slow acknowledgement does not delay the schedule) while a follower
/// receives; latency is arrival minus the send stamp carried in the body. Beside the
/// percentiles, what the load generator's side and each process's waits for a CPU explain
/// of the tail ([`tail`]).
async fn end_to_end<S: System>(
    system: &Arc<S>,
    plan: &Plan,
    (beside, server_pid): (Beside, u32),
    log: &impl Fn(&str),
) -> anyhow::Result<Vec<Figure>> {
    let stream = beside.stream();
    system.prepare(stream).await?;
    let total = (plan.e2e_rate_per_sec as f64 * plan.e2e_time.as_secs_f64()) as u64;
    let warmup = (plan.e2e_rate_per_sec as f64 * plan.e2e_warmup.as_secs_f64()) as u64;
    let (arrivals_tx, mut arrivals_rx) = mpsc::unbounded_channel();
    let follow_deadline = Instant::now() + plan.e2e_time + Duration::from_secs(10);
    let follower = {
        let system = system.clone();
        tokio::spawn(async move {
            system
                .follow(stream, total, follow_deadline, arrivals_tx)
                .await
        })
    };
    let producer = system.producer().await?;
    let waits_before = (CpuWait::of(server_pid), CpuWait::of(std::process::id()));
    let run_started = Instant::now();
    let ((sent, failed), send_times) = send_paced(&producer, stream, plan, total).await;
    let run_seconds = run_started.elapsed().as_secs_f64();
    let waits = (
        CpuWait::of(server_pid).since(waits_before.0),
        CpuWait::of(std::process::id()).since(waits_before.1),
    );
    producer.close().await;
    let latencies = collect_arrivals(&mut arrivals_rx, sent, follow_deadline).await;
    let received = latencies.len() as u64;
    follower.abort();
    if received == 0 {
        bail!("end-to-end: none of {sent} messages arrived ({failed} sends failed)");
    }
    if received < sent || failed > 0 {
        log(&format!(
            "  end-to-end: {received} of {sent} arrived, {failed} sends failed"
        ));
    }
    // Leave out the warm-up: the earliest-sent messages.
    let mut latencies = latencies;
    latencies.sort_unstable_by_key(|&(sent_at, _)| sent_at);
    let measured = &latencies[(warmup as usize).min(latencies.len().saturating_sub(1))..];
    let micros: Vec<u64> = measured
        .iter()
        .map(|&(sent_at, arrived_at)| arrived_at.saturating_sub(sent_at) / 1_000)
        .collect();
    let name = end_to_end_name(plan, beside);
    let mut figures = latency_figures(&name, micros, log);
    figures.extend(tail::figures(&name, measured, &send_times, log));
    figures.push(tail::cpu_wait_figure(
        &name,
        "server",
        waits.0,
        run_seconds,
        log,
    ));
    figures.push(tail::cpu_wait_figure(
        &name,
        "load generator",
        waits.1,
        run_seconds,
        log,
    ));
    Ok(figures)
}

/// p50/p99/p999 figures "{name}, pNN latency" of some latencies in microseconds.
fn latency_figures(name: &str, mut micros: Vec<u64>, log: &impl Fn(&str)) -> Vec<Figure> {
    micros.sort_unstable();
    let quantiles = [("p50", 0.5), ("p99", 0.99), ("p999", 0.999)];
    log(&format!(
        "  {name}: p50 {} us, p99 {} us, p999 {} us (of {})",
        percentile(&micros, 0.5),
        percentile(&micros, 0.99),
        percentile(&micros, 0.999),
        micros.len()
    ));
    quantiles
        .into_iter()
        .map(|(label, p)| Figure {
            workload: format!("{name}, {label} latency"),
            value: percentile(&micros, p) as f64,
            measure: Measure::LatencyMicros,
        })
        .collect()
}

/// Failure lines logged one by one before the rest are only counted.
const FAILURES_LOGGED: usize = 20;

/// Parked-pull wake latency (systems that have it): p50/p99/p999 of the answered pulls;
/// every failed pull is counted and logged.
async fn parked_pulls<S: System>(
    system: &Arc<S>,
    plan: &Plan,
    log: &impl Fn(&str),
) -> anyhow::Result<Vec<Figure>> {
    let Some(outcome) = system
        .parked_pulls("bench_parked_pull", plan.parked_pull)
        .await
        .context("parked-pull run")?
    else {
        return Ok(Vec::new());
    };
    let answered = outcome.latencies_micros.len();
    let failed = outcome.failures.len();
    for failure in outcome.failures.iter().take(FAILURES_LOGGED) {
        log(&format!("  parked pull failed: {failure}"));
    }
    if failed > 0 {
        log(&format!(
            "  parked pull: {failed} of {} pulls failed (left out of the percentiles){}",
            answered + failed,
            if failed > FAILURES_LOGGED {
                format!("; the first {FAILURES_LOGGED} are logged above")
            } else {
                String::new()
            }
        ));
    }
    if answered == 0 {
        log("  parked pull: no pull was answered with its message: no figures");
        return Ok(Vec::new());
    }
    Ok(latency_figures(PARKED_PULL, outcome.latencies_micros, log))
}

/// Group commit against the fsync ceiling: 16 producers, each with one 1 KiB single send
/// in flight, for the run time; just before and just after it, on the data dir's file system
/// (`scratch`, its parent), one writer doing write(16 records) + fdatasync. The ceiling
/// figure is the rounds/s of both together x 16.
async fn group_commit<S: System>(
    system: &Arc<S>,
    plan: &Plan,
    scratch: std::path::PathBuf,
    log: &impl Fn(&str),
) -> anyhow::Result<Vec<Figure>> {
    let stream = "bench_group_commit";
    system.prepare(stream).await?;
    let one_in_flight = Plan {
        window: 1,
        ..plan.clone()
    };
    let per_round = GROUP_COMMIT_PRODUCERS as usize;
    let record = pattern_body(per_round * (GROUP_COMMIT_BODY_BYTES + RECORD_OVERHEAD_BYTES));
    let before = fsync_rounds(&scratch, &record, plan.fsync_ceiling).await?;
    let rate = produce(
        system,
        stream,
        GROUP_COMMIT_BODY_BYTES,
        GROUP_COMMIT_PRODUCERS,
        SendMode::Single,
        &one_in_flight,
    )
    .await
    .with_context(|| format!("producing to {stream}"))?;
    log(&format!(
        "  {GROUP_COMMIT}: {:.0} msgs/s",
        rate.ops_per_sec()
    ));
    let after = fsync_rounds(&scratch, &record, plan.fsync_ceiling).await?;
    let fsync = Rate {
        ops: before.ops + after.ops,
        bytes: before.bytes + after.bytes,
        elapsed: before.elapsed + after.elapsed,
    };
    let allowed = Rate {
        ops: fsync.ops * per_round as u64,
        bytes: fsync.ops * (per_round * GROUP_COMMIT_BODY_BYTES) as u64,
        elapsed: fsync.elapsed,
    };
    log(&format!(
        "  fsync ceiling: {:.0} write+fdatasync rounds/s before the run, {:.0} after, {:.0} \
         together x {per_round} = {:.0} msgs/s allowed; group commit reached {:.2} of it",
        before.ops_per_sec(),
        after.ops_per_sec(),
        fsync.ops_per_sec(),
        allowed.ops_per_sec(),
        rate.ops_per_sec() / allowed.ops_per_sec().max(1e-9)
    ));
    let duration = plan.fsync_ceiling.duration;
    let simplest = tokio::task::spawn_blocking(move || {
        minimal_server::group_commit(
            &scratch,
            GROUP_COMMIT_BODY_BYTES + RECORD_OVERHEAD_BYTES,
            per_round,
            duration,
        )
    })
    .await
    .context("minimal server panicked")?
    .context("minimal server")?;
    log(&format!(
        "  {MINIMAL_SERVER}: {:.0} msgs/s = {:.2} of the fsync ceiling",
        simplest.ops_per_sec(),
        simplest.ops_per_sec() / allowed.ops_per_sec().max(1e-9)
    ));
    // Counted in bodies, as the rows beside it, though each request carries a record's bytes.
    let simplest = Rate {
        bytes: simplest.ops * GROUP_COMMIT_BODY_BYTES as u64,
        ..simplest
    };
    Ok(vec![
        throughput(GROUP_COMMIT.to_owned(), &rate),
        throughput(FSYNC_CEILING.to_owned(), &allowed),
        throughput(MINIMAL_SERVER.to_owned(), &simplest),
    ])
}

/// write(`record`) + fdatasync rounds into a fresh file under `scratch`, within `bounds`.
async fn fsync_rounds(
    scratch: &std::path::Path,
    record: &[u8],
    bounds: Bounds,
) -> anyhow::Result<Rate> {
    let (scratch, record) = (scratch.to_owned(), record.to_owned());
    let (rate, _) = tokio::task::spawn_blocking(move || {
        ceilings::write_fdatasync(&scratch, &record, bounds, ceilings::Blocks::Appended)
    })
    .await
    .context("fsync ceiling task panicked")?
    .context("fsync ceiling")?;
    Ok(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrival_carries_the_stamp_of_the_body() {
        let (sender, mut receiver) = mpsc::unbounded_channel();
        let mut body = vec![0u8; 32];
        body[..8].copy_from_slice(&42u64.to_le_bytes());
        record_arrival(&sender, &body);
        let (sent, arrived) = receiver.try_recv().expect("one arrival");
        assert_eq!(sent, 42);
        assert!(arrived <= now_nanos());
        // A body too short to carry a stamp is not counted as an arrival.
        record_arrival(&sender, &[1, 2, 3]);
        assert!(receiver.try_recv().is_err());
    }

    #[test]
    fn large_bodies_get_fewer_messages_per_run() {
        let plan = Plan {
            sizes: vec![1024],
            messages: 1000,
            max_bytes_per_run: 1 << 20,
            run_time: Duration::from_secs(1),
            producer_counts: vec![1],
            batch: 8,
            window: 2,
            e2e_rate_per_sec: 100,
            e2e_body_bytes: 1024,
            e2e_time: Duration::from_secs(1),
            e2e_warmup: Duration::ZERO,
            parked_pull: ParkedPullPlan {
                repeats: 1,
                time_bound: Duration::from_secs(1),
                suspend: Duration::from_secs(1),
                park_pause: Duration::from_millis(2),
                body_bytes: 1024,
            },
            cpu_hog: false,
            group_commit: false,
            fsync_ceiling: Bounds {
                duration: Duration::from_secs(1),
                max_ops: 1,
                max_bytes: u64::MAX,
            },
            stored_before_memory: 0,
            top_up_time: Duration::from_secs(1),
        };
        assert_eq!(plan.messages_for(128), 1000);
        assert_eq!(plan.messages_for(16384), 64);
        assert_eq!(plan.messages_for(8 << 20), 1);
    }

    #[test]
    fn latency_figures_sort_and_name_three_quantiles() {
        let figures = latency_figures(PARKED_PULL, vec![300, 100, 200], &|_: &str| {});
        let named: Vec<(&str, f64)> = figures
            .iter()
            .map(|f| (f.workload.as_str(), f.value))
            .collect();
        assert_eq!(
            named,
            [
                ("parked pull answered after the send, p50 latency", 200.0),
                ("parked pull answered after the send, p99 latency", 300.0),
                ("parked pull answered after the send, p999 latency", 300.0),
            ]
        );
        assert!(figures.iter().all(|f| f.measure == Measure::LatencyMicros));
    }

    #[test]
    fn pattern_body_has_the_size_and_does_not_repeat_one_byte() {
        let body = pattern_body(1024);
        assert_eq!(body.len(), 1024);
        assert!(body.iter().any(|&b| b != body[0]));
    }
}
