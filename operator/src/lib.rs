//! quiver-operator: Kubernetes operator for Quiver brokers and consumer groups.
//!
//! `Broker` resources become StatefulSets (with Services, a ConfigMap and a PDB), rolled one pod
//! at a time and drained before scale-down; `ConsumerGroup` resources are created on their
//! brokers and get their lag in status and in Prometheus.

#![forbid(unsafe_code)]

pub mod admin;
pub mod controller;
pub mod crd;
pub mod crdgen;
pub mod desired;
pub mod disk;
pub mod http;
pub mod lag;
pub mod leader;
pub mod metrics;
pub mod quantity;
pub mod remoting_admin;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod scenarios;
#[cfg(test)]
pub mod testapi;
pub use controller::{Context, Error};
