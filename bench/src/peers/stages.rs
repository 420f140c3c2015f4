//! The broker's own per-stage times (Quiver only): GET /debug/stages before and after a
//! latency run, as figures beside its end-to-end percentiles, so each p99 is explained.

use std::net::SocketAddr;

use anyhow::{bail, Context as _};
use serde::Deserialize;

use crate::peers::workload::{Figure, Measure};

/// One send and one parked pull in this many are timed by the broker during the bench.
pub const SAMPLE_EVERY: u32 = 4;

/// Where the broker serves its stage times; `None` for systems without them.
#[derive(Clone, Copy, Debug, Default)]
pub struct BrokerStages {
    pub http: Option<SocketAddr>,
}

#[derive(Debug, Deserialize)]
struct Report {
    now_ns: u64,
    send: Kind,
    parked_pull_wake: Kind,
}

#[derive(Debug, Deserialize)]
struct Kind {
    samples: usize,
    stages: Vec<Stage>,
}

#[derive(Debug, Deserialize)]
struct Stage {
    stage: String,
    /// Samples of this row (older brokers: the kind's).
    samples: Option<usize>,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
}

impl BrokerStages {
    /// The broker's clock now: the start of the run whose stages are read afterwards.
    pub async fn mark(&self) -> anyhow::Result<Option<u64>> {
        Ok(match self.http {
            Some(http) => Some(fetch(http, 0).await?.now_ns),
            None => None,
        })
    }

    /// A figure per stage of the samples since `mark` (p99 as the value, p50 and p999 beside
    /// it), named after `run`; each logged.
    pub async fn figures(
        &self,
        mark: Option<u64>,
        run: &str,
        log: &impl Fn(&str),
    ) -> anyhow::Result<Vec<Figure>> {
        let (Some(http), Some(since)) = (self.http, mark) else {
            return Ok(Vec::new());
        };
        let report = fetch(http, since).await?;
        let kinds = [
            ("send", &report.send),
            ("woken pull", &report.parked_pull_wake),
        ];
        let mut figures = Vec::new();
        for (kind, summary) in kinds {
            for stage in &summary.stages {
                let workload = format!(
                    "{run}: broker stage, {kind} {} (p50 / p99 / p999)",
                    stage.stage
                );
                log(&format!(
                    "  {workload}: {:.0} / {:.0} / {:.0} us (of {} samples)",
                    stage.p50_us,
                    stage.p99_us,
                    stage.p999_us,
                    stage.samples.unwrap_or(summary.samples)
                ));
                figures.push(Figure {
                    workload,
                    value: stage.p99_us,
                    measure: Measure::StageMicros {
                        p50: stage.p50_us,
                        p999: stage.p999_us,
                    },
                });
            }
        }
        Ok(figures)
    }
}

async fn fetch(http: SocketAddr, since_ns: u64) -> anyhow::Result<Report> {
    let (status, body) =
        crate::http::get(http, &format!("/debug/stages?since_ns={since_ns}")).await?;
    if !status.is_success() {
        bail!(
            "/debug/stages answered {status}: {}",
            String::from_utf8_lossy(&body)
        );
    }
    serde_json::from_slice(&body).context("decoding /debug/stages")
}
