//! The in-flight byte budget that bounds what a server's connections hold in memory.

use std::sync::Arc;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// Bytes shared by many connections: each counts its read buffer and the frames it has handed
/// out (until they are dropped) against `semaphore`, which holds `total` permits.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    pub semaphore: Arc<Semaphore>,
    pub total: usize,
}

impl ByteBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> ByteBudget {
        ByteBudget {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
        }
    }
}

/// A connection's share of a [`ByteBudget`]: its read buffer is counted while bytes arrive,
/// and each decoded frame takes its bytes along until dropped.
pub(crate) struct ReadBudget {
    budget: ByteBudget,
    held: Option<OwnedSemaphorePermit>,
}

impl ReadBudget {
    pub(crate) fn new(budget: ByteBudget) -> ReadBudget {
        ReadBudget { budget, held: None }
    }

    pub(crate) fn held(&self) -> usize {
        self.held
            .as_ref()
            .map_or(0, OwnedSemaphorePermit::num_permits)
    }

    /// Waits until `bytes` (capped at the whole budget) are counted for this buffer.
    pub(crate) async fn hold(&mut self, bytes: usize) -> Result<(), AcquireError> {
        // A frame larger than the whole budget waits for all of it, not for the impossible.
        let bytes = bytes.min(self.budget.total);
        let held = self.held();
        if held >= bytes {
            return Ok(());
        }
        let more = u32::try_from(bytes - held).unwrap_or(u32::MAX);
        if let Ok(extra) = self.budget.semaphore.clone().try_acquire_many_owned(more) {
            self.merge(extra);
            return Ok(());
        }
        // Wait for the whole amount holding nothing: two connections each holding part of
        // the budget while waiting for the rest would wait forever.
        self.held = None;
        let all = u32::try_from(bytes).unwrap_or(u32::MAX);
        self.held = Some(
            self.budget
                .semaphore
                .clone()
                .acquire_many_owned(all)
                .await?,
        );
        Ok(())
    }

    fn merge(&mut self, extra: OwnedSemaphorePermit) {
        match self.held.as_mut() {
            Some(held) => held.merge(extra),
            None => self.held = Some(extra),
        }
    }

    /// Moves `bytes` of what is held to a decoded frame (None if nothing is held).
    pub(crate) fn hand_over(&mut self, bytes: usize) -> Option<OwnedSemaphorePermit> {
        let held = self.held.as_mut()?;
        let moved = bytes.min(held.num_permits());
        if moved == held.num_permits() {
            return self.held.take();
        }
        held.split(moved)
    }

    /// Gives back what is held beyond `bytes` (after a large frame went to its request).
    pub(crate) fn release_above(&mut self, bytes: usize) {
        if let Some(held) = self.held.as_mut() {
            let excess = held.num_permits().saturating_sub(bytes);
            if excess > 0 {
                drop(held.split(excess));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_read_buffer_counts_against_the_budget_and_hands_frames_to_requests() {
        let shared = ByteBudget::new(1000);
        let semaphore = shared.semaphore.clone();
        let mut budget = ReadBudget::new(shared);
        budget.hold(300).await.unwrap();
        assert_eq!(semaphore.available_permits(), 700);
        // A decoded 120-byte frame keeps its bytes counted until its request is answered.
        let request = budget.hand_over(120).expect("held");
        assert_eq!((budget.held(), semaphore.available_permits()), (180, 700));
        drop(request);
        assert_eq!(semaphore.available_permits(), 820);
        budget.release_above(100);
        assert_eq!((budget.held(), semaphore.available_permits()), (100, 900));
        // More than the whole budget is capped at it, so it can still be granted.
        budget.hold(5000).await.unwrap();
        assert_eq!((budget.held(), semaphore.available_permits()), (1000, 0));
        drop(budget);
        assert_eq!(semaphore.available_permits(), 1000);
    }

    #[tokio::test]
    async fn connections_waiting_for_more_do_not_hold_part_of_the_budget() {
        let shared = ByteBudget::new(1000);
        let mut first = ReadBudget::new(shared.clone());
        let mut second = ReadBudget::new(shared);
        first.hold(600).await.unwrap();
        second.hold(400).await.unwrap();
        // Both now want the whole budget; holding their parts while waiting would never end.
        let growers = [first, second].map(|mut budget| {
            tokio::spawn(async move {
                budget.hold(1000).await.unwrap();
                budget.held()
            })
        });
        let all = tokio::time::timeout(Duration::from_secs(20), async {
            let mut held = Vec::new();
            for grower in growers {
                held.push(grower.await.unwrap());
            }
            held
        })
        .await
        .expect("both get the whole budget in turn");
        assert_eq!(all, vec![1000, 1000]);
    }
}
