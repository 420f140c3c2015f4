//! Administration: topics, subscription groups and the broker permission, changed in memory
//! and persisted (off the async workers) before the change is acknowledged.

use std::sync::Arc;

use quiver_protocol::body::{SubscriptionGroupConfig, TopicConfig};

use super::{blocking, ServiceError};
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::state_log::StateRecord;

/// Creates or replaces a topic's config and persists the topics.
pub async fn upsert_topic(broker: &Arc<Broker>, config: TopicConfig) -> Result<(), ServiceError> {
    broker.topics().upsert(config);
    blocking(broker, |broker| broker.topics().persist()).await
}

/// Removes a topic and its stored messages, then persists the topics.
pub async fn delete_topic(broker: &Arc<Broker>, topic: &str) -> Result<(), ServiceError> {
    broker.topics().remove(topic);
    let deleted = topic.to_owned();
    blocking(broker, move |broker| {
        broker
            .store()
            .delete_topic(&deleted)
            .map_err(BrokerError::store("delete topic"))?;
        broker.topics().persist()
    })
    .await
}

/// Creates or replaces a subscription group and persists the groups.
pub async fn upsert_group(
    broker: &Arc<Broker>,
    config: SubscriptionGroupConfig,
) -> Result<(), ServiceError> {
    broker.groups().upsert(config);
    blocking(broker, |broker| broker.groups().persist()).await
}

/// Removes a subscription group (and its committed offsets when `drop_offsets`) through the
/// state log, so every member of a group removes it too, then persists the groups. A
/// replica refuses it, naming the master.
pub async fn delete_group(
    broker: &Arc<Broker>,
    group: &str,
    drop_offsets: bool,
) -> Result<(), ServiceError> {
    let record = StateRecord::DeleteGroup {
        group: group.to_owned(),
        drop_offsets,
    };
    crate::state_log::write(broker, &record).await?;
    blocking(broker, |broker| broker.groups().persist()).await
}

/// Sets the broker permission (each in turn: the last one stays) and persists it: a drained
/// broker stays drained across restarts until told otherwise.
pub async fn set_permissions(broker: &Arc<Broker>, updates: &[i32]) -> Result<(), ServiceError> {
    for &permission in updates {
        tracing::info!(permission, "brokerPermission changed");
        broker.set_permission(permission);
    }
    blocking(broker, |broker| broker.persist_runtime()).await
}
