//! `quiver topics`: list, create, routes and consumers of topics.

use quiver_client::{Admin, ClientConfig, TopicRoute, TopicSpec};

use crate::table::Table;
use crate::{print_json, Output, TopicsCommand};

pub async fn run(
    client: ClientConfig,
    output: Output,
    command: TopicsCommand,
) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    match command {
        TopicsCommand::List => {
            let topics = admin.topics().await?;
            match output {
                Output::Json => print_json(&topics)?,
                Output::Table => {
                    let mut table = Table::new(&["TOPIC", "READ_QUEUES", "WRITE_QUEUES", "PERM"]);
                    for t in topics {
                        table.row(vec![
                            t.name,
                            t.read_queue_nums.to_string(),
                            t.write_queue_nums.to_string(),
                            t.perm.to_string(),
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        TopicsCommand::Create { name, queues, perm } => {
            let spec = TopicSpec {
                perm,
                ..TopicSpec::new(name, queues)
            };
            let brokers = admin.create_topic(&spec).await?;
            match output {
                Output::Json => {
                    print_json(&serde_json::json!({ "topic": spec, "brokers": brokers }))?
                }
                Output::Table => println!(
                    "topic {} created on {} broker(s): {}",
                    spec.name,
                    brokers.len(),
                    brokers.join(", ")
                ),
            }
        }
        TopicsCommand::Route { name } => print_route(&*admin.route(&name).await?, output)?,
        TopicsCommand::Consumers { name } => {
            let mut groups = std::collections::BTreeSet::new();
            for addr in admin.broker_addrs().await? {
                groups.extend(admin.consumed_by_at(&addr, &name).await?);
            }
            match output {
                Output::Json => print_json(&groups)?,
                Output::Table => {
                    let mut table = Table::new(&["GROUP"]);
                    for group in groups {
                        table.row(vec![group]);
                    }
                    print!("{}", table.render());
                }
            }
        }
    }
    admin.shutdown().await;
    Ok(())
}

/// A topic's route: brokers and their queue counts.
fn print_route(route: &TopicRoute, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(&serde_json::json!({
            "topic": route.topic,
            "brokers": route.brokers,
            "read_queues": route.read_queues.iter().map(|q| (q.broker_name.clone(), q.queue_id)).collect::<Vec<_>>(),
            "write_queues": route.write_queues.iter().map(|q| (q.broker_name.clone(), q.queue_id)).collect::<Vec<_>>(),
        }))?,
        Output::Table => {
            let mut table = Table::new(&["BROKER", "ADDRESS", "READ_QUEUES", "WRITE_QUEUES"]);
            for (broker, addr) in &route.brokers {
                let reads = route
                    .read_queues
                    .iter()
                    .filter(|q| &q.broker_name == broker)
                    .count();
                let writes = route
                    .write_queues
                    .iter()
                    .filter(|q| &q.broker_name == broker)
                    .count();
                table.row(vec![
                    broker.clone(),
                    addr.clone(),
                    reads.to_string(),
                    writes.to_string(),
                ]);
            }
            print!("{}", table.render());
        }
    }
    Ok(())
}
