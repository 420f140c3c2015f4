//! Request processors, one file per command family, and the dispatch by request code.

mod admin;
mod heartbeat;
mod offsets;
mod pull;
mod query;
mod relay;
mod replication;
mod reply;
mod retry;
mod route;
mod send;
mod tools;
mod transaction;
mod unsupported;

use std::sync::Arc;

use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;

use crate::broker::Broker;
use crate::consumers::ConnectionHandle;
use crate::error::{chain, BrokerError};

/// What a processor sees: the broker and the connection the request came on.
#[derive(Clone)]
pub struct Ctx {
    pub broker: Arc<Broker>,
    pub connection: ConnectionHandle,
}

/// A request answered with an error code and a remark saying why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("code {code}: {remark}")]
pub struct Refusal {
    pub code: i32,
    pub remark: String,
}

impl Refusal {
    pub fn new(code: i32, remark: impl Into<String>) -> Refusal {
        Refusal {
            code,
            remark: remark.into(),
        }
    }
}

impl From<quiver_protocol::HeaderError> for Refusal {
    fn from(error: quiver_protocol::HeaderError) -> Self {
        Refusal::new(response::SYSTEM_ERROR, error.to_string())
    }
}

impl From<BrokerError> for Refusal {
    fn from(error: BrokerError) -> Self {
        Refusal::new(response::SYSTEM_ERROR, chain(&error))
    }
}

impl From<quiver_store::StoreError> for Refusal {
    fn from(error: quiver_store::StoreError) -> Self {
        match error {
            // Apache's answer to a full disk: producers retry on another broker.
            quiver_store::StoreError::WritesRefused(refusal) => Refusal::new(
                response::SERVICE_NOT_AVAILABLE,
                format!("service not available now: {}", refusal.message),
            ),
            error => Refusal::new(response::SYSTEM_ERROR, chain(&error)),
        }
    }
}

impl From<crate::service::ServiceError> for Refusal {
    /// The remoting port's answer to a service's error.
    fn from(error: crate::service::ServiceError) -> Self {
        use crate::service::ServiceError as E;
        let code = match &error {
            E::Store(_) | E::Broker(_) => response::SYSTEM_ERROR,
            E::Forbidden(_) => response::NO_PERMISSION,
            E::TopicNotFound(_) => response::TOPIC_NOT_EXIST,
            E::IllegalMessage(_) | E::BodyTooLarge(_) => response::MESSAGE_ILLEGAL,
            E::NotFound(_) => response::QUERY_NOT_FOUND,
            E::Busy(_) => response::SYSTEM_BUSY,
            E::BadRequest(_) | E::InvalidTransaction(_) => response::SYSTEM_ERROR,
            // Apache's answers when the slaves do not hold the message: none stored it.
            E::Replication(crate::replication::ConfirmError::TooFewCopies { .. }) => {
                response::SLAVE_NOT_AVAILABLE
            }
            E::Replication(_) => response::FLUSH_SLAVE_TIMEOUT,
        };
        match error {
            E::Store(error) => Refusal::from(error),
            E::Broker(error) => Refusal::from(error),
            error => Refusal::new(code, error.to_string()),
        }
    }
}

/// Apache's answer to a subscription that cannot be served, when the pull carries the
/// expression (or CHECK_CLIENT_CONFIG asks).
pub(crate) fn filter_code(error: &crate::filter::FilterError) -> i32 {
    use crate::filter::FilterError as E;
    match error {
        E::Parse { .. } => response::SUBSCRIPTION_PARSE_FAILED,
        E::Unsupported { .. } => response::SYSTEM_ERROR,
    }
}

pub type Outcome = Result<RemotingCommand, Refusal>;

/// Processes one request; None for oneway requests (they get no answer).
/// Whether `req` is answered without waiting on anything but the CPU: a send or a
/// transaction's end under async flush (an append is a copy into mapped memory). The connection's reader then runs it
/// itself, keeping the request on its thread, instead of spawning a task for it.
pub fn answers_at_once(broker: &Broker, req: &RemotingCommand) -> bool {
    // A sync group's master waits for its replicas: that wait must not hold the reader.
    let waits_for_replicas = broker
        .replication()
        .as_ref()
        .is_some_and(|replication| replication.mode == crate::config::ReplicationMode::Sync);
    broker.config().flush_mode == crate::config::FlushMode::Async
        && !waits_for_replicas
        && matches!(
            req.code,
            request::SEND_MESSAGE
                | request::SEND_MESSAGE_V2
                | request::SEND_BATCH_MESSAGE
                | request::END_TRANSACTION
        )
}

/// `trace` is stamped by the processors that know a stage (a parked pull's wake-up).
pub async fn dispatch(
    ctx: &Ctx,
    req: RemotingCommand,
    trace: &mut crate::stages::Trace,
) -> Option<RemotingCommand> {
    tracing::trace!(code = req.code, opaque = req.opaque, remote = %ctx.connection.remote, "request");
    let outcome = match allowed(ctx, &req) {
        Ok(()) => process(ctx, &req, trace).await?,
        Err(refusal) => Err(refusal),
    };
    let reply = match outcome {
        Ok(reply) => reply,
        Err(refusal) if is_routine(refusal.code) => {
            tracing::debug!(code = req.code, response = refusal.code, remark = %refusal.remark, "request answered with a status");
            req.response_to(refusal.code, Some(refusal.remark))
        }
        Err(refusal) => {
            tracing::warn!(
                code = req.code,
                remote = %ctx.connection.remote,
                response = refusal.code,
                remark = %refusal.remark,
                "request refused"
            );
            req.response_to(refusal.code, Some(refusal.remark))
        }
    };
    (!req.is_oneway()).then_some(reply)
}

/// With ACL on, whether the request's signature and account allow it, before any processor
/// sees it.
fn allowed(ctx: &Ctx, req: &RemotingCommand) -> Result<(), Refusal> {
    match &ctx.broker.acl() {
        Some(acl) if !crate::acl::is_open_lookup(req.code) => acl
            .check(req, ctx.connection.remote.ip())
            .map_err(|denied| Refusal::new(response::NO_PERMISSION, denied.0)),
        _ => Ok(()),
    }
}

/// Runs the processor of the request's code; None when the answer went out another way (a
/// parked pull answered on the thread that dispatched the message it waited for).
async fn process(
    ctx: &Ctx,
    req: &RemotingCommand,
    trace: &mut crate::stages::Trace,
) -> Option<Outcome> {
    Some(match req.code {
        request::SEND_MESSAGE | request::SEND_MESSAGE_V2 | request::SEND_BATCH_MESSAGE => {
            send::handle(ctx, req).await
        }
        request::PULL_MESSAGE => return pull::handle(ctx, req, trace).await.transpose(),
        request::END_TRANSACTION => transaction::end(ctx, req).await,
        request::QUERY_CONSUMER_OFFSET => offsets::query(ctx, req),
        request::UPDATE_CONSUMER_OFFSET => offsets::update(ctx, req).await,
        request::GET_MAX_OFFSET => offsets::max(ctx, req),
        request::GET_MIN_OFFSET => offsets::min(ctx, req),
        request::SEARCH_OFFSET_BY_TIMESTAMP => offsets::search(ctx, req).await,
        request::QUERY_MESSAGE => query::query_message(ctx, req).await,
        request::VIEW_MESSAGE_BY_ID => query::view_message(ctx, req).await,
        request::GET_EARLIEST_MSG_STORETIME => query::earliest_store_time(ctx, req).await,
        request::HEART_BEAT => heartbeat::heartbeat(ctx, req),
        request::UNREGISTER_CLIENT => heartbeat::unregister(ctx, req),
        request::GET_CONSUMER_LIST_BY_GROUP => heartbeat::consumer_list(ctx, req),
        request::LOCK_BATCH_MQ => heartbeat::lock_batch(ctx, req),
        request::UNLOCK_BATCH_MQ => heartbeat::unlock_batch(ctx, req),
        request::CHECK_CLIENT_CONFIG => heartbeat::check_client_config(ctx, req),
        request::CONSUMER_SEND_MSG_BACK => retry::send_back(ctx, req).await,
        request::GET_ROUTEINFO_BY_TOPIC => route::route(ctx, req),
        request::GET_BROKER_CLUSTER_INFO => route::cluster_info(ctx, req),
        request::UPDATE_AND_CREATE_TOPIC => admin::create_topic(ctx, req).await,
        request::GET_ALL_TOPIC_CONFIG => admin::all_topics(ctx, req),
        request::DELETE_TOPIC_IN_BROKER => admin::delete_topic(ctx, req).await,
        request::UPDATE_BROKER_CONFIG => admin::update_broker_config(ctx, req).await,
        request::GET_BROKER_CONFIG => admin::broker_config(ctx, req),
        request::GET_BROKER_RUNTIME_INFO => admin::runtime_info(ctx, req),
        request::UPDATE_AND_CREATE_SUBSCRIPTIONGROUP => admin::create_group(ctx, req).await,
        request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG => admin::all_groups(ctx, req),
        request::DELETE_SUBSCRIPTIONGROUP => admin::delete_group(ctx, req).await,
        request::GET_TOPIC_STATS_INFO => admin::topic_stats(ctx, req).await,
        request::GET_CONSUMER_CONNECTION_LIST => admin::consumer_connections(ctx, req),
        request::GET_CONSUME_STATS => admin::consume_stats(ctx, req).await,
        request::INVOKE_BROKER_TO_RESET_OFFSET => admin::reset_offset(ctx, req).await,
        request::GET_ALL_TOPIC_LIST_FROM_NAMESERVER => tools::all_topic_list(ctx, req),
        request::GET_TOPICS_BY_CLUSTER => tools::topics_by_cluster(ctx, req),
        request::GET_SYSTEM_TOPIC_LIST_FROM_NS => tools::system_topics_from_ns(ctx, req),
        request::GET_SYSTEM_TOPIC_LIST_FROM_BROKER => tools::system_topics_from_broker(ctx, req),
        request::DELETE_TOPIC_IN_NAMESRV => tools::delete_topic_in_namesrv(ctx, req),
        request::QUERY_TOPIC_CONSUME_BY_WHO => tools::topic_consumed_by(ctx, req),
        request::GET_PRODUCER_CONNECTION_LIST => tools::producer_connections(ctx, req),
        request::CLONE_GROUP_OFFSET => tools::clone_group_offset(ctx, req).await,
        request::GET_CONSUMER_RUNNING_INFO => relay::consumer_running_info(ctx, req).await,
        request::CONSUME_MESSAGE_DIRECTLY => relay::consume_message_directly(ctx, req).await,
        request::SEND_REPLY_MESSAGE | request::SEND_REPLY_MESSAGE_V2 => {
            reply::send_reply(ctx, req).await
        }
        request::QUIVER_REPLICA_FETCH => replication::fetch(ctx, req).await,
        request::QUIVER_CONSENSUS => replication::consensus(ctx, req).await,
        request::QUIVER_REPLICATION_STATUS => replication::status(ctx, req),
        request::QUIVER_SWITCHOVER => replication::switchover(ctx, req).await,
        request::QUIVER_REPLICATION_MEMBERS => replication::members(ctx, req).await,
        request::GET_ALL_CONSUMER_OFFSET => replication::all_consumer_offsets(ctx, req),
        other => Err(unsupported::refusal(other)),
    })
}

/// Answers that are part of normal operation, not bad input: not worth a warning.
fn is_routine(code: i32) -> bool {
    matches!(
        code,
        response::QUERY_NOT_FOUND
            | response::TOPIC_NOT_EXIST
            | response::CONSUMER_NOT_ONLINE
            // A full disk refuses every send; the store logs when it starts and ends.
            | response::SERVICE_NOT_AVAILABLE
    )
}

/// A SUCCESS response carrying `ext` header fields.
pub fn success(req: &RemotingCommand, ext: &[(&str, String)]) -> RemotingCommand {
    let mut reply = req.response_to(response::SUCCESS, None);
    for (key, value) in ext {
        reply.ext_fields.insert(*key, value.clone());
    }
    reply
}

/// A header's queueId as the u32 the store uses.
pub fn queue_id(value: i32) -> Result<u32, Refusal> {
    u32::try_from(value).map_err(|_| {
        Refusal::from(quiver_protocol::HeaderError::Invalid {
            field: "queueId",
            value: value.to_string(),
        })
    })
}

/// A header's offset as a typed queue offset.
pub fn queue_offset(field: &'static str, value: i64) -> Result<quiver_store::QueueOffset, Refusal> {
    u64::try_from(value)
        .map(quiver_store::QueueOffset)
        .map_err(|_| {
            Refusal::from(quiver_protocol::HeaderError::Invalid {
                field,
                value: value.to_string(),
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::ConsumerFilter;

    #[test]
    fn filter_errors_answer_apache_codes() {
        let error = ConsumerFilter::compile(Some("SQL92"), "a >").unwrap_err();
        assert_eq!(filter_code(&error), response::SUBSCRIPTION_PARSE_FAILED);
        let error = ConsumerFilter::compile(Some("XPATH"), "//a").unwrap_err();
        assert_eq!(filter_code(&error), response::SYSTEM_ERROR);
    }

    #[test]
    fn a_body_over_the_limit_is_an_illegal_message() {
        let error = crate::service::produce::check_body(5, 4).unwrap_err();
        assert_eq!(Refusal::from(error).code, response::MESSAGE_ILLEGAL);
    }
}
