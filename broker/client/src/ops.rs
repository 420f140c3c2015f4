//! Single broker requests shared by the consumers and the admin: pull, offsets, send-back,
//! member lists and queue locks.

use std::collections::HashMap;
use std::time::Duration;

use quiver_protocol::{code, RemotingCommand};
use quiver_store::QueueOffset;

use crate::core::ClientCore;
use crate::error::{ClientError, Result};
use crate::message::ReceivedMessage;
use crate::remoting::{expect_codes, expect_success, response_error};
use crate::subscription::Subscription;
use crate::{ext_fields, MessageQueue};

/// PULL_MESSAGE sysFlag bits (DESIGN §3).
const PULL_FLAG_COMMIT_OFFSET: i32 = 1;
const PULL_FLAG_SUSPEND: i32 = 2;
const PULL_FLAG_SUBSCRIPTION: i32 = 4;

/// What a pull found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullStatus {
    Found(Vec<ReceivedMessage>),
    /// Nothing new at this offset (after the long poll, if one was asked for).
    NoNewMessage,
    /// Messages were there but none matched the tag filter: continue at `next_begin_offset`.
    NoMatchedMessage,
    /// The offset is outside the queue: resume at `next_begin_offset`.
    OffsetIllegal,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullResult {
    pub status: PullStatus,
    pub next_begin_offset: QueueOffset,
    pub min_offset: QueueOffset,
    pub max_offset: QueueOffset,
}

/// Where a failed message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendBackTarget {
    /// `%RETRY%group`, redelivered after a delay (the DLQ once retries are exhausted). The
    /// delay level is the broker's choice (3 + reconsumeTimes) unless given.
    Retry { delay_level: Option<u32> },
    /// Straight to `%DLQ%group` (orderly consumers that ran out of local attempts).
    DeadLetter,
}

/// One pull request.
#[derive(Clone, Debug)]
pub struct PullSpec<'a> {
    pub group: &'a str,
    pub queue: &'a MessageQueue,
    pub offset: QueueOffset,
    pub max_messages: u32,
    pub subscription: &'a Subscription,
    /// Offset to commit with this pull (piggy-backed commit).
    pub commit_offset: Option<QueueOffset>,
    /// Long-poll: the broker holds the request this long when nothing is there.
    pub suspend: Option<Duration>,
}

fn parse_offset(response: &RemotingCommand, field: &str) -> QueueOffset {
    QueueOffset(
        response
            .ext(field)
            .and_then(|v| v.parse::<i64>().ok())
            .map_or(0, |v| v.max(0) as u64),
    )
}

fn queue_fields(queue: &MessageQueue) -> [(&'static str, String); 2] {
    [
        ("topic", queue.topic.clone()),
        ("queueId", queue.queue_id.to_string()),
    ]
}

impl ClientCore {
    pub async fn pull(&self, spec: &PullSpec<'_>) -> Result<PullResult> {
        let addr = self.broker_addr(&spec.queue.broker_name)?;
        let mut sys_flag = PULL_FLAG_SUBSCRIPTION;
        if spec.commit_offset.is_some() {
            sys_flag |= PULL_FLAG_COMMIT_OFFSET;
        }
        if spec.suspend.is_some() {
            sys_flag |= PULL_FLAG_SUSPEND;
        }
        let suspend_ms = spec.suspend.map_or(0, |d| d.as_millis() as u64);
        let commit = spec.commit_offset.map_or(0, |o| o.0);
        let [topic, queue_id] = queue_fields(spec.queue);
        let ext = ext_fields([
            ("consumerGroup", spec.group.to_owned()),
            topic,
            queue_id,
            ("queueOffset", spec.offset.0.to_string()),
            ("maxMsgNums", spec.max_messages.to_string()),
            ("sysFlag", sys_flag.to_string()),
            ("commitOffset", commit.to_string()),
            ("suspendTimeoutMillis", suspend_ms.to_string()),
            ("subscription", spec.subscription.expression().to_owned()),
            ("subVersion", spec.subscription.version().to_string()),
            ("expressionType", "TAG".to_owned()),
        ]);
        let request = RemotingCommand::request(code::request::PULL_MESSAGE, ext);
        let timeout = self.request_timeout() + spec.suspend.unwrap_or_default();
        let response = self.remoting.invoke(&addr, request, timeout).await?;
        use code::response as r;
        let response = expect_codes(
            &addr,
            code::request::PULL_MESSAGE,
            response,
            &[
                r::SUCCESS,
                r::PULL_NOT_FOUND,
                r::PULL_RETRY_IMMEDIATELY,
                r::PULL_OFFSET_MOVED,
            ],
        )?;
        let next_begin_offset = parse_offset(&response, "nextBeginOffset");
        let min_offset = parse_offset(&response, "minOffset");
        let max_offset = parse_offset(&response, "maxOffset");
        let status = match response.code {
            r::SUCCESS => {
                let messages = decode_messages(&addr, spec.queue, &response.body)?;
                let matching: Vec<ReceivedMessage> = messages
                    .into_iter()
                    .filter(|m| spec.subscription.matches(m.tags()))
                    .collect();
                if matching.is_empty() {
                    PullStatus::NoMatchedMessage
                } else {
                    PullStatus::Found(matching)
                }
            }
            r::PULL_NOT_FOUND => PullStatus::NoNewMessage,
            r::PULL_RETRY_IMMEDIATELY => PullStatus::NoMatchedMessage,
            _ => PullStatus::OffsetIllegal,
        };
        Ok(PullResult {
            status,
            next_begin_offset,
            min_offset,
            max_offset,
        })
    }

    /// The group's committed offset, or None when it never committed on this queue.
    pub async fn query_consumer_offset(
        &self,
        group: &str,
        queue: &MessageQueue,
    ) -> Result<Option<QueueOffset>> {
        let addr = self.broker_addr(&queue.broker_name)?;
        let [topic, queue_id] = queue_fields(queue);
        let ext = ext_fields([("consumerGroup", group.to_owned()), topic, queue_id]);
        let request = RemotingCommand::request(code::request::QUERY_CONSUMER_OFFSET, ext);
        let response = self.invoke(&addr, request).await?;
        if response.code == code::response::QUERY_NOT_FOUND {
            return Ok(None);
        }
        let response = expect_success(&addr, code::request::QUERY_CONSUMER_OFFSET, response)?;
        match response.ext("offset").and_then(|v| v.parse::<i64>().ok()) {
            Some(offset) if offset >= 0 => Ok(Some(QueueOffset(offset as u64))),
            _ => Ok(None),
        }
    }

    /// Commits a group's offset; oneway when `wait` is false (the 5 s persister).
    pub async fn update_consumer_offset(
        &self,
        group: &str,
        queue: &MessageQueue,
        offset: QueueOffset,
        wait: bool,
    ) -> Result<()> {
        let addr = self.broker_addr(&queue.broker_name)?;
        let [topic, queue_id] = queue_fields(queue);
        let ext = ext_fields([
            ("consumerGroup", group.to_owned()),
            topic,
            queue_id,
            ("commitOffset", offset.0.to_string()),
        ]);
        let request = RemotingCommand::request(code::request::UPDATE_CONSUMER_OFFSET, ext);
        if wait {
            let response = self.invoke(&addr, request).await?;
            expect_success(&addr, code::request::UPDATE_CONSUMER_OFFSET, response)?;
            Ok(())
        } else {
            self.invoke_oneway(&addr, request).await
        }
    }

    async fn offset_request(
        &self,
        request_code: i32,
        queue: &MessageQueue,
        extra: Option<(&'static str, String)>,
    ) -> Result<QueueOffset> {
        let addr = self.broker_addr(&queue.broker_name)?;
        let [topic, queue_id] = queue_fields(queue);
        let mut ext = ext_fields([topic, queue_id]);
        if let Some((key, value)) = extra {
            ext.insert(key.to_owned(), value);
        }
        let response = self
            .invoke(&addr, RemotingCommand::request(request_code, ext))
            .await?;
        let response = expect_success(&addr, request_code, response)?;
        Ok(parse_offset(&response, "offset"))
    }

    pub async fn max_offset(&self, queue: &MessageQueue) -> Result<QueueOffset> {
        self.offset_request(code::request::GET_MAX_OFFSET, queue, None)
            .await
    }

    pub async fn min_offset(&self, queue: &MessageQueue) -> Result<QueueOffset> {
        self.offset_request(code::request::GET_MIN_OFFSET, queue, None)
            .await
    }

    /// First offset whose store time is at or after `timestamp_ms` (max offset if none).
    pub async fn search_offset(
        &self,
        queue: &MessageQueue,
        timestamp_ms: i64,
    ) -> Result<QueueOffset> {
        self.offset_request(
            code::request::SEARCH_OFFSET_BY_TIMESTAMP,
            queue,
            Some(("timestamp", timestamp_ms.to_string())),
        )
        .await
    }

    /// CONSUMER_SEND_MSG_BACK: the broker re-stores the message in %RETRY%group (or the DLQ).
    pub async fn send_back(
        &self,
        group: &str,
        message: &ReceivedMessage,
        target: SendBackTarget,
        max_reconsume_times: i32,
    ) -> Result<()> {
        // RocketMQ's convention: delay level 0 lets the broker pick, a negative one means DLQ.
        let delay_level = match target {
            SendBackTarget::Retry { delay_level } => delay_level.map_or(0, |level| level as i64),
            SendBackTarget::DeadLetter => -1,
        };
        let addr = self.broker_addr(&message.queue.broker_name)?;
        let ext = ext_fields([
            ("offset", message.commit_log_offset.0.to_string()),
            ("group", group.to_owned()),
            ("delayLevel", delay_level.to_string()),
            ("originMsgId", message.msg_id()),
            ("originTopic", message.topic.clone()),
            ("unitMode", "false".to_owned()),
            ("maxReconsumeTimes", max_reconsume_times.to_string()),
        ]);
        let request = RemotingCommand::request(code::request::CONSUMER_SEND_MSG_BACK, ext);
        let response = self.invoke(&addr, request).await?;
        expect_success(&addr, code::request::CONSUMER_SEND_MSG_BACK, response)?;
        Ok(())
    }

    /// The live members of a group, as the broker knows them from heartbeats.
    pub async fn consumer_ids(&self, addr: &str, group: &str) -> Result<Vec<String>> {
        let request = RemotingCommand::request(
            code::request::GET_CONSUMER_LIST_BY_GROUP,
            ext_fields([("consumerGroup", group.to_owned())]),
        );
        let response = self.invoke(addr, request).await?;
        let response = expect_success(addr, code::request::GET_CONSUMER_LIST_BY_GROUP, response)?;
        let body =
            quiver_protocol::body::GetConsumerListByGroupResponseBody::decode(&response.body)
                .map_err(|source| ClientError::Body {
                    addr: addr.to_owned(),
                    request_code: code::request::GET_CONSUMER_LIST_BY_GROUP,
                    source,
                })?;
        Ok(body.consumer_id_list)
    }

    /// LOCK_BATCH_MQ: returns the queues this client now holds the lock of.
    pub async fn lock_queues(
        &self,
        addr: &str,
        group: &str,
        queues: &[MessageQueue],
    ) -> Result<Vec<MessageQueue>> {
        use quiver_protocol::body::{LockBatchRequestBody, LockBatchResponseBody};
        let body = LockBatchRequestBody {
            consumer_group: group.to_owned(),
            client_id: self.client_id.clone(),
            mq_set: queues.to_vec(),
            ..Default::default()
        };
        let request = RemotingCommand::request(code::request::LOCK_BATCH_MQ, HashMap::new())
            .with_body(body.encode());
        let response = self.invoke(addr, request).await?;
        let response = expect_success(addr, code::request::LOCK_BATCH_MQ, response)?;
        let locked =
            LockBatchResponseBody::decode(&response.body).map_err(|source| ClientError::Body {
                addr: addr.to_owned(),
                request_code: code::request::LOCK_BATCH_MQ,
                source,
            })?;
        Ok(locked.lock_ok_mq_set)
    }

    pub async fn unlock_queues(
        &self,
        addr: &str,
        group: &str,
        queues: &[MessageQueue],
    ) -> Result<()> {
        use quiver_protocol::body::LockBatchRequestBody;
        let body = LockBatchRequestBody {
            consumer_group: group.to_owned(),
            client_id: self.client_id.clone(),
            mq_set: queues.to_vec(),
            ..Default::default()
        };
        let request = RemotingCommand::request(code::request::UNLOCK_BATCH_MQ, HashMap::new())
            .with_body(body.encode());
        let response = self.invoke(addr, request).await?;
        if response.code != code::response::SUCCESS {
            return Err(response_error(
                addr,
                code::request::UNLOCK_BATCH_MQ,
                &response,
            ));
        }
        Ok(())
    }
}

/// Splits a pull body into messages, keeping each record's size for flow control.
fn decode_messages(
    addr: &str,
    queue: &MessageQueue,
    mut body: &[u8],
) -> Result<Vec<ReceivedMessage>> {
    let mut messages = Vec::new();
    while !body.is_empty() {
        let (record, used) =
            quiver_store::record::decode(body).map_err(|source| ClientError::Records {
                addr: addr.to_owned(),
                topic: queue.topic.clone(),
                queue_id: queue.queue_id,
                source,
            })?;
        messages.push(ReceivedMessage::from_record(
            record,
            queue.clone(),
            used as u64,
        ));
        body = &body[used..];
    }
    Ok(messages)
}
