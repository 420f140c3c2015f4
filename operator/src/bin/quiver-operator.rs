//! quiver-operator: parses flags, starts tracing, the HTTP port and leader election, then runs
//! the controllers while leading.

#![forbid(unsafe_code)]

use anyhow::Context as _;
use clap::Parser;
use kube::Client;
use quiver_operator::controller::{self, Context};
use quiver_operator::desired;
use quiver_operator::http::{self, Health};
use quiver_operator::leader::{self, Candidate, Leadership};
use quiver_operator::metrics::Metrics;
use quiver_operator::remoting_admin::RemotingAdmin;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

#[derive(Debug, Parser)]
#[command(
    name = "quiver-operator",
    version,
    about = "Kubernetes operator for Quiver brokers"
)]
struct Args {
    /// Watch only this namespace (default: all namespaces).
    #[arg(long, env = "QUIVER_NAMESPACE")]
    namespace: Option<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "QUIVER_HTTP_LISTEN", default_value = "0.0.0.0:8080")]
    http_listen: String,
    /// Seconds between lag polls of each ConsumerGroup (>= 1).
    #[arg(long, env = "QUIVER_LAG_INTERVAL_SECONDS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    lag_interval_seconds: u64,
    /// Run the controllers only while holding the leader Lease.
    #[arg(long, env = "QUIVER_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// Log format: json (structured) or text.
    #[arg(long, env = "QUIVER_LOG_FORMAT", default_value = "json", value_parser = ["json", "text"])]
    log_format: String,
    /// Labels of the operator's own pods, `key=value[,key=value]`: the Brokers'
    /// NetworkPolicies admit only these pods of the operator's namespace (default: all of them).
    #[arg(long, env = "QUIVER_OPERATOR_POD_LABELS", default_value = "", value_parser = desired::parse_labels)]
    operator_pod_labels: BTreeMap<String, String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    if args.log_format == "json" {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }

    let client = Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(forward_signals(stop_tx));

    let listener = tokio::net::TcpListener::bind(&args.http_listen)
        .await
        .with_context(|| format!("binding --http-listen {}", args.http_listen))?;
    let http_addr = listener
        .local_addr()
        .context("reading the HTTP listener's address")?;
    tracing::info!(addr = %http_addr, "serving /metrics /healthz /readyz");
    let http_task = tokio::spawn(http::serve(
        listener,
        metrics.clone(),
        health.clone(),
        stopped(stop_rx.clone()),
    ));

    let admin = Arc::new(RemotingAdmin::default());
    let ctx = Arc::new(
        Context::new(
            client.clone(),
            admin,
            metrics,
            Duration::from_secs(args.lag_interval_seconds),
        )
        .with_operator_pod_labels(args.operator_pod_labels),
    );

    let outcome = if args.leader_election {
        run_as_leader(client, ctx, args.namespace, health, stop_rx).await
    } else {
        health.set_ready(true);
        controller::run(ctx, args.namespace, stopped(stop_rx)).await;
        Ok(())
    };
    http_task.abort();
    tracing::info!("stopped");
    outcome
}

/// Competes for the Lease and runs the controllers while leading. Losing the lease is an error
/// so the pod restarts and competes again with a clean state.
async fn run_as_leader(
    client: Client,
    ctx: Arc<Context>,
    namespace: Option<String>,
    health: Arc<Health>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let candidate = Candidate {
        namespace: namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string()),
        identity: std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .unwrap_or_else(|_| format!("quiver-operator-{}", std::process::id())),
    };
    // A standby replica is healthy and ready: it takes over when the leader goes.
    health.set_ready(true);
    let outcome = leader::run_while_leading(client, candidate, stopped(stop), |shutdown| {
        controller::run(ctx, namespace, shutdown)
    })
    .await
    .context("leader election")?;
    match outcome {
        Leadership::Stopped => Ok(()),
        Leadership::Lost => anyhow::bail!("lost the leader Lease; exiting to compete again"),
    }
}

async fn stopped(mut stop: watch::Receiver<bool>) {
    stop.wait_for(|stopped| *stopped).await.ok();
}

async fn forward_signals(stop: watch::Sender<bool>) {
    let mut terminate =
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(signal) => signal,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                return;
            }
        };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = terminate.recv() => {},
    }
    tracing::info!("shutdown requested");
    stop.send(true).ok();
}

#[cfg(test)]
mod tests {
    use super::Args;
    use clap::Parser;

    #[test]
    fn defaults_match_the_chart_contract() {
        let args = Args::try_parse_from(["quiver-operator"]).expect("defaults parse");
        assert_eq!(args.namespace, None);
        assert_eq!(args.http_listen, "0.0.0.0:8080");
        assert_eq!(args.lag_interval_seconds, 30);
        assert!(args.leader_election);
    }

    #[test]
    fn flags_are_read() {
        let args = Args::try_parse_from([
            "quiver-operator",
            "--namespace",
            "team-a",
            "--http-listen",
            "127.0.0.1:9090",
            "--lag-interval-seconds",
            "5",
            "--leader-election",
            "false",
            "--log-format",
            "text",
        ])
        .expect("flags parse");
        assert_eq!(args.namespace.as_deref(), Some("team-a"));
        assert_eq!(args.http_listen, "127.0.0.1:9090");
        assert_eq!(args.lag_interval_seconds, 5);
        assert!(!args.leader_election);
        assert_eq!(args.log_format, "text");
    }

    #[test]
    fn a_zero_lag_interval_is_refused() {
        assert!(Args::try_parse_from(["quiver-operator", "--lag-interval-seconds", "0"]).is_err());
    }
}
