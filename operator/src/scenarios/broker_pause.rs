//! The pause annotation: a spec change made while paused is not applied (Paused=True, one
//! Paused event); removing the annotation applies it.

use super::{condition, eventually, holds_for, Scenario};
use crate::crd::PAUSE_ANNOTATION;
use std::time::Duration;

fn template_image(scenario: &Scenario) -> String {
    let spec = scenario.statefulset().spec.template.spec.expect("pod spec");
    spec.containers[0].image.clone().unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_change_made_while_paused_waits_for_the_annotation_to_go() {
    let scenario = Scenario::settled(3).await;
    scenario.annotate(PAUSE_ANNOTATION, "true");
    eventually(Duration::from_secs(60), || {
        condition(&scenario.status().conditions, "Paused").0 == "True"
    })
    .await;
    scenario.set_image("quiver:2");
    holds_for(
        Duration::from_secs(300),
        "nothing applied while paused",
        || template_image(&scenario) == "quiver:1" && scenario.pods_ready_on(3, "quiver:1"),
    )
    .await;
    let status = scenario.status();
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("False".into(), "Paused".into())
    );
    assert_eq!(
        scenario.events("Paused").len(),
        1,
        "one event for the pause"
    );

    scenario.edit_broker(|broker| {
        broker["metadata"]["annotations"]
            .as_object_mut()
            .expect("annotations")
            .remove(PAUSE_ANNOTATION);
    });
    eventually(Duration::from_secs(900), || {
        scenario.pods_ready_on(3, "quiver:2") && scenario.broker_ready()
    })
    .await;
    let status = scenario.status();
    assert_eq!(condition(&status.conditions, "Paused").0, "False");
    assert_eq!(status.observed_generation, Some(2));
    scenario.stop().await;
}
