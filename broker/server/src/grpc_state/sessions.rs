//! The clients' Telemetry sessions: one open stream per 5.x client id, what its settings
//! said (client type, consumer group, language, the topics it publishes to) and the queue
//! the broker pushes commands to it through.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use quiver_grpc_proto::v2::{self, settings, ClientType, TelemetryCommand};
use tokio::sync::mpsc;

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

    pub(crate) fn apply_settings(&self, client_id: &str, settings: &v2::Settings) {
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
