//! The produce and transaction services under their former `processor` names and remoting
//! refusals, for callers not moved to `crate::service` yet (the gRPC handlers). To be removed
//! once nothing imports them.

use super::Refusal;
use crate::broker::Broker;
use crate::service::{produce, transaction};
use crate::topics::TopicConfig;

pub(crate) use produce::{half_message, store_message_async, StoreTarget};
pub(crate) use transaction::Ending;

/// What `store_message_async` fails with (mapped by `Refusal::from`).
pub(crate) type SendError = crate::service::ServiceError;

pub(crate) fn check_broker_writable(broker: &Broker) -> Result<(), Refusal> {
    produce::check_broker_writable(broker).map_err(Refusal::from)
}

pub(crate) fn topic_for_send(broker: &Broker, topic: &str) -> Result<TopicConfig, Refusal> {
    produce::topic_for_send(broker, topic).map_err(Refusal::from)
}

pub(crate) fn park_if_delayed(
    broker: &Broker,
    target: StoreTarget,
    now: i64,
) -> Result<StoreTarget, Refusal> {
    produce::park_if_delayed(broker, target, now).map_err(Refusal::from)
}

pub(crate) async fn end_transaction(broker: &Broker, ending: Ending<'_>) -> Result<(), Refusal> {
    transaction::end_transaction(broker, ending)
        .await
        .map_err(Refusal::from)
}
