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
    raise_open_file_limit(config.max_connections);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if config.worker_threads > 0 {
        runtime.worker_threads(config.worker_threads);
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async move {
        let listener = bind_with_backlog(&config.listen, LISTEN_BACKLOG)
            .await
            .with_context(|| format!("binding --listen {}", config.listen))?;
        let http = tokio::net::TcpListener::bind(&config.http_listen)
            .await
            .with_context(|| format!("binding --http-listen {}", config.http_listen))?;
        let grpc = match config.grpc_listen() {
            Some(address) => Some(
                bind_with_backlog(address, LISTEN_BACKLOG)
                    .await
                    .with_context(|| format!("binding --grpc-listen {address}"))?,
            ),
            None => None,
        };
        quiver_broker::run_with_grpc(config, listener, Some(http), grpc, shutdown_signal())
            .await
            .context("broker failed")
    })
}

/// Connections the kernel completes before the broker accepts them (capped by somaxconn): a
/// fleet of clients reconnecting at once is not made to wait out SYN retries.
const LISTEN_BACKLOG: u32 = 4096;

async fn bind_with_backlog(
    address: &str,
    backlog: u32,
) -> std::io::Result<tokio::net::TcpListener> {
    let address = tokio::net::lookup_host(address)
        .await?
        .next()
        .ok_or_else(|| std::io::Error::other("the address resolves to nothing"))?;
    let socket = if address.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(backlog)
}

/// Files open beside client connections: the store's segments, queues, indexes, peers.
const FILES_BESIDE_CONNECTIONS: u64 = 1024;

/// Raises the soft open-file limit to the hard one (as Go and the JVM's launchers do), so
/// `max-connections` is not cut short by a default of 1024; warns when even that is too low.
fn raise_open_file_limit(max_connections: usize) {
    let wanted = max_connections as u64 + FILES_BESIDE_CONNECTIONS;
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) if limit < wanted => tracing::warn!(
            limit,
            max_connections,
            "the open-file limit is below max-connections plus the store's files; \
             connections beyond it are refused by the operating system (raise ulimit -n)"
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "cannot raise the open-file limit"),
    }
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
