//! What the bench's two binaries, `quiver-bench` and `quiver-broker-bench`, share.

#![forbid(unsafe_code)]

/// The value at quantile `p` of `sorted` (ascending): the element at index floor(len * p),
/// the last one at most; 0 for no samples.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    let index = ((sorted.len() as f64 * p) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(index).copied().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_picks_floor_of_len_times_p_and_clamps() {
        let sorted: Vec<u64> = (1..=1000).collect();
        assert_eq!(percentile(&sorted, 0.5), 501);
        assert_eq!(percentile(&sorted, 0.99), 991);
        assert_eq!(percentile(&sorted, 0.999), 1000);
        assert_eq!(percentile(&sorted, 1.0), 1000);
        assert_eq!(percentile(&[7u64], 0.999), 7);
        assert_eq!(percentile::<u64>(&[], 0.5), 0);
        // 20 samples (a smoke run): p99 and p999 are the maximum.
        let twenty: Vec<u64> = (0..20).collect();
        assert_eq!(percentile(&twenty, 0.99), 19);
        assert_eq!(percentile(&twenty, 0.5), 10);
    }

    #[test]
    fn percentile_of_signed_values_keeps_their_sign() {
        // Timer lateness: a message received early is negative.
        let late: Vec<i64> = (-5..5).collect();
        assert_eq!(percentile(&late, 0.0), -5);
        assert_eq!(percentile(&late, 0.5), 0);
        assert_eq!(percentile(&late, 0.99), 4);
        assert_eq!(percentile::<i64>(&[], 0.99), 0);
    }
}
