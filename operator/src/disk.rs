//! The Broker's `DiskPressure` condition, decided from what each broker reports about its store
//! (GET_BROKER_RUNTIME_INFO). Pure: the controller gathers the reports, this decides.

use crate::admin::{AdminError, RuntimeInfo, REFUSAL_DISK_HIGH_WATER, REFUSAL_NO_SPACE};
use crate::controller::conditions::{Desired, Status};

/// Condition type.
pub const CONDITION: &str = "DiskPressure";
/// Reason: a broker's disk is above its high water (it refuses sends for that).
pub const REASON_ABOVE_HIGH_WATER: &str = "DiskAboveHighWater";
/// Reason: a broker refuses sends for another cause (no space left, failed fsync, read-only
/// file system, data directory gone).
pub const REASON_WRITES_REFUSED: &str = "WritesRefused";
/// Reason: every broker that answered is below its high water and takes writes.
pub const REASON_OK: &str = "DiskOK";
/// Reason: no broker reported its disk.
pub const REASON_UNKNOWN: &str = "DiskUsageUnknown";

/// What asking one broker for its runtime info gave.
#[derive(Clone, Debug, PartialEq)]
pub enum DiskProbe {
    /// The broker answered.
    Reported(RuntimeInfo),
    /// The broker predates GET_BROKER_RUNTIME_INFO (REQUEST_CODE_NOT_SUPPORTED).
    Unsupported,
    /// The broker did not answer usefully (unreachable, timeout, error code, bad body).
    NoAnswer(String),
}

impl DiskProbe {
    /// The probe for the result of a runtime info call.
    pub fn from_result(result: Result<RuntimeInfo, AdminError>) -> DiskProbe {
        match result {
            Ok(info) => DiskProbe::Reported(info),
            Err(error) if error.is_unsupported() => DiskProbe::Unsupported,
            Err(error) => DiskProbe::NoAnswer(error.to_string()),
        }
    }
}

/// One broker (by name, which is also its pod's name) and what it reported.
#[derive(Clone, Debug, PartialEq)]
pub struct BrokerDisk {
    /// Broker and pod name, e.g. `qb-0`.
    pub broker: String,
    /// Its report.
    pub probe: DiskProbe,
}

/// How a broker that answered stands.
enum Standing {
    /// Takes writes, below high water.
    Fine,
    /// At or above high water (refusing sends, or about to).
    AboveHighWater,
    /// Refuses sends for a cause other than high water.
    Refused,
}

/// The DiskPressure condition for the reports of a Broker's brokers.
///
/// True when any broker refuses writes or is above its high water: reason
/// `WritesRefused` when some broker refuses for a cause other than its high water (no space,
/// failed fsync, read-only file system, data directory gone), else `DiskAboveHighWater`.
/// False (`DiskOK`) when at least one broker answered and none of them is under pressure.
/// Unknown when no broker answered (older brokers, unreachable, none running yet).
///
/// `default_high_water` stands in for a broker that does not report its high water;
/// `storage_size` is the Broker's `spec.storage.size`, named in the suggestion.
pub fn disk_pressure(disks: &[BrokerDisk], default_high_water: f64, storage_size: &str) -> Desired {
    let mut tally = Tally::default();
    for disk in disks {
        match &disk.probe {
            DiskProbe::Reported(info) => tally.add_report(&disk.broker, info, default_high_water),
            DiskProbe::Unsupported => tally.silent.push(format!(
                "{} (older broker without GET_BROKER_RUNTIME_INFO)",
                disk.broker
            )),
            DiskProbe::NoAnswer(error) => tally
                .silent
                .push(format!("{} (did not answer: {error})", disk.broker)),
        }
    }
    tally.condition(storage_size)
}

/// The brokers sorted by what their reports say, for the condition's message.
#[derive(Default)]
struct Tally {
    pressed: Vec<String>,
    fine: Vec<String>,
    silent: Vec<String>,
    any_refused_otherwise: bool,
    more_space_helps: bool,
}

impl Tally {
    fn add_report(&mut self, broker: &str, info: &RuntimeInfo, default_high_water: f64) {
        let high_water = info.high_water_ratio.unwrap_or(default_high_water);
        let above = info.disk_used_ratio.is_some_and(|used| used > high_water);
        let refusal = info.write_refusal.as_deref();
        let refused = info.writable == Some(false) || refusal.is_some();
        let standing = match refusal {
            _ if !refused && !above => Standing::Fine,
            Some(reason) if reason != REFUSAL_DISK_HIGH_WATER => Standing::Refused,
            // Refused without a reason counts as high water when the disk says so.
            None if !above => Standing::Refused,
            _ => Standing::AboveHighWater,
        };
        let usage = usage(info, high_water);
        if matches!(standing, Standing::Fine) {
            self.fine.push(format!("{broker}: {usage}"));
            return;
        }
        self.any_refused_otherwise |= matches!(standing, Standing::Refused);
        self.more_space_helps |=
            matches!(standing, Standing::AboveHighWater) || refusal == Some(REFUSAL_NO_SPACE);
        let what = if refused {
            let reason = refusal.unwrap_or("no reason given");
            match &info.write_refusal_message {
                Some(message) => format!("refuses sends ({reason}: {message}), still serves reads"),
                None => format!("refuses sends ({reason}), still serves reads"),
            }
        } else {
            "is above its high water, so it refuses sends".to_string()
        };
        self.pressed.push(format!("{broker}: {usage}, {what}"));
    }

    fn condition(self, storage_size: &str) -> Desired {
        let silent_note = if self.silent.is_empty() {
            String::new()
        } else {
            format!("; unknown on {}", self.silent.join(", "))
        };
        if !self.pressed.is_empty() {
            let advice = if self.more_space_helps {
                format!(
                    "raise spec.storage.size (now {storage_size}): the operator expands each \
                     broker's volume claim in place if the storage class allows volume \
                     expansion; or free space with shorter retention (spec.retention)"
                )
            } else {
                "more space will not help: check the pod's volume and node (kubectl describe \
                 pod, the broker's log)"
                    .to_string()
            };
            let reason = if self.any_refused_otherwise {
                REASON_WRITES_REFUSED
            } else {
                REASON_ABOVE_HIGH_WATER
            };
            let message = format!("{}. To fix: {advice}{silent_note}", self.pressed.join("; "));
            return Desired::new(CONDITION, Status::True, reason, message);
        }
        if !self.fine.is_empty() {
            let message = format!(
                "below high water and writable: {}{silent_note}",
                self.fine.join("; ")
            );
            return Desired::new(CONDITION, Status::False, REASON_OK, message);
        }
        let message = if self.silent.is_empty() {
            "no broker to ask yet".to_string()
        } else {
            format!("no broker reported its disk: {}", self.silent.join(", "))
        };
        Desired::new(CONDITION, Status::Unknown, REASON_UNKNOWN, message)
    }
}

/// "disk 93% used of 90% high water (Total : 48.0 MiB, Free : 3.1 MiB.)".
fn usage(info: &RuntimeInfo, high_water: f64) -> String {
    let used = match info.disk_used_ratio {
        Some(used) => format!("disk {} used", percent(used)),
        None => "disk usage not reported".to_string(),
    };
    let capacity = info
        .disk_capacity
        .as_deref()
        .map(|capacity| format!(" ({capacity})"))
        .unwrap_or_default();
    format!("{used} of {} high water{capacity}", percent(high_water))
}

/// 0.93 -> "93%", 0.899 -> "89.9%".
fn percent(ratio: f64) -> String {
    let percent = ratio * 100.0;
    if (percent - percent.round()).abs() < 0.05 {
        format!("{percent:.0}%")
    } else {
        format!("{percent:.1}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::BrokerAddr;

    fn reported(broker: &str, used: f64, writable: bool, refusal: Option<&str>) -> BrokerDisk {
        BrokerDisk {
            broker: broker.to_string(),
            probe: DiskProbe::Reported(RuntimeInfo {
                disk_used_ratio: Some(used),
                disk_capacity: Some("Total : 48.0 MiB, Free : 3.1 MiB.".to_string()),
                high_water_ratio: Some(0.9),
                writable: Some(writable),
                write_refusal: refusal.map(str::to_string),
                write_refusal_message: refusal.map(|reason| format!("sends refused: {reason}")),
            }),
        }
    }

    fn silent(broker: &str, probe: DiskProbe) -> BrokerDisk {
        BrokerDisk {
            broker: broker.to_string(),
            probe,
        }
    }

    fn decide(disks: &[BrokerDisk]) -> Desired {
        disk_pressure(disks, 0.9, "10Gi")
    }

    #[test]
    fn every_broker_below_high_water_is_false() {
        let condition = decide(&[
            reported("qb-0", 0.42, true, None),
            reported("qb-1", 0.899, true, None),
        ]);
        assert_eq!(
            (condition.type_, condition.status, condition.reason),
            ("DiskPressure", Status::False, REASON_OK)
        );
        assert!(
            condition
                .message
                .contains("qb-0: disk 42% used of 90% high water")
                && condition.message.contains("qb-1: disk 89.9% used"),
            "{}",
            condition.message
        );
    }

    #[test]
    fn a_broker_refusing_sends_above_high_water_is_true_and_suggests_more_storage() {
        let condition = decide(&[
            reported("qb-0", 0.42, true, None),
            reported("qb-1", 0.93, false, Some("disk-high-water")),
        ]);
        assert_eq!(
            (condition.status, condition.reason),
            (Status::True, REASON_ABOVE_HIGH_WATER)
        );
        let message = &condition.message;
        for part in [
            "qb-1: disk 93% used of 90% high water (Total : 48.0 MiB, Free : 3.1 MiB.)",
            "refuses sends (disk-high-water: sends refused: disk-high-water)",
            "still serves reads",
            "raise spec.storage.size (now 10Gi)",
            "expands each broker's volume claim",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
        assert!(!message.contains("qb-0"), "{message}");
        assert_eq!(
            message,
            "qb-1: disk 93% used of 90% high water (Total : 48.0 MiB, Free : 3.1 MiB.), refuses \
             sends (disk-high-water: sends refused: disk-high-water), still serves reads. To fix: \
             raise spec.storage.size (now 10Gi): the operator expands each broker's volume claim \
             in place if the storage class allows volume expansion; or free space with shorter \
             retention (spec.retention)"
        );
    }

    #[test]
    fn above_high_water_without_a_refusal_is_still_pressure() {
        // E.g. between two of the broker's disk checks: usage crossed, the store not yet.
        let condition = decide(&[reported("qb-0", 0.95, true, None)]);
        assert_eq!(
            (condition.status, condition.reason),
            (Status::True, REASON_ABOVE_HIGH_WATER)
        );
        assert!(condition.message.contains("above its high water"));
    }

    #[test]
    fn other_refusal_reasons_are_writes_refused() {
        for reason in ["fsync-failed", "read-only-fs", "data-dir-gone"] {
            let condition = decide(&[
                reported("qb-0", 0.95, false, Some("disk-high-water")),
                reported("qb-1", 0.30, false, Some(reason)),
            ]);
            assert_eq!(
                (condition.status, condition.reason),
                (Status::True, REASON_WRITES_REFUSED),
                "{reason}"
            );
            assert!(
                condition.message.contains("qb-1: disk 30% used"),
                "{}",
                condition.message
            );
            assert!(condition.message.contains(reason), "{}", condition.message);
            // qb-0 is above high water: more space still helps there.
            assert!(condition.message.contains("raise spec.storage.size"));
        }
        let alone = decide(&[reported("qb-0", 0.30, false, Some("read-only-fs"))]);
        assert_eq!(alone.reason, REASON_WRITES_REFUSED);
        assert!(
            alone.message.contains("more space will not help") && !alone.message.contains("raise"),
            "{}",
            alone.message
        );
        let no_space = decide(&[reported("qb-0", 0.80, false, Some("no-space"))]);
        assert_eq!(no_space.reason, REASON_WRITES_REFUSED);
        assert!(no_space.message.contains("raise spec.storage.size"));
    }

    #[test]
    fn no_answer_at_all_is_unknown() {
        let unsupported = decide(&[silent("qb-0", DiskProbe::Unsupported)]);
        assert_eq!(
            (unsupported.status, unsupported.reason),
            (Status::Unknown, REASON_UNKNOWN)
        );
        assert!(
            unsupported
                .message
                .contains("qb-0 (older broker without GET_BROKER_RUNTIME_INFO)"),
            "{}",
            unsupported.message
        );
        let unreachable = decide(&[
            silent("qb-0", DiskProbe::Unsupported),
            silent("qb-1", DiskProbe::NoAnswer("connection refused".into())),
        ]);
        assert_eq!(unreachable.status, Status::Unknown);
        assert!(unreachable
            .message
            .contains("qb-1 (did not answer: connection refused)"));
        assert_eq!(decide(&[]).status, Status::Unknown);
    }

    #[test]
    fn partial_answers_decide_from_the_brokers_that_answered() {
        let ok = decide(&[
            reported("qb-0", 0.5, true, None),
            silent("qb-1", DiskProbe::NoAnswer("timeout".into())),
        ]);
        assert_eq!(ok.status, Status::False);
        assert!(
            ok.message
                .ends_with("; unknown on qb-1 (did not answer: timeout)"),
            "{}",
            ok.message
        );
        let pressed = decide(&[
            silent("qb-0", DiskProbe::Unsupported),
            reported("qb-1", 0.91, false, Some("disk-high-water")),
        ]);
        assert_eq!(pressed.status, Status::True);
    }

    #[test]
    fn the_default_high_water_stands_in_for_an_unreported_one() {
        let apache_like = BrokerDisk {
            broker: "qb-0".into(),
            probe: DiskProbe::Reported(RuntimeInfo {
                disk_used_ratio: Some(0.8),
                ..RuntimeInfo::default()
            }),
        };
        assert_eq!(
            disk_pressure(std::slice::from_ref(&apache_like), 0.9, "10Gi").status,
            Status::False
        );
        let pressed = disk_pressure(&[apache_like], 0.75, "10Gi");
        assert_eq!(pressed.status, Status::True);
        assert!(pressed.message.contains("80% used of 75% high water"));
    }

    #[test]
    fn probes_come_from_admin_results() {
        let unsupported = AdminError::Rejected {
            addr: BrokerAddr("b:1".into()),
            request: "GET_BROKER_RUNTIME_INFO",
            code: 3,
            remark: "not supported".into(),
        };
        assert_eq!(
            DiskProbe::from_result(Err(unsupported)),
            DiskProbe::Unsupported
        );
        let other = AdminError::Rejected {
            addr: BrokerAddr("b:1".into()),
            request: "GET_BROKER_RUNTIME_INFO",
            code: 1,
            remark: "boom".into(),
        };
        assert!(matches!(
            DiskProbe::from_result(Err(other)),
            DiskProbe::NoAnswer(message) if message.contains("code 1")
        ));
        assert_eq!(
            DiskProbe::from_result(Ok(RuntimeInfo::default())),
            DiskProbe::Reported(RuntimeInfo::default())
        );
    }
}
