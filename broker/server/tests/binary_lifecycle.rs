//! The `quiver-broker` binary: --help documents the flags, env and flags configure it, and
//! SIGTERM stops it with exit code 0 within a bound.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Two free ports, held together until both are known so they never coincide.
fn two_free_ports() -> (u16, u16) {
    let first = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let second = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        first.local_addr().unwrap().port(),
        second.local_addr().unwrap().port(),
    )
}

#[test]
fn help_lists_every_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--data-dir",
        "--listen",
        "--http-listen",
        "--grpc-listen",
        "--grpc-advertise",
        "--advertise",
        "--broker-name",
        "--cluster",
        "--peers",
        "--flush-mode",
        "--segment-size",
        "--auto-create-topics",
        "--transaction-timeout-ms",
        "--transaction-check-max",
        "--transaction-check-interval-ms",
        "--timer-max-delay-ms",
    ] {
        assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
    }
    assert!(help.contains("QUIVER_DATA_DIR"));
}

#[test]
fn invalid_config_names_the_field() {
    let out = Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .args(["--segment-size", "10"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("segment-size"));
}

#[test]
fn sigterm_exits_zero() {
    let dir = tempfile::tempdir().unwrap();
    let (port, http_port) = two_free_ports();
    // Beside the data dir, not in it: what the broker said if it exits early.
    let log_dir = tempfile::tempdir().unwrap();
    let log_path = log_dir.path().join("broker.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_quiver-broker"))
        .env("QUIVER_DATA_DIR", dir.path())
        .env("QUIVER_SEGMENT_SIZE", "1048576")
        .env("QUIVER_MAX_MESSAGE_SIZE", "65536")
        // Not the default 0.0.0.0:8081: another broker on the machine may hold it.
        .env("QUIVER_GRPC_LISTEN", "off")
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = format!("127.0.0.1:{http_port}").parse().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while runtime
        .block_on(common::http_get(http, "/readyz"))
        .is_none_or(|(status, _)| status != 200)
    {
        assert!(
            child.try_wait().unwrap().is_none(),
            "broker exited early: {}",
            std::fs::read_to_string(&log_path).unwrap_or_default()
        );
        assert!(Instant::now() < deadline, "broker not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(exit) = child.try_wait().unwrap() {
            break exit;
        }
        if Instant::now() > deadline {
            child.kill().ok();
            panic!("broker did not stop within 15 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(exit.code(), Some(0));
    // A clean stop persisted the config files.
    assert!(dir.path().join("config").join("topics.json").exists());
}
