//! The object store: JSON objects keyed by (resource, namespace, name), one global
//! resourceVersion, a bounded change history for watches, and the live watchers.

use super::resources::ResourceType;
use super::selector::Selector;
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use tokio::sync::mpsc::UnboundedSender;

/// Changes kept for watches that resume from an older resourceVersion.
pub const DEFAULT_HISTORY_LIMIT: usize = 10_000;

/// Where an object lives: (resource id, namespace, name); namespace empty when cluster-scoped.
pub type ObjectKey = (String, String, String);

/// The key of `name` in `namespace` of `rt`.
pub fn key(rt: &ResourceType, namespace: &str, name: &str) -> ObjectKey {
    let namespace = if rt.namespaced { namespace } else { "" };
    (rt.id(), namespace.to_string(), name.to_string())
}

/// What happened to an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeType {
    Added,
    Modified,
    Deleted,
}

/// One committed change, as watches replay it.
#[derive(Clone, Debug)]
pub struct Change {
    pub resource_version: u64,
    pub resource: String,
    pub namespace: String,
    pub change: ChangeType,
    pub object: Value,
    /// The object before, to tell watchers whose selector it left or entered.
    pub old: Option<Value>,
}

/// What a watch stream sends next.
#[derive(Debug)]
pub enum WatchFrame {
    Event(&'static str, Value),
    Bookmark(u64),
}

/// A live watch.
pub struct Watcher {
    pub resource: String,
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: Selector,
    pub sender: UnboundedSender<WatchFrame>,
}

impl Watcher {
    fn selects(&self, object: &Value) -> bool {
        self.labels.matches_labels(object) && self.fields.matches_fields(object)
    }

    /// The event this watcher sees for `change`, if any (selector entries and exits included).
    pub fn event_for(&self, change: &Change) -> Option<(&'static str, Value)> {
        if change.resource != self.resource
            || self
                .namespace
                .as_ref()
                .is_some_and(|ns| *ns != change.namespace)
        {
            return None;
        }
        let was = change.old.as_ref().is_some_and(|old| self.selects(old));
        let is = change.change != ChangeType::Deleted && self.selects(&change.object);
        let kind = match (change.change, was, is) {
            (ChangeType::Deleted, true, _) => "DELETED",
            (_, false, true) => "ADDED",
            (_, true, true) => "MODIFIED",
            (_, true, false) => "DELETED",
            _ => return None,
        };
        Some((kind, change.object.clone()))
    }
}

/// All objects and the change log.
pub struct Store {
    pub objects: BTreeMap<ObjectKey, Value>,
    pub resource_version: u64,
    pub history: VecDeque<Change>,
    pub history_limit: usize,
    /// Highest resourceVersion dropped from the history: watches from before it get 410.
    pub compacted: u64,
    pub watchers: Vec<Watcher>,
    next_uid: u64,
}

impl Default for Store {
    fn default() -> Store {
        Store {
            objects: BTreeMap::new(),
            resource_version: 1,
            history: VecDeque::new(),
            history_limit: DEFAULT_HISTORY_LIMIT,
            compacted: 0,
            watchers: Vec::new(),
            next_uid: 1,
        }
    }
}

impl Store {
    /// A fresh uid, shaped like the API server's.
    pub fn new_uid(&mut self) -> String {
        let uid = self.next_uid;
        self.next_uid += 1;
        format!("00000000-0000-4000-8000-{uid:012x}")
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Value> {
        self.objects.get(key)
    }

    /// Objects of `resource` in `namespace` (all namespaces when `None`), in key order.
    pub fn list(&self, resource: &str, namespace: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((id, ns, _), _)| id == resource && namespace.is_none_or(|want| want == ns))
            .map(|(_, object)| object.clone())
            .collect()
    }

    /// Stores `object` (or removes the key when `None`) under a new resourceVersion, records the
    /// change and tells the watchers; returns the object as stored.
    pub fn commit(&mut self, key: &ObjectKey, object: Option<Value>) -> Value {
        self.resource_version += 1;
        let rv = self.resource_version;
        let old = self.objects.get(key).cloned();
        let (change, mut stored) = match object {
            Some(object) => {
                let change = if old.is_some() {
                    ChangeType::Modified
                } else {
                    ChangeType::Added
                };
                (change, object)
            }
            None => (
                ChangeType::Deleted,
                old.clone().expect("deleting a stored object"),
            ),
        };
        stored["metadata"]["resourceVersion"] = Value::String(rv.to_string());
        if change == ChangeType::Deleted {
            self.objects.remove(key);
        } else {
            self.objects.insert(key.clone(), stored.clone());
        }
        let change = Change {
            resource_version: rv,
            resource: key.0.clone(),
            namespace: key.1.clone(),
            change,
            object: stored.clone(),
            old,
        };
        self.notify(&change);
        self.record(change);
        stored
    }

    fn notify(&mut self, change: &Change) {
        self.watchers
            .retain(|watcher| match watcher.event_for(change) {
                Some((kind, object)) => {
                    watcher.sender.send(WatchFrame::Event(kind, object)).is_ok()
                }
                None => !watcher.sender.is_closed(),
            });
    }

    fn record(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > self.history_limit {
            if let Some(dropped) = self.history.pop_front() {
                self.compacted = dropped.resource_version;
            }
        }
    }
}
