//! `quiver cluster`: the brokers of the cluster and their state.

use quiver_client::{Admin, BrokerState, ClientConfig};

use crate::table::{optional, Table};
use crate::{print_json, Output};

pub async fn run(client: ClientConfig, output: Output) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    let brokers = admin.brokers().await?;
    match output {
        Output::Json => print_json(&brokers)?,
        Output::Table => {
            let mut table =
                Table::new(&["CLUSTER", "BROKER", "ADDRESS", "STATE", "PERM", "RTT_MS"]);
            for broker in brokers {
                let (state, perm, rtt) = match &broker.state {
                    BrokerState::Up {
                        round_trip_ms,
                        permission,
                    } => (
                        "up".to_owned(),
                        optional(*permission),
                        format!("{round_trip_ms:.1}"),
                    ),
                    BrokerState::Unreachable { error } => {
                        (format!("unreachable: {error}"), "-".into(), "-".into())
                    }
                };
                table.row(vec![
                    broker.cluster,
                    broker.broker_name,
                    broker.addr,
                    state,
                    perm,
                    rtt,
                ]);
            }
            print!("{}", table.render());
        }
    }
    admin.shutdown().await;
    Ok(())
}
