//! A plain TCP socket shared by its reader, its writer task and the threads that answer on
//! it: an answer built while the writer is idle is written at once by the thread that built
//! it ([`Direct`]), sparing the wake-up of the writer task (on a busy machine, the time that
//! task waits for a core is most of an answer's answered -> written).

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::{Buf, BytesMut};
use parking_lot::Mutex;
use quiver_protocol::frame;
use tokio::io::AsyncWrite;
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::TcpStream;
use tokio::sync::Notify;

use crate::connection::{OnWritten, Outbound};

/// Frames at least this large go the writer task's way (vectored from where their bodies
/// are), as do all frames while it is writing.
const DIRECT_MAX_BODY: usize = 16 * 1024;

/// The write half of a plain socket, for the writer task; it waits while an answering
/// thread writes ([`Direct`]).
pub(crate) struct PlainWrite {
    half: Arc<OwnedWriteHalf>,
}

impl AsyncWrite for PlainWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let stream: &TcpStream = (*self.half).as_ref();
        loop {
            ready!(stream.poll_write_ready(cx))?;
            match stream.try_write(buf) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let stream: &TcpStream = (*self.half).as_ref();
        loop {
            ready!(stream.poll_write_ready(cx))?;
            match stream.try_write_vectored(bufs) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
                written => return Poll::Ready(written),
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let stream: &TcpStream = (*self.half).as_ref();
        let shut = nix::sys::socket::shutdown(
            std::os::fd::AsRawFd::as_raw_fd(stream),
            nix::sys::socket::Shutdown::Write,
        );
        Poll::Ready(match shut {
            Ok(()) | Err(nix::errno::Errno::ENOTCONN) => Ok(()),
            Err(error) => Err(error.into()),
        })
    }
}

/// Shares `half` between the writer task and the threads that answer.
pub(crate) fn share(
    half: OwnedWriteHalf,
    language: Option<&'static str>,
) -> (PlainWrite, Arc<Direct>) {
    let half = Arc::new(half);
    let direct = Arc::new(Direct {
        // Weak: the write side is shut once the writer task is done, however long clones of
        // the connection live.
        half: Arc::downgrade(&half),
        writing: Mutex::new(false),
        done_writing: Notify::new(),
        language,
        more_to_read: AtomicBool::new(false),
    });
    (PlainWrite { half }, direct)
}

/// Who writes on the socket now: the writer task or one answering thread, never both.
pub(crate) struct Direct {
    half: Weak<OwnedWriteHalf>,
    /// True while someone writes; the writer task waits on `done_writing` for its turn.
    writing: Mutex<bool>,
    done_writing: Notify,
    language: Option<&'static str>,
    /// The reader holds the start of another frame: answers go to the writer task, which
    /// writes the whole run of them at once, one write where each would cost its own.
    more_to_read: AtomicBool,
}

impl Direct {
    /// Tells whether the reader has more bytes buffered behind the frame it just handed out.
    pub(crate) fn set_more_to_read(&self, more: bool) {
        self.more_to_read.store(more, Ordering::Relaxed);
    }

    /// The writer task's turn: waits while an answering thread finishes its frame.
    pub(crate) async fn begin_writing(&self) {
        loop {
            let notified = self.done_writing.notified();
            {
                let mut writing = self.writing.lock();
                if !*writing {
                    *writing = true;
                    return;
                }
            }
            notified.await;
        }
    }

    pub(crate) fn end_writing(&self) {
        *self.writing.lock() = false;
        self.done_writing.notify_one();
    }

    /// Writes `command` now, on this thread, if nobody is writing, nothing is queued
    /// (`queue_empty`) and it is small; else hands it back, untouched, for the queue. A
    /// frame the socket takes only part of is finished by a task of its own (the writer
    /// task waits for it); one the socket takes none of goes back to the queue.
    pub(crate) fn try_write_now(
        self: &Arc<Self>,
        mut outbound: Outbound,
        queue_empty: impl FnOnce() -> bool,
    ) -> Result<(), Outbound> {
        if outbound.command.body_len() >= DIRECT_MAX_BODY
            || self.more_to_read.load(Ordering::Relaxed)
        {
            return Err(outbound);
        }
        let Some(half) = self.half.upgrade() else {
            return Err(outbound);
        };
        {
            let mut writing = self.writing.lock();
            if *writing || !queue_empty() {
                return Err(outbound);
            }
            *writing = true;
        }
        if let Some(language) = self.language {
            // The buffer is reused: a few bytes, no allocation.
            outbound.command.language.clear();
            outbound.command.language.push_str(language);
        }
        let mut buf = BytesMut::new();
        if frame::encode(&outbound.command, &mut buf).is_err() {
            // The writer task reports encoding failures.
            self.end_writing();
            return Err(outbound);
        }
        let stream: &TcpStream = (*half).as_ref();
        match stream.try_write(&buf) {
            Ok(written) if written == buf.len() => {
                self.end_writing();
                if let Some(tell) = outbound.on_written {
                    tell(Instant::now());
                }
                Ok(())
            }
            Ok(written) if written > 0 => {
                buf.advance(written);
                self.finish_later(half, buf, outbound.on_written);
                Ok(())
            }
            _ => {
                // Nothing written (no room, or a failure the writer task will meet too).
                self.end_writing();
                Err(outbound)
            }
        }
    }

    /// The rest of a frame the socket took part of, written as room comes; nobody else
    /// writes meanwhile.
    fn finish_later(
        self: &Arc<Self>,
        half: Arc<OwnedWriteHalf>,
        mut rest: BytesMut,
        on_written: Option<OnWritten>,
    ) {
        let direct = Arc::clone(self);
        let finish = async move {
            let stream: &TcpStream = (*half).as_ref();
            let written = write_all(stream, &mut rest).await;
            direct.end_writing();
            if let (Ok(()), Some(tell)) = (written, on_written) {
                tell(Instant::now());
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(finish)),
            // Answers are built on the runtime; without one the connection cannot go on.
            Err(_) => tracing::error!("a partly written frame with no runtime to finish it"),
        }
    }
}
/// Writes `buf` whole: at once when the socket has room, else as room comes.
async fn write_all(stream: &TcpStream, buf: &mut BytesMut) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(written) => buf.advance(written),
            Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {
                stream.writable().await?
            }
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
