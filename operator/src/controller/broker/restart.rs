//! A restart asked for with the `quiver.io/restart` annotation, pure. The token goes into the
//! pod template (the same annotation), so a new token is a template change and the rollout
//! restarts the pods one at a time, as it does for any change: highest ordinal first, or per
//! replicated group replicas first and the master after a switchover, each once the others are
//! Ready (and back in sync). The template keeps the last token when the annotation goes, so
//! removing it restarts nothing.

use super::plan::Note;
use crate::crd::{Broker, RestartState, RestartStatus, RESTART_ANNOTATION};
use k8s_openapi::api::apps::v1::StatefulSet;
use std::borrow::Cow;

/// The restart token the StatefulSet's pod template carries.
pub fn template_token(sts: &StatefulSet) -> Option<&str> {
    sts.spec
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(RESTART_ANNOTATION)
        .map(String::as_str)
}

/// The Broker a pass builds from: with its own restart token, else with the one its
/// StatefulSet's template carries (so removing the annotation is no template change).
pub fn with_sticky_token<'a>(
    broker: &'a Broker,
    existing: Option<&StatefulSet>,
) -> Cow<'a, Broker> {
    let kept = existing.and_then(template_token);
    match kept {
        Some(token) if broker.restart_token().is_none() => {
            let mut sticky = broker.clone();
            sticky
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(RESTART_ANNOTATION.to_string(), token.to_string());
            Cow::Owned(sticky)
        }
        _ => Cow::Borrowed(broker),
    }
}

/// The token of a restart this pass starts: the Broker's token differs from the one the running
/// StatefulSet's template carries (a new Broker's pods just start).
pub fn requested<'a>(broker: &'a Broker, existing: Option<&StatefulSet>) -> Option<&'a str> {
    let token = broker.restart_token()?;
    let running = existing?;
    (template_token(running) != Some(token)).then_some(token)
}

/// Whether every pod runs the StatefulSet's template and is Ready: its status describes the
/// current spec, counts every pod updated and Ready, and no rollout step is left.
pub fn settled(sts: Option<&StatefulSet>, rolling: bool) -> bool {
    let Some(sts) = sts else {
        return false;
    };
    let Some(status) = sts.status.as_ref() else {
        return false;
    };
    let replicas = sts.spec.replicas.unwrap_or(0);
    let current = status.observed_generation.is_some()
        && status.observed_generation >= sts.metadata.generation;
    !rolling
        && current
        && status.updated_replicas.unwrap_or(0) >= replicas
        && status.ready_replicas.unwrap_or(0) >= replicas
}

/// The restart's status after this pass: a new one is in progress, one in progress completes
/// once the pods settle.
pub fn next_status(
    previous: Option<&RestartStatus>,
    started: Option<&str>,
    settled: bool,
) -> Option<RestartStatus> {
    if let Some(token) = started {
        return Some(RestartStatus {
            token: token.to_string(),
            state: RestartState::InProgress,
        });
    }
    let previous = previous?;
    let state = match previous.state {
        RestartState::InProgress if settled => RestartState::Completed,
        state => state,
    };
    Some(RestartStatus {
        state,
        ..previous.clone()
    })
}

/// The event of a restart that starts, for a Broker with replicated groups or without.
pub fn started_note(broker: &Broker, token: &str) -> Note {
    let order = if broker.is_replicated() {
        "each broker group restarts its replicas first, then switches mastership over and \
         restarts the old master"
    } else {
        "pods restart one at a time, highest ordinal first, each once the others are Ready"
    };
    Note::normal(
        "RestartStarted",
        "Restart",
        format!("restart {token} requested by {RESTART_ANNOTATION}: {order}"),
    )
}

/// The event of a restart that completed this pass.
pub fn completed_note(
    previous: Option<&RestartStatus>,
    next: Option<&RestartStatus>,
) -> Option<Note> {
    let was = previous.map(|restart| restart.state);
    let next = next.filter(|restart| restart.state == RestartState::Completed)?;
    (was == Some(RestartState::InProgress)).then(|| {
        Note::normal(
            "RestartCompleted",
            "Restart",
            format!(
                "restart {} completed: every pod restarted and is Ready",
                next.token
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::{self, RolloutPlan};
    use crate::fixtures::BrokerFixture;

    fn annotated(token: &str) -> Broker {
        let mut broker = Broker::test().replicas(3);
        broker
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(RESTART_ANNOTATION.to_string(), token.to_string());
        broker
    }

    fn sts_of(broker: &Broker) -> StatefulSet {
        desired::stateful_set(broker, &RolloutPlan::initial(broker))
    }

    #[test]
    fn a_new_token_is_a_restart_and_the_template_keeps_the_last_one() {
        let plain = Broker::test().replicas(3);
        let first = annotated("2024-01-01T00:00:00Z");
        assert_eq!(requested(&first, None), None, "a new Broker just starts");
        let running = sts_of(&plain);
        assert_eq!(
            requested(&first, Some(&running)),
            Some("2024-01-01T00:00:00Z")
        );
        let restarted = sts_of(&first);
        assert_eq!(template_token(&restarted), Some("2024-01-01T00:00:00Z"));
        assert_ne!(
            crate::controller::rollout::template_hash(&restarted),
            crate::controller::rollout::template_hash(&running),
            "the token rolls the pods"
        );
        assert_eq!(requested(&first, Some(&restarted)), None, "asked once");
        let sticky = with_sticky_token(&plain, Some(&restarted));
        assert_eq!(sticky.restart_token(), Some("2024-01-01T00:00:00Z"));
        assert_eq!(
            crate::controller::rollout::template_hash(&sts_of(&sticky)),
            crate::controller::rollout::template_hash(&restarted),
            "removing the annotation restarts nothing"
        );
        let second = annotated("2");
        assert_eq!(
            with_sticky_token(&second, Some(&restarted)).restart_token(),
            Some("2")
        );
        assert_eq!(requested(&second, Some(&restarted)), Some("2"));
    }

    #[test]
    fn a_restart_completes_once_the_pods_settle_with_one_event() {
        let started = next_status(None, Some("t1"), true).expect("started");
        assert_eq!(started.state, RestartState::InProgress);
        let rolling = next_status(Some(&started), None, false);
        assert_eq!(rolling.as_ref(), Some(&started));
        assert_eq!(completed_note(Some(&started), rolling.as_ref()), None);
        let done = next_status(Some(&started), None, true);
        assert_eq!(
            done.as_ref().map(|r| r.state),
            Some(RestartState::Completed)
        );
        let note = completed_note(Some(&started), done.as_ref()).expect("an event");
        assert_eq!(note.reason, "RestartCompleted");
        assert!(note.note.contains("t1"), "{}", note.note);
        let later = next_status(done.as_ref(), None, true);
        assert_eq!(completed_note(done.as_ref(), later.as_ref()), None, "once");
        assert_eq!(next_status(None, None, true), None);
    }

    #[test]
    fn settled_needs_a_current_status_every_pod_updated_and_ready_and_no_step_left() {
        use k8s_openapi::api::apps::v1::StatefulSetStatus;
        let mut sts = sts_of(&Broker::test().replicas(3));
        sts.metadata.generation = Some(2);
        let status = |observed, updated, ready| StatefulSetStatus {
            observed_generation: Some(observed),
            updated_replicas: Some(updated),
            ready_replicas: Some(ready),
            replicas: 3,
            ..StatefulSetStatus::default()
        };
        sts.status = Some(status(2, 3, 3));
        assert!(settled(Some(&sts), false));
        assert!(!settled(Some(&sts), true), "a rollout step left");
        sts.status = Some(status(1, 3, 3));
        assert!(!settled(Some(&sts), false), "about the old spec");
        sts.status = Some(status(2, 2, 3));
        assert!(!settled(Some(&sts), false));
        sts.status = Some(status(2, 3, 2));
        assert!(!settled(Some(&sts), false));
        assert!(!settled(None, false));
    }
}
