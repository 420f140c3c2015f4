//! Events counted by reason (writes refused, files deleted), for the server's metrics.

use std::sync::atomic::{AtomicU64, Ordering};

/// A count per reason, the reasons listed in a fixed array (their `ALL`).
pub(crate) struct Tally<R: 'static, const N: usize> {
    reasons: &'static [R; N],
    counts: [AtomicU64; N],
}

impl<R: Copy + PartialEq, const N: usize> Tally<R, N> {
    pub(crate) fn new(reasons: &'static [R; N]) -> Self {
        Tally {
            reasons,
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Counts one event for `reason`.
    pub(crate) fn add(&self, reason: R) {
        let index = self.reasons.iter().position(|r| *r == reason);
        self.counts[index.expect("every reason is listed")].fetch_add(1, Ordering::Relaxed);
    }

    /// Every reason with its count, in the listed order.
    pub(crate) fn read(&self) -> Vec<(R, u64)> {
        self.reasons
            .iter()
            .zip(&self.counts)
            .map(|(reason, count)| (*reason, count.load(Ordering::Relaxed)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_listed_reason_in_order() {
        static REASONS: [char; 3] = ['a', 'b', 'c'];
        let tally = Tally::new(&REASONS);
        tally.add('c');
        tally.add('a');
        tally.add('c');
        assert_eq!(tally.read(), [('a', 1), ('b', 0), ('c', 2)]);
    }
}
