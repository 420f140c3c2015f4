//! Admin operations: topics, routes, cluster, consume stats and lag, offset resets, finding
//! messages by key or id.

mod per_broker;
mod query;
mod replication;
mod tools;

pub use query::KeyQuery;
pub use replication::{standalone_status, MembershipChange};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use quiver_protocol::body;
use quiver_protocol::header as h;
use quiver_protocol::offset::QueueOffset;
use quiver_protocol::{code, ExtFields, RemotingCommand};

use crate::client::{ClientConfig, ClientCore, TopicRoute};
use crate::error::{ClientError, Result};
use crate::message::now_ms;
use crate::remoting::expect_success;
use crate::MessageQueue;

/// Permission bits of a topic or broker, as the wire defines them.
pub use quiver_protocol::body::perm::{READ_ONLY as PERM_READ_ONLY, READ_WRITE as PERM_READ_WRITE};

#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct TopicSpec {
    pub name: String,
    pub read_queue_nums: u32,
    pub write_queue_nums: u32,
    pub perm: i32,
}

impl TopicSpec {
    pub fn new(name: impl Into<String>, queue_nums: u32) -> Self {
        Self {
            name: name.into(),
            read_queue_nums: queue_nums,
            write_queue_nums: queue_nums,
            perm: PERM_READ_WRITE,
        }
    }
}

/// A broker as the cluster info lists it, with whether it answered.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct BrokerStatus {
    pub cluster: String,
    pub broker_name: String,
    pub addr: String,
    pub state: BrokerState,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum BrokerState {
    Up {
        round_trip_ms: f64,
        permission: Option<i32>,
    },
    Unreachable {
        error: String,
    },
}

/// Lag of one (group, topic, queue).
#[derive(Clone, Debug, PartialEq)]
pub struct QueueLag {
    pub group: String,
    pub queue: MessageQueue,
    pub broker_offset: QueueOffset,
    /// None when the group never committed on this queue: its lag is unknown, not zero.
    pub consumer_offset: Option<QueueOffset>,
    pub lag_messages: Option<u64>,
    /// Age of the first unconsumed message; 0 when caught up; None when unknown.
    pub lag_seconds: Option<f64>,
}

/// Where an offset reset moves a group: the wire type, shared with the broker.
pub use quiver_protocol::header::ResetTarget;

pub struct Admin {
    core: Arc<ClientCore>,
}

impl Admin {
    pub fn new(config: ClientConfig) -> Self {
        Self {
            core: ClientCore::new(config),
        }
    }

    pub fn core(&self) -> &Arc<ClientCore> {
        &self.core
    }

    pub async fn cluster_info(&self) -> Result<body::ClusterInfo> {
        let request =
            RemotingCommand::request(code::request::GET_BROKER_CLUSTER_INFO, ExtFields::default());
        let (addr, response) = self.core.invoke_name_server(request).await?;
        let response = expect_success(&addr, code::request::GET_BROKER_CLUSTER_INFO, response)?;
        body::ClusterInfo::decode(&response.body).map_err(|source| ClientError::Body {
            addr,
            request_code: code::request::GET_BROKER_CLUSTER_INFO,
            source,
        })
    }

    /// Every master broker address of the cluster.
    pub async fn broker_addrs(&self) -> Result<Vec<String>> {
        Ok(self
            .brokers_of(&self.cluster_info().await?)
            .into_iter()
            .map(|(_, _, addr)| addr)
            .collect())
    }

    fn brokers_of(&self, info: &body::ClusterInfo) -> Vec<(String, String, String)> {
        let mut brokers = Vec::new();
        for (cluster, names) in &info.cluster_addr_table {
            for name in names {
                if let Some(data) = info.broker_addr_table.get(name) {
                    if let Some(addr) = data.master_addr() {
                        brokers.push((cluster.clone(), name.clone(), addr.to_owned()));
                    }
                }
            }
        }
        brokers.sort();
        brokers
    }

    /// Each broker of the cluster and whether it answers.
    pub async fn brokers(&self) -> Result<Vec<BrokerStatus>> {
        let info = self.cluster_info().await?;
        let mut statuses = Vec::new();
        for (cluster, broker_name, addr) in self.brokers_of(&info) {
            let started = Instant::now();
            let request =
                RemotingCommand::request(code::request::GET_BROKER_CONFIG, ExtFields::default());
            let state = match self
                .core
                .invoke(&addr, request)
                .await
                .and_then(|r| expect_success(&addr, code::request::GET_BROKER_CONFIG, r))
            {
                Ok(response) => BrokerState::Up {
                    round_trip_ms: started.elapsed().as_secs_f64() * 1000.0,
                    permission: broker_permission(&response.body),
                },
                Err(error) => BrokerState::Unreachable {
                    error: error.to_string(),
                },
            };
            statuses.push(BrokerStatus {
                cluster,
                broker_name,
                addr,
                state,
            });
        }
        Ok(statuses)
    }

    /// Creates or updates the topic on every broker of the cluster.
    pub async fn create_topic(&self, spec: &TopicSpec) -> Result<Vec<String>> {
        if spec.name.is_empty() || spec.read_queue_nums == 0 || spec.write_queue_nums == 0 {
            return Err(ClientError::InvalidArgument {
                what: "topic",
                reason: "a topic needs a name and at least one read and one write queue".into(),
            });
        }
        let addrs = self.broker_addrs().await?;
        for addr in &addrs {
            self.create_topic_at(addr, spec).await?;
        }
        Ok(addrs)
    }

    /// Changes a broker's permission at run time: 6 read-write, 4 read-only (draining).
    pub async fn set_broker_permission(&self, addr: &str, permission: i32) -> Result<()> {
        let settings = BTreeMap::from([("brokerPermission".to_owned(), permission.to_string())]);
        let request =
            RemotingCommand::request(code::request::UPDATE_BROKER_CONFIG, ExtFields::default())
                .with_body(body::encode_properties_text(&settings));
        let response = self.core.invoke(addr, request).await?;
        expect_success(addr, code::request::UPDATE_BROKER_CONFIG, response)?;
        Ok(())
    }

    /// Every topic on any broker, merged by name (queue counts of the first broker seen).
    pub async fn topics(&self) -> Result<Vec<TopicSpec>> {
        let mut topics: BTreeMap<String, TopicSpec> = BTreeMap::new();
        for addr in self.broker_addrs().await? {
            for topic in self.topics_at(&addr).await? {
                topics.entry(topic.name.clone()).or_insert(topic);
            }
        }
        Ok(topics.into_values().collect())
    }

    pub async fn route(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        self.core.fetch_route(topic).await
    }

    /// Every subscription group any broker knows.
    pub async fn groups(&self) -> Result<Vec<String>> {
        let mut groups = Vec::new();
        for addr in self.broker_addrs().await? {
            groups.extend(self.groups_at(&addr).await?);
        }
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    /// The settings of every subscription group, the first broker's where several know it.
    pub async fn group_configs(&self) -> Result<Vec<body::SubscriptionGroupConfig>> {
        let mut groups = BTreeMap::new();
        for addr in self.broker_addrs().await? {
            for config in self.group_configs_at(&addr).await? {
                groups.entry(config.group_name.clone()).or_insert(config);
            }
        }
        Ok(groups.into_values().collect())
    }

    /// Creates or updates a subscription group on every broker; the brokers' addresses.
    pub async fn upsert_group(
        &self,
        config: &body::SubscriptionGroupConfig,
    ) -> Result<Vec<String>> {
        if config.group_name.is_empty() {
            return Err(ClientError::InvalidArgument {
                what: "group",
                reason: "a subscription group needs a name".into(),
            });
        }
        let addrs = self.broker_addrs().await?;
        for addr in &addrs {
            self.upsert_group_at(addr, config).await?;
        }
        Ok(addrs)
    }

    /// Per-queue broker and consumer offsets of a group, merged over the brokers.
    pub async fn consume_stats(
        &self,
        group: &str,
        topic: Option<&str>,
    ) -> Result<BTreeMap<MessageQueue, body::OffsetWrapper>> {
        let mut table = BTreeMap::new();
        for addr in self.broker_addrs().await? {
            if let Some(stats) = self.consume_stats_at(&addr, group, topic).await? {
                table.extend(stats.offset_table);
            }
        }
        Ok(table)
    }

    /// Lag per queue in messages and seconds (broker max offset minus committed offset).
    pub async fn lag(&self, group: &str, topic: Option<&str>) -> Result<Vec<QueueLag>> {
        let stats = self.consume_stats(group, topic).await?;
        let now = now_ms();
        let mut lags = Vec::with_capacity(stats.len());
        for (queue, wrapper) in stats {
            let broker_offset = QueueOffset(wrapper.broker_offset.max(0) as u64);
            let consumer_offset = (wrapper.consumer_offset >= 0)
                .then_some(QueueOffset(wrapper.consumer_offset as u64));
            let lag_messages = consumer_offset.map(|c| broker_offset.0.saturating_sub(c.0));
            let lag_seconds = match (consumer_offset, lag_messages) {
                (Some(_), Some(0)) => Some(0.0),
                (Some(committed), Some(_)) => self
                    .store_timestamp(group, &queue, committed)
                    .await
                    .map(|stored| (now - stored).max(0) as f64 / 1000.0),
                _ => None,
            };
            lags.push(QueueLag {
                group: group.to_owned(),
                queue,
                broker_offset,
                consumer_offset,
                lag_messages,
                lag_seconds,
            });
        }
        Ok(lags)
    }

    /// Store time of the message at `offset` on the broker the route names; None when unreadable.
    async fn store_timestamp(
        &self,
        group: &str,
        queue: &MessageQueue,
        offset: QueueOffset,
    ) -> Option<i64> {
        let read = async {
            self.core.route(&queue.topic).await?;
            let addr = self.core.broker_addr(&queue.broker_name)?;
            self.store_time_at(&addr, group, queue, offset).await
        };
        match read.await {
            Ok(stored) => stored,
            Err(error) => {
                tracing::debug!(queue = %queue, %error, "could not read the first unconsumed message");
                None
            }
        }
    }

    /// Moves the group's committed offsets on `topic` and tells its online members.
    pub async fn reset_offsets(
        &self,
        group: &str,
        topic: &str,
        target: ResetTarget,
    ) -> Result<Vec<(MessageQueue, QueueOffset)>> {
        let route = self.core.fetch_route(topic).await?;
        let mut moved = Vec::with_capacity(route.read_queues.len());
        for queue in &route.read_queues {
            let offset = match target {
                ResetTarget::Earliest => self.core.min_offset(queue).await?,
                ResetTarget::Latest => self.core.max_offset(queue).await?,
                ResetTarget::Timestamp(ts) => self.core.search_offset(queue, ts).await?,
            };
            // Committing directly covers groups with no member online.
            self.core
                .update_consumer_offset(group, queue, offset, true)
                .await?;
            moved.push((queue.clone(), offset));
        }
        let timestamp = target.wire_timestamp();
        for addr in route.brokers.values() {
            let header = h::ResetOffsetRequestHeader {
                topic: topic.to_owned(),
                group: group.to_owned(),
                timestamp,
                is_force: true,
            };
            let request = RemotingCommand::request(
                code::request::INVOKE_BROKER_TO_RESET_OFFSET,
                header.to_ext(),
            );
            let response = self.core.invoke(addr, request).await?;
            if response.code != code::response::SUCCESS {
                // No member online is fine: the committed offsets above are the reset.
                tracing::debug!(%addr, code = response.code, remark = ?response.remark, "broker did not push the reset");
            }
        }
        Ok(moved)
    }

    pub async fn shutdown(&self) {
        self.core.shutdown().await;
    }
}

/// `brokerPermission` from GET_BROKER_CONFIG's `key=value` properties text, when present.
fn broker_permission(body: &[u8]) -> Option<i32> {
    body::decode_properties_text(body)
        .ok()?
        .get("brokerPermission")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_is_read_from_config_lines() {
        assert_eq!(
            broker_permission(b"brokerName=broker-0\nbrokerPermission=4\n"),
            Some(4)
        );
        assert_eq!(broker_permission(b"brokerName=broker-0\n"), None);
    }
}
