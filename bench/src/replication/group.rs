//! Brokers on 127.0.0.1: one standalone broker, or a replicated group of members sharing one
//! broker name; killing (`kill -9`) and restarting members on their own dir and ports; when a
//! group is ready, from each member's replication metrics.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::peers::server::{free_port, ServerProcess};
use crate::replication::observe::{cpu_seconds, Cpu, Metrics};

/// The group's broker name.
pub const BROKER_NAME: &str = "group-a";
/// Members of a group.
pub const MEMBERS: u64 = 3;
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// The broker's log filter: warnings, and the replication module's decisions.
const RUST_LOG: &str = "warn,quiver_broker::replication=info";

/// How a group's members replicate.
#[derive(Clone, Debug)]
pub struct GroupSpec {
    /// `sync` or `async`.
    pub replication: &'static str,
    pub min_in_sync: u32,
    /// More flags for every member (`--member-arg`).
    pub extra_args: Vec<String>,
}

/// One broker process: its ports and data dir stay when it is killed and restarted.
pub struct Member {
    pub id: u64,
    pub addr: SocketAddr,
    pub http: SocketAddr,
    args: Vec<String>,
    process: Option<ServerProcess>,
    starts: u32,
}

impl Member {
    /// A member not started yet.
    fn new(id: u64, addr: SocketAddr, http: SocketAddr, args: Vec<String>) -> Member {
        Member {
            id,
            addr,
            http,
            args,
            process: None,
            starts: 0,
        }
    }

    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// The last lines of its current (or last) process's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process
            .as_ref()
            .map_or_else(|| "(not running)".into(), |p| p.log_tail(lines))
    }
}

/// Brokers started by this benchmark, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Brokers {
    binary: PathBuf,
    log_dir: PathBuf,
    /// Log names start with it (the scenario's dir name), so scenarios keep apart.
    label: String,
    pub members: Vec<Member>,
}

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn dir_label(dir: &Path) -> String {
    dir.file_name()
        .map_or_else(|| "brokers".into(), |n| n.to_string_lossy().into_owned())
}

/// The flags every broker here gets: ports on 127.0.0.1, no gRPC, async flush.
fn base_args(data_dir: &Path, addr: SocketAddr, http: SocketAddr) -> Vec<String> {
    [
        "--data-dir",
        &data_dir.display().to_string(),
        "--listen",
        &addr.to_string(),
        "--http-listen",
        &http.to_string(),
        "--grpc-listen",
        "off",
        "--advertise",
        &addr.to_string(),
        "--flush-mode",
        "async",
    ]
    .map(str::to_owned)
    .to_vec()
}

impl Brokers {
    /// `members`, none started yet, logging under `log_dir`.
    fn new(binary: &Path, scratch: &Path, log_dir: &Path, members: Vec<Member>) -> Brokers {
        Brokers {
            binary: binary.to_owned(),
            log_dir: log_dir.to_owned(),
            label: dir_label(scratch),
            members,
        }
    }

    /// One standalone broker (`--flush-mode async`), data in `<scratch>/single`.
    pub fn start_single(binary: &Path, scratch: &Path, log_dir: &Path) -> anyhow::Result<Brokers> {
        let (addr, http) = (localhost(free_port()?), localhost(free_port()?));
        let data_dir = scratch.join("single");
        std::fs::create_dir_all(&data_dir)?;
        let member = Member::new(0, addr, http, base_args(&data_dir, addr, http));
        let mut brokers = Brokers::new(binary, scratch, log_dir, vec![member]);
        brokers.start(0)?;
        Ok(brokers)
    }

    /// A group of [`MEMBERS`] members named [`BROKER_NAME`], data in `<scratch>/member-N`.
    pub fn start_group(
        binary: &Path,
        scratch: &Path,
        log_dir: &Path,
        spec: &GroupSpec,
    ) -> anyhow::Result<Brokers> {
        let mut ports = Vec::new();
        for _ in 0..MEMBERS {
            ports.push((localhost(free_port()?), localhost(free_port()?)));
        }
        let group_members: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(id, (addr, _))| format!("{id}={addr}"))
            .collect();
        let mut members = Vec::new();
        for (id, &(addr, http)) in (0..MEMBERS).zip(&ports) {
            let data_dir = scratch.join(format!("member-{id}"));
            std::fs::create_dir_all(&data_dir)?;
            let mut args = base_args(&data_dir, addr, http);
            args.extend(
                [
                    "--broker-name",
                    BROKER_NAME,
                    "--group-members",
                    &group_members.join(","),
                    "--replica-id",
                    &id.to_string(),
                    "--replication",
                    spec.replication,
                    "--min-in-sync-replicas",
                    &spec.min_in_sync.to_string(),
                ]
                .map(str::to_owned),
            );
            args.extend(spec.extra_args.iter().cloned());
            members.push(Member::new(id, addr, http, args));
        }
        let mut brokers = Brokers::new(binary, scratch, log_dir, members);
        for id in 0..MEMBERS {
            brokers.start(id)?;
        }
        Ok(brokers)
    }

    pub fn member(&self, id: u64) -> &Member {
        &self.members[id as usize]
    }

    /// Every member's address, comma-separated (any member answers route look-ups).
    pub fn name_servers(&self) -> String {
        let addrs: Vec<String> = self.members.iter().map(|m| m.addr.to_string()).collect();
        addrs.join(",")
    }

    /// Starts member `id` (again: same flags, dir and ports; each start logs to
    /// `<scenario>-member<id>-start<n>.log`) and waits until it listens.
    pub fn start(&mut self, id: u64) -> anyhow::Result<()> {
        let member = &mut self.members[id as usize];
        if member.process.is_some() {
            bail!("member {id} is already running");
        }
        member.starts += 1;
        let name = format!("{}-member{id}-start{}", self.label, member.starts);
        let mut process = ServerProcess::spawn(
            &name,
            &self.binary,
            &member.args,
            &self.log_dir,
            &[("RUST_LOG", RUST_LOG)],
        )?;
        process.wait_listening(member.addr, START_TIMEOUT)?;
        member.process = Some(process);
        Ok(())
    }

    /// `kill -9` of member `id`; returns the moment just before the signal.
    pub fn kill(&mut self, id: u64) -> Instant {
        let killed_at = Instant::now();
        if let Some(mut process) = self.members[id as usize].process.take() {
            process.kill();
        }
        killed_at
    }

    /// SIGTERM to member `id`: it stops on its own (a master hands over first); returns the
    /// moment just before the signal. [`Self::wait_exit`] collects it.
    pub fn terminate(&mut self, id: u64) -> Instant {
        let signalled_at = Instant::now();
        if let Some(process) = &self.members[id as usize].process {
            // SAFETY: kill(2) on our own child's pid, which is not reaped yet (its
            // ServerProcess reaps it) so cannot be reused.
            unsafe { libc::kill(process.pid() as libc::pid_t, libc::SIGTERM) };
        }
        signalled_at
    }

    /// After [`Self::terminate`]: waits at most `timeout` for member `id` to exit; its exit
    /// code (None: a signal ended it, or it was still running and is killed now).
    pub async fn wait_exit(&mut self, id: u64, timeout: Duration) -> Option<i32> {
        let pid = self.members[id as usize].process.as_ref()?.pid();
        let deadline = Instant::now() + timeout;
        let code = loop {
            if let Some(code) = exit_code(pid) {
                break code;
            }
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        if let Some(mut process) = self.members[id as usize].process.take() {
            process.kill();
        }
        code
    }

    /// Whether member `id`'s /metrics says it leads its group's consensus.
    pub async fn leads_consensus(&self, id: u64) -> Option<bool> {
        let member = self.member(id);
        let metrics = Metrics::read(member.http).await.ok()?;
        Some(metrics.leads_consensus)
    }

    /// The replication metrics of every running member (a member that does not answer is
    /// left out).
    pub async fn metrics(&self) -> Vec<(u64, Metrics)> {
        let mut all = Vec::new();
        for member in self.members.iter().filter(|m| m.is_running()) {
            if let Ok(metrics) = Metrics::read(member.http).await {
                all.push((member.id, metrics));
            }
        }
        all
    }

    /// A member other than `killed` whose /metrics says it is the master of an epoch after
    /// `epoch`.
    pub async fn new_master(&self, killed: u64, epoch: u64) -> Option<u64> {
        self.metrics()
            .await
            .into_iter()
            .find(|(id, m)| m.is_master && *id != killed && m.epoch.is_some_and(|e| e > epoch))
            .map(|(id, _)| id)
    }

    /// Waits until every member runs, all report the same epoch, one of them as its master,
    /// and that master counts every member in sync; returns (master, epoch). (A restarted
    /// member reports its old epoch, and may call itself master, until it hears the group.)
    pub async fn wait_all_in_sync(&self, timeout: Duration) -> anyhow::Result<(u64, u64)> {
        self.wait_all_in_sync_watching(timeout, &mut Vec::new())
            .await
    }

    /// [`Self::wait_all_in_sync`], noting into `claims` every (member, epoch) that called
    /// itself master on the way but is not the agreed master of the agreed epoch.
    pub async fn wait_all_in_sync_watching(
        &self,
        timeout: Duration,
        claims: &mut Vec<(u64, u64)>,
    ) -> anyhow::Result<(u64, u64)> {
        let deadline = Instant::now() + timeout;
        let mut seen_claims = Vec::new();
        loop {
            let metrics = self.metrics().await;
            for (id, m) in &metrics {
                let claim = (*id, m.epoch.unwrap_or(0));
                if m.is_master && !seen_claims.contains(&claim) {
                    seen_claims.push(claim);
                }
            }
            if let Some(found) = agreed_master(&metrics, self.members.len()) {
                claims.extend(seen_claims.into_iter().filter(|c| *c != found));
                return Ok(found);
            }
            if Instant::now() >= deadline {
                let seen: Vec<String> = metrics
                    .iter()
                    .map(|(id, m)| format!("member {id}: {m:?}"))
                    .collect();
                bail!(
                    "no master with all {} members in sync after {timeout:?} ({})\nlog tails:\n{}",
                    self.members.len(),
                    seen.join("; "),
                    self.log_tails(8)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// CPU seconds (user + system) used so far by each running member and by this process.
    pub fn cpu(&self) -> Cpu {
        Cpu {
            members: self
                .members
                .iter()
                .filter_map(|m| {
                    let pid = m.process.as_ref()?.pid();
                    Some((m.id, cpu_seconds(&format!("/proc/{pid}/stat"))?))
                })
                .collect(),
            client: cpu_seconds("/proc/self/stat").unwrap_or(0.0),
            at: Instant::now(),
        }
    }

    /// Every member's log tail, for error messages.
    pub fn log_tails(&self, lines: usize) -> String {
        self.members
            .iter()
            .map(|m| format!("-- member {} --\n{}", m.id, m.log_tail(lines)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut process) = member.process.take() {
                process.stop(Duration::from_secs(5));
            }
        }
    }
}

/// Whether child `pid` has exited: Some(its exit code, None if a signal ended it); None while
/// it runs. Leaves it unreaped for its ServerProcess.
fn exit_code(pid: u32) -> Option<Option<i32>> {
    // SAFETY: siginfo_t is plain data; all zeroes is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
    // SAFETY: waitid(2) on our own child, writing into `info`; WNOWAIT leaves it unreaped.
    let waited = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, flags) };
    // SAFETY: waitid filled `info` for a child (si_pid 0: none has changed state yet).
    let (child, status) = unsafe { (info.si_pid(), info.si_status()) };
    if waited != 0 || child == 0 {
        return None;
    }
    Some((info.si_code == libc::CLD_EXITED).then_some(status))
}

/// (master, epoch) when all `members` answered with one epoch, exactly one calls itself
/// master, and it counts all of them in sync.
pub(super) fn agreed_master(metrics: &[(u64, Metrics)], members: usize) -> Option<(u64, u64)> {
    if metrics.len() != members {
        return None;
    }
    let epoch = metrics[0].1.epoch?;
    if metrics.iter().any(|(_, m)| m.epoch != Some(epoch)) {
        return None;
    }
    let mut masters = metrics.iter().filter(|(_, m)| m.is_master);
    let (master, state) = masters.next()?;
    if masters.next().is_some() || state.in_sync != Some(members as u64) {
        return None;
    }
    Some((*master, epoch))
}
