//! The comparison table (markdown) and its section of BENCHMARKS.md.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context as _;

use crate::peers::workload::{
    Figure, Measure, ANON_RSS, FSYNC_CEILING, GROUP_COMMIT, MINIMAL_SERVER, PARKED_PULL, STORED_1K,
    STORED_BODY_BYTES,
};

/// "Well under the data size": anonymous RSS at most this share of the 1 KiB bodies stored.
const RSS_SHARE_OF_DATA: f64 = 0.1;

/// What one system's run gave: figures, or why there are none.
pub struct Outcome {
    pub system: &'static str,
    pub figures: Result<Vec<Figure>, String>,
}

fn cell(figure: &Figure) -> String {
    match figure.measure {
        Measure::Throughput { mb_per_sec } => {
            format!("{:.1}k msg/s, {mb_per_sec:.1} MB/s", figure.value / 1e3)
        }
        Measure::LatencyMicros => format!("{:.0} µs", figure.value),
        Measure::BytesPerMessage => format!("{:.0} B", figure.value),
        Measure::MemoryBytes => format!("{:.0} MiB", figure.value / MIB),
        Measure::Count => format!("{:.0}", figure.value),
        Measure::StageMicros { p50, p999 } => {
            format!("{p50:.0} / {:.0} / {p999:.0} µs", figure.value)
        }
        Measure::Percent => format!("{:.0}%", figure.value),
        Measure::MillisPerSecond { mean_us } => {
            format!("{:.1} ms/s ({mean_us:.0} µs each)", figure.value)
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

fn find<'a>(figures: &'a [Figure], workload: &str) -> Option<&'a Figure> {
    figures.iter().find(|figure| figure.workload == workload)
}

/// One markdown table: a row per workload, a column per system, then Quiver/peer ratios
/// (above 1 means Quiver is higher: better for throughput, worse for latency, disk and RSS).
pub fn table(outcomes: &[Outcome]) -> String {
    let quiver = outcomes
        .iter()
        .find(|outcome| outcome.system == "quiver")
        .and_then(|outcome| outcome.figures.as_ref().ok());
    let peers: Vec<&Outcome> = outcomes
        .iter()
        .filter(|outcome| outcome.system != "quiver")
        .collect();
    // Row order: the first system with figures lists every workload.
    let workloads: Vec<String> = outcomes
        .iter()
        .filter_map(|outcome| outcome.figures.as_ref().ok())
        .flat_map(|figures| figures.iter().map(|figure| figure.workload.clone()))
        .fold(Vec::new(), |mut seen, workload| {
            if !seen.contains(&workload) {
                seen.push(workload);
            }
            seen
        });
    let mut out = String::from("| workload |");
    for outcome in outcomes {
        let _ = write!(out, " {} |", outcome.system);
    }
    if quiver.is_some() {
        for peer in &peers {
            let _ = write!(out, " quiver/{} |", peer.system);
        }
    }
    out.push_str("\n|---|");
    let ratio_columns = if quiver.is_some() { peers.len() } else { 0 };
    for _ in 0..outcomes.len() + ratio_columns {
        out.push_str("---:|");
    }
    out.push('\n');
    for workload in &workloads {
        let _ = write!(out, "| {workload} |");
        for outcome in outcomes {
            let text = match &outcome.figures {
                Ok(figures) => find(figures, workload).map_or_else(|| "—".to_owned(), cell),
                Err(_) => "n/a".to_owned(),
            };
            let _ = write!(out, " {text} |");
        }
        if let Some(quiver) = quiver {
            for peer in &peers {
                let ratio = match (&peer.figures, find(quiver, workload)) {
                    (Ok(figures), Some(ours)) => find(figures, workload)
                        .filter(|theirs| theirs.value > 0.0)
                        .map(|theirs| format!("{:.2}x", ours.value / theirs.value)),
                    _ => None,
                };
                let _ = write!(out, " {} |", ratio.as_deref().unwrap_or("—"));
            }
        }
        out.push('\n');
    }
    for outcome in outcomes {
        if let Err(reason) = &outcome.figures {
            let _ = writeln!(out, "\n{}: not available: {reason}", outcome.system);
        }
    }
    out
}

/// The targets next to what this run measured.
/// `size_1k_workloads`: the 1 KiB batched produce workloads (one target row each, labelled by
/// what follows "produce 1024 B, ") and the catch-up consume workload. `stored_goal`: the
/// 1 KiB messages to have stored before the broker's memory counts (1M in a full run).
pub fn targets(
    outcomes: &[Outcome],
    size_1k_workloads: (&[String], &str),
    (p99_row, hog_p99_row): (&str, &str),
    stored_goal: u64,
) -> String {
    let run = RunFigures { outcomes };
    let mut out = String::from("| target | measured | met |\n|---|---:|:---:|\n");
    throughput_targets(&mut out, &run, size_1k_workloads);
    latency_target(&mut out, p99_row, run.quiver(p99_row));
    hog_target(&mut out, &run, hog_p99_row);
    let parked = run.quiver(&format!("{PARKED_PULL}, p99 latency"));
    latency_target(&mut out, "parked pull p99", parked);
    group_commit_target(&mut out, &run);
    rss_target(&mut out, &run, stored_goal);
    out
}

/// One run's outcomes, looked up by system and workload.
struct RunFigures<'a> {
    outcomes: &'a [Outcome],
}

impl RunFigures<'_> {
    fn of(&self, system: &str) -> Option<&[Figure]> {
        self.outcomes
            .iter()
            .find(|outcome| outcome.system == system)
            .and_then(|outcome| outcome.figures.as_deref().ok())
    }

    fn quiver(&self, workload: &str) -> Option<f64> {
        find(self.of("quiver")?, workload).map(|figure| figure.value)
    }

    /// Quiver's figure over the peer's, when both measured it.
    fn ratio(&self, peer: &str, workload: &str) -> Option<f64> {
        let ours = self.quiver(workload)?;
        let theirs = find(self.of(peer)?, workload)?.value;
        (theirs > 0.0).then(|| ours / theirs)
    }
}

/// 1 KiB produce and consume at >= 2x NATS and >= 5x rocketmq-rust.
fn throughput_targets(
    out: &mut String,
    run: &RunFigures<'_>,
    size_1k_workloads: (&[String], &str),
) {
    let (produce, consume) = size_1k_workloads;
    let rows: Vec<(String, &str)> = produce
        .iter()
        .map(|workload| {
            let label = workload
                .strip_prefix("produce 1024 B, ")
                .unwrap_or(workload);
            let label = if produce.len() > 1 {
                format!("produce ({label})")
            } else {
                "produce".to_owned()
            };
            (label, workload.as_str())
        })
        .chain([("consume".to_owned(), consume)])
        .collect();
    for (peer, goal) in [("nats", 2.0), ("rocketmq-rust", 5.0)] {
        for (what, workload) in &rows {
            let measured = run.ratio(peer, workload);
            let _ = writeln!(
                out,
                "| 1 KiB {what} >= {goal}x {peer} | {} | {} |",
                measured.map_or_else(|| "not measured".to_owned(), |r| format!("{r:.2}x")),
                verdict(measured.map(|r| r >= goal))
            );
        }
    }
}

/// A latency at or under 1 ms.
fn latency_target(out: &mut String, target: &str, value: Option<f64>) {
    let _ = writeln!(
        out,
        "| {target} <= 1000 µs | {} | {} |",
        value.map_or_else(
            || "not measured".to_owned(),
            |v| format!("{v:.0} µs ({:.2}x the target)", v / 1000.0)
        ),
        verdict(value.map(|v| v <= 1000.0))
    );
}

/// Under the CPU hog, Quiver's end-to-end p99 no worse than the better of NATS and Redis.
fn hog_target(out: &mut String, run: &RunFigures<'_>, row: &str) {
    let peer = |system: &str| run.of(system).and_then(|f| find(f, row)).map(|f| f.value);
    let best_peer = [("nats", peer("nats")), ("redis", peer("redis"))]
        .into_iter()
        .filter_map(|(system, value)| value.map(|value| (system, value)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let measured = match (run.quiver(row), best_peer) {
        (Some(ours), Some((system, theirs))) => {
            format!(
                "{ours:.0} µs against {system}'s {theirs:.0} µs ({:.2}x)",
                ours / theirs
            )
        }
        (Some(ours), None) => format!("{ours:.0} µs; nats and redis not measured"),
        _ => "not measured".to_owned(),
    };
    let met = run
        .quiver(row)
        .zip(best_peer)
        .map(|(ours, (_, theirs))| ours <= theirs);
    let _ = writeln!(
        out,
        "| {row} <= the better of nats and redis | {measured} | {} |",
        verdict(met)
    );
}

/// Sync group commit at >= 50% of what the file system's fsync rate allows 16 producers.
fn group_commit_target(out: &mut String, run: &RunFigures<'_>) {
    let (produced, allowed) = (run.quiver(GROUP_COMMIT), run.quiver(FSYNC_CEILING));
    let share = group_commit_share(produced, allowed);
    let simplest = group_commit_share(run.quiver(MINIMAL_SERVER), allowed)
        .map(|share| format!("; the simplest server {:.0}%", share * 100.0))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "| sync group commit >= 50% of fsync rate x 16 | {} | {} |",
        match (share, produced, allowed) {
            (Some(share), Some(produced), Some(allowed)) => format!(
                "{:.0}% ({:.1}k of {:.1}k msg/s{simplest})",
                share * 100.0,
                produced / 1e3,
                allowed / 1e3
            ),
            _ => "not measured (needs --flush sync)".to_owned(),
        },
        verdict(share.map(|s| s >= 0.5))
    );
}

/// The broker's anonymous RSS against the bodies stored, judged only once the goal is stored.
fn rss_target(out: &mut String, run: &RunFigures<'_>, stored_goal: u64) {
    // (1 KiB messages stored, anonymous RSS in bytes).
    let rss = run.quiver(STORED_1K).zip(run.quiver(ANON_RSS));
    let reached = |stored: f64| stored >= stored_goal as f64;
    let measured = rss.map_or_else(
        || "not measured".to_owned(),
        |(stored, anon)| {
            let data = stored * STORED_BODY_BYTES as f64;
            let short = if reached(stored) {
                ""
            } else {
                ", fewer than the goal"
            };
            format!(
                "{:.0} MiB = {:.1}% of {:.0} MiB ({} stored{short})",
                anon / MIB,
                anon / data * 100.0,
                data / MIB,
                count_label(stored as u64)
            )
        },
    );
    let met = rss
        .filter(|(stored, _)| reached(*stored))
        .map(|(stored, anon)| anon <= stored * STORED_BODY_BYTES as f64 * RSS_SHARE_OF_DATA);
    let _ = writeln!(
        out,
        "| broker anonymous RSS with {} 1 KiB messages stored <= {:.0}% of their bodies | {} | {} |",
        count_label(stored_goal),
        RSS_SHARE_OF_DATA * 100.0,
        measured,
        verdict(met)
    );
}

/// A message count as people write it: 1M, 250k, 812.
fn count_label(count: u64) -> String {
    match count {
        n if n >= 1_000_000 && n % 10_000 == 0 => format!("{}M", n as f64 / 1e6),
        n if n >= 1_000_000 => format!("{:.2}M", n as f64 / 1e6),
        n if n >= 10_000 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

/// Group-commit throughput as a share of what the fsync ceiling allows (None when either
/// was not measured or the ceiling is zero).
fn group_commit_share(produced: Option<f64>, allowed: Option<f64>) -> Option<f64> {
    let (produced, allowed) = (produced?, allowed?);
    (allowed > 0.0).then(|| produced / allowed)
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "yes",
        Some(false) => "no",
        None => "—",
    }
}

/// Replaces the generated block `key` (one per flush mode) of the "## Peers" section of
/// `path`, between its markers; a new block goes at the end of the section (the file's end
/// when the section is not there yet). Hand-written text outside the markers is kept.
pub fn write_section(path: &Path, key: &str, generated: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let begin_marker = format!("<!-- peers-table:{key}:begin -->");
    let end_marker = format!("<!-- peers-table:{key}:end -->");
    let block = format!("{begin_marker}\n{generated}\n{end_marker}");
    let updated = match (text.find(&begin_marker), text.find(&end_marker)) {
        (Some(begin), Some(end)) if begin < end => format!(
            "{}{block}{}",
            &text[..begin],
            &text[end + end_marker.len()..]
        ),
        _ => match text.find("\n## Peers\n") {
            Some(section) => {
                // The section runs to the next level-2 heading or the end of the file.
                let body = section + "\n## Peers\n".len();
                let end = text[body..].find("\n## ").map_or(text.len(), |i| body + i);
                format!("{}\n\n{block}\n{}", text[..end].trim_end(), &text[end..])
            }
            None => format!("{}\n\n## Peers\n\n{block}\n", text.trim_end()),
        },
    };
    std::fs::write(path, updated).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn throughput(workload: &str, value: f64) -> Figure {
        Figure {
            workload: workload.into(),
            value,
            measure: Measure::Throughput {
                mb_per_sec: value / 1e3,
            },
        }
    }

    #[test]
    fn table_has_a_ratio_column_per_peer_and_names_unavailable_systems() {
        let outcomes = [
            Outcome {
                system: "quiver",
                figures: Ok(vec![throughput("produce", 300_000.0)]),
            },
            Outcome {
                system: "nats",
                figures: Ok(vec![throughput("produce", 100_000.0)]),
            },
            Outcome {
                system: "redis",
                figures: Err("redis-server is not installed".into()),
            },
        ];
        let table = table(&outcomes);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "| workload | quiver | nats | redis | quiver/nats | quiver/redis |"
        );
        assert_eq!(
            lines[2],
            "| produce | 300.0k msg/s, 300.0 MB/s | 100.0k msg/s, 100.0 MB/s | n/a | 3.00x | — |"
        );
        assert!(table.contains("redis: not available: redis-server is not installed"));
    }

    #[test]
    fn targets_compare_quiver_to_the_goal_ratio() {
        let outcomes = [
            Outcome {
                system: "quiver",
                figures: Ok(vec![throughput("p", 150.0), throughput("c", 500.0)]),
            },
            Outcome {
                system: "nats",
                figures: Ok(vec![throughput("p", 100.0), throughput("c", 100.0)]),
            },
        ];
        let text = targets(
            &outcomes,
            (&["p".to_owned()], "c"),
            ("e2e", "e2e hog"),
            1_000_000,
        );
        assert!(text.contains("| 1 KiB produce >= 2x nats | 1.50x | no |"));
        assert!(text.contains("| 1 KiB consume >= 2x nats | 5.00x | yes |"));
        assert!(text.contains("| 1 KiB produce >= 5x rocketmq-rust | not measured | — |"));
        assert!(text.contains("| parked pull p99 <= 1000 µs | not measured | — |"));
        assert!(text.contains(
            "| sync group commit >= 50% of fsync rate x 16 | not measured (needs --flush sync) | — |"
        ));
    }

    #[test]
    fn targets_have_one_produce_row_per_producer_count() {
        let one = "produce 1024 B, 1 producer(s), batch 128".to_owned();
        let four = "produce 1024 B, 4 producer(s), batch 128".to_owned();
        let outcomes = [
            Outcome {
                system: "quiver",
                figures: Ok(vec![throughput(&one, 300.0), throughput(&four, 300.0)]),
            },
            Outcome {
                system: "nats",
                figures: Ok(vec![throughput(&one, 100.0), throughput(&four, 200.0)]),
            },
        ];
        let text = targets(
            &outcomes,
            (&[one, four], "c"),
            ("e2e", "e2e hog"),
            1_000_000,
        );
        assert!(
            text.contains("| 1 KiB produce (1 producer(s), batch 128) >= 2x nats | 3.00x | yes |")
        );
        assert!(
            text.contains("| 1 KiB produce (4 producer(s), batch 128) >= 2x nats | 1.50x | no |")
        );
    }

    #[test]
    fn targets_rate_parked_pull_p99_and_group_commit_share() {
        let latency = |workload: String, value: f64| Figure {
            workload,
            value,
            measure: Measure::LatencyMicros,
        };
        let outcomes = [Outcome {
            system: "quiver",
            figures: Ok(vec![
                latency(format!("{PARKED_PULL}, p50 latency"), 2500.0),
                latency(format!("{PARKED_PULL}, p99 latency"), 640.0),
                throughput(GROUP_COMMIT, 6_000.0),
                throughput(FSYNC_CEILING, 16_000.0),
            ]),
        }];
        let text = targets(
            &outcomes,
            (&["p".to_owned()], "c"),
            ("e2e", "e2e hog"),
            1_000_000,
        );
        assert!(text.contains("| parked pull p99 <= 1000 µs | 640 µs (0.64x the target) | yes |"));
        assert!(text.contains(
            "| sync group commit >= 50% of fsync rate x 16 | 38% (6.0k of 16.0k msg/s) | no |"
        ));
        // With the simplest server measured beside it, its share is shown too.
        let mut with_simplest = outcomes;
        if let Ok(figures) = &mut with_simplest[0].figures {
            figures.push(throughput(MINIMAL_SERVER, 12_000.0));
        }
        let text = targets(
            &with_simplest,
            (&["p".to_owned()], "c"),
            ("e2e", "e2e hog"),
            1_000_000,
        );
        assert!(text.contains(
            "| sync group commit >= 50% of fsync rate x 16 | 38% (6.0k of 16.0k msg/s; the simplest server 75%) | no |"
        ));
    }

    #[test]
    fn under_the_hog_quiver_is_rated_against_the_better_of_nats_and_redis() {
        let p99 = |system: &'static str, micros: f64| Outcome {
            system,
            figures: Ok(vec![Figure {
                workload: "e2e hog".into(),
                value: micros,
                measure: Measure::LatencyMicros,
            }]),
        };
        let row = |outcomes: &[Outcome]| {
            targets(outcomes, (&["p".to_owned()], "c"), ("e2e", "e2e hog"), 1)
                .lines()
                .find(|line| line.starts_with("| e2e hog <="))
                .expect("a hog row")
                .to_owned()
        };
        let beaten = [
            p99("quiver", 900.0),
            p99("nats", 2000.0),
            p99("redis", 800.0),
        ];
        assert_eq!(
            row(&beaten),
            "| e2e hog <= the better of nats and redis | 900 µs against redis's 800 µs (1.12x) | no |"
        );
        let met = [
            p99("quiver", 700.0),
            p99("nats", 2000.0),
            p99("redis", 800.0),
        ];
        assert!(row(&met).ends_with("(0.88x) | yes |"), "{}", row(&met));
        let alone = [p99("quiver", 700.0)];
        assert_eq!(
            row(&alone),
            "| e2e hog <= the better of nats and redis | 700 µs; nats and redis not measured | — |"
        );
    }

    #[test]
    fn targets_rate_anonymous_rss_against_the_stored_bodies() {
        let figure = |workload: &str, value: f64, measure| Figure {
            workload: workload.into(),
            value,
            measure,
        };
        let outcomes = |stored: f64, anon_mib: f64| {
            [Outcome {
                system: "quiver",
                figures: Ok(vec![
                    figure(STORED_1K, stored, Measure::Count),
                    figure(ANON_RSS, anon_mib * MIB, Measure::MemoryBytes),
                ]),
            }]
        };
        let row = |outcomes: &[Outcome], goal| {
            targets(outcomes, (&["p".to_owned()], "c"), ("e2e", "e2e hog"), goal)
                .lines()
                .find(|line| line.contains("anonymous RSS"))
                .expect("an RSS row")
                .to_owned()
        };
        assert_eq!(
            row(&outcomes(1_024_000.0, 16.0), 1_000_000),
            "| broker anonymous RSS with 1M 1 KiB messages stored <= 10% of their bodies \
             | 16 MiB = 1.6% of 1000 MiB (1.02M stored) | yes |"
        );
        assert!(row(&outcomes(1_024_000.0, 120.0), 1_000_000).ends_with("| no |"));
        // Fewer stored than the goal (a slow system, a short run): measured, not judged.
        assert!(row(&outcomes(512_000.0, 16.0), 1_000_000)
            .ends_with("(512k stored, fewer than the goal) | — |"));
        assert!(row(&[], 1_000_000).ends_with("| not measured | — |"));
    }

    #[test]
    fn count_labels_read_as_people_write_them() {
        assert_eq!(count_label(1_000_000), "1M");
        assert_eq!(count_label(1_200_000), "1.2M");
        assert_eq!(count_label(1_234_567), "1.23M");
        assert_eq!(count_label(250_000), "250k");
        assert_eq!(count_label(812), "812");
    }

    #[test]
    fn group_commit_share_needs_both_figures_and_a_ceiling() {
        assert_eq!(group_commit_share(Some(8.0), Some(16.0)), Some(0.5));
        assert_eq!(group_commit_share(Some(8.0), None), None);
        assert_eq!(group_commit_share(None, Some(16.0)), None);
        assert_eq!(group_commit_share(Some(8.0), Some(0.0)), None);
    }

    #[test]
    fn write_section_appends_once_then_replaces_between_markers() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("BENCHMARKS.md");
        std::fs::write(&path, "# Benchmarks\n\n## Store\n\nfigures\n").expect("write");
        write_section(&path, "async", "first").expect("append");
        let appended = std::fs::read_to_string(&path).expect("read");
        assert!(appended.starts_with("# Benchmarks\n\n## Store\n\nfigures\n\n## Peers\n"));
        assert!(appended.contains("first"));
        // Notes written after the generated block survive the next run.
        std::fs::write(&path, format!("{appended}\nhand-written notes\n")).expect("write");
        write_section(&path, "async", "second").expect("replace");
        let replaced = std::fs::read_to_string(&path).expect("read");
        assert!(!replaced.contains("first"));
        assert!(replaced.contains("second"));
        assert!(replaced.contains("hand-written notes"));
        assert_eq!(replaced.matches("## Peers").count(), 1);
        // Another flush mode gets its own block, inside the same section.
        write_section(&path, "sync", "third").expect("add");
        let both = std::fs::read_to_string(&path).expect("read");
        assert!(both.contains("second") && both.contains("third"));
        assert_eq!(both.matches("## Peers").count(), 1);
    }
}
