//! `BrokerAdmin` over the RocketMQ remoting protocol: quiver-protocol's codec on a tokio
//! TcpStream, one short connection per call (the operator calls each broker a few times per
//! lag interval, so pooling buys nothing).

use crate::admin::{
    AdminError, BrokerAddr, BrokerAdmin, BrokerPermission, ConsumeStats, QueueConsumeStats,
    QueueOffset, QueueTopicStats, ResetTarget, RuntimeInfo, SubscriptionGroup, TopicConfig,
    TopicStats,
};
use bytes::BytesMut;
use futures::future::{BoxFuture, FutureExt};
use quiver_protocol::body::{self, SubscriptionGroupConfig};
use quiver_protocol::code::{request, response};
use quiver_protocol::{frame, ExtFields, RemotingCommand};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Default bound on one call: connect, send, and read the response.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// PULL_MESSAGE sysFlag bit: the request carries its own subscription expression.
const PULL_FLAG_SUBSCRIPTION: i32 = 1 << 2;

/// Talks to brokers directly by address.
pub struct RemotingAdmin {
    call_timeout: Duration,
    next_opaque: AtomicI32,
}

impl Default for RemotingAdmin {
    fn default() -> Self {
        RemotingAdmin::new(DEFAULT_CALL_TIMEOUT)
    }
}

fn ext<const N: usize>(fields: [(&str, String); N]) -> ExtFields {
    fields
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect()
}

impl RemotingAdmin {
    /// An admin whose calls each take at most `call_timeout`.
    pub fn new(call_timeout: Duration) -> RemotingAdmin {
        RemotingAdmin {
            call_timeout,
            next_opaque: AtomicI32::new(1),
        }
    }

    /// Sends `command` (named `name` in errors) and returns the response with the same opaque.
    pub async fn call(
        &self,
        addr: &BrokerAddr,
        command: RemotingCommand,
        name: &'static str,
    ) -> Result<RemotingCommand, AdminError> {
        let opaque = self.next_opaque.fetch_add(1, Ordering::Relaxed);
        let encoded = frame::encode_to_bytes(&command.with_opaque(opaque)).map_err(|source| {
            AdminError::Malformed {
                addr: addr.clone(),
                request: name,
                source: Box::new(source),
            }
        })?;
        let exchange = async {
            let mut stream = TcpStream::connect(&addr.0)
                .await
                .map_err(|source| unreachable(addr, source))?;
            stream
                .write_all(&encoded)
                .await
                .map_err(|source| unreachable(addr, source))?;
            let mut buffer = BytesMut::with_capacity(8 * 1024);
            loop {
                match frame::decode(&mut buffer) {
                    Ok(Some(reply)) if reply.is_response() && reply.opaque == opaque => {
                        return Ok(reply)
                    }
                    // Pushes from the broker (none expected) are skipped.
                    Ok(Some(_)) => continue,
                    Ok(None) => {}
                    Err(source) => {
                        return Err(AdminError::Malformed {
                            addr: addr.clone(),
                            request: name,
                            source: Box::new(source),
                        })
                    }
                }
                let read = stream
                    .read_buf(&mut buffer)
                    .await
                    .map_err(|source| unreachable(addr, source))?;
                if read == 0 {
                    let closed = std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "connection closed before the response",
                    );
                    return Err(unreachable(addr, closed));
                }
            }
        };
        match tokio::time::timeout(self.call_timeout, exchange).await {
            Ok(result) => result,
            Err(elapsed) => Err(AdminError::Unreachable {
                addr: addr.clone(),
                source: Box::new(elapsed),
            }),
        }
    }

    async fn invoke_ok(
        &self,
        addr: &BrokerAddr,
        command: RemotingCommand,
        name: &'static str,
    ) -> Result<RemotingCommand, AdminError> {
        let reply = self.call(addr, command, name).await?;
        if reply.code == response::SUCCESS {
            Ok(reply)
        } else {
            Err(rejected(addr, name, &reply))
        }
    }

    /// Store time of the message at `offset`, read with a one-message pull that commits nothing.
    async fn store_time_at(
        &self,
        addr: &BrokerAddr,
        group: &str,
        queue: &body::MessageQueue,
        offset: i64,
    ) -> Result<Option<i64>, AdminError> {
        let fields = ext([
            ("consumerGroup", group.to_string()),
            ("topic", queue.topic.clone()),
            ("queueId", queue.queue_id.to_string()),
            ("queueOffset", offset.to_string()),
            ("maxMsgNums", "1".to_string()),
            ("sysFlag", PULL_FLAG_SUBSCRIPTION.to_string()),
            ("commitOffset", "-1".to_string()),
            ("suspendTimeoutMillis", "0".to_string()),
            ("subscription", "*".to_string()),
            ("subVersion", "0".to_string()),
            ("expressionType", "TAG".to_string()),
        ]);
        let reply = self
            .call(
                addr,
                RemotingCommand::request(request::PULL_MESSAGE, fields),
                "PULL_MESSAGE",
            )
            .await?;
        Ok(match reply.code {
            response::SUCCESS => quiver_protocol::record::store_timestamp_of(&reply.body),
            // Nothing there (moved or not yet dispatched): the time lag stays unknown.
            _ => None,
        })
    }

    async fn consume_stats_of(
        &self,
        addr: &BrokerAddr,
        group: &str,
    ) -> Result<ConsumeStats, AdminError> {
        let command = RemotingCommand::request(
            request::GET_CONSUME_STATS,
            ext([("consumerGroup", group.to_string())]),
        );
        let reply = self.call(addr, command, "GET_CONSUME_STATS").await?;
        if reply.code == response::SUBSCRIPTION_GROUP_NOT_EXIST {
            return Ok(ConsumeStats::default());
        }
        if reply.code != response::SUCCESS {
            return Err(rejected(addr, "GET_CONSUME_STATS", &reply));
        }
        let stats =
            body::ConsumeStats::decode(&reply.body).map_err(|source| AdminError::Malformed {
                addr: addr.clone(),
                request: "GET_CONSUME_STATS",
                source: Box::new(source),
            })?;
        let mut queues = Vec::with_capacity(stats.offset_table.len());
        for (queue, offsets) in stats.offset_table {
            let broker_offset = QueueOffset(u64::try_from(offsets.broker_offset).unwrap_or(0));
            // A negative consumer offset is the broker's "nothing committed".
            let consumer_offset = u64::try_from(offsets.consumer_offset).ok().map(QueueOffset);
            let oldest_unconsumed_store_ms = match consumer_offset {
                Some(committed) if committed < broker_offset => {
                    self.store_time_at(addr, group, &queue, offsets.consumer_offset)
                        .await?
                }
                _ => None,
            };
            queues.push(QueueConsumeStats {
                topic: queue.topic,
                broker_name: queue.broker_name,
                queue_id: i32::try_from(queue.queue_id).unwrap_or(i32::MAX),
                broker_offset,
                consumer_offset,
                oldest_unconsumed_store_ms,
            });
        }
        Ok(ConsumeStats { queues })
    }
}

fn unreachable(addr: &BrokerAddr, source: std::io::Error) -> AdminError {
    AdminError::Unreachable {
        addr: addr.clone(),
        source: Box::new(source),
    }
}

fn rejected(addr: &BrokerAddr, name: &'static str, reply: &RemotingCommand) -> AdminError {
    AdminError::Rejected {
        addr: addr.clone(),
        request: name,
        code: reply.code,
        remark: reply.remark.clone().unwrap_or_default(),
    }
}

impl BrokerAdmin for RemotingAdmin {
    fn consume_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<ConsumeStats, AdminError>> {
        self.consume_stats_of(addr, group).boxed()
    }

    fn topic_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<TopicStats, AdminError>> {
        async move {
            let command = RemotingCommand::request(
                request::GET_TOPIC_STATS_INFO,
                ext([("topic", topic.to_string())]),
            );
            let reply = self
                .invoke_ok(addr, command, "GET_TOPIC_STATS_INFO")
                .await?;
            let table = body::TopicStatsTable::decode(&reply.body).map_err(|source| {
                AdminError::Malformed {
                    addr: addr.clone(),
                    request: "GET_TOPIC_STATS_INFO",
                    source: Box::new(source),
                }
            })?;
            let queues = table
                .offset_table
                .into_iter()
                .map(|(queue, offsets)| QueueTopicStats {
                    broker_name: queue.broker_name,
                    queue_id: i32::try_from(queue.queue_id).unwrap_or(i32::MAX),
                    min_offset: QueueOffset(u64::try_from(offsets.min_offset).unwrap_or(0)),
                    max_offset: QueueOffset(u64::try_from(offsets.max_offset).unwrap_or(0)),
                    last_update_ms: (offsets.last_update_timestamp > 0)
                        .then_some(offsets.last_update_timestamp),
                })
                .collect();
            Ok(TopicStats { queues })
        }
        .boxed()
    }

    fn members<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        async move {
            let command = RemotingCommand::request(
                request::GET_CONSUMER_CONNECTION_LIST,
                ext([("consumerGroup", group.to_string())]),
            );
            let reply = self
                .call(addr, command, "GET_CONSUMER_CONNECTION_LIST")
                .await?;
            if reply.code == response::CONSUMER_NOT_ONLINE {
                return Ok(Vec::new());
            }
            if reply.code != response::SUCCESS {
                return Err(rejected(addr, "GET_CONSUMER_CONNECTION_LIST", &reply));
            }
            let connections = body::ConsumerConnection::decode(&reply.body).map_err(|source| {
                AdminError::Malformed {
                    addr: addr.clone(),
                    request: "GET_CONSUMER_CONNECTION_LIST",
                    source: Box::new(source),
                }
            })?;
            Ok(connections
                .connection_set
                .into_iter()
                .map(|connection| connection.client_id)
                .collect())
        }
        .boxed()
    }

    fn groups<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        async move {
            let command = RemotingCommand::request(
                request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
                ExtFields::default(),
            );
            let reply = self
                .invoke_ok(addr, command, "GET_ALL_SUBSCRIPTIONGROUP_CONFIG")
                .await?;
            let wrapper =
                body::SubscriptionGroupWrapper::decode(&reply.body).map_err(|source| {
                    AdminError::Malformed {
                        addr: addr.clone(),
                        request: "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
                        source: Box::new(source),
                    }
                })?;
            Ok(wrapper.subscription_group_table.into_keys().collect())
        }
        .boxed()
    }

    fn topics<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        async move {
            let command =
                RemotingCommand::request(request::GET_ALL_TOPIC_CONFIG, ExtFields::default());
            let reply = self
                .invoke_ok(addr, command, "GET_ALL_TOPIC_CONFIG")
                .await?;
            let wrapper =
                body::TopicConfigSerializeWrapper::decode(&reply.body).map_err(|source| {
                    AdminError::Malformed {
                        addr: addr.clone(),
                        request: "GET_ALL_TOPIC_CONFIG",
                        source: Box::new(source),
                    }
                })?;
            Ok(wrapper.topic_config_table.into_keys().collect())
        }
        .boxed()
    }

    fn set_permission<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        permission: BrokerPermission,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let properties = BTreeMap::from([(
                "brokerPermission".to_string(),
                permission.wire_value().to_string(),
            )]);
            let command =
                RemotingCommand::request(request::UPDATE_BROKER_CONFIG, ExtFields::default())
                    .with_body(body::encode_properties_text(&properties));
            self.invoke_ok(addr, command, "UPDATE_BROKER_CONFIG")
                .await
                .map(drop)
        }
        .boxed()
    }

    fn create_topic<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a TopicConfig,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let fields = ext([
                ("topic", topic.name.clone()),
                ("defaultTopic", "TBW102".to_string()),
                ("readQueueNums", topic.queues.to_string()),
                ("writeQueueNums", topic.queues.to_string()),
                ("perm", BrokerPermission::ReadWrite.wire_value().to_string()),
                ("topicFilterType", "SINGLE_TAG".to_string()),
                ("topicSysFlag", "0".to_string()),
                ("order", "false".to_string()),
            ]);
            let command = RemotingCommand::request(request::UPDATE_AND_CREATE_TOPIC, fields);
            self.invoke_ok(addr, command, "UPDATE_AND_CREATE_TOPIC")
                .await
                .map(drop)
        }
        .boxed()
    }

    fn upsert_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a SubscriptionGroup,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let config = SubscriptionGroupConfig {
                consume_enable: group.consume_enable,
                consume_from_min_enable: group.consume_from_min_enable,
                retry_queue_nums: group.retry_queue_nums,
                retry_max_times: group.max_reconsume_times,
                ..SubscriptionGroupConfig::named(group.group.clone())
            };
            let command = RemotingCommand::request(
                request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                ExtFields::default(),
            )
            .with_body(config.encode());
            self.invoke_ok(addr, command, "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP")
                .await
                .map(drop)
        }
        .boxed()
    }

    fn reset_offsets<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
        topic: &'a str,
        target: ResetTarget,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            // The broker's encoding: 0 earliest, -1 latest, else a timestamp in ms.
            let timestamp = match target {
                ResetTarget::Earliest => 0,
                ResetTarget::Latest => -1,
                ResetTarget::Timestamp(ms) => ms.max(1),
            };
            let fields = ext([
                ("topic", topic.to_string()),
                ("group", group.to_string()),
                ("timestamp", timestamp.to_string()),
                ("isForce", "true".to_string()),
            ]);
            let command = RemotingCommand::request(request::INVOKE_BROKER_TO_RESET_OFFSET, fields);
            self.invoke_ok(addr, command, "INVOKE_BROKER_TO_RESET_OFFSET")
                .await
                .map(drop)
        }
        .boxed()
    }

    fn delete_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let fields = ext([
                ("groupName", group.to_string()),
                ("cleanOffset", "true".to_string()),
            ]);
            let command = RemotingCommand::request(request::DELETE_SUBSCRIPTIONGROUP, fields);
            self.invoke_ok(addr, command, "DELETE_SUBSCRIPTIONGROUP")
                .await
                .map(drop)
        }
        .boxed()
    }

    fn runtime_info<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<RuntimeInfo, AdminError>> {
        async move {
            let command =
                RemotingCommand::request(request::GET_BROKER_RUNTIME_INFO, ExtFields::default());
            // An older broker answers REQUEST_CODE_NOT_SUPPORTED: a Rejected error the caller
            // recognises with `is_unsupported`.
            let reply = self
                .invoke_ok(addr, command, "GET_BROKER_RUNTIME_INFO")
                .await?;
            let table =
                body::KvTable::decode(&reply.body).map_err(|source| AdminError::Malformed {
                    addr: addr.clone(),
                    request: "GET_BROKER_RUNTIME_INFO",
                    source: Box::new(source),
                })?;
            Ok(RuntimeInfo::from_table(&table.table))
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    /// A broker stand-in on loopback that answers one request with `answer(request)`.
    async fn one_answer(
        answer: impl FnOnce(&RemotingCommand) -> RemotingCommand + Send + 'static,
    ) -> BrokerAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = BrokerAddr(listener.local_addr().expect("addr").to_string());
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut buffer = BytesMut::new();
            let request = loop {
                if let Some(request) = frame::decode(&mut buffer).expect("frame") {
                    break request;
                }
                assert!(stream.read_buf(&mut buffer).await.expect("read") > 0);
            };
            let reply = frame::encode_to_bytes(&answer(&request)).expect("encode");
            stream.write_all(&reply).await.expect("write");
        });
        addr
    }

    #[tokio::test]
    async fn runtime_info_decodes_the_kv_table() {
        let addr = one_answer(|request| {
            assert_eq!(request.code, request::GET_BROKER_RUNTIME_INFO);
            let table = body::KvTable {
                table: BTreeMap::from([
                    ("commitLogDiskRatio".to_string(), "0.93".to_string()),
                    ("quiverDiskHighWaterRatio".to_string(), "0.9".to_string()),
                    ("quiverWritable".to_string(), "false".to_string()),
                    (
                        "quiverWriteRefusal".to_string(),
                        "disk-high-water".to_string(),
                    ),
                ]),
            };
            request
                .response_to(response::SUCCESS, None)
                .with_body(table.encode())
        })
        .await;
        let info = RemotingAdmin::default()
            .runtime_info(&addr)
            .await
            .expect("answered");
        assert_eq!(info.disk_used_ratio, Some(0.93));
        assert_eq!(info.high_water_ratio, Some(0.9));
        assert_eq!(info.writable, Some(false));
        assert_eq!(info.write_refusal.as_deref(), Some("disk-high-water"));
    }

    #[tokio::test]
    async fn an_older_broker_is_recognised_as_unsupported() {
        let addr = one_answer(|request| {
            request.response_to(
                response::REQUEST_CODE_NOT_SUPPORTED,
                Some("request type 28 not supported".to_string()),
            )
        })
        .await;
        let error = RemotingAdmin::default()
            .runtime_info(&addr)
            .await
            .expect_err("refused");
        assert!(error.is_unsupported(), "{error:?}");
    }
}
