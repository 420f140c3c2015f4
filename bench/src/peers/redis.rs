//! The Redis Streams load generator (redis crate): XADD, pipelined for batches; XRANGE for
//! the catch-up read; XREAD BLOCK to follow.

use std::time::Instant;

use anyhow::Context as _;
use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::streams::{StreamRangeReply, StreamReadReply};
use redis::Value;
use tokio::sync::mpsc;

use crate::peers::workload::{record_arrival, Arrival, ProducerHandle, System};

/// The field every entry carries its body in.
const BODY_FIELD: &str = "b";

pub struct RedisSystem {
    pub url: String,
    /// Entries asked for per XRANGE / XREAD.
    pub read_batch: usize,
}

impl RedisSystem {
    async fn connection(&self) -> anyhow::Result<MultiplexedConnection> {
        let client = redis::Client::open(self.url.as_str())?;
        client
            .get_multiplexed_async_connection()
            .await
            .with_context(|| format!("connecting to Redis at {}", self.url))
    }
}

fn body_of(map: &std::collections::HashMap<String, Value>) -> &[u8] {
    match map.get(BODY_FIELD) {
        Some(Value::BulkString(bytes)) => bytes,
        _ => &[],
    }
}

impl System for RedisSystem {
    type Producer = RedisProducer;

    /// Streams are created by their first XADD; this starts from an empty key.
    async fn prepare(&self, stream: &str) -> anyhow::Result<()> {
        let mut connection = self.connection().await?;
        redis::cmd("DEL")
            .arg(stream)
            .query_async::<()>(&mut connection)
            .await?;
        Ok(())
    }

    async fn producer(&self) -> anyhow::Result<RedisProducer> {
        Ok(RedisProducer {
            connection: self.connection().await?,
        })
    }

    async fn read_back(
        &self,
        stream: &str,
        count: u64,
        deadline: Instant,
    ) -> anyhow::Result<(u64, u64)> {
        let mut connection = self.connection().await?;
        let (mut read, mut bytes) = (0u64, 0u64);
        let mut start = "-".to_owned();
        while read < count && Instant::now() < deadline {
            let reply: StreamRangeReply = redis::cmd("XRANGE")
                .arg(stream)
                .arg(&start)
                .arg("+")
                .arg("COUNT")
                .arg(self.read_batch)
                .query_async(&mut connection)
                .await?;
            let Some(last) = reply.ids.last() else { break };
            start = format!("({}", last.id);
            read += reply.ids.len() as u64;
            bytes += reply
                .ids
                .iter()
                .map(|entry| body_of(&entry.map).len() as u64)
                .sum::<u64>();
        }
        Ok((read, bytes))
    }

    async fn follow(
        &self,
        stream: &str,
        count: u64,
        deadline: Instant,
        arrivals: mpsc::UnboundedSender<Arrival>,
    ) -> anyhow::Result<()> {
        // Its own connection: a blocked XREAD holds up everything behind it.
        let mut connection = self.connection().await?;
        let mut last_id = "0".to_owned();
        let mut received = 0;
        while received < count && Instant::now() < deadline {
            let reply: Option<StreamReadReply> = redis::cmd("XREAD")
                .arg("COUNT")
                .arg(self.read_batch)
                .arg("BLOCK")
                .arg(100)
                .arg("STREAMS")
                .arg(stream)
                .arg(&last_id)
                .query_async(&mut connection)
                .await?;
            for key in reply.map(|reply| reply.keys).unwrap_or_default() {
                for entry in key.ids {
                    record_arrival(&arrivals, body_of(&entry.map));
                    received += 1;
                    last_id = entry.id;
                }
            }
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct RedisProducer {
    connection: MultiplexedConnection,
}

impl ProducerHandle for RedisProducer {
    async fn send_one(&self, stream: &str, body: Bytes) -> anyhow::Result<()> {
        let mut connection = self.connection.clone();
        redis::cmd("XADD")
            .arg(stream)
            .arg("*")
            .arg(BODY_FIELD)
            .arg(&body[..])
            .query_async::<String>(&mut connection)
            .await?;
        Ok(())
    }

    /// A pipeline of XADDs: one round trip for the batch.
    async fn send_batch(&self, stream: &str, bodies: Vec<Bytes>) -> anyhow::Result<()> {
        let mut pipeline = redis::pipe();
        for body in &bodies {
            pipeline
                .cmd("XADD")
                .arg(stream)
                .arg("*")
                .arg(BODY_FIELD)
                .arg(&body[..])
                .ignore();
        }
        let mut connection = self.connection.clone();
        pipeline.query_async::<()>(&mut connection).await?;
        Ok(())
    }

    async fn close(self) {}
}
