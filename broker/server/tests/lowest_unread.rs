//! What retention under disk pressure must keep: everything from the lowest CommitLog offset
//! a consumer group with committed offsets, a delay level's delivery, or the timer service
//! (a timer not enqueued, or enqueued and not fired) has yet to read.

mod common;

use std::net::SocketAddr;

use common::test_config;
use quiver_broker::broker::Broker;
use quiver_store::{CommitLogOffset, NewMessage, PutResult, QueueOffset};

fn put(broker: &Broker, topic: &str, queue_id: u32) -> PutResult {
    let host: SocketAddr = "127.0.0.1:10911".parse().unwrap();
    broker
        .store()
        .put(
            &NewMessage {
                topic,
                queue_id,
                flag: 0,
                body: b"body",
                properties: "",
                sys_flag: 0,
                born_timestamp_ms: 1,
                born_host: host,
                store_host: host,
                reconsume_times: 0,
                prepared_transaction_offset: 0,
            },
            1,
        )
        .unwrap()
}

#[test]
fn groups_and_undelivered_delayed_messages_hold_retention_back() {
    let dir = tempfile::tempdir().unwrap();
    let bound: SocketAddr = "127.0.0.1:10911".parse().unwrap();
    let broker = Broker::open(test_config(dir.path()), bound).unwrap();
    let first = put(&broker, "Orders", 0);
    let delayed = put(&broker, quiver_broker::topics::SCHEDULE_TOPIC, 2);
    let last = put(&broker, "Orders", 0);
    // The delay level's delivery has not started: its message must stay.
    assert_eq!(broker.lowest_unread(), Some(delayed.physical_offset));
    broker.delay_delivered().lock().insert(2, 1);
    assert_eq!(broker.lowest_unread(), None, "nothing is left to read");
    // A group that read only the first message of Orders holds back from the second.
    broker
        .offsets()
        .commit("G", "Orders", 0, QueueOffset(first.queue_offset.0 + 1));
    assert_eq!(broker.lowest_unread(), Some(last.physical_offset));
    broker.offsets().commit("G", "Orders", 0, QueueOffset(0));
    assert_eq!(broker.lowest_unread(), Some(CommitLogOffset(0)));
    broker.store().shutdown().unwrap();
}

#[test]
fn pending_timers_hold_retention_back() {
    use std::sync::atomic::Ordering;
    let dir = tempfile::tempdir().unwrap();
    let bound: SocketAddr = "127.0.0.1:10911".parse().unwrap();
    let broker = Broker::open(test_config(dir.path()), bound).unwrap();
    put(&broker, "Orders", 0);
    let timed = put(&broker, quiver_broker::timer::TIMER_TOPIC, 0);
    assert_eq!(
        broker.lowest_unread(),
        Some(timed.physical_offset),
        "not enqueued yet"
    );
    let timers = broker.timers();
    timers.enqueued_offset.store(1, Ordering::Release);
    assert_eq!(broker.lowest_unread(), None, "enqueued and fired");
    timers
        .lowest_pending
        .store(timed.physical_offset.0, Ordering::Release);
    assert_eq!(
        broker.lowest_unread(),
        Some(timed.physical_offset),
        "enqueued, pending"
    );
    broker.store().shutdown().unwrap();
}
