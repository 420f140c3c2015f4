//! The connection layer against peers that misbehave: one that never answers (timeout) and
//! one that hangs up (connection closed), then reconnects on the next request.

use std::time::Duration;

use quiver_client::remoting::RemotingClient;
use quiver_client::ClientError;
use quiver_protocol::{code, ExtFields, RemotingCommand};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

fn ping() -> RemotingCommand {
    RemotingCommand::request(code::request::GET_BROKER_CONFIG, ExtFields::default())
}

#[tokio::test]
async fn silent_peer_times_out_and_closing_peer_is_reported_then_reconnected() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    // Accepts two connections: reads the first until the client gives up, closes the second at once.
    let peer = tokio::spawn(async move {
        let (mut silent, _) = listener.accept().await.expect("first connection");
        let mut sink = Vec::new();
        // Reads (never answers) until the client closes its side, at most 10 s.
        let _ = tokio::time::timeout(Duration::from_secs(10), silent.read_to_end(&mut sink)).await;
        drop(silent);
        let (closing, _) = listener.accept().await.expect("second connection");
        drop(closing);
        listener
    });

    let client = RemotingClient::new();
    match client
        .invoke(&addr, ping(), Duration::from_millis(200))
        .await
    {
        Err(ClientError::Timeout {
            addr: a,
            code,
            timeout_ms,
        }) => {
            assert_eq!(
                (a.as_str(), code, timeout_ms),
                (addr.as_str(), code::request::GET_BROKER_CONFIG, 200)
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    client.close_all().await;
    // A fresh connection (the old one was closed), which the peer hangs up.
    match client.invoke(&addr, ping(), Duration::from_secs(5)).await {
        Err(ClientError::ConnectionClosed { addr: a }) => assert_eq!(a, addr),
        other => panic!("expected connection closed, got {other:?}"),
    }
    let listener = tokio::time::timeout(Duration::from_secs(5), peer)
        .await
        .expect("peer done")
        .expect("peer ok");
    drop(listener);
    match client.invoke(&addr, ping(), Duration::from_secs(5)).await {
        Err(ClientError::Connect { addr: a, .. }) => assert_eq!(a, addr),
        other => panic!("expected connect failure once nobody listens, got {other:?}"),
    }
}
