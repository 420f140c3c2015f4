//! What each request code needs: an admin account, and PUB or SUB on the topics and groups
//! its header or body names, as Apache's `PlainAccessResource.parse` maps them.

use quiver_protocol::body::{HeartbeatData, LockBatchRequestBody};
use quiver_protocol::code::request;
use quiver_protocol::RemotingCommand;

use super::accounts::{Perm, Resource};

/// Codes that change the broker's state or reach into other clients: an admin account only.
/// Apache's admin codes (17, 25, 200, 207, 215) and every other changing code Quiver knows.
const ADMIN_CODES: &[i32] = &[
    request::UPDATE_AND_CREATE_TOPIC,
    request::UPDATE_BROKER_CONFIG,
    request::TRIGGER_DELETE_FILES,
    request::PUT_KV_CONFIG,
    request::DELETE_KV_CONFIG,
    request::REGISTER_BROKER,
    request::UNREGISTER_BROKER,
    request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    request::WIPE_WRITE_PERM_OF_BROKER,
    request::DELETE_SUBSCRIPTIONGROUP,
    request::SUSPEND_CONSUMER,
    request::RESUME_CONSUMER,
    request::RESET_CONSUMER_OFFSET_IN_CONSUMER,
    request::RESET_CONSUMER_OFFSET_IN_BROKER,
    request::ADJUST_CONSUMER_THREAD_POOL,
    request::DELETE_TOPIC_IN_BROKER,
    request::DELETE_TOPIC_IN_NAMESRV,
    request::INVOKE_BROKER_TO_RESET_OFFSET,
    request::CLEAN_EXPIRED_CONSUMEQUEUE,
    request::CONSUME_MESSAGE_DIRECTLY,
    request::CLONE_GROUP_OFFSET,
    request::CLEAN_UNUSED_TOPIC,
    request::UPDATE_NAMESRV_CONFIG,
    // A group's members sign these with --peer-access-key, which must be an admin account.
    request::QUIVER_REPLICA_FETCH,
    request::QUIVER_CONSENSUS,
    request::QUIVER_SWITCHOVER,
    request::QUIVER_REPLICATION_MEMBERS,
];

/// Name-server lookups, answered without a signature as Apache's name server (which has no
/// ACL) answers them: a client with a wrong secret then learns it from the broker's refusal
/// of its first send or pull, with the remark, instead of failing to find a route.
pub fn is_open_lookup(code: i32) -> bool {
    matches!(
        code,
        request::GET_ROUTEINFO_BY_TOPIC | request::GET_BROKER_CLUSTER_INFO
    )
}

/// Whether `code` needs an admin account.
pub fn needs_admin(code: i32) -> bool {
    ADMIN_CODES.contains(&code)
}

/// Calls `check` with each (resource, permission) `req` needs, stopping at its first error.
/// A header field or body that is missing or unreadable names nothing here: the processor
/// refuses such a request on its own.
pub fn each_need<E>(
    req: &RemotingCommand,
    mut check: impl FnMut(Resource<'_>, Perm) -> Result<(), E>,
) -> Result<(), E> {
    let field = |key: &str| req.ext(key).filter(|name| !name.is_empty());
    let topic = |key: &str| field(key).map(Resource::topic);
    let group = |key: &str| field(key).map(Resource::group);
    let mut need = |resource: Option<Resource<'_>>, perm: Perm| match resource {
        Some(resource) => check(resource, perm),
        None => Ok(()),
    };
    match req.code {
        // Replies (324, 325) go to the requester, never stored: as Apache, a signature only.
        request::SEND_MESSAGE => {
            let (resource, perm) = sending_to(field("topic"));
            need(resource, perm)
        }
        request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            let (resource, perm) = sending_to(field("b"));
            need(resource, perm)
        }
        // Apache asks PUB on the original topic; a consumer only reads it, so SUB here.
        request::CONSUMER_SEND_MSG_BACK => {
            need(group("group"), Perm::SUB)?;
            need(topic("originTopic"), Perm::SUB)
        }
        request::PULL_MESSAGE
        | request::QUERY_CONSUMER_OFFSET
        | request::UPDATE_CONSUMER_OFFSET => {
            need(topic("topic"), Perm::SUB)?;
            need(group("consumerGroup"), Perm::SUB)
        }
        request::QUERY_MESSAGE
        | request::GET_MAX_OFFSET
        | request::GET_MIN_OFFSET
        | request::SEARCH_OFFSET_BY_TIMESTAMP
        | request::GET_EARLIEST_MSG_STORETIME => need(topic("topic"), Perm::SUB),
        request::UNREGISTER_CLIENT | request::GET_CONSUMER_LIST_BY_GROUP => {
            need(group("consumerGroup"), Perm::SUB)
        }
        request::HEART_BEAT => heartbeat_needs(req, check),
        request::LOCK_BATCH_MQ | request::UNLOCK_BATCH_MQ => {
            match LockBatchRequestBody::decode(&req.body) {
                Ok(body) if !body.consumer_group.is_empty() => {
                    check(Resource::group(&body.consumer_group), Perm::SUB)
                }
                _ => Ok(()),
            }
        }
        _ => Ok(()),
    }
}

/// A send needs PUB on its topic; one to `%RETRY%<group>` (a consumer's retry) needs SUB on
/// the group, as in Apache.
pub(super) fn sending_to(topic: Option<&str>) -> (Option<Resource<'_>>, Perm) {
    match topic.map(Resource::topic) {
        Some(group @ Resource::Group(_)) => (Some(group), Perm::SUB),
        resource => (resource, Perm::PUB),
    }
}

/// Each consumer group of the heartbeat, and each topic it subscribes to: SUB.
fn heartbeat_needs<E>(
    req: &RemotingCommand,
    mut check: impl FnMut(Resource<'_>, Perm) -> Result<(), E>,
) -> Result<(), E> {
    let Ok(heartbeat) = HeartbeatData::decode(&req.body) else {
        return Ok(());
    };
    for consumer in &heartbeat.consumer_data_set {
        check(Resource::group(&consumer.group_name), Perm::SUB)?;
        for subscription in &consumer.subscription_data_set {
            check(Resource::topic(&subscription.topic), Perm::SUB)?;
        }
    }
    Ok(())
}
