//! Batch produce: one standalone broker with async flush against the replicated group with
//! sync replication, the same client, batch and producer counts (the peers bench's produce).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_client::{Message, Producer, ProducerConfig};

use crate::measure::{Bounds, Rate};
use crate::peers::rocketmq::RocketMqSystem;
use crate::peers::workload::{self, ParkedPullPlan, Plan, SendMode, System as _};
use crate::replication::group::{Brokers, GroupSpec};

/// Body size of every produce run.
pub const BODY_BYTES: usize = 1024;

/// How much one produce run does.
#[derive(Clone, Debug)]
pub struct ProducePlan {
    pub messages: u64,
    pub run_time: Duration,
    pub batch: usize,
    pub producers: Vec<u32>,
    pub queues: u32,
}

/// One produce figure: (producers, rate, the cores each process used meanwhile).
pub type ProduceRates = Vec<(u32, Rate, String)>;

/// The single broker's and the group's rates, producer count by producer count.
pub struct ProduceOutcome {
    pub single: ProduceRates,
    pub group: ProduceRates,
}

/// The peers bench's plan with only what a batch produce run reads filled in.
fn peers_plan(plan: &ProducePlan) -> Plan {
    Plan {
        sizes: vec![BODY_BYTES],
        messages: plan.messages,
        max_bytes_per_run: 256 << 20,
        run_time: plan.run_time,
        producer_counts: plan.producers.clone(),
        batch: plan.batch,
        window: 1,
        e2e_rate_per_sec: 0,
        e2e_body_bytes: BODY_BYTES,
        e2e_time: Duration::ZERO,
        e2e_warmup: Duration::ZERO,
        parked_pull: ParkedPullPlan {
            repeats: 0,
            time_bound: Duration::ZERO,
            suspend: Duration::ZERO,
            park_pause: Duration::ZERO,
            body_bytes: BODY_BYTES,
        },
        cpu_hog: false,
        group_commit: false,
        fsync_ceiling: Bounds {
            duration: Duration::ZERO,
            max_ops: 0,
            max_bytes: 0,
        },
        stored_before_memory: 0,
        top_up_time: Duration::ZERO,
    }
}

/// Sends one message to `topic` through `name_servers` until a send is acknowledged (the
/// group's master took its first write), at most `timeout`.
pub async fn first_send(name_servers: &str, topic: &str, timeout: Duration) -> anyhow::Result<()> {
    let mut config = ProducerConfig::new(name_servers);
    config.send_timeout = Duration::from_secs(2);
    let producer = Producer::new(config);
    let deadline = Instant::now() + timeout;
    let outcome = loop {
        let sent = producer
            .send(Message::new(topic, Bytes::from_static(b"warm-up")))
            .await;
        match sent {
            Ok(_) => break Ok(()),
            Err(error) if Instant::now() >= deadline => {
                break Err(error).context(format!("no send to {topic} acknowledged in {timeout:?}"))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    producer.shutdown().await;
    outcome
}

/// The batch produce runs against one started broker (or group), one topic per run.
async fn produce_runs(
    brokers: &Brokers,
    master: Option<u64>,
    name_servers: String,
    label: &str,
    plan: &ProducePlan,
    log: &impl Fn(&str),
) -> anyhow::Result<ProduceRates> {
    let system = Arc::new(RocketMqSystem {
        name_server: name_servers.clone(),
        queues_per_topic: plan.queues,
        pull_batch: 256,
    });
    let peers = peers_plan(plan);
    let mut rates = Vec::new();
    for &producers in &plan.producers {
        let stream = format!("bench_repl_produce_{producers}");
        system.prepare(&stream).await?;
        first_send(&name_servers, &stream, Duration::from_secs(20)).await?;
        let cpu_before = brokers.cpu();
        let rate = workload::produce(
            &system,
            &stream,
            BODY_BYTES,
            producers,
            SendMode::Batch,
            &peers,
        )
        .await
        .with_context(|| format!("{label}: producing to {stream}"))?;
        let cores = brokers.cpu().cores_since(&cpu_before, master);
        log(&format!(
            "  {label}, {producers} producer(s), batch {}: {:.0} msgs/s, {:.1} MB/s ({} in {:.2} s; {cores})",
            plan.batch,
            rate.ops_per_sec(),
            rate.mb_per_sec(),
            rate.ops,
            rate.elapsed.as_secs_f64()
        ));
        if rate.ops == 0 {
            bail!("{label}: nothing was produced to {stream}");
        }
        rates.push((producers, rate, cores));
    }
    Ok(rates)
}

/// The single broker alone, then the group alone (each from empty dirs, stopped after).
pub async fn run(
    binary: &Path,
    scratch: &Path,
    log_dir: &Path,
    spec: &GroupSpec,
    plan: &ProducePlan,
    log: &impl Fn(&str),
) -> anyhow::Result<ProduceOutcome> {
    let single = {
        let brokers = Brokers::start_single(binary, &scratch.join("produce-single"), log_dir)?;
        let addr = brokers.member(0).addr.to_string();
        let label = "single broker, async flush";
        produce_runs(&brokers, None, addr, label, plan, log)
            .await
            .map_err(|e| e.context(format!("log tail:\n{}", brokers.log_tails(5))))?
    };
    let group = {
        let brokers = Brokers::start_group(binary, &scratch.join("produce-group"), log_dir, spec)?;
        let (master, epoch) = brokers.wait_all_in_sync(Duration::from_secs(60)).await?;
        log(&format!(
            "  group: member {master} is the master of epoch {epoch}, all in sync"
        ));
        let label = format!("3-member group, {} replication", spec.replication);
        produce_runs(
            &brokers,
            Some(master),
            brokers.name_servers(),
            &label,
            plan,
            log,
        )
        .await
        .map_err(|e| e.context(format!("log tails:\n{}", brokers.log_tails(5))))?
    };
    Ok(ProduceOutcome { single, group })
}
