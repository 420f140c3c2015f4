//! SendMessage: normal, FIFO (a message group always lands on the same queue), delayed or
//! timed (the delivery timestamp becomes the timer property) and transactional (a half
//! message, answered with a transaction id) messages, stored as the remoting port stores them.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;

use quiver_grpc_proto::v2::{self, Code, MessageType, SendResultEntry};
use quiver_protocol::body::perm;
use quiver_protocol::message as msg;
use quiver_protocol::record::encode_properties;

use super::convert::{incoming, Incoming};
use super::status::{self, ok, status};
use super::transaction::TransactionHandle;
use crate::broker::Broker;
use crate::service::produce::{
    check_body, check_broker_writable, half_message, park_if_delayed, store_message_async,
    topic_for_send, StoreTarget,
};

/// One message on its way to the store, and what its answer needs.
struct Prepared {
    target: StoreTarget,
    message_id: String,
    is_half: bool,
}

/// Stores every message of the request; each gets its own entry, the response's status is
/// the first failure's (clients send one topic per request).
pub(crate) async fn send(
    broker: &Broker,
    request: &v2::SendMessageRequest,
    born_host: SocketAddr,
) -> Result<v2::SendMessageResponse, v2::Status> {
    if request.messages.is_empty() {
        return Err(status(Code::BadRequest, "the request carries no message"));
    }
    let now = crate::now_ms();
    let mut entries = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        let entry = match prepare(broker, message, born_host, now) {
            Ok(prepared) => store(broker, prepared).await,
            Err(refused) => failed(refused),
        };
        entries.push(entry);
    }
    let status = entries
        .iter()
        .filter_map(|entry| entry.status.clone())
        .find(|status| status.code != Code::Ok as i32)
        .unwrap_or_else(ok);
    Ok(v2::SendMessageResponse {
        status: Some(status),
        entries,
    })
}

fn failed(refused: v2::Status) -> SendResultEntry {
    SendResultEntry {
        status: Some(refused),
        ..SendResultEntry::default()
    }
}

async fn store(broker: &Broker, prepared: Prepared) -> SendResultEntry {
    let results = match store_message_async(broker, std::slice::from_ref(&prepared.target)).await {
        Ok(results) => results,
        Err(error) => return failed(status::of_service(error)),
    };
    let stored = &results[0];
    let transaction_id = if prepared.is_half {
        TransactionHandle {
            commit_log_offset: stored.physical_offset.0,
            half_offset: stored.queue_offset.0,
        }
        .encode()
    } else {
        String::new()
    };
    SendResultEntry {
        status: Some(ok()),
        message_id: prepared.message_id,
        transaction_id,
        offset: i64::try_from(stored.queue_offset.0).unwrap_or(i64::MAX),
    }
}

/// Checks one message and builds what to store: its topic's queue (by message group for
/// FIFO), parked for its delivery time, or kept as a half message.
fn prepare(
    broker: &Broker,
    message: &v2::Message,
    born_host: SocketAddr,
    now: i64,
) -> Result<Prepared, v2::Status> {
    let checked = incoming(message, now)?;
    check_body(
        message.body.len(),
        broker.config().max_message_size as usize,
    )
    .map_err(status::of_service)?;
    check_broker_writable(broker).map_err(status::of_service)?;
    let topic = topic_for_send(broker, &checked.topic).map_err(status::of_service)?;
    if topic.perm & perm::WRITE == 0 || topic.write_queue_nums == 0 {
        return Err(status(
            Code::Forbidden,
            format!("topic {} is not writable", checked.topic),
        ));
    }
    let queue_id = queue_for(broker, &checked, topic.write_queue_nums);
    let is_half = checked.kind == MessageType::Transaction;
    let Incoming {
        topic: topic_name,
        message_id,
        properties,
        born_timestamp_ms,
        ..
    } = checked;
    let target = StoreTarget {
        topic: topic_name.clone(),
        queue_id,
        flag: 0,
        body: message.body.clone(),
        properties: encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        sys_flag: 0,
        born_timestamp_ms,
        born_host,
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    };
    let target = if is_half {
        let mut half = half_message(broker, target, &topic_name);
        half.properties =
            with_property(&half.properties, msg::PROPERTY_TRANSACTION_PREPARED, "true");
        half
    } else {
        park_if_delayed(broker, target, now).map_err(status::of_delivery_time)?
    };
    Ok(Prepared {
        target,
        message_id,
        is_half,
    })
}

fn with_property(properties: &str, key: &str, value: &str) -> String {
    let mut map = quiver_protocol::record::parse_properties(properties);
    map.insert(key.to_owned(), value.to_owned());
    encode_properties(map.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// A message group's messages all go to one queue (its hash), so they are stored and
/// consumed in order; other messages take the queues in turn.
fn queue_for(broker: &Broker, message: &Incoming, queues: u32) -> u32 {
    match &message.group {
        Some(group) => crc32fast::hash(group.as_bytes()) % queues,
        None => broker.grpc().send_sequence.fetch_add(1, Ordering::Relaxed) % queues,
    }
}
