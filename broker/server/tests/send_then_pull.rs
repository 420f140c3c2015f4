//! A message sent over loopback is pulled back byte-exact, with tag filtering.

mod common;

use common::{ext_u64, pulled_bodies, test_config, TestBroker};
use quiver_protocol::code::response;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_then_pull() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(test_config(dir.path())).await;
    let mut client = broker.client().await;

    for i in 0..5 {
        let reply = client
            .send(
                "Orders",
                1,
                &format!("m{i}"),
                if i % 2 == 0 { "A" } else { "B" },
            )
            .await;
        assert_eq!(reply.code, response::SUCCESS, "{:?}", reply.remark);
        assert_eq!(ext_u64(&reply, "queueId"), 1);
        assert_eq!(ext_u64(&reply, "queueOffset"), i);
        assert_eq!(reply.ext("msgId").unwrap().len(), 32);
    }

    let pulled = client.pull("G", "Orders", 1, 0, 0, None).await;
    assert_eq!(pulled.code, response::SUCCESS);
    assert_eq!(pulled_bodies(&pulled), vec!["m0", "m1", "m2", "m3", "m4"]);
    assert_eq!(ext_u64(&pulled, "nextBeginOffset"), 5);
    assert_eq!(ext_u64(&pulled, "maxOffset"), 5);

    let caught_up = client.pull("G", "Orders", 1, 5, 0, None).await;
    assert_eq!(caught_up.code, response::PULL_NOT_FOUND);

    let beyond = client.pull("G", "Orders", 1, 50, 0, None).await;
    assert_eq!(beyond.code, response::PULL_OFFSET_MOVED);

    let metrics = broker.metrics().await;
    assert!(
        metrics
            .contains("rocketmq_messages_in_total{cluster=\"DefaultCluster\",topic=\"Orders\"} 5"),
        "{metrics}"
    );
    assert!(metrics.contains("rocketmq_messages_out_total{cluster=\"DefaultCluster\",topic=\"Orders\",consumer_group=\"G\"} 5"), "{metrics}");
    broker.stop().await;
}
