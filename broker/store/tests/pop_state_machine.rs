//! POP state machine property: any interleaving of receive, ack, change-invisible, restart
//! (reopen from disk), revive and time passing delivers every message until it is acked, and
//! never after its ack. The broker's queues are modelled: an original queue of `messages`
//! messages and the retry queue the revive step re-puts expired messages to (in-order groups
//! get them again in place instead).

use std::collections::BTreeSet;

use proptest::prelude::*;
use quiver_store::{FlushMode, PopKey, PopState, ReadStart};

#[derive(Clone, Debug)]
enum Op {
    Receive { max: usize, invisible_ms: i64 },
    Ack { pick: usize },
    ChangeInvisible { pick: usize, invisible_ms: i64 },
    Restart,
    Pass { ms: i64 },
    Revive,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1usize..4, 50i64..2_000).prop_map(|(max, invisible_ms)| Op::Receive { max, invisible_ms }),
        4 => any::<usize>().prop_map(|pick| Op::Ack { pick }),
        2 => (any::<usize>(), 50i64..2_000).prop_map(|(pick, invisible_ms)| Op::ChangeInvisible { pick, invisible_ms }),
        1 => Just(Op::Restart),
        3 => (0i64..1_500).prop_map(|ms| Op::Pass { ms }),
        2 => Just(Op::Revive),
    ]
}

/// A handle the client holds: which queue, offset, revision, and the message's identity.
#[derive(Clone, Debug)]
struct Held {
    key: PopKey,
    offset: u64,
    revision: u64,
    message: u64,
}

struct World {
    dir: tempfile::TempDir,
    state: PopState,
    fifo: bool,
    messages: u64,
    /// The retry queue: (message, its attempt when received) per offset.
    retry: Vec<(u64, u32)>,
    now_ms: i64,
    held: Vec<Held>,
    acked: BTreeSet<u64>,
}

fn original() -> PopKey {
    PopKey::new("g", "t", 0)
}

fn retry_key() -> PopKey {
    PopKey::new("g", "%RETRY%g_t", 0)
}

impl World {
    fn new(fifo: bool, messages: u64) -> World {
        let dir = tempfile::tempdir().unwrap();
        let state = PopState::open(dir.path(), FlushMode::Async).unwrap();
        World {
            dir,
            state,
            fifo,
            messages,
            retry: Vec::new(),
            now_ms: 1_000,
            held: Vec::new(),
            acked: BTreeSet::new(),
        }
    }

    fn delivered(&mut self, key: &PopKey, offset: u64, revision: u64, message: u64) {
        assert!(
            !self.acked.contains(&message),
            "message {message} delivered after its ack"
        );
        self.held.push(Held {
            key: key.clone(),
            offset,
            revision,
            message,
        });
    }

    fn receive(&mut self, max: usize, invisible_ms: i64) {
        let until = self.now_ms + invisible_ms;
        for key in [original(), retry_key()] {
            let len = if key == original() {
                self.messages
            } else {
                self.retry.len() as u64
            };
            let start = self
                .state
                .begin_read(&key, self.fifo, self.now_ms, until, max, || 0);
            let found = match start.unwrap() {
                ReadStart::Busy => panic!("nobody else reads"),
                ReadStart::Blocked => Vec::new(),
                ReadStart::Redeliver(again) => again,
                ReadStart::Read(claim) => {
                    let from = claim.from();
                    let to = len.min(from + max as u64);
                    let received: Vec<(u64, u32)> =
                        (from..to).map(|o| (o, self.attempt_at(&key, o))).collect();
                    claim.finish(to, &received, until).unwrap()
                }
            };
            for delivery in found {
                let message = self.message_at(&key, delivery.offset);
                self.delivered(&key, delivery.offset, delivery.entry.revision, message);
            }
        }
    }

    fn message_at(&self, key: &PopKey, offset: u64) -> u64 {
        if *key == original() {
            offset
        } else {
            self.retry[offset as usize].0
        }
    }

    fn attempt_at(&self, key: &PopKey, offset: u64) -> u32 {
        if *key == original() {
            1
        } else {
            self.retry[offset as usize].1
        }
    }

    fn ack(&mut self, pick: usize) {
        if self.held.is_empty() {
            return;
        }
        let held = self.held.swap_remove(pick % self.held.len());
        if self
            .state
            .remove(&held.key, held.offset, held.revision)
            .is_ok()
        {
            self.acked.insert(held.message);
        }
    }

    fn change_invisible(&mut self, pick: usize, invisible_ms: i64) {
        if self.held.is_empty() {
            return;
        }
        let index = pick % self.held.len();
        let held = self.held[index].clone();
        if let Ok(renewed) = self.state.renew(
            &held.key,
            held.offset,
            held.revision,
            self.now_ms + invisible_ms,
        ) {
            self.held[index].revision = renewed.revision;
        }
    }

    /// The revive loop's round: expired messages to the retry queue (normal groups only).
    fn revive(&mut self) {
        if self.fifo {
            return;
        }
        for (key, delivery) in self.state.expired(self.now_ms, usize::MAX) {
            let lease = self.now_ms + 30_000;
            let Ok(leased) =
                self.state
                    .renew(&key, delivery.offset, delivery.entry.revision, lease)
            else {
                continue;
            };
            let message = self.message_at(&key, delivery.offset);
            self.retry.push((message, delivery.entry.attempt + 1));
            self.state
                .remove(&key, delivery.offset, leased.revision)
                .unwrap();
        }
    }

    fn restart(&mut self) {
        self.state = PopState::open(self.dir.path(), FlushMode::Async).unwrap();
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Receive { max, invisible_ms } => self.receive(max, invisible_ms),
            Op::Ack { pick } => self.ack(pick),
            Op::ChangeInvisible { pick, invisible_ms } => self.change_invisible(pick, invisible_ms),
            Op::Restart => self.restart(),
            Op::Pass { ms } => self.now_ms += ms,
            Op::Revive => self.revive(),
        }
    }

    /// A diligent client from here on: every message is delivered and acked in the end.
    fn drain(&mut self) {
        for _ in 0..200 {
            if self.acked.len() as u64 == self.messages {
                break;
            }
            self.now_ms += 40_000;
            self.revive();
            self.receive(8, 1_000);
            while !self.held.is_empty() {
                self.ack(0);
            }
        }
        assert_eq!(
            self.acked.len() as u64,
            self.messages,
            "every message delivered until acked"
        );
        let prefix = self.state.acked_prefix(&original()).unwrap_or(0);
        assert_eq!(prefix, self.messages, "the acked prefix covers the queue");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pop_state_machine(
        fifo in any::<bool>(),
        messages in 1u64..8,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        let mut world = World::new(fifo, messages);
        for op in &ops {
            world.apply(op);
        }
        world.drain();
    }
}
