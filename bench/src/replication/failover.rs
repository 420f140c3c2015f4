//! Failover: a sender sends 1 KiB messages one at a time to whoever the group's route names
//! master; each round stops the master, by `kill -9` (an election after the master timeout) or
//! by SIGTERM (a controlled shutdown: it hands mastership over first), and times the signal to
//! the first SEND_OK answered by another member, then restarts the stopped member on its dir
//! and ports and waits until the master counts it in sync again.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quiver_client::{Message, Producer, ProducerConfig, SendStatus};
use tokio::sync::mpsc;

use crate::peers::rocketmq::RocketMqSystem;
use crate::peers::workload::{pattern_body, System as _};
use crate::replication::group::{Brokers, GroupSpec};
use crate::replication::produce::{first_send, BODY_BYTES};

const TOPIC: &str = "bench_repl_failover";
/// Pause after a failed send before the next one (the producer looks the route up again).
const RETRY_PAUSE: Duration = Duration::from_millis(5);
/// Deadline of one send attempt (a send to a dead or refusing member fails sooner).
const SEND_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the live members' /metrics are read for a new master during a failover.
const POLL: Duration = Duration::from_millis(50);

/// How a round stops the master.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// `kill -9`: the group elects after the master timeout.
    Kill,
    /// SIGTERM: the master hands over to an in-sync replica, then exits.
    Term,
}

impl Stop {
    pub fn signal(self) -> &'static str {
        match self {
            Stop::Kill => "kill -9",
            Stop::Term => "SIGTERM",
        }
    }
}

/// How long each part of a round may take at most.
#[derive(Clone, Copy, Debug)]
pub struct FailoverPlan {
    pub rounds: u32,
    /// Kill to the first acknowledged send on another member.
    pub ack_bound: Duration,
    /// Restart to all members in sync.
    pub resync_bound: Duration,
    /// The whole scenario.
    pub time_bound: Duration,
}

/// One kill.
#[derive(Clone, Debug)]
pub struct Round {
    pub round: u32,
    pub killed: u64,
    pub new_master: Option<u64>,
    /// When the kill was sent, UTC (to find it in the brokers' logs).
    pub killed_at_utc: String,
    /// Kill to a live member's /metrics naming it master (polled every 50 ms).
    pub elected: Option<Duration>,
    /// Kill to the first SEND_OK answered by another member; None: not within the bound.
    pub first_ack: Option<Duration>,
    /// Sends that failed between the kill and that SEND_OK.
    pub failed_sends: u64,
    /// The killed member's restart to all members in sync again.
    pub resync: Option<Duration>,
    /// Whether the stopped master led its group's consensus (None: its /metrics did not say).
    pub led_consensus: Option<bool>,
    /// SIGTERM rounds: the stopped master's exit code (None: a signal ended it, or it did
    /// not exit within the bound); kill -9 rounds: None.
    pub exit_code: Option<i32>,
    /// Why the sends failed: error text (addresses and numbers kept) and how often.
    pub errors: Vec<(String, u64)>,
    /// (member, epoch) that called itself master while the killed member rejoined, besides
    /// the group's master (a restarted member reporting its old role).
    pub stale_claims: Vec<(u64, u64)>,
    /// Sends acknowledged by the restarted member before all were in sync again.
    pub acks_from_restarted: u64,
}

pub struct FailoverOutcome {
    pub rounds: Vec<Round>,
    /// Rounds not run, and why (the scenario's time bound or an error).
    pub stopped_early: Option<String>,
}

/// An acknowledged send: when it was issued and answered, and the answering member's port.
struct Ack {
    issued: Instant,
    answered: Instant,
    port: Option<u16>,
}

/// The store host's port in an offset message id (IPv4: 8 hex digits of address, 8 of port).
fn store_port(offset_msg_id: &str) -> Option<u16> {
    let hex = offset_msg_id.get(8..16)?;
    u32::from_str_radix(hex, 16)
        .ok()
        .and_then(|p| u16::try_from(p).ok())
}

/// What the sender shares with the rounds.
#[derive(Default)]
struct SenderState {
    stop: AtomicBool,
    failures: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends one message at a time until told to stop (or `deadline`): every SEND_OK goes to
/// `acks`, every failure is counted; the producer refetches the route after a failure.
async fn sender(
    producer: Producer,
    state: Arc<SenderState>,
    acks: mpsc::UnboundedSender<Ack>,
    deadline: Instant,
) {
    let body = pattern_body(BODY_BYTES);
    while !state.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
        let issued = Instant::now();
        let sent = producer.send(Message::new(TOPIC, body.clone())).await;
        match sent {
            Ok(result) if result.status == SendStatus::Ok => {
                let ack = Ack {
                    issued,
                    answered: Instant::now(),
                    port: store_port(&result.offset_msg_id),
                };
                if acks.send(ack).is_err() {
                    return;
                }
            }
            outcome => {
                state.failures.fetch_add(1, Ordering::Relaxed);
                let error = match outcome {
                    Ok(result) => format!("send answered {:?}", result.status),
                    Err(error) => error.to_string(),
                };
                let error: String = error.chars().take(200).collect();
                *lock(&state.errors).entry(error).or_default() += 1;
                tokio::time::sleep(RETRY_PAUSE).await;
            }
        }
    }
}

/// Starts a group, runs the rounds, stops it.
pub async fn run(
    binary: &Path,
    scratch: &Path,
    log_dir: &Path,
    spec: &GroupSpec,
    plan: &FailoverPlan,
    how: Stop,
    log: &impl Fn(&str),
) -> anyhow::Result<FailoverOutcome> {
    let dir = match how {
        Stop::Kill => "failover",
        Stop::Term => "shutdown",
    };
    let mut brokers = Brokers::start_group(binary, &scratch.join(dir), log_dir, spec)?;
    let (master, epoch) = brokers.wait_all_in_sync(Duration::from_secs(60)).await?;
    log(&format!(
        "  group: member {master} is the master of epoch {epoch}, all in sync"
    ));
    let name_servers = brokers.name_servers();
    let system = RocketMqSystem {
        name_server: name_servers.clone(),
        queues_per_topic: 4,
        pull_batch: 32,
    };
    system.prepare(TOPIC).await?;
    first_send(&name_servers, TOPIC, Duration::from_secs(20)).await?;

    let mut config = ProducerConfig::new(&name_servers);
    config.send_timeout = SEND_TIMEOUT;
    config.client = config.client.with_request_timeout(SEND_TIMEOUT);
    config.retries = 0;
    let producer = Producer::new(config);
    let state = Arc::new(SenderState::default());
    let (acks_tx, mut acks) = mpsc::unbounded_channel();
    let started = Instant::now();
    let sending = tokio::spawn(sender(
        producer.clone(),
        state.clone(),
        acks_tx,
        started + plan.time_bound + plan.ack_bound + plan.resync_bound,
    ));
    let mut rounds = Vec::new();
    let mut stopped_early = None;
    for number in 1..=plan.rounds {
        if started.elapsed() >= plan.time_bound {
            stopped_early = Some(format!(
                "the scenario's time bound ({:?}) passed after {} round(s)",
                plan.time_bound,
                number - 1
            ));
            break;
        }
        match round(&mut brokers, number, plan, how, &state, &mut acks).await {
            Ok(round) => {
                log(&describe(&round));
                rounds.push(round);
            }
            Err(error) => {
                stopped_early = Some(format!("round {number}: {error:#}"));
                break;
            }
        }
    }
    state.stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(SEND_TIMEOUT * 3, sending).await;
    producer.shutdown().await;
    Ok(FailoverOutcome {
        rounds,
        stopped_early,
    })
}

/// One line per round, as it ends.
pub fn describe(round: &Round) -> String {
    let ms = |d: Option<Duration>| d.map_or("—".into(), |d| format!("{} ms", d.as_millis()));
    let exit = match (round.exit_code, round.led_consensus) {
        (Some(code), led) => format!(
            " (exit code {code}{})",
            if led == Some(true) {
                ", it led the consensus"
            } else {
                ""
            }
        ),
        (None, _) => String::new(),
    };
    format!(
        "  round {} (signal at {}): stopped member {}{exit}, new master {}, named after {}, first SEND_OK after {}, {} failed sends, back in sync {} after its restart{}",
        round.round,
        round.killed_at_utc,
        round.killed,
        round.new_master.map_or("—".into(), |m| m.to_string()),
        ms(round.elected),
        ms(round.first_ack),
        round.failed_sends,
        ms(round.resync),
        if round.stale_claims.is_empty() && round.acks_from_restarted == 0 {
            String::new()
        } else {
            format!(
                "; while it rejoined, (member, epoch) {:?} also called itself master, {} send(s) acknowledged by it",
                round.stale_claims, round.acks_from_restarted
            )
        }
    )
}

/// Now as `HH:MM:SS.mmm` UTC, the brokers' log format.
fn utc_now() -> String {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = since_epoch.as_secs();
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        secs / 3600 % 24,
        secs / 60 % 60,
        secs % 60,
        since_epoch.subsec_millis()
    )
}

/// Waits (10 s at most) until master `master`, on `master_port`, acknowledges a send.
async fn acked_by(
    acks: &mut mpsc::UnboundedReceiver<Ack>,
    master: u64,
    master_port: u16,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, acks.recv()).await {
            Ok(Some(ack)) if ack.port == Some(master_port) => return Ok(()),
            Ok(Some(_)) => {}
            Ok(None) => anyhow::bail!("the sender stopped"),
            Err(_) => anyhow::bail!("no send acknowledged by master {master} within 10 s"),
        }
    }
}

/// Restarts the killed `master` and waits for the group to be in sync again: how long that
/// took (None: not within the bound), the stale master claims seen meanwhile, and how many
/// sends the restarted member acknowledged (as a master it no longer is).
async fn restart(
    brokers: &mut Brokers,
    master: u64,
    master_port: u16,
    plan: &FailoverPlan,
    acks: &mut mpsc::UnboundedReceiver<Ack>,
) -> anyhow::Result<(Option<Duration>, Vec<(u64, u64)>, u64)> {
    let restarted_at = Instant::now();
    brokers.start(master)?;
    let mut stale_claims = Vec::new();
    let resync = match brokers
        .wait_all_in_sync_watching(plan.resync_bound, &mut stale_claims)
        .await
    {
        Ok(_) => Some(restarted_at.elapsed()),
        Err(_) => None,
    };
    let mut acks_from_restarted = 0;
    while let Ok(ack) = acks.try_recv() {
        if ack.port == Some(master_port) && ack.issued >= restarted_at {
            acks_from_restarted += 1;
        }
    }
    Ok((resync, stale_claims, acks_from_restarted))
}

async fn round(
    brokers: &mut Brokers,
    number: u32,
    plan: &FailoverPlan,
    how: Stop,
    state: &SenderState,
    acks: &mut mpsc::UnboundedReceiver<Ack>,
) -> anyhow::Result<Round> {
    let (master, epoch) = brokers.wait_all_in_sync(plan.resync_bound).await?;
    let master_port = brokers.member(master).addr.port();
    // The sender is writing to this master before it is killed.
    acked_by(acks, master, master_port).await?;
    while acks.try_recv().is_ok() {}
    let failures_before = state.failures.load(Ordering::Relaxed);
    lock(&state.errors).clear();

    let led_consensus = brokers.leads_consensus(master).await;
    let killed_at_utc = utc_now();
    let killed_at = match how {
        Stop::Kill => brokers.kill(master),
        Stop::Term => brokers.terminate(master),
    };
    let ack_deadline = killed_at + plan.ack_bound;
    let mut elected = None;
    let mut first_ack = None;
    let mut new_master = None;
    let mut poll = tokio::time::interval(POLL);
    while first_ack.is_none() && Instant::now() < ack_deadline {
        tokio::select! {
            ack = acks.recv() => match ack {
                Some(ack) if ack.issued >= killed_at && ack.port.is_some_and(|p| p != master_port) => {
                    first_ack = Some(ack.answered.duration_since(killed_at));
                    new_master = brokers.members.iter().find(|m| Some(m.addr.port()) == ack.port).map(|m| m.id);
                }
                Some(_) => {}
                None => anyhow::bail!("the sender stopped"),
            },
            _ = poll.tick(), if elected.is_none() => {
                if brokers.new_master(master, epoch).await.is_some() {
                    elected = Some(killed_at.elapsed());
                }
            }
            _ = tokio::time::sleep_until(ack_deadline.into()) => {}
        }
    }
    // A member answered as master: it was named by then, if a poll had not seen it yet.
    if elected.is_none() {
        elected = first_ack;
    }
    let failed_sends = state.failures.load(Ordering::Relaxed) - failures_before;
    let errors = std::mem::take(&mut *lock(&state.errors))
        .into_iter()
        .collect();
    let exit_code = match how {
        Stop::Kill => None,
        Stop::Term => brokers.wait_exit(master, plan.ack_bound).await,
    };

    let (resync, stale_claims, acks_from_restarted) =
        restart(brokers, master, master_port, plan, acks).await?;
    Ok(Round {
        killed_at_utc,
        round: number,
        killed: master,
        new_master,
        elected,
        first_ack,
        failed_sends,
        resync,
        led_consensus,
        exit_code,
        errors,
        stale_claims,
        acks_from_restarted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_port_is_read_from_an_ipv4_offset_message_id() {
        // 127.0.0.1:10911, offset 0x1234.
        let id = "7F00000100002A9F0000000000001234";
        assert_eq!(store_port(id), Some(10911));
        assert_eq!(store_port("short"), None);
    }
}
