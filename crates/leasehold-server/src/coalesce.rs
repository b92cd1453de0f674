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

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Above this many buffered bytes a write goes out before more is taken, so
/// a large reply (a transcript) streams instead of piling up in memory.
const HIGH_WATER: usize = 64 * 1024;

/// A byte stream whose flushes are coalesced (see the [module docs](self)).
#[derive(Debug)]
pub struct Coalesce<T> {
    inner: T,
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    written: usize,
    /// Whether this burst has yielded once already.
    yielded: bool,
}

impl<T> Coalesce<T> {
    /// Wraps `inner`.
    pub fn new(inner: T) -> Self {
        Coalesce {
            inner,
            buf: Vec::with_capacity(4096),
            written: 0,
            yielded: false,
        }
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &T {
        &self.inner
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
        if !this.yielded {
            // Let the replies that are about to be ready join this write.
            this.yielded = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
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
