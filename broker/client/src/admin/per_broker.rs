//! Admin calls addressed to one broker, as a controller that knows its brokers makes them
//! (the operator's broker-admin trait is implemented over these).

use std::collections::BTreeMap;

use quiver_protocol::body::{self, SubscriptionGroupConfig};
use quiver_protocol::header as h;
use quiver_protocol::offset::QueueOffset;
use quiver_protocol::{code, ExtFields, RemotingCommand};

use super::{Admin, ResetTarget, TopicSpec};
use crate::error::{ClientError, Result};
use crate::ops::{PullSpec, PullStatus};
use crate::remoting::expect_success;
use crate::subscription::Subscription;
use crate::MessageQueue;

/// Decodes a response body, naming the broker and request when it is malformed.
pub(super) fn decoded<T>(
    addr: &str,
    request_code: i32,
    decode: impl FnOnce(&[u8]) -> std::result::Result<T, quiver_protocol::BodyError>,
    response: &RemotingCommand,
) -> Result<T> {
    decode(&response.body).map_err(|source| ClientError::Body {
        addr: addr.to_owned(),
        request_code,
        source,
    })
}

impl Admin {
    /// Sends `request` to `addr` and accepts only SUCCESS.
    pub(super) async fn call_ok(
        &self,
        addr: &str,
        request: RemotingCommand,
    ) -> Result<RemotingCommand> {
        let request_code = request.code;
        let response = self.core.invoke(addr, request).await?;
        expect_success(addr, request_code, response)
    }

    /// A group's per-queue offsets on one broker (every topic it consumes when `topic` is
    /// None); `None` when the broker does not know the group.
    pub async fn consume_stats_at(
        &self,
        addr: &str,
        group: &str,
        topic: Option<&str>,
    ) -> Result<Option<body::ConsumeStats>> {
        let header = h::GetConsumeStatsRequestHeader {
            consumer_group: group.to_owned(),
            topic: topic.map(str::to_owned),
            // -1 for "never committed" (unknown lag); an Apache broker answers 0 there.
            mark_uncommitted: Some(true),
        };
        let request = RemotingCommand::request(code::request::GET_CONSUME_STATS, header.to_ext());
        let response = self.core.invoke(addr, request).await?;
        if response.code == code::response::SUBSCRIPTION_GROUP_NOT_EXIST {
            return Ok(None);
        }
        let response = expect_success(addr, code::request::GET_CONSUME_STATS, response)?;
        let stats = decoded(
            addr,
            code::request::GET_CONSUME_STATS,
            body::ConsumeStats::decode,
            &response,
        )?;
        Ok(Some(stats))
    }

    /// Store time (ms) of the message at `offset` of `queue` on the broker at `addr`, read with
    /// a one-message pull that commits nothing; `None` when no message is there.
    pub async fn store_time_at(
        &self,
        addr: &str,
        group: &str,
        queue: &MessageQueue,
        offset: QueueOffset,
    ) -> Result<Option<i64>> {
        let subscription = Subscription::new(queue.topic.clone(), "*");
        let spec = PullSpec {
            group,
            queue,
            offset,
            max_messages: 1,
            subscription: &subscription,
            commit_offset: None,
            suspend: None,
            epoch: None,
        };
        let pulled = self.core.pull_from(addr, &spec).await?;
        Ok(match pulled.status {
            PullStatus::Found(messages) => messages.first().map(|m| m.store_timestamp_ms),
            _ => None,
        })
    }

    /// A topic's per-queue min and max offsets on one broker.
    pub async fn topic_stats_at(&self, addr: &str, topic: &str) -> Result<body::TopicStatsTable> {
        let header = h::GetTopicStatsInfoRequestHeader {
            topic: topic.to_owned(),
        };
        let request =
            RemotingCommand::request(code::request::GET_TOPIC_STATS_INFO, header.to_ext());
        let response = self.call_ok(addr, request).await?;
        decoded(
            addr,
            code::request::GET_TOPIC_STATS_INFO,
            body::TopicStatsTable::decode,
            &response,
        )
    }

    /// The clients of a group connected to one broker; empty when none is online.
    pub async fn members_at(&self, addr: &str, group: &str) -> Result<Vec<body::Connection>> {
        let header = h::GetConsumerConnectionListRequestHeader {
            consumer_group: group.to_owned(),
        };
        let request =
            RemotingCommand::request(code::request::GET_CONSUMER_CONNECTION_LIST, header.to_ext());
        let response = self.core.invoke(addr, request).await?;
        if response.code == code::response::CONSUMER_NOT_ONLINE {
            return Ok(Vec::new());
        }
        let response = expect_success(addr, code::request::GET_CONSUMER_CONNECTION_LIST, response)?;
        let connections = decoded(
            addr,
            code::request::GET_CONSUMER_CONNECTION_LIST,
            body::ConsumerConnection::decode,
            &response,
        )?;
        Ok(connections.connection_set)
    }

    /// Every subscription group one broker knows, sorted.
    pub async fn groups_at(&self, addr: &str) -> Result<Vec<String>> {
        let configs = self.group_configs_at(addr).await?;
        Ok(configs
            .into_iter()
            .map(|config| config.group_name)
            .collect())
    }

    /// The settings of every subscription group one broker knows, sorted by name.
    pub async fn group_configs_at(&self, addr: &str) -> Result<Vec<SubscriptionGroupConfig>> {
        let request = RemotingCommand::request(
            code::request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            ExtFields::default(),
        );
        let response = self.call_ok(addr, request).await?;
        let wrapper = decoded(
            addr,
            code::request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
            body::SubscriptionGroupWrapper::decode,
            &response,
        )?;
        let table = wrapper.subscription_group_table.into_iter();
        // The key names the group; a body written by another tool may leave groupName out.
        Ok(table
            .map(|(name, config)| SubscriptionGroupConfig {
                group_name: name,
                ..config
            })
            .collect())
    }

    /// Every topic one broker holds, with its queue counts and permission, sorted by name.
    pub async fn topics_at(&self, addr: &str) -> Result<Vec<TopicSpec>> {
        let request =
            RemotingCommand::request(code::request::GET_ALL_TOPIC_CONFIG, ExtFields::default());
        let response = self.call_ok(addr, request).await?;
        let wrapper = decoded(
            addr,
            code::request::GET_ALL_TOPIC_CONFIG,
            body::TopicConfigSerializeWrapper::decode,
            &response,
        )?;
        Ok(wrapper
            .topic_config_table
            .into_iter()
            .map(|(name, config)| TopicSpec {
                name,
                read_queue_nums: config.read_queue_nums,
                write_queue_nums: config.write_queue_nums,
                perm: config.perm,
            })
            .collect())
    }

    /// Creates or updates a topic on one broker.
    pub async fn create_topic_at(&self, addr: &str, spec: &TopicSpec) -> Result<()> {
        let header = h::CreateTopicRequestHeader {
            topic: spec.name.clone(),
            default_topic: Some(crate::producer::AUTO_CREATE_TOPIC_KEY.to_owned()),
            read_queue_nums: i32::try_from(spec.read_queue_nums).unwrap_or(i32::MAX),
            write_queue_nums: i32::try_from(spec.write_queue_nums).unwrap_or(i32::MAX),
            perm: spec.perm,
            topic_filter_type: Some("SINGLE_TAG".to_owned()),
            topic_sys_flag: Some(0),
            order: Some(false),
        };
        let request =
            RemotingCommand::request(code::request::UPDATE_AND_CREATE_TOPIC, header.to_ext());
        self.call_ok(addr, request).await.map(drop)
    }

    /// Creates or updates a subscription group's settings on one broker.
    pub async fn upsert_group_at(
        &self,
        addr: &str,
        config: &SubscriptionGroupConfig,
    ) -> Result<()> {
        let request = RemotingCommand::request(
            code::request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
            ExtFields::default(),
        )
        .with_body(config.encode());
        self.call_ok(addr, request).await.map(drop)
    }

    /// Deletes a subscription group and its committed offsets on one broker.
    pub async fn delete_group_at(&self, addr: &str, group: &str) -> Result<()> {
        let header = h::DeleteSubscriptionGroupRequestHeader {
            group_name: group.to_owned(),
            clean_offset: Some(true),
        };
        let request =
            RemotingCommand::request(code::request::DELETE_SUBSCRIPTIONGROUP, header.to_ext());
        self.call_ok(addr, request).await.map(drop)
    }

    /// Has one broker move a group's offsets on `topic` and tell the group's online members.
    pub async fn reset_offsets_at(
        &self,
        addr: &str,
        group: &str,
        topic: &str,
        target: ResetTarget,
    ) -> Result<()> {
        let header = h::ResetOffsetRequestHeader {
            topic: topic.to_owned(),
            group: group.to_owned(),
            timestamp: target.wire_timestamp(),
            is_force: true,
        };
        let request = RemotingCommand::request(
            code::request::INVOKE_BROKER_TO_RESET_OFFSET,
            header.to_ext(),
        );
        self.call_ok(addr, request).await.map(drop)
    }

    /// GET_BROKER_RUNTIME_INFO's key-value table (disk ratios, writability, ...). An older
    /// broker refuses it: [`ClientError::is_unsupported`] tells.
    pub async fn runtime_info_at(&self, addr: &str) -> Result<BTreeMap<String, String>> {
        let request =
            RemotingCommand::request(code::request::GET_BROKER_RUNTIME_INFO, ExtFields::default());
        let response = self.call_ok(addr, request).await?;
        let table = decoded(
            addr,
            code::request::GET_BROKER_RUNTIME_INFO,
            body::KvTable::decode,
            &response,
        )?;
        Ok(table.table)
    }
}
