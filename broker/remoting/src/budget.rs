//! The in-flight byte budgets that bound what a server's connections hold in memory: one
//! shared by every connection and one per connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};

/// Bytes shared by many connections: each counts its read buffer and the frames it has handed
/// out (until they are dropped) against `semaphore`, which holds `total` permits.
#[derive(Clone, Debug)]
pub struct ByteBudget {
    pub semaphore: Arc<Semaphore>,
    pub total: usize,
    /// Times a connection's reading waited for this budget (it was spent).
    pub waits: Arc<AtomicU64>,
}

impl ByteBudget {
    /// A budget of `total` bytes.
    pub fn new(total: usize) -> ByteBudget {
        ByteBudget {
            semaphore: Arc::new(Semaphore::new(total)),
            total,
            waits: Arc::default(),
        }
    }
}

/// The budget each connection gets of its own: its size, and one wait count for them all.
#[derive(Clone, Debug)]
pub struct PerConnectionBudget {
    pub bytes: usize,
    /// Times a connection's reading waited for its own budget (its frames held it all).
    pub waits: Arc<AtomicU64>,
}

impl PerConnectionBudget {
    pub fn new(bytes: usize) -> PerConnectionBudget {
        PerConnectionBudget {
            bytes,
            waits: Arc::default(),
        }
    }

    /// A fresh budget for one connection.
    pub(crate) fn budget(&self) -> ByteBudget {
        ByteBudget {
            semaphore: Arc::new(Semaphore::new(self.bytes)),
            total: self.bytes,
            waits: self.waits.clone(),
        }
    }
}

/// Budget bytes a decoded frame keeps counted until it is dropped: its share of the
/// broker-wide budget and of its connection's.
#[derive(Debug, Default)]
pub struct HeldBytes {
    shared: Option<OwnedSemaphorePermit>,
    own: Option<OwnedSemaphorePermit>,
}

impl HeldBytes {
    /// The frame's bytes, as counted (the larger of the two shares).
    pub fn bytes(&self) -> usize {
        let count = |permit: &Option<OwnedSemaphorePermit>| {
            permit.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
        };
        count(&self.shared).max(count(&self.own))
    }
}

/// A connection's read buffer and the frames it has handed out, counted against a budget
/// shared by many connections and against the connection's own, either optional.
pub(crate) struct ReadBudget {
    shared: Option<ByteBudget>,
    own: Option<ByteBudget>,
    held: HeldBytes,
}

impl ReadBudget {
    pub(crate) fn new(shared: Option<ByteBudget>, own: Option<ByteBudget>) -> ReadBudget {
        ReadBudget {
            shared,
            own,
            held: HeldBytes::default(),
        }
    }

    /// What every budget present counts for this buffer (the least of them).
    pub(crate) fn held(&self) -> usize {
        [
            (&self.shared, &self.held.shared),
            (&self.own, &self.held.own),
        ]
        .into_iter()
        .filter(|(budget, _)| budget.is_some())
        .map(|(_, held)| held_permits(held))
        .min()
        .unwrap_or(0)
    }

    /// Waits until `bytes` (capped at each whole budget) are counted for this buffer: the
    /// connection's own first (only its own frames hold it), then the shared one.
    pub(crate) async fn hold(&mut self, bytes: usize) -> Result<(), AcquireError> {
        if let Some(own) = &self.own {
            hold_more(own, &mut self.held.own, bytes, false).await?;
        }
        if let Some(shared) = &self.shared {
            hold_more(shared, &mut self.held.shared, bytes, true).await?;
        }
        Ok(())
    }

    /// Moves `bytes` of what is held to a decoded frame.
    pub(crate) fn hand_over(&mut self, bytes: usize) -> HeldBytes {
        HeldBytes {
            shared: split_off(&mut self.held.shared, bytes),
            own: split_off(&mut self.held.own, bytes),
        }
    }

    /// Gives back what is held beyond `bytes` (after a large frame went to its request).
    pub(crate) fn release_above(&mut self, bytes: usize) {
        for held in [&mut self.held.shared, &mut self.held.own] {
            if let Some(held) = held.as_mut() {
                let excess = held.num_permits().saturating_sub(bytes);
                if excess > 0 {
                    drop(held.split(excess));
                }
            }
        }
    }
}

fn held_permits(held: &Option<OwnedSemaphorePermit>) -> usize {
    held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits)
}

/// Counts `bytes` (capped at the whole budget, so a larger frame can still be read) in `held`
/// from `budget`, waiting while it is spent (counted as a wait). A wait on a budget `shared`
/// with other connections holds none of it: two connections each holding part while waiting
/// for the rest would wait forever.
async fn hold_more(
    budget: &ByteBudget,
    held: &mut Option<OwnedSemaphorePermit>,
    bytes: usize,
    shared: bool,
) -> Result<(), AcquireError> {
    let bytes = bytes.min(budget.total);
    let more = u32::try_from(bytes.saturating_sub(held_permits(held))).unwrap_or(u32::MAX);
    if more == 0 {
        return Ok(());
    }
    if let Ok(extra) = budget.semaphore.clone().try_acquire_many_owned(more) {
        merge(held, extra);
        return Ok(());
    }
    budget.waits.fetch_add(1, Ordering::Relaxed);
    if shared {
        *held = None;
        let all = u32::try_from(bytes).unwrap_or(u32::MAX);
        *held = Some(budget.semaphore.clone().acquire_many_owned(all).await?);
    } else {
        merge(
            held,
            budget.semaphore.clone().acquire_many_owned(more).await?,
        );
    }
    Ok(())
}

fn merge(held: &mut Option<OwnedSemaphorePermit>, extra: OwnedSemaphorePermit) {
    match held.as_mut() {
        Some(held) => held.merge(extra),
        None => *held = Some(extra),
    }
}

fn split_off(
    held: &mut Option<OwnedSemaphorePermit>,
    bytes: usize,
) -> Option<OwnedSemaphorePermit> {
    let permit = held.as_mut()?;
    if bytes >= permit.num_permits() {
        return held.take();
    }
    permit.split(bytes)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_read_buffer_counts_against_the_budget_and_hands_frames_to_requests() {
        let shared = ByteBudget::new(1000);
        let semaphore = shared.semaphore.clone();
        let mut budget = ReadBudget::new(Some(shared), None);
        budget.hold(300).await.unwrap();
        assert_eq!(semaphore.available_permits(), 700);
        // A decoded 120-byte frame keeps its bytes counted until its request is answered.
        let request = budget.hand_over(120);
        assert_eq!(request.bytes(), 120);
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
        let mut first = ReadBudget::new(Some(shared.clone()), None);
        let mut second = ReadBudget::new(Some(shared), None);
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

    #[tokio::test]
    async fn a_connection_waits_for_its_own_budget_without_touching_the_shared_one() {
        let shared = ByteBudget::new(10_000);
        let own = ByteBudget::new(1000);
        let mut budget = ReadBudget::new(Some(shared.clone()), Some(own.clone()));
        budget.hold(800).await.unwrap();
        let request = budget.hand_over(800);
        assert_eq!(request.bytes(), 800);
        assert_eq!(
            (
                own.semaphore.available_permits(),
                shared.semaphore.available_permits()
            ),
            (200, 9200)
        );
        // The connection's frames hold 800 of its 1000: reading 500 more waits for them.
        let grow = tokio::spawn(async move {
            budget.hold(500).await.unwrap();
            budget.held()
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(
            !grow.is_finished(),
            "waits while its own frames hold the budget"
        );
        assert_eq!(own.waits.load(Ordering::Relaxed), 1);
        assert_eq!(shared.waits.load(Ordering::Relaxed), 0);
        drop(request);
        let held = tokio::time::timeout(Duration::from_secs(20), grow)
            .await
            .expect("the frame's bytes came back")
            .unwrap();
        assert_eq!(held, 500);
    }
}
