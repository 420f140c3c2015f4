//! The one loop in the tree that reads RemotingCommand frames off a socket.

use std::time::{Duration, Instant};

use bytes::{BufMut, BytesMut};
use quiver_protocol::{frame, FrameError, RemotingCommand};
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::arrival::Arrivals;
use crate::budget::{ByteBudget, HeldBytes, ReadBudget};

/// Bytes read ahead beyond the frame being received.
const READ_AHEAD: usize = 64 * 1024;
/// The buffer of a read between frames: what an idle connection holds while it waits.
const FIRST_READ: usize = 4 * 1024;

/// Why no more frames can be read.
#[derive(Debug)]
pub(crate) enum ReadFailure {
    Io(std::io::Error),
    Malformed(FrameError),
    /// A frame was started and not finished within the frame read timeout.
    FrameTimedOut(Duration),
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
/// The stamps are (read returned, bytes reached the socket).
pub(crate) type Frame = (
    RemotingCommand,
    HeldBytes,
    (Option<Instant>, Option<Instant>),
);

pub(crate) struct FrameReader<R> {
    reader: R,
    buf: BytesMut,
    budget: Option<ReadBudget>,
    stamp_reads: bool,
    arrivals: Option<Arrivals>,
    /// When the last read returned bytes (if stamping): the frames it completed arrived then.
    filled_at: Option<Instant>,
    /// When the bytes of the last read reached the socket (if stamping and known).
    arrived_at: Option<Instant>,
    /// How long a started frame may take to arrive whole; None: as long as it takes.
    frame_timeout: Option<Duration>,
    /// When the first bytes of the frame being received arrived.
    frame_started: Option<Instant>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(
        reader: R,
        budgets: (Option<ByteBudget>, Option<ByteBudget>),
        (stamp_reads, arrivals): (bool, Option<Arrivals>),
        frame_timeout: Option<Duration>,
    ) -> FrameReader<R> {
        let (shared, own) = budgets;
        FrameReader {
            reader,
            buf: BytesMut::new(),
            budget: (shared.is_some() || own.is_some()).then(|| ReadBudget::new(shared, own)),
            stamp_reads,
            arrivals: arrivals.filter(|_| stamp_reads),
            filled_at: None,
            arrived_at: None,
            frame_timeout,
            frame_started: None,
        }
    }

    /// Whether bytes of another frame are buffered behind the last one handed out.
    pub(crate) fn has_buffered(&self) -> bool {
        !self.buf.is_empty()
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
                    .map_or_else(HeldBytes::default, |budget| budget.hand_over(consumed));
                // What is left over is the start of the next frame.
                self.frame_started = (!self.buf.is_empty()).then(Instant::now);
                return Ok(Some((command, held, (self.filled_at, self.arrived_at))));
            }
            if self.fill().await? == 0 {
                return Ok(None);
            }
            let now = Instant::now();
            if self.stamp_reads {
                self.filled_at = Some(now);
                self.arrived_at = self.arrivals.as_ref().and_then(Arrivals::take);
            }
            self.frame_started.get_or_insert(now);
        }
    }

    /// Reads once, into room the budgets count ([`FrameReader::read_room`]).
    async fn fill(&mut self) -> Result<usize, ReadFailure> {
        if self.buf.is_empty() {
            // Between frames: let go of the last read's buffer (its frames keep their part).
            self.buf = BytesMut::new();
        }
        let wanted = self.buf.len() + self.read_room()?;
        // Only the peer's part is timed: a wait for the budget below is the broker's.
        let deadline = self.frame_deadline();
        let Some(budget) = self.budget.as_mut() else {
            self.buf.reserve(wanted - self.buf.len());
            return within(deadline, self.reader.read_buf(&mut self.buf)).await;
        };
        budget.release_above(wanted);
        if budget.hold(wanted).await.is_err() {
            return Err(std::io::Error::other("the byte budget was closed").into());
        }
        // At most what is counted; a frame larger than a whole budget still gets read.
        let room = match budget.held().saturating_sub(self.buf.len()) {
            0 => wanted.saturating_sub(self.buf.len()).max(1),
            room => room,
        };
        self.buf.reserve(room);
        let mut window = (&mut self.buf).limit(room);
        within(deadline, self.reader.read_buf(&mut window)).await
    }

    /// How much the next read may bring: a small read between frames, so an idle connection
    /// holds little; room that doubles with what arrived of a large frame, so one declared
    /// large and sent slowly holds about what was sent; else the frame's rest and a read-ahead.
    fn read_room(&self) -> Result<usize, FrameError> {
        let buffered = self.buf.len();
        if buffered == 0 {
            return Ok(FIRST_READ);
        }
        let rest = frame::frame_len(&self.buf)?.map_or(0, |len| len.saturating_sub(buffered));
        Ok(if rest <= READ_AHEAD {
            rest + READ_AHEAD
        } else {
            rest.min(buffered.max(FIRST_READ))
        })
    }

    /// When the frame being received must be whole, if one is started and a timeout is set.
    fn frame_deadline(&self) -> Option<(Instant, Duration)> {
        let timeout = self.frame_timeout?;
        let started = self.frame_started.filter(|_| !self.buf.is_empty())?;
        Some((started + timeout, timeout))
    }
}

/// Runs `read`, failing with `FrameTimedOut` if `deadline` passes first.
async fn within(
    deadline: Option<(Instant, Duration)>,
    read: impl std::future::Future<Output = std::io::Result<usize>>,
) -> Result<usize, ReadFailure> {
    match deadline {
        None => Ok(read.await?),
        Some((deadline, timeout)) => match tokio::time::timeout_at(deadline.into(), read).await {
            Ok(read) => Ok(read?),
            Err(_) => Err(ReadFailure::FrameTimedOut(timeout)),
        },
    }
}
