//! Answers far larger than the read buffer (a pull's messages), arriving in small pieces with
//! the next answer right behind them, reach their callers byte-exact.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quiver_client::remoting::RemotingClient;
use quiver_protocol::{code, frame, ExtFields, RemotingCommand};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

fn body(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|n| (n % 251) as u8 ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn a_large_answer_read_in_small_pieces_arrives_whole_and_the_next_after_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    let sizes = [3 * 1024 * 1024 + 17, 100];
    let peer = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.expect("connection");
        let mut buf = BytesMut::new();
        let mut requests = Vec::new();
        // Both requests, then both answers in one stream cut into 1,000-byte writes.
        while requests.len() < 2 {
            while let Some(request) = frame::decode(&mut buf).expect("request") {
                requests.push(request);
            }
            if requests.len() < 2 && conn.read_buf(&mut buf).await.expect("read") == 0 {
                panic!("client hung up");
            }
        }
        // The large answer (to GET_BROKER_CONFIG) goes first, whichever request came first.
        requests.sort_by_key(|r| r.code != code::request::GET_BROKER_CONFIG);
        let mut out = BytesMut::new();
        for (request, (size, seed)) in requests.iter().zip(sizes.iter().zip([1u8, 2])) {
            let mut answer = request.response_to(code::response::SUCCESS, None);
            answer.body = body(*size, seed);
            frame::encode(&answer, &mut out).expect("encode");
        }
        for piece in out.chunks(1000) {
            conn.write_all(piece).await.expect("write");
        }
        conn.flush().await.expect("flush");
        // Keeps the connection open until the client is done.
        let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_u8()).await;
    });

    let client = RemotingClient::new();
    let request = |code| RemotingCommand::request(code, ExtFields::default());
    let (big, small) = tokio::join!(
        client.invoke(
            &addr,
            request(code::request::GET_BROKER_CONFIG),
            Duration::from_secs(10)
        ),
        client.invoke(
            &addr,
            request(code::request::GET_BROKER_RUNTIME_INFO),
            Duration::from_secs(10)
        ),
    );
    assert_eq!(big.expect("large answer").body, body(sizes[0], 1));
    assert_eq!(small.expect("small answer").body, body(sizes[1], 2));
    client.close_all().await;
    peer.await.expect("peer");
}
