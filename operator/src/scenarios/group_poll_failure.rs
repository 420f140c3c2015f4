//! A failed lag poll is visible, not just logged: Ready=False with reason PollFailed and the
//! cause, a Warning event, the lag series dropped and `quiver_lag_poll_success` 0; the poll is
//! retried on the error's backoff, not held until the interval, and the same failure does not
//! rewrite status. Back, lag, series and Ready return.

use super::group_support::{GroupScenario, FIRST_POLL, NEXT_POLL, POLL_SUCCESS};
use super::{addr, eventually, LAG_INTERVAL};
use std::time::Duration;

const BROKER_PATH: &str = "/apis/quiver.io/v1alpha1/namespaces/ns/brokers/qb";

async fn polled_group() -> GroupScenario {
    let scenario = GroupScenario::start().await;
    let stored_at = crate::testapi::sim_clock();
    let admin = &scenario.admin;
    admin.set_queue(
        &addr(0),
        "billing",
        ("orders", 0),
        100,
        Some(90),
        Some(stored_at),
    );
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    scenario.create_group(|_| {});
    eventually(FIRST_POLL, || scenario.polled()).await;
    let metrics = scenario.metrics();
    assert!(metrics.contains(&format!("{POLL_SUCCESS} 1")), "{metrics}");
    assert!(
        metrics.contains("rocketmq_consumer_lag_messages{"),
        "{metrics}"
    );
    scenario
}

fn assert_lag_unknown(scenario: &GroupScenario) {
    let metrics = scenario.metrics();
    assert!(metrics.contains(&format!("{POLL_SUCCESS} 0")), "{metrics}");
    for gone in [
        "rocketmq_consumer_lag_messages{",
        "rocketmq_consumer_lag_latency{",
        "quiver_consumer_queue_lag_messages{",
        "quiver_consumer_group_status{",
        "quiver_consumer_group_stalled{",
    ] {
        assert!(!metrics.contains(gone), "{gone} still exported:\n{metrics}");
    }
}

fn poll_failed(scenario: &GroupScenario) -> bool {
    scenario.condition("Ready") == ("False".into(), "PollFailed".into())
}

#[tokio::test(start_paused = true)]
async fn no_broker_answering_is_a_condition_an_event_and_no_lag_series() {
    let scenario = polled_group().await;
    scenario.admin.make_unreachable(&addr(0));
    scenario.admin.make_unreachable(&addr(1));

    eventually(NEXT_POLL, || poll_failed(&scenario)).await;
    let ready = scenario.message("Ready");
    assert!(
        ready.contains("reaching any broker") && ready.contains("unreachable"),
        "{ready}"
    );
    for type_ in ["Lagging", "Consuming", "Stalled"] {
        assert_eq!(
            scenario.condition(type_),
            ("Unknown".into(), "PollFailed".into())
        );
    }
    let status = scenario.status();
    assert_eq!(status.total_lag, None, "unknown, not the last value");
    assert!(
        status.lag_window.is_some(),
        "the judgement's memory is kept"
    );
    scenario.event("PollFailed", "Warning");
    assert_lag_unknown(&scenario);

    // Retried on the backoff (5 s, then 10 s), well before the interval; the same failure
    // writes nothing new.
    let (writes, polls) = (scenario.status_writes(), scenario.polls());
    let retried = eventually(LAG_INTERVAL, || scenario.polls() > polls).await;
    assert!(
        retried < Duration::from_secs(10),
        "retried after {retried:?}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(scenario.polls() >= polls + 2, "retried again");
    assert_eq!(scenario.status_writes(), writes, "nothing new to write");
    assert_lag_unknown(&scenario);

    // Back: lag, series and Ready return at the next retry.
    scenario.admin.make_reachable(&addr(0));
    scenario.admin.make_reachable(&addr(1));
    eventually(Duration::from_secs(60), || {
        scenario.condition("Ready").0 == "True"
    })
    .await;
    assert_eq!(scenario.status().total_lag, Some(10));
    let metrics = scenario.metrics();
    assert!(metrics.contains(&format!("{POLL_SUCCESS} 1")), "{metrics}");
    assert!(
        metrics.contains("rocketmq_consumer_lag_messages{"),
        "{metrics}"
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn an_api_error_reading_the_broker_is_surfaced_the_same_way() {
    let scenario = polled_group().await;
    scenario
        .server
        .fail_next(http::Method::GET, BROKER_PATH, 1, 500);
    eventually(NEXT_POLL, || poll_failed(&scenario)).await;
    let ready = scenario.message("Ready");
    assert!(ready.contains("reading Broker qb"), "{ready}");
    scenario.event("PollFailed", "Warning");
    assert_lag_unknown(&scenario);

    // One failure only: the backoff retry polls and recovers, before the interval.
    eventually(Duration::from_secs(12), || {
        scenario.condition("Ready").0 == "True"
    })
    .await;
    assert!(scenario.metrics().contains(&format!("{POLL_SUCCESS} 1")));
    scenario.stop().await;
}
