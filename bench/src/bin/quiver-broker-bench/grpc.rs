//! `--mode grpc`: the RocketMQ 5.x gRPC path beside the remoting path, in one run and on the
//! same broker build, with the same 1 KiB bodies. The broker is the `quiver-broker` binary in
//! a process of its own (fresh per scenario, `process.rs`); both protocols' clients run in
//! this one, so neither shares the broker's runtime. Scenarios:
//! - produce only: one message a request, 1 and 4 producers, remoting SEND_MESSAGE_V2 against
//!   gRPC SendMessage (issue 25's target: gRPC >= 0.60 of remoting);
//! - catch-up: messages stored beforehand, read once by a remoting PULL (32 a pull, offsets
//!   kept by the reader) and by a SimpleConsumer's ReceiveMessage (32 a receive) plus one
//!   AckMessage per message, the acks of a batch in flight together and not awaited before
//!   the next receive (up to 2 batches acking, as `ack_async`) (target >= 0.50);
//! - paced: a producer at a fixed rate and a consumer long polling, producer-to-consumer
//!   latency percentiles of each path (target: gRPC p99 <= 2 ms at 5k msgs/s).
//!
//! After the table, what the broker spent per call or message of each scenario (CPU time and
//! context switches of its threads, from `/proc`): where a call's cost is, not only its rate.

use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_bench::percentile;
use quiver_grpc_proto::v2;
use quiver_grpc_proto::v2::messaging_service_client::MessagingServiceClient;
use tonic::transport::Channel;

use crate::harness::{body, send_ext, stamp_nanos, Conn, Security, QUEUES, TOPIC};
use crate::process::{BrokerProcess, Cost};
use crate::throughput::{catch_up, consume, produce, store_for_filtering, Sends};
use crate::Args;

const GROUP: &str = "GrpcBench";

/// A gRPC client on its own HTTP/2 connection.
async fn connect(addr: SocketAddr) -> anyhow::Result<MessagingServiceClient<Channel>> {
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        // grpc-java's default window (the Python and Go clients size theirs by BDP probes).
        .initial_stream_window_size(1024 * 1024)
        .initial_connection_window_size(4 * 1024 * 1024)
        .connect()
        .await
        .with_context(|| format!("connecting to the gRPC port {addr}"))?;
    Ok(MessagingServiceClient::new(channel))
}

fn resource(name: &str) -> Option<v2::Resource> {
    Some(v2::Resource {
        resource_namespace: String::new(),
        name: name.to_string(),
    })
}

/// A 5.x client's normal message: tag `bench`, a fresh message id, the stamped body.
fn message(size: usize, id: u64) -> v2::Message {
    v2::Message {
        topic: resource(TOPIC),
        user_properties: Default::default(),
        system_properties: Some(v2::SystemProperties {
            tag: Some("bench".into()),
            message_id: format!("01BENCH{id:020}"),
            message_type: v2::MessageType::Normal as i32,
            born_timestamp: Some(prost_types_now()),
            born_host: "127.0.0.1".into(),
            ..Default::default()
        }),
        body: body(size).to_vec().into(),
    }
}

fn prost_types_now() -> quiver_grpc_proto::prost_types::Timestamp {
    let ms = quiver_broker::now_ms();
    quiver_grpc_proto::prost_types::Timestamp {
        seconds: ms / 1000,
        nanos: i32::try_from((ms % 1000) * 1_000_000).unwrap_or(0),
    }
}

fn ok(status: Option<&v2::Status>, what: &str) -> anyhow::Result<()> {
    match status {
        Some(s) if s.code == v2::Code::Ok as i32 => Ok(()),
        other => bail!("{what} failed: {other:?}"),
    }
}

async fn send_one(
    client: &mut MessagingServiceClient<Channel>,
    size: usize,
    id: u64,
) -> anyhow::Result<()> {
    let request = v2::SendMessageRequest {
        messages: vec![message(size, id)],
    };
    let answer = client.send_message(request).await?.into_inner();
    ok(answer.status.as_ref(), "SendMessage")
}

async fn grpc_produce(
    addr: SocketAddr,
    producer: u64,
    count: u64,
    size: usize,
) -> anyhow::Result<()> {
    let mut client = connect(addr).await?;
    for i in 0..count {
        send_one(&mut client, size, producer << 40 | i).await?;
    }
    Ok(())
}

/// A fresh broker's remoting and gRPC addresses.
#[derive(Clone, Copy)]
struct Ports {
    remoting: SocketAddr,
    grpc: SocketAddr,
}

/// A scenario's figure and what the broker and the clients spent per call.
#[derive(Clone, Copy)]
struct Measured {
    figure: f64,
    cost: Cost,
}

/// Runs `run(ports, caller, count)` for `callers` callers sharing `args.messages` calls on a
/// fresh broker; calls/s of them all.
async fn rate_of<F, Fut>(args: &Args, callers: u64, run: F) -> anyhow::Result<Measured>
where
    F: Fn(Ports, u64, u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let broker = BrokerProcess::start(args).await?;
    let ports = Ports {
        remoting: broker.addr,
        grpc: broker.grpc_addr,
    };
    let total = args.messages;
    let before = broker.usage()?;
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for caller in 0..callers {
        let count = total / callers + u64::from(caller < total % callers);
        tasks.spawn(run(ports, caller, count));
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    let figure = total as f64 / started.elapsed().as_secs_f64();
    let cost = broker.usage()?.per_call(before, total);
    Ok(Measured { figure, cost })
}

/// The transport's floor: heartbeats (no store work) on one connection per caller, remoting
/// HEART_BEAT against gRPC Heartbeat; calls/s.
async fn heartbeat_rate(
    args: &Args,
    security: &Arc<Security>,
    callers: u64,
    grpc: bool,
) -> anyhow::Result<Measured> {
    let shared = security.clone();
    rate_of(args, callers, move |ports, _, count| {
        let security = shared.clone();
        async move {
            if grpc {
                let mut client = connect(ports.grpc).await?;
                for _ in 0..count {
                    let request = v2::HeartbeatRequest {
                        group: resource(GROUP),
                        client_type: v2::ClientType::Producer as i32,
                    };
                    let answer = client.heartbeat(request).await?.into_inner();
                    ok(answer.status.as_ref(), "Heartbeat")?;
                }
                return Ok(());
            }
            let mut conn = Conn::connect(ports.remoting, &security).await?;
            let heartbeat = Bytes::from_static(
                br#"{"clientID":"bench","producerDataSet":[],"consumerDataSet":[]}"#,
            );
            for _ in 0..count {
                let request = quiver_protocol::code::request::HEART_BEAT;
                let reply = conn
                    .call(request, Default::default(), heartbeat.clone())
                    .await?;
                if reply.code != quiver_protocol::code::response::SUCCESS {
                    bail!("heartbeat failed: {} {:?}", reply.code, reply.remark);
                }
            }
            Ok(())
        }
    })
    .await
}

/// Sends `args.messages` messages split over `producers`; msgs/s.
async fn produce_rate(
    args: &Args,
    security: &Arc<Security>,
    producers: u64,
    grpc: bool,
) -> anyhow::Result<Measured> {
    let (size, security) = (args.size, security.clone());
    rate_of(args, producers, move |ports, p, count| {
        let security = security.clone();
        async move {
            if grpc {
                grpc_produce(ports.grpc, p, count, size).await
            } else {
                produce(ports.remoting, security, p, count, size, Sends::Single).await
            }
        }
    })
    .await
}

/// Batches whose acks may still be in flight while the consumer receives the next one (as
/// an application acking asynchronously, `ack_async`, does).
const ACK_BATCHES_IN_FLIGHT: usize = 2;

/// How a consumer acks what it received.
#[derive(Clone, Copy)]
enum Acks {
    /// One AckMessage per message, as a SimpleConsumer's `ack(message)`.
    PerMessage,
    /// One AckMessage with an entry per message of the batch (the protocol allows it; the
    /// Apache clients do not send it): the broker's POP cost without a call per message.
    PerBatch,
}

/// Receives (32 at a time) and acks until `count` messages were delivered; the deliveries.
async fn receive_and_ack(
    client: &mut MessagingServiceClient<Channel>,
    (group, acks): (&'static str, Acks),
    count: u64,
    long_poll: Duration,
    mut on_message: impl FnMut(&v2::Message),
) -> anyhow::Result<u64> {
    let mut delivered = 0u64;
    let mut acking = tokio::task::JoinSet::new();
    while delivered < count {
        let request = v2::ReceiveMessageRequest {
            group: resource(group),
            message_queue: Some(v2::MessageQueue {
                topic: resource(TOPIC),
                id: -1,
                ..Default::default()
            }),
            filter_expression: Some(v2::FilterExpression {
                r#type: v2::FilterType::Tag as i32,
                expression: "*".into(),
            }),
            batch_size: 32,
            invisible_duration: Some(quiver_grpc_proto::prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            auto_renew: false,
            long_polling_timeout: Some(quiver_grpc_proto::prost_types::Duration {
                seconds: i64::try_from(long_poll.as_secs())?,
                nanos: i32::try_from(long_poll.subsec_nanos())?,
            }),
            attempt_id: None,
        };
        let mut request = tonic::Request::new(request);
        request.set_timeout(long_poll + Duration::from_secs(5));
        let mut stream = client.receive_message(request).await?.into_inner();
        let mut batch = Vec::new();
        while let Some(item) = stream.message().await? {
            match item.content {
                Some(v2::receive_message_response::Content::Message(m)) => {
                    on_message(&m);
                    batch.push(m);
                }
                Some(v2::receive_message_response::Content::Status(s)) => {
                    let code = s.code;
                    if code != v2::Code::Ok as i32 && code != v2::Code::MessageNotFound as i32 {
                        bail!("ReceiveMessage failed: {s:?}");
                    }
                }
                _ => {}
            }
        }
        delivered += batch.len() as u64;
        acking.spawn(ack_batch(client.clone(), group, acks, batch));
        while acking.len() >= ACK_BATCHES_IN_FLIGHT {
            acking.join_next().await.context("an ack batch")???;
        }
    }
    while let Some(acked) = acking.join_next().await {
        acked??;
    }
    Ok(delivered)
}

/// Acks a received batch, the AckMessage calls of a batch in flight together.
async fn ack_batch(
    client: MessagingServiceClient<Channel>,
    group: &'static str,
    acks: Acks,
    batch: Vec<v2::Message>,
) -> anyhow::Result<()> {
    let entry = |m: v2::Message| {
        let props = m.system_properties.unwrap_or_default();
        v2::AckMessageEntry {
            message_id: props.message_id,
            receipt_handle: props.receipt_handle.unwrap_or_default(),
        }
    };
    let requests: Vec<v2::AckMessageRequest> = match acks {
        Acks::PerMessage => batch
            .into_iter()
            .map(|m| v2::AckMessageRequest {
                group: resource(group),
                topic: resource(TOPIC),
                entries: vec![entry(m)],
            })
            .collect(),
        Acks::PerBatch => vec![v2::AckMessageRequest {
            group: resource(group),
            topic: resource(TOPIC),
            entries: batch.into_iter().map(entry).collect(),
        }],
    };
    let mut calls = tokio::task::JoinSet::new();
    for request in requests {
        let mut client = client.clone();
        calls.spawn(async move {
            let answer = client.ack_message(request).await?.into_inner();
            ok(answer.status.as_ref(), "AckMessage")
        });
    }
    while let Some(result) = calls.join_next().await {
        result??;
    }
    Ok(())
}

/// Msgs/s of `read` (which returns how many it read) and what the broker spent per message.
async fn read_rate<Fut>(broker: &BrokerProcess, read: Fut) -> anyhow::Result<Measured>
where
    Fut: std::future::Future<Output = anyhow::Result<u64>>,
{
    let before = broker.usage()?;
    let started = Instant::now();
    let read = read.await?;
    let figure = read as f64 / started.elapsed().as_secs_f64();
    let cost = broker.usage()?.per_call(before, read);
    Ok(Measured { figure, cost })
}

/// The same stored messages read by a remoting catch-up, by a SimpleConsumer acking each
/// message and by one acking each batch in one call.
async fn catch_up_rates(args: &Args) -> anyhow::Result<[Measured; 3]> {
    let mut broker = BrokerProcess::start(args).await?;
    let count = args.catch_up_messages;
    store_for_filtering(&mut broker.conn, count, args.size).await?;
    let mut conn = Conn::connect_plain(broker.addr).await?;
    let remoting = read_rate(&broker, catch_up(&mut conn, "TAG", "*")).await?;
    let mut client = connect(broker.grpc_addr).await?;
    let group = (GROUP, Acks::PerMessage);
    let read = receive_and_ack(&mut client, group, count, Duration::ZERO, |_| ());
    let grpc = read_rate(&broker, read).await?;
    // Another group reads the same messages from the start, acking a batch a call.
    let group = ("GrpcBenchBatchAcks", Acks::PerBatch);
    let read = receive_and_ack(&mut client, group, count, Duration::ZERO, |_| ());
    let batched = read_rate(&broker, read).await?;
    Ok([remoting, grpc, batched])
}

/// Sends `count` messages at `rate` per second, each on its own task so a slow answer does
/// not hold back the schedule; `send(i)` sends message i.
async fn paced<F, Fut>(rate: u64, count: u64, send: F) -> anyhow::Result<()>
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let started = Instant::now();
    let mut sends = tokio::task::JoinSet::new();
    for i in 0..count {
        let due = started + Duration::from_secs_f64(i as f64 / rate as f64);
        tokio::time::sleep_until(due.into()).await;
        sends.spawn(send(i));
        while let Some(done) = sends.try_join_next() {
            done??;
        }
    }
    while let Some(done) = sends.join_next().await {
        done??;
    }
    Ok(())
}

/// Latencies (µs, sorted) of a paced scenario and what the broker spent per message.
type Paced = (Vec<u64>, Cost);

/// Producer-to-consumer latency at `rate` msgs/s over gRPC: one producer channel, one
/// SimpleConsumer long polling and acking.
async fn grpc_paced(args: &Args, rate: u64, count: u64) -> anyhow::Result<Paced> {
    let broker = BrokerProcess::start(args).await?;
    let before = broker.usage()?;
    let mut consumer = connect(broker.grpc_addr).await?;
    let latencies = Arc::new(parking_lot::Mutex::new(Vec::with_capacity(count as usize)));
    let seen = latencies.clone();
    let receiving = tokio::spawn(async move {
        let group = (GROUP, Acks::PerMessage);
        receive_and_ack(&mut consumer, group, count, Duration::from_secs(2), |m| {
            let sent = m
                .body
                .get(..8)
                .map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or([0; 8])));
            seen.lock().push(stamp_nanos().saturating_sub(sent) / 1_000);
        })
        .await
    });
    let producer = connect(broker.grpc_addr).await?;
    let size = args.size;
    paced(rate, count, move |i| {
        let mut client = producer.clone();
        async move { send_one(&mut client, size, i).await }
    })
    .await?;
    receiving.await??;
    let cost = broker.usage()?.per_call(before, count);
    let mut latencies = std::mem::take(&mut *latencies.lock());
    latencies.sort_unstable();
    Ok((latencies, cost))
}

/// The same over remoting: single sends paced on 4 connections, a long-polling pull per queue.
async fn remoting_paced(
    args: &Args,
    security: &Arc<Security>,
    rate: u64,
    count: u64,
) -> anyhow::Result<Paced> {
    let broker = BrokerProcess::start(args).await?;
    let before = broker.usage()?;
    let received = Arc::new(AtomicU64::new(0));
    let consumers: Vec<_> = (0..QUEUES)
        .map(|q| {
            tokio::spawn(consume(
                broker.addr,
                security.clone(),
                q,
                count,
                received.clone(),
            ))
        })
        .collect();
    let mut connections = Vec::new();
    for _ in 0..4 {
        connections.push(Arc::new(tokio::sync::Mutex::new(
            Conn::connect(broker.addr, security).await?,
        )));
    }
    let size = args.size;
    paced(rate, count, move |i| {
        let conn = connections[(i % 4) as usize].clone();
        async move {
            let queue_id = u32::try_from(i % u64::from(QUEUES))?;
            let reply = conn
                .lock()
                .await
                .call(
                    quiver_protocol::code::request::SEND_MESSAGE_V2,
                    send_ext(queue_id, false),
                    body(size),
                )
                .await?;
            if reply.code != quiver_protocol::code::response::SUCCESS {
                bail!("send failed: {} {:?}", reply.code, reply.remark);
            }
            Ok(())
        }
    })
    .await?;
    let mut latencies = Vec::new();
    for task in consumers {
        latencies.extend(task.await??);
    }
    let cost = broker.usage()?.per_call(before, count);
    latencies.sort_unstable();
    Ok((latencies, cost))
}

/// One row of the table: the remoting and gRPC figures and their ratio.
fn row(label: &str, remoting: f64, grpc: f64) {
    println!(
        "| {label:<40} | {remoting:>10.0} | {grpc:>10.0} | {:>8.2} |",
        grpc / remoting
    );
}

fn header(columns: [&str; 4]) {
    let [a, b, c, d] = columns;
    println!("| {a:<40} | {b:>10} | {c:>10} | {d:>8} |");
    println!(
        "|{}|{}|{}|{}|",
        "-".repeat(42),
        "-".repeat(12),
        "-".repeat(12),
        "-".repeat(10)
    );
}

/// What was spent per call of each scenario: (label, remoting, gRPC).
type Costs = Vec<(String, Cost, Cost)>;

fn print_costs(costs: &Costs) {
    println!();
    println!(
        "per call or message: CPU µs / context switches of the broker's threads, then of the \
         clients' (this process)"
    );
    let side = |[(b_cpu, b_sw), (c_cpu, c_sw)]: Cost| {
        format!("{b_cpu:.1}/{b_sw:.2} + {c_cpu:.1}/{c_sw:.2}")
    };
    println!(
        "| {:<42} | {:>24} | {:>24} | {:>10} |",
        "scenario", "remoting broker + clients", "gRPC broker + clients", "broker CPU"
    );
    println!(
        "|{}|{}|{}|{}|",
        "-".repeat(44),
        "-".repeat(26),
        "-".repeat(26),
        "-".repeat(12)
    );
    for (label, remoting, grpc) in costs {
        println!(
            "| {label:<42} | {:>24} | {:>24} | {:>10.2} |",
            side(*remoting),
            side(*grpc),
            grpc[0].0 / remoting[0].0.max(0.001)
        );
    }
}

pub async fn run(args: &Args, security: &Arc<Security>) -> anyhow::Result<()> {
    header(["scenario", "remoting", "gRPC", "ratio"]);
    let mut costs = Costs::new();
    for callers in [1, 4] {
        let remoting = heartbeat_rate(args, security, callers, false).await?;
        let grpc = heartbeat_rate(args, security, callers, true).await?;
        let label = format!("floor: heartbeat x{callers} (calls/s)");
        row(&label, remoting.figure, grpc.figure);
        costs.push((label, remoting.cost, grpc.cost));
    }
    for producers in [1, 4] {
        let remoting = produce_rate(args, security, producers, false).await?;
        let grpc = produce_rate(args, security, producers, true).await?;
        let label = format!("produce 1 msg/request x{producers} (msgs/s)");
        row(&label, remoting.figure, grpc.figure);
        costs.push((label, remoting.cost, grpc.cost));
    }
    if args.catch_up_messages > 0 {
        let [remoting, grpc, batched] = catch_up_rates(args).await?;
        let label = "catch-up pull / receive+ack (msgs/s)";
        row(label, remoting.figure, grpc.figure);
        costs.push((label.into(), remoting.cost, grpc.cost));
        let label = "catch-up, one ack call per batch (msgs/s)";
        row(label, remoting.figure, batched.figure);
        costs.push((label.into(), remoting.cost, batched.cost));
    }
    let rate = args.paced_rate;
    let count = rate * args.paced_secs;
    if count > 0 {
        let (remoting, remoting_cost) = remoting_paced(args, security, rate, count).await?;
        let (grpc, grpc_cost) = grpc_paced(args, rate, count).await?;
        for (label, q) in [("p50", 0.50), ("p99", 0.99)] {
            let (r, g) = (percentile(&remoting, q), percentile(&grpc, q));
            println!(
                "| {:<40} | {:>10} | {:>10} | {:>8.2} |",
                format!("paced {rate}/s producer-to-consumer {label}"),
                format!("{:.2} ms", r as f64 / 1000.0),
                format!("{:.2} ms", g as f64 / 1000.0),
                g as f64 / r.max(1) as f64
            );
        }
        let label = format!("paced {rate}/s (per message)");
        costs.push((label, remoting_cost, grpc_cost));
    }
    println!("targets: produce ratio >= 0.60, receive+ack ratio >= 0.50, gRPC paced p99 <= 2 ms");
    print_costs(&costs);
    Ok(())
}
