//! The writer half: encodes queued frames into few vectored writes.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Buf, Bytes, BytesMut};
use quiver_protocol::{frame, RemotingCommand};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use crate::connection::{OnWritten, Outbound, Shared};
use crate::plain::Direct;

/// Bodies of at least this many bytes (pull answers) are written from where they are,
/// after their frame head, instead of being copied into the write buffer first.
const VECTORED_BODY_BYTES: usize = 16 * 1024;
/// writev takes at most this many buffers (Linux IOV_MAX).
const MAX_IOVECS: usize = 1024;
/// Body bytes coalesced into one write before it is sent.
const COALESCE_BYTES: usize = 1024 * 1024;
/// Encoding buffer kept while nothing is queued; an idle connection holds no more.
const IDLE_BUFFER_BYTES: usize = 4 * 1024;

pub(crate) struct FrameWriter<W> {
    writer: W,
    /// Rewritten into every frame when set (Apache brokers speak as JAVA in every frame).
    language: Option<&'static str>,
    shared: Arc<Shared>,
    buf: BytesMut,
    chunks: Vec<Bytes>,
    /// Told the time once the chunks holding their frames are written.
    on_written: Vec<OnWritten>,
    /// Answering threads that write on the socket themselves; whoever writes holds it.
    direct: Option<Arc<Direct>>,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub(crate) fn new(
        writer: W,
        language: Option<&'static str>,
        shared: Arc<Shared>,
        direct: Option<Arc<Direct>>,
    ) -> Self {
        FrameWriter {
            writer,
            language,
            shared,
            buf: BytesMut::new(),
            chunks: Vec::new(),
            on_written: Vec::new(),
            direct,
        }
    }

    /// Writes what is queued until every sender is gone or `closing` flips, then shuts the
    /// socket's write side down.
    pub(crate) async fn run(
        mut self,
        mut outbound: mpsc::Receiver<Outbound>,
        mut closing: watch::Receiver<bool>,
    ) {
        loop {
            if outbound.is_empty() && self.buf.capacity() > IDLE_BUFFER_BYTES {
                // Going idle: the encoding buffer's allocation goes too.
                self.buf = BytesMut::new();
            }
            let command = tokio::select! {
                biased;
                command = outbound.recv() => command,
                // It only ever flips to true. Refuse new frames; queued ones are still written.
                _ = closing.changed() => {
                    outbound.close();
                    continue;
                }
            };
            let Some(command) = command else { break };
            self.encode_queued(command, &mut outbound);
            if let Some(direct) = &self.direct {
                direct.begin_writing().await;
            }
            let written = write_chunks(&mut self.writer, &mut self.chunks).await;
            if let Some(direct) = &self.direct {
                direct.end_writing();
            }
            if let Err(error) = written {
                self.shared.end(&format!("write failed: {error}"));
                return;
            }
            if !self.on_written.is_empty() {
                let written_at = Instant::now();
                self.on_written.drain(..).for_each(|tell| tell(written_at));
            }
        }
        if let Some(direct) = &self.direct {
            // Not in the middle of an answering thread's frame.
            direct.begin_writing().await;
        }
        let _ = self.writer.shutdown().await;
    }

    /// Encodes `first` and whatever else is queued (up to about a MiB of bodies) into chunks.
    fn encode_queued(&mut self, first: Outbound, outbound: &mut mpsc::Receiver<Outbound>) {
        let mut queued = 0;
        let mut next = Some(first);
        while let Some(Outbound {
            command,
            on_written,
        }) = next
        {
            queued += command.body_len();
            self.encode(*command);
            self.on_written.extend(on_written);
            next = if queued < COALESCE_BYTES {
                outbound.try_recv().ok()
            } else {
                None
            };
        }
        if !self.buf.is_empty() {
            self.chunks.push(self.buf.split().freeze());
        }
    }

    fn encode(&mut self, mut command: RemotingCommand) {
        if let Some(language) = self.language {
            // The buffer is reused: a few bytes, no allocation.
            command.language.clear();
            command.language.push_str(language);
        }
        // Kept aside: a vectored body moves out of the command.
        let (opaque, code) = (command.opaque, command.code);
        let awaits_answer = !(command.is_response() || command.is_oneway());
        let encoded = if command.body_len() >= VECTORED_BODY_BYTES {
            frame::encode_head(&command, &mut self.buf).map(|()| {
                self.chunks.push(self.buf.split().freeze());
                self.chunks.push(command.body);
                self.chunks.extend(command.body_chain);
            })
        } else {
            frame::encode(&command, &mut self.buf)
        };
        if let Err(error) = encoded {
            tracing::error!(peer = %self.shared.peer, code, %error, "cannot encode a frame");
            if awaits_answer {
                self.shared.fail_encode(opaque, code, error);
            }
        }
    }
}

/// Writes `chunks` in order with vectored writes and empties it.
async fn write_chunks<W: AsyncWrite + Unpin>(
    writer: &mut W,
    chunks: &mut Vec<Bytes>,
) -> std::io::Result<()> {
    chunks.retain(|chunk| !chunk.is_empty());
    let mut first = 0;
    while first < chunks.len() {
        let slices: Vec<IoSlice<'_>> = chunks[first..]
            .iter()
            .take(MAX_IOVECS)
            .map(|chunk| IoSlice::new(chunk))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let len = chunks[first].len();
            if written >= len {
                written -= len;
                first += 1;
            } else {
                chunks[first].advance(written);
                written = 0;
            }
        }
    }
    chunks.clear();
    Ok(())
}
