//! `quiver replication`: the broker group of a broker (roles, epoch, in-sync set, lag), a
//! switchover of its mastership, and changes of its membership.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Subcommand;
use quiver_client::admin::{standalone_status, MembershipChange};
use quiver_client::{Admin, ClientConfig};
use quiver_protocol::body::{ReplicaRole, ReplicationStatus};

use crate::table::Table;
use crate::{print_json, Output};

#[derive(Subcommand, Debug)]
pub enum ReplicationCommand {
    /// The broker group of the broker at --server, as that member sees it: master, epoch,
    /// in-sync set and each member's role and lag.
    Status,
    /// Move the mastership of the group of the broker at --server to another member, then
    /// print the group as the new master sees it.
    Switchover {
        /// Replica id of the member to become master (in sync with the master).
        #[arg(long = "to")]
        to: u64,
        /// How long the master may pause sends while the target catches up, in milliseconds.
        #[arg(long, default_value_t = 10_000)]
        wait_ms: u64,
    },
    /// Change the members of the group of the broker at --server (any member: it forwards
    /// to the group's consensus leader), then print the membership after the change.
    Members {
        #[command(subcommand)]
        change: MembersCommand,
        /// How long the change may take (a new member catching up included), in
        /// milliseconds.
        #[arg(long, global = true, default_value_t = 60_000)]
        wait_ms: u64,
    },
}

#[derive(Subcommand, Debug)]
pub enum MembersCommand {
    /// Add a member. Start it first with an empty data directory and --group-members
    /// listing the group's members and itself; it joins once added, then catches up.
    Add {
        /// Replica id of the new member.
        #[arg(long)]
        id: u64,
        /// Its remoting address (host:port), as the other members reach it.
        #[arg(long)]
        address: String,
    },
    /// Remove a member (mastership is switched to another in-sync member first).
    Remove {
        /// Replica id of the member to remove.
        #[arg(long)]
        id: u64,
    },
    /// Add a new member, then remove an old one.
    Replace {
        /// Replica id of the member to remove.
        #[arg(long)]
        id: u64,
        /// Replica id of the member that takes its place.
        #[arg(long)]
        new_id: u64,
        /// The new member's remoting address (host:port).
        #[arg(long)]
        address: String,
    },
}

impl MembersCommand {
    fn change(self) -> MembershipChange {
        match self {
            MembersCommand::Add { id, address } => MembershipChange::Add { id, address },
            MembersCommand::Remove { id } => MembershipChange::Remove { id },
            MembersCommand::Replace {
                id,
                new_id,
                address,
            } => MembershipChange::Replace {
                old: id,
                new: new_id,
                address,
            },
        }
    }
}

pub async fn run(
    client: ClientConfig,
    output: Output,
    command: ReplicationCommand,
) -> anyhow::Result<()> {
    let Some(addr) = client.name_servers.first().cloned() else {
        bail!("--server names no broker");
    };
    let admin = Admin::new(client);
    let result = match command {
        ReplicationCommand::Status => status(&admin, &addr).await,
        ReplicationCommand::Switchover { to, wait_ms } => {
            switchover(&admin, &addr, to, Duration::from_millis(wait_ms)).await
        }
        ReplicationCommand::Members { change, wait_ms } => {
            let change = change.change();
            let changed = admin
                .replication_members_at(&addr, &change, Duration::from_millis(wait_ms))
                .await
                .with_context(|| format!("{change:?} through {addr}"));
            admin.shutdown().await;
            return print_members(&changed?, output);
        }
    };
    admin.shutdown().await;
    print(&result?, output)
}

/// The group as the member at `addr` sees it; a broker without replication is a group of one.
async fn status(admin: &Admin, addr: &str) -> anyhow::Result<ReplicationStatus> {
    match admin.replication_status_at(addr).await {
        Ok(status) => Ok(status),
        Err(error) if error.is_unsupported() => Ok(standalone_status("", addr)),
        Err(error) => Err(error).context(format!("asking {addr} for its replication status")),
    }
}

/// Sends the switchover to the group's master and returns the group as the new master sees it.
async fn switchover(
    admin: &Admin,
    addr: &str,
    target: u64,
    wait: Duration,
) -> anyhow::Result<ReplicationStatus> {
    let before = status(admin, addr).await?;
    let plan = plan_switchover(&before, target)?;
    let Switchover::Send { master, target } = plan else {
        return Ok(before);
    };
    admin
        .switchover_at(&master, target.0, wait)
        .await
        .with_context(|| {
            format!(
                "switching the mastership from {master} to replica {}",
                target.0
            )
        })?;
    status(admin, &target.1).await
}

/// What a switchover to `target` needs, from the group's status.
#[derive(Debug, PartialEq, Eq)]
enum Switchover {
    /// The target is already the master.
    AlreadyMaster,
    /// Send it to the master at this address; the target's (id, address).
    Send {
        master: String,
        target: (u64, String),
    },
}

fn plan_switchover(status: &ReplicationStatus, target: u64) -> anyhow::Result<Switchover> {
    let Some(member) = status.replicas.iter().find(|r| r.replica_id == target) else {
        let ids: Vec<String> = status
            .replicas
            .iter()
            .map(|r| r.replica_id.to_string())
            .collect();
        bail!(
            "group {} has no replica {target} (members: {})",
            status.broker_name,
            ids.join(", ")
        );
    };
    if status.master_id == Some(target) {
        return Ok(Switchover::AlreadyMaster);
    }
    let Some(master) = status.master_address.clone() else {
        bail!(
            "group {} has no master (epoch {}): nothing to switch over from",
            status.broker_name,
            status.epoch
        );
    };
    Ok(Switchover::Send {
        master,
        target: (target, member.address.clone()),
    })
}

fn print(status: &ReplicationStatus, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(status),
        Output::Table => {
            print!("{}", render(status));
            Ok(())
        }
    }
}

/// The membership after a change: JSON `{"members":{"id":"address"}}`, or one row per
/// member.
fn print_members(members: &BTreeMap<u64, String>, output: Output) -> anyhow::Result<()> {
    match output {
        Output::Json => print_json(&quiver_protocol::body::ReplicationMembers {
            members: members.clone(),
        }),
        Output::Table => {
            let mut table = Table::new(&["MEMBER", "ADDRESS"]);
            for (id, address) in members {
                table.row(vec![id.to_string(), address.clone()]);
            }
            print!("{}", table.render());
            Ok(())
        }
    }
}

/// A summary line of the group, then one row per member.
fn render(status: &ReplicationStatus) -> String {
    let name = if status.broker_name.is_empty() {
        "-"
    } else {
        &status.broker_name
    };
    let master = status
        .master_id
        .map_or_else(|| "none".to_owned(), |id| id.to_string());
    let in_sync: Vec<String> = status.in_sync_replicas.iter().map(u64::to_string).collect();
    let mut out = format!(
        "group {name}  mode {}  epoch {}  master {master}  in-sync [{}] (min {})  {}\n",
        status.mode,
        status.epoch,
        in_sync.join(","),
        status.min_in_sync_replicas,
        if status.writable {
            "writable"
        } else {
            "NOT WRITABLE"
        },
    );
    let mut table = Table::new(&[
        "REPLICA",
        "ADDRESS",
        "ROLE",
        "IN_SYNC",
        "LOG_END",
        "LAG_BYTES",
        "LAG_MS",
    ]);
    for member in &status.replicas {
        let role = match member.role {
            ReplicaRole::Master => "master",
            ReplicaRole::Replica => "replica",
            ReplicaRole::Unknown => "unknown",
        };
        table.row(vec![
            member.replica_id.to_string(),
            member.address.clone(),
            role.to_owned(),
            if member.in_sync { "yes" } else { "no" }.to_owned(),
            member.log_end.to_string(),
            member.lag_bytes.to_string(),
            member.lag_ms.to_string(),
        ]);
    }
    out.push_str(&table.render());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use quiver_protocol::body::ReplicaStatus;

    fn group() -> ReplicationStatus {
        let member = |id: u64, role, in_sync, lag_bytes| ReplicaStatus {
            replica_id: id,
            address: format!("qb-{id}.qb-headless.ns.svc:10911"),
            role,
            in_sync,
            log_end: 4096 - lag_bytes,
            lag_bytes,
            lag_ms: lag_bytes / 8,
        };
        ReplicationStatus {
            broker_name: "qb-0".into(),
            replica_id: 1,
            mode: "sync".into(),
            min_in_sync_replicas: 2,
            epoch: 4,
            master_id: Some(0),
            master_address: Some("qb-0.qb-headless.ns.svc:10911".into()),
            in_sync_replicas: vec![0, 1],
            confirmed_offset: 4096,
            writable: true,
            replicas: vec![
                member(0, ReplicaRole::Master, true, 0),
                member(1, ReplicaRole::Replica, true, 0),
                member(2, ReplicaRole::Replica, false, 800),
            ],
        }
    }

    #[test]
    fn the_table_has_the_group_line_and_a_row_per_member() {
        let text = render(&group());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "group qb-0  mode sync  epoch 4  master 0  in-sync [0,1] (min 2)  writable"
        );
        assert!(lines[1].starts_with("REPLICA  ADDRESS"), "{}", lines[1]);
        let columns: Vec<&str> = lines[4].split_whitespace().collect();
        assert_eq!(
            columns,
            [
                "2",
                "qb-2.qb-headless.ns.svc:10911",
                "replica",
                "no",
                "3296",
                "800",
                "100"
            ]
        );
        assert_eq!(lines.len(), 5);
    }

    #[test]
    fn a_group_without_a_master_says_so() {
        let mut status = group();
        status.master_id = None;
        status.master_address = None;
        status.writable = false;
        assert!(render(&status).starts_with(
            "group qb-0  mode sync  epoch 4  master none  in-sync [0,1] (min 2)  NOT WRITABLE"
        ));
        let error = plan_switchover(&status, 1).unwrap_err().to_string();
        assert!(error.contains("has no master"), "{error}");
    }

    #[test]
    fn a_standalone_broker_is_a_group_of_one_master() {
        let text = render(&standalone_status("", "127.0.0.1:10911"));
        assert!(text.starts_with("group -  mode async  epoch 0  master 0  in-sync [0] (min 1)"));
        let row: Vec<&str> = text
            .lines()
            .nth(2)
            .expect("a row")
            .split_whitespace()
            .collect();
        assert_eq!(
            row,
            ["0", "127.0.0.1:10911", "master", "yes", "0", "0", "0"]
        );
    }

    #[test]
    fn the_switchover_goes_to_the_master_naming_the_target() {
        assert_eq!(
            plan_switchover(&group(), 1).unwrap(),
            Switchover::Send {
                master: "qb-0.qb-headless.ns.svc:10911".into(),
                target: (1, "qb-1.qb-headless.ns.svc:10911".into()),
            }
        );
        assert_eq!(
            plan_switchover(&group(), 0).unwrap(),
            Switchover::AlreadyMaster
        );
        let error = plan_switchover(&group(), 7).unwrap_err().to_string();
        assert!(error.contains("no replica 7 (members: 0, 1, 2)"), "{error}");
    }

    #[test]
    fn the_commands_parse() {
        let cli = crate::Cli::try_parse_from([
            "quiver",
            "--server",
            "b:10911",
            "replication",
            "switchover",
            "--to",
            "2",
        ])
        .expect("parses");
        match cli.command {
            crate::Command::Replication(ReplicationCommand::Switchover { to, wait_ms }) => {
                assert_eq!((to, wait_ms), (2, 10_000));
            }
            other => panic!("{other:?}"),
        }
        let cli =
            crate::Cli::try_parse_from(["quiver", "replication", "status", "--output", "json"])
                .expect("parses");
        assert!(matches!(
            cli.command,
            crate::Command::Replication(ReplicationCommand::Status)
        ));
        assert_eq!(cli.output, Output::Json);
        assert!(crate::Cli::try_parse_from(["quiver", "replication", "switchover"]).is_err());
    }

    #[test]
    fn the_members_commands_parse_into_changes() {
        let parse = |args: &[&str]| {
            let cli =
                crate::Cli::try_parse_from(["quiver", "replication", "members"].iter().chain(args))
                    .expect("parses");
            match cli.command {
                crate::Command::Replication(ReplicationCommand::Members { change, wait_ms }) => {
                    (change.change(), wait_ms)
                }
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            parse(&["add", "--id", "3", "--address", "h:3"]),
            (
                MembershipChange::Add {
                    id: 3,
                    address: "h:3".into()
                },
                60_000
            )
        );
        assert_eq!(
            parse(&["remove", "--id", "3", "--wait-ms", "5000"]),
            (MembershipChange::Remove { id: 3 }, 5000)
        );
        assert_eq!(
            parse(&["replace", "--id", "2", "--new-id", "4", "--address", "h:4"]).0,
            MembershipChange::Replace {
                old: 2,
                new: 4,
                address: "h:4".into()
            }
        );
        assert!(crate::Cli::try_parse_from([
            "quiver",
            "replication",
            "members",
            "add",
            "--id",
            "3"
        ])
        .is_err());
    }
}
