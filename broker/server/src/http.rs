//! The HTTP port: GET /metrics, /healthz, /readyz, served by hyper one request per connection.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::broker::{Broker, BrokerSlot};
use crate::tls::{Port, TlsServer};

/// Connections served at once; more are closed on accept (scrapers and probes need few).
const MAX_CONNECTIONS: usize = 64;
/// hyper's smallest read buffer: a request head larger than this is refused.
const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;
/// A client has this long to send its request head.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one connection, the scrape's store reads included, so no client pins a task.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// What a request may read: the broker once open, and the metrics registry.
#[derive(Clone)]
struct Endpoints {
    broker: BrokerSlot,
    registry: Arc<Registry>,
}

/// Serves until `stop` flips, then drops the connections in flight. Runs from the start, so
/// /healthz answers during recovery while /readyz says 503 until the broker serves. `tls`
/// (its metrics are served) handshakes every connection when `serve_tls` is set.
pub async fn serve(
    listener: TcpListener,
    broker: BrokerSlot,
    cluster: Arc<str>,
    mut stop: watch::Receiver<bool>,
    tls: Option<Arc<TlsServer>>,
    serve_tls: bool,
) {
    let registry = Arc::new(crate::exposition::registry(
        &cluster,
        broker.clone(),
        tls.clone(),
    ));
    let endpoints = Endpoints { broker, registry };
    let tls = tls.filter(|_| serve_tls);
    let connection_slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, remote)) => {
                    let Ok(slot) = connection_slots.clone().try_acquire_owned() else {
                        tracing::debug!(%remote, "http connection limit reached; closing");
                        continue;
                    };
                    connections.spawn(handshake_then_serve(stream, tls.clone(), endpoints.clone(), slot));
                }
                Err(error) => {
                    tracing::warn!(%error, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn handshake_then_serve(
    stream: TcpStream,
    tls: Option<Arc<TlsServer>>,
    endpoints: Endpoints,
    slot: OwnedSemaphorePermit,
) {
    match tls {
        None => serve_connection(stream, endpoints, slot).await,
        Some(tls) => {
            if let Ok(stream) = tls.accept(stream, Port::Http).await {
                serve_connection(stream, endpoints, slot).await;
            }
        }
    }
}

async fn serve_connection<S>(stream: S, endpoints: Endpoints, _slot: OwnedSemaphorePermit)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request: Request<Incoming>| {
        let endpoints = endpoints.clone();
        async move { Ok::<_, Infallible>(respond(&endpoints, &request).await) }
    });
    let connection = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD_BYTES)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => tracing::debug!(%error, "http connection failed"),
        Err(_) => tracing::debug!("http connection timed out"),
    }
}

async fn respond(endpoints: &Endpoints, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    let broker = endpoints.broker.get();
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/metrics") => scrape(endpoints.registry.clone()).await,
        (&Method::GET, "/healthz") => text(StatusCode::OK, "ok\n".into()),
        (&Method::GET, "/readyz") if broker.is_some_and(|b| b.is_ready()) => {
            text(StatusCode::OK, ready_text(broker.map(Arc::as_ref)))
        }
        (&Method::GET, "/readyz") => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into()),
        (&Method::GET, "/debug/stages") => stages(broker.map(Arc::as_ref), request.uri().query()),
        (&Method::GET, _) => text(StatusCode::NOT_FOUND, "not found\n".into()),
        _ => text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed\n".into(),
        ),
    }
}

/// Encodes the registry on a blocking thread: the collector reads the store.
async fn scrape(registry: Arc<Registry>) -> Response<Full<Bytes>> {
    match tokio::task::spawn_blocking(move || crate::exposition::encode(&registry)).await {
        Ok(exposition) => response(StatusCode::OK, crate::exposition::CONTENT_TYPE, exposition),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
    }
}

/// Per-stage percentiles of the samples completed after `?since_ns=` (all when absent).
fn stages(broker: Option<&Broker>, query: Option<&str>) -> Response<Full<Bytes>> {
    let Some(recorder) = broker.map(|broker| broker.stages()) else {
        return text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n".into());
    };
    if !recorder.is_on() {
        let off = "stage sampling is off: start the broker with --stage-sample-every N\n";
        return text(StatusCode::NOT_FOUND, off.into());
    }
    let since = query
        .into_iter()
        .flat_map(|query| query.split('&'))
        .find_map(|pair| pair.strip_prefix("since_ns="))
        .map(str::parse::<u64>);
    let since = match since.transpose() {
        Ok(since) => since.unwrap_or(0),
        Err(error) => return text(StatusCode::BAD_REQUEST, format!("since_ns: {error}\n")),
    };
    match serde_json::to_string(&recorder.report(since)) {
        Ok(body) => response(StatusCode::OK, "application/json", body),
        Err(error) => text(StatusCode::INTERNAL_SERVER_ERROR, format!("{error}\n")),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    response(status, "text/plain", body)
}

fn response(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(Bytes::from(body)))
        .expect("static response parts are valid")
}

/// The /readyz body of a serving broker: "ready", and why it is read-only if it is. Still
/// 200 then, so consumers can drain it.
fn ready_text(broker: Option<&Broker>) -> String {
    match broker.and_then(|b| b.store().disk_status().refusal) {
        Some(refusal) => format!(
            "ready, read-only ({}): {}\n",
            refusal.reason.as_str(),
            refusal.message
        ),
        None => "ready\n".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn send(addr: std::net::SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response))
            .await
            .expect("the server answers and closes")
            .unwrap();
        response
    }

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        send(addr, &format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n")).await
    }

    /// A server with no broker yet (recovering), and the sender that stops it.
    async fn recovering_server() -> (
        std::net::SocketAddr,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = watch::channel(false);
        let slot = BrokerSlot::default();
        let server = tokio::spawn(serve(listener, slot, Arc::from("C"), stopped, None, false));
        (addr, stop, server)
    }

    #[tokio::test]
    async fn recovering_broker_is_live_but_not_ready() {
        let (addr, stop, server) = recovering_server().await;
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        let metrics = get(addr, "/metrics").await;
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("content-type: text/plain; version=0.0.4"));
        assert!(
            metrics.contains("\r\n\r\n# HELP quiver_broker_ready "),
            "{metrics}"
        );
        assert!(metrics.contains("quiver_broker_ready{cluster=\"C\"} 0\n"));
        stop.send(true).unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn unknown_paths_and_methods_are_refused() {
        let (addr, stop, server) = recovering_server().await;
        assert!(get(addr, "/nothing").await.starts_with("HTTP/1.1 404"));
        let post = send(addr, "POST /metrics HTTP/1.1\r\nHost: t\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let huge_head = format!(
            "GET /healthz HTTP/1.1\r\nHost: t\r\nX: {}\r\n\r\n",
            "x".repeat(2 * MAX_REQUEST_HEAD_BYTES)
        );
        let refused = send(addr, &huge_head).await;
        assert!(!refused.starts_with("HTTP/1.1 200"), "{refused}");
        stop.send(true).unwrap();
        server.await.unwrap();
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_and_stop_drops_the_rest() {
        let (addr, stop, server) = recovering_server().await;
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // The server accepts in order: once this one is closed, all the idle ones hold slots.
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
        stop.send(true).unwrap();
        server.await.unwrap();
        let read = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }
}
