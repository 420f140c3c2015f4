//! The master's fetch streams. A replica keeps several fetches in flight as one stream: the
//! master serves them in the order the replica numbered them, each from where the one before
//! it ended, so the next chunk is already on its way while the replica appends the last.
//! The first fetch (seq 0) opens a stream at the offset it names and the master names the
//! stream; a replica's newer stream ends its older one, whose waiting fetches are refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// How long a fetch waits for the ones before it in its stream (each is held at most
/// `MAX_FETCH_WAIT`, and a replica keeps a few in flight).
const TURN_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a fetch of a stream is not served.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StreamError {
    #[error("stream {stream} of replica {replica} is not open (replaced, broken by a refused fetch, or of an earlier mastership): open a new one")]
    NotOpen { replica: u64, stream: u64 },
    #[error("fetch {seq} of stream {stream} waited {TURN_TIMEOUT:?} for the fetches before it")]
    TurnTimedOut { stream: u64, seq: u64 },
}

/// Where a replica's open stream stands.
#[derive(Debug)]
struct Position {
    stream: u64,
    next_seq: u64,
    read_from: u64,
}

/// Every replica's open stream.
#[derive(Debug, Default)]
pub(super) struct Streams {
    last_id: AtomicU64,
    open: Mutex<HashMap<u64, Position>>,
    /// Woken whenever a fetch was served or a stream ended.
    moved: Notify,
}

impl Streams {
    /// Forgets every stream (a new mastership serves from its own log).
    pub(super) fn clear(&self) {
        self.open.lock().clear();
        self.moved.notify_waiters();
    }

    /// Opens a new stream of `replica` at `offset`, ending its previous one: the turn of
    /// its first fetch.
    pub(super) fn open(&self, replica: u64, offset: u64) -> Turn<'_> {
        let stream = self.last_id.fetch_add(1, Ordering::Relaxed) + 1;
        let position = Position {
            stream,
            next_seq: 0,
            read_from: offset,
        };
        self.open.lock().insert(replica, position);
        self.moved.notify_waiters();
        self.turn(replica, stream, 0, offset)
    }

    /// Waits until every fetch before `seq` of `stream` was served: this fetch's turn.
    pub(super) async fn wait_turn(
        &self,
        replica: u64,
        stream: u64,
        seq: u64,
    ) -> Result<Turn<'_>, StreamError> {
        let deadline = tokio::time::Instant::now() + TURN_TIMEOUT;
        loop {
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            match self.open.lock().get(&replica) {
                Some(p) if p.stream == stream && p.next_seq == seq => {
                    return Ok(self.turn(replica, stream, seq, p.read_from));
                }
                // Not yet its turn.
                Some(p) if p.stream == stream && p.next_seq < seq => {}
                _ => return Err(StreamError::NotOpen { replica, stream }),
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return Err(StreamError::TurnTimedOut { stream, seq });
            }
        }
    }

    fn turn(&self, replica: u64, stream: u64, seq: u64, read_from: u64) -> Turn<'_> {
        Turn {
            streams: self,
            replica,
            stream,
            seq,
            read_from,
            served: false,
        }
    }

    /// Ends `stream` of `replica` if it is still the open one.
    fn close(&self, replica: u64, stream: u64) {
        let mut open = self.open.lock();
        if open.get(&replica).is_some_and(|p| p.stream == stream) {
            open.remove(&replica);
        }
        drop(open);
        self.moved.notify_waiters();
    }
}

/// A fetch's turn in its stream. Served, the next fetch reads from where this one ended;
/// dropped unserved (refused, or its task aborted), it ends the stream, so no later fetch
/// is served from the wrong place.
pub(super) struct Turn<'a> {
    streams: &'a Streams,
    replica: u64,
    pub stream: u64,
    seq: u64,
    /// Where this fetch reads.
    pub read_from: u64,
    served: bool,
}

impl Turn<'_> {
    /// This fetch was answered with the bytes up to `end`.
    pub(super) fn served(mut self, end: u64) {
        let mut open = self.streams.open.lock();
        if let Some(p) = open
            .get_mut(&self.replica)
            .filter(|p| p.stream == self.stream && p.next_seq == self.seq)
        {
            p.next_seq += 1;
            p.read_from = end;
            self.served = true;
        }
        drop(open);
        self.streams.moved.notify_waiters();
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        if !self.served {
            self.streams.close(self.replica, self.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fetches_are_served_in_their_order_each_from_where_the_previous_ended() {
        let streams = Streams::default();
        let first = streams.open(1, 100);
        let stream = first.stream;
        assert_eq!(first.read_from, 100);
        // The third fetch arrives first: it waits for the second, which waits for the first.
        let third = streams.wait_turn(1, stream, 2);
        let second = streams.wait_turn(1, stream, 1);
        tokio::pin!(third, second);
        assert!(futures_util::poll!(third.as_mut()).is_pending());
        assert!(futures_util::poll!(second.as_mut()).is_pending());
        first.served(150);
        let second = second.await.unwrap();
        assert_eq!(second.read_from, 150);
        assert!(futures_util::poll!(third.as_mut()).is_pending());
        second.served(170);
        assert_eq!(third.await.unwrap().read_from, 170);
    }

    #[tokio::test]
    async fn a_newer_stream_or_a_refused_fetch_ends_the_stream_and_its_waiting_fetches() {
        let streams = Streams::default();
        let first = streams.open(1, 0);
        let old = first.stream;
        let waiting = streams.wait_turn(1, old, 1);
        tokio::pin!(waiting);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        let reopened = streams.open(1, 0);
        assert_eq!(
            waiting.await.err(),
            Some(StreamError::NotOpen {
                replica: 1,
                stream: old
            })
        );
        // The old stream's first fetch finishing changes nothing of the new one.
        first.served(999);
        let new = reopened.stream;
        let next = streams.wait_turn(1, new, 1);
        tokio::pin!(next);
        assert!(futures_util::poll!(next.as_mut()).is_pending());
        // Refused (dropped unserved): the fetches after it are refused, not served from 0.
        drop(reopened);
        assert!(matches!(next.await, Err(StreamError::NotOpen { .. })));
        // Other replicas' streams are their own.
        let other = streams.open(2, 5);
        assert_eq!(other.read_from, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_whose_predecessor_never_comes_gives_up() {
        let streams = Streams::default();
        let first = streams.open(1, 0);
        let stream = first.stream;
        let late = streams.wait_turn(1, stream, 3).await.err();
        assert_eq!(late, Some(StreamError::TurnTimedOut { stream, seq: 3 }));
        drop(first);
    }
}
