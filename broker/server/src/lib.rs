//! quiver-broker: a RocketMQ 4.x compatible broker over quiver-store.
//!
//! One port speaks the RocketMQ remoting protocol (and answers name-server requests, so clients
//! use the broker address as their name server); a second port serves `/metrics`, `/healthz`
//! and `/readyz`. [`run`] takes both listeners and a shutdown future so tests own all three.

#![forbid(unsafe_code)]

pub mod acl;
pub(crate) mod background;
pub mod broker;
pub mod config;
pub mod consumers;
pub(crate) mod delivery;
pub mod error;
pub mod exposition;
pub mod filter;
pub mod groups;
pub mod grpc;
pub mod grpc_state;
pub mod http;
pub mod locks;
pub mod long_poll;
mod member;
pub mod metrics;
pub mod peers;
pub(crate) mod periodic;
pub(crate) mod persist;
pub mod pop;
pub mod processor;
pub mod producers;
pub mod replication;
pub mod schedule;
pub mod server;
pub mod service;
pub mod slots;
pub mod stages;
pub mod state_log;
pub(crate) mod target;
pub mod timer;
pub mod tls;
pub mod topics;
pub mod transaction;

pub use config::{BrokerConfig, ClientAuth, ConfigError, FlushMode, ReplicationMode, TlsMode};
pub use error::BrokerError;
pub use server::{run, run_with_grpc};

/// Milliseconds since the Unix epoch (the clock RocketMQ timestamps use).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
