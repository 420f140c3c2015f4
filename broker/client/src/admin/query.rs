//! Finding messages: by key or unique key (QUERY_MESSAGE to every broker of the topic), by
//! offset message id (VIEW_MESSAGE_BY_ID to the broker the id names), and a queue's earliest
//! store time (GET_EARLIEST_MSG_STORETIME).

use quiver_protocol::header as h;
use quiver_protocol::{code, message as wire, record, RemotingCommand};

use super::Admin;
use crate::error::{ClientError, Result};
use crate::remoting::{expect_codes, expect_success};
use crate::{MessageQueue, ReceivedMessage};

/// Messages a query by unique key asks each broker for (Apache's `defaultQueryMaxNum`).
const UNIQUE_KEY_QUERY_MAX: i32 = 32;

/// A key query: what to look for, and when it was stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyQuery {
    pub topic: String,
    pub key: String,
    /// Messages each broker returns at most (brokers cap it at 64).
    pub max_per_broker: u32,
    /// Store time range in ms since the epoch, both ends included.
    pub begin_ms: i64,
    pub end_ms: i64,
}

impl KeyQuery {
    /// Every message of `topic` with `key`, whenever stored (up to 64 per broker).
    pub fn new(topic: impl Into<String>, key: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            key: key.into(),
            max_per_broker: 64,
            begin_ms: 0,
            end_ms: i64::MAX,
        }
    }
}

impl Admin {
    /// The messages of the topic whose KEYS (or unique key) hold the key, stored within the
    /// range, from every broker of the topic; oldest first.
    pub async fn query_by_key(&self, query: &KeyQuery) -> Result<Vec<ReceivedMessage>> {
        let max = i32::try_from(query.max_per_broker).unwrap_or(i32::MAX);
        self.query_brokers(query, max, false).await
    }

    /// The messages of `topic` whose unique key (UNIQ_KEY, the id a producer's send result
    /// shows) is `id`; more than one only when it was stored again (a retry). Oldest first.
    pub async fn query_by_unique_key(&self, topic: &str, id: &str) -> Result<Vec<ReceivedMessage>> {
        let query = KeyQuery::new(topic, id);
        let mut found = self
            .query_brokers(&query, UNIQUE_KEY_QUERY_MAX, true)
            .await?;
        found.retain(|message| message.property(wire::PROPERTY_UNIQ_KEY) == Some(id));
        Ok(found)
    }

    async fn query_brokers(
        &self,
        query: &KeyQuery,
        max_num: i32,
        by_unique_key: bool,
    ) -> Result<Vec<ReceivedMessage>> {
        let route = self.core.fetch_route(&query.topic).await?;
        let mut found = Vec::new();
        for (broker_name, addr) in &route.brokers {
            let header = h::QueryMessageRequestHeader {
                topic: query.topic.clone(),
                key: query.key.clone(),
                max_num,
                begin_timestamp: query.begin_ms,
                end_timestamp: query.end_ms,
            };
            let mut fields = header.to_ext();
            if by_unique_key {
                fields.insert(h::UNIQUE_KEY_QUERY_FLAG, "true");
            }
            let request = RemotingCommand::request(code::request::QUERY_MESSAGE, fields);
            let response = self.core.invoke(addr, request).await?;
            let accepted = [code::response::SUCCESS, code::response::QUERY_NOT_FOUND];
            let response = expect_codes(addr, code::request::QUERY_MESSAGE, response, &accepted)?;
            found.extend(received(
                addr,
                broker_name,
                code::request::QUERY_MESSAGE,
                &response,
            )?);
        }
        found.sort_by_key(|m| (m.store_timestamp_ms, m.commit_log_offset));
        Ok(found)
    }

    /// The message an offset message id (store host + CommitLog offset) names, read from the
    /// broker at that host.
    pub async fn view_message(&self, offset_msg_id: &str) -> Result<ReceivedMessage> {
        let (host, offset) = wire::decode_offset_msg_id(offset_msg_id).map_err(|error| {
            ClientError::InvalidArgument {
                what: "message id",
                reason: error.to_string(),
            }
        })?;
        let addr = host.to_string();
        let header = h::ViewMessageRequestHeader {
            offset: i64::try_from(offset).unwrap_or(i64::MAX),
        };
        let request = RemotingCommand::request(code::request::VIEW_MESSAGE_BY_ID, header.to_ext());
        let response = self.core.invoke(&addr, request).await?;
        let response = expect_success(&addr, code::request::VIEW_MESSAGE_BY_ID, response)?;
        let broker_name = self.broker_name_of(&addr).await;
        received(
            &addr,
            &broker_name,
            code::request::VIEW_MESSAGE_BY_ID,
            &response,
        )?
        .pop()
        .ok_or_else(|| ClientError::MessageNotFound {
            what: format!("message {offset_msg_id}"),
        })
    }

    /// The broker name the cluster gives `addr`; the address itself when unknown.
    async fn broker_name_of(&self, addr: &str) -> String {
        match self.cluster_info().await {
            Ok(info) => self
                .brokers_of(&info)
                .into_iter()
                .find(|(_, _, known)| known == addr)
                .map_or_else(|| addr.to_owned(), |(_, name, _)| name),
            Err(_) => addr.to_owned(),
        }
    }

    /// Store time (ms) of the oldest message still in `queue`; `None` when it is empty.
    pub async fn earliest_store_time(&self, queue: &MessageQueue) -> Result<Option<i64>> {
        self.core.route(&queue.topic).await?;
        let addr = self.core.broker_addr(&queue.broker_name)?;
        let header = h::GetEarliestMsgStoretimeRequestHeader {
            topic: queue.topic.clone(),
            queue_id: i32::try_from(queue.queue_id).unwrap_or(i32::MAX),
        };
        let request =
            RemotingCommand::request(code::request::GET_EARLIEST_MSG_STORETIME, header.to_ext());
        let response = self.core.invoke(&addr, request).await?;
        let response = expect_success(&addr, code::request::GET_EARLIEST_MSG_STORETIME, response)?;
        let header = h::GetEarliestMsgStoretimeResponseHeader::from_command(&response).map_err(
            |source| ClientError::Header {
                addr: addr.clone(),
                request_code: code::request::GET_EARLIEST_MSG_STORETIME,
                source,
            },
        )?;
        Ok((header.timestamp >= 0).then_some(header.timestamp))
    }
}

/// The records of a query or view response, as received messages of `broker_name`.
fn received(
    addr: &str,
    broker_name: &str,
    request_code: i32,
    response: &RemotingCommand,
) -> Result<Vec<ReceivedMessage>> {
    let mut messages = Vec::new();
    let mut body = &response.body[..];
    while !body.is_empty() {
        let (record, used) = record::decode(body).map_err(|source| ClientError::QueryBody {
            addr: addr.to_owned(),
            request_code,
            source,
        })?;
        let queue = MessageQueue {
            topic: record.topic.clone(),
            broker_name: broker_name.to_owned(),
            queue_id: record.queue_id,
        };
        messages.push(ReceivedMessage::from_record(record, queue, used as u64));
        body = &body[used..];
    }
    Ok(messages)
}
