//! One message on its way to the store, as the services and deliveries build it.

use std::net::SocketAddr;

use bytes::Bytes;
use quiver_store::record::Record;

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

impl StoreTarget {
    /// A stored `record` again, to `topic` and `queue_id` with `properties`: its flag, body,
    /// sysFlag, birth and reconsume times as stored, no prepared transaction offset.
    pub(crate) fn copy_of(
        record: &Record,
        topic: String,
        queue_id: u32,
        properties: String,
    ) -> Self {
        StoreTarget {
            topic,
            queue_id,
            flag: record.flag,
            body: record.body.clone(),
            properties,
            sys_flag: record.sys_flag,
            born_timestamp_ms: record.born_timestamp_ms,
            born_host: record.born_host,
            reconsume_times: record.reconsume_times,
            prepared_transaction_offset: 0,
        }
    }
}
