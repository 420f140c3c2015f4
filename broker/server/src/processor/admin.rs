//! Admin codes for the CLI and the operator: topics (17, 21, 215), broker config (25, 26),
//! subscription groups (200, 201, 207), stats (202, 203, 208) and offset reset (222).

use std::collections::HashMap;

use bytes::Bytes;
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;
use quiver_store::QueueOffset;
use serde_json::{json, Value};

use super::{json_body, success, success_json, Ctx, Fields, Outcome, Refusal};
use crate::broker::blocking;
use crate::config::{PERM_READ_ONLY, PERM_READ_WRITE};
use crate::groups::SubscriptionGroupConfig;
use crate::topics::{validate_topic_name, TopicConfig};

/// fastjson's form of a map keyed by MessageQueue: the key is the queue as a JSON object.
pub fn queue_keyed_json(topic: &str, broker_name: &str, entries: &[(u32, Value)]) -> String {
    let pairs: Vec<String> = entries
        .iter()
        .map(|(queue_id, value)| {
            let key = json!({ "brokerName": broker_name, "queueId": queue_id, "topic": topic });
            format!("{key}:{value}")
        })
        .collect();
    format!("{{{}}}", pairs.join(","))
}

fn bad_request(remark: impl Into<String>) -> Refusal {
    Refusal::new(response::SYSTEM_ERROR, remark)
}

pub fn create_topic(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let name = f.str("topic")?;
    validate_topic_name(name).map_err(|e| bad_request(e.to_string()))?;
    let defaults = TopicConfig::new(name, ctx.broker.config.default_queue_nums);
    let read: u32 = f
        .opt_parse("readQueueNums")?
        .unwrap_or(defaults.read_queue_nums);
    let write: u32 = f
        .opt_parse("writeQueueNums")?
        .unwrap_or(defaults.write_queue_nums);
    if !(1..=1024).contains(&read) || !(1..=1024).contains(&write) {
        return Err(bad_request(
            "readQueueNums and writeQueueNums must be in 1..=1024",
        ));
    }
    let config = TopicConfig {
        topic_name: name.to_string(),
        read_queue_nums: read,
        write_queue_nums: write,
        perm: f.opt_parse("perm")?.unwrap_or(PERM_READ_WRITE),
        topic_filter_type: f
            .opt_str("topicFilterType")
            .unwrap_or("SINGLE_TAG")
            .to_string(),
        topic_sys_flag: f.opt_parse("topicSysFlag")?.unwrap_or(0),
        order: f.bool("order"),
    };
    tracing::info!(topic = name, read, write, "topic created or updated");
    ctx.broker.topics.upsert(config);
    ctx.broker.topics.persist()?;
    Ok(success(req, &[]))
}

pub fn all_topics(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let table: serde_json::Map<String, Value> = ctx
        .broker
        .topics
        .all()
        .into_iter()
        .map(|config| {
            let name = config.topic_name.clone();
            (name, serde_json::to_value(config).unwrap_or(Value::Null))
        })
        .collect();
    Ok(success_json(
        req,
        &json!({ "topicConfigTable": table, "dataVersion": { "timestamp": 0, "counter": 0 } }),
    ))
}

pub async fn delete_topic(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let topic = Fields(req).str("topic")?.to_string();
    ctx.broker.topics.remove(&topic);
    let deleted = topic.clone();
    blocking(&ctx.broker, move |broker| {
        broker
            .store
            .delete_topic(&deleted)
            .map_err(crate::error::BrokerError::store("delete topic"))?;
        broker.topics.persist()
    })
    .await??;
    tracing::info!(topic, "topic deleted");
    Ok(success(req, &[]))
}

/// Runtime settings as `key=value` lines (RocketMQ's properties form).
fn config_properties(ctx: &Ctx) -> String {
    let broker = &ctx.broker;
    let c = &broker.config;
    let mut lines = vec![
        format!("brokerName={}", c.broker_name),
        format!("brokerClusterName={}", c.cluster),
        format!("brokerPermission={}", broker.permission()),
        format!("brokerAddr={}", broker.advertised),
        format!("autoCreateTopicEnable={}", c.auto_create_topics),
        format!("defaultTopicQueueNums={}", c.default_queue_nums),
        format!("maxMessageSize={}", c.max_message_size),
        format!(
            "flushDiskType={}",
            match c.flush_mode {
                crate::config::FlushMode::Async => "ASYNC_FLUSH",
                crate::config::FlushMode::Sync => "SYNC_FLUSH",
            }
        ),
        format!("mappedFileSizeCommitLog={}", c.segment_size),
        format!("fileReservedTime={}", c.file_reserved_hours),
        format!("storePathRootDir={}", c.data_dir.display()),
        format!("brokerId=0"),
    ];
    lines.sort();
    lines.join("\n") + "\n"
}

pub fn broker_config(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let mut reply = success(req, &[("version", "0".to_string())]);
    reply.body = Bytes::from(config_properties(ctx));
    Ok(reply)
}

pub fn update_broker_config(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let text = std::str::from_utf8(&req.body)
        .map_err(|e| bad_request(format!("body is not UTF-8: {e}")))?;
    let mut updates = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| bad_request(format!("`{line}` is not key=value")))?;
        match key.trim() {
            "brokerPermission" => {
                let permission: u32 = value.trim().parse().map_err(|_| {
                    bad_request(format!("brokerPermission `{value}` is not a number"))
                })?;
                if !matches!(permission, 2 | PERM_READ_ONLY | PERM_READ_WRITE) {
                    return Err(bad_request("brokerPermission must be 6, 4 or 2"));
                }
                updates.push(permission);
            }
            other => {
                return Err(bad_request(format!(
                    "setting `{other}` cannot be changed at run time (only brokerPermission)"
                )))
            }
        }
    }
    for permission in updates {
        tracing::info!(permission, "brokerPermission changed");
        ctx.broker.set_permission(permission);
    }
    Ok(success(req, &[]))
}

pub fn create_group(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let body = json_body(req)?;
    let config: SubscriptionGroupConfig = serde_json::from_value(body)
        .map_err(|e| bad_request(format!("subscription group body is invalid: {e}")))?;
    if config.group_name.is_empty() {
        return Err(bad_request("subscription group body has no groupName"));
    }
    tracing::info!(group = %config.group_name, "subscription group created or updated");
    ctx.broker.groups.upsert(config);
    ctx.broker.groups.persist()?;
    Ok(success(req, &[]))
}

pub fn all_groups(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    Ok(success_json(req, &ctx.broker.groups.wrapper_json()))
}

pub fn delete_group(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let group = Fields(req).str("groupName")?;
    ctx.broker.groups.remove(group);
    ctx.broker.offsets.delete_group(group);
    ctx.broker.groups.persist()?;
    tracing::info!(group, "subscription group and its offsets deleted");
    Ok(success(req, &[]))
}

fn queue_count(ctx: &Ctx, topic: &str) -> Result<u32, Refusal> {
    ctx.broker
        .topics
        .get(topic)
        .map(|c| c.read_queue_nums.max(c.write_queue_nums))
        .ok_or_else(|| {
            Refusal::new(
                response::TOPIC_NOT_EXIST,
                format!("topic {topic} does not exist"),
            )
        })
}

pub async fn topic_stats(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let topic = Fields(req).str("topic")?.to_string();
    let queues = queue_count(ctx, &topic)?;
    let name = ctx.broker.config.broker_name.clone();
    let body = blocking(&ctx.broker, move |broker| {
        let entries: Vec<(u32, Value)> = (0..queues)
            .map(|q| {
                let min = broker.store.min_offset(&topic, q);
                let max = broker.store.max_offset(&topic, q);
                let last = match max.0 {
                    0 => 0,
                    m => broker
                        .store
                        .store_timestamp(&topic, q, QueueOffset(m - 1))
                        .ok()
                        .flatten()
                        .unwrap_or(0),
                };
                (
                    q,
                    json!({ "minOffset": min.0, "maxOffset": max.0, "lastUpdateTimestamp": last }),
                )
            })
            .collect();
        format!(
            "{{\"offsetTable\":{}}}",
            queue_keyed_json(&topic, &name, &entries)
        )
    })
    .await?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(Bytes::from(body)))
}

pub fn consumer_connections(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let group = Fields(req).str("consumerGroup")?;
    let state = ctx.broker.consumers.group(group).ok_or_else(|| {
        Refusal::new(
            response::CONSUMER_NOT_ONLINE,
            format!("no consumer of group {group} is online"),
        )
    })?;
    let connections: Vec<Value> = state
        .clients
        .values()
        .map(|c| {
            json!({
                "clientId": c.client_id,
                "clientAddr": c.connection.remote.to_string(),
                "language": c.language,
                "version": c.version,
            })
        })
        .collect();
    let subscriptions: serde_json::Map<String, Value> = state
        .subscriptions
        .values()
        .map(|s| {
            (
                s.topic.clone(),
                json!({
                    "topic": s.topic,
                    "subString": s.expression,
                    "codeSet": s.tags_codes,
                    "subVersion": s.sub_version,
                    "expressionType": "TAG",
                }),
            )
        })
        .collect();
    Ok(success_json(
        req,
        &json!({
            "connectionSet": connections,
            "subscriptionTable": subscriptions,
            "consumeType": state.consume_type,
            "messageModel": state.message_model,
            "consumeFromWhere": state.consume_from_where,
        }),
    ))
}

pub async fn consume_stats(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let group = f.str("consumerGroup")?.to_string();
    let topics = match f.opt_str("topic") {
        Some(topic) => vec![topic.to_string()],
        None => ctx.broker.offsets.topics_of(&group),
    };
    let mut counts = Vec::new();
    for topic in topics {
        let queues = queue_count(ctx, &topic)?;
        counts.push((topic, queues));
    }
    let name = ctx.broker.config.broker_name.clone();
    let body = blocking(&ctx.broker, move |broker| {
        let mut parts = Vec::new();
        for (topic, queues) in counts {
            let table = broker.offsets.table(&group, &topic);
            let entries: Vec<(u32, Value)> = (0..queues)
                .map(|q| {
                    let max = broker.store.max_offset(&topic, q);
                    let committed = table.get(&q).copied();
                    let last = match committed {
                        Some(QueueOffset(c)) if c > 0 => broker
                            .store
                            .store_timestamp(&topic, q, QueueOffset(c - 1))
                            .ok()
                            .flatten()
                            .unwrap_or(0),
                        _ => 0,
                    };
                    // -1 marks "nothing committed" (unknown lag), as RocketMQ tools expect.
                    let consumer = committed.map_or(-1, |QueueOffset(c)| i64::try_from(c).unwrap_or(i64::MAX));
                    (q, json!({ "brokerOffset": max.0, "consumerOffset": consumer, "lastTimestamp": last }))
                })
                .collect();
            let object = queue_keyed_json(&topic, &name, &entries);
            parts.push(object[1..object.len() - 1].to_string());
        }
        let joined: Vec<&String> = parts.iter().filter(|p| !p.is_empty()).collect();
        let joined: Vec<&str> = joined.iter().map(|s| s.as_str()).collect();
        format!("{{\"offsetTable\":{{{}}},\"consumeTps\":0.0}}", joined.join(","))
    })
    .await?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(Bytes::from(body)))
}

/// INVOKE_BROKER_TO_RESET_OFFSET: timestamp ms, or 0 for the earliest, -1 for the latest.
pub async fn reset_offset(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let topic = f.str("topic")?.to_string();
    let group = f.str("group")?.to_string();
    let timestamp: i64 = f.parse("timestamp")?;
    let is_force = f.bool("isForce");
    let queues = queue_count(ctx, &topic)?;
    let (search_topic, search_group) = (topic.clone(), group.clone());
    let offsets = blocking(&ctx.broker, move |broker| {
        (0..queues)
            .map(|q| {
                let offset = match timestamp {
                    -1 => Ok(broker.store.max_offset(&search_topic, q)),
                    0 => Ok(broker.store.min_offset(&search_topic, q)),
                    ts => broker
                        .store
                        .search_offset_by_timestamp(&search_topic, q, ts),
                };
                offset.map(|o| (q, o))
            })
            .collect::<Result<Vec<_>, _>>()
            .inspect(|pairs| broker.offsets.reset(&search_group, &search_topic, pairs))
    })
    .await??;
    let name = &ctx.broker.config.broker_name;
    let entries: Vec<(u32, Value)> = offsets.iter().map(|(q, o)| (*q, json!(o.0))).collect();
    let body = Bytes::from(format!(
        "{{\"offsetTable\":{}}}",
        queue_keyed_json(&topic, name, &entries)
    ));
    tracing::info!(group, topic, timestamp, "consumer offsets reset");
    if let Some(state) = ctx.broker.consumers.group(&group) {
        let ext = HashMap::from([
            ("topic".to_string(), topic.clone()),
            ("group".to_string(), group.clone()),
            ("timestamp".to_string(), timestamp.to_string()),
            ("isForce".to_string(), is_force.to_string()),
        ]);
        for client in state.clients.values() {
            let push = RemotingCommand::request(request::RESET_CONSUMER_CLIENT_OFFSET, ext.clone())
                .with_body(body.clone())
                .into_oneway();
            client.connection.push(push);
        }
    }
    Ok(req.response_to(response::SUCCESS, None).with_body(body))
}
