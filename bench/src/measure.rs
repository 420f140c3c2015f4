//! Bounded measurement loops and the figures they yield.

use std::time::{Duration, Instant};

/// How long and how much one measurement may run.
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    pub duration: Duration,
    pub max_ops: u64,
    pub max_bytes: u64,
}

impl Bounds {
    /// Ops allowed for operations of `op_bytes` each.
    pub fn ops_for(&self, op_bytes: u64) -> u64 {
        self.max_ops.min(self.max_bytes / op_bytes.max(1)).max(1)
    }
}

/// Operations done in an elapsed time.
#[derive(Clone, Copy, Debug)]
pub struct Rate {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Rate {
    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn mb_per_sec(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Runs `op(n)` (which does `n` operations of `op_bytes` each, `n` at most `batch`) until
/// the time or count bound is reached; the clock is read once per batch.
pub fn run_bounded(
    bounds: Bounds,
    op_bytes: u64,
    batch: u64,
    mut op: impl FnMut(u64) -> anyhow::Result<()>,
) -> anyhow::Result<Rate> {
    let max_ops = bounds.ops_for(op_bytes);
    let started = Instant::now();
    let mut ops = 0;
    while ops < max_ops && started.elapsed() < bounds.duration {
        let n = batch.min(max_ops - ops);
        op(n)?;
        ops += n;
    }
    Ok(Rate {
        ops,
        bytes: ops * op_bytes,
        elapsed: started.elapsed(),
    })
}

/// The median of some latencies.
pub fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    quiver_bench::percentile(&samples, 0.5)
}
