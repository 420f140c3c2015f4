//! The RocketMQ-protocol load generator (quiver-client), the same for Quiver and rocketmq-rust.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use quiver_client::{
    Admin, ClientConfig, Message, MessageQueue, Producer, ProducerConfig, PullConsumer, PullStatus,
    QueueOffset, SendStatus, Subscription, TopicSpec,
};
use tokio::sync::mpsc;

use crate::peers::workload::{
    record_arrival, Arrival, ParkedPullPlan, ParkedPulls, ProducerHandle, System,
};

/// A broker reached through its name server (for Quiver, the broker itself).
pub struct RocketMqSystem {
    pub name_server: String,
    pub queues_per_topic: u32,
    /// Messages asked for per pull request.
    pub pull_batch: u32,
}

impl RocketMqSystem {
    fn client_config(&self) -> ClientConfig {
        ClientConfig::new(&self.name_server).with_request_timeout(Duration::from_secs(10))
    }

    /// Creates `stream` with `queues` queues and waits until its route is known.
    async fn prepare_queues(&self, stream: &str, queues: u32) -> anyhow::Result<()> {
        let admin = Admin::new(self.client_config());
        let created = admin.create_topic(&TopicSpec::new(stream, queues)).await;
        // The name server learns the topic from the broker's next registration: wait for it.
        let deadline = Instant::now() + Duration::from_secs(40);
        let outcome = async {
            created.with_context(|| format!("creating topic {stream}"))?;
            loop {
                match admin.core().fetch_route(stream).await {
                    Ok(route) if !route.write_queues.is_empty() => return Ok(()),
                    Ok(_) | Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Ok(_) => bail!("topic {stream} has no writable queue in its route"),
                    Err(error) => {
                        return Err(error).with_context(|| format!("route of topic {stream}"))
                    }
                }
            }
        }
        .await;
        admin.shutdown().await;
        outcome
    }
}

impl System for RocketMqSystem {
    type Producer = RocketMqProducer;

    async fn prepare(&self, stream: &str) -> anyhow::Result<()> {
        self.prepare_queues(stream, self.queues_per_topic).await
    }

    async fn producer(&self) -> anyhow::Result<RocketMqProducer> {
        let mut config = ProducerConfig::new(&self.name_server);
        config.client = self.client_config();
        config.group = "bench_producer".into();
        config.send_timeout = Duration::from_secs(10);
        config.default_topic_queue_nums = self.queues_per_topic;
        Ok(RocketMqProducer {
            producer: Producer::new(config),
        })
    }

    async fn read_back(
        &self,
        stream: &str,
        count: u64,
        deadline: Instant,
    ) -> anyhow::Result<(u64, u64)> {
        let consumer = Arc::new(PullConsumer::new(self.client_config(), "bench_catch_up"));
        let queues = consumer.queues(stream).await?;
        let (read, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let mut tasks = tokio::task::JoinSet::new();
        for queue in queues {
            let (consumer, read, bytes) = (consumer.clone(), read.clone(), bytes.clone());
            let subscription = Subscription::new(stream, "*");
            let pull_batch = self.pull_batch;
            tasks.spawn(async move {
                let end = consumer.max_offset(&queue).await?;
                let mut offset = QueueOffset(0);
                while offset < end
                    && read.load(Ordering::Relaxed) < count
                    && Instant::now() < deadline
                {
                    let result = consumer
                        .pull(&queue, offset, pull_batch, &subscription, None)
                        .await?;
                    if let PullStatus::Found(messages) = &result.status {
                        let body_bytes: usize = messages.iter().map(|m| m.body.len()).sum();
                        read.fetch_add(messages.len() as u64, Ordering::Relaxed);
                        bytes.fetch_add(body_bytes as u64, Ordering::Relaxed);
                    }
                    if result.next_begin_offset <= offset {
                        bail!("pull of {queue:?} at {offset:?} did not advance");
                    }
                    offset = result.next_begin_offset;
                }
                anyhow::Ok(())
            });
        }
        while let Some(joined) = tasks.join_next().await {
            joined.context("pull task panicked")??;
        }
        consumer.shutdown().await;
        Ok((read.load(Ordering::Relaxed), bytes.load(Ordering::Relaxed)))
    }

    async fn follow(
        &self,
        stream: &str,
        count: u64,
        deadline: Instant,
        arrivals: mpsc::UnboundedSender<Arrival>,
    ) -> anyhow::Result<()> {
        let consumer = Arc::new(PullConsumer::new(self.client_config(), "bench_follow"));
        let queues = consumer.queues(stream).await?;
        let received = Arc::new(AtomicU64::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for queue in queues {
            let (consumer, received, arrivals) =
                (consumer.clone(), received.clone(), arrivals.clone());
            let subscription = Subscription::new(stream, "*");
            let pull_batch = self.pull_batch;
            tasks.spawn(follow_queue(
                consumer,
                queue,
                subscription,
                pull_batch,
                (received, count, deadline),
                arrivals,
            ));
        }
        let mut outcome = Ok(());
        while let Some(joined) = tasks.join_next().await {
            if let Err(error) = joined.context("follow task panicked").and_then(|r| r) {
                outcome = Err(error);
            }
        }
        consumer.shutdown().await;
        outcome
    }

    async fn parked_pulls(
        &self,
        stream: &str,
        plan: ParkedPullPlan,
    ) -> anyhow::Result<Option<ParkedPulls>> {
        parked_pulls(self, stream, plan).await.map(Some)
    }
}

/// One parked pull after another on a fresh one-queue topic: the pull long-polls at the
/// queue's max offset, `park_pause` later (time for the broker to park it) one message is
/// sent; the latency is the pull's answer minus the moment the send was issued.
async fn parked_pulls(
    system: &RocketMqSystem,
    stream: &str,
    plan: ParkedPullPlan,
) -> anyhow::Result<ParkedPulls> {
    system.prepare_queues(stream, 1).await?;
    let consumer = Arc::new(PullConsumer::new(
        system.client_config(),
        "bench_parked_pull",
    ));
    let queue = consumer
        .queues(stream)
        .await?
        .into_iter()
        .next()
        .with_context(|| format!("topic {stream} has no queue"))?;
    let producer = system.producer().await?;
    let subscription = Subscription::new(stream, "*");
    let body = Bytes::from(vec![0x5a; plan.body_bytes]);
    // Warm-up, left out: routes and connections of both clients.
    producer.send_one(stream, body.clone()).await?;
    consumer
        .pull(&queue, QueueOffset(0), 1, &subscription, None)
        .await?;
    let mut outcome = ParkedPulls::default();
    let started = Instant::now();
    let mut round = 0u64;
    while round < plan.repeats && started.elapsed() < plan.time_bound {
        round += 1;
        let offset = consumer.max_offset(&queue).await?;
        let pull = {
            let (consumer, queue, subscription) =
                (consumer.clone(), queue.clone(), subscription.clone());
            tokio::spawn(async move {
                let result = consumer
                    .pull(&queue, offset, 1, &subscription, Some(plan.suspend))
                    .await;
                (result, Instant::now())
            })
        };
        tokio::time::sleep(plan.park_pause).await;
        let answered_before_the_send = pull.is_finished();
        let sent_at = Instant::now();
        let sent = producer.send_one(stream, body.clone()).await;
        let (pulled, answered_at) = pull.await.context("parked pull task panicked")?;
        let waited = answered_at.saturating_duration_since(sent_at);
        let failure = match (&sent, &pulled) {
            (Err(error), _) => Some(format!("round {round}: send failed: {error:#}")),
            (_, Err(error)) => Some(format!("round {round}: pull at {offset:?} failed: {error}")),
            (Ok(()), Ok(result)) => match &result.status {
                PullStatus::Found(messages)
                    if !messages.is_empty() && !answered_before_the_send =>
                {
                    None
                }
                status => Some(format!(
                    "round {round}: pull at {offset:?} answered {} {waited:?} after the send{}",
                    match status {
                        PullStatus::Found(messages) => format!("{} message(s)", messages.len()),
                        other => format!("{other:?}"),
                    },
                    if answered_before_the_send {
                        " (it was answered before the send was issued: not parked)"
                    } else {
                        ""
                    }
                )),
            },
        };
        match failure {
            Some(line) => outcome.failures.push(line),
            None => outcome.latencies_micros.push(waited.as_micros() as u64),
        }
    }
    producer.close().await;
    consumer.shutdown().await;
    Ok(outcome)
}

/// Long-polls one queue from offset 0 until the shared count or the deadline is reached.
async fn follow_queue(
    consumer: Arc<PullConsumer>,
    queue: MessageQueue,
    subscription: Subscription,
    pull_batch: u32,
    (received, count, deadline): (Arc<AtomicU64>, u64, Instant),
    arrivals: mpsc::UnboundedSender<Arrival>,
) -> anyhow::Result<()> {
    let mut offset = QueueOffset(0);
    while received.load(Ordering::Relaxed) < count && Instant::now() < deadline {
        let long_poll = Duration::from_millis(500);
        let result = consumer
            .pull(&queue, offset, pull_batch, &subscription, Some(long_poll))
            .await?;
        if let PullStatus::Found(messages) = &result.status {
            for message in messages {
                record_arrival(&arrivals, &message.body);
            }
            received.fetch_add(messages.len() as u64, Ordering::Relaxed);
        }
        offset = offset.max(result.next_begin_offset);
    }
    Ok(())
}

#[derive(Clone)]
pub struct RocketMqProducer {
    producer: Producer,
}

fn check_stored(status: SendStatus) -> anyhow::Result<()> {
    match status {
        SendStatus::Ok => Ok(()),
        other => bail!("send answered {other:?}"),
    }
}

impl ProducerHandle for RocketMqProducer {
    async fn send_one(&self, stream: &str, body: Bytes) -> anyhow::Result<()> {
        let result = self.producer.send(Message::new(stream, body)).await?;
        check_stored(result.status)
    }

    async fn send_batch(&self, stream: &str, bodies: Vec<Bytes>) -> anyhow::Result<()> {
        let messages = bodies
            .into_iter()
            .map(|body| Message::new(stream, body))
            .collect();
        let result = self.producer.send_batch(messages).await?;
        check_stored(result.status)
    }

    async fn close(self) {
        self.producer.shutdown().await;
    }
}
