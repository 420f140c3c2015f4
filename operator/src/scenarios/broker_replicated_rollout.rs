//! An image change on a replicated group, end to end (the executor's pod deletes and the
//! switchover it asks of the brokers, under the simulated OnDelete StatefulSet): replicas first
//! (highest replica id first), then the switchover to an updated in-sync replica, then the old
//! master, one pod down at a time. Each pass's decision is a row of
//! controller::broker::tests::rollouts.

use super::{addr, eventually, Scenario};
use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn a_rollout_restarts_replicas_then_switches_over_then_restarts_the_old_master() {
    let scenario = Scenario::settled_replicated(1, 3, 2).await;
    assert!(scenario.admin.switchovers().is_empty());
    scenario.set_image("quiver:2");
    let mut steps: Vec<String> = Vec::new();
    let mut switchovers_seen = 0;
    eventually(Duration::from_secs(1200), || {
        let pods = scenario.pods();
        let not_ready = pods.iter().filter(|(_, _, ready)| !*ready).count();
        assert!(not_ready <= 1, "two pods down at once: {pods:?}");
        let switchovers = scenario.admin.switchovers();
        for (_, target) in &switchovers[switchovers_seen..] {
            steps.push(format!("switchover to {target}"));
        }
        switchovers_seen = switchovers.len();
        for (name, image, _) in &pods {
            let step = format!("restart {name}");
            if image == "quiver:2" && !steps.contains(&step) {
                steps.push(step);
            }
        }
        scenario.pods_ready_on(3, "quiver:2") && scenario.broker_ready()
    })
    .await;
    assert_eq!(
        steps,
        [
            "restart qb-2",
            "restart qb-1",
            "switchover to 1",
            "restart qb-0"
        ],
        "replicas first, then the switchover, then the old master"
    );
    let switchovers = scenario.admin.switchovers();
    assert_eq!(switchovers.len(), 1, "{switchovers:?}");
    assert_eq!(switchovers[0].0 .0, addr(0), "sent to the master");
    assert_eq!(scenario.admin.master("qb-g0"), Some(1));
    scenario.event("Switchover", "Normal");
    scenario.event("RolloutStep", "Normal");
    let status = scenario.status();
    assert!(status.rollout.is_none(), "no rollout left in status");
    let group = &status.replication.expect("replication").groups[0];
    assert_eq!(group.master.as_deref(), Some("qb-1"));
    assert_eq!(group.epoch, Some(2));
    scenario.stop().await;
}
