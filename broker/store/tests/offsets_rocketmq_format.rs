//! RocketMQ's own consumerOffset.json (unquoted integer keys) loads.

use quiver_store::{ConsumerOffsets, QueueOffset};

#[test]
fn loads_rocketmq_unquoted_integer_keys() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("consumerOffset.json"),
        "{\n\t\"offsetTable\":{\n\t\t\"TopicTest@please_rename_unique_group_name_4\":{0:250,1:249,2:-1,3:251\n\t\t},\n\t\t\"%RETRY%g@g\":{0:0}\n\t},\"dataVersion\":{\"counter\":3}\n}",
    )
    .unwrap();
    let offsets = ConsumerOffsets::load(dir.path()).unwrap();
    let group = "please_rename_unique_group_name_4";
    assert_eq!(offsets.query(group, "TopicTest", 0), Some(QueueOffset(250)));
    assert_eq!(offsets.query(group, "TopicTest", 3), Some(QueueOffset(251)));
    assert_eq!(
        offsets.query(group, "TopicTest", 2),
        None,
        "-1 means nothing committed"
    );
    assert_eq!(offsets.query("g", "%RETRY%g", 0), Some(QueueOffset(0)));
    // Written back as standard JSON, which loads too.
    offsets.persist().unwrap();
    let reloaded = ConsumerOffsets::load(dir.path()).unwrap();
    assert_eq!(reloaded.table(group, "TopicTest").len(), 3);
}
