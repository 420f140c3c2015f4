//! ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue
//! over the broker's POP service: a received message stays invisible to its group for the
//! requested time and is acked on its own; its receipt handle names it.

use std::sync::Arc;
use std::time::Duration;

use quiver_grpc_proto::v2::{self, Code, FilterType};
use tokio::sync::watch;

use super::auth::Caller;
use super::convert::{outgoing, std_duration, timestamp, Delivery};
use super::renew::Received;
use super::{ok, status};
use crate::broker::{blocking, Broker};
use crate::config::FlushMode;
use crate::filter::ConsumerFilter;
use crate::pop::{PopError, Popped, ReceiveRequest, MAX_MESSAGES_PER_RECEIVE};

/// What a receive's messages stay invisible for when the request names no time (push
/// consumers that ask the server to renew).
const DEFAULT_INVISIBLE: Duration = Duration::from_secs(60);
/// The invisible times a request may ask for.
const MIN_INVISIBLE: Duration = Duration::from_secs(1);
const MAX_INVISIBLE: Duration = Duration::from_secs(12 * 3600);
/// How long a receive waits for messages when the request does not say.
const DEFAULT_LONG_POLL: Duration = Duration::from_secs(20);
/// A long poll ends at this share of the time the client's deadline leaves, so the answer
/// reaches the client before it gives up on the call.
const DEADLINE_SHARE_PERCENT: u32 = 80;

/// The status of a failed POP call.
fn pop_status(error: &PopError) -> v2::Status {
    let code = match error {
        PopError::InvalidHandle | PopError::HandleExpired => Code::InvalidReceiptHandle,
        PopError::TopicNotFound(_) => Code::TopicNotFound,
        PopError::ConsumeDisabled(_) => Code::Forbidden,
        PopError::Filter(_) => Code::IllegalFilterExpression,
        PopError::Store(_) | PopError::BadRecord { .. } | PopError::Task(_) => {
            Code::InternalServerError
        }
    };
    status(code, crate::error::chain(error))
}

fn checked_invisible(
    requested: Option<&quiver_grpc_proto::prost_types::Duration>,
) -> Result<Duration, v2::Status> {
    let Some(requested) = requested else {
        return Ok(DEFAULT_INVISIBLE);
    };
    let invisible = std_duration(requested);
    if !(MIN_INVISIBLE..=MAX_INVISIBLE).contains(&invisible) {
        return Err(status(
            Code::IllegalInvisibleTime,
            format!(
                "invisible duration {invisible:?} is outside {MIN_INVISIBLE:?}..={MAX_INVISIBLE:?}"
            ),
        ));
    }
    Ok(invisible)
}

/// The long poll a receive may do: what it asks (or the default), at most the share of the
/// client's deadline.
fn long_poll(
    requested: Option<&quiver_grpc_proto::prost_types::Duration>,
    deadline: Option<Duration>,
) -> Duration {
    let wanted = requested.map_or(DEFAULT_LONG_POLL, std_duration);
    match deadline {
        Some(left) => wanted.min(left * DEADLINE_SHARE_PERCENT / 100),
        None => wanted,
    }
}

fn compile_filter(expression: Option<&v2::FilterExpression>) -> Result<ConsumerFilter, v2::Status> {
    let (kind, text) = match expression {
        Some(expression) if expression.r#type() == FilterType::Sql => {
            (Some("SQL92"), expression.expression.as_str())
        }
        Some(expression) if !expression.expression.is_empty() => {
            (Some("TAG"), expression.expression.as_str())
        }
        _ => (Some("TAG"), "*"),
    };
    ConsumerFilter::compile(kind, text)
        .map_err(|error| status(Code::IllegalFilterExpression, error.to_string()))
}

/// The responses of one ReceiveMessage: a status, the messages, then the delivery time.
pub(crate) async fn receive(
    broker: &Arc<Broker>,
    caller: &Caller,
    request: &v2::ReceiveMessageRequest,
    mut stop: watch::Receiver<bool>,
) -> Vec<v2::ReceiveMessageResponse> {
    let refused = |status: v2::Status| {
        vec![v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Status(status)),
        }]
    };
    let group = request.group.as_ref().map_or("", |g| g.name.as_str());
    let topic = request
        .message_queue
        .as_ref()
        .and_then(|queue| queue.topic.as_ref())
        .map_or("", |t| t.name.as_str());
    if group.is_empty() {
        return refused(status(
            Code::IllegalConsumerGroup,
            "the request names no consumer group",
        ));
    }
    let filter = match compile_filter(request.filter_expression.as_ref()) {
        Ok(filter) => filter,
        Err(status) => return refused(status),
    };
    let invisible = match checked_invisible(request.invisible_duration.as_ref()) {
        Ok(invisible) => invisible,
        Err(status) => return refused(status),
    };
    let max_messages = usize::try_from(request.batch_size.max(1))
        .unwrap_or(1)
        .min(MAX_MESSAGES_PER_RECEIVE);
    let receiving = broker.pop.receive(
        broker,
        ReceiveRequest {
            group,
            topic,
            filter: &filter,
            max_messages,
            invisible,
            long_poll: long_poll(request.long_polling_timeout.as_ref(), caller.timeout),
        },
    );
    let popped = tokio::select! {
        popped = receiving => popped,
        // A stopping broker answers at once: nothing was received.
        _ = stop.wait_for(|stopped| *stopped) => Ok(Vec::new()),
    };
    let popped = match popped {
        Ok(popped) => popped,
        Err(error) => return refused(pop_status(&error)),
    };
    if request.auto_renew && !caller.client_id.is_empty() {
        let now_ms = crate::now_ms();
        for message in &popped {
            let received = Received {
                client_id: &caller.client_id,
                group,
                topic,
                handle: &message.receipt_handle,
                invisible_ms: i64::try_from(invisible.as_millis()).unwrap_or(i64::MAX / 4),
                invisible_until_ms: message.invisible_until_ms,
            };
            broker.grpc.renewals.track(received, now_ms);
        }
    }
    let store_host = broker.grpc.advertised.get().cloned().unwrap_or_default();
    answer(&popped, invisible, &store_host)
}

/// A receive's answer: its status, each message, then (when there are messages) the time
/// they were handed out.
fn answer(
    popped: &[Popped],
    invisible: Duration,
    store_host: &str,
) -> Vec<v2::ReceiveMessageResponse> {
    let first = if popped.is_empty() {
        status(Code::MessageNotFound, "no new message")
    } else {
        ok()
    };
    let mut responses = Vec::with_capacity(popped.len() + 2);
    responses.push(v2::ReceiveMessageResponse {
        content: Some(v2::receive_message_response::Content::Status(first)),
    });
    for message in popped {
        let Ok((record, _)) = quiver_protocol::record::decode(&message.record) else {
            tracing::warn!(topic = %message.topic, offset = message.queue_offset, "undecodable record received; skipped");
            continue;
        };
        let delivery = Delivery {
            receipt_handle: message.receipt_handle.clone(),
            delivery_attempt: message.delivery_attempt,
            invisible,
        };
        let mut converted = outgoing(&record, &message.topic, Some(delivery), store_host);
        if let Some(system) = converted.system_properties.as_mut() {
            system.queue_id = i32::try_from(message.queue_id).unwrap_or(i32::MAX);
            system.queue_offset = i64::try_from(message.queue_offset).ok();
        }
        responses.push(v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Message(converted)),
        });
    }
    if !popped.is_empty() {
        responses.push(v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::DeliveryTimestamp(
                timestamp(crate::now_ms()),
            )),
        });
    }
    responses
}

/// Runs POP state work: on this task in async flush mode, on a blocking thread when it
/// fsyncs (sync mode) or stores (`stores`).
async fn pop_work<T: Send + 'static>(
    broker: &Arc<Broker>,
    stores: bool,
    work: impl FnOnce(&Broker) -> Result<T, PopError> + Send + 'static,
) -> Result<T, v2::Status> {
    if !stores && broker.config.flush_mode == FlushMode::Async {
        return work(broker).map_err(|error| pop_status(&error));
    }
    match blocking(broker, work).await {
        Ok(done) => done.map_err(|error| pop_status(&error)),
        Err(error) => Err(status(
            Code::InternalServerError,
            crate::error::chain(&error),
        )),
    }
}

pub(crate) async fn ack(
    broker: &Arc<Broker>,
    request: v2::AckMessageRequest,
) -> v2::AckMessageResponse {
    let group = request.group.map(|g| g.name).unwrap_or_default();
    let topic = request.topic.map(|t| t.name).unwrap_or_default();
    let mut entries = Vec::with_capacity(request.entries.len());
    for entry in request.entries {
        let (group, topic, handle) = (group.clone(), topic.clone(), entry.receipt_handle.clone());
        let acked = pop_work(broker, false, move |broker| {
            let renewals = &broker.grpc.renewals;
            renewals.settle(&handle, |handle| {
                broker.pop.ack(broker, &group, &topic, handle)
            })
        })
        .await;
        entries.push(v2::AckMessageResultEntry {
            message_id: entry.message_id,
            receipt_handle: entry.receipt_handle,
            status: Some(acked.map_or_else(|refused| refused, |()| ok())),
        });
    }
    v2::AckMessageResponse {
        status: Some(overall(entries.iter().filter_map(|e| e.status.as_ref()))),
        entries,
    }
}

/// OK when every entry is; the one failure's status when there is one entry; else
/// MULTIPLE_RESULTS (each entry says its own).
fn overall<'a>(statuses: impl Iterator<Item = &'a v2::Status>) -> v2::Status {
    let statuses: Vec<&v2::Status> = statuses.collect();
    if statuses.iter().all(|s| s.code == Code::Ok as i32) {
        return ok();
    }
    if let [only] = statuses.as_slice() {
        return (*only).clone();
    }
    status(
        Code::MultipleResults,
        "some entries failed; see each entry's status",
    )
}

pub(crate) async fn change_invisible(
    broker: &Arc<Broker>,
    request: v2::ChangeInvisibleDurationRequest,
) -> v2::ChangeInvisibleDurationResponse {
    let refused = |status: v2::Status| v2::ChangeInvisibleDurationResponse {
        status: Some(status),
        receipt_handle: String::new(),
    };
    let invisible = match request.invisible_duration.as_ref() {
        None => return refused(status(Code::IllegalInvisibleTime, "no invisible duration")),
        Some(requested) => match checked_invisible(Some(requested)) {
            Ok(invisible) => invisible,
            Err(status) => return refused(status),
        },
    };
    let group = request.group.map(|g| g.name).unwrap_or_default();
    let topic = request.topic.map(|t| t.name).unwrap_or_default();
    let handle = request.receipt_handle;
    // The client takes over: the message is no longer renewed for it.
    let changed = pop_work(broker, false, move |broker| {
        broker.grpc.renewals.settle(&handle, |handle| {
            broker
                .pop
                .change_invisible(broker, &group, &topic, handle, invisible)
        })
    })
    .await;
    match changed {
        Ok(receipt_handle) => v2::ChangeInvisibleDurationResponse {
            status: Some(ok()),
            receipt_handle,
        },
        Err(status) => refused(status),
    }
}

pub(crate) async fn forward_to_dead_letter(
    broker: &Arc<Broker>,
    request: v2::ForwardMessageToDeadLetterQueueRequest,
) -> v2::ForwardMessageToDeadLetterQueueResponse {
    let group = request.group.map(|g| g.name).unwrap_or_default();
    let topic = request.topic.map(|t| t.name).unwrap_or_default();
    let handle = request.receipt_handle;
    let forwarded = pop_work(broker, true, move |broker| {
        broker.grpc.renewals.settle(&handle, |handle| {
            broker
                .pop
                .forward_to_dead_letter(broker, &group, &topic, handle)
        })
    })
    .await;
    v2::ForwardMessageToDeadLetterQueueResponse {
        status: Some(forwarded.map_or_else(|refused| refused, |()| ok())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seconds(seconds: i64) -> quiver_grpc_proto::prost_types::Duration {
        quiver_grpc_proto::prost_types::Duration { seconds, nanos: 0 }
    }

    #[test]
    fn a_long_poll_ends_before_the_clients_deadline() {
        let ten = Duration::from_secs(10);
        assert_eq!(
            long_poll(Some(&seconds(30)), Some(ten)),
            Duration::from_secs(8)
        );
        assert_eq!(
            long_poll(Some(&seconds(5)), Some(ten)),
            Duration::from_secs(5)
        );
        assert_eq!(long_poll(None, None), DEFAULT_LONG_POLL);
    }

    #[test]
    fn invisible_times_are_bounded() {
        assert_eq!(checked_invisible(None).unwrap(), DEFAULT_INVISIBLE);
        assert_eq!(
            checked_invisible(Some(&seconds(15))).unwrap(),
            Duration::from_secs(15)
        );
        let refused = checked_invisible(Some(&seconds(0))).unwrap_err();
        assert_eq!(refused.code, Code::IllegalInvisibleTime as i32);
        assert!(checked_invisible(Some(&seconds(13 * 3600))).is_err());
    }

    #[test]
    fn filters_compile_from_tag_or_sql_expressions() {
        assert!(compile_filter(None).is_ok());
        let sql = v2::FilterExpression {
            r#type: FilterType::Sql as i32,
            expression: "a >".into(),
        };
        assert_eq!(
            compile_filter(Some(&sql)).unwrap_err().code,
            Code::IllegalFilterExpression as i32
        );
    }
}
