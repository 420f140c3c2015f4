//! The push consumer's answers to admin requests the broker relays to it:
//! GET_CONSUMER_RUNNING_INFO (307) with Apache's `ConsumerRunningInfo`, and
//! CONSUME_MESSAGE_DIRECTLY (309): the listener consumes the message once, nothing is committed
//! or sent back, and the answer is Apache's `ConsumeMessageDirectlyResult`.

use quiver_protocol::body::{running_info_prop as prop, ConsumerRunningInfo, ProcessQueueInfo};
use quiver_protocol::{code, RemotingCommand};

use super::{ConsumeMode, ConsumeOutcome, Inner};
use crate::message::ReceivedMessage;
use crate::remoting::InboundRequest;
use crate::subscription::Subscription;
use crate::MessageQueue;

/// Answers a relayed admin request; false when `request` is not one of them.
pub(super) async fn answer(inner: &Inner, request: &InboundRequest) -> bool {
    let command = &request.command;
    let response = match command.code {
        code::request::GET_CONSUMER_RUNNING_INFO => command
            .response_to(code::response::SUCCESS, None)
            .with_body(running_info(inner).encode()),
        code::request::CONSUME_MESSAGE_DIRECTLY => consume_directly(inner, command).await,
        _ => return false,
    };
    if let Err(error) = inner.core.remoting.reply(&request.addr, response).await {
        tracing::debug!(%error, "reply to a relayed admin request failed");
    }
    true
}

fn running_info(inner: &Inner) -> ConsumerRunningInfo {
    let config = &inner.config;
    let orderly = config.mode == ConsumeMode::Orderly;
    let properties = [
        (prop::CONSUME_TYPE, "CONSUME_PASSIVELY".to_owned()),
        (prop::CONSUME_ORDERLY, orderly.to_string()),
        (
            prop::THREADPOOL_CORE_SIZE,
            config.consume_concurrency.to_string(),
        ),
        (
            prop::NAMESERVER_ADDR,
            inner.core.config.name_servers.join(";"),
        ),
        (
            prop::CLIENT_VERSION,
            concat!("quiver-client ", env!("CARGO_PKG_VERSION")).to_owned(),
        ),
    ];
    let subscription_set = inner
        .subscriptions
        .iter()
        .map(Subscription::to_wire)
        .collect();
    let assignments: Vec<_> = inner.assignments.lock().values().cloned().collect();
    let mq_table = assignments
        .into_iter()
        .map(|state| {
            let committed = inner.offsets.read(&state.queue);
            let held = state.process_queue.lock();
            let range = held.offset_range();
            let info = ProcessQueueInfo {
                commit_offset: committed.map_or(-1, |o| o.0 as i64),
                cached_msg_min_offset: range.map_or(0, |(low, _)| low.0 as i64),
                cached_msg_max_offset: range.map_or(0, |(_, high)| high.0 as i64),
                cached_msg_count: held.message_count() as i32,
                cached_msg_size_in_mi_b: (held.bytes_in_flight() / (1024 * 1024)) as i32,
                locked: state.holds_lock(),
                droped: held.is_dropped(),
            };
            (state.queue.clone(), info)
        })
        .collect();
    ConsumerRunningInfo {
        properties: properties
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect(),
        subscription_set,
        mq_table,
        jstack: None,
    }
}

/// Runs the listener on the relayed message (the stored record) and reports how it went.
async fn consume_directly(inner: &Inner, command: &RemotingCommand) -> RemotingCommand {
    let record = match quiver_protocol::record::decode(&command.body) {
        Ok((record, size)) => (record, size),
        Err(error) => {
            let remark = format!("the relayed message does not decode: {error}");
            return command.response_to(code::response::SYSTEM_ERROR, Some(remark));
        }
    };
    let (record, size) = record;
    let broker_name = command.ext("brokerName").unwrap_or_default().to_owned();
    let queue = MessageQueue::new(record.topic.clone(), broker_name, record.queue_id);
    let message = ReceivedMessage::from_record(record, queue, size as u64);
    let listener = inner.listener.clone();
    let started = std::time::Instant::now();
    let outcome =
        tokio::task::spawn_blocking(move || listener(std::slice::from_ref(&message))).await;
    let (result, remark) = match outcome {
        Ok(ConsumeOutcome::Success) => ("CR_SUCCESS", None),
        Ok(ConsumeOutcome::Retry) => ("CR_LATER", None),
        Err(error) => ("CR_THROW_EXCEPTION", Some(error.to_string())),
    };
    let body = serde_json::json!({
        "order": inner.config.mode == ConsumeMode::Orderly,
        "autoCommit": true,
        "consumeResult": result,
        "remark": remark,
        "spentTimeMills": started.elapsed().as_millis() as u64,
    });
    command
        .response_to(code::response::SUCCESS, None)
        .with_body(body.to_string().into())
}
