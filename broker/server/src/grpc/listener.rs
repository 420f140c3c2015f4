//! Accepting the gRPC port's connections: plain, or TLS as the remoting port's `tls-mode`
//! says (a ClientHello is handshaken; a plain connection is served when permissive, closed
//! when enforcing), with the same certificate and its reloads.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use quiver_grpc_proto::v2::messaging_service_server::MessagingServiceServer;
use quiver_remoting::tls::HANDSHAKE_TIMEOUT;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;

use super::messaging::Messaging;
use crate::broker::Broker;
use crate::config::TlsMode;
use crate::slots::ConnectionSlot;
use crate::tls::{classify, peek_first_byte, FirstByte, Port, TlsServer};

/// Connections handshaken and waiting for the HTTP/2 server to take them.
const ACCEPTED_QUEUE: usize = 64;
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

impl tonic::transport::server::Connected for GrpcStream {
    type ConnectInfo = RemoteAddr;

    fn connect_info(&self) -> RemoteAddr {
        match self {
            GrpcStream::Plain(_, peer) | GrpcStream::Tls(_, peer) => RemoteAddr(peer.remote),
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

/// Serves `MessagingService` on `listener` until `stop` flips; then the Telemetry streams
/// end and the server waits for the calls in flight.
pub async fn serve(
    broker: Arc<Broker>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    stop: watch::Receiver<bool>,
) {
    broker
        .grpc()
        .serve_check_backs(super::transaction::check_back);
    let (accepted_tx, accepted_rx) = mpsc::channel(ACCEPTED_QUEUE);
    let renewing = tokio::spawn(super::renew::run(broker.clone(), stop.clone()));
    let tls_mode = broker.config().tls_mode;
    let accepting = tokio::spawn(accept_loop(
        broker.clone(),
        listener,
        tls,
        tls_mode,
        accepted_tx,
        stop.clone(),
    ));
    // A message body up to max-message-size, plus its properties and the request's framing.
    let max_request = broker.config().max_message_size as usize + 1024 * 1024;
    let service = MessagingServiceServer::new(Messaging::new(broker.clone(), stop.clone()))
        .max_decoding_message_size(max_request);
    let mut stopping = stop.clone();
    let sessions_broker = broker.clone();
    let shutdown = async move {
        let _ = stopping.wait_for(|stopped| *stopped).await;
        sessions_broker.grpc().sessions.close_all();
    };
    let served = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .serve_with_incoming_shutdown(service, ReceiverStream::new(accepted_rx), shutdown)
        .await;
    if let Err(error) = served {
        tracing::error!(%error, "the gRPC server failed");
    }
    accepting.abort();
    renewing.abort();
}

async fn accept_loop(
    broker: Arc<Broker>,
    listener: TcpListener,
    tls: Option<Arc<TlsServer>>,
    tls_mode: TlsMode,
    accepted: mpsc::Sender<io::Result<GrpcStream>>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (stream, remote) = tokio::select! {
            _ = stop.changed() => return,
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
        // gRPC connections count against the remoting port's limits: one budget of sockets.
        let Some(slot) = crate::server::take_slot(&broker, remote) else {
            drop(stream);
            continue;
        };
        let peer = Peer {
            remote,
            _slot: slot,
        };
        let _ = stream.set_nodelay(true);
        let accepted = accepted.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let stream = match tls {
                Some(tls) if tls_mode != TlsMode::Disabled => {
                    handshake(stream, peer, &tls, tls_mode).await
                }
                _ => Some(GrpcStream::Plain(stream, peer)),
            };
            if let Some(stream) = stream {
                let _ = accepted.send(Ok(stream)).await;
            }
        });
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
