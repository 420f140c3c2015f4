//! The broker's services: what a request may ask of the broker, whatever protocol carried it.
//! The remoting processors (`processor/`) and the gRPC handlers (`grpc/`) decode a request,
//! call a service and map its [`ServiceError`] at their own edge (a remoting response code, a
//! gRPC status); the background deliveries (`crate::delivery`: delay levels, timers, POP
//! revive, transaction check-back) call the same services. A service call is a plain
//! function call on `&Broker`; the state it works on (the store, offsets, topics, groups,
//! POP and transaction state) is composed by `Broker` and imports no service.
//!
//! - [`produce`]: appending messages. `produce::store_message_async` (a send: durable and,
//!   in a sync group, confirmed by the replicas) and `produce::store_message` (a blocking
//!   delivery), `produce::check_broker_writable`, `produce::topic_for_send` (the topic,
//!   auto-created when allowed), `produce::park_if_delayed` (a delay level or timer parks
//!   the message), `produce::half_message` (a transaction's half message),
//!   `produce::check_body`, `produce::retry_properties`, `produce::ensure_topic`.
//! - [`transaction`]: `transaction::end_transaction` commits or rolls back a half message.
//! - [`consume`]: consumer offsets ([`consume::commit_offset`], [`consume::query_offset`])
//!   and the checks a pull passes ([`consume::check_broker_readable`], [`consume::pull_topic`]).
//! - [`pop`]: POP consumption over the broker, as methods of `crate::pop::PopService`
//!   (`receive`, `ack`, `change_invisible`, `forward_to_dead_letter`) and
//!   `pop::move_message`, which the revive loop (`crate::delivery::revive`) uses too.
//! - [`route`]: `route::create_on_lookup`, the topic a route lookup (either port's) found
//!   nowhere, created when auto-creation allows it; `route::retry_queues`.
//! - [`admin`]: topics, subscription groups and the broker permission, changed and persisted
//!   ([`admin::upsert_topic`], [`admin::delete_topic`], [`admin::upsert_group`],
//!   [`admin::delete_group`], [`admin::set_permissions`]).

pub mod admin;
pub mod consume;
pub mod pop;
pub mod produce;
pub mod route;
pub mod transaction;

use crate::error::BrokerError;

/// Why a service refused or failed: what went wrong, not how a protocol answers it.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The broker's permission or the topic's, or a disabled group, forbids it.
    #[error("{0}")]
    Forbidden(String),
    /// The topic does not exist (and is not created).
    #[error("{0}")]
    TopicNotFound(String),
    /// The message cannot be stored as it is: bad topic name, body, batch, delay or timer.
    #[error("{0}")]
    IllegalMessage(String),
    /// The message body is larger than `max-message-size`.
    #[error("{0}")]
    BodyTooLarge(String),
    /// An argument the request names is out of range or malformed.
    #[error("{0}")]
    BadRequest(String),
    /// Nothing to answer here (no committed offset and none to assume).
    #[error("{0}")]
    NotFound(String),
    /// Not now: a bound is reached or another member must answer; ask again later.
    #[error("{0}")]
    Busy(String),
    /// The transaction the ending names is not a half message of this broker as named.
    #[error("{0}")]
    InvalidTransaction(String),
    /// The store refused or failed (a full disk, not the master, an I/O error).
    #[error(transparent)]
    Store(#[from] quiver_store::StoreError),
    /// The in-sync replicas did not confirm the message.
    #[error(transparent)]
    Replication(#[from] crate::replication::ConfirmError),
    /// Persisting or a blocking task failed.
    #[error(transparent)]
    Broker(#[from] BrokerError),
}

/// Runs blocking work off the async workers and flattens its error into a service error.
pub(crate) async fn blocking<T, E, F>(
    broker: &std::sync::Arc<crate::broker::Broker>,
    work: F,
) -> Result<T, ServiceError>
where
    T: Send + 'static,
    E: Into<ServiceError> + Send + 'static,
    F: FnOnce(&crate::broker::Broker) -> Result<T, E> + Send + 'static,
{
    crate::broker::blocking(broker, work)
        .await?
        .map_err(Into::into)
}
