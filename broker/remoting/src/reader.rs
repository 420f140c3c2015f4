//! The one loop in the tree that reads RemotingCommand frames off a socket.

use std::time::Instant;

use bytes::{BufMut, BytesMut};
use quiver_protocol::{frame, FrameError, RemotingCommand};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::OwnedSemaphorePermit;

use crate::budget::{ByteBudget, ReadBudget};

/// Bytes read ahead beyond the frame being received (or when between frames).
const READ_AHEAD: usize = 64 * 1024;

/// Why no more frames can be read.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    Io(std::io::Error),
    Malformed(FrameError),
}

impl From<std::io::Error> for ReadFailure {
    fn from(error: std::io::Error) -> Self {
        ReadFailure::Io(error)
    }
}

impl From<FrameError> for ReadFailure {
    fn from(error: FrameError) -> Self {
        ReadFailure::Malformed(error)
    }
}

/// A decoded frame, the budget bytes it keeps counted until dropped, and when it was read.
pub(crate) type Frame = (
    RemotingCommand,
    Option<OwnedSemaphorePermit>,
    Option<Instant>,
);

pub(crate) struct FrameReader<R> {
    reader: R,
    buf: BytesMut,
    budget: Option<ReadBudget>,
    stamp_reads: bool,
    /// When the last read returned bytes (if stamping): the frames it completed arrived then.
    filled_at: Option<Instant>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(reader: R, budget: Option<ByteBudget>, stamp_reads: bool) -> FrameReader<R> {
        FrameReader {
            reader,
            buf: BytesMut::with_capacity(READ_AHEAD),
            budget: budget.map(ReadBudget::new),
            stamp_reads,
            filled_at: None,
        }
    }

    /// The next frame; `Ok(None)` once the peer has closed its side.
    pub(crate) async fn next_frame(&mut self) -> Result<Option<Frame>, ReadFailure> {
        loop {
            let buffered = self.buf.len();
            if let Some(command) = frame::decode(&mut self.buf)? {
                // The frame's bytes were counted while buffered; whoever handles it keeps them.
                let consumed = buffered - self.buf.len();
                let held = self
                    .budget
                    .as_mut()
                    .and_then(|budget| budget.hand_over(consumed));
                return Ok(Some((command, held, self.filled_at)));
            }
            if self.fill().await? == 0 {
                return Ok(None);
            }
            if self.stamp_reads {
                self.filled_at = Some(Instant::now());
            }
        }
    }

    /// Reads once: room for the frame being received (its length prefix says how big), so a
    /// large one lands in one allocation, or a read-ahead chunk; within the budget if any.
    async fn fill(&mut self) -> Result<usize, ReadFailure> {
        let wanted = frame::frame_len(&self.buf)?.map_or(READ_AHEAD, |bytes| bytes.max(READ_AHEAD));
        let Some(budget) = self.budget.as_mut() else {
            self.buf.reserve(wanted.saturating_sub(self.buf.len()));
            return Ok(self.reader.read_buf(&mut self.buf).await?);
        };
        budget.release_above(wanted.max(self.buf.len()));
        if budget.hold(wanted).await.is_err() {
            return Err(std::io::Error::other("the byte budget was closed").into());
        }
        // At most what is counted; a frame larger than the whole budget still gets read.
        let room = match budget.held().saturating_sub(self.buf.len()) {
            0 => wanted.saturating_sub(self.buf.len()).max(1),
            room => room,
        };
        self.buf.reserve(room);
        let mut window = (&mut self.buf).limit(room);
        Ok(self.reader.read_buf(&mut window).await?)
    }
}
