//! Write coalescing: one `writev` for the replies of many requests.
//!
//! An HTTP/2 connection carries the requests of many clients. hyper runs
//! each request as its own task, and each reply wakes the connection task,
//! which encodes the reply's frames and flushes them to the socket at once:
//! one system call per reply. On loopback and on a LAN that call is most of
//! a small request's cost, because the kernel pushes the segment through
//! the whole TCP stack (and wakes the peer) inside it. The profile of a
//! unary Check at 64 clients over 8 connections showed about one `writev`
//! per reply against one `recvfrom` per five requests.
//!
//! [`Coalesce`] wraps the connection's byte stream. Writes go to a buffer;
//! the first flush of a burst does not write but yields once (it wakes its
//! own task and returns `Pending`), so that the request tasks which are
//! already runnable finish and add their replies; the flush after the yield
//! writes everything in one call. A reply waits for at most one pass of the
//! scheduler's run queue, never for a timer: a lone request is answered as
//! soon as nothing else is ready. Nothing about what is written changes,
//! only how many system calls carry it.
//!
//! A yield that gathered nothing (one client, one request at a time) only
//! cost a pass through the scheduler and, on a multi-threaded runtime, often
//! the wake-up of an idle worker: about 10 % more latency for a lone
//! client. So a flush whose yield gained nothing turns yielding off for the
//! next `SKIP_AFTER_NO_GAIN` flushes, which write at once; then it tries
//! again. Under load every yield gains and it stays on.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Above this many buffered bytes a write goes out before more is taken, so
/// a large reply (a transcript) streams instead of piling up in memory.
const HIGH_WATER: usize = 64 * 1024;

/// Flushes written at once after a yield that gathered nothing.
const SKIP_AFTER_NO_GAIN: u8 = 16;

/// A byte stream whose flushes are coalesced (see the [module docs](self)).
#[derive(Debug)]
pub struct Coalesce<T> {
    inner: T,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    written: usize,
    /// Whether this burst has yielded once already.
    yielded: bool,
    /// How much was buffered when this burst yielded.
    at_yield: usize,
    /// Flushes left to write at once (see the [module docs](self)).
    skip: u8,
}

impl<T> Coalesce<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Coalesce {
            inner,
            buf: Vec::with_capacity(4096),
            written: 0,
            yielded: false,
            at_yield: 0,
            skip: 0,
        }
    }
}

impl<T: AsyncWrite + Unpin> Coalesce<T> {
    /// Writes the buffer out; `Ready` once it is empty.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.buf.len() {
            let n = ready!(Pin::new(&mut self.inner).poll_write(cx, &self.buf[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.buf.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }

    /// Makes room for `incoming` bytes: drains a buffer that would pass the
    /// high-water mark.
    fn poll_room(&mut self, cx: &mut Context<'_>, incoming: usize) -> Poll<io::Result<()>> {
        if !self.buf.is_empty() && self.buf.len() + incoming > HIGH_WATER {
            ready!(self.poll_drain(cx))?;
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalesce<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalesce<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_room(cx, data.len()))?;
        if this.buf.is_empty() && data.len() >= HIGH_WATER {
            // Large: no point copying it.
            return Pin::new(&mut this.inner).poll_write(cx, data);
        }
        this.buf.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        ready!(this.poll_room(cx, total))?;
        if this.buf.is_empty() && total >= HIGH_WATER {
            return Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        }
        for b in bufs {
            this.buf.extend_from_slice(b);
        }
        Poll::Ready(Ok(total))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.buf.is_empty() {
            this.yielded = false;
            return Pin::new(&mut this.inner).poll_flush(cx);
        }
        if this.skip > 0 && !this.yielded {
            this.skip -= 1;
        } else if !this.yielded {
            // Let the replies that are about to be ready join this write.
            this.yielded = true;
            this.at_yield = this.buf.len();
            cx.waker().wake_by_ref();
            return Poll::Pending;
        } else if this.buf.len() == this.at_yield {
            // Nothing joined: stop paying for yields for a while.
            this.skip = SKIP_AFTER_NO_GAIN;
            this.at_yield = usize::MAX;
        }
        ready!(this.poll_drain(cx))?;
        this.yielded = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

impl<T: tonic::transport::server::Connected> tonic::transport::server::Connected for Coalesce<T> {
    type ConnectInfo = T::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};
    use tokio::io::AsyncWriteExt;

    /// A socket that records each write call (each would be a system call).
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        shut: Arc<Mutex<bool>>,
    }

    impl Recorder {
        fn writes(&self) -> Vec<Vec<u8>> {
            self.writes.lock().unwrap().clone()
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.writes.lock().unwrap().push(data.to_vec());
            Poll::Ready(Ok(data.len()))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            *self.shut.lock().unwrap() = true;
            Poll::Ready(Ok(()))
        }
    }

    /// Replies written before a flush go out in one write, in order, and
    /// only after the flush yielded once.
    #[tokio::test]
    async fn a_burst_of_replies_is_one_write_after_one_yield() {
        let socket = Recorder::default();
        let mut io = Coalesce::new(socket.clone());
        io.write_all(b"one ").await.unwrap();
        io.write_all(b"two ").await.unwrap();
        io.write_all(b"three").await.unwrap();
        assert!(
            socket.writes().is_empty(),
            "nothing is written before a flush"
        );

        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(
            Pin::new(&mut io).poll_flush(&mut cx).is_pending(),
            "the first flush yields"
        );
        assert!(socket.writes().is_empty());
        // A reply that became ready during the yield joins the same write.
        io.write_all(b" four").await.unwrap();
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
        assert_eq!(socket.writes(), vec![b"one two three four".to_vec()]);

        // The next burst yields again.
        io.write_all(b"five").await.unwrap();
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        io.flush().await.unwrap();
        assert_eq!(socket.writes().len(), 2);
        assert_eq!(socket.writes()[1], b"five".to_vec());
    }

    /// A yield that gathers nothing turns yielding off for the next
    /// flushes; then it is tried again.
    #[tokio::test]
    async fn yields_that_gather_nothing_pause_yielding() {
        let socket = Recorder::default();
        let mut io = Coalesce::new(socket.clone());
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        io.write_all(b"lone").await.unwrap();
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_pending());
        assert!(
            Pin::new(&mut io).poll_flush(&mut cx).is_ready(),
            "nothing joined"
        );
        for i in 0..SKIP_AFTER_NO_GAIN {
            io.write_all(b"x").await.unwrap();
            assert!(
                Pin::new(&mut io).poll_flush(&mut cx).is_ready(),
                "flush {i} after a fruitless yield writes at once"
            );
        }
        assert_eq!(socket.writes().len(), 1 + usize::from(SKIP_AFTER_NO_GAIN));
        io.write_all(b"again").await.unwrap();
        assert!(
            Pin::new(&mut io).poll_flush(&mut cx).is_pending(),
            "then it yields again"
        );
    }

    /// A flush with nothing buffered does not yield.
    #[tokio::test]
    async fn an_empty_flush_is_immediate() {
        let mut io = Coalesce::new(Recorder::default());
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
    }

    /// Past the high-water mark the buffer is written out before more is
    /// taken, and a large write is passed on without a copy; nothing is
    /// lost or reordered.
    #[tokio::test]
    async fn large_writes_stream_instead_of_piling_up() {
        let socket = Recorder::default();
        let mut io = Coalesce::new(socket.clone());
        let small = vec![1u8; HIGH_WATER / 2 + 1];
        io.write_all(&small).await.unwrap();
        io.write_all(&small).await.unwrap();
        assert_eq!(
            socket.writes().len(),
            1,
            "the first half went out to make room"
        );
        let large = vec![2u8; HIGH_WATER * 2];
        io.write_all(&large).await.unwrap();
        io.flush().await.unwrap();
        let written: Vec<u8> = socket.writes().concat();
        let mut expected = small.clone();
        expected.extend_from_slice(&small);
        expected.extend_from_slice(&large);
        assert_eq!(written, expected);
        assert!(socket.writes().iter().all(|w| w.len() <= HIGH_WATER * 2));
    }

    /// Shutting down writes what is buffered first.
    #[tokio::test]
    async fn shutdown_drains_the_buffer() {
        let socket = Recorder::default();
        let mut io = Coalesce::new(socket.clone());
        io.write_all(b"last words").await.unwrap();
        io.shutdown().await.unwrap();
        assert_eq!(socket.writes(), vec![b"last words".to_vec()]);
        assert!(*socket.shut.lock().unwrap());
    }
}
