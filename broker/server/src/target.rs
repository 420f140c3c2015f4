//! One message on its way to the store, as the services and deliveries build it.

use std::net::SocketAddr;

use bytes::Bytes;

/// One message to append, owned so it can cross into a blocking task.
#[derive(Clone, Debug)]
pub(crate) struct StoreTarget {
    pub topic: String,
    pub queue_id: u32,
    pub flag: i32,
    pub body: Bytes,
    pub properties: String,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    /// A committed transactional message: where its half message is in the CommitLog.
    pub prepared_transaction_offset: i64,
}
