//! A connection's writer: resolves the replies in request order, encodes them and writes
//! them in few writes, large values from the bytes they came in, long flushes from the
//! node's bulk runtime; relays a `KEEL.INVOKE`'s pushed views as they come.

use super::{BULK_WRITE_MIN, WRITE_BUFFER_BYTES_MAX, WRITE_SLICE_BYTES};
use crate::front_door::commands::correctables::{View, INVOKE_ENDED};
use crate::front_door::conn::{Pending, Resolved};
use crate::metrics::Metrics;
use crate::pubsub::{Pushed, Pushes};
use bytes::Bytes;
use keel_wire::resp::{encode_shared, Frame, Protocol};
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Replies encoded and not yet written: bytes of their own, and the large values they
/// share with the store, each due at an offset of those bytes.
struct Output {
    own: Vec<u8>,
    shared: Vec<(usize, Bytes)>,
    shared_bytes: usize,
    /// How long a write may make no progress.
    stall: std::time::Duration,
}

impl Output {
    /// Nothing to write (allocates nothing).
    fn empty(stall: std::time::Duration) -> Output {
        Output { own: Vec::new(), shared: Vec::new(), shared_bytes: 0, stall }
    }

    fn len(&self) -> usize {
        self.own.len() + self.shared_bytes
    }

    fn push(&mut self, frame: &Frame, protocol: Protocol) {
        let before = self.shared.len();
        encode_shared(frame, protocol, &mut self.own, &mut self.shared);
        self.shared_bytes += self.shared[before..].iter().map(|(_, b)| b.len()).sum::<usize>();
    }

    /// Writes everything; `false` when the connection failed or stalled.
    async fn flush<W: AsyncWrite + Unpin>(&mut self, writer: &mut W) -> bool {
        let mut at = 0;
        let mut ok = true;
        for (offset, bytes) in &self.shared {
            ok = ok
                && write_within(writer, &self.own[at..*offset], self.stall).await
                && write_within(writer, bytes, self.stall).await;
            at = *offset;
        }
        ok = ok && write_within(writer, &self.own[at..], self.stall).await;
        // A TLS stream may hold the last record until flushed (TCP: nothing to do).
        ok = ok && matches!(tokio::time::timeout(self.stall, writer.flush()).await, Ok(Ok(())));
        self.own.clear();
        self.shared.clear();
        self.shared_bytes = 0;
        if self.own.capacity() > 2 * WRITE_BUFFER_BYTES_MAX {
            self.own.shrink_to(WRITE_BUFFER_BYTES_MAX);
        }
        ok
    }
}

/// Writes `bytes` whole; `false` when the connection failed or no byte could be written
/// for `stall` (a client that does not read its replies).
async fn write_within<W: AsyncWrite + Unpin>(
    writer: &mut W,
    mut bytes: &[u8],
    stall: std::time::Duration,
) -> bool {
    while !bytes.is_empty() {
        let slice = &bytes[..bytes.len().min(WRITE_SLICE_BYTES)];
        match tokio::time::timeout(stall, writer.write(slice)).await {
            Ok(Ok(n)) if n > 0 => bytes = &bytes[n..],
            _ => return false,
        }
        if !bytes.is_empty() {
            // The engine loops share the runtime: let them in between slices.
            tokio::task::yield_now().await;
        }
    }
    true
}

/// Where a connection's replies go: its socket's write half, written from the
/// connection's task, or from the bulk runtime for a flush longer than
/// [`BULK_WRITE_MIN`].
pub(super) struct Sink<W> {
    /// `None` only after a bulk write was lost with the bulk runtime (the node stops).
    writer: Option<W>,
    bulk: Option<tokio::runtime::Handle>,
}

impl<W: AsyncWrite + Unpin + Send + 'static> Sink<W> {
    /// Replies to `writer`, flushes longer than [`BULK_WRITE_MIN`] written from `bulk`.
    pub(super) fn new(writer: W, bulk: Option<tokio::runtime::Handle>) -> Sink<W> {
        Sink { writer: Some(writer), bulk }
    }

    /// Writes everything in `out`; `false` when the connection failed or stalled.
    async fn flush(&mut self, out: &mut Output) -> bool {
        let Some(writer) = self.writer.as_mut() else { return false };
        let bulk = match &self.bulk {
            Some(bulk) if out.len() > BULK_WRITE_MIN => bulk,
            _ => return out.flush(writer).await,
        };
        let Some(mut writer) = self.writer.take() else { return false };
        let mut taken = std::mem::replace(out, Output::empty(out.stall));
        // The task gives the writer and the buffers back. If this connection's task is
        // dropped meanwhile it still ends: once written, or when a write stalls.
        let written = bulk.spawn(async move {
            let ok = taken.flush(&mut writer).await;
            (writer, taken, ok)
        });
        match written.await {
            Ok((writer, taken, ok)) => {
                self.writer = Some(writer);
                *out = taken;
                ok
            }
            Err(_) => false, // the bulk runtime is shutting down with the node
        }
    }

    async fn shutdown(self) {
        if let Some(mut writer) = self.writer {
            let _ = writer.shutdown().await;
        }
    }
}

/// Writes a `KEEL.INVOKE`'s preliminary views as they come, each flushed at once (the
/// point is to show them before the final one), and returns the final reply; `None` if
/// the client went away.
async fn relay_views<W: AsyncWrite + Unpin + Send + 'static>(
    mut views: mpsc::Receiver<View>,
    out: &mut Output,
    sink: &mut Sink<W>,
    protocol: Protocol,
) -> Option<Frame> {
    loop {
        match views.recv().await {
            Some(View::Push(frame)) => {
                out.push(&frame, protocol);
                if !sink.flush(out).await {
                    return None;
                }
            }
            Some(View::Final(frame)) => return Some(frame),
            None => return Some(Frame::error(INVOKE_ENDED)),
        }
    }
}

/// What a connection's writer writes: its replies in request order, the frames pushed to
/// it (pub/sub) between them, and where it counts the replies resolved.
pub(super) struct Replies {
    /// The replies, in request order.
    pub(super) pending: mpsc::Receiver<Pending>,
    /// The pushed frames.
    pub(super) pushes: Pushes,
    /// Replies resolved so far.
    pub(super) resolved: Arc<Resolved>,
    /// The node's metrics (outboxes overflowed).
    pub(super) metrics: Arc<Metrics>,
}

/// Moves the pushed frames queued now into `out`; `false` when the outbox overflowed
/// (the connection must close).
fn take_pushes(pushes: &mut Pushes, out: &mut Output, metrics: &Metrics) -> bool {
    while let Ok(pushed) = pushes.rx.try_recv() {
        if !put_pushed(pushed, pushes, out, metrics) {
            return false;
        }
    }
    true
}

fn put_pushed(pushed: Pushed, pushes: &Pushes, out: &mut Output, metrics: &Metrics) -> bool {
    match pushed {
        Pushed::Frame(frame, protocol, size) => {
            out.push(&frame, protocol);
            pushes.bytes.fetch_sub(size, Ordering::Relaxed);
            true
        }
        Pushed::Overflow => {
            metrics.pubsub_overflows.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// Resolves replies in order and writes them, flushing whenever the next reply is not
/// ready: when none is queued, and before waiting for one still being computed (a read
/// waiting for a durability round), so that the replies before it leave at once. Frames
/// pushed to the connection are written between replies: those queued before a reply is
/// taken, before it.
pub(super) async fn write_replies<W: AsyncWrite + Unpin + Send + 'static>(
    mut sink: Sink<W>,
    replies: Replies,
    stall: std::time::Duration,
) {
    struct Stopped(Arc<Resolved>);
    impl Drop for Stopped {
        fn drop(&mut self) {
            self.0.stopped();
        }
    }
    let Replies { mut pending, mut pushes, resolved, metrics } = replies;
    let resolved = Stopped(resolved);
    let mut out = Output {
        own: Vec::with_capacity(WRITE_BUFFER_BYTES_MAX),
        shared: Vec::new(),
        shared_bytes: 0,
        stall,
    };
    let mut pushes_open = true;
    loop {
        if !take_pushes(&mut pushes, &mut out, &metrics) {
            break;
        }
        if out.len() >= WRITE_BUFFER_BYTES_MAX && !sink.flush(&mut out).await {
            return;
        }
        let next = match pending.try_recv() {
            Ok(next) => next,
            Err(mpsc::error::TryRecvError::Empty) => {
                if out.len() > 0 && !sink.flush(&mut out).await {
                    return;
                }
                tokio::select! {
                    biased;
                    next = pending.recv() => match next {
                        Some(next) => next,
                        None => return,
                    },
                    pushed = pushes.rx.recv(), if pushes_open => {
                        match pushed {
                            Some(pushed) => {
                                if !put_pushed(pushed, &pushes, &mut out, &metrics) {
                                    break;
                                }
                            }
                            None => pushes_open = false,
                        }
                        continue;
                    }
                }
            }
            Err(mpsc::error::TryRecvError::Disconnected) => break,
        };
        let protocol: Protocol = next.protocol;
        let (close, silent) = (next.close, next.silent);
        let mut next = next;
        let frame: Frame = match next.take_views() {
            Some(views) => match relay_views(views, &mut out, &mut sink, protocol).await {
                Some(frame) => frame,
                None => return,
            },
            None => {
                let mut reply = std::pin::pin!(next.resolve());
                let polled = std::future::poll_fn(|cx| Poll::Ready(reply.as_mut().poll(cx)));
                match polled.await {
                    Poll::Ready(frame) => frame,
                    Poll::Pending => {
                        if out.len() > 0 && !sink.flush(&mut out).await {
                            return;
                        }
                        reply.await
                    }
                }
            }
        };
        resolved.0.one_more();
        if !silent {
            out.push(&frame, protocol);
        }
        if close {
            break;
        }
        if out.len() >= WRITE_BUFFER_BYTES_MAX && !sink.flush(&mut out).await {
            return;
        }
    }
    let _ = sink.flush(&mut out).await;
    sink.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::pin::Pin;
    use std::task::Context;

    /// Takes every byte offered and records how many each write offered, on which
    /// thread, and the bytes (shared, for a test to read while the writer runs; `wrote` is
    /// notified per write).
    #[derive(Default)]
    struct Recording {
        offered: Vec<usize>,
        threads: Vec<String>,
        written: Arc<std::sync::Mutex<Vec<u8>>>,
        wrote: Arc<tokio::sync::Notify>,
    }

    impl AsyncWrite for Recording {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<std::io::Result<usize>> {
            self.offered.push(buf.len());
            let thread = std::thread::current().name().unwrap_or_default().to_string();
            self.threads.push(thread);
            self.written.lock().expect("not poisoned").extend_from_slice(buf);
            self.wrote.notify_one();
            Poll::Ready(Ok(buf.len()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_large_reply_is_written_in_slices_a_small_one_whole() {
        let stall = std::time::Duration::from_secs(1);
        let mut writer = Recording::default();
        let large = vec![b'v'; 2 * WRITE_SLICE_BYTES + 10];
        assert!(write_within(&mut writer, &large, stall).await);
        assert_eq!(writer.offered, [WRITE_SLICE_BYTES, WRITE_SLICE_BYTES, 10]);
        let mut writer = Recording::default();
        assert!(write_within(&mut writer, b"+OK\r\n", stall).await);
        assert_eq!(writer.offered, [5]);
    }

    #[test]
    fn a_flush_longer_than_a_slice_is_written_on_the_bulk_runtime_a_short_one_in_place() {
        let bulk = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("test-bulk")
            .enable_all()
            .build()
            .expect("a runtime");
        let main =
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
        main.block_on(async {
            let stall = std::time::Duration::from_secs(1);
            let mut sink =
                Sink { writer: Some(Recording::default()), bulk: Some(bulk.handle().clone()) };
            let mut out = Output::empty(stall);
            out.push(&Frame::ok(), Protocol::Resp2);
            assert!(sink.flush(&mut out).await);
            assert_eq!(out.len(), 0, "flushed");
            let here = std::thread::current().name().unwrap_or_default().to_string();
            assert_eq!(sink.writer.as_ref().expect("kept").threads, [here]);
            let large = Frame::Bulk(Bytes::from(vec![b'v'; BULK_WRITE_MIN + 1]));
            out.push(&large, Protocol::Resp2);
            assert!(sink.flush(&mut out).await);
            assert_eq!(out.len(), 0, "flushed");
            let threads = &sink.writer.as_ref().expect("given back").threads;
            assert!(threads.len() > 2, "{threads:?}");
            assert!(threads[1..].iter().all(|t| t == "test-bulk"), "{threads:?}");
            // Once the bulk runtime is gone, a long flush fails instead of hanging.
            let mut sink =
                Sink { writer: Some(Recording::default()), bulk: Some(bulk.handle().clone()) };
            bulk.shutdown_background();
            out.push(&large, Protocol::Resp2);
            assert!(!sink.flush(&mut out).await);
        });
    }

    #[tokio::test]
    async fn replies_ready_leave_before_the_writer_waits_for_a_later_one() {
        let writer = Recording::default();
        let (written, wrote) = (writer.written.clone(), writer.wrote.clone());
        let (queue, pending) = mpsc::channel(8);
        let (_outbox, pushes) = crate::pubsub::Outbox::new();
        let replies = Replies {
            pending,
            pushes,
            resolved: Arc::new(Resolved::default()),
            metrics: Arc::new(Metrics::default()),
        };
        let task = tokio::spawn(write_replies(
            Sink { writer: Some(writer), bulk: None },
            replies,
            std::time::Duration::from_secs(5),
        ));
        // A reply that is ready, then one that never comes (a read waiting for a round),
        // queued together as a pipeline's reader queues them.
        queue.send(Pending::ready(Frame::ok(), Protocol::Resp2)).await.expect("open");
        let never: crate::front_door::ReplyFuture = Box::pin(std::future::pending());
        queue.send(Pending::later(never, Protocol::Resp2)).await.expect("open");
        let bound = std::time::Duration::from_secs(2);
        tokio::time::timeout(bound, wrote.notified()).await.expect("the ready reply was held back");
        assert_eq!(written.lock().expect("not poisoned").as_slice(), b"+OK\r\n");
        task.abort();
    }
}
