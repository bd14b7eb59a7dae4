//! One write per call instead of two.
//!
//! The CA's gRPC client (grpc-go) sends a PING with every request once the previous answer's DATA has
//! arrived (its bandwidth estimator), in the same write as the request. h2 answers the PING as soon as
//! it has read it, flushing before hyper has even seen the request, and the answer to the request
//! follows in a second write: two system calls here and two wake-ups of the client for every call.
//! grpc-go's own server sends both in one write. Two small pieces make ours do the same:
//!
//! * [`Coalescing`] wraps the connection's socket: the first write after bytes were read waits one
//!   turn of the scheduler (the task is woken at once and the bytes stay in h2's buffer);
//! * [`InlineFirst`] is the executor hyper gives each stream to: it polls the stream once where it is,
//!   so an answer the tables hold is in h2's buffer by the time the connection writes again; a stream
//!   that has to wait (a call to Python) is spawned as before.

use std::future::Future;
use std::io::{self, IoSlice};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A socket whose first write after a read yields once (see the module documentation).
pub struct Coalescing<T> {
    inner: T,
    /// Bytes were read since the last write: the next write waits one turn.
    read_since_write: bool,
}

impl<T> Coalescing<T> {
    pub fn new(inner: T) -> Self {
        Coalescing {
            inner,
            read_since_write: false,
        }
    }

    /// Pending the first time after a read, the task to be polled again once the other tasks ready on
    /// this thread have had their turn (tokio's `yield_now`, which wakes no other thread); the caller
    /// writes then, or sooner if it tries again in the same turn.
    fn yield_once(&mut self, cx: &mut Context<'_>) -> bool {
        if !self.read_since_write {
            return false;
        }
        self.read_since_write = false;
        let mut turn = std::pin::pin!(tokio::task::yield_now());
        turn.as_mut().poll(cx).is_pending()
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Coalescing<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.read_since_write = true;
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Coalescing<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        if self.yield_once(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.yield_once(cx) {
            return Poll::Pending;
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, data)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// hyper's executor for streams: poll once in place, spawn on tokio if not done.
#[derive(Clone, Copy, Default)]
pub struct InlineFirst;

impl<F> hyper::rt::Executor<F> for InlineFirst
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    fn execute(&self, future: F) {
        let mut future = Box::pin(future);
        // A future may be polled with any waker; only the last poll's is woken, and tokio polls it
        // again with its own before it can wait on anything.
        let mut cx = Context::from_waker(Waker::noop());
        match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(&mut cx))) {
            Ok(Poll::Ready(_)) => {}
            Ok(Poll::Pending) => {
                tokio::spawn(future);
            }
            // As a spawned task's panic would: that stream is dropped (reset), the connection goes on.
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A socket that holds `incoming` for reads and records each write call.
    #[derive(Default)]
    struct Recorded {
        incoming: Vec<u8>,
        writes: Vec<Vec<u8>>,
    }

    impl AsyncRead for Recorded {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
            let n = self.incoming.len().min(buf.remaining());
            let taken: Vec<u8> = self.incoming.drain(..n).collect();
            buf.put_slice(&taken);
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for Recorded {
        fn poll_write(mut self: Pin<&mut Self>, _: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
            self.writes.push(data.to_vec());
            Poll::Ready(Ok(data.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn the_first_write_after_a_read_waits_one_turn_later_writes_go_at_once() {
        runtime().block_on(async {
            let mut socket = Coalescing::new(Recorded {
                incoming: b"request".to_vec(),
                ..Recorded::default()
            });
            let mut cx = Context::from_waker(Waker::noop());
            assert!(
                Pin::new(&mut socket).poll_write(&mut cx, b"early").is_ready(),
                "nothing read yet"
            );
            let mut buf = [0u8; 16];
            assert_eq!(socket.read(&mut buf).await.unwrap(), 7);
            assert!(
                Pin::new(&mut socket).poll_write(&mut cx, b"pong").is_pending(),
                "first write after a read"
            );
            assert!(
                Pin::new(&mut socket).poll_write(&mut cx, b"pong").is_ready(),
                "its retry"
            );
            socket.write_all(b"answer").await.unwrap();
            assert_eq!(
                socket.inner.writes,
                [b"early".to_vec(), b"pong".to_vec(), b"answer".to_vec()]
            );
            // A task that yielded is polled again by itself: an awaited write completes.
            assert_eq!(socket.read(&mut buf).await.unwrap(), 0);
            socket.inner.incoming = b"more".to_vec();
            assert_eq!(socket.read(&mut buf).await.unwrap(), 4);
            socket.write_all(b"later").await.unwrap();
            assert_eq!(socket.inner.writes.last().unwrap(), b"later");
        });
    }

    #[test]
    fn a_stream_that_is_ready_finishes_in_place_one_that_waits_is_spawned() {
        runtime().block_on(async {
            let done = Arc::new(AtomicBool::new(false));
            let flag = done.clone();
            hyper::rt::Executor::execute(&InlineFirst, async move { flag.store(true, Ordering::SeqCst) });
            assert!(done.load(Ordering::SeqCst), "finished before execute returned");

            let (send, receive) = tokio::sync::oneshot::channel::<u8>();
            let (report, reported) = tokio::sync::oneshot::channel::<u8>();
            hyper::rt::Executor::execute(&InlineFirst, async move {
                let _ = report.send(receive.await.unwrap() + 1);
            });
            send.send(41).unwrap();
            assert_eq!(reported.await.unwrap(), 42, "spawned, then woken by its own waker");

            hyper::rt::Executor::execute(&InlineFirst, async { panic!("a stream's bug") });
        });
    }
}
