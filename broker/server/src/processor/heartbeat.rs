//! HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
//! LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42), CHECK_CLIENT_CONFIG (46).

use quiver_protocol::body::{
    CheckClientRequestBody, GetConsumerListByGroupResponseBody, HeartbeatData,
    LockBatchRequestBody, LockBatchResponseBody, MessageQueue,
};
use quiver_protocol::code::response;
use quiver_protocol::header::{GetConsumerListByGroupRequestHeader, UnregisterClientRequestHeader};
use quiver_protocol::RemotingCommand;

use super::{filter_code, success, Ctx, Outcome, Refusal};
use crate::consumers::{ConsumerClient, Registration};
use crate::error::chain;
use crate::filter::{ConsumerFilter, FilterError};
use crate::locks::LockKey;
use crate::producers::ProducerClient;
use crate::service::route::retry_queues;
use crate::topics::RETRY_PREFIX;

fn bad_body(what: &'static str) -> impl FnOnce(quiver_protocol::BodyError) -> Refusal {
    move |error| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!("{what} body is invalid: {}", crate::error::chain(&error)),
        )
    }
}

pub fn heartbeat(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let heartbeat = HeartbeatData::decode(&req.body).map_err(bad_body("heartbeat"))?;
    if heartbeat.client_id.is_empty() {
        return Err(Refusal::new(
            response::SYSTEM_ERROR,
            "heartbeat body has no clientID",
        ));
    }
    let now = crate::now_ms();
    for producer in &heartbeat.producer_data_set {
        register_producer(ctx, req, &heartbeat.client_id, &producer.group_name, now);
    }
    let mut refused = Vec::new();
    for consumer in heartbeat.consumer_data_set {
        let group = consumer.group_name;
        if group.is_empty() {
            continue;
        }
        let group_config = broker.groups().get_or_create(&group);
        // Push consumers subscribe to %RETRY%<group>: it must exist before they pull it.
        let retry_topic = format!("{RETRY_PREFIX}{group}");
        broker
            .topics()
            .get_or_create(&retry_topic, retry_queues(&group_config));
        let registered = broker.consumers().register(Registration {
            group: group.clone(),
            client: ConsumerClient {
                client_id: heartbeat.client_id.clone(),
                language: req.language.clone(),
                version: req.version,
                connection: ctx.connection.clone(),
                last_heartbeat_ms: now,
            },
            subscriptions: consumer.subscription_data_set,
            consume_type: consumer.consume_type,
            message_model: consumer.message_model,
            consume_from_where: consumer.consume_from_where,
        });
        if registered.joined {
            tracing::info!(group, client_id = %heartbeat.client_id, remote = %ctx.connection.remote, "consumer joined");
            if group_config.notify_consumer_ids_changed_enable {
                broker.consumers().notify_ids_changed(&group);
            }
        }
        refused.extend(
            registered
                .refused
                .into_iter()
                .map(|(topic, error)| (group.clone(), topic, error)),
        );
    }
    refuse_subscriptions(&refused)?;
    Ok(success(req, &[]))
}

/// The client stays registered (membership and its other subscriptions work), but a
/// subscription that cannot be served is answered as an error, and so are its pulls.
fn refuse_subscriptions(refused: &[(String, String, FilterError)]) -> Result<(), Refusal> {
    let Some((_, _, first)) = refused.first() else {
        return Ok(());
    };
    let reasons: Vec<String> = refused
        .iter()
        .map(|(group, topic, error)| format!("group {group}, topic {topic}: {}", chain(error)))
        .collect();
    Err(Refusal::new(
        filter_code(first),
        format!(
            "heartbeat registered, but these subscriptions cannot be served and their pulls are \
             refused: {}",
            reasons.join("; ")
        ),
    ))
}

/// CHECK_CLIENT_CONFIG (46): whether a subscription's expression can be served, asked by
/// Java clients before they subscribe with SQL92.
pub fn check_client_config(_ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    if req.body.is_empty() {
        return Ok(success(req, &[]));
    }
    let body = CheckClientRequestBody::decode(&req.body).map_err(bad_body("check client"))?;
    let subscription = &body.subscription_data;
    ConsumerFilter::compile(
        subscription.expression_type.as_deref(),
        &subscription.sub_string,
    )
    .map_err(|error| Refusal::new(filter_code(&error), chain(&error)))?;
    Ok(success(req, &[]))
}

fn register_producer(ctx: &Ctx, req: &RemotingCommand, client_id: &str, group: &str, now: i64) {
    if group.is_empty() {
        return;
    }
    let client = ProducerClient {
        client_id: client_id.to_owned(),
        language: req.language.clone(),
        version: req.version,
        connection: ctx.connection.clone(),
        last_heartbeat_ms: now,
    };
    if ctx.broker.producers().register(group, client) {
        tracing::debug!(group, client_id, remote = %ctx.connection.remote, "producer joined");
    }
}

pub fn unregister(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = UnregisterClientRequestHeader::from_command(req)?;
    if let Some(group) = header.producer_group.as_deref().filter(|g| !g.is_empty()) {
        ctx.broker.producers().unregister(group, &header.client_id);
    }
    if let Some(group) = header.consumer_group.as_deref().filter(|g| !g.is_empty()) {
        if ctx.broker.consumers().unregister(group, &header.client_id) {
            tracing::info!(group, client_id = %header.client_id, "consumer left");
            ctx.broker.consumers().notify_ids_changed(group);
        }
    }
    Ok(success(req, &[]))
}

pub fn consumer_list(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let group = GetConsumerListByGroupRequestHeader::from_command(req)?.consumer_group;
    let ids = ctx.broker.consumers().client_ids(&group);
    if ids.is_empty() {
        return Err(Refusal::new(
            response::SYSTEM_ERROR,
            format!("no consumer of group {group} is online"),
        ));
    }
    let body = GetConsumerListByGroupResponseBody {
        consumer_id_list: ids,
    };
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(body.encode()))
}

fn lock_request(req: &RemotingCommand) -> Result<(String, Vec<LockKey>), Refusal> {
    let body = LockBatchRequestBody::decode(&req.body).map_err(bad_body("lock batch"))?;
    if body.consumer_group.is_empty() || body.client_id.is_empty() {
        return Err(Refusal::new(
            response::SYSTEM_ERROR,
            "lock body needs consumerGroup and clientId",
        ));
    }
    let queues = body
        .mq_set
        .into_iter()
        .map(|mq| {
            (
                body.consumer_group.clone(),
                mq.topic,
                mq.broker_name,
                mq.queue_id,
            )
        })
        .collect();
    Ok((body.client_id, queues))
}

pub fn lock_batch(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let (client_id, queues) = lock_request(req)?;
    let granted = ctx.broker.locks().lock(&client_id, queues, crate::now_ms());
    let body = LockBatchResponseBody {
        lock_ok_mq_set: granted
            .into_iter()
            .map(|(_, topic, broker_name, queue_id)| {
                MessageQueue::new(topic, broker_name, queue_id)
            })
            .collect(),
    };
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(body.encode()))
}

pub fn unlock_batch(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let (client_id, queues) = lock_request(req)?;
    ctx.broker.locks().unlock(&client_id, &queues);
    Ok(success(req, &[]))
}
