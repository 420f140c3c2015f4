//! quiver-grpc-proto: the `apache.rocketmq.v2` contract the RocketMQ 5.x clients speak, compiled
//! from this crate's `.proto` files (`proto/`) at build time: prost messages and the tonic
//! `MessagingService` server and client.

/// The generated messages, enums and tonic stubs of `apache.rocketmq.v2`.
#[allow(clippy::all, clippy::pedantic, missing_docs, rust_2018_idioms)]
pub mod v2 {
    tonic::include_proto!("apache.rocketmq.v2");
}

/// The encoded `FileDescriptorSet` of the `.proto` files (and the well-known types they import).
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/rocketmq_v2_descriptor.bin"));

pub use prost;
pub use prost_types;
pub use tonic;
pub use tonic_prost;
