//! Queue allocation among the members of a consumer group (RocketMQ's
//! `AllocateMessageQueueAveragely`): every member computes the same answer from the same
//! sorted inputs, so no coordination is needed beyond agreeing on the member list.

/// The queues `current` owns when `queues` are shared averagely among `consumer_ids`.
///
/// Both inputs are sorted here, so callers may pass them in any order. A member that is not
/// (yet) in the list owns nothing, which is what RocketMQ does while a heartbeat is in flight.
pub fn allocate_averagely<Q: Clone + Ord>(
    queues: &[Q],
    consumer_ids: &[String],
    current: &str,
) -> Vec<Q> {
    let mut queues = queues.to_vec();
    queues.sort();
    queues.dedup();
    let mut consumer_ids = consumer_ids.to_vec();
    consumer_ids.sort();
    consumer_ids.dedup();
    let Some(index) = consumer_ids.iter().position(|id| id == current) else {
        return Vec::new();
    };
    if queues.is_empty() {
        return Vec::new();
    }
    let queue_count = queues.len();
    let member_count = consumer_ids.len();
    let remainder = queue_count % member_count;
    // The first `remainder` members take one extra queue each.
    let takes_extra = remainder > 0 && index < remainder;
    let share = if queue_count <= member_count {
        1
    } else if takes_extra {
        queue_count / member_count + 1
    } else {
        queue_count / member_count
    };
    let start = if takes_extra {
        index * share
    } else {
        index * share + remainder
    };
    let range = share.min(queue_count.saturating_sub(start));
    (0..range)
        .map(|i| queues[(start + i) % queue_count].clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn eight_queues_three_members_split_three_three_two() {
        let queues: Vec<u32> = (0..8).collect();
        let members = ids(&["c", "a", "b"]);
        assert_eq!(allocate_averagely(&queues, &members, "a"), vec![0, 1, 2]);
        assert_eq!(allocate_averagely(&queues, &members, "b"), vec![3, 4, 5]);
        assert_eq!(allocate_averagely(&queues, &members, "c"), vec![6, 7]);
    }

    #[test]
    fn more_members_than_queues_leaves_the_last_members_idle() {
        let queues: Vec<u32> = (0..2).collect();
        let members = ids(&["a", "b", "c"]);
        assert_eq!(allocate_averagely(&queues, &members, "a"), vec![0]);
        assert_eq!(allocate_averagely(&queues, &members, "b"), vec![1]);
        assert_eq!(
            allocate_averagely(&queues, &members, "c"),
            Vec::<u32>::new()
        );
    }

    #[test]
    fn unknown_member_gets_nothing() {
        let queues: Vec<u32> = (0..4).collect();
        assert!(allocate_averagely(&queues, &ids(&["a"]), "z").is_empty());
    }

    #[test]
    fn every_queue_is_owned_by_exactly_one_member() {
        for queue_count in 0..20u32 {
            for member_count in 1..7usize {
                let queues: Vec<u32> = (0..queue_count).rev().collect();
                let members: Vec<String> = (0..member_count).map(|i| format!("m{i}")).collect();
                let mut owned: Vec<u32> = members
                    .iter()
                    .flat_map(|m| allocate_averagely(&queues, &members, m))
                    .collect();
                owned.sort();
                assert_eq!(owned, (0..queue_count).collect::<Vec<_>>());
                let shares: Vec<usize> = members
                    .iter()
                    .map(|m| allocate_averagely(&queues, &members, m).len())
                    .collect();
                let (min, max) = (shares.iter().min().unwrap(), shares.iter().max().unwrap());
                assert!(max - min <= 1, "unbalanced shares {shares:?}");
            }
        }
    }
}
