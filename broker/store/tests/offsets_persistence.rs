//! Consumer offsets: commit, query, reset, delete; persisted atomically with a `.bak`.

use quiver_store::{ConsumerOffsets, QueueOffset};

#[test]
fn offsets_persist_atomically_and_reload() {
    let dir = tempfile::tempdir().unwrap();
    let config_dir = dir.path().join("config");
    let offsets = ConsumerOffsets::load(&config_dir).unwrap();
    assert_eq!(offsets.query("g1", "T", 0), None);
    offsets.commit("g1", "T", 0, QueueOffset(250));
    offsets.commit("g1", "T", 1, QueueOffset(7));
    offsets.commit("g2", "%RETRY%g2", 0, QueueOffset(3));
    offsets.persist().unwrap();
    offsets.reset("g1", "T", &[(0, QueueOffset(100)), (2, QueueOffset(1))]);
    offsets.persist().unwrap();

    let main = config_dir.join("consumerOffset.json");
    let bak = config_dir.join("consumerOffset.json.bak");
    assert!(main.exists() && bak.exists());
    assert!(
        !config_dir.join("consumerOffset.json.tmp").exists(),
        "the temp file was renamed"
    );
    let previous: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bak).unwrap()).unwrap();
    assert_eq!(
        previous["offsetTable"]["T@g1"]["0"], 250,
        "the .bak is the previous version"
    );

    let reloaded = ConsumerOffsets::load(&config_dir).unwrap();
    assert_eq!(reloaded.query("g1", "T", 0), Some(QueueOffset(100)));
    assert_eq!(reloaded.query("g1", "T", 1), Some(QueueOffset(7)));
    assert_eq!(reloaded.query("g1", "T", 2), Some(QueueOffset(1)));
    assert_eq!(reloaded.groups(), vec!["g1".to_string(), "g2".to_string()]);
    assert_eq!(reloaded.topics_of("g2"), vec!["%RETRY%g2".to_string()]);
    assert_eq!(reloaded.table("g1", "T").len(), 3);

    reloaded.delete_group("g1");
    assert_eq!(reloaded.query("g1", "T", 0), None);
    assert_eq!(reloaded.groups(), vec!["g2".to_string()]);
    reloaded.persist().unwrap();
    assert_eq!(
        ConsumerOffsets::load(&config_dir).unwrap().groups(),
        vec!["g2".to_string()]
    );
}
