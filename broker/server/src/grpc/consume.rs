//! ReceiveMessage, AckMessage, ChangeInvisibleDuration and ForwardMessageToDeadLetterQueue
//! over the broker's POP service: a received message stays invisible to its group for the
//! requested time and is acked on its own; its receipt handle names it.

use std::sync::Arc;
use std::time::Duration;

use quiver_grpc_proto::v2::{self, Code, FilterType};
use tokio::sync::watch;

use super::auth::Caller;
use super::call::name;
use super::convert::{outgoing, std_duration, timestamp, Delivery};
use super::status::{self, ok, status};
use crate::broker::{blocking, Broker};
use crate::config::FlushMode;
use crate::filter::ConsumerFilter;
use crate::grpc_state::Received;
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
) -> Result<Vec<v2::ReceiveMessageResponse>, v2::Status> {
    let group = name(request.group.as_ref());
    let topic = name(
        request
            .message_queue
            .as_ref()
            .and_then(|queue| queue.topic.as_ref()),
    );
    if group.is_empty() {
        return Err(status(
            Code::IllegalConsumerGroup,
            "the request names no consumer group",
        ));
    }
    let filter = compile_filter(request.filter_expression.as_ref())?;
    let invisible = checked_invisible(request.invisible_duration.as_ref())?;
    let max_messages = usize::try_from(request.batch_size.max(1))
        .unwrap_or(1)
        .min(MAX_MESSAGES_PER_RECEIVE);
    let receiving = broker.pop().receive(
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
    let popped = popped.map_err(|error| status::of_pop(&error))?;
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
            broker.grpc().renewals.track(received, now_ms);
        }
    }
    let store_host = broker.grpc().advertised.get().cloned().unwrap_or_default();
    Ok(answer(&popped, invisible, &store_host))
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
    if !stores && broker.config().flush_mode == FlushMode::Async {
        return work(broker).map_err(|error| status::of_pop(&error));
    }
    match blocking(broker, work).await {
        Ok(done) => done.map_err(|error| status::of_pop(&error)),
        Err(error) => Err(status::internal(&error)),
    }
}

/// A received message its client acts on: its group, topic and the handle it received.
struct Held {
    group: String,
    topic: String,
    handle: String,
}

impl Held {
    fn new(group: Option<&v2::Resource>, topic: Option<&v2::Resource>, handle: &str) -> Held {
        Held {
            group: name(group).to_owned(),
            topic: name(topic).to_owned(),
            handle: handle.to_owned(),
        }
    }

    /// Runs `act` (group, topic, handle) on the handle that works for the message now (its
    /// renewed one, if any), as [`pop_work`]: the client takes over, it is renewed no more.
    async fn settle<T: Send + 'static>(
        self,
        broker: &Arc<Broker>,
        stores: bool,
        act: impl FnOnce(&Broker, &str, &str, &str) -> Result<T, PopError> + Send + 'static,
    ) -> Result<T, v2::Status> {
        pop_work(broker, stores, move |broker| {
            let Held {
                group,
                topic,
                handle,
            } = self;
            broker
                .grpc()
                .renewals
                .settle(&handle, |handle| act(broker, &group, &topic, handle))
        })
        .await
    }
}

pub(crate) async fn ack(
    broker: &Arc<Broker>,
    request: v2::AckMessageRequest,
) -> Result<v2::AckMessageResponse, v2::Status> {
    let group = name(request.group.as_ref()).to_owned();
    let topic = name(request.topic.as_ref()).to_owned();
    let handles: Vec<String> = request
        .entries
        .iter()
        .map(|entry| entry.receipt_handle.clone())
        .collect();
    // Every entry in one pass (and one blocking hop in sync mode), each answered on its own.
    let acked = pop_work(broker, false, move |broker| {
        let current = broker.grpc().renewals.settle_all(&handles);
        Ok(broker.pop().ack_all(broker, &group, &topic, &current))
    })
    .await?;
    let entries: Vec<v2::AckMessageResultEntry> = request
        .entries
        .into_iter()
        .zip(acked)
        .map(|(entry, acked)| v2::AckMessageResultEntry {
            message_id: entry.message_id,
            receipt_handle: entry.receipt_handle,
            status: Some(acked.map_or_else(|refused| status::of_pop(&refused), |()| ok())),
        })
        .collect();
    Ok(v2::AckMessageResponse {
        status: Some(overall(entries.iter().filter_map(|e| e.status.as_ref()))),
        entries,
    })
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
) -> Result<v2::ChangeInvisibleDurationResponse, v2::Status> {
    let Some(requested) = request.invisible_duration.as_ref() else {
        return Err(status(Code::IllegalInvisibleTime, "no invisible duration"));
    };
    let invisible = checked_invisible(Some(requested))?;
    let held = Held::new(
        request.group.as_ref(),
        request.topic.as_ref(),
        &request.receipt_handle,
    );
    let receipt_handle = held
        .settle(broker, false, move |broker, group, topic, handle| {
            broker
                .pop()
                .change_invisible(broker, group, topic, handle, invisible)
        })
        .await?;
    Ok(v2::ChangeInvisibleDurationResponse {
        status: Some(ok()),
        receipt_handle,
    })
}

pub(crate) async fn forward_to_dead_letter(
    broker: &Arc<Broker>,
    request: v2::ForwardMessageToDeadLetterQueueRequest,
) -> Result<v2::ForwardMessageToDeadLetterQueueResponse, v2::Status> {
    let held = Held::new(
        request.group.as_ref(),
        request.topic.as_ref(),
        &request.receipt_handle,
    );
    held.settle(broker, true, |broker, group, topic, handle| {
        broker
            .pop()
            .forward_to_dead_letter(broker, group, topic, handle)
    })
    .await?;
    Ok(v2::ForwardMessageToDeadLetterQueueResponse { status: Some(ok()) })
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
