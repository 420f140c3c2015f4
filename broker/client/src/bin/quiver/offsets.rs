//! `quiver offsets reset`: move a group's committed offsets on a topic.

use anyhow::Context;
use quiver_client::{Admin, ClientConfig, ResetTarget};

use crate::table::Table;
use crate::{print_json, Output};

pub async fn reset(
    client: ClientConfig,
    output: Output,
    group: &str,
    topic: &str,
    to: ResetTarget,
) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    let moved = admin
        .reset_offsets(group, topic, to)
        .await
        .with_context(|| format!("resetting {group} on {topic}"))?;
    match output {
        Output::Json => print_json(
            &moved
                .iter()
                .map(|(q, o)| serde_json::json!({ "broker": q.broker_name, "queue_id": q.queue_id, "offset": o.0 }))
                .collect::<Vec<_>>(),
        )?,
        Output::Table => {
            let mut table = Table::new(&["BROKER", "QUEUE", "NEW_OFFSET"]);
            for (queue, offset) in &moved {
                table.row(vec![queue.broker_name.clone(), queue.queue_id.to_string(), offset.to_string()]);
            }
            print!("{}", table.render());
        }
    }
    admin.shutdown().await;
    Ok(())
}
