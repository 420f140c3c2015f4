//! `quiver groups`: list and create subscription groups.

use quiver_client::{Admin, ClientConfig};
use quiver_protocol::body::SubscriptionGroupConfig;

use crate::table::Table;
use crate::{print_json, GroupsCommand, Output};

pub async fn run(
    client: ClientConfig,
    output: Output,
    command: GroupsCommand,
) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    match command {
        GroupsCommand::List => {
            let groups = admin.group_configs().await?;
            match output {
                Output::Json => print_json(&groups)?,
                Output::Table => {
                    let mut table = Table::new(&["GROUP", "FIFO", "RETRY_MAX_TIMES", "CONSUME"]);
                    for group in groups {
                        table.row(vec![
                            group.group_name,
                            group.consume_message_orderly.to_string(),
                            group.retry_max_times.to_string(),
                            group.consume_enable.to_string(),
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        GroupsCommand::Create {
            name,
            fifo,
            retry_max_times,
        } => {
            let config = SubscriptionGroupConfig {
                group_name: name,
                consume_message_orderly: fifo,
                retry_max_times,
                ..SubscriptionGroupConfig::default()
            };
            let brokers = admin.upsert_group(&config).await?;
            match output {
                Output::Json => {
                    print_json(&serde_json::json!({ "group": config, "brokers": brokers }))?
                }
                Output::Table => println!(
                    "group {} created on {} broker(s): {}",
                    config.group_name,
                    brokers.len(),
                    brokers.join(", ")
                ),
            }
        }
    }
    admin.shutdown().await;
    Ok(())
}
