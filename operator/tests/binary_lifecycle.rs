//! The quiver-operator binary: serves its HTTP port with no reachable cluster and stops cleanly
//! on SIGTERM.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const UNREACHABLE_KUBECONFIG: &str = "apiVersion: v1
kind: Config
clusters:
- name: nowhere
  cluster:
    server: https://127.0.0.1:9
users:
- name: nobody
  user:
    token: not-a-real-token
contexts:
- name: nowhere
  context:
    cluster: nowhere
    user: nobody
    namespace: default
current-context: nowhere
";

/// Kills the child if a test fails before it exits.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.kill().ok();
        self.0.wait().ok();
    }
}

fn get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    response
}

#[test]
fn serves_http_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, UNREACHABLE_KUBECONFIG).expect("write kubeconfig");
    let child = Command::new(env!("CARGO_BIN_EXE_quiver-operator"))
        .args([
            "--http-listen",
            "127.0.0.1:0",
            "--leader-election",
            "false",
            "--log-format",
            "json",
            // As the chart passes it.
            "--operator-pod-labels",
            "app.kubernetes.io/instance=quiver,app.kubernetes.io/name=quiver-operator",
        ])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start quiver-operator");
    let mut running = Running(child);
    let stdout = running.0.stdout.take().expect("stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });

    let deadline = Instant::now() + Duration::from_secs(20);
    let addr = loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        let line = lines_rx
            .recv_timeout(remaining)
            .expect("the serving line within 20 s");
        let Ok(entry) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if entry["fields"]["message"] == "serving /metrics /healthz /readyz" {
            break entry["fields"]["addr"]
                .as_str()
                .expect("addr field")
                .to_string();
        }
    };
    assert!(get(&addr, "/healthz").starts_with("HTTP/1.1 200"));
    // Ready once the controllers start (no leader election to wait for).
    let deadline = Instant::now() + Duration::from_secs(10);
    while !get(&addr, "/readyz").starts_with("HTTP/1.1 200") {
        assert!(Instant::now() < deadline, "/readyz not 200 within 10 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let metrics = get(&addr, "/metrics");
    // OpenMetrics text; families appear with their first series (no reconcile ran yet).
    assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");

    let pid = libc::pid_t::try_from(running.0.id()).expect("pid fits pid_t");
    // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped); no memory involved.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0, "SIGTERM delivered");
    let deadline = Instant::now() + Duration::from_secs(20);
    let exit = loop {
        if let Some(exit) = running.0.try_wait().expect("poll child") {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "quiver-operator did not stop within 20 s of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(exit.success(), "exit status {exit:?}");
}
