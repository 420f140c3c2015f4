//! Where an end-to-end run's tail goes outside the broker (issue 41): the load generator's
//! own side per message, joined with its end-to-end latency, and how long each process's
//! runnable threads waited for a CPU during the run.
//!
//! Per message: its send stamp (in the body), when its send task first ran (spawned on the
//! load generator's runtime: that runtime's scheduling delay), when the send was
//! acknowledged, and when it arrived at the follower. The slowest 0.1% of messages (the
//! p999 and above) get the share of their latency their send task spent waiting to run, so
//! the p999 is explained by what it is made of rather than by comparing percentiles of
//! separate distributions.

use std::collections::HashMap;

use quiver_bench::percentile;

use crate::peers::workload::{Arrival, Figure, Measure};

/// One message's load-generator stamps, nanoseconds on the bench's clock.
#[derive(Clone, Copy, Debug)]
pub struct SendTimes {
    pub stamp: u64,
    pub task_ran: u64,
    pub acknowledged: u64,
}

/// Run-queue waits of a process's threads (`/proc/PID/task/*/schedstat`): nanoseconds spent
/// runnable but not running, and how many times a thread was scheduled in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuWait {
    pub waited_ns: u64,
    pub timeslices: u64,
}

impl CpuWait {
    /// The process's threads so far; zero when it is gone or the kernel keeps no schedstat.
    pub fn of(pid: u32) -> CpuWait {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return CpuWait::default();
        };
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
            .filter_map(|line| parse_schedstat(&line))
            .fold(CpuWait::default(), |sum, wait| CpuWait {
                waited_ns: sum.waited_ns + wait.waited_ns,
                timeslices: sum.timeslices + wait.timeslices,
            })
    }

    /// What happened between `earlier` and `self` (threads that ended meanwhile are lost).
    pub fn since(self, earlier: CpuWait) -> CpuWait {
        CpuWait {
            waited_ns: self.waited_ns.saturating_sub(earlier.waited_ns),
            timeslices: self.timeslices.saturating_sub(earlier.timeslices),
        }
    }
}

/// "on-cpu-ns run-queue-wait-ns timeslices".
fn parse_schedstat(line: &str) -> Option<CpuWait> {
    let mut fields = line.split_whitespace().skip(1).map(str::parse::<u64>);
    Some(CpuWait {
        waited_ns: fields.next()?.ok()?,
        timeslices: fields.next()?.ok()?,
    })
}

/// One part of a message's time, nanoseconds, from its stamps.
type Part = fn(&SendTimes) -> u64;

/// The figures of one end-to-end run's outside-the-broker breakdown, named after `run`:
/// `arrivals` as measured (warm-up already left out), `sends` of every message.
pub fn figures(
    run: &str,
    arrivals: &[Arrival],
    sends: &[SendTimes],
    log: &impl Fn(&str),
) -> Vec<Figure> {
    let by_stamp: HashMap<u64, &SendTimes> = sends.iter().map(|s| (s.stamp, s)).collect();
    let joined: Vec<(u64, &SendTimes)> = arrivals
        .iter()
        .filter_map(|&(sent, arrived)| Some((arrived.saturating_sub(sent), *by_stamp.get(&sent)?)))
        .collect();
    if joined.is_empty() {
        return Vec::new();
    }
    let parts: [(&str, Part); 2] = [
        ("send stamp -> its send task ran", |s| {
            s.task_ran.saturating_sub(s.stamp)
        }),
        ("send stamp -> acknowledged", |s| {
            s.acknowledged.saturating_sub(s.stamp)
        }),
    ];
    let mut figures = Vec::new();
    for (part, of) in parts {
        let mut micros: Vec<u64> = joined.iter().map(|(_, s)| of(s) / 1000).collect();
        micros.sort_unstable();
        let [p50, p99, p999] = [0.5, 0.99, 0.999].map(|p| percentile(&micros, p) as f64);
        let workload = format!("{run}: load generator, {part} (p50 / p99 / p999)");
        log(&format!("  {workload}: {p50:.0} / {p99:.0} / {p999:.0} us"));
        figures.push(Figure {
            workload,
            value: p99,
            measure: Measure::StageMicros { p50, p999 },
        });
    }
    figures.push(slowest_share(run, &joined, log));
    figures
}

/// Of the slowest 0.1% of messages (at least one), the share of their summed latency spent
/// before their send task ran.
fn slowest_share(run: &str, joined: &[(u64, &SendTimes)], log: &impl Fn(&str)) -> Figure {
    let mut by_latency: Vec<&(u64, &SendTimes)> = joined.iter().collect();
    by_latency.sort_unstable_by_key(|(latency, _)| std::cmp::Reverse(*latency));
    let slowest = &by_latency[..joined.len().div_ceil(1000)];
    let total: u64 = slowest.iter().map(|(latency, _)| latency).sum();
    let waiting: u64 = slowest
        .iter()
        .map(|(latency, s)| s.task_ran.saturating_sub(s.stamp).min(*latency))
        .sum();
    let share = 100.0 * waiting as f64 / total.max(1) as f64;
    let fastest = slowest.last().map_or(0, |(latency, _)| latency / 1000);
    let workload = format!("{run}: slowest 0.1%, share of their latency before the send task ran");
    log(&format!(
        "  {workload}: {share:.0}% (of {} messages at or above {fastest} us)",
        slowest.len(),
    ));
    Figure {
        workload,
        value: share,
        measure: Measure::Percent,
    }
}

/// The figure of how long `who`'s runnable threads waited for a CPU over a run of
/// `seconds`: milliseconds per second of run, the mean wait per timeslice beside it.
pub fn cpu_wait_figure(
    run: &str,
    who: &str,
    wait: CpuWait,
    seconds: f64,
    log: &impl Fn(&str),
) -> Figure {
    let per_second = wait.waited_ns as f64 / 1e6 / seconds.max(1e-9);
    let mean_us = wait.waited_ns as f64 / 1e3 / wait.timeslices.max(1) as f64;
    let workload = format!("{run}: {who} threads waiting for a CPU (ms per s of run)");
    log(&format!(
        "  {workload}: {per_second:.1} ms/s, {mean_us:.1} us per timeslice of {}",
        wait.timeslices
    ));
    Figure {
        workload,
        value: per_second,
        measure: Measure::MillisPerSecond { mean_us },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_lines_give_the_wait_and_the_timeslices() {
        assert_eq!(
            parse_schedstat("123 456 7\n"),
            Some(CpuWait {
                waited_ns: 456,
                timeslices: 7
            })
        );
        assert_eq!(parse_schedstat("garbage"), None);
        let own = CpuWait::of(std::process::id());
        assert!(own.timeslices > 0 || own == CpuWait::default());
    }

    #[test]
    fn the_slowest_messages_are_split_by_their_send_task_wait() {
        let sends: Vec<SendTimes> = (0..2000u64)
            .map(|i| SendTimes {
                stamp: i * 1_000_000,
                // The last message's task ran 3 ms late; the others at once.
                task_ran: i * 1_000_000 + if i == 1999 { 3_000_000 } else { 1_000 },
                acknowledged: i * 1_000_000 + 100_000,
            })
            .collect();
        let arrivals: Vec<Arrival> = sends
            .iter()
            .map(|s| (s.stamp, s.task_ran + 200_000))
            .collect();
        let figures = figures("run", &arrivals, &sends, &|_| {});
        let share = figures.last().expect("the share figure");
        assert!(matches!(share.measure, Measure::Percent));
        // Of the two slowest (0.1% of 2000), 3 ms of 3.2 + 0.201 ms waited.
        assert!((share.value - 88.2).abs() < 1.0, "{}", share.value);
        let ran = &figures[0];
        assert_eq!(ran.value, 1.0);
    }
}
