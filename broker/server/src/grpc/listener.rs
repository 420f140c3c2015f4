//! Accepting the gRPC port's connections: plain, or TLS as the remoting port's `tls-mode`
//! says (a ClientHello is handshaken; a plain connection is served when permissive, closed
//! when enforcing), with the same certificate and its reloads; then hyper's HTTP/2 server on
//! each, its calls served on the connection's own task (`connection.rs`).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use quiver_grpc_proto::v2::messaging_service_server::MessagingServiceServer;
use quiver_remoting::tls::HANDSHAKE_TIMEOUT;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;
use tonic::codegen::http;
use tonic::codegen::Service as _;

use super::connection::OnConnection;
use super::messaging::Messaging;
use crate::broker::Broker;
use crate::config::TlsMode;
use crate::slots::ConnectionSlot;
use crate::tls::{classify, peek_first_byte, FirstByte, Port, TlsServer};

/// Pings on idle HTTP/2 connections, so a vanished client's streams end.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
/// HTTP/2 flow-control windows: a receive answers up to 32 messages of up to max-message-size
/// each; 64 KiB windows (the HTTP/2 default) would stall it for WINDOW_UPDATEs every 64 KiB.
const STREAM_WINDOW: u32 = 1024 * 1024;
const CONNECTION_WINDOW: u32 = 4 * 1024 * 1024;

/// The remote address of a call, as the HTTP/2 server hands it to each request.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RemoteAddr(pub SocketAddr);

/// Who is at the other end of a connection, and the connection slot it holds until it ends.
pub(crate) struct Peer {
    remote: SocketAddr,
    _slot: ConnectionSlot,
}

/// One accepted connection, plain or TLS.
pub(crate) enum GrpcStream {
    Plain(TcpStream, Peer),
    Tls(Box<TlsStream<TcpStream>>, Peer),
}

impl GrpcStream {
    fn remote(&self) -> SocketAddr {
        match self {
            GrpcStream::Plain(_, peer) | GrpcStream::Tls(_, peer) => peer.remote,
        }
    }
}

impl AsyncRead for GrpcStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcStream::Plain(stream, _) => Pin::new(stream).poll_read(cx, buf),
            GrpcStream::Tls(stream, _) => Pin::new(stream.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for GrpcStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            GrpcStream::Plain(stream, _) => Pin::new(stream).poll_write(cx, buf),
            GrpcStream::Tls(stream, _) => Pin::new(stream.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcStream::Plain(stream, _) => Pin::new(stream).poll_flush(cx),
            GrpcStream::Tls(stream, _) => Pin::new(stream.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            GrpcStream::Plain(stream, _) => Pin::new(stream).poll_shutdown(cx),
            GrpcStream::Tls(stream, _) => Pin::new(stream.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The service as one connection calls it: each request carries the connection's remote
/// address (`Caller` reads it).
#[derive(Clone)]
struct Service {
    messaging: MessagingServiceServer<Messaging>,
    remote: SocketAddr,
}

impl hyper::service::Service<http::Request<hyper::body::Incoming>> for Service {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = <MessagingServiceServer<Messaging> as tonic::codegen::Service<
        http::Request<hyper::body::Incoming>,
    >>::Future;

    fn call(&self, mut request: http::Request<hyper::body::Incoming>) -> Self::Future {
        request.extensions_mut().insert(RemoteAddr(self.remote));
        // The generated service is always ready: no poll_ready before the call.
        self.messaging.clone().call(request)
    }
}

/// Serves `MessagingService` on `listener` until `stop` flips; then the Telemetry streams
/// end and each connection finishes its calls in flight (HTTP/2 GOAWAY).
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    stop: watch::Receiver<bool>,
) {
    broker
        .grpc()
        .serve_check_backs(super::transaction::check_back);
    let renewing = tokio::spawn(super::renew::run(broker.clone(), stop.clone()));
    // A message body up to max-message-size, plus its properties and the request's framing.
    let max_request = broker.config().max_message_size as usize + 1024 * 1024;
    let messaging = MessagingServiceServer::new(Messaging::new(broker.clone(), stop.clone()))
        .max_decoding_message_size(max_request);
    let mut connections = accept_loop(&broker, listener, tls, messaging, stop).await;
    broker.grpc().sessions.close_all();
    while connections.join_next().await.is_some() {}
    renewing.abort();
}

/// Once `stop` is true (its guard not held across an await, so the future stays `Send`).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await;
}

/// Accepts until `stop` flips; the connections' tasks, still serving.
async fn accept_loop(
    broker: &Arc<Broker>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    messaging: MessagingServiceServer<Messaging>,
    mut stop: watch::Receiver<bool>,
) -> JoinSet<()> {
    let tls_mode = broker.config().tls_mode;
    let mut connections = JoinSet::new();
    loop {
        let (stream, remote) = tokio::select! {
            () = stopped(&mut stop) => return connections,
            next = listener.accept() => match next {
                Ok(pair) => pair,
                Err(error) => {
                    // Out of file descriptors and similar: back off instead of spinning.
                    tracing::warn!(%error, "gRPC accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Reaps the connections that ended, so the set holds the open ones only.
        while connections.try_join_next().is_some() {}
        // gRPC connections count against the remoting port's limits: one budget of sockets.
        let Some(slot) = crate::server::take_slot(broker, remote) else {
            drop(stream);
            continue;
        };
        let peer = Peer {
            remote,
            _slot: slot,
        };
        let _ = stream.set_nodelay(true);
        let (tls, messaging, stop) = (tls.clone(), messaging.clone(), stop.clone());
        connections.spawn(async move {
            let stream = match tls {
                Some(tls) if tls_mode != TlsMode::Disabled => {
                    handshake(stream, peer, &tls, tls_mode).await
                }
                _ => Some(GrpcStream::Plain(stream, peer)),
            };
            if let Some(stream) = stream {
                serve_connection(stream, messaging, stop).await;
            }
        });
    }
}

/// HTTP/2 on one connection, its calls on this task, until the client goes or `stop` flips
/// (then the calls in flight finish first).
async fn serve_connection(
    stream: GrpcStream,
    messaging: MessagingServiceServer<Messaging>,
    mut stop: watch::Receiver<bool>,
) {
    let remote = stream.remote();
    let executor = OnConnection::default();
    let mut http2 = hyper::server::conn::http2::Builder::new(executor.clone());
    http2
        .timer(TokioTimer::new())
        .keep_alive_interval(KEEPALIVE_INTERVAL)
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW);
    let connection = http2.serve_connection(TokioIo::new(stream), Service { messaging, remote });
    let served = executor
        .drive(async move {
            let mut connection = std::pin::pin!(connection);
            tokio::select! {
                done = connection.as_mut() => return done,
                () = stopped(&mut stop) => connection.as_mut().graceful_shutdown(),
            }
            connection.await
        })
        .await;
    if let Err(error) = served {
        tracing::debug!(%remote, %error, "gRPC connection ended");
    }
}

/// A connection to a TLS-enabled gRPC port: None when it is closed instead of served.
async fn handshake(
    stream: TcpStream,
    peer: Peer,
    tls: &TlsServer,
    mode: TlsMode,
) -> Option<GrpcStream> {
    let first = tokio::time::timeout(HANDSHAKE_TIMEOUT, peek_first_byte(&stream))
        .await
        .ok()?
        .ok()??;
    match (classify(first), mode) {
        (FirstByte::Tls, _) => {
            let stream = tls.accept(stream, Port::Grpc).await.ok()?;
            Some(GrpcStream::Tls(Box::new(stream), peer))
        }
        (FirstByte::Plain, TlsMode::Enforcing) => {
            let remote = peer.remote;
            tracing::debug!(%remote, "plain gRPC connection with tls-mode enforcing; closing");
            None
        }
        (FirstByte::Plain, _) => Some(GrpcStream::Plain(stream, peer)),
    }
}
