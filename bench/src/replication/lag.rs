//! Replication lag at a steady rate: a producer on the master sends 1 KiB messages in small
//! batches paced by the clock (not by acknowledgements), each body stamped with its send
//! time; a long-polling pull consumer on a replica reads them as the replica serves them.
//! Lag = the pull answer's arrival minus the stamp. Beside it: how long each sync batch waited
//! for its SEND_OK, and the master's own `quiver_replication_lag_seconds`, sampled.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_client::ops::PullSpec;
use quiver_client::{
    ClientConfig, ClientCore, Message, MessageQueue, Producer, ProducerConfig, PullStatus,
    QueueOffset, SendStatus, Subscription,
};
use tokio::sync::mpsc;

use crate::peers::rocketmq::RocketMqSystem;
use crate::peers::workload::{now_nanos, pattern_body, record_arrival, Arrival, System as _};
use crate::replication::group::{Brokers, GroupSpec};
use crate::replication::observe::Metrics;
use crate::replication::produce::{first_send, BODY_BYTES};

const TOPIC: &str = "bench_repl_lag";
const GROUP: &str = "bench_repl_lag";
/// How long a pull on the replica is held when nothing is readable.
const LONG_POLL: Duration = Duration::from_millis(500);
/// Messages asked for per pull.
const PULL_BATCH: u32 = 256;
/// How often the master's /metrics is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// How long arrivals are awaited after the last send.
const DRAIN: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
pub struct LagPlan {
    pub rate_per_sec: u64,
    pub time: Duration,
    /// Messages per batch send (one batch per tick carries what is due).
    pub batch: u64,
    /// Leading part of the run left out of the percentiles.
    pub warmup: Duration,
    pub queues: u32,
    /// Producer connections the batches take turns on.
    pub producers: u32,
}

pub struct LagOutcome {
    pub replica: u64,
    pub sent: u64,
    pub acknowledged: u64,
    pub failed_batches: u64,
    /// Sent messages over the pacing loop's time.
    pub sent_per_sec: f64,
    /// Acknowledged messages over the time to the last acknowledgement.
    pub acked_per_sec: f64,
    /// Arrived on the replica (all, warm-up included).
    pub arrived: u64,
    /// Pulls that failed (each retried 10 ms later).
    pub pull_errors: u64,
    /// Lag of each message after the warm-up, microseconds, sorted.
    pub lag_micros: Vec<u64>,
    /// Each batch's send to its SEND_OK, microseconds, sorted (after the warm-up).
    pub ack_micros: Vec<u64>,
    /// The master's highest `quiver_replication_lag_seconds` per sample, milliseconds, sorted.
    pub master_lag_ms: Vec<f64>,
    /// The master's highest `quiver_replication_lag_bytes` over the samples.
    pub master_lag_bytes_max: f64,
    /// Cores each process used from the first send to the last acknowledgement.
    pub cores: String,
}

pub async fn run(
    binary: &Path,
    scratch: &Path,
    log_dir: &Path,
    spec: &GroupSpec,
    plan: &LagPlan,
    log: &impl Fn(&str),
) -> anyhow::Result<LagOutcome> {
    let brokers = Brokers::start_group(binary, &scratch.join("lag"), log_dir, spec)?;
    let outcome = measure(&brokers, plan, log).await;
    outcome.map_err(|e| e.context(format!("log tails:\n{}", brokers.log_tails(8))))
}

async fn measure(
    brokers: &Brokers,
    plan: &LagPlan,
    log: &impl Fn(&str),
) -> anyhow::Result<LagOutcome> {
    let (master, _) = brokers.wait_all_in_sync(Duration::from_secs(60)).await?;
    let replica = (0..brokers.members.len() as u64)
        .find(|id| *id != master)
        .context("a group without a replica")?;
    log(&format!(
        "  group: member {master} is the master, all in sync; the consumer pulls from member {replica}"
    ));
    let master_addr = brokers.member(master).addr.to_string();
    let replica_addr = brokers.member(replica).addr.to_string();
    let system = RocketMqSystem {
        name_server: master_addr.clone(),
        queues_per_topic: plan.queues,
        pull_batch: PULL_BATCH,
    };
    system.prepare(TOPIC).await?;
    first_send(&master_addr, TOPIC, Duration::from_secs(20)).await?;

    // The consumer: the route from the replica, every pull to the replica.
    let core = ClientCore::new(
        ClientConfig::new(&replica_addr).with_request_timeout(Duration::from_secs(5)),
    );
    let queues = wait_queues(&core, plan.queues, log).await?;
    let total = (plan.rate_per_sec as f64 * plan.time.as_secs_f64()) as u64;
    let stop = Arc::new(AtomicBool::new(false));
    let pull_errors = Arc::new(AtomicU64::new(0));
    let (arrivals_tx, mut arrivals_rx) = mpsc::unbounded_channel();
    let mut pulls = tokio::task::JoinSet::new();
    for queue in queues {
        let (core, addr, stop, errors, arrivals) = (
            core.clone(),
            replica_addr.clone(),
            stop.clone(),
            pull_errors.clone(),
            arrivals_tx.clone(),
        );
        pulls.spawn(follow(core, addr, queue, (stop, errors), arrivals));
    }
    drop(arrivals_tx);
    let sampler = tokio::spawn(sample(brokers.member(master).http, stop.clone()));

    let cpu_before = brokers.cpu();
    let paced = send_paced(&master_addr, plan, total).await;
    let cores = brokers.cpu().cores_since(&cpu_before, Some(master));
    let arrivals = drain(&mut arrivals_rx, total, paced.acked).await;
    stop.store(true, Ordering::Relaxed);
    pulls.abort_all();
    while pulls.join_next().await.is_some() {}
    let samples = sampler.await.context("the metrics sampler panicked")?;
    core.shutdown().await;
    if arrivals.is_empty() {
        bail!(
            "none of {} acknowledged messages arrived on replica {replica}",
            paced.acked
        );
    }

    let pull_errors = pull_errors.load(Ordering::Relaxed);
    Ok(outcome(
        plan,
        replica,
        &paced,
        &arrivals,
        &samples,
        pull_errors,
        cores,
    ))
}

/// Waits up to DRAIN for `acked` arrivals (room for `total`), then takes what else came.
async fn drain(
    arrivals_rx: &mut mpsc::UnboundedReceiver<Arrival>,
    total: u64,
    acked: u64,
) -> Vec<Arrival> {
    let drain_deadline = Instant::now() + DRAIN;
    let mut arrivals = Vec::with_capacity(total as usize);
    while (arrivals.len() as u64) < acked && Instant::now() < drain_deadline {
        let remaining = drain_deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, arrivals_rx.recv()).await {
            Ok(Some(arrival)) => arrivals.push(arrival),
            Ok(None) | Err(_) => break,
        }
    }
    while let Ok(arrival) = arrivals_rx.try_recv() {
        arrivals.push(arrival);
    }
    arrivals
}

/// The run's figures: lag and acknowledgement times past the warm-up, sorted, and the
/// master's own lag samples.
fn outcome(
    plan: &LagPlan,
    replica: u64,
    paced: &Paced,
    arrivals: &[Arrival],
    samples: &[(f64, f64)],
    pull_errors: u64,
    cores: String,
) -> LagOutcome {
    let warmup_end = paced.started_nanos + plan.warmup.as_nanos() as u64;
    let mut lag_micros: Vec<u64> = arrivals
        .iter()
        .filter(|(sent, _)| *sent >= warmup_end)
        .map(|(sent, arrived)| arrived.saturating_sub(*sent) / 1_000)
        .collect();
    lag_micros.sort_unstable();
    let mut ack_micros: Vec<u64> = paced
        .acks
        .iter()
        .filter(|(sent, _)| *sent >= warmup_end)
        .map(|(_, micros)| *micros)
        .collect();
    ack_micros.sort_unstable();
    let mut master_lag_ms: Vec<f64> = samples.iter().map(|(seconds, _)| seconds * 1e3).collect();
    master_lag_ms.sort_by(f64::total_cmp);
    let master_lag_bytes_max = samples.iter().map(|(_, b)| *b).fold(0.0, f64::max);
    LagOutcome {
        replica,
        sent: paced.sent,
        acknowledged: paced.acked,
        failed_batches: paced.failed_batches,
        sent_per_sec: paced.sent as f64 / paced.pacing.as_secs_f64().max(1e-9),
        acked_per_sec: paced.acked as f64 / paced.until_last_ack.as_secs_f64().max(1e-9),
        arrived: arrivals.len() as u64,
        pull_errors,
        lag_micros,
        ack_micros,
        master_lag_ms,
        master_lag_bytes_max,
        cores,
    }
}

/// The topic's readable queues as the replica's route gives them once it copied the master's
/// topic (about once a second): until then its route may offer other queues (the auto-create
/// default), which it then refuses to serve.
async fn wait_queues(
    core: &ClientCore,
    expected: u32,
    log: &impl Fn(&str),
) -> anyhow::Result<Vec<MessageQueue>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut other_counts = Vec::new();
    loop {
        let route = core.fetch_route(TOPIC).await;
        match &route {
            Ok(route) if route.read_queues.len() == expected as usize => {
                if !other_counts.is_empty() {
                    log(&format!(
                        "  (the replica's route of {TOPIC} first offered {other_counts:?} read queues, then the topic's {expected})"
                    ));
                }
                return Ok(route.read_queues.clone());
            }
            Ok(route) => {
                let count = route.read_queues.len();
                if !other_counts.contains(&count) {
                    other_counts.push(count);
                }
            }
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            let found = route.map(|r| r.read_queues.len());
            bail!("the replica's route of {TOPIC} has not {expected} read queues after 20 s: {found:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Long-polls one queue on the replica from offset 0 until stopped; each 1 KiB body's stamp
/// and its arrival go to `arrivals` (the warm-up send's short body does not).
async fn follow(
    core: Arc<ClientCore>,
    replica: String,
    queue: MessageQueue,
    (stop, errors): (Arc<AtomicBool>, Arc<AtomicU64>),
    arrivals: mpsc::UnboundedSender<Arrival>,
) -> anyhow::Result<()> {
    let subscription = Subscription::new(TOPIC, "*");
    let mut offset = QueueOffset(0);
    while !stop.load(Ordering::Relaxed) {
        let spec = PullSpec {
            group: GROUP,
            queue: &queue,
            offset,
            max_messages: PULL_BATCH,
            subscription: &subscription,
            commit_offset: None,
            suspend: Some(LONG_POLL),
            epoch: None,
        };
        let result = match core.pull_from(&replica, &spec).await {
            Ok(result) => result,
            Err(_) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if let PullStatus::Found(messages) = &result.status {
            for message in messages.iter().filter(|m| m.body.len() == BODY_BYTES) {
                record_arrival(&arrivals, &message.body);
            }
        }
        offset = offset.max(result.next_begin_offset);
    }
    Ok(())
}

/// The master's highest lag (seconds, bytes) over its replicas, every [`SAMPLE_EVERY`].
async fn sample(http: std::net::SocketAddr, stop: Arc<AtomicBool>) -> Vec<(f64, f64)> {
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        if let Ok(metrics) = Metrics::read(http).await {
            let seconds = metrics.lag.iter().map(|(_, _, s)| *s).fold(0.0, f64::max);
            let bytes = metrics.lag.iter().map(|(_, b, _)| *b).fold(0.0, f64::max);
            samples.push((seconds, bytes));
        }
    }
    samples
}

struct Paced {
    started_nanos: u64,
    sent: u64,
    acked: u64,
    failed_batches: u64,
    pacing: Duration,
    until_last_ack: Duration,
    /// (send stamp, send to SEND_OK in µs) per acknowledged batch.
    acks: Vec<(u64, u64)>,
}

/// Sends `total` stamped 1 KiB messages at `plan.rate_per_sec`: every 1 ms tick, what is due
/// goes out in batches of at most `plan.batch`, each on its own task (a slow acknowledgement
/// does not hold the schedule back), the batches taking turns on `plan.producers` connections.
async fn send_paced(master: &str, plan: &LagPlan, total: u64) -> Paced {
    let producers: Vec<Producer> = (0..plan.producers.max(1))
        .map(|_| {
            let mut config = ProducerConfig::new(master);
            config.send_timeout = Duration::from_secs(10);
            config.retries = 0;
            Producer::new(config)
        })
        .collect();
    let mut turn = 0usize;
    let template = pattern_body(BODY_BYTES);
    let failed = Arc::new(AtomicU64::new(0));
    let (acks_tx, mut acks_rx) = mpsc::unbounded_channel::<(u64, u64, u64)>();
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let started_nanos = now_nanos();
    let mut sent = 0u64;
    let mut sends = tokio::task::JoinSet::new();
    while sent < total && started.elapsed() < plan.time + Duration::from_secs(5) {
        ticker.tick().await;
        let due = ((started.elapsed().as_secs_f64() * plan.rate_per_sec as f64) as u64).min(total);
        while sent < due {
            let n = plan.batch.max(1).min(due - sent);
            let stamp = now_nanos();
            let messages: Vec<Message> = (0..n)
                .map(|_| {
                    let mut body = template.to_vec();
                    body[..8].copy_from_slice(&stamp.to_le_bytes());
                    Message::new(TOPIC, Bytes::from(body))
                })
                .collect();
            let producer = producers[turn % producers.len()].clone();
            turn += 1;
            let (failed, acks) = (failed.clone(), acks_tx.clone());
            sends.spawn(async move {
                match producer.send_batch(messages).await {
                    Ok(result) if result.status == SendStatus::Ok => {
                        let _ = acks.send((stamp, (now_nanos() - stamp) / 1_000, n));
                    }
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
            sent += n;
        }
        while sends.try_join_next().is_some() {}
    }
    let pacing = started.elapsed();
    while sends.join_next().await.is_some() {}
    let until_last_ack = started.elapsed();
    drop(acks_tx);
    let mut acks = Vec::new();
    let mut acked = 0;
    while let Some((stamp, micros, n)) = acks_rx.recv().await {
        acks.push((stamp, micros));
        acked += n;
    }
    for producer in producers {
        producer.shutdown().await;
    }
    Paced {
        started_nanos,
        sent,
        acked,
        failed_batches: failed.load(Ordering::Relaxed),
        pacing,
        until_last_ack,
        acks,
    }
}
