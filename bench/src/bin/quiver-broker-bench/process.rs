//! `--mode grpc`'s broker: the release `quiver-broker` binary beside this one, started per
//! scenario in a process of its own, so the clients (this process) and the broker do not
//! share a runtime or its worker threads; and what the broker spent, read from `/proc`.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use crate::harness::{create_topic, Conn, TOPIC};
use crate::Args;

/// A broker process with the bench topic, stopped when dropped.
pub(crate) struct BrokerProcess {
    pub(crate) addr: SocketAddr,
    pub(crate) grpc_addr: SocketAddr,
    pub(crate) conn: Conn,
    child: Child,
    _dir: tempfile::TempDir,
}

impl Drop for BrokerProcess {
    fn drop(&mut self) {
        self.child.kill().ok();
        self.child.wait().ok();
    }
}

pub(crate) fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// The `quiver-broker` binary beside this one.
pub(crate) fn broker_binary() -> anyhow::Result<std::path::PathBuf> {
    let binary = std::env::current_exe()?
        .parent()
        .context("bench binary has no directory")?
        .join("quiver-broker");
    if !binary.exists() {
        bail!(
            "{} missing: build it with the bench (cargo build --release -p quiver-broker -p quiver-bench)",
            binary.display()
        );
    }
    Ok(binary)
}

impl BrokerProcess {
    /// Starts `quiver-broker` on free loopback ports over a fresh directory, async or sync
    /// flush as `--flush-mode` says, and creates the bench topic.
    pub(crate) async fn start(args: &Args) -> anyhow::Result<BrokerProcess> {
        let binary = broker_binary()?;
        let dir = tempfile::tempdir()?;
        let (addr, grpc_addr, http) = (free_addr()?, free_addr()?, free_addr()?);
        let arguments = [
            "--data-dir",
            &dir.path().join("data").display().to_string(),
            "--listen",
            &addr.to_string(),
            "--advertise",
            &addr.to_string(),
            "--http-listen",
            &http.to_string(),
            "--grpc-listen",
            &grpc_addr.to_string(),
            "--flush-mode",
            &args.flush_mode.to_string(),
            "--segment-size",
            "268435456",
        ];
        let child = Command::new(&binary)
            .args(arguments)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut conn = loop {
            match Conn::connect_plain(addr).await {
                Ok(conn) => break conn,
                Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(error) => return Err(error.context("the broker did not listen in 30 s")),
            }
        };
        create_topic(&mut conn, TOPIC).await?;
        Ok(BrokerProcess {
            addr,
            grpc_addr,
            conn,
            child,
            _dir: dir,
        })
    }

    /// What the broker's threads, and this process's (the clients'), spent so far.
    pub(crate) fn usage(&self) -> anyhow::Result<Spent> {
        Ok(Spent {
            broker: Usage::of(self.child.id())?,
            clients: Usage::of(std::process::id())?,
        })
    }
}

/// What the broker and the clients spent.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Spent {
    broker: Usage,
    clients: Usage,
}

/// Per call: (CPU µs, context switches) of the broker, then of the clients.
pub(crate) type Cost = [(f64, f64); 2];

impl Spent {
    /// What was spent between `before` and `self`, per one of `calls`.
    pub(crate) fn per_call(self, before: Spent, calls: u64) -> Cost {
        [
            self.broker.per_call(before.broker, calls),
            self.clients.per_call(before.clients, calls),
        ]
    }
}

/// CPU time and context switches of a process's live threads (a thread that ended takes its
/// counts with it: the broker's workers live as long as it does).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    cpu: Duration,
    switches: u64,
}

impl Usage {
    fn of(pid: u32) -> anyhow::Result<Usage> {
        let mut usage = Usage::default();
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let task = task?.path();
            // schedstat: nanoseconds on a CPU, nanoseconds waiting for one, time slices.
            let Ok(schedstat) = std::fs::read_to_string(task.join("schedstat")) else {
                continue;
            };
            let on_cpu: u64 = schedstat
                .split_whitespace()
                .next()
                .and_then(|ns| ns.parse().ok())
                .unwrap_or(0);
            usage.cpu += Duration::from_nanos(on_cpu);
            let status = std::fs::read_to_string(task.join("status")).unwrap_or_default();
            usage.switches += status
                .lines()
                .filter(|line| line.contains("ctxt_switches:"))
                .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>();
        }
        Ok(usage)
    }

    /// What was spent between `before` and `self`, per one of `calls`: (CPU µs, switches).
    fn per_call(self, before: Usage, calls: u64) -> (f64, f64) {
        let calls = calls.max(1) as f64;
        let cpu = self.cpu.saturating_sub(before.cpu).as_secs_f64() * 1e6 / calls;
        let switches = self.switches.saturating_sub(before.switches) as f64 / calls;
        (cpu, switches)
    }
}
