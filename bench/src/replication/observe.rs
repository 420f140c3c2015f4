//! What the bench reads off the brokers: each member's replication metrics (its /metrics)
//! and the CPU time each process used.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// CPU seconds used by the members and the bench at one moment.
#[derive(Clone, Debug)]
pub struct Cpu {
    pub members: Vec<(u64, f64)>,
    pub client: f64,
    pub at: Instant,
}

impl Cpu {
    /// Cores each used between `before` and `self`: "member 0 0.92, member 1 0.41, ...,
    /// client 0.35 cores" (`master` marked).
    pub fn cores_since(&self, before: &Cpu, master: Option<u64>) -> String {
        let wall = self.at.duration_since(before.at).as_secs_f64().max(1e-9);
        let mut parts: Vec<String> = self
            .members
            .iter()
            .filter_map(|(id, now)| {
                let (_, then) = before.members.iter().find(|(other, _)| other == id)?;
                let mark = if Some(*id) == master { " (master)" } else { "" };
                Some(format!("member {id}{mark} {:.2}", (now - then) / wall))
            })
            .collect();
        parts.push(format!(
            "client {:.2}",
            (self.client - before.client) / wall
        ));
        format!("{} cores", parts.join(", "))
    }
}

/// utime + stime of a `/proc/<pid>/stat`, in seconds.
pub(super) fn cpu_seconds(stat_path: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((utime + stime) / ticks)
}

/// What one member's /metrics says of its replication.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub is_master: bool,
    pub in_sync: Option<u64>,
    pub epoch: Option<u64>,
    /// It leads its group's consensus (`quiver_replication_consensus_leader`).
    pub leads_consensus: bool,
    /// On the master: (replica id, lag bytes, lag seconds) per replica.
    pub lag: Vec<(String, f64, f64)>,
}

impl Metrics {
    pub async fn read(http: SocketAddr) -> anyhow::Result<Metrics> {
        let text = http_get(http, "/metrics").await?;
        Ok(Metrics::parse(&text))
    }

    fn parse(text: &str) -> Metrics {
        let mut metrics = Metrics::default();
        let mut lag_bytes = Vec::new();
        let mut lag_seconds = Vec::new();
        for (name, labels, value) in text.lines().filter_map(sample) {
            match name {
                "quiver_replication_role" if label(&labels, "role") == Some("master") => {
                    metrics.is_master = value == 1.0;
                }
                "quiver_replication_in_sync_replicas" => metrics.in_sync = Some(value as u64),
                "quiver_replication_epoch" => metrics.epoch = Some(value as u64),
                "quiver_replication_consensus_leader" => metrics.leads_consensus = value == 1.0,
                "quiver_replication_lag_bytes" => {
                    lag_bytes.push((label(&labels, "replica_id").unwrap_or("").to_owned(), value));
                }
                "quiver_replication_lag_seconds" => {
                    let id = label(&labels, "replica_id").unwrap_or("").to_owned();
                    lag_seconds.push((id, value));
                }
                _ => {}
            }
        }
        metrics.lag = lag_bytes
            .into_iter()
            .map(|(id, bytes)| {
                let seconds = lag_seconds
                    .iter()
                    .find(|(other, _)| *other == id)
                    .map_or(0.0, |(_, s)| *s);
                (id, bytes, seconds)
            })
            .collect();
        metrics
    }
}

/// A sample's labels: (key, value) pairs.
type Labels<'a> = Vec<(&'a str, &'a str)>;

/// One sample line of the text exposition: (name, labels, value); None for comments.
fn sample(line: &str) -> Option<(&str, Labels<'_>, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let value = value.parse().ok()?;
    let (name, labels) = match series.split_once('{') {
        Some((name, rest)) => {
            let labels = rest
                .trim_end_matches('}')
                .split(',')
                .filter_map(|pair| {
                    let (key, value) = pair.split_once('=')?;
                    Some((key, value.trim_matches('"')))
                })
                .collect();
            (name, labels)
        }
        None => (series, Vec::new()),
    };
    Some((name, labels, value))
}

fn label<'a>(labels: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    labels.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// GET `path` on `http` (1 s bound); the body of a 2xx answer.
pub async fn http_get(http: SocketAddr, path: &str) -> anyhow::Result<String> {
    let fetch = async {
        let (status, body) = crate::http::get(http, path).await?;
        if !status.is_success() {
            bail!("{path} on {http} answered {status}");
        }
        Ok(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(1), fetch)
        .await
        .with_context(|| format!("{path} on {http}: no answer within 1 s"))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::group::agreed_master;

    #[test]
    fn metrics_of_a_master_and_its_replicas_lag() {
        let text = "# HELP quiver_replication_role x\n\
            quiver_replication_role{cluster=\"DefaultCluster\",role=\"master\"} 1\n\
            quiver_replication_role{cluster=\"DefaultCluster\",role=\"replica\"} 0\n\
            quiver_replication_epoch{cluster=\"DefaultCluster\"} 3\n\
            quiver_replication_in_sync_replicas{cluster=\"DefaultCluster\"} 3\n\
            quiver_replication_lag_bytes{cluster=\"DefaultCluster\",replica_id=\"1\"} 2048\n\
            quiver_replication_lag_bytes{cluster=\"DefaultCluster\",replica_id=\"2\"} 0\n\
            quiver_replication_lag_seconds{cluster=\"DefaultCluster\",replica_id=\"1\"} 0.004\n\
            quiver_replication_lag_seconds{cluster=\"DefaultCluster\",replica_id=\"2\"} 0.0\n\
            quiver_replication_consensus_leader{cluster=\"DefaultCluster\"} 1\n";
        let metrics = Metrics::parse(text);
        assert!(metrics.is_master);
        assert!(metrics.leads_consensus);
        assert_eq!(metrics.in_sync, Some(3));
        assert_eq!(metrics.epoch, Some(3));
        assert_eq!(
            metrics.lag,
            vec![("1".into(), 2048.0, 0.004), ("2".into(), 0.0, 0.0)]
        );
        // Two members, both in sync.
        let metrics = Metrics {
            in_sync: Some(2),
            ..metrics
        };
        let stale = Metrics {
            epoch: Some(2),
            ..metrics.clone()
        };
        let agreed = [
            (0, metrics.clone()),
            (
                1,
                Metrics {
                    is_master: false,
                    ..metrics.clone()
                },
            ),
        ];
        assert_eq!(agreed_master(&agreed, 2), Some((0, 3)));
        assert_eq!(agreed_master(&agreed, 3), None, "a member did not answer");
        let restarted = [(0, metrics.clone()), (1, stale)];
        assert_eq!(
            agreed_master(&restarted, 2),
            None,
            "two masters, two epochs"
        );
        let replica = Metrics::parse("quiver_replication_role{cluster=\"c\",role=\"master\"} 0\n");
        assert!(!replica.is_master);
    }
}
