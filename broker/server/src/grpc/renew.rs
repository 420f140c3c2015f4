//! The loop that keeps `auto_renew` receives invisible while their client is connected: what
//! it renews is kept in `crate::grpc_state` (`Renewals`), renewed here through the POP
//! service.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::broker::{blocking, Broker};
use crate::config::FlushMode;

/// How often messages due for renewal are looked for.
const TICK: Duration = Duration::from_millis(200);

/// Renews due messages every [`TICK`] until `stop` flips.
pub(crate) async fn run(broker: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.wait_for(|stopped| *stopped) => return,
            _ = tick.tick() => {}
        }
        if broker.grpc().renewals.is_empty() {
            continue;
        }
        if broker.config().flush_mode == FlushMode::Async {
            renew_due(&broker, crate::now_ms());
        } else if let Err(error) =
            blocking(&broker, |broker| renew_due(broker, crate::now_ms())).await
        {
            tracing::error!(error = %crate::error::chain(&error), "renewing received messages failed");
        }
    }
}

/// Renews what is due at `now_ms` for clients still connected; forgets the others.
/// Blocking in sync flush mode (each renewal is fsynced).
fn renew_due(broker: &Broker, now_ms: i64) {
    let grpc = broker.grpc();
    grpc.renewals
        .renew_due(&grpc.sessions, now_ms, |group, topic, handle, invisible| {
            broker
                .pop()
                .change_invisible(broker, group, topic, handle, invisible)
        });
}
