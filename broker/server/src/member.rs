//! What a replicated group's member reads and writes of its broker ([`Member`]), kept apart
//! from `broker.rs` so the broker does not import the state log (which imports it). The
//! calls name the broker's own accessors (`Broker::store(self)`), not this trait's.

use std::sync::Arc;

use quiver_store::{ConsumerOffsets, MessageStore};

use crate::broker::Broker;
use crate::config::BrokerConfig;
use crate::groups::GroupManager;
use crate::replication::Member;
use crate::topics::TopicManager;
use crate::transaction::Transactions;

impl Member for Broker {
    fn store(&self) -> &Arc<MessageStore> {
        Broker::store(self)
    }

    fn offsets(&self) -> &Arc<ConsumerOffsets> {
        Broker::offsets(self)
    }

    fn apply_held_state(&self) -> Result<usize, quiver_store::StoreError> {
        crate::state_log::take_over(Broker::store(self), &crate::state_log::Tables::of(self))
    }

    fn topics(&self) -> &TopicManager {
        Broker::topics(self)
    }

    fn groups(&self) -> &GroupManager {
        Broker::groups(self)
    }

    fn config(&self) -> &BrokerConfig {
        Broker::config(self)
    }

    fn transactions(&self) -> &Transactions {
        Broker::transactions(self)
    }
}
