//! The NATS JetStream load generator (async-nats), file storage.

use std::time::Instant;

use anyhow::Context as _;
use async_nats::jetstream::{self, consumer, stream};
use bytes::Bytes;
use futures::StreamExt as _;
use tokio::sync::mpsc;

use crate::peers::workload::{record_arrival, Arrival, ProducerHandle, System};

pub struct NatsSystem {
    pub url: String,
    /// Messages asked for per pull request.
    pub pull_batch: usize,
}

impl NatsSystem {
    async fn context(&self) -> anyhow::Result<jetstream::Context> {
        let client = async_nats::connect(&self.url)
            .await
            .with_context(|| format!("connecting to NATS at {}", self.url))?;
        Ok(jetstream::new(client))
    }

    async fn ordered_messages(
        &self,
        stream_name: &str,
        durable: &str,
    ) -> anyhow::Result<consumer::pull::Stream> {
        let context = self.context().await?;
        let stream = context.get_stream(stream_name).await?;
        let consumer = stream
            .create_consumer(consumer::pull::Config {
                durable_name: Some(durable.to_owned()),
                deliver_policy: consumer::DeliverPolicy::All,
                // Like RocketMQ pulls, offsets are the reader's business: no per-message ack.
                ack_policy: consumer::AckPolicy::None,
                ..Default::default()
            })
            .await
            .with_context(|| format!("creating consumer {durable} on {stream_name}"))?;
        Ok(consumer
            .stream()
            .max_messages_per_batch(self.pull_batch)
            .messages()
            .await?)
    }
}

impl System for NatsSystem {
    type Producer = NatsProducer;

    async fn prepare(&self, stream_name: &str) -> anyhow::Result<()> {
        let context = self.context().await?;
        context
            .create_stream(stream::Config {
                name: stream_name.to_owned(),
                subjects: vec![stream_name.to_owned()],
                storage: stream::StorageType::File,
                ..Default::default()
            })
            .await
            .with_context(|| format!("creating stream {stream_name}"))?;
        Ok(())
    }

    async fn producer(&self) -> anyhow::Result<NatsProducer> {
        Ok(NatsProducer {
            context: self.context().await?,
        })
    }

    async fn read_back(
        &self,
        stream_name: &str,
        count: u64,
        deadline: Instant,
    ) -> anyhow::Result<(u64, u64)> {
        let mut messages = self.ordered_messages(stream_name, "catch_up").await?;
        let (mut read, mut bytes) = (0u64, 0u64);
        while read < count {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(remaining, messages.next()).await {
                Ok(Some(message)) => {
                    let message = message?;
                    read += 1;
                    bytes += message.payload.len() as u64;
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok((read, bytes))
    }

    async fn follow(
        &self,
        stream_name: &str,
        count: u64,
        deadline: Instant,
        arrivals: mpsc::UnboundedSender<Arrival>,
    ) -> anyhow::Result<()> {
        let mut messages = self.ordered_messages(stream_name, "follow").await?;
        let mut received = 0;
        while received < count {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(remaining, messages.next()).await {
                Ok(Some(message)) => {
                    record_arrival(&arrivals, &message?.payload);
                    received += 1;
                }
                Ok(None) | Err(_) => break,
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct NatsProducer {
    context: jetstream::Context,
}

impl ProducerHandle for NatsProducer {
    async fn send_one(&self, stream_name: &str, body: Bytes) -> anyhow::Result<()> {
        let ack = self.context.publish(stream_name.to_owned(), body).await?;
        ack.await?;
        Ok(())
    }

    /// JetStream has no batch publish: the batch is published back to back, then every
    /// acknowledgement is awaited.
    async fn send_batch(&self, stream_name: &str, bodies: Vec<Bytes>) -> anyhow::Result<()> {
        let mut acks = Vec::with_capacity(bodies.len());
        for body in bodies {
            acks.push(self.context.publish(stream_name.to_owned(), body).await?);
        }
        for ack in acks {
            ack.await?;
        }
        Ok(())
    }

    /// Every publish was acknowledged; dropping the last clone closes the connection.
    async fn close(self) {}
}
