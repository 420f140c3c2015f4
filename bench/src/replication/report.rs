//! One markdown table per run: each scenario's rows, absolute figures, ratios and the issue's
//! targets beside them; then every failover and shutdown round.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use quiver_bench::percentile;

use crate::measure::Rate;
use crate::replication::failover::{FailoverOutcome, Round};
use crate::replication::group::GroupSpec;
use crate::replication::lag::LagOutcome;
use crate::replication::produce::ProduceOutcome;
use crate::replication::Plans;

/// The group's batch produce rate over the single broker's (issue 39: 0.6).
const PRODUCE_RATIO_TARGET: f64 = 0.6;
/// Kill to the first acknowledged send on the new master, p99 (issue 26's target).
const FAILOVER_TARGET: Duration = Duration::from_secs(10);
/// SIGTERM of the master to the first acknowledged send on the new master, p99.
const SHUTDOWN_TARGET: Duration = Duration::from_secs(1);
/// Replica-visible lag p99 at 50k msgs/s (issue 39: 50 ms).
const LAG_TARGET_MS: f64 = 50.0;

/// Each scenario's outcome, or why it has none (None: not run).
#[derive(Default)]
pub struct Outcomes {
    pub produce: Option<Result<ProduceOutcome, String>>,
    pub failover: Option<Result<FailoverOutcome, String>>,
    /// The same rounds with SIGTERM instead of kill -9.
    pub shutdown: Option<Result<FailoverOutcome, String>>,
    pub lag: Option<Result<LagOutcome, String>>,
}

/// An error on one line.
pub fn reason(error: &anyhow::Error) -> String {
    let text = format!("{error:#}");
    eprintln!("  not measured: {text}");
    // The table keeps the first line (the log tails follow on the next ones), without pipes.
    let first = text.lines().next().unwrap_or_default().replace('|', "/");
    first.chars().take(400).collect()
}

/// The 1-minute load average: how quiet the machine was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".into())
}

fn rate(rate: &Rate) -> String {
    format!(
        "{:.1}k msgs/s, {:.1} MB/s",
        rate.ops_per_sec() / 1e3,
        rate.mb_per_sec()
    )
}

/// "0.62 (1.24x the target: met)" for higher-is-better figures.
fn at_least(value: f64, target: f64) -> String {
    let verdict = if value >= target { "met" } else { "short" };
    format!("{:.2}x the target: {verdict}", value / target)
}

/// The same for lower-is-better figures.
fn at_most(value: f64, target: f64) -> String {
    let verdict = if value <= target { "met" } else { "short" };
    format!("{:.2}x the target: {verdict}", value / target)
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

fn ms(micros: u64) -> String {
    format!("{:.2} ms", micros as f64 / 1e3)
}

pub fn render(plans: &Plans, spec: &GroupSpec, outcomes: &Outcomes, load: &str) -> String {
    let mut out = String::new();
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        out,
        "Run {date} on {cores} cores, every broker and the client on this machine (load average \
         {load}); group: 3 members of broker `group-a`, `--replication {} \
         --min-in-sync-replicas {}`{}; every broker `--flush-mode async`.\n",
        spec.replication,
        spec.min_in_sync,
        if spec.extra_args.is_empty() {
            String::new()
        } else {
            format!(" `{}`", spec.extra_args.join(" "))
        }
    );
    let _ = writeln!(out, "| row | figure | target | against the target |");
    let _ = writeln!(out, "|---|---:|---|---|");
    let mut row = |name: &str, figure: &str, target: &str, against: &str| {
        let _ = writeln!(out, "| {name} | {figure} | {target} | {against} |");
    };
    match &outcomes.produce {
        None => {}
        Some(Err(reason)) => row("produce", &format!("not measured: {reason}"), "", ""),
        Some(Ok(produce)) => {
            let batch = plans.produce.batch;
            for (producers, single, single_cores) in &produce.single {
                let name = format!("produce 1 KiB, batch {batch}, {producers} producer(s)");
                row(
                    &format!("{name}: single broker"),
                    &format!("{} ({single_cores})", rate(single)),
                    "",
                    "",
                );
                let group = produce.group.iter().find(|(p, _, _)| p == producers);
                if let Some((_, group, group_cores)) = group {
                    let label = format!("{name}: 3-member group, {} replication", spec.replication);
                    row(&label, &format!("{} ({group_cores})", rate(group)), "", "");
                    let ratio = group.ops_per_sec() / single.ops_per_sec().max(1e-9);
                    row(
                        &format!("{name}: group / single"),
                        &format!("{ratio:.2}"),
                        ">= 0.60",
                        &at_least(ratio, PRODUCE_RATIO_TARGET),
                    );
                }
            }
        }
    }
    match &outcomes.failover {
        None => {}
        Some(Err(reason)) => row("failover", &format!("not measured: {reason}"), "", ""),
        Some(Ok(failover)) => failover_rows(&mut row, failover),
    }
    match &outcomes.shutdown {
        None => {}
        Some(Err(reason)) => row("shutdown", &format!("not measured: {reason}"), "", ""),
        Some(Ok(shutdown)) => {
            let killed = outcomes.failover.as_ref().and_then(|f| f.as_ref().ok());
            shutdown_rows(&mut row, shutdown, killed);
        }
    }
    match &outcomes.lag {
        None => {}
        Some(Err(reason)) => row("lag", &format!("not measured: {reason}"), "", ""),
        Some(Ok(lag)) => lag_rows(&mut row, plans, lag),
    }
    if let Some(Ok(failover)) = &outcomes.failover {
        out.push('\n');
        out.push_str(&rounds_table(failover));
    }
    if let Some(Ok(shutdown)) = &outcomes.shutdown {
        out.push('\n');
        out.push_str(&shutdown_table(shutdown));
    }
    out
}

/// Percentiles of durations (as microseconds); None counts as `bound`.
fn sorted_micros(values: impl Iterator<Item = Option<Duration>>, bound: Duration) -> Vec<u64> {
    let mut micros: Vec<u64> = values
        .map(|d| d.unwrap_or(bound).as_micros() as u64)
        .collect();
    micros.sort_unstable();
    micros
}

fn failover_rows(row: &mut impl FnMut(&str, &str, &str, &str), failover: &FailoverOutcome) {
    let rounds = &failover.rounds;
    let kills = rounds.len();
    let name = "failover: kill -9 of the master -> first SEND_OK answered by the new master";
    if kills == 0 {
        row(name, "no round completed", "", "");
    } else {
        let missed = rounds.iter().filter(|r| r.first_ack.is_none()).count();
        let bound = Duration::from_secs(30);
        let acks = sorted_micros(rounds.iter().map(|r| r.first_ack), bound);
        let at = |p| Duration::from_micros(percentile(&acks, p));
        row(
            &format!("{name}, p50 ({kills} kills)"),
            &secs(at(0.5)),
            "",
            "",
        );
        let p99 = at(0.99);
        let p99_name = if kills <= 100 {
            format!("{name}, p99 (of {kills} kills: the max)")
        } else {
            format!("{name}, p99 ({kills} kills)")
        };
        row(
            &p99_name,
            &secs(p99),
            "<= 10 s",
            &at_most(p99.as_secs_f64(), FAILOVER_TARGET.as_secs_f64()),
        );
        let max = Duration::from_micros(acks.last().copied().unwrap_or(0));
        let missed_note = if missed > 0 {
            format!(" ({missed} kill(s) without an acknowledged send within 30 s, counted as 30 s)")
        } else {
            String::new()
        };
        row(
            &format!("{name}, max"),
            &format!("{}{missed_note}", secs(max)),
            "",
            "",
        );
        let elected = sorted_micros(rounds.iter().map(|r| r.elected), bound);
        row(
            "failover: kill -9 -> a live member's /metrics names itself master (50 ms polls), p50 / max",
            &format!(
                "{} / {}",
                ms(percentile(&elected, 0.5)),
                ms(elected.last().copied().unwrap_or(0))
            ),
            "",
            "",
        );
        let resync = sorted_micros(rounds.iter().map(|r| r.resync), Duration::from_secs(60));
        row(
            "failover: killed member restarted on its dir -> the master counts all 3 in sync, p50 / max",
            &format!(
                "{} / {}",
                secs(Duration::from_micros(percentile(&resync, 0.5))),
                secs(Duration::from_micros(resync.last().copied().unwrap_or(0)))
            ),
            "",
            "",
        );
        let mut failed: Vec<u64> = rounds.iter().map(|r| r.failed_sends).collect();
        failed.sort_unstable();
        row(
            "failover: sends that failed between the kill and the first SEND_OK, median per kill / total",
            &format!("{} / {}", percentile(&failed, 0.5), failed.iter().sum::<u64>()),
            "",
            "",
        );
    }
    if let Some(why) = &failover.stopped_early {
        row("failover: stopped early", why, "", "");
    }
}

/// "min / p50 / p99 / max" of the rounds' signal -> first SEND_OK (a round without one
/// counts as 30 s), and that p99.
fn spread(rounds: &[Round]) -> (String, Duration) {
    let acks = sorted_micros(rounds.iter().map(|r| r.first_ack), Duration::from_secs(30));
    let at = |p| Duration::from_micros(percentile(&acks, p));
    let min = Duration::from_micros(acks.first().copied().unwrap_or(0));
    let max = Duration::from_micros(acks.last().copied().unwrap_or(0));
    let p99 = at(0.99);
    let text = format!(
        "{} / {} / {} / {}",
        secs(min),
        secs(at(0.5)),
        secs(p99),
        secs(max)
    );
    (text, p99)
}

/// The shutdown run's rows, the failover run's kill -9 figures beside them.
fn shutdown_rows(
    row: &mut impl FnMut(&str, &str, &str, &str),
    shutdown: &FailoverOutcome,
    killed: Option<&FailoverOutcome>,
) {
    let rounds = &shutdown.rounds;
    let name = "shutdown: SIGTERM of the master -> first SEND_OK answered by the new master";
    if rounds.is_empty() {
        row(name, "no round completed", "", "");
    } else {
        let (figures, p99) = spread(rounds);
        row(
            &format!("{name}, min / p50 / p99 / max ({} rounds)", rounds.len()),
            &figures,
            "p99 <= 1 s",
            &at_most(p99.as_secs_f64(), SHUTDOWN_TARGET.as_secs_f64()),
        );
        if let Some(killed) = killed.filter(|k| !k.rounds.is_empty()) {
            row(
                &format!(
                    "beside it, kill -9 of the master -> first SEND_OK (failover run), min / p50 / p99 / max ({} kills)",
                    killed.rounds.len()
                ),
                &spread(&killed.rounds).0,
                "",
                "",
            );
        }
        for (led, which) in [(true, "led"), (false, "did not lead")] {
            let some: Vec<Round> = rounds
                .iter()
                .filter(|r| r.led_consensus == Some(led))
                .cloned()
                .collect();
            if !some.is_empty() {
                row(
                    &format!("shutdown: rounds whose master {which} the group's consensus, min / p50 / p99 / max ({})", some.len()),
                    &spread(&some).0,
                    "",
                    "",
                );
            }
        }
        row(
            "shutdown: exit codes of the SIGTERMed masters",
            &exit_codes(rounds),
            "0",
            "",
        );
        let mut failed: Vec<u64> = rounds.iter().map(|r| r.failed_sends).collect();
        failed.sort_unstable();
        row(
            "shutdown: sends that failed between the SIGTERM and the first SEND_OK, median per round / total",
            &format!("{} / {}", percentile(&failed, 0.5), failed.iter().sum::<u64>()),
            "",
            "",
        );
    }
    if let Some(why) = &shutdown.stopped_early {
        row("shutdown: stopped early", why, "", "");
    }
}

/// "19 x 0, 1 x none" (none: a signal ended it, or it did not exit in time).
fn exit_codes(rounds: &[Round]) -> String {
    let mut counts: BTreeMap<Option<i32>, u32> = BTreeMap::new();
    for round in rounds {
        *counts.entry(round.exit_code).or_default() += 1;
    }
    counts
        .iter()
        .map(|(code, n)| match code {
            Some(code) => format!("{n} x {code}"),
            None => format!("{n} x none (killed by a signal or not exited within 30 s)"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn lag_rows(row: &mut impl FnMut(&str, &str, &str, &str), plans: &Plans, lag: &LagOutcome) {
    let rate = plans.lag.rate_per_sec;
    row(
        &format!(
            "lag: paced 1 KiB producer on the master ({} connection(s)), {} per batch every 1 ms: sent / acknowledged",
            plans.lag.producers, plans.lag.batch
        ),
        &format!(
            "{:.1}k / {:.1}k msgs/s ({} of {} acknowledged, {} batches failed)",
            lag.sent_per_sec / 1e3,
            lag.acked_per_sec / 1e3,
            lag.acknowledged,
            lag.sent,
            lag.failed_batches
        ),
        &format!("{rate} msgs/s"),
        &format!("{:.2}x the rate", lag.acked_per_sec / rate as f64),
    );
    let name = format!(
        "lag: pull answer from replica {} received - send stamp",
        lag.replica
    );
    let p = |q| percentile(&lag.lag_micros, q);
    row(
        &format!(
            "{name}, p50 ({} of {} arrived, {} pulls failed; first {:?} left out)",
            lag.lag_micros.len(),
            lag.arrived,
            lag.pull_errors,
            plans.lag.warmup
        ),
        &ms(p(0.5)),
        "",
        "",
    );
    let p99 = p(0.99);
    row(
        &format!("{name}, p99"),
        &ms(p99),
        "<= 50 ms",
        &at_most(p99 as f64 / 1e3, LAG_TARGET_MS),
    );
    row(
        &format!("{name}, p999 / max"),
        &format!(
            "{} / {}",
            ms(p(0.999)),
            ms(lag.lag_micros.last().copied().unwrap_or(0))
        ),
        "",
        "",
    );
    let ack = |q| percentile(&lag.ack_micros, q);
    row(
        "lag: sync batch send -> SEND_OK (every in-sync member holds it), p50 / p99 / max",
        &format!(
            "{} / {} / {}",
            ms(ack(0.5)),
            ms(ack(0.99)),
            ms(lag.ack_micros.last().copied().unwrap_or(0))
        ),
        "",
        "",
    );
    master_lag_rows(row, lag);
}

/// The master's own view of the lag, and the CPU the paced run used.
fn master_lag_rows(row: &mut impl FnMut(&str, &str, &str, &str), lag: &LagOutcome) {
    let samples = &lag.master_lag_ms;
    let at = |q: f64| percentile(samples, q);
    row(
        &format!(
            "lag: master's quiver_replication_lag_seconds, highest replica, {} samples every 100 ms, p50 / p99 / max",
            samples.len()
        ),
        &format!(
            "{:.1} / {:.1} / {:.1} ms",
            at(0.5),
            at(0.99),
            samples.last().copied().unwrap_or(0.0)
        ),
        "",
        "",
    );
    row("lag: CPU used during the paced run", &lag.cores, "", "");
    row(
        "lag: master's quiver_replication_lag_bytes, highest sample",
        &format!("{:.0} KiB", lag.master_lag_bytes_max / 1024.0),
        "",
        "",
    );
}

fn rounds_table(failover: &FailoverOutcome) -> String {
    let mut out = String::from(
        "| kill | killed member | new master | kill -> named master | kill -> first SEND_OK | failed sends | restart -> all in sync | other master claims while it rejoined (member@epoch) | sends acked by it meanwhile |\n|---:|---:|---:|---:|---:|---:|---:|---|---:|\n",
    );
    let opt = |d: Option<Duration>| d.map_or("—".into(), |d| format!("{} ms", d.as_millis()));
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for Round {
        killed_at_utc: _,
        round,
        killed,
        new_master,
        elected,
        first_ack,
        failed_sends,
        resync,
        errors: round_errors,
        stale_claims,
        acks_from_restarted,
        ..
    } in &failover.rounds
    {
        let _ = writeln!(
            out,
            "| {round} | {killed} | {} | {} | {} | {failed_sends} | {} | {} | {acks_from_restarted} |",
            new_master.map_or("—".into(), |m| m.to_string()),
            opt(*elected),
            opt(*first_ack),
            opt(*resync),
            if stale_claims.is_empty() {
                "—".to_owned()
            } else {
                stale_claims
                    .iter()
                    .map(|(id, epoch)| format!("{id}@{epoch}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        for (error, count) in round_errors {
            *errors.entry(shape(error)).or_default() += count;
        }
    }
    if !errors.is_empty() {
        out.push_str(
            "\nWhy sends failed during the failovers (all kills, most frequent first):\n\n",
        );
        out.push_str(&most_frequent(errors));
    }
    out
}

/// Up to 8 error shapes, most frequent first, as a markdown list.
fn most_frequent(errors: BTreeMap<String, u64>) -> String {
    let mut errors: Vec<_> = errors.into_iter().collect();
    errors.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
    let mut out = String::new();
    for (error, count) in errors.iter().take(8) {
        let _ = writeln!(out, "- {count} x `{error}`");
    }
    out
}

/// One line per SIGTERM round, then why sends failed during the handovers.
fn shutdown_table(shutdown: &FailoverOutcome) -> String {
    let mut out = String::from(
        "| SIGTERM | stopped master | it led the consensus | exit code | new master | SIGTERM -> named master | SIGTERM -> first SEND_OK | failed sends | restart -> all in sync |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|\n",
    );
    let opt = |d: Option<Duration>| d.map_or("—".into(), |d| format!("{} ms", d.as_millis()));
    let mut errors: BTreeMap<String, u64> = BTreeMap::new();
    for r in &shutdown.rounds {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.round,
            r.killed,
            r.led_consensus
                .map_or("—", |led| if led { "yes" } else { "no" }),
            r.exit_code.map_or("none".into(), |c| c.to_string()),
            r.new_master.map_or("—".into(), |m| m.to_string()),
            opt(r.elected),
            opt(r.first_ack),
            r.failed_sends,
            opt(r.resync),
        );
        for (error, count) in &r.errors {
            *errors.entry(shape(error)).or_default() += count;
        }
    }
    if !errors.is_empty() {
        out.push_str(
            "\nWhy sends failed during the handovers (all SIGTERMs, most frequent first):\n\n",
        );
        out.push_str(&most_frequent(errors));
    }
    out
}

/// An error's text with numbers blanked, so the same failure on other ports counts once.
fn shape(error: &str) -> String {
    let mut shaped = String::with_capacity(error.len());
    let mut in_number = false;
    for c in error.chars() {
        if c.is_ascii_digit() {
            if !in_number {
                shaped.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            shaped.push(c);
        }
    }
    shaped
}
