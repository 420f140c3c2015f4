//! `quiver produce`: send messages from arguments, a file or stdin, with a progress bar.

use std::io::{BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use quiver_client::{ClientConfig, Message, Producer, ProducerConfig, QueueSelector};

use crate::table::Table;
use crate::{print_json, Output, ProduceArgs};

/// The bodies to send: the arguments, the lines of --file, or the lines of stdin.
fn read_bodies(args: &ProduceArgs) -> anyhow::Result<Vec<String>> {
    let bodies: Vec<String> = if let Some(path) = &args.file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        text.lines().map(String::from).collect()
    } else if !args.messages.is_empty() {
        args.messages.clone()
    } else {
        let stdin = std::io::stdin();
        stdin
            .lock()
            .lines()
            .collect::<Result<_, _>>()
            .context("cannot read messages from stdin")?
    };
    if bodies.is_empty() {
        bail!("no messages to send: pass them as arguments, with --file, or on stdin");
    }
    Ok(bodies)
}

pub async fn run(client: ClientConfig, output: Output, args: ProduceArgs) -> anyhow::Result<()> {
    let bodies = read_bodies(&args)?;
    let mut config = ProducerConfig::new("");
    config.client = client;
    config.group = args.group.clone();
    let producer = Producer::new(config);
    let total = bodies.len() as u64 * args.repeat;
    let template = |body: &str| {
        let mut message = Message::new(args.topic.clone(), body.to_owned()).with_keys(&args.keys);
        if let Some(tags) = &args.tags {
            message = message.with_tags(tags.clone());
        }
        for (k, v) in &args.properties {
            message = message.with_property(k.clone(), v.clone());
        }
        if let Some(at) = args.deliver_at_ms {
            message = message.with_deliver_at_ms(at);
        }
        if let Some(delay) = args.delay_ms {
            message = message.with_delay_ms(delay);
        }
        message
    };
    let started = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let progress = Progress::start(total, sent.clone());
    let semaphore = Arc::new(tokio::sync::Semaphore::new(args.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let mut results = Vec::new();
    let mut first_error = None;
    'sending: for _ in 0..args.repeat {
        for body in &bodies {
            let permit = semaphore
                .clone()
                .acquire_owned()
                .await
                .context("send limiter closed")?;
            let producer = producer.clone();
            let message = template(body);
            let hash_key = args.hash_key.clone();
            let sent = sent.clone();
            tasks.spawn(async move {
                let _permit = permit;
                let selector = hash_key
                    .as_deref()
                    .map_or(QueueSelector::RoundRobin, QueueSelector::KeyHash);
                let result = producer.send_with(message, selector).await;
                sent.fetch_add(1, Ordering::Relaxed);
                result
            });
            while let Some(done) = tasks.try_join_next() {
                collect(done, &mut results, &mut first_error, args.quiet);
            }
            if first_error.is_some() {
                break 'sending;
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        collect(done, &mut results, &mut first_error, args.quiet);
    }
    progress.finish();
    producer.shutdown().await;
    if let Some(error) = first_error {
        return Err(error).context(format!("sending to topic {}", args.topic));
    }
    print_produced(
        output,
        &results,
        args.quiet,
        started.elapsed().as_secs_f64(),
    )
}

/// What was sent: every result unless `quiet`, and the rate.
fn print_produced(
    output: Output,
    results: &[serde_json::Value],
    quiet: bool,
    elapsed: f64,
) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(&serde_json::json!({
            "sent": results.len(),
            "seconds": elapsed,
            "results": if quiet { &[][..] } else { results },
        }))?,
        Output::Table => {
            if !quiet {
                let mut table = Table::new(&["MSG_ID", "BROKER", "QUEUE", "OFFSET"]);
                for r in results {
                    table.row(vec![
                        r["msg_id"].as_str().unwrap_or_default().to_owned(),
                        r["broker"].as_str().unwrap_or_default().to_owned(),
                        r["queue_id"].to_string(),
                        r["queue_offset"].to_string(),
                    ]);
                }
                print!("{}", table.render());
            }
            eprintln!(
                "sent {} messages in {elapsed:.2} s ({:.0} msg/s)",
                results.len(),
                results.len() as f64 / elapsed.max(1e-9)
            );
        }
    }
    Ok(())
}

fn collect(
    done: Result<quiver_client::Result<quiver_client::SendResult>, tokio::task::JoinError>,
    results: &mut Vec<serde_json::Value>,
    first_error: &mut Option<anyhow::Error>,
    quiet: bool,
) {
    match done {
        Ok(Ok(result)) => {
            if quiet {
                results.push(serde_json::Value::Null);
            } else {
                results.push(serde_json::json!({
                    "msg_id": result.msg_id,
                    "offset_msg_id": result.offset_msg_id,
                    "broker": result.queue.broker_name,
                    "queue_id": result.queue.queue_id,
                    "queue_offset": result.queue_offset.0,
                }));
            }
        }
        Ok(Err(error)) => {
            first_error.get_or_insert(error.into());
        }
        Err(join_error) => {
            first_error.get_or_insert(anyhow::Error::new(join_error).context("send task failed"));
        }
    }
}

/// A one-line progress bar with rate on stderr, only when stderr is a terminal.
struct Progress {
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Progress {
    fn start(total: u64, done: Arc<AtomicU64>) -> Self {
        if !std::io::stderr().is_terminal() || total < 1000 {
            return Self { task: None };
        }
        let started = Instant::now();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            loop {
                tick.tick().await;
                let n = done.load(Ordering::Relaxed);
                let width = 30usize;
                let filled = (n as f64 / total as f64 * width as f64) as usize;
                let rate = n as f64 / started.elapsed().as_secs_f64().max(1e-9);
                eprint!(
                    "\r[{}{}] {n}/{total} {rate:.0} msg/s",
                    "#".repeat(filled),
                    "-".repeat(width - filled.min(width))
                );
                let _ = std::io::stderr().flush();
            }
        });
        Self { task: Some(task) }
    }

    fn finish(self) {
        if let Some(task) = self.task {
            task.abort();
            eprintln!();
        }
    }
}
