//! One plain HTTP/1.1 GET to a broker's HTTP port (metrics, stage times).

use std::net::SocketAddr;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// GET `path` on `http`, on a connection of its own: the answer's status and body.
pub async fn get(http: SocketAddr, path: &str) -> anyhow::Result<(StatusCode, Bytes)> {
    let stream = TcpStream::connect(http)
        .await
        .with_context(|| format!("connecting to {http} for {path}"))?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, http.to_string())
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, body))
}
