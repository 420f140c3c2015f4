//! Client connections of both ports (remoting and gRPC), bounded together by
//! `max-connections` and `max-connections-per-address`: a slot is taken on accept and given
//! back when the connection ends; it also keeps `quiver_connections`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::ClosedBecause;

pub struct ConnectionSlots {
    total: Arc<Semaphore>,
    per_address: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>,
    max_per_address: usize,
    /// Open connections (`quiver_connections`).
    open: Arc<AtomicI64>,
}

/// One open connection's place; dropped when the connection ends.
pub struct ConnectionSlot {
    _total: OwnedSemaphorePermit,
    per_address: Arc<parking_lot::Mutex<HashMap<IpAddr, usize>>>,
    address: IpAddr,
    open: Arc<AtomicI64>,
}

impl ConnectionSlots {
    pub fn new(max: usize, max_per_address: usize) -> ConnectionSlots {
        ConnectionSlots {
            total: Arc::new(Semaphore::new(max)),
            per_address: Arc::default(),
            max_per_address,
            open: Arc::default(),
        }
    }

    /// A slot for a connection from `address`, or which limit refuses it.
    pub fn take(&self, address: IpAddr) -> Result<ConnectionSlot, ClosedBecause> {
        let total = self
            .total
            .clone()
            .try_acquire_owned()
            .map_err(|_| ClosedBecause::ConnectionLimit)?;
        {
            let mut open = self.per_address.lock();
            let count = open.entry(address).or_default();
            if *count >= self.max_per_address {
                return Err(ClosedBecause::AddressLimit);
            }
            *count += 1;
        }
        self.open.fetch_add(1, Ordering::Relaxed);
        Ok(ConnectionSlot {
            _total: total,
            per_address: self.per_address.clone(),
            address,
            open: self.open.clone(),
        })
    }

    /// Open connections of both ports.
    pub fn open(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
        let mut open = self.per_address.lock();
        if let Some(count) = open.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_limits_hold_and_slots_come_back() {
        let slots = ConnectionSlots::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let first = slots.take(a).unwrap();
        let _second = slots.take(a).unwrap();
        assert_eq!(slots.take(a).err(), Some(ClosedBecause::AddressLimit));
        let _third = slots.take(b).unwrap();
        assert_eq!(slots.take(b).err(), Some(ClosedBecause::ConnectionLimit));
        assert_eq!(slots.open(), 3);
        drop(first);
        assert_eq!(slots.open(), 2);
        assert!(slots.take(a).is_ok(), "a slot came back");
    }
}
