//! The calls of `mqadmin` and the dashboard, addressed to one broker: who consumes a topic,
//! a producer group's connections, offset cloning, the cluster's topic list and a consumer's
//! running info (relayed by the broker to the consumer).

use quiver_protocol::body;
use quiver_protocol::header as h;
use quiver_protocol::{code, ExtFields, RemotingCommand};

use super::per_broker::decoded;
use super::Admin;
use crate::error::{ClientError, Result};

impl Admin {
    /// The groups consuming `topic` on one broker (online subscribers and groups with
    /// offsets), sorted.
    pub async fn consumed_by_at(&self, addr: &str, topic: &str) -> Result<Vec<String>> {
        let header = h::QueryTopicConsumeByWhoRequestHeader {
            topic: topic.to_owned(),
        };
        let request_code = code::request::QUERY_TOPIC_CONSUME_BY_WHO;
        let response = self
            .call_ok(
                addr,
                RemotingCommand::request(request_code, header.to_ext()),
            )
            .await?;
        let mut groups =
            decoded(addr, request_code, body::GroupList::decode, &response)?.group_list;
        groups.sort();
        Ok(groups)
    }

    /// The online clients of a producer group on one broker; empty when none is.
    pub async fn producers_at(&self, addr: &str, group: &str) -> Result<Vec<body::Connection>> {
        let header = h::GetProducerConnectionListRequestHeader {
            producer_group: group.to_owned(),
        };
        let request_code = code::request::GET_PRODUCER_CONNECTION_LIST;
        match self
            .call_ok(
                addr,
                RemotingCommand::request(request_code, header.to_ext()),
            )
            .await
        {
            Ok(response) => Ok(decoded(
                addr,
                request_code,
                body::ProducerConnection::decode,
                &response,
            )?
            .connection_set),
            // Apache's answer for a group with no online producer.
            Err(ClientError::Broker {
                code: code::response::SYSTEM_ERROR,
                ..
            }) => Ok(Vec::new()),
            Err(error) => Err(error),
        }
    }

    /// Copies `src`'s offsets to `dest` on one broker: on `topic`, or on every topic `src`
    /// has offsets on.
    pub async fn clone_offsets_at(
        &self,
        addr: &str,
        src: &str,
        dest: &str,
        topic: Option<&str>,
    ) -> Result<()> {
        let header = h::CloneGroupOffsetRequestHeader {
            src_group: src.to_owned(),
            dest_group: dest.to_owned(),
            topic: topic.map(str::to_owned),
            offline: Some(true),
        };
        let request = RemotingCommand::request(code::request::CLONE_GROUP_OFFSET, header.to_ext());
        self.call_ok(addr, request).await.map(drop)
    }

    /// Every topic of the cluster, as the name server (the broker at `addr`) lists them.
    pub async fn all_topic_names_at(&self, addr: &str) -> Result<Vec<String>> {
        let request_code = code::request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER;
        let request = RemotingCommand::request(request_code, ExtFields::default());
        let response = self.call_ok(addr, request).await?;
        Ok(decoded(addr, request_code, body::TopicList::decode, &response)?.topic_list)
    }

    /// A consumer's running info (Apache's `ConsumerRunningInfo` JSON), asked of the consumer
    /// `client_id` through the broker at `addr`.
    pub async fn consumer_running_info_at(
        &self,
        addr: &str,
        group: &str,
        client_id: &str,
    ) -> Result<serde_json::Value> {
        let header = h::GetConsumerRunningInfoRequestHeader {
            consumer_group: group.to_owned(),
            client_id: client_id.to_owned(),
            jstack_enable: Some(false),
        };
        let request_code = code::request::GET_CONSUMER_RUNNING_INFO;
        let response = self
            .call_ok(
                addr,
                RemotingCommand::request(request_code, header.to_ext()),
            )
            .await?;
        let as_json =
            |bytes: &[u8]| body::decode_json::<serde_json::Value>(bytes, "ConsumerRunningInfo");
        decoded(addr, request_code, as_json, &response)
    }

    /// Has the consumer `client_id` consume the stored message `msg_id` (an offset message id
    /// of the broker at `addr`) once, through the broker; Apache's
    /// `ConsumeMessageDirectlyResult` JSON.
    pub async fn consume_message_directly_at(
        &self,
        addr: &str,
        group: &str,
        client_id: &str,
        msg_id: &str,
    ) -> Result<serde_json::Value> {
        let header = h::ConsumeMessageDirectlyResultRequestHeader {
            consumer_group: group.to_owned(),
            client_id: Some(client_id.to_owned()),
            msg_id: Some(msg_id.to_owned()),
            broker_name: None,
        };
        let request_code = code::request::CONSUME_MESSAGE_DIRECTLY;
        let response = self
            .call_ok(
                addr,
                RemotingCommand::request(request_code, header.to_ext()),
            )
            .await?;
        let as_json = |bytes: &[u8]| {
            body::decode_json::<serde_json::Value>(bytes, "ConsumeMessageDirectlyResult")
        };
        decoded(addr, request_code, as_json, &response)
    }
}
