//! Single broker requests shared by the consumers and the admin: pull, offsets, send-back,
//! member lists and queue locks.

use std::time::Duration;

use quiver_protocol::header::{
    self as h, CommandHeader, ConsumerSendMsgBackRequestHeader,
    GetConsumerListByGroupRequestHeader, PullMessageRequestHeader, PullMessageResponseHeader,
    QueryConsumerOffsetRequestHeader, QueryConsumerOffsetResponseHeader,
    UpdateConsumerOffsetRequestHeader,
};
use quiver_protocol::offset::QueueOffset;
use quiver_protocol::{code, ExtFields, RemotingCommand};

use crate::client::ClientCore;
use crate::error::{ClientError, Result};
use crate::message::ReceivedMessage;
use crate::remoting::{expect_codes, expect_success, response_error};
use crate::subscription::Subscription;
use crate::MessageQueue;

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
    /// A replicated group's epoch when the broker answered: sent back with the next pull
    /// of the queue ([`PullSpec::epoch`]).
    pub epoch: Option<u64>,
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
    /// The epoch of the queue's previous pull ([`PullResult::epoch`]): a replicated group
    /// moves a reader past where that epoch's data ends back to there (no skip after a
    /// failover cut a tail).
    pub epoch: Option<u64>,
}

/// Reads a typed response header, naming the broker and request when it is malformed.
pub(crate) fn response_header<H: CommandHeader>(
    addr: &str,
    request_code: i32,
    response: &RemotingCommand,
) -> Result<H> {
    H::from_ext(&response.ext_fields).map_err(|source| ClientError::Header {
        addr: addr.to_owned(),
        request_code,
        source,
    })
}

/// Offsets travel as i64; a negative one means "none" and reads as 0.
fn to_offset(value: i64) -> QueueOffset {
    QueueOffset(u64::try_from(value).unwrap_or(0))
}

fn wire_offset(offset: QueueOffset) -> i64 {
    i64::try_from(offset.0).unwrap_or(i64::MAX)
}

fn queue_id(queue: &MessageQueue) -> i32 {
    i32::try_from(queue.queue_id).unwrap_or(i32::MAX)
}

impl ClientCore {
    pub async fn pull(&self, spec: &PullSpec<'_>) -> Result<PullResult> {
        let addr = self.broker_addr(&spec.queue.broker_name)?;
        self.pull_from(&addr, spec).await
    }

    /// Pulls from the broker at `addr`, whatever the route says serves the queue.
    pub async fn pull_from(&self, addr: &str, spec: &PullSpec<'_>) -> Result<PullResult> {
        let addr = addr.to_owned();
        let mut sys_flag = h::PULL_FLAG_SUBSCRIPTION;
        if spec.commit_offset.is_some() {
            sys_flag |= h::PULL_FLAG_COMMIT_OFFSET;
        }
        if spec.suspend.is_some() {
            sys_flag |= h::PULL_FLAG_SUSPEND;
        }
        let header = PullMessageRequestHeader {
            consumer_group: spec.group.to_owned(),
            topic: spec.queue.topic.clone(),
            queue_id: queue_id(spec.queue),
            queue_offset: wire_offset(spec.offset),
            max_msg_nums: i32::try_from(spec.max_messages).unwrap_or(i32::MAX),
            sys_flag,
            commit_offset: spec.commit_offset.map_or(-1, wire_offset),
            suspend_timeout_millis: spec
                .suspend
                .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
            subscription: Some(spec.subscription.expression().to_owned()),
            sub_version: spec.subscription.version(),
            expression_type: Some(spec.subscription.expression_type().to_owned()),
            quiver_epoch: spec.epoch,
        };
        let ext = header.to_ext();
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
        let header: PullMessageResponseHeader =
            response_header(&addr, code::request::PULL_MESSAGE, &response)?;
        let next_begin_offset = to_offset(header.next_begin_offset);
        let min_offset = to_offset(header.min_offset);
        let max_offset = to_offset(header.max_offset);
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
            epoch: header.quiver_epoch,
        })
    }

    /// The group's committed offset, or None when it never committed on this queue.
    pub async fn query_consumer_offset(
        &self,
        group: &str,
        queue: &MessageQueue,
    ) -> Result<Option<QueueOffset>> {
        let addr = self.broker_addr(&queue.broker_name)?;
        let header = QueryConsumerOffsetRequestHeader {
            consumer_group: group.to_owned(),
            topic: queue.topic.clone(),
            queue_id: queue_id(queue),
            // A new group's start is ours to compute (consume-from-where), not the broker's 0.
            set_zero_if_not_found: Some(false),
        };
        let request =
            RemotingCommand::request(code::request::QUERY_CONSUMER_OFFSET, header.to_ext());
        let response = self.invoke(&addr, request).await?;
        if response.code == code::response::QUERY_NOT_FOUND {
            return Ok(None);
        }
        let response = expect_success(&addr, code::request::QUERY_CONSUMER_OFFSET, response)?;
        let header: QueryConsumerOffsetResponseHeader =
            response_header(&addr, code::request::QUERY_CONSUMER_OFFSET, &response)?;
        Ok(u64::try_from(header.offset).ok().map(QueueOffset))
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
        let header = UpdateConsumerOffsetRequestHeader {
            consumer_group: group.to_owned(),
            topic: queue.topic.clone(),
            queue_id: queue_id(queue),
            commit_offset: wire_offset(offset),
        };
        let request =
            RemotingCommand::request(code::request::UPDATE_CONSUMER_OFFSET, header.to_ext());
        if wait {
            let response = self.invoke(&addr, request).await?;
            expect_success(&addr, code::request::UPDATE_CONSUMER_OFFSET, response)?;
            Ok(())
        } else {
            self.invoke_oneway(&addr, request).await
        }
    }

    pub async fn max_offset(&self, queue: &MessageQueue) -> Result<QueueOffset> {
        let header = h::GetMaxOffsetRequestHeader {
            topic: queue.topic.clone(),
            queue_id: queue_id(queue),
        };
        let answer: h::GetMaxOffsetResponseHeader = self
            .offset_request(code::request::GET_MAX_OFFSET, queue, header.to_ext())
            .await?;
        Ok(to_offset(answer.offset))
    }

    pub async fn min_offset(&self, queue: &MessageQueue) -> Result<QueueOffset> {
        let header = h::GetMinOffsetRequestHeader {
            topic: queue.topic.clone(),
            queue_id: queue_id(queue),
        };
        let answer: h::GetMinOffsetResponseHeader = self
            .offset_request(code::request::GET_MIN_OFFSET, queue, header.to_ext())
            .await?;
        Ok(to_offset(answer.offset))
    }

    /// First offset whose store time is at or after `timestamp_ms` (max offset if none).
    pub async fn search_offset(
        &self,
        queue: &MessageQueue,
        timestamp_ms: i64,
    ) -> Result<QueueOffset> {
        let header = h::SearchOffsetRequestHeader {
            topic: queue.topic.clone(),
            queue_id: queue_id(queue),
            timestamp: timestamp_ms,
        };
        let answer: h::SearchOffsetResponseHeader = self
            .offset_request(
                code::request::SEARCH_OFFSET_BY_TIMESTAMP,
                queue,
                header.to_ext(),
            )
            .await?;
        Ok(to_offset(answer.offset))
    }

    async fn offset_request<H: CommandHeader>(
        &self,
        request_code: i32,
        queue: &MessageQueue,
        ext: ExtFields,
    ) -> Result<H> {
        let addr = self.broker_addr(&queue.broker_name)?;
        let response = self
            .invoke(&addr, RemotingCommand::request(request_code, ext))
            .await?;
        let response = expect_success(&addr, request_code, response)?;
        response_header(&addr, request_code, &response)
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
            SendBackTarget::Retry { delay_level } => {
                delay_level.map_or(0, |level| i32::try_from(level).unwrap_or(i32::MAX))
            }
            SendBackTarget::DeadLetter => -1,
        };
        let addr = self.broker_addr(&message.queue.broker_name)?;
        let header = ConsumerSendMsgBackRequestHeader {
            offset: i64::try_from(message.commit_log_offset.0).unwrap_or(i64::MAX),
            group: group.to_owned(),
            delay_level,
            origin_msg_id: Some(message.msg_id()),
            origin_topic: Some(message.topic.clone()),
            unit_mode: Some(false),
            max_reconsume_times: Some(max_reconsume_times),
        };
        let request =
            RemotingCommand::request(code::request::CONSUMER_SEND_MSG_BACK, header.to_ext());
        let response = self.invoke(&addr, request).await?;
        expect_success(&addr, code::request::CONSUMER_SEND_MSG_BACK, response)?;
        Ok(())
    }

    /// The live members of a group, as the broker knows them from heartbeats.
    pub async fn consumer_ids(&self, addr: &str, group: &str) -> Result<Vec<String>> {
        let header = GetConsumerListByGroupRequestHeader {
            consumer_group: group.to_owned(),
        };
        let request =
            RemotingCommand::request(code::request::GET_CONSUMER_LIST_BY_GROUP, header.to_ext());
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
        let request = RemotingCommand::request(code::request::LOCK_BATCH_MQ, ExtFields::default())
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
        let request =
            RemotingCommand::request(code::request::UNLOCK_BATCH_MQ, ExtFields::default())
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
            quiver_protocol::record::decode(body).map_err(|source| ClientError::Records {
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
