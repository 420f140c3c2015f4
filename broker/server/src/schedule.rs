//! Delay levels: messages wait in SCHEDULE_TOPIC_XXXX (queue = level - 1) and are re-stored
//! in their real topic once due (RocketMQ's ScheduleMessageService).

use quiver_protocol::message as msg;
use quiver_store::record::{encode_properties, parse_properties, Record};

use crate::target::StoreTarget;

/// The delay of each level (1-based): 1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
pub const DELAY_LEVELS_MS: [i64; 18] = [
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000,
    480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
];

/// The schedule queue holding a level's messages.
pub fn queue_of_level(level: usize) -> u32 {
    u32::try_from(level.clamp(1, DELAY_LEVELS_MS.len()) - 1).unwrap_or(0)
}

/// Properties of a delayed message: remembers where it goes once due.
pub fn delay_properties(
    properties: &str,
    real_topic: &str,
    real_queue_id: u32,
    level: usize,
) -> String {
    let mut map = parse_properties(properties);
    // As Apache's `HookUtils.checkIfTimerMessage`: a delay level wins and clears a timer.
    for timer in crate::timer::TIMER_PROPERTIES {
        map.remove(timer);
    }
    map.insert(msg::PROPERTY_REAL_TOPIC.into(), real_topic.into());
    map.insert(
        msg::PROPERTY_REAL_QUEUE_ID.into(),
        real_queue_id.to_string(),
    );
    map.insert(msg::PROPERTY_DELAY.into(), level.to_string());
    encode_properties(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// A parked message (delay level or timer) as it goes to its real topic and queue, without
/// REAL_TOPIC, REAL_QID and the properties that parked it.
pub(crate) fn released(record: &Record, parking: &[&str]) -> Option<StoreTarget> {
    let mut properties = record.properties_map();
    let real_topic = properties.remove(msg::PROPERTY_REAL_TOPIC);
    let real_queue = properties
        .remove(msg::PROPERTY_REAL_QUEUE_ID)
        .and_then(|q| q.parse::<u32>().ok())
        .unwrap_or(0);
    for name in parking {
        properties.remove(*name);
    }
    let properties = encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Some(StoreTarget {
        prepared_transaction_offset: record.prepared_transaction_offset,
        ..StoreTarget::copy_of(record, real_topic?, real_queue, properties)
    })
}
