//! Standard `metav1.Condition` bookkeeping: transition time moves only when the status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// A condition's status: True, False, or Unknown when it cannot be determined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Nothing to tell either way (e.g. no broker answered).
    Unknown,
}

impl Status {
    /// The `metav1.Condition` status string.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

impl From<bool> for Status {
    fn from(holds: bool) -> Status {
        if holds {
            Status::True
        } else {
            Status::False
        }
    }
}

/// A condition to set; `observed_generation` is filled in by [`merge`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    /// Condition type, e.g. Ready.
    pub type_: &'static str,
    /// True, False or Unknown.
    pub status: Status,
    /// CamelCase reason.
    pub reason: &'static str,
    /// Human-readable message.
    pub message: String,
}

impl Desired {
    /// A condition of `type_` with its status, reason and message.
    pub fn new(
        type_: &'static str,
        status: impl Into<Status>,
        reason: &'static str,
        message: impl Into<String>,
    ) -> Desired {
        Desired {
            type_,
            status: status.into(),
            reason,
            message: message.into(),
        }
    }
}

/// Conditions for `desired`, keeping the previous transition time of unchanged statuses.
pub fn merge(
    previous: &[Condition],
    desired: &[Desired],
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|want| {
            let status = want.status.as_str().to_string();
            let last_transition_time = previous
                .iter()
                .find(|existing| existing.type_ == want.type_ && existing.status == status)
                .map(|existing| existing.last_transition_time.clone())
                .unwrap_or(Time(now));
            Condition {
                type_: want.type_.to_string(),
                status,
                reason: want.reason.to_string(),
                message: want.message.clone(),
                observed_generation: generation,
                last_transition_time,
            }
        })
        .collect()
}

/// `previous` with the one condition of `desired.type_` set (added at the end when absent), every
/// other condition kept as it was.
pub fn set(
    previous: &[Condition],
    desired: &Desired,
    generation: Option<i64>,
    now: Timestamp,
) -> Vec<Condition> {
    let updated = merge(previous, std::slice::from_ref(desired), generation, now)
        .pop()
        .expect("one desired condition gives one condition");
    let mut conditions = previous.to_vec();
    match conditions
        .iter_mut()
        .find(|existing| existing.type_ == desired.type_)
    {
        Some(existing) => *existing = updated,
        None => conditions.push(updated),
    }
    conditions
}

/// `ours` laid over the `stored` conditions, for a write that must not revert another writer's:
/// the types `decides` covers come from `ours` (a decided type absent from `ours` is removed),
/// every other stored condition is kept as stored. A condition whose status the stored one has
/// keeps the stored transition time; one whose status differs from the stored one moved `now`.
pub fn rebase(
    stored: &[Condition],
    ours: &[Condition],
    decides: impl Fn(&str) -> bool,
    now: Timestamp,
) -> Vec<Condition> {
    let mut conditions: Vec<Condition> = ours
        .iter()
        .filter(|condition| decides(&condition.type_))
        .map(|condition| {
            let last_transition_time = match find(stored, &condition.type_) {
                Some(was) if was.status == condition.status => was.last_transition_time.clone(),
                Some(_) => Time(now),
                None => condition.last_transition_time.clone(),
            };
            Condition {
                last_transition_time,
                ..condition.clone()
            }
        })
        .collect();
    conditions.extend(
        stored
            .iter()
            .filter(|condition| !decides(&condition.type_))
            .cloned(),
    );
    conditions
}

/// The condition of `type_`, if present.
pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|condition| condition.type_ == type_)
}

/// Whether `conditions` has `type_` with status True.
pub fn is_true(conditions: &[Condition], type_: &str) -> bool {
    conditions
        .iter()
        .any(|condition| condition.type_ == type_ && condition.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_kept_while_status_holds() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let first = merge(
            &[],
            &[Desired::new("Ready", false, "Starting", "0/3")],
            Some(1),
            t0,
        );
        let same = merge(
            &first,
            &[Desired::new("Ready", false, "Starting", "1/3")],
            Some(1),
            t1,
        );
        assert_eq!(same[0].last_transition_time, Time(t0));
        assert_eq!(same[0].message, "1/3");
        let flipped = merge(
            &same,
            &[Desired::new("Ready", true, "AllBrokersReady", "3/3")],
            Some(2),
            t1,
        );
        assert_eq!(flipped[0].last_transition_time, Time(t1));
        assert_eq!(flipped[0].observed_generation, Some(2));
        assert!(is_true(&flipped, "Ready"));
        let unknown = merge(
            &flipped,
            &[Desired::new("Ready", Status::Unknown, "NoAnswer", "?")],
            Some(2),
            t0,
        );
        assert_eq!(unknown[0].status, "Unknown");
        assert_eq!(unknown[0].last_transition_time, Time(t0));
        assert!(!is_true(&unknown, "Ready"));
    }

    #[test]
    fn set_replaces_one_condition_and_keeps_the_others() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let before = merge(
            &[],
            &[
                Desired::new("Ready", true, "AllBrokersReady", "3/3"),
                Desired::new("Degraded", false, "AsExpected", "3/3"),
            ],
            Some(1),
            t0,
        );
        let failed = set(
            &before,
            &Desired::new("Degraded", true, "ReconcileError", "boom"),
            Some(1),
            t1,
        );
        assert_eq!(failed[0], before[0]);
        assert_eq!(
            (failed[1].status.as_str(), failed[1].reason.as_str()),
            ("True", "ReconcileError")
        );
        assert_eq!(failed[1].last_transition_time, Time(t1));
        let added = set(
            &[],
            &Desired::new("Paused", false, "NotPaused", ""),
            None,
            t0,
        );
        assert_eq!(added.len(), 1);
        assert!(find(&failed, "Degraded").is_some_and(|c| c.message == "boom"));
    }

    #[test]
    fn rebase_keeps_other_writers_conditions_and_stored_transition_times() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let t2 = Timestamp::from_second(3_000).unwrap();
        let stored = merge(
            &[],
            &[
                Desired::new("Ready", true, "AllBrokersReady", "3/3"),
                Desired::new("example.com/Audited", true, "Audited", "by a tool"),
                Desired::new("Degraded", true, "ReconcileError", "boom"),
                Desired::new("VolumeExpansion", true, "Expanding", "1/3"),
            ],
            Some(1),
            t1,
        );
        // Computed from an older copy: Ready held since t0, Degraded False since t0.
        let ours = merge(
            &[],
            &[
                Desired::new("Ready", true, "AllBrokersReady", "3/3"),
                Desired::new("Degraded", false, "AsExpected", "3/3"),
            ],
            Some(1),
            t0,
        );
        let ours_decide = |type_: &str| type_ != "example.com/Audited";
        let rebased = rebase(&stored, &ours, ours_decide, t2);
        let types: Vec<&str> = rebased.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            ["Ready", "Degraded", "example.com/Audited"],
            "a decided type left out of ours goes, another writer's stays"
        );
        assert_eq!(rebased[0].last_transition_time, Time(t1), "status kept");
        assert_eq!(rebased[1].last_transition_time, Time(t2), "status flipped");
        assert_eq!(rebased[2], stored[1]);
        let fresh = rebase(&[], &ours, ours_decide, t2);
        assert_eq!(fresh, ours, "nothing stored: ours as computed");
    }
}
