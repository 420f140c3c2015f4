//! CONSUMER_SEND_MSG_BACK (36): a failed message goes to %RETRY%<group> after a delay level,
//! or to %DLQ%<group> once it has been redelivered maxReconsumeTimes times.

use std::collections::BTreeMap;

use quiver_protocol::code::response;
use quiver_protocol::header::{ConsumerSendMsgBackRequestHeader, SendBackDelay};
use quiver_protocol::RemotingCommand;
use quiver_store::record::encode_properties;
use quiver_store::CommitLogOffset;

use super::{success, Ctx, Outcome, Refusal};
use crate::broker::{blocking, Broker};
use crate::schedule;
use crate::service::produce::{retry_properties, store_message_async, topic_for_send, StoreTarget};
use crate::topics::{DLQ_PREFIX, RETRY_PREFIX, SCHEDULE_TOPIC};

/// Where a sent-back message goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendBackTarget {
    /// Redelivered from %RETRY%<group> after the delay of `level`.
    Retry { level: usize },
    /// Parked for good in %DLQ%<group>.
    DeadLetter,
}

/// RocketMQ's rule: DLQ once reconsumeTimes reaches the max or the client asks for it;
/// otherwise the client's level, or 3 + reconsumeTimes when it leaves the choice to us.
pub fn decide(
    reconsume_times: i32,
    max_reconsume_times: i32,
    requested: SendBackDelay,
) -> SendBackTarget {
    if reconsume_times >= max_reconsume_times {
        return SendBackTarget::DeadLetter;
    }
    let level = match requested {
        SendBackDelay::DeadLetter => return SendBackTarget::DeadLetter,
        SendBackDelay::BrokerChooses => 3 + reconsume_times,
        SendBackDelay::Level(level) => level,
    };
    SendBackTarget::Retry {
        level: usize::try_from(level)
            .unwrap_or(1)
            .clamp(1, schedule::DELAY_LEVELS_MS.len()),
    }
}

pub async fn send_back(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let header = ConsumerSendMsgBackRequestHeader::from_command(req)?;
    let group = header.group.clone();
    let physical = u64::try_from(header.offset).map_err(|_| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!("offset {} is negative", header.offset),
        )
    })?;
    let requested = header.delay();
    let header_max = header.max_reconsume_times;
    let origin_msg_id = header.origin_msg_id.filter(|id| !id.is_empty());
    if !broker.is_writable() {
        return Err(Refusal::new(
            response::NO_PERMISSION,
            format!("broker {} is not writable", broker.config().broker_name),
        ));
    }
    let group_config = broker.groups().get_or_create(&group);
    let max_reconsume_times = header_max.unwrap_or(group_config.retry_max_times);
    let record = blocking(broker, move |broker| {
        broker.store().read_record(CommitLogOffset(physical))
    })
    .await?
    .map_err(|error| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!(
                "no message at commit log offset {physical}: {}",
                crate::error::chain(&error)
            ),
        )
    })?;
    let properties = retry_properties(&record, origin_msg_id);
    let target = decide(record.reconsume_times, max_reconsume_times, requested);
    if target == SendBackTarget::DeadLetter {
        tracing::info!(group, topic = %record.topic, reconsume_times = record.reconsume_times, "message dead-lettered");
    }
    let (topic, queue_id, properties) = destination(broker, &group, physical, target, &properties)?;
    let target = vec![StoreTarget {
        reconsume_times: record.reconsume_times + 1,
        ..StoreTarget::copy_of(&record, topic, queue_id, properties)
    }];
    store_message_async(broker, &target).await?;
    Ok(success(req, &[]))
}

/// Topic, queue and encoded properties of the copy: %DLQ% at once, or %RETRY% after the
/// level's delay (parked in the schedule topic).
fn destination(
    broker: &Broker,
    group: &str,
    physical: u64,
    target: SendBackTarget,
    properties: &BTreeMap<String, String>,
) -> Result<(String, u32, String), Refusal> {
    let encoded = encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    match target {
        SendBackTarget::DeadLetter => {
            let dlq = format!("{DLQ_PREFIX}{group}");
            topic_for_send(broker, &dlq)?;
            Ok((dlq, 0, encoded))
        }
        SendBackTarget::Retry { level } => {
            let retry = format!("{RETRY_PREFIX}{group}");
            let config = topic_for_send(broker, &retry)?;
            let retry_queue =
                u32::try_from(physical % u64::from(config.write_queue_nums.max(1))).unwrap_or(0);
            let delayed = schedule::delay_properties(&encoded, &retry, retry_queue, level);
            Ok((
                SCHEDULE_TOPIC.to_string(),
                schedule::queue_of_level(level),
                delayed,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_grow_then_dead_letter() {
        use SendBackDelay::{BrokerChooses, DeadLetter, Level};
        assert_eq!(
            decide(0, 16, BrokerChooses),
            SendBackTarget::Retry { level: 3 }
        );
        assert_eq!(
            decide(2, 16, BrokerChooses),
            SendBackTarget::Retry { level: 5 }
        );
        assert_eq!(decide(1, 16, Level(2)), SendBackTarget::Retry { level: 2 });
        assert_eq!(
            decide(15, 16, BrokerChooses),
            SendBackTarget::Retry { level: 18 }
        );
        assert_eq!(decide(16, 16, BrokerChooses), SendBackTarget::DeadLetter);
        assert_eq!(decide(0, 16, DeadLetter), SendBackTarget::DeadLetter);
    }
}
