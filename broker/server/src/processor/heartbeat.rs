//! HEART_BEAT (34), UNREGISTER_CLIENT (35), GET_CONSUMER_LIST_BY_GROUP (38),
//! LOCK_BATCH_MQ (41), UNLOCK_BATCH_MQ (42).

use quiver_protocol::code::response;
use quiver_protocol::RemotingCommand;
use serde_json::{json, Value};

use super::{json_body, success, success_json, Ctx, Fields, Outcome, Refusal};
use crate::consumers::{ConsumerClient, Registration, Subscription};
use crate::locks::LockKey;
use crate::topics::RETRY_PREFIX;

/// Enum fields arrive as names or as Java ordinals: normalise to the name.
fn enum_name(value: Option<&Value>, names: &[&str], default: &str) -> String {
    match value {
        Some(Value::String(name)) => name.clone(),
        Some(Value::Number(n)) => n
            .as_u64()
            .and_then(|i| names.get(i as usize))
            .map_or_else(|| default.to_string(), |name| (*name).to_string()),
        _ => default.to_string(),
    }
}

const CONSUME_TYPES: [&str; 2] = ["CONSUME_ACTIVELY", "CONSUME_PASSIVELY"];
const MESSAGE_MODELS: [&str; 2] = ["BROADCASTING", "CLUSTERING"];
const CONSUME_FROM: [&str; 6] = [
    "CONSUME_FROM_LAST_OFFSET",
    "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
    "CONSUME_FROM_MIN_OFFSET",
    "CONSUME_FROM_MAX_OFFSET",
    "CONSUME_FROM_FIRST_OFFSET",
    "CONSUME_FROM_TIMESTAMP",
];

pub fn heartbeat(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let body = json_body(req)?;
    let client_id = body
        .get("clientID")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::new(response::SYSTEM_ERROR, "heartbeat body has no clientID"))?
        .to_string();
    let consumers = body
        .get("consumerDataSet")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let now = crate::now_ms();
    for consumer in consumers {
        let Some(group) = consumer.get("groupName").and_then(Value::as_str) else {
            continue;
        };
        let group_config = broker.groups.get_or_create(group);
        // Push consumers subscribe to %RETRY%<group>: it must exist before they pull it.
        let retry_topic = format!("{RETRY_PREFIX}{group}");
        broker
            .topics
            .get_or_create(&retry_topic, group_config.retry_queue_nums.max(1));
        let subscriptions = consumer
            .get("subscriptionDataSet")
            .and_then(Value::as_array)
            .map(|set| set.iter().filter_map(parse_subscription).collect())
            .unwrap_or_default();
        let changed = broker.consumers.register(Registration {
            group: group.to_string(),
            client: ConsumerClient {
                client_id: client_id.clone(),
                language: req.language.clone(),
                version: req.version,
                connection: ctx.connection.clone(),
                last_heartbeat_ms: now,
            },
            subscriptions,
            consume_type: enum_name(
                consumer.get("consumeType"),
                &CONSUME_TYPES,
                "CONSUME_PASSIVELY",
            ),
            message_model: enum_name(consumer.get("messageModel"), &MESSAGE_MODELS, "CLUSTERING"),
            consume_from_where: enum_name(
                consumer.get("consumeFromWhere"),
                &CONSUME_FROM,
                "CONSUME_FROM_LAST_OFFSET",
            ),
        });
        if changed {
            tracing::info!(group, client_id, remote = %ctx.connection.remote, "consumer joined");
            if group_config.notify_consumer_ids_changed_enable {
                broker.consumers.notify_ids_changed(group);
            }
        }
    }
    Ok(success(req, &[]))
}

fn parse_subscription(value: &Value) -> Option<Subscription> {
    let topic = value.get("topic")?.as_str()?.to_string();
    let expression = value
        .get("subString")
        .and_then(Value::as_str)
        .unwrap_or("*")
        .to_string();
    let tags_codes = value
        .get("codeSet")
        .and_then(Value::as_array)
        .map(|codes| codes.iter().filter_map(Value::as_i64).collect())
        .unwrap_or_default();
    Some(Subscription {
        topic,
        expression,
        tags_codes,
        sub_version: value.get("subVersion").and_then(Value::as_i64).unwrap_or(0),
    })
}

pub fn unregister(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let client_id = f.str("clientID")?;
    if let Some(group) = f.opt_str("consumerGroup") {
        if ctx.broker.consumers.unregister(group, client_id) {
            tracing::info!(group, client_id, "consumer left");
            ctx.broker.consumers.notify_ids_changed(group);
        }
    }
    Ok(success(req, &[]))
}

pub fn consumer_list(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let group = Fields(req).str("consumerGroup")?.to_string();
    let ids = ctx.broker.consumers.client_ids(&group);
    if ids.is_empty() {
        return Err(Refusal::new(
            response::SYSTEM_ERROR,
            format!("no consumer of group {group} is online"),
        ));
    }
    Ok(success_json(req, &json!({ "consumerIdList": ids })))
}

fn lock_request(req: &RemotingCommand) -> Result<(String, Vec<LockKey>), Refusal> {
    let body = json_body(req)?;
    let group = body
        .get("consumerGroup")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::new(response::SYSTEM_ERROR, "lock body has no consumerGroup"))?
        .to_string();
    let client_id = body
        .get("clientId")
        .and_then(Value::as_str)
        .ok_or_else(|| Refusal::new(response::SYSTEM_ERROR, "lock body has no clientId"))?
        .to_string();
    let queues = body
        .get("mqSet")
        .and_then(Value::as_array)
        .map(|set| {
            set.iter()
                .filter_map(|mq| {
                    Some((
                        group.clone(),
                        mq.get("topic")?.as_str()?.to_string(),
                        mq.get("brokerName")?.as_str()?.to_string(),
                        u32::try_from(mq.get("queueId")?.as_u64()?).ok()?,
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok((client_id, queues))
}

pub fn lock_batch(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let (client_id, queues) = lock_request(req)?;
    let granted = ctx.broker.locks.lock(&client_id, queues, crate::now_ms());
    let set: Vec<Value> = granted
        .into_iter()
        .map(|(_, topic, broker_name, queue_id)| {
            json!({ "topic": topic, "brokerName": broker_name, "queueId": queue_id })
        })
        .collect();
    Ok(success_json(req, &json!({ "lockOKMQSet": set })))
}

pub fn unlock_batch(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let (client_id, queues) = lock_request(req)?;
    ctx.broker.locks.unlock(&client_id, &queues);
    Ok(success(req, &[]))
}
