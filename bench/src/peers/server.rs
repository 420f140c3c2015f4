//! Server processes of the systems under test: free ports, readiness, peak RSS, stopping.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// A port on 127.0.0.1 that was free a moment ago (the listener is closed before the server
/// binds it, so another process could take it in between: the start then fails loudly).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A child server process, killed (SIGTERM, then SIGKILL) when dropped.
pub struct ServerProcess {
    name: String,
    child: Child,
    log_path: PathBuf,
}

impl ServerProcess {
    /// Starts `program` with `args`, its stdout and stderr going to `<log_dir>/<name>.log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        log_dir: &Path,
        envs: &[(&str, &str)],
    ) -> anyhow::Result<ServerProcess> {
        let log_path = log_dir.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("creating {}", log_path.display()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .current_dir(log_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (key, value) in envs {
            command.env(key, value);
        }
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}: {}", program.display()))?;
        Ok(ServerProcess {
            name: name.to_owned(),
            child,
            log_path,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until `addr` accepts connections, failing early if the process exits.
    pub fn wait_listening(&mut self, addr: SocketAddr, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{} exited with {status} before listening on {addr}; log tail:\n{}",
                    self.name,
                    self.log_tail(15)
                );
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "{} not listening on {addr} after {timeout:?}; log tail:\n{}",
                    self.name,
                    self.log_tail(15)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Peak resident set size so far (VmHWM, which counts mapped file pages too), in bytes.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        self.status_kib("VmHWM:").map(|kib| kib * 1024)
    }

    /// Anonymous resident memory now (RssAnon: heap and stacks, not the page cache), in bytes.
    pub fn anon_rss_bytes(&self) -> Option<u64> {
        self.status_kib("RssAnon:").map(|kib| kib * 1024)
    }

    fn status_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        let line = status.lines().find(|line| line.starts_with(field))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// The last `count` lines of the process's log, for error messages.
    pub fn log_tail(&self, count: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(count)..].join("\n")
    }

    /// SIGKILL at once (`kill -9`: no shutdown work), then reaps the process.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then SIGKILL after `grace`; reaps the process.
    pub fn stop(&mut self, grace: Duration) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill(2) on our own child's pid, which is not reaped yet so cannot be reused.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(5));
    }
}

/// Bytes the files under `dir` occupy on disk (allocated blocks, like `du`).
pub fn disk_usage_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.metadata() {
            Ok(meta) if meta.is_dir() => disk_usage_bytes(&entry.path()),
            Ok(meta) => meta.blocks() * 512,
            Err(_) => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_exits_early_is_reported_with_its_log() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut process = ServerProcess::spawn(
            "failing",
            Path::new("/bin/sh"),
            &["-c".into(), "echo cannot bind; exit 3".into()],
            dir.path(),
            &[],
        )
        .expect("spawn");
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port().expect("port")));
        let error = process
            .wait_listening(addr, Duration::from_secs(10))
            .expect_err("the process exits");
        let message = format!("{error:#}");
        assert!(message.contains("failing exited"), "{message}");
        assert!(message.contains("cannot bind"), "{message}");
    }

    #[test]
    fn disk_usage_counts_files_in_subdirectories() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
        std::fs::write(dir.path().join("sub/data"), vec![7u8; 64 * 1024]).expect("write");
        assert!(disk_usage_bytes(dir.path()) >= 64 * 1024);
        assert_eq!(disk_usage_bytes(&dir.path().join("missing")), 0);
    }
}
