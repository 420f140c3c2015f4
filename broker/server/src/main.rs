//! `quiver-broker`: parses the config, starts tracing, binds the ports and runs until SIGTERM.

#![forbid(unsafe_code)]

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context as _;
use quiver_broker::BrokerConfig;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let config = match BrokerConfig::from_args(std::env::args_os()) {
        Ok(config) => config,
        Err(quiver_broker::ConfigError::Args(error)) => error.exit(),
        Err(error) => return Err(error).context("invalid configuration"),
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.worker_threads > 0 {
        runtime.worker_threads(config.worker_threads);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&config.listen)
            .await
            .with_context(|| format!("binding --listen {}", config.listen))?;
        let http = tokio::net::TcpListener::bind(&config.http_listen)
            .await
            .with_context(|| format!("binding --http-listen {}", config.http_listen))?;
        quiver_broker::run(config, listener, Some(http), shutdown_signal())
            .await
            .context("broker failed")
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(term) => term,
        Err(error) => {
            tracing::error!(%error, "cannot listen for SIGTERM; stopping on Ctrl-C only");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}
