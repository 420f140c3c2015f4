//! Admin codes for the CLI and the operator: topics (17, 21, 215), broker config (25, 26),
//! subscription groups (200, 201, 207), stats (202, 203, 208) and offset reset (222).

use bytes::Bytes;
use quiver_protocol::body::perm;
use quiver_protocol::body::{
    Connection, ConsumeStats, ConsumerConnection, MessageQueue, OffsetWrapper, ResetOffsetBody,
    TopicOffset, TopicStatsTable,
};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::{
    CreateTopicRequestHeader, DeleteSubscriptionGroupRequestHeader, DeleteTopicRequestHeader,
    GetConsumeStatsRequestHeader, GetConsumerConnectionListRequestHeader,
    GetTopicStatsInfoRequestHeader, ResetOffsetClientHeader, ResetOffsetRequestHeader, ResetTarget,
};
use quiver_protocol::RemotingCommand;
use quiver_store::QueueOffset;

use super::{success, Ctx, Outcome, Refusal};
use crate::broker::blocking;
use crate::service::admin;
use crate::state_log::{self, StateRecord};
use crate::topics::validate_topic_name;
use quiver_protocol::body::{KvTable, SubscriptionGroupConfig, TopicConfig};

fn bad_request(remark: impl Into<String>) -> Refusal {
    Refusal::new(response::SYSTEM_ERROR, remark)
}

pub async fn create_topic(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = CreateTopicRequestHeader::from_command(req)?;
    let name = header.topic.as_str();
    validate_topic_name(name).map_err(|e| bad_request(e.to_string()))?;
    let queues = |value: i32| u32::try_from(value).ok().filter(|n| (1..=1024).contains(n));
    let (Some(read), Some(write)) = (
        queues(header.read_queue_nums),
        queues(header.write_queue_nums),
    ) else {
        return Err(bad_request(
            "readQueueNums and writeQueueNums must be in 1..=1024",
        ));
    };
    let perm = Some(header.perm)
        .filter(|p| (0..=perm::READ_WRITE | perm::INHERIT).contains(p))
        .ok_or_else(|| bad_request(format!("perm {} is not a permission", header.perm)))?;
    let config = TopicConfig {
        topic_name: name.to_string(),
        read_queue_nums: read,
        write_queue_nums: write,
        perm,
        topic_filter_type: header
            .topic_filter_type
            .clone()
            .unwrap_or_else(|| "SINGLE_TAG".into()),
        topic_sys_flag: header.topic_sys_flag.unwrap_or(0),
        order: header.order.unwrap_or(false),
    };
    tracing::info!(topic = name, read, write, perm, "topic created or updated");
    admin::upsert_topic(&ctx.broker, config).await?;
    Ok(success(req, &[]))
}

pub fn all_topics(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(ctx.broker.topics().wrapper().encode()))
}

pub async fn delete_topic(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let topic = DeleteTopicRequestHeader::from_command(req)?.topic;
    admin::delete_topic(&ctx.broker, &topic).await?;
    tracing::info!(topic, "topic deleted");
    Ok(success(req, &[]))
}

/// Runtime settings as `key=value` lines (RocketMQ's properties form).
/// brokerId and brokerRole as Apache names them (the master is id 0, SYNC_MASTER or
/// ASYNC_MASTER; replicas SLAVE), and for a group member its route addresses, so peers
/// route to its current master.
fn replication_properties(broker: &crate::broker::Broker) -> Vec<String> {
    let Some(replication) = &broker.replication() else {
        return vec!["brokerId=0".into(), "brokerRole=ASYNC_MASTER".into()];
    };
    let addresses = replication.route_addresses();
    let id = addresses
        .iter()
        .find(|(_, address)| **address == broker.advertised())
        .map_or(-1, |(id, _)| *id);
    let role = match (replication.role(), replication.mode) {
        (crate::replication::Role::Master { .. }, crate::config::ReplicationMode::Sync) => {
            "SYNC_MASTER"
        }
        (crate::replication::Role::Master { .. }, crate::config::ReplicationMode::Async) => {
            "ASYNC_MASTER"
        }
        _ => "SLAVE",
    };
    let joined: Vec<String> = addresses
        .iter()
        .map(|(id, address)| format!("{id}/{address}"))
        .collect();
    vec![
        format!("brokerId={id}"),
        format!("brokerRole={role}"),
        format!("{}={}", crate::peers::GROUP_ADDRESSES_KEY, joined.join(",")),
    ]
}

fn config_properties(ctx: &Ctx) -> String {
    let broker = &ctx.broker;
    let c = broker.config();
    let mut lines = vec![
        format!("brokerName={}", c.broker_name),
        format!("brokerClusterName={}", c.cluster),
        format!("brokerPermission={}", broker.permission()),
        format!("brokerAddr={}", broker.advertised()),
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
        format!("aclEnable={}", broker.acl().is_some()),
    ];
    lines.extend(replication_properties(broker));
    // A replica names its master's gRPC endpoint: peers route 5.x writes there.
    let grpc = broker
        .grpc()
        .advertised
        .get()
        .and_then(|own| match &broker.replication() {
            Some(replication) => replication.grpc_route_endpoint(own),
            None => Some(own.clone()),
        });
    if let Some(endpoint) = grpc {
        lines.push(format!("{}={endpoint}", crate::peers::GRPC_ENDPOINT_KEY));
    }
    lines.sort();
    lines.join("\n") + "\n"
}

pub fn broker_config(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let mut reply = success(req, &[("version", "0".to_string())]);
    reply.body = Bytes::from(config_properties(ctx));
    Ok(reply)
}

/// GET_BROKER_RUNTIME_INFO (28): Apache's keys for the store and its disk, as `mqadmin
/// brokerStatus` and the operator read them, and Quiver's write gate.
pub fn runtime_info(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let store = ctx.broker.store();
    let stats = store.stats();
    let disk = store.disk_status();
    let refusal = disk.refusal.as_ref();
    let up_ms = crate::now_ms().saturating_sub(ctx.broker.started_ms());
    let entries = [
        ("brokerVersionDesc", "V4_9_4".to_string()),
        (
            "brokerVersion",
            quiver_protocol::PROTOCOL_VERSION.to_string(),
        ),
        ("bootTimestamp", ctx.broker.started_ms().to_string()),
        ("runtime", uptime_text(up_ms)),
        (
            "commitLogMinOffset",
            stats.min_physical_offset.0.to_string(),
        ),
        (
            "commitLogMaxOffset",
            stats.max_physical_offset.0.to_string(),
        ),
        ("commitLogDiskRatio", disk.used_ratio.to_string()),
        (
            "commitLogDirCapacity",
            format!(
                "Total : {}, Free : {}.",
                human_bytes(disk.total_bytes),
                human_bytes(disk.available_bytes)
            ),
        ),
        (
            "quiverDiskHighWaterRatio",
            disk.high_water_ratio.to_string(),
        ),
        ("quiverWritable", refusal.is_none().to_string()),
        (
            "quiverWriteRefusal",
            refusal.map_or("", |r| r.reason.as_str()).to_string(),
        ),
        (
            "quiverWriteRefusalMessage",
            refusal.map_or_else(String::new, |r| r.message.clone()),
        ),
    ];
    let table = KvTable {
        table: entries
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect(),
    };
    let mut reply = success(req, &[]);
    reply.body = table.encode();
    Ok(reply)
}

/// Uptime as Apache's runtime info writes it: `[ 0 days, 1 hours, 2 minutes, 3 seconds ]`.
fn uptime_text(ms: i64) -> String {
    let seconds = ms.max(0) / 1000;
    let (days, hours) = (seconds / 86_400, seconds / 3_600 % 24);
    let (minutes, seconds) = (seconds / 60 % 60, seconds % 60);
    format!("[ {days} days, {hours} hours, {minutes} minutes, {seconds} seconds ]")
}

/// Bytes as Apache's `MixAll.humanReadableByteCount(bytes, false)` writes them.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let exponent = ((bytes as f64).ln() / 1024f64.ln()).floor() as usize;
    let exponent = exponent.clamp(1, UNITS.len());
    let value = bytes as f64 / 1024f64.powi(exponent as i32);
    format!("{value:.1} {}", UNITS[exponent - 1])
}

pub async fn update_broker_config(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
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
                let permission: i32 = value.trim().parse().map_err(|_| {
                    bad_request(format!("brokerPermission `{value}` is not a number"))
                })?;
                if !perm::is_broker_permission(permission) {
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
    admin::set_permissions(&ctx.broker, &updates).await?;
    Ok(success(req, &[]))
}

pub async fn create_group(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let config = SubscriptionGroupConfig::decode(&req.body).map_err(|e| {
        bad_request(format!(
            "subscription group body is invalid: {}",
            crate::error::chain(&e)
        ))
    })?;
    if config.group_name.is_empty() {
        return Err(bad_request("subscription group body has no groupName"));
    }
    tracing::info!(group = %config.group_name, "subscription group created or updated");
    admin::upsert_group(&ctx.broker, config).await?;
    Ok(success(req, &[]))
}

pub fn all_groups(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(ctx.broker.groups().wrapper().encode()))
}

pub async fn delete_group(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = DeleteSubscriptionGroupRequestHeader::from_command(req)?;
    let group = header.group_name.as_str();
    // The contract: deleting a group drops its offsets unless told to keep them.
    let drop_offsets = header.clean_offset.unwrap_or(true);
    admin::delete_group(&ctx.broker, group, drop_offsets).await?;
    tracing::info!(group, drop_offsets, "subscription group deleted");
    Ok(success(req, &[]))
}

fn queue_count(ctx: &Ctx, topic: &str) -> Result<u32, Refusal> {
    ctx.broker
        .topics()
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
    let topic = GetTopicStatsInfoRequestHeader::from_command(req)?.topic;
    let queues = queue_count(ctx, &topic)?;
    let stats = blocking(&ctx.broker, move |broker| {
        let mut stats = TopicStatsTable::default();
        for q in 0..queues {
            let min = broker.store().min_offset(&topic, q);
            let max = broker.store().max_offset(&topic, q);
            let last = match max.0 {
                0 => 0,
                m => stored_at(broker, &topic, q, QueueOffset(m - 1)),
            };
            stats.offset_table.insert(
                MessageQueue::new(topic.as_str(), broker.config().broker_name.as_str(), q),
                TopicOffset {
                    min_offset: as_i64(min),
                    max_offset: as_i64(max),
                    last_update_timestamp: last,
                },
            );
        }
        stats
    })
    .await?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(stats.encode()))
}

fn as_i64(offset: QueueOffset) -> i64 {
    i64::try_from(offset.0).unwrap_or(i64::MAX)
}

/// Store time of a message, 0 when unknown (RocketMQ's convention in stats bodies).
fn stored_at(
    broker: &crate::broker::Broker,
    topic: &str,
    queue_id: u32,
    offset: QueueOffset,
) -> i64 {
    broker
        .store()
        .store_timestamp(topic, queue_id, offset)
        .ok()
        .flatten()
        .unwrap_or(0)
}

pub fn consumer_connections(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let group = GetConsumerConnectionListRequestHeader::from_command(req)?.consumer_group;
    // 5.x consumers (gRPC Telemetry sessions) are members too.
    let pop_members = ctx.broker.grpc().sessions.consumers_of(&group);
    let Some(state) = ctx.broker.consumers().group(&group) else {
        if pop_members.is_empty() {
            return Err(Refusal::new(
                response::CONSUMER_NOT_ONLINE,
                format!("no consumer of group {group} is online"),
            ));
        }
        let body = ConsumerConnection {
            connection_set: pop_members,
            consume_type: quiver_protocol::body::ConsumeType::ConsumePop,
            ..Default::default()
        };
        return Ok(req
            .response_to(response::SUCCESS, None)
            .with_body(body.encode()));
    };
    let mut body = ConsumerConnection {
        connection_set: state
            .clients
            .values()
            .map(|c| Connection {
                client_id: c.client_id.clone(),
                client_addr: c.connection.remote.to_string(),
                language: c.language.clone(),
                version: c.version,
            })
            .collect(),
        subscription_table: state.subscriptions,
        consume_type: state.consume_type,
        message_model: state.message_model,
        consume_from_where: state.consume_from_where,
    };
    body.connection_set.extend(pop_members);
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(body.encode()))
}

pub async fn consume_stats(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetConsumeStatsRequestHeader::from_command(req)?;
    let group = header.consumer_group;
    // Apache answers 0 for "never committed"; Quiver's own tools ask for -1 (unknown lag).
    let uncommitted = if header.mark_uncommitted == Some(true) {
        -1
    } else {
        0
    };
    let topics = match header.topic.filter(|t| !t.is_empty()) {
        Some(topic) => vec![topic],
        None => ctx.broker.offsets().topics_of(&group),
    };
    let mut counts = Vec::new();
    for topic in topics {
        let queues = queue_count(ctx, &topic)?;
        counts.push((topic, queues));
    }
    let stats = blocking(&ctx.broker, move |broker| {
        let mut stats = ConsumeStats::default();
        for (topic, queues) in counts {
            let table = broker.offsets().table(&group, &topic);
            for q in 0..queues {
                let committed = table.get(&q).copied();
                let last = match committed {
                    Some(QueueOffset(c)) if c > 0 => {
                        stored_at(broker, &topic, q, QueueOffset(c - 1))
                    }
                    _ => 0,
                };
                stats.offset_table.insert(
                    MessageQueue::new(topic.as_str(), broker.config().broker_name.as_str(), q),
                    OffsetWrapper {
                        broker_offset: as_i64(broker.store().max_offset(&topic, q)),
                        consumer_offset: committed.map_or(uncommitted, as_i64),
                        last_timestamp: last,
                    },
                );
            }
        }
        stats
    })
    .await?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(stats.encode()))
}

/// INVOKE_BROKER_TO_RESET_OFFSET: to a timestamp, the earliest or the latest offsets; online
/// members are told with RESET_CONSUMER_CLIENT_OFFSET.
pub async fn reset_offset(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = ResetOffsetRequestHeader::from_command(req)?;
    let target = header.target();
    let queues = queue_count(ctx, &header.topic)?;
    let (topic, group) = (header.topic.clone(), header.group.clone());
    let offsets = blocking(&ctx.broker, move |broker| {
        (0..queues)
            .map(|q| {
                let offset = match target {
                    ResetTarget::Latest => Ok(broker.store().max_offset(&topic, q)),
                    ResetTarget::Earliest => Ok(broker.store().min_offset(&topic, q)),
                    ResetTarget::Timestamp(ts) => {
                        broker.store().search_offset_by_timestamp(&topic, q, ts)
                    }
                };
                offset.map(|o| (q, o))
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await??;
    let record = StateRecord::commit(
        &group,
        &header.topic,
        offsets.iter().map(|(q, o)| (*q, o.0)),
    );
    state_log::write(&ctx.broker, &record).await?;
    let name = ctx.broker.config().broker_name.as_str();
    let reset = ResetOffsetBody {
        offset_table: offsets
            .iter()
            .map(|(q, o)| {
                (
                    MessageQueue::new(header.topic.as_str(), name, *q),
                    as_i64(*o),
                )
            })
            .collect(),
    };
    tracing::info!(group = %header.group, topic = %header.topic, ?target, "consumer offsets reset");
    if let Some(state) = ctx.broker.consumers().group(&header.group) {
        let push_header = ResetOffsetClientHeader {
            topic: header.topic.clone(),
            group: header.group.clone(),
            timestamp: header.timestamp,
            is_force: header.is_force,
        };
        for client in state.clients.values() {
            let push = RemotingCommand::request(
                request::RESET_CONSUMER_CLIENT_OFFSET,
                push_header.to_ext(),
            )
            // The C++ client reads another form of the table than Java clients.
            .with_body(reset.encode_for_language(&client.language))
            .into_oneway();
            client.connection.push(push);
        }
    }
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(reset.encode()))
}

#[cfg(test)]
mod tests {
    use super::{human_bytes, uptime_text};

    #[test]
    fn uptime_reads_like_apache_runtime_info() {
        assert_eq!(uptime_text(0), "[ 0 days, 0 hours, 0 minutes, 0 seconds ]");
        let ms = ((2 * 24 + 3) * 3_600 + 4 * 60 + 5) * 1000 + 999;
        assert_eq!(uptime_text(ms), "[ 2 days, 3 hours, 4 minutes, 5 seconds ]");
    }

    #[test]
    fn human_bytes_reads_like_apache_runtime_info() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(48 * 1024 * 1024), "48.0 MiB");
        assert_eq!(human_bytes(3_250_585), "3.1 MiB");
        assert_eq!(human_bytes(5 << 40), "5.0 TiB");
    }
}
