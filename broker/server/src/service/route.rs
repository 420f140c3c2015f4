//! Route lookups (GET_ROUTEINFO_BY_TOPIC, QueryRoute): the topic no broker of the cluster
//! holds, created here when auto-creation allows it.

use crate::broker::Broker;
use crate::groups::SubscriptionGroupConfig;
use crate::topics::{validate_topic_name, TopicConfig, RETRY_PREFIX};

use super::ServiceError;

/// Creates `topic` on a lookup that found it nowhere in the cluster, as the quick start's
/// producer and consumer need a route first: when auto-creation is on, the name is valid and
/// `may_create` (the caller may send to it; asked last). A `%RETRY%<group>` topic gets its
/// group's retry queues, any other the default queue count. TopicNotFound otherwise.
pub(crate) fn create_on_lookup(
    broker: &Broker,
    topic: &str,
    may_create: impl FnOnce() -> bool,
) -> Result<TopicConfig, ServiceError> {
    let creatable =
        broker.config().auto_create_topics && validate_topic_name(topic).is_ok() && may_create();
    if !creatable {
        return Err(ServiceError::TopicNotFound(format!(
            "no route for topic {topic}"
        )));
    }
    let queues = match topic.strip_prefix(RETRY_PREFIX) {
        Some(group) => retry_queues(&broker.groups().get_or_create(group)),
        None => broker.config().default_queue_nums,
    };
    let (config, _) = broker.topics().get_or_create(topic, queues);
    tracing::info!(topic, "topic auto-created on route lookup");
    Ok(config)
}

/// Queues of a group's `%RETRY%` topic: its `retryQueueNums`, at least 1.
pub(crate) fn retry_queues(group: &SubscriptionGroupConfig) -> u32 {
    u32::try_from(group.retry_queue_nums).unwrap_or(1).max(1)
}
