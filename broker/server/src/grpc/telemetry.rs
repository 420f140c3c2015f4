//! Telemetry: each 5.x client keeps one bidirectional stream open. It sends its settings
//! first; the broker answers them with what the server decides (a group's FIFO flag and
//! retry policy, the body limit), and later pushes commands over it: transaction check-backs
//! (`RecoverOrphanedTransactionCommand`) go to a producer that publishes to the topic. The
//! open sessions are kept in `crate::grpc_state` (`Sessions`).

use std::sync::Arc;
use std::time::Duration;

use quiver_grpc_proto::v2::{
    self, retry_policy, settings, CustomizedBackoff, ExponentialBackoff, RetryPolicy,
    TelemetryCommand,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::auth::Caller;
use super::call::Opened;
use super::convert::duration;
use crate::broker::Broker;
use crate::grpc_state::Outbound;

/// Commands queued per stream before a push is dropped (the client reads slowly or not).
const OUTBOUND_QUEUE: usize = 64;
/// What a push consumer asks for at once, and waits for at most (Apache Proxy's defaults).
const RECEIVE_BATCH_SIZE: i32 = 32;
const LONG_POLLING_TIMEOUT: Duration = Duration::from_secs(30);
/// Producers retry a failed send after 10 ms, doubling up to 1 s (Apache Proxy's policy).
const PRODUCER_BACKOFF_INITIAL: Duration = Duration::from_millis(10);
const PRODUCER_BACKOFF_MAX: Duration = Duration::from_secs(1);
const PRODUCER_BACKOFF_MULTIPLIER: f32 = 2.0;

/// Opens a client's Telemetry stream: the commands the broker sends it, while
/// [`serve_stream`] reads what the client sends.
pub(crate) fn open(
    broker: &Arc<Broker>,
    caller: Caller,
    inbound: tonic::Streaming<TelemetryCommand>,
    stop: watch::Receiver<bool>,
) -> Opened {
    if caller.client_id.is_empty() {
        return Opened::Invalid(tonic::Status::invalid_argument(
            "a Telemetry stream needs the x-mq-client-id header",
        ));
    }
    let (outbound, commands) = mpsc::channel(OUTBOUND_QUEUE);
    tokio::spawn(serve_stream(
        broker.clone(),
        caller.client_id,
        inbound,
        caller.remote,
        outbound,
        stop,
    ));
    Opened::Stream(Box::pin(ReceiverStream::new(commands)))
}

/// Serves one client's stream: registers it, answers each Settings, and forgets it when the
/// client's side ends.
async fn serve_stream(
    broker: Arc<Broker>,
    client_id: String,
    mut inbound: tonic::Streaming<TelemetryCommand>,
    remote: std::net::SocketAddr,
    outbound: Outbound,
    mut stop: watch::Receiver<bool>,
) {
    let generation = broker
        .grpc()
        .sessions
        .open(&client_id, remote, outbound.clone());
    loop {
        let next = tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => break,
            next = inbound.message() => next,
        };
        let command = match next {
            Ok(Some(command)) => command,
            Ok(None) => break,
            Err(status) => {
                tracing::debug!(client = %client_id, %status, "telemetry stream ended");
                break;
            }
        };
        match command.command {
            Some(v2::telemetry_command::Command::Settings(settings)) => {
                broker.grpc().sessions.apply_settings(&client_id, &settings);
                let answer = TelemetryCommand {
                    status: Some(super::status::ok()),
                    command: Some(v2::telemetry_command::Command::Settings(answer_settings(
                        &broker, settings,
                    ))),
                };
                if outbound.send(Ok(answer)).await.is_err() {
                    break;
                }
            }
            // Stack traces and verify results answer commands this broker never sends.
            Some(other) => {
                tracing::debug!(client = %client_id, command = ?std::mem::discriminant(&other), "telemetry command ignored")
            }
            None => {}
        }
    }
    broker.grpc().sessions.close(&client_id, generation);
}

/// The client's settings with what the server decides filled in.
pub(crate) fn answer_settings(broker: &Broker, mut settings: v2::Settings) -> v2::Settings {
    match &mut settings.pub_sub {
        Some(settings::PubSub::Publishing(publishing)) => {
            publishing.max_body_size =
                i32::try_from(broker.config().max_message_size).unwrap_or(i32::MAX);
            let max_attempts = settings
                .backoff_policy
                .as_ref()
                .map_or(3, |policy| policy.max_attempts);
            settings.backoff_policy = Some(producer_backoff(max_attempts));
        }
        Some(settings::PubSub::Subscription(subscription)) => {
            let group = subscription
                .group
                .as_ref()
                .map(|g| g.name.clone())
                .unwrap_or_default();
            let config = broker.groups().get_or_create(&group);
            subscription.fifo = Some(config.consume_message_orderly);
            subscription.receive_batch_size = Some(RECEIVE_BATCH_SIZE);
            subscription.long_polling_timeout = Some(duration(LONG_POLLING_TIMEOUT));
            settings.backoff_policy = Some(consumer_backoff(config.retry_max_times));
        }
        None => {}
    }
    settings
}

fn producer_backoff(max_attempts: i32) -> RetryPolicy {
    RetryPolicy {
        max_attempts: max_attempts.max(1),
        strategy: Some(retry_policy::Strategy::ExponentialBackoff(
            ExponentialBackoff {
                initial: Some(duration(PRODUCER_BACKOFF_INITIAL)),
                max: Some(duration(PRODUCER_BACKOFF_MAX)),
                multiplier: PRODUCER_BACKOFF_MULTIPLIER,
            },
        )),
    }
}

/// A group redelivers up to `retry_max_times` times after the first delivery, waiting the
/// delay levels (1s 5s 10s 30s 1m ... 2h) between them, as 4.x retries do.
fn consumer_backoff(retry_max_times: i32) -> RetryPolicy {
    let next = crate::schedule::DELAY_LEVELS_MS
        .iter()
        .map(|ms| duration(Duration::from_millis(u64::try_from(*ms).unwrap_or(0))))
        .collect();
    RetryPolicy {
        max_attempts: retry_max_times.saturating_add(1).max(1),
        strategy: Some(retry_policy::Strategy::CustomizedBackoff(
            CustomizedBackoff { next },
        )),
    }
}
