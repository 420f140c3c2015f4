//! One gRPC connection served on one task. hyper's HTTP/2 server hands each stream (call)
//! to an executor as a future; its usual executor spawns a task per stream, so a unary call
//! wakes the stream's task to serve it and then the connection's task again to write the
//! answer, each a wake-up that may cross threads. [`OnConnection`] instead queues the
//! stream's future for the connection's own task, which polls it beside the connection: a
//! call is read, served and answered in the poll that read it, and a call that waits (a
//! long-polling receive, a store write) wakes that one task when it can go on.
//!
//! While that task polls, the connection and its streams wake one another (a stream queued,
//! an answer for the connection to write): such a wake-up only asks the running poll for
//! another round ([`Rounds`]); scheduling the task again would cost a wake-up per call, and
//! on a busy runtime the thread it wakes, as a task per stream did.

use std::future::Future;
use std::pin::{pin, Pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::stream::{FuturesUnordered, StreamExt as _};
use futures_util::task::AtomicWaker;
use parking_lot::Mutex;

type StreamFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The executor a connection hands its streams' futures to; [`OnConnection::drive`] runs
/// them on the task driving the connection.
#[derive(Clone, Default)]
pub(crate) struct OnConnection {
    queued: Arc<Mutex<Vec<StreamFuture>>>,
    rounds: Arc<Rounds>,
}

/// The waker of everything the driving task polls.
#[derive(Default)]
struct Rounds {
    /// The driving task is polling: a wake-up asks it for one more round.
    polling: AtomicBool,
    /// Something woke while it was polling.
    again: AtomicBool,
    /// The driving task, for wake-ups while it is not polling.
    task: AtomicWaker,
}

impl Wake for Rounds {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.again.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

impl<F> hyper::rt::Executor<F> for OnConnection
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, future: F) {
        self.queued.lock().push(Box::pin(future));
        Wake::wake_by_ref(&self.rounds);
    }
}

/// Rounds of connection-then-streams one poll makes before letting other tasks run.
const ROUNDS_PER_POLL: usize = 16;

impl OnConnection {
    /// Drives `connection` and the streams it hands this executor, on the calling task,
    /// until the connection ends and its streams are done; the connection's outcome.
    pub(crate) async fn drive<C: Future>(&self, connection: C) -> C::Output {
        let mut connection = pin!(connection);
        let mut streams = FuturesUnordered::new();
        let mut ended = None;
        let waker = Waker::from(self.rounds.clone());
        std::future::poll_fn(|cx| {
            self.rounds.task.register(cx.waker());
            self.rounds.polling.store(true, Ordering::SeqCst);
            let mut inner = Context::from_waker(&waker);
            for _ in 0..ROUNDS_PER_POLL {
                self.rounds.again.store(false, Ordering::SeqCst);
                if ended.is_none() {
                    if let Poll::Ready(outcome) = connection.as_mut().poll(&mut inner) {
                        ended = Some(outcome);
                    }
                }
                streams.extend(std::mem::take(&mut *self.queued.lock()));
                while let Poll::Ready(Some(())) = streams.poll_next_unpin(&mut inner) {}
                if streams.is_empty() {
                    if let Some(outcome) = ended.take() {
                        self.rounds.polling.store(false, Ordering::SeqCst);
                        return Poll::Ready(outcome);
                    }
                }
                if self.rounds.again.load(Ordering::SeqCst) {
                    continue;
                }
                self.rounds.polling.store(false, Ordering::SeqCst);
                // A wake-up between the check and the store found the task polling.
                if !self.rounds.again.load(Ordering::SeqCst) {
                    return Poll::Pending;
                }
                self.rounds.polling.store(true, Ordering::SeqCst);
            }
            self.rounds.polling.store(false, Ordering::SeqCst);
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::rt::Executor as _;

    #[tokio::test]
    async fn queued_futures_run_on_the_driving_task_until_the_connection_and_they_end() {
        let executor = OnConnection::default();
        let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
        let ran = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (count, spawner) = (ran.clone(), executor.clone());
        // The "connection" hands over a stream that finishes only after the connection did.
        let connection = async move {
            spawner.execute(async move {
                let _ = done_rx.await;
                count.fetch_add(1, Ordering::SeqCst);
            });
            tokio::task::yield_now().await;
            "ended"
        };
        let driving = tokio::spawn({
            let executor = executor.clone();
            async move { executor.drive(connection).await }
        });
        tokio::task::yield_now().await;
        assert!(!driving.is_finished(), "a stream is still running");
        done_tx.send(()).unwrap();
        assert_eq!(driving.await.unwrap(), "ended");
        assert_eq!(ran.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_wake_up_from_outside_the_poll_resumes_the_driving_task() {
        let executor = OnConnection::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        let driving = tokio::spawn({
            let executor = executor.clone();
            async move { executor.drive(rx).await }
        });
        tokio::task::yield_now().await;
        std::thread::spawn(move || tx.send(7).unwrap())
            .join()
            .unwrap();
        assert_eq!(driving.await.unwrap().unwrap(), 7);
    }
}
