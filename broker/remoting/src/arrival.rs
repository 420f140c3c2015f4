//! When the bytes a read returned reached the socket: the kernel's receive timestamp
//! (`SO_TIMESTAMPNS`), so the time a frame waited in the socket for its reader to be
//! scheduled is measured rather than left in "what the stages do not cover".
//!
//! Only for plain TCP read halves, and only when asked for (`--stage-sample-every`): every
//! read becomes a `recvmsg` with room for one control message.

use std::io::IoSliceMut;
use std::os::fd::{AsFd, AsRawFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use nix::sys::time::TimeSpec;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::tcp::OwnedReadHalf;

/// Bytes one stamped read takes at most: tokio's `ReadBuf` must be initialized before a
/// `recvmsg` fills it, and zeroing the whole read-ahead on every read would cost more than
/// the read.
const STAMPED_READ_BYTES: usize = 16 * 1024;

/// Where a [`StampedRead`] leaves the arrival of the bytes of its last read; the frame
/// reader takes it after each read.
#[derive(Clone, Default, Debug)]
pub struct Arrivals(Arc<Mutex<Option<Instant>>>);

impl Arrivals {
    pub(crate) fn take(&self) -> Option<Instant> {
        self.0.lock().take()
    }

    fn set(&self, arrived: Instant) {
        *self.0.lock() = Some(arrived);
    }
}

/// A TCP read half whose reads note when their last bytes arrived (the kernel's software
/// receive timestamp, moved onto the monotonic clock).
pub struct StampedRead {
    half: OwnedReadHalf,
    arrivals: Arrivals,
}

impl StampedRead {
    /// Turns receive timestamps on for the socket; if the kernel refuses, reads go on
    /// without them (a warning says so).
    pub fn new(half: OwnedReadHalf) -> (StampedRead, Arrivals) {
        let stream: &tokio::net::TcpStream = half.as_ref();
        if let Err(error) = setsockopt(&stream.as_fd(), sockopt::ReceiveTimestampns, &true) {
            tracing::warn!(%error, "cannot turn receive timestamps on; reads go without");
        }
        let arrivals = Arrivals::default();
        let read = StampedRead {
            half,
            arrivals: arrivals.clone(),
        };
        (read, arrivals)
    }
}

impl AsyncRead for StampedRead {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let stream: &tokio::net::TcpStream = this.half.as_ref();
        loop {
            ready!(stream.poll_read_ready(cx))?;
            let room = buf.remaining().min(STAMPED_READ_BYTES);
            let into = buf.initialize_unfilled_to(room);
            let fd = stream.as_raw_fd();
            match stream.try_io(Interest::READABLE, || recv_stamped(fd, into)) {
                Ok((read, stamp)) => {
                    buf.advance(read);
                    if let Some(arrived) = stamp.map(monotonic) {
                        this.arrivals.set(arrived);
                    }
                    return Poll::Ready(Ok(()));
                }
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(error) => return Poll::Ready(Err(error)),
            }
        }
    }
}

/// One `recvmsg` into `into`: the bytes read and the receive timestamp it carried.
fn recv_stamped(
    fd: std::os::fd::RawFd,
    into: &mut [u8],
) -> std::io::Result<(usize, Option<TimeSpec>)> {
    let mut control = nix::cmsg_space!(TimeSpec);
    let mut iov = [IoSliceMut::new(into)];
    let message =
        recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut control), MsgFlags::MSG_DONTWAIT)?;
    let stamp = message.cmsgs().ok().and_then(|mut cmsgs| {
        cmsgs.find_map(|cmsg| match cmsg {
            ControlMessageOwned::ScmTimestampns(stamp) => Some(stamp),
            _ => None,
        })
    });
    Ok((message.bytes, stamp))
}

/// The kernel stamps with the real-time clock: its age now, taken off the monotonic now.
fn monotonic(stamp: TimeSpec) -> Instant {
    let at = UNIX_EPOCH + Duration::new(stamp.tv_sec() as u64, stamp.tv_nsec() as u32);
    let age = SystemTime::now().duration_since(at).unwrap_or_default();
    let now = Instant::now();
    now.checked_sub(age).unwrap_or(now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_read_notes_when_its_bytes_arrived() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (half, _write) = server.into_split();
        let (mut read, arrivals) = StampedRead::new(half);
        // The kernel turns receive timestamps on for the system in deferred work: the first
        // segments after the first socket asks may come without one.
        let mut stamped = None;
        for _ in 0..20 {
            let before = Instant::now();
            client.write_all(b"hello").await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut got = [0u8; 16];
            let n = read.read(&mut got).await.unwrap();
            assert_eq!(&got[..n], b"hello");
            if let Some(arrived) = arrivals.take() {
                stamped = Some((before, arrived));
                break;
            }
        }
        let (before, arrived) = stamped.expect("a stamp");
        // The bytes arrived well before the read that returned them.
        let waited = Instant::now().saturating_duration_since(arrived);
        assert!(waited >= Duration::from_millis(15), "{waited:?}");
        assert!(
            arrived + Duration::from_millis(5) >= before,
            "{arrived:?} {before:?}"
        );
        assert!(arrivals.take().is_none());
    }
}
