//! Producer manager: each producer group's online clients, from heartbeats' producerDataSet,
//! forgotten on UNREGISTER_CLIENT, a closed connection or expiry. GET_PRODUCER_CONNECTION_LIST
//! (204) lists them; a transaction state check will ask one of a group's connections.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;

use crate::consumers::ConnectionHandle;

/// One online client of a producer group.
#[derive(Clone, Debug)]
pub struct ProducerClient {
    pub client_id: String,
    pub language: String,
    pub version: i32,
    pub connection: ConnectionHandle,
    pub last_heartbeat_ms: i64,
}

/// Every producer group's online clients, by client id.
#[derive(Default)]
pub struct ProducerManager {
    groups: Mutex<HashMap<String, BTreeMap<String, ProducerClient>>>,
}

impl ProducerManager {
    /// Registers or refreshes a client of `group`; true when it is new to the group.
    pub fn register(&self, group: &str, client: ProducerClient) -> bool {
        let mut groups = self.groups.lock();
        let clients = groups.entry(group.to_owned()).or_default();
        clients.insert(client.client_id.clone(), client).is_none()
    }

    /// Removes a client from a group; true when it was there.
    pub fn unregister(&self, group: &str, client_id: &str) -> bool {
        let mut groups = self.groups.lock();
        let Some(clients) = groups.get_mut(group) else {
            return false;
        };
        let removed = clients.remove(client_id).is_some();
        if clients.is_empty() {
            groups.remove(group);
        }
        removed
    }

    /// Removes every client of a closed connection.
    pub fn connection_closed(&self, connection_id: u64) {
        self.remove_where(|client| client.connection.id == connection_id);
    }

    /// Removes clients without a heartbeat since `now_ms - expiry_ms`.
    pub fn expire(&self, now_ms: i64, expiry_ms: u64) {
        let expiry_ms = i64::try_from(expiry_ms).unwrap_or(i64::MAX);
        self.remove_where(|client| now_ms.saturating_sub(client.last_heartbeat_ms) > expiry_ms);
    }

    fn remove_where(&self, mut predicate: impl FnMut(&ProducerClient) -> bool) {
        let mut groups = self.groups.lock();
        for clients in groups.values_mut() {
            clients.retain(|_, client| !predicate(client));
        }
        groups.retain(|_, clients| !clients.is_empty());
    }

    /// The online clients of `group`, by client id.
    pub fn clients(&self, group: &str) -> Vec<ProducerClient> {
        self.groups
            .lock()
            .get(group)
            .map(|clients| clients.values().cloned().collect())
            .unwrap_or_default()
    }

    /// A client of any group by its client id (the requester a reply goes back to).
    pub fn find(&self, client_id: &str) -> Option<ProducerClient> {
        let groups = self.groups.lock();
        groups
            .values()
            .find_map(|clients| clients.get(client_id).cloned())
    }

    /// Every producer group with an online client, sorted.
    pub fn groups(&self) -> Vec<String> {
        let mut groups: Vec<String> = self.groups.lock().keys().cloned().collect();
        groups.sort();
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_remoting::Connection;

    fn client(id: &str, connection_id: u64, heartbeat_ms: i64) -> ProducerClient {
        let (remoting, _rx) = Connection::detached("127.0.0.1:1", 8);
        ProducerClient {
            client_id: id.into(),
            language: "JAVA".into(),
            version: 401,
            connection: ConnectionHandle {
                id: connection_id,
                remote: "127.0.0.1:1".parse().unwrap(),
                remoting,
            },
            last_heartbeat_ms: heartbeat_ms,
        }
    }

    fn ids(manager: &ProducerManager, group: &str) -> Vec<String> {
        manager
            .clients(group)
            .into_iter()
            .map(|client| client.client_id)
            .collect()
    }

    #[test]
    fn groups_follow_heartbeats_unregisters_and_closed_connections() {
        let manager = ProducerManager::default();
        assert!(manager.register("P", client("a", 1, 0)));
        assert!(!manager.register("P", client("a", 1, 5)), "a refresh");
        assert!(manager.register("P", client("b", 2, 0)));
        assert!(manager.register("Q", client("a", 1, 0)));
        assert_eq!(ids(&manager, "P"), ["a", "b"]);
        assert_eq!(manager.groups(), ["P", "Q"]);
        assert_eq!(manager.find("b").map(|c| c.connection.id), Some(2));
        assert!(manager.find("z").is_none());
        assert!(manager.unregister("P", "b"));
        assert!(!manager.unregister("P", "b"));
        manager.connection_closed(1);
        assert!(manager.groups().is_empty());
    }

    #[test]
    fn silent_producers_expire() {
        let manager = ProducerManager::default();
        manager.register("P", client("a", 1, 1_000));
        manager.expire(100_000, 120_000);
        assert_eq!(ids(&manager, "P"), ["a"]);
        manager.expire(122_001, 120_000);
        assert!(ids(&manager, "P").is_empty());
    }
}
