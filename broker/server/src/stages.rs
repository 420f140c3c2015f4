//! Per-stage times of sampled requests, so a latency percentile is explained, not guessed.
//!
//! A sampled send is stamped when its last bytes reached the socket (the kernel's receive
//! timestamp, plain TCP only), when the read that completed its frame returned, when its
//! processor answered (decoded, appended, dispatched to its ConsumeQueue, parked pulls woken)
//! and when the connection's writer had written the answer; the thread's minor page faults
//! between the read and the answer are counted beside. A sampled pull that was parked is
//! stamped when a dispatch woke it, when answering began (on the dispatching thread, or in
//! the pull's task when it had to be woken), when it answered and when the answer was
//! written. Off unless `--stage-sample-every N`; when on, one send and one pull in N are
//! timed into fixed rings written without a lock (a sequence number per slot lets a reader
//! skip the slot being written).

use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use quiver_protocol::code::request;
use serde::Serialize;

/// Samples kept per kind; older ones are overwritten.
const RING_SLOTS: usize = 1 << 15;
/// Values a sample holds at most: a send's three stages and its page faults.
const MAX_STAGES: usize = 4;
/// Where a send's page-fault count sits in its sample; `NO_COUNT` when it was not counted
/// (the answer came from another thread than the read).
const FAULTS: usize = 3;
const NO_COUNT: u64 = u64::MAX;

/// The stages of a send, in order.
pub const SEND_STAGES: [&str; 3] = [
    "arrived -> read (in the socket until the reader ran: its scheduling delay; 0 over TLS)",
    "read -> answered (decode, append, dispatch, wake parked pulls)",
    "answered -> written",
];
/// Rows derived from a send's stages and faults, after the stages.
pub const SEND_DERIVED: [&str; 3] = [
    "arrived -> written (all of the broker's part)",
    "read -> answered, sends that took a page fault",
    "read -> answered, sends that took none",
];
/// The stages of a parked pull woken by a dispatch, in order.
pub const WAKE_STAGES: [&str; 3] = [
    "dispatched -> answering (on the dispatching thread, or the pull's task woken)",
    "answering -> answered (read the queue, build the answer)",
    "answered -> written",
];

/// What a request being answered has been stamped with so far.
#[derive(Debug, Default, Clone)]
pub struct Trace {
    kind: Option<Kind>,
    read_at: Option<Instant>,
    arrived_at: Option<Instant>,
    /// The thread the trace started on and its minor page faults then (sends only).
    faults_at_start: Option<(std::thread::ThreadId, u64)>,
    /// Set by the pull processor when a dispatch woke its parked pull: (dispatched, woken).
    woken: Option<(Instant, Instant)>,
}

impl Trace {
    /// A trace that records nothing.
    pub fn off() -> Trace {
        Trace::default()
    }

    pub fn is_sampled(&self) -> bool {
        self.kind.is_some()
    }

    /// A parked pull was woken by the dispatch at `dispatched` and runs again now.
    pub fn woken(&mut self, dispatched: Instant) {
        if self.kind == Some(Kind::Pull) {
            self.woken = Some((dispatched, Instant::now()));
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Send,
    Pull,
}

/// The sampler and its two rings; one per broker.
pub struct StageRecorder {
    every: u64,
    epoch: Instant,
    sends_seen: AtomicU64,
    pulls_seen: AtomicU64,
    sends: Ring,
    wakes: Ring,
}

impl StageRecorder {
    /// A recorder timing one send and one pull in `every`; 0 records nothing (and allocates
    /// no ring).
    pub fn new(every: u32) -> Arc<StageRecorder> {
        let slots = if every == 0 { 0 } else { RING_SLOTS };
        Arc::new(StageRecorder {
            every: u64::from(every),
            epoch: Instant::now(),
            sends_seen: AtomicU64::new(0),
            pulls_seen: AtomicU64::new(0),
            sends: Ring::new(slots),
            wakes: Ring::new(slots),
        })
    }

    pub fn is_on(&self) -> bool {
        self.every > 0
    }

    /// Starts the trace of a request read at `read_at` whose bytes reached the socket at
    /// `arrived_at`: sampled or not.
    pub fn start(&self, code: i32, (read_at, arrived_at): ReadStamps) -> Trace {
        if self.every == 0 {
            return Trace::off();
        }
        let (kind, seen) = match code {
            request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
                (Kind::Send, &self.sends_seen)
            }
            request::PULL_MESSAGE => (Kind::Pull, &self.pulls_seen),
            _ => return Trace::off(),
        };
        if seen.fetch_add(1, Ordering::Relaxed) % self.every != 0 {
            return Trace::off();
        }
        let faults_at_start = (kind == Kind::Send).then(thread_faults).flatten();
        Trace {
            kind: Some(kind),
            read_at,
            arrived_at,
            faults_at_start,
            woken: None,
        }
    }

    /// The answer is built now: what to call once it is written, if the trace is kept (sends
    /// stamped on read; pulls woken by a dispatch).
    pub fn answered(self: &Arc<Self>, trace: Trace) -> Option<quiver_remoting::OnWritten> {
        let answered = Instant::now();
        let (ring, marks, faults) = match (trace.kind?, trace.read_at, trace.woken) {
            (Kind::Send, Some(read), _) => {
                // A send read before its bytes were stamped (TLS) waited 0 as far as we know.
                let arrived = trace.arrived_at.map_or(read, |at| at.min(read));
                let faults = faults_since(trace.faults_at_start);
                (Kind::Send, [arrived, read, answered], faults)
            }
            (Kind::Pull, _, Some((dispatched, woken))) => {
                (Kind::Pull, [dispatched, woken, answered], NO_COUNT)
            }
            _ => return None,
        };
        let recorder = self.clone();
        Some(Box::new(move |written: Instant| {
            let mut sample = [0u64; MAX_STAGES];
            let ends = marks.iter().skip(1).chain([&written]);
            for ((value, start), end) in sample.iter_mut().zip(&marks).zip(ends) {
                *value = nanos(end.saturating_duration_since(*start));
            }
            sample[FAULTS] = faults;
            let done = nanos(written.saturating_duration_since(recorder.epoch));
            recorder.ring(ring).push(done, &sample);
        }))
    }

    fn ring(&self, kind: Kind) -> &Ring {
        match kind {
            Kind::Send => &self.sends,
            Kind::Pull => &self.wakes,
        }
    }

    /// Nanoseconds since this recorder started: the `since_ns` of a later report.
    pub fn now_ns(&self) -> u64 {
        nanos(self.epoch.elapsed())
    }

    /// Percentiles of each stage over the samples completed after `since_ns`.
    pub fn report(&self, since_ns: u64) -> StageReport {
        StageReport {
            now_ns: self.now_ns(),
            sample_every: self.every,
            send: summarize_sends(&self.sends.read_since(since_ns)),
            parked_pull_wake: summarize(&self.wakes.read_since(since_ns), &WAKE_STAGES),
        }
    }
}

/// When a request's last bytes were read, and when they reached the socket.
pub type ReadStamps = (Option<Instant>, Option<Instant>);

/// This thread and its minor page faults so far (`getrusage(RUSAGE_THREAD)`).
fn thread_faults() -> Option<(std::thread::ThreadId, u64)> {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_THREAD).ok()?;
    let faults = u64::try_from(usage.minor_page_faults()).ok()?;
    Some((std::thread::current().id(), faults))
}

/// Minor page faults of this thread since `start`, if it was taken on this thread.
fn faults_since(start: Option<(std::thread::ThreadId, u64)>) -> u64 {
    match (start, thread_faults()) {
        (Some((thread, before)), Some((now_on, after))) if thread == now_on => {
            after.saturating_sub(before)
        }
        _ => NO_COUNT,
    }
}

fn nanos(duration: std::time::Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// What GET /debug/stages answers.
#[derive(Debug, Serialize)]
pub struct StageReport {
    pub now_ns: u64,
    pub sample_every: u64,
    pub send: KindSummary,
    pub parked_pull_wake: KindSummary,
}

#[derive(Debug, Serialize)]
pub struct KindSummary {
    pub samples: usize,
    pub stages: Vec<StageSummary>,
}

/// One stage's percentiles, in microseconds.
#[derive(Debug, Serialize)]
pub struct StageSummary {
    pub stage: &'static str,
    /// Samples in this row (the fault rows split the send's).
    pub samples: usize,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

fn summarize(samples: &[[u64; MAX_STAGES]], names: &[&'static str]) -> KindSummary {
    let stages = names
        .iter()
        .enumerate()
        .map(|(i, &stage)| stage_summary(stage, samples.iter().map(|sample| sample[i]).collect()))
        .collect();
    KindSummary {
        samples: samples.len(),
        stages,
    }
}

/// A send's stages, then what is derived from them: the broker's whole part, and read ->
/// answered split by whether the thread took a page fault (so the faults' share of the
/// tail is read off the two rows).
fn summarize_sends(samples: &[[u64; MAX_STAGES]]) -> KindSummary {
    let mut summary = summarize(samples, &SEND_STAGES);
    let [whole, faulted, clean] = SEND_DERIVED;
    let total = samples.iter().map(|s| s[0] + s[1] + s[2]).collect();
    summary.stages.push(stage_summary(whole, total));
    let counted = samples.iter().filter(|s| s[FAULTS] != NO_COUNT);
    let (with, without): (Vec<&[u64; MAX_STAGES]>, Vec<_>) = counted.partition(|s| s[FAULTS] > 0);
    summary
        .stages
        .push(stage_summary(faulted, with.iter().map(|s| s[1]).collect()));
    summary
        .stages
        .push(stage_summary(clean, without.iter().map(|s| s[1]).collect()));
    summary
}

fn stage_summary(stage: &'static str, mut values: Vec<u64>) -> StageSummary {
    values.sort_unstable();
    let micros = |q: f64| quantile(&values, q) as f64 / 1000.0;
    StageSummary {
        stage,
        samples: values.len(),
        p50_us: micros(0.5),
        p99_us: micros(0.99),
        p999_us: micros(0.999),
        max_us: micros(1.0),
    }
}

/// The nearest-rank quantile of sorted values; 0 when there are none.
fn quantile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// A fixed ring of samples: the completion time then the stage durations, in nanoseconds.
struct Ring {
    slots: Box<[Slot]>,
    next: AtomicU64,
}

#[derive(Default)]
struct Slot {
    /// 0 while empty or being written; else the sample's position in the ring's history + 1.
    seq: AtomicU64,
    done_ns: AtomicU64,
    stages: [AtomicU64; MAX_STAGES],
}

impl Ring {
    fn new(slots: usize) -> Ring {
        Ring {
            slots: (0..slots).map(|_| Slot::default()).collect(),
            next: AtomicU64::new(0),
        }
    }

    fn push(&self, done_ns: u64, stages: &[u64; MAX_STAGES]) {
        if self.slots.is_empty() {
            return;
        }
        let position = self.next.fetch_add(1, Ordering::Relaxed);
        let slot = &self.slots[(position % self.slots.len() as u64) as usize];
        slot.seq.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.done_ns.store(done_ns, Ordering::Relaxed);
        for (cell, &value) in slot.stages.iter().zip(stages) {
            cell.store(value, Ordering::Relaxed);
        }
        slot.seq.store(position + 1, Ordering::Release);
    }

    /// The samples completed after `since_ns`, skipping any slot written meanwhile.
    fn read_since(&self, since_ns: u64) -> Vec<[u64; MAX_STAGES]> {
        let mut samples = Vec::new();
        for slot in self.slots.iter() {
            let before = slot.seq.load(Ordering::Acquire);
            if before == 0 {
                continue;
            }
            let done_ns = slot.done_ns.load(Ordering::Relaxed);
            let stages = std::array::from_fn(|i| slot.stages[i].load(Ordering::Relaxed));
            fence(Ordering::Acquire);
            if slot.seq.load(Ordering::Relaxed) == before && done_ns > since_ns {
                samples.push(stages);
            }
        }
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn off_records_nothing_and_allocates_no_ring() {
        let recorder = StageRecorder::new(0);
        assert!(!recorder.is_on());
        let trace = recorder.start(request::SEND_MESSAGE, (Some(Instant::now()), None));
        assert!(!trace.is_sampled());
        assert!(recorder.answered(trace).is_none());
        assert!(recorder.sends.slots.is_empty());
    }

    #[test]
    fn one_send_and_one_pull_in_n_are_sampled_each_on_its_own_count() {
        let recorder = StageRecorder::new(2);
        let sampled: Vec<bool> = (0..4)
            .flat_map(|_| [request::SEND_MESSAGE_V2, request::PULL_MESSAGE])
            .map(|code| recorder.start(code, (None, None)).is_sampled())
            .collect();
        // Alternating sends and pulls with N = 2 still samples both kinds.
        assert_eq!(
            sampled,
            [true, true, false, false, true, true, false, false]
        );
        assert!(!recorder
            .start(request::HEART_BEAT, (None, None))
            .is_sampled());
    }

    #[test]
    fn a_send_is_split_into_its_stages_and_reported_after_since() {
        let recorder = StageRecorder::new(1);
        let since = recorder.now_ns();
        let read = Instant::now() - Duration::from_millis(3);
        let arrived = read - Duration::from_millis(4);
        let trace = recorder.start(request::SEND_MESSAGE, (Some(read), Some(arrived)));
        let on_written = recorder.answered(trace).expect("a stamped send is kept");
        std::thread::sleep(Duration::from_millis(2));
        on_written(Instant::now());
        let report = recorder.report(since);
        assert_eq!(report.send.samples, 1);
        assert_eq!(report.parked_pull_wake.samples, 0);
        let [arrived_to_read, read_to_answered, answered_to_written, whole, faulted, clean] =
            &report.send.stages[..]
        else {
            panic!(
                "three send stages and three derived rows: {:?}",
                report.send.stages
            );
        };
        assert!(arrived_to_read.p50_us >= 4000.0, "{arrived_to_read:?}");
        assert!(read_to_answered.p99_us >= 3000.0, "{read_to_answered:?}");
        assert!(
            answered_to_written.p50_us >= 2000.0,
            "{answered_to_written:?}"
        );
        assert!(whole.p50_us >= 9000.0, "{whole:?}");
        // Started and answered on this thread: its faults were counted, one way or the other.
        assert_eq!(faulted.samples + clean.samples, 1, "{faulted:?} {clean:?}");
        assert_eq!(recorder.report(report.now_ns).send.samples, 0);
    }

    #[test]
    fn a_send_without_an_arrival_stamp_waited_nothing_in_the_socket() {
        let recorder = StageRecorder::new(1);
        let trace = recorder.start(request::SEND_MESSAGE, (Some(Instant::now()), None));
        recorder.answered(trace).expect("kept")(Instant::now());
        let report = recorder.report(0);
        assert_eq!(report.send.stages[0].max_us, 0.0);
    }

    #[test]
    fn faults_split_read_to_answered_into_two_rows() {
        let with = [0, 5_000_000, 0, 1];
        let without = [0, 1_000, 0, 0];
        let uncounted = [0, 9_000_000, 0, NO_COUNT];
        let summary = summarize_sends(&[with, without, without, uncounted]);
        let row = |name: &str| summary.stages.iter().find(|s| s.stage == name).unwrap();
        assert_eq!(row(SEND_DERIVED[1]).samples, 1);
        assert_eq!(row(SEND_DERIVED[1]).p50_us, 5000.0);
        assert_eq!(row(SEND_DERIVED[2]).samples, 2);
        assert_eq!(row(SEND_DERIVED[2]).max_us, 1.0);
        assert_eq!(row(SEND_DERIVED[0]).samples, 4);
    }

    #[test]
    fn a_pull_is_kept_only_when_a_dispatch_woke_it() {
        let recorder = StageRecorder::new(1);
        let unwoken = recorder.start(request::PULL_MESSAGE, (Some(Instant::now()), None));
        assert!(recorder.answered(unwoken).is_none());
        let mut woken = recorder.start(request::PULL_MESSAGE, (None, None));
        woken.woken(Instant::now() - Duration::from_millis(1));
        recorder.answered(woken).expect("kept")(Instant::now());
        let report = recorder.report(0);
        assert_eq!(report.parked_pull_wake.samples, 1);
        assert!(report.parked_pull_wake.stages[0].p50_us >= 1000.0);
        assert_eq!(report.parked_pull_wake.stages.len(), WAKE_STAGES.len());
    }

    #[test]
    fn the_ring_keeps_the_newest_samples() {
        let ring = Ring::new(4);
        for i in 1..=6 {
            ring.push(i, &[i; MAX_STAGES]);
        }
        let mut kept: Vec<u64> = ring.read_since(0).iter().map(|s| s[0]).collect();
        kept.sort_unstable();
        assert_eq!(kept, [3, 4, 5, 6]);
        assert_eq!(ring.read_since(4).len(), 2);
    }

    #[test]
    fn quantiles_use_the_nearest_rank() {
        let values: Vec<u64> = (1..=1000).collect();
        assert_eq!(quantile(&values, 0.5), 500);
        assert_eq!(quantile(&values, 0.99), 990);
        assert_eq!(quantile(&values, 1.0), 1000);
        assert_eq!(quantile(&[], 0.99), 0);
    }
}
