//! `quiver consume`: a push consumer that prints or counts what it receives.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use quiver_client::{
    ClientConfig, ConsumeMode, ConsumeOutcome, MessageSelector, PushConsumer, PushConsumerConfig,
    ReceivedMessage,
};

use crate::{print_json, ConsumeArgs, ConsumePrint, Output};

pub fn message_json(message: &ReceivedMessage) -> serde_json::Value {
    serde_json::json!({
        "topic": message.topic,
        "broker": message.queue.broker_name,
        "queue_id": message.queue.queue_id,
        "queue_offset": message.queue_offset.0,
        "msg_id": message.msg_id(),
        "tags": message.tags(),
        "keys": message.keys(),
        "properties": message.properties,
        "reconsume_times": message.reconsume_times,
        "store_timestamp_ms": message.store_timestamp_ms,
        "body": String::from_utf8_lossy(&message.body),
    })
}

pub async fn run(client: ClientConfig, output: Output, args: ConsumeArgs) -> anyhow::Result<()> {
    let selector = match &args.sql {
        Some(expression) => MessageSelector::by_sql(expression.clone()),
        None => MessageSelector::by_tag(args.tags.clone()),
    };
    let mut config = PushConsumerConfig::new("", args.group.clone())
        .subscribe(args.topic.clone(), selector)
        .consume_from(args.from)
        .mode(if args.orderly {
            ConsumeMode::Orderly
        } else {
            ConsumeMode::Concurrent
        });
    config.client = client;
    config.long_poll = Duration::from_secs(5);
    if args.max.is_some() {
        // One listener call at a time keeps the count exact at --max.
        config.consume_concurrency = 1;
    }
    let count = Arc::new(AtomicU64::new(0));
    let last_message = Arc::new(parking_lot::Mutex::new(Instant::now()));
    let (done_tx, mut done_rx) = tokio::sync::watch::channel(false);
    let max = args.max;
    let print = args.mode == ConsumePrint::Print;
    let listener = {
        let count = count.clone();
        let last_message = last_message.clone();
        Arc::new(move |messages: &[ReceivedMessage]| {
            let mut stdout = std::io::stdout().lock();
            for message in messages {
                let n = count.fetch_add(1, Ordering::SeqCst) + 1;
                if max.is_some_and(|max| n > max) {
                    // Past --max: leave it for the next consumer rather than drop it.
                    return ConsumeOutcome::Retry;
                }
                if print {
                    let _ = writeln!(stdout, "{}", consumed_line(message, output));
                }
                if max.is_some_and(|max| n >= max) {
                    let _ = done_tx.send(true);
                }
            }
            let _ = stdout.flush();
            *last_message.lock() = Instant::now();
            ConsumeOutcome::Success
        })
    };
    let consumer = PushConsumer::start(config, listener)
        .await
        .context(format!("starting to consume {}", args.topic))?;
    let idle = args.idle_timeout_secs.map(Duration::from_secs);
    wait_until_done(&mut done_rx, idle, &last_message).await;
    consumer
        .shutdown()
        .await
        .context("committing offsets on shutdown")?;
    let consumed = max.map_or(count.load(Ordering::SeqCst), |max| {
        count.load(Ordering::SeqCst).min(max)
    });
    if args.mode == ConsumePrint::Count {
        match output {
            Output::Json => print_json(&serde_json::json!({ "consumed": consumed }))?,
            Output::Table => println!("{consumed}"),
        }
    }
    Ok(())
}

/// One consumed message as `consume` prints it.
fn consumed_line(message: &ReceivedMessage, output: Output) -> String {
    match output {
        Output::Json => message_json(message).to_string(),
        Output::Table => format!(
            "{}\t{}:{}@{}\ttags={}\tkeys={}\t{}",
            message.topic,
            message.queue.broker_name,
            message.queue.queue_id,
            message.queue_offset,
            message.tags().unwrap_or("-"),
            message.keys().join(","),
            String::from_utf8_lossy(&message.body)
        ),
    }
}

/// Until Ctrl-C, --max reached, or no message for `idle`.
async fn wait_until_done(
    done: &mut tokio::sync::watch::Receiver<bool>,
    idle: Option<Duration>,
    last_message: &parking_lot::Mutex<Instant>,
) {
    let mut check = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = done.changed() => return,
            _ = check.tick() => {
                if idle.is_some_and(|idle| last_message.lock().elapsed() >= idle) {
                    return;
                }
            }
        }
    }
}
