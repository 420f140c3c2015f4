//! Consumer manager: online clients per group from heartbeats, expiry, and the
//! NOTIFY_CONSUMER_IDS_CHANGED push when a group's membership changes.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;

use parking_lot::Mutex;
use quiver_protocol::body::{ConsumeFromWhere, ConsumeType, MessageModel, SubscriptionData};
use quiver_protocol::header::NotifyConsumerIdsChangedRequestHeader;
use quiver_protocol::RemotingCommand;
use quiver_remoting::Connection;

use crate::filter::{CompiledFilter, ConsumerFilter, FilterError};

/// One client connection: who it is, and the way to answer and push to it.
#[derive(Clone, Debug)]
pub struct ConnectionHandle {
    pub id: u64,
    pub remote: SocketAddr,
    pub remoting: Connection,
}

impl ConnectionHandle {
    /// Sends without waiting; a full or closed connection drops the push (it is advisory).
    pub fn push(&self, command: RemotingCommand) -> bool {
        self.remoting.try_send(command)
    }
}

/// One online client of a group.
#[derive(Clone, Debug)]
pub struct ConsumerClient {
    pub client_id: String,
    pub language: String,
    pub version: i32,
    pub connection: ConnectionHandle,
    pub last_heartbeat_ms: i64,
}

/// A group's online state.
#[derive(Clone, Debug, Default)]
pub struct GroupState {
    pub clients: BTreeMap<String, ConsumerClient>,
    /// Topic -> the subscription the group's latest heartbeat announced.
    pub subscriptions: BTreeMap<String, SubscriptionData>,
    /// Topic -> that subscription's expression, compiled (or why it cannot be).
    pub filters: BTreeMap<String, RegisteredFilter>,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
}

/// A subscription's expression as registered, and its compiled filter.
#[derive(Clone, Debug)]
pub struct RegisteredFilter {
    pub expression: String,
    pub expression_type: Option<String>,
    pub filter: CompiledFilter,
}

impl RegisteredFilter {
    fn compile(subscription: &SubscriptionData) -> RegisteredFilter {
        let kind = subscription.expression_type.as_deref();
        RegisteredFilter {
            expression: subscription.sub_string.clone(),
            expression_type: subscription.expression_type.clone(),
            filter: ConsumerFilter::compile(kind, &subscription.sub_string).map(Arc::new),
        }
    }

    /// Whether this is the filter of `expression` of `kind`.
    pub fn is_for(&self, kind: Option<&str>, expression: &str) -> bool {
        self.expression == expression && self.expression_type.as_deref() == kind
    }
}

/// What a registration did.
#[derive(Debug, Default)]
pub struct Registered {
    /// The client was not a member of the group before.
    pub joined: bool,
    /// Subscriptions whose expression cannot be served: (topic, why).
    pub refused: Vec<(String, FilterError)>,
}

/// A heartbeat's registration of one client in one group.
pub struct Registration {
    pub group: String,
    pub client: ConsumerClient,
    pub subscriptions: Vec<SubscriptionData>,
    pub consume_type: ConsumeType,
    pub message_model: MessageModel,
    pub consume_from_where: ConsumeFromWhere,
}

/// Every group's online clients.
#[derive(Default)]
pub struct ConsumerManager {
    groups: Mutex<HashMap<String, GroupState>>,
}

impl ConsumerManager {
    /// Registers or refreshes a client and compiles its subscriptions' expressions (again
    /// only when one changed); a subscription that cannot be served is kept with its error.
    pub fn register(&self, registration: Registration) -> Registered {
        let mut groups = self.groups.lock();
        let state = groups.entry(registration.group).or_default();
        state.consume_type = registration.consume_type;
        state.message_model = registration.message_model;
        state.consume_from_where = registration.consume_from_where;
        let mut refused = Vec::new();
        for subscription in registration.subscriptions {
            let kind = subscription.expression_type.as_deref();
            let unchanged = state
                .filters
                .get(&subscription.topic)
                .is_some_and(|known| known.is_for(kind, &subscription.sub_string));
            if !unchanged {
                state.filters.insert(
                    subscription.topic.clone(),
                    RegisteredFilter::compile(&subscription),
                );
            }
            if let Some(Err(error)) = state.filters.get(&subscription.topic).map(|f| &f.filter) {
                refused.push((subscription.topic.clone(), error.clone()));
            }
            state
                .subscriptions
                .insert(subscription.topic.clone(), subscription);
        }
        let client_id = registration.client.client_id.clone();
        let previous = state.clients.insert(client_id, registration.client);
        Registered {
            joined: previous.is_none(),
            refused,
        }
    }

    /// Removes a client from a group; true when it was a member.
    pub fn unregister(&self, group: &str, client_id: &str) -> bool {
        let mut groups = self.groups.lock();
        let Some(state) = groups.get_mut(group) else {
            return false;
        };
        let removed = state.clients.remove(client_id).is_some();
        if state.clients.is_empty() {
            groups.remove(group);
        }
        removed
    }

    /// Removes every client of a closed connection; returns the groups that changed.
    pub fn connection_closed(&self, connection_id: u64) -> Vec<String> {
        self.remove_where(|client| client.connection.id == connection_id)
    }

    /// Removes clients without a heartbeat since `now_ms - expiry_ms`; returns changed groups.
    pub fn expire(&self, now_ms: i64, expiry_ms: u64) -> Vec<String> {
        let expiry_ms = i64::try_from(expiry_ms).unwrap_or(i64::MAX);
        self.remove_where(|client| now_ms.saturating_sub(client.last_heartbeat_ms) > expiry_ms)
    }

    fn remove_where(&self, mut predicate: impl FnMut(&ConsumerClient) -> bool) -> Vec<String> {
        let mut groups = self.groups.lock();
        let mut changed = Vec::new();
        for (group, state) in groups.iter_mut() {
            let before = state.clients.len();
            state.clients.retain(|_, client| !predicate(client));
            if state.clients.len() != before {
                changed.push(group.clone());
            }
        }
        groups.retain(|_, state| !state.clients.is_empty());
        changed
    }

    /// Client ids of a group, sorted (the order clients allocate queues by).
    pub fn client_ids(&self, group: &str) -> Vec<String> {
        self.groups
            .lock()
            .get(group)
            .map(|state| state.clients.keys().cloned().collect())
            .unwrap_or_default()
    }

    pub fn group(&self, group: &str) -> Option<GroupState> {
        self.groups.lock().get(group).cloned()
    }

    pub fn subscription(&self, group: &str, topic: &str) -> Option<SubscriptionData> {
        self.groups
            .lock()
            .get(group)
            .and_then(|state| state.subscriptions.get(topic).cloned())
    }

    /// The compiled filter of the group's subscription to `topic`, if it registered one.
    pub fn filter(&self, group: &str, topic: &str) -> Option<RegisteredFilter> {
        self.groups
            .lock()
            .get(group)
            .and_then(|state| state.filters.get(topic).cloned())
    }

    pub fn online_groups(&self) -> Vec<String> {
        self.groups.lock().keys().cloned().collect()
    }

    /// Pushes NOTIFY_CONSUMER_IDS_CHANGED (40) to every member of `group`, oneway.
    pub fn notify_ids_changed(&self, group: &str) {
        let members: Vec<ConnectionHandle> = match self.groups.lock().get(group) {
            Some(state) => state
                .clients
                .values()
                .map(|client| client.connection.clone())
                .collect(),
            None => return,
        };
        for connection in members {
            let header = NotifyConsumerIdsChangedRequestHeader {
                consumer_group: group.to_string(),
            };
            let request = RemotingCommand::request(
                quiver_protocol::code::request::NOTIFY_CONSUMER_IDS_CHANGED,
                header.to_ext(),
            )
            .into_oneway();
            if !connection.push(request) {
                tracing::debug!(group, remote = %connection.remote, "could not push ids-changed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(
        id: &str,
        connection_id: u64,
        heartbeat_ms: i64,
    ) -> (
        ConsumerClient,
        tokio::sync::mpsc::Receiver<quiver_remoting::Outbound>,
    ) {
        let (remoting, rx) = Connection::detached("127.0.0.1:1", 8);
        let client = ConsumerClient {
            client_id: id.into(),
            language: "CPP".into(),
            version: 0,
            connection: ConnectionHandle {
                id: connection_id,
                remote: "127.0.0.1:1".parse().unwrap(),
                remoting,
            },
            last_heartbeat_ms: heartbeat_ms,
        };
        (client, rx)
    }

    fn register(manager: &ConsumerManager, client: ConsumerClient) -> bool {
        manager
            .register(Registration {
                group: "G".into(),
                client,
                subscriptions: vec![],
                consume_type: ConsumeType::ConsumePassively,
                message_model: MessageModel::Clustering,
                consume_from_where: ConsumeFromWhere::LastOffset,
            })
            .joined
    }

    fn subscription(topic: &str, kind: &str, expression: &str) -> SubscriptionData {
        SubscriptionData {
            topic: topic.into(),
            sub_string: expression.into(),
            expression_type: Some(kind.into()),
            ..SubscriptionData::default()
        }
    }

    #[test]
    fn subscriptions_carry_their_compiled_filters() {
        let manager = ConsumerManager::default();
        let (a, _rx) = client("a", 1, 1_000);
        let registration = |subscriptions| Registration {
            group: "G".into(),
            client: a.clone(),
            subscriptions,
            consume_type: ConsumeType::ConsumePassively,
            message_model: MessageModel::Clustering,
            consume_from_where: ConsumeFromWhere::LastOffset,
        };
        let registered = manager.register(registration(vec![
            subscription("T", "SQL92", "a > 5"),
            subscription("U", "SQL92", "a >"),
            subscription("V", "TAG", "x || y"),
        ]));
        assert!(registered.joined);
        assert_eq!(registered.refused.len(), 1);
        assert_eq!(registered.refused[0].0, "U");
        let sql = manager.filter("G", "T").expect("registered");
        assert!(sql.is_for(Some("SQL92"), "a > 5"));
        assert!(sql.filter.unwrap().selector().is_some());
        assert!(manager.filter("G", "U").unwrap().filter.is_err());
        assert!(matches!(
            *manager.filter("G", "V").unwrap().filter.unwrap(),
            ConsumerFilter::Tags(_)
        ));
        // A later heartbeat with a fixed expression replaces the error.
        let registered = manager.register(registration(vec![subscription("U", "SQL92", "a > 1")]));
        assert!(!registered.joined && registered.refused.is_empty());
        assert!(manager.filter("G", "U").unwrap().filter.is_ok());
    }

    #[test]
    fn membership_changes_and_notifications() {
        let manager = ConsumerManager::default();
        let (a, mut rx_a) = client("a", 1, 1_000);
        let (b, _rx_b) = client("b", 2, 1_000);
        assert!(register(&manager, a.clone()));
        assert!(!register(&manager, a), "a refresh is not a change");
        assert!(register(&manager, b));
        assert_eq!(manager.client_ids("G"), vec!["a", "b"]);
        manager.notify_ids_changed("G");
        let pushed = rx_a.try_recv().expect("a was notified").command;
        assert_eq!(
            pushed.code,
            quiver_protocol::code::request::NOTIFY_CONSUMER_IDS_CHANGED
        );
        assert!(pushed.is_oneway());
        assert_eq!(manager.connection_closed(2), vec!["G".to_string()]);
        assert_eq!(manager.client_ids("G"), vec!["a"]);
    }

    #[test]
    fn silent_clients_expire() {
        let manager = ConsumerManager::default();
        let (a, _rx) = client("a", 1, 1_000);
        register(&manager, a);
        assert!(manager.expire(100_000, 120_000).is_empty());
        assert_eq!(
            manager.expire(121_001 + 1_000, 120_000),
            vec!["G".to_string()]
        );
        assert!(manager.client_ids("G").is_empty());
    }
}
