//! Telemetry: each 5.x client keeps one bidirectional stream open. It sends its settings
//! first; the broker answers them with what the server decides (a group's FIFO flag and
//! retry policy, the body limit), and later pushes commands over it: transaction check-backs
//! (`RecoverOrphanedTransactionCommand`) go to a producer that publishes to the topic.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use quiver_grpc_proto::v2::{
    self, retry_policy, settings, ClientType, CustomizedBackoff, ExponentialBackoff, RetryPolicy,
    TelemetryCommand,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;

use super::auth::Caller;
use super::call::Opened;
use super::convert::duration;
use crate::broker::Broker;

/// Commands queued per stream before a push is dropped (the client reads slowly or not).
const OUTBOUND_QUEUE: usize = 64;
/// What a push consumer asks for at once, and waits for at most (Apache Proxy's defaults).
const RECEIVE_BATCH_SIZE: i32 = 32;
const LONG_POLLING_TIMEOUT: Duration = Duration::from_secs(30);
/// Producers retry a failed send after 10 ms, doubling up to 1 s (Apache Proxy's policy).
const PRODUCER_BACKOFF_INITIAL: Duration = Duration::from_millis(10);
const PRODUCER_BACKOFF_MAX: Duration = Duration::from_secs(1);
const PRODUCER_BACKOFF_MULTIPLIER: f32 = 2.0;

pub(crate) type Outbound = mpsc::Sender<Result<TelemetryCommand, tonic::Status>>;

/// One client's open Telemetry stream.
struct Session {
    /// Tells a reopened stream of the same client from the one it replaced.
    generation: u64,
    remote: std::net::SocketAddr,
    client_type: ClientType,
    /// The consumer group its settings name (consumers only).
    group: Option<String>,
    /// Its SDK's language, as its settings' user agent says ("JAVA", "PYTHON", ...).
    language: String,
    /// Topics the client publishes to: from its settings and its sends.
    topics: BTreeSet<String>,
    outbound: Outbound,
}

/// The clients' Telemetry streams, by client id.
#[derive(Default)]
pub struct Sessions {
    by_client: Mutex<HashMap<String, Session>>,
    generations: AtomicU64,
}

impl Sessions {
    /// Registers a new stream of `client_id` (replacing an older one); returns its generation.
    pub(crate) fn open(
        &self,
        client_id: &str,
        remote: std::net::SocketAddr,
        outbound: Outbound,
    ) -> u64 {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let session = Session {
            generation,
            remote,
            client_type: ClientType::Unspecified,
            group: None,
            language: String::new(),
            topics: BTreeSet::new(),
            outbound,
        };
        self.by_client.lock().insert(client_id.to_owned(), session);
        generation
    }

    /// Forgets the stream of `client_id` if it is still generation `generation`.
    pub(crate) fn close(&self, client_id: &str, generation: u64) {
        let mut sessions = self.by_client.lock();
        if sessions
            .get(client_id)
            .is_some_and(|s| s.generation == generation)
        {
            sessions.remove(client_id);
        }
    }

    /// Forgets a client that said it terminated.
    pub(crate) fn terminate(&self, client_id: &str) {
        self.by_client.lock().remove(client_id);
    }

    /// Ends every stream (the broker stops): the clients reconnect elsewhere or later.
    pub fn close_all(&self) {
        self.by_client.lock().clear();
    }

    /// Whether `client_id` has a stream open.
    pub(crate) fn contains(&self, client_id: &str) -> bool {
        self.by_client.lock().contains_key(client_id)
    }

    /// Open streams.
    pub fn len(&self) -> usize {
        self.by_client.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn apply_settings(&self, client_id: &str, settings: &v2::Settings) {
        let mut sessions = self.by_client.lock();
        let Some(session) = sessions.get_mut(client_id) else {
            return;
        };
        session.client_type = settings.client_type();
        if let Some(agent) = &settings.user_agent {
            session.language = agent.language().as_str_name().to_owned();
        }
        match &settings.pub_sub {
            Some(settings::PubSub::Publishing(publishing)) => session
                .topics
                .extend(publishing.topics.iter().map(|topic| topic.name.clone())),
            Some(settings::PubSub::Subscription(subscription)) => {
                session.group = subscription.group.as_ref().map(|g| g.name.clone());
            }
            None => {}
        }
    }

    /// The connected 5.x consumers of `group`, as GET_CONSUMER_CONNECTION_LIST lists members.
    pub fn consumers_of(&self, group: &str) -> Vec<quiver_protocol::body::Connection> {
        self.by_client
            .lock()
            .iter()
            .filter(|(_, session)| session.group.as_deref() == Some(group))
            .map(|(client_id, session)| quiver_protocol::body::Connection {
                client_id: client_id.clone(),
                client_addr: session.remote.to_string(),
                language: session.language.clone(),
                version: 0,
            })
            .collect()
    }

    /// Remembers that `client_id` sent to `topic` (a check-back for it may go there).
    pub(crate) fn note_published(&self, client_id: &str, topic: &str) {
        if let Some(session) = self.by_client.lock().get_mut(client_id) {
            if !session.topics.contains(topic) {
                session.topics.insert(topic.to_owned());
            }
        }
    }

    /// Queues `command` on the stream of a producer that publishes to `topic`; false when
    /// none is open or its queue is full.
    pub(crate) fn push_to_producer_of(&self, topic: &str, command: TelemetryCommand) -> bool {
        let sessions = self.by_client.lock();
        let producer = sessions.values().find(|session| {
            session.client_type == ClientType::Producer
                && session.topics.contains(topic)
                && !session.outbound.is_closed()
        });
        producer.is_some_and(|session| session.outbound.try_send(Ok(command)).is_ok())
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn outbound() -> (
        Outbound,
        mpsc::Receiver<Result<TelemetryCommand, tonic::Status>>,
    ) {
        mpsc::channel(4)
    }

    fn producer_settings(topic: &str) -> v2::Settings {
        v2::Settings {
            client_type: Some(ClientType::Producer as i32),
            pub_sub: Some(settings::PubSub::Publishing(v2::Publishing {
                topics: vec![v2::Resource {
                    resource_namespace: String::new(),
                    name: topic.into(),
                }],
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn pushes_go_to_a_producer_of_the_topic_only() {
        let sessions = Sessions::default();
        let (tx, mut rx) = outbound();
        let generation = sessions.open("c1", "127.0.0.1:1".parse().unwrap(), tx);
        assert!(
            !sessions.push_to_producer_of("T", TelemetryCommand::default()),
            "no settings yet"
        );
        sessions.apply_settings("c1", &producer_settings("T"));
        assert!(!sessions.push_to_producer_of("U", TelemetryCommand::default()));
        assert!(sessions.push_to_producer_of("T", TelemetryCommand::default()));
        assert!(rx.try_recv().is_ok());
        sessions.note_published("c1", "U");
        assert!(sessions.push_to_producer_of("U", TelemetryCommand::default()));
        sessions.close("c1", generation + 1);
        assert_eq!(sessions.len(), 1, "a newer generation's close leaves it");
        sessions.close("c1", generation);
        assert!(sessions.is_empty());
    }
}
