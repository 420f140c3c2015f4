//! Two connections joined by an in-memory pipe, one playing the broker and one the client.

use std::time::Duration;

use bytes::Bytes;
use quiver_protocol::{code, ExtFields, RemotingCommand};
use tokio::io::{DuplexStream, ReadHalf};

use crate::{ByteBudget, Connection, ConnectionError, Incoming, Options};

type Side = (Connection, Incoming<ReadHalf<DuplexStream>>);

fn pair_with(client: Options, server: Options) -> (Side, Side) {
    let (near, far) = tokio::io::duplex(64 * 1024);
    let (near_read, near_write) = tokio::io::split(near);
    let (far_read, far_write) = tokio::io::split(far);
    (
        Connection::from_parts(near_read, near_write, client),
        Connection::from_parts(far_read, far_write, server),
    )
}

fn pair() -> (Side, Side) {
    pair_with(Options::new("server"), Options::new("client"))
}

fn request(code: i32) -> RemotingCommand {
    RemotingCommand::request(code, ExtFields::default())
}

const LONG: Duration = Duration::from_secs(10);

#[tokio::test]
async fn responses_answer_their_requests_by_opaque_even_out_of_order() {
    let ((client, mut client_in), (server, mut server_in)) = pair();
    tokio::spawn(async move { while let Ok(Some(_)) = client_in.next().await {} });
    let answering = tokio::spawn(async move {
        let first = server_in.next().await.unwrap().unwrap().command;
        let second = server_in.next().await.unwrap().unwrap().command;
        for asked in [second, first] {
            let answer = asked
                .response_to(code::response::SUCCESS, None)
                .with_body(Bytes::from(asked.code.to_string()));
            server.respond(answer).await.unwrap();
        }
        server_in
    });
    let (a, b) = tokio::join!(
        client.request(request(10), LONG),
        client.request(request(11), LONG)
    );
    assert_eq!(a.unwrap().body, Bytes::from("10"));
    assert_eq!(b.unwrap().body, Bytes::from("11"));
    answering.await.unwrap();
}

#[tokio::test]
async fn a_oneway_frame_arrives_flagged_and_expects_nothing() {
    let ((client, _client_in), (_server, mut server_in)) = pair();
    client.send_oneway(request(34)).await.unwrap();
    let got = server_in.next().await.unwrap().unwrap().command;
    assert_eq!(got.code, 34);
    assert!(got.is_oneway());
}

#[tokio::test]
async fn the_server_asks_and_the_client_answers_on_the_same_connection() {
    let ((client, mut client_in), (server, mut server_in)) = pair();
    // The server's reader must run to route the client's answer back.
    tokio::spawn(async move { while let Ok(Some(_)) = server_in.next().await {} });
    tokio::spawn(async move {
        while let Ok(Some(inbound)) = client_in.next().await {
            let asked = inbound.command;
            assert_eq!(asked.code, code::request::GET_CONSUMER_RUNNING_INFO);
            let answer = asked
                .response_to(code::response::SUCCESS, None)
                .with_body(Bytes::from_static(b"running"));
            client.respond(answer).await.unwrap();
        }
    });
    let answer = server
        .request(request(code::request::GET_CONSUMER_RUNNING_INFO), LONG)
        .await
        .unwrap();
    assert_eq!(answer.body, Bytes::from_static(b"running"));
}

#[tokio::test]
async fn an_unanswered_request_times_out_and_a_late_answer_is_dropped() {
    let ((client, mut client_in), (server, mut server_in)) = pair();
    let reading = tokio::spawn(async move { while let Ok(Some(_)) = client_in.next().await {} });
    let error = client
        .request(request(10), Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            ConnectionError::Timeout {
                code: 10,
                timeout_ms: 50,
                ..
            }
        ),
        "{error:?}"
    );
    // The late answer finds no waiter; the next request gets its own answer.
    let late = server_in.next().await.unwrap().unwrap().command;
    server
        .respond(late.response_to(code::response::SUCCESS, Some("late".into())))
        .await
        .unwrap();
    let next = tokio::spawn(async move {
        let asked = server_in.next().await.unwrap().unwrap().command;
        server
            .respond(asked.response_to(code::response::SUCCESS, Some("fresh".into())))
            .await
            .unwrap();
    });
    let answer = client.request(request(11), LONG).await.unwrap();
    assert_eq!(answer.remark.as_deref(), Some("fresh"));
    next.await.unwrap();
    reading.abort();
}

#[tokio::test]
async fn closing_fails_pending_requests_and_the_peer_sees_the_end() {
    let ((client, mut client_in), (_server, mut server_in)) = pair();
    tokio::spawn(async move { while let Ok(Some(_)) = client_in.next().await {} });
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.request(request(10), LONG).await })
    };
    assert_eq!(server_in.next().await.unwrap().unwrap().command.code, 10);
    client.close();
    match waiting.await.unwrap() {
        Err(ConnectionError::Closed { reason, .. }) => assert_eq!(reason, "closed by this side"),
        other => panic!("expected closed, got {other:?}"),
    }
    assert!(client.is_closed());
    assert!(
        server_in.next().await.unwrap().is_none(),
        "the write side was shut"
    );
    assert!(matches!(
        client.request(request(11), LONG).await,
        Err(ConnectionError::Closed { .. })
    ));
}

#[tokio::test]
async fn the_peer_hanging_up_fails_pending_requests() {
    let ((client, mut client_in), (server, server_in)) = pair();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.request(request(10), LONG).await })
    };
    let reading = tokio::spawn(async move { client_in.next().await.map(|next| next.is_none()) });
    tokio::time::sleep(Duration::from_millis(20)).await;
    server.close();
    drop(server_in);
    assert!(reading.await.unwrap().unwrap(), "end of stream");
    match waiting.await.unwrap() {
        Err(ConnectionError::Closed { reason, .. }) => {
            assert_eq!(reason, "the peer closed the connection")
        }
        other => panic!("expected closed, got {other:?}"),
    }
}

#[tokio::test]
async fn requests_beyond_the_bound_wait_for_an_answer() {
    let client_options = Options {
        max_pending_requests: 1,
        ..Options::new("server")
    };
    let ((client, mut client_in), (server, mut server_in)) =
        pair_with(client_options, Options::new("client"));
    tokio::spawn(async move { while let Ok(Some(_)) = client_in.next().await {} });
    let first = {
        let client = client.clone();
        tokio::spawn(async move { client.request(request(10), LONG).await })
    };
    let asked = server_in.next().await.unwrap().unwrap().command;
    // The only slot is taken: the second waits for it, here past its timeout, unsent.
    let second = client.request(request(11), Duration::from_millis(50)).await;
    assert!(matches!(
        second,
        Err(ConnectionError::Timeout { code: 11, .. })
    ));
    server
        .respond(asked.response_to(code::response::SUCCESS, None))
        .await
        .unwrap();
    assert_eq!(first.await.unwrap().unwrap().code, code::response::SUCCESS);
    let third = tokio::spawn(async move { client.request(request(12), LONG).await });
    let next = server_in.next().await.unwrap().unwrap().command;
    assert_eq!(next.code, 12, "the timed-out request was never sent");
    server
        .respond(next.response_to(code::response::SUCCESS, None))
        .await
        .unwrap();
    assert!(third.await.unwrap().is_ok());
}

#[tokio::test]
async fn large_chained_bodies_arrive_byte_exact_and_the_language_is_rewritten() {
    let server_options = Options {
        language: Some(quiver_protocol::LANGUAGE_JAVA),
        ..Options::new("client")
    };
    let ((client, mut client_in), (server, mut server_in)) =
        pair_with(Options::new("server"), server_options);
    tokio::spawn(async move { while let Ok(Some(_)) = server_in.next().await {} });
    let part = |len: usize, seed: u8| -> Bytes {
        (0..len)
            .map(|n| (n % 251) as u8 ^ seed)
            .collect::<Vec<u8>>()
            .into()
    };
    let mut push = request(40).into_oneway();
    push.body = part(200 * 1024, 1);
    push.body_chain = vec![part(70_000, 2), part(3, 3)];
    let expected: Vec<u8> = [part(200 * 1024, 1), part(70_000, 2), part(3, 3)].concat();
    assert!(server.try_send(push));
    let got = client_in.next().await.unwrap().unwrap().command;
    assert_eq!(got.body.as_ref(), expected.as_slice());
    assert_eq!(got.language, "JAVA");
    drop(client);
}

#[tokio::test]
async fn a_detached_connection_hands_frames_to_its_receiver() {
    let (connection, mut frames) = Connection::detached("test", 1);
    assert!(connection.try_send(request(40)));
    assert!(!connection.try_send(request(41)), "the queue holds one");
    assert_eq!(frames.recv().await.unwrap().command.code, 40);
}

#[tokio::test]
async fn a_request_keeps_its_frame_bytes_counted_until_dropped() {
    let budget = ByteBudget::new(1 << 20);
    let server_options = Options {
        read_budget: Some(budget.clone()),
        ..Options::new("client")
    };
    let ((client, _client_in), (_server, mut server_in)) =
        pair_with(Options::new("server"), server_options);
    let body = Bytes::from(vec![7u8; 1000]);
    client
        .send_oneway(request(10).with_body(body))
        .await
        .unwrap();
    let inbound = server_in.next().await.unwrap().unwrap();
    let held = inbound.held_bytes.bytes();
    assert!(held > 1000, "the whole frame is counted: {held}");
    let before = budget.semaphore.available_permits();
    drop(inbound);
    assert_eq!(budget.semaphore.available_permits(), before + held);
}

#[tokio::test]
async fn a_signing_side_signs_requests_and_oneways_but_not_responses() {
    let credentials = quiver_protocol::acl::Credentials::new("alice12", "alice-secret");
    let client_options = Options {
        credentials: Some(std::sync::Arc::new(credentials)),
        ..Options::new("server")
    };
    let ((client, mut client_in), (server, mut server_in)) =
        pair_with(client_options, Options::new("client"));
    let asking = {
        let client = client.clone();
        tokio::spawn(async move {
            let ask = request(10).with_body(Bytes::from_static(b"payload"));
            client.request(ask, LONG).await
        })
    };
    let asked = server_in.next().await.unwrap().unwrap().command;
    assert_eq!(asked.ext(quiver_protocol::acl::ACCESS_KEY), Some("alice12"));
    assert!(quiver_protocol::acl::verify(&asked, "alice-secret"));
    server
        .respond(asked.response_to(code::response::SUCCESS, None))
        .await
        .unwrap();
    tokio::spawn(async move {
        // The client answers the server's request unsigned.
        let pushed = client_in.next().await.unwrap().unwrap().command;
        let _ = client
            .respond(pushed.response_to(code::response::SUCCESS, None))
            .await;
        client.send_oneway(request(34)).await.unwrap();
        while let Ok(Some(_)) = client_in.next().await {}
    });
    assert!(asking.await.unwrap().is_ok());
    let pushing = tokio::spawn(async move { server.request(request(40), LONG).await });
    // Reading routes the client's answer on the way to its oneway frame.
    let oneway = server_in.next().await.unwrap().unwrap().command;
    let answer = pushing.await.unwrap().unwrap();
    assert!(answer.ext(quiver_protocol::acl::SIGNATURE).is_none());
    assert!(oneway.is_oneway());
    assert!(quiver_protocol::acl::verify(&oneway, "alice-secret"));
}

/// A client over TCP, and a server side made with `Connection::start_plain`.
async fn plain_pair() -> (Side2, (Connection, Incoming)) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (read, write) = server.into_split();
    let mut options = Options::new("client");
    options.language = Some(quiver_protocol::LANGUAGE_JAVA);
    let server = Connection::start_plain(read, write, options);
    (Connection::start(client, Options::new("server")), server)
}

type Side2 = (Connection, Incoming);

#[tokio::test]
async fn plain_answers_written_by_the_answering_thread_or_the_writer_all_arrive_whole() {
    let ((client, mut client_in), (server, mut server_in)) = plain_pair().await;
    tokio::spawn(async move { while let Ok(Some(_)) = client_in.next().await {} });
    let answering = tokio::spawn(async move {
        let mut answered = 0;
        while let Ok(Some(inbound)) = server_in.next().await {
            let asked = inbound.command;
            // Large bodies go the writer task's way, small ones may be written at once;
            // both interleave here, and through a reserved slot too.
            let size = if asked.code % 3 == 0 { 40 * 1024 } else { 100 };
            let answer = asked
                .response_to(code::response::SUCCESS, None)
                .with_body(Bytes::from(vec![asked.code as u8; size]));
            if asked.code % 2 == 0 {
                server.try_reserve().expect("room").send(answer, None);
            } else {
                server.respond(answer).await.unwrap();
            }
            answered += 1;
        }
        answered
    });
    let asks = (0..200).map(|n| {
        let client = client.clone();
        async move { client.request(request(n), LONG).await }
    });
    let answers = futures_join_all(asks).await;
    for (n, answer) in answers.into_iter().enumerate() {
        let answer = answer.unwrap();
        let size = if n % 3 == 0 { 40 * 1024 } else { 100 };
        assert_eq!(answer.body.len(), size, "answer {n}");
        assert!(answer.body.iter().all(|&b| b == n as u8));
        assert_eq!(answer.language, quiver_protocol::LANGUAGE_JAVA);
    }
    client.close();
    drop(client);
    assert_eq!(answering.await.unwrap(), 200);
}

#[tokio::test]
async fn a_plain_answer_reports_when_it_was_written() {
    let ((client, mut client_in), (server, mut server_in)) = plain_pair().await;
    tokio::spawn(async move { while let Ok(Some(_)) = client_in.next().await {} });
    let (told, written) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let asked = server_in.next().await.unwrap().unwrap().command;
        let answer = asked.response_to(code::response::SUCCESS, None);
        let on_written = Box::new(move |_| {
            let _ = told.send(());
        });
        server.respond_then(answer, on_written).await.unwrap();
        server_in
    });
    client.request(request(7), LONG).await.unwrap();
    tokio::time::timeout(LONG, written).await.unwrap().unwrap();
}

/// Awaits every future, in order (the crate has no futures dependency).
async fn futures_join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut set = tokio::task::JoinSet::new();
    for (n, future) in futures.enumerate() {
        set.spawn(async move { (n, future.await) });
    }
    let mut out: Vec<(usize, F::Output)> = Vec::new();
    while let Some(done) = set.join_next().await {
        out.push(done.unwrap());
    }
    out.sort_by_key(|(n, _)| *n);
    out.into_iter().map(|(_, o)| o).collect()
}
