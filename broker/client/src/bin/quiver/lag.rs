//! `quiver lag`: lag per group, topic and queue, once or refreshed.

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;
use quiver_client::{Admin, ClientConfig, QueueLag};

use crate::table::{optional, Table};
use crate::{LagArgs, Output};

/// Per-queue lag, and per group and topic the total (table) or one JSON row per queue.
fn print_lag(lags: &[QueueLag], output: Output, watch: bool) -> anyhow::Result<()> {
    match output {
        Output::Json => {
            let rows: Vec<serde_json::Value> = lags
                .iter()
                .map(|lag| {
                    serde_json::json!({
                        "group": lag.group,
                        "topic": lag.queue.topic,
                        "broker": lag.queue.broker_name,
                        "queue_id": lag.queue.queue_id,
                        "broker_offset": lag.broker_offset.0,
                        "consumer_offset": lag.consumer_offset.map(|o| o.0),
                        "lag_messages": lag.lag_messages,
                        "lag_seconds": lag.lag_seconds,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string(&rows)?);
        }
        Output::Table => {
            let mut table = Table::new(&[
                "GROUP",
                "TOPIC",
                "BROKER",
                "QUEUE",
                "BROKER_OFFSET",
                "CONSUMER_OFFSET",
                "LAG",
                "LAG_SECONDS",
            ]);
            let mut totals: BTreeMap<(String, String), (u64, bool)> = BTreeMap::new();
            for lag in lags {
                table.row(vec![
                    lag.group.clone(),
                    lag.queue.topic.clone(),
                    lag.queue.broker_name.clone(),
                    lag.queue.queue_id.to_string(),
                    lag.broker_offset.to_string(),
                    optional(lag.consumer_offset),
                    optional(lag.lag_messages),
                    optional(lag.lag_seconds.map(|s| format!("{s:.1}"))),
                ]);
                let total = totals
                    .entry((lag.group.clone(), lag.queue.topic.clone()))
                    .or_default();
                total.0 += lag.lag_messages.unwrap_or(0);
                total.1 |= lag.lag_messages.is_none();
            }
            if watch && std::io::stdout().is_terminal() {
                // Clear the screen so the table refreshes in place.
                print!("\x1b[2J\x1b[H");
            }
            print!("{}", table.render());
            for ((group, topic), (total, has_unknown)) in totals {
                let note = if has_unknown {
                    " (some queues never committed)"
                } else {
                    ""
                };
                println!("total {group}/{topic}: {total}{note}");
            }
        }
    }
    Ok(())
}

pub async fn run(client: ClientConfig, output: Output, args: LagArgs) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    loop {
        let groups = match &args.group {
            Some(group) => vec![group.clone()],
            None => admin.groups().await?,
        };
        let mut lags = Vec::new();
        for group in &groups {
            lags.extend(
                admin
                    .lag(group, args.topic.as_deref())
                    .await
                    .with_context(|| format!("lag of group {group}"))?,
            );
        }
        print_lag(&lags, output, args.watch)?;
        if !args.watch {
            break;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(Duration::from_secs(args.interval_secs.max(1))) => {}
        }
    }
    admin.shutdown().await;
    Ok(())
}
