//! The HTTP port: GET /metrics, /healthz, /readyz. A minimal HTTP/1.1 responder: one request
//! per connection, then close.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::broker::Broker;

const MAX_REQUEST_HEAD_BYTES: usize = 8 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The broker once it has opened; empty while the store recovers.
pub type BrokerSlot = Arc<OnceLock<Arc<Broker>>>;

/// Serves until `stop` flips. Runs from the start, so /healthz answers during recovery while
/// /readyz says 503 until the broker serves.
pub async fn serve(
    listener: TcpListener,
    broker: BrokerSlot,
    cluster: Arc<str>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let broker = broker.clone();
                    let cluster = cluster.clone();
                    tokio::spawn(async move {
                        if let Err(error) = tokio::time::timeout(REQUEST_TIMEOUT, answer(stream, broker, cluster)).await {
                            tracing::debug!(%error, "http request timed out");
                        }
                    });
                }
                Err(error) => {
                    tracing::warn!(%error, "http accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

async fn answer(mut stream: TcpStream, slot: BrokerSlot, cluster: Arc<str>) {
    let broker = slot.get().cloned();
    let ready = broker.as_ref().is_some_and(|b| b.is_ready());
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        if head.len() > MAX_REQUEST_HEAD_BYTES {
            return;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head);
    let mut parts = text.split_whitespace();
    let method = parts.next().unwrap_or("");
    let path = parts.next().unwrap_or("").split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => {
            let scrape = broker.clone();
            let render = move || match scrape {
                Some(broker) => crate::metrics::render(&broker, crate::now_ms()),
                None => crate::metrics::render_recovering(&cluster),
            };
            match tokio::task::spawn_blocking(render).await {
                Ok(text) => ("200 OK", "text/plain; version=0.0.4", text),
                Err(error) => (
                    "500 Internal Server Error",
                    "text/plain",
                    format!("{error}\n"),
                ),
            }
        }
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_string()),
        ("GET", "/readyz") if ready => ("200 OK", "text/plain", ready_text(broker.as_deref())),
        ("GET", "/readyz") => (
            "503 Service Unavailable",
            "text/plain",
            "not ready\n".to_string(),
        ),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_string()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "method not allowed\n".to_string(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The /readyz body of a serving broker: "ready", and why it is read-only if it is. Still
/// 200 then, so consumers can drain it.
fn ready_text(broker: Option<&Broker>) -> String {
    match broker.and_then(|b| b.store.disk_status().refusal) {
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

    async fn get(addr: std::net::SocketAddr, path: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn recovering_broker_is_live_but_not_ready() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let server = tokio::spawn(serve(
            listener,
            BrokerSlot::default(),
            Arc::from("C"),
            stopped,
        ));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 503"));
        assert!(get(addr, "/metrics")
            .await
            .contains("quiver_broker_ready{cluster=\"C\"} 0"));
        stop.send(true).unwrap();
        server.await.unwrap();
    }
}
