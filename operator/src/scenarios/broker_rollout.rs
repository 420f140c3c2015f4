//! An image change rolls the pods one at a time: the partition steps down from the highest
//! ordinal, at no sampled moment are two pods not Ready, and the Broker ends Ready at the new
//! generation with every pod on the new image.

use super::{eventually, Scenario};
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn an_image_change_rolls_one_pod_at_a_time_from_the_highest_ordinal() {
    let scenario = Scenario::settled(3).await;
    scenario.set_image("quiver:2");
    let mut partitions = vec![scenario.partition()];
    let mut updated_order: Vec<String> = Vec::new();
    eventually(Duration::from_secs(900), || {
        let pods = scenario.pods();
        let not_ready = pods.iter().filter(|(_, _, ready)| !*ready).count();
        assert!(not_ready <= 1, "two pods down at once: {pods:?}");
        for (name, image, _) in &pods {
            if image == "quiver:2" && !updated_order.contains(name) {
                updated_order.push(name.clone());
            }
        }
        let partition = scenario.partition();
        if partitions.last() != Some(&partition) {
            partitions.push(partition);
        }
        scenario.pods_ready_on(3, "quiver:2") && scenario.broker_ready()
    })
    .await;
    assert_eq!(
        partitions,
        [0, 2, 1, 0],
        "the partition steps down one at a time"
    );
    assert_eq!(
        updated_order,
        ["qb-2", "qb-1", "qb-0"],
        "highest ordinal first"
    );
    let status = scenario.status();
    assert_eq!(status.observed_generation, Some(2));
    assert!(status.rollout.is_none(), "no rollout left in status");
    scenario.event("RolloutStarted", "Normal");
    scenario.stop().await;
}
