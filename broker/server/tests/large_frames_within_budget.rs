//! Read buffers count against `max-inflight-bytes`: at its smallest (one largest frame), two
//! connections sending 9 MiB frames at once (18 MiB in all) are still both answered, one
//! after the other, instead of each holding half the budget and waiting for the rest.

mod common;

use bytes::Bytes;
use common::{ext, test_config, TestBroker};
use quiver_protocol::code::{request, response};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_large_frames_share_the_smallest_budget() {
    let dir = tempfile::tempdir().unwrap();
    let config = quiver_broker::BrokerConfig {
        max_inflight_bytes: quiver_protocol::MAX_FRAME_BYTES,
        ..test_config(dir.path())
    };
    let broker = TestBroker::start(config).await;
    let mut senders = Vec::new();
    for name in ["A", "B"] {
        let mut client = broker.client().await;
        senders.push(tokio::spawn(async move {
            // Over max-message-size: read whole, then refused with an answer.
            let body = Bytes::from(vec![b'x'; 9 * 1024 * 1024]);
            let answer = client
                .call(
                    request::SEND_MESSAGE,
                    ext(&[
                        ("producerGroup", "P"),
                        ("topic", name),
                        ("defaultTopic", "TBW102"),
                        ("defaultTopicQueueNums", "4"),
                        ("queueId", "0"),
                        ("sysFlag", "0"),
                        ("bornTimestamp", "0"),
                        ("flag", "0"),
                    ]),
                    body,
                )
                .await;
            assert_ne!(answer.code, response::SUCCESS);
            // The connection still serves small requests afterwards.
            let config = client
                .call(request::GET_BROKER_CONFIG, Default::default(), Bytes::new())
                .await;
            assert_eq!(config.code, response::SUCCESS);
        }));
    }
    for sender in senders {
        sender.await.expect("both connections answered");
    }
    broker.stop().await;
}
