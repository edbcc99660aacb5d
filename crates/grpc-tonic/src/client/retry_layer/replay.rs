//! A call's request body, kept so that another attempt can send it again (A6's retry buffer).
//!
//! Every attempt gets a body of its own that reads the frames kept so far and then the source,
//! appending what it reads for the others. Once the kept bytes would pass the per-call limit,
//! nothing more is kept: the attempt sending the body goes on, and no other attempt can be made
//! (A6: the call is committed). A unary request's body is complete at once; a client stream's
//! arrives as the caller sends it, and an attempt after the first replays the messages so far.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame};
use tonic::Status;
use tonic::body::Body;

/// The kept request body of one call, shared by its attempts.
#[derive(Clone)]
pub(super) struct RequestReplay(Arc<Mutex<Kept>>);

struct Kept {
    /// What is left of the caller's body; `None` once it ended.
    source: Option<Body>,
    /// The data frames read so far, while under the limit.
    frames: Vec<Bytes>,
    /// Data frames read from the source so far (kept or not).
    frames_read: usize,
    kept_bytes: usize,
    limit: usize,
    /// The limit was passed: `frames` is dropped and no attempt but the current may read on.
    overflowed: bool,
    /// How the source ended: its trailers, or the error it failed with.
    trailers: Option<HeaderMap>,
    failed: Option<Status>,
    /// Attempts waiting for the source while another polls it (hedged attempts read at once).
    waiting: Vec<Waker>,
}

impl Kept {
    fn wake_all(&mut self) {
        for waker in self.waiting.drain(..) {
            waker.wake();
        }
    }
}

impl RequestReplay {
    /// Keeps `body` up to `limit` bytes.
    pub(super) fn new(body: Body, limit: usize) -> Self {
        Self(Arc::new(Mutex::new(Kept {
            source: Some(body),
            frames: Vec::new(),
            frames_read: 0,
            kept_bytes: 0,
            limit,
            overflowed: false,
            trailers: None,
            failed: None,
            waiting: Vec::new(),
        })))
    }

    fn lock(&self) -> MutexGuard<'_, Kept> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether another attempt can still send the whole body.
    pub(super) fn replayable(&self) -> bool {
        !self.lock().overflowed
    }

    /// A body for one attempt, from the first frame.
    pub(super) fn attempt_body(&self) -> Body {
        Body::new(AttemptBody {
            kept: self.clone(),
            next: 0,
            trailers_sent: false,
        })
    }
}

/// One attempt's view of the request body.
struct AttemptBody {
    kept: RequestReplay,
    /// The index of the next data frame this attempt sends.
    next: usize,
    trailers_sent: bool,
}

impl HttpBody for AttemptBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        let mut kept = this.kept.lock();
        if this.next < kept.frames_read {
            if kept.overflowed {
                // Only an attempt the layer gave up on can be behind once nothing is kept.
                return Poll::Ready(Some(Err(Status::cancelled(
                    "the request body is no longer kept for this attempt",
                ))));
            }
            let frame = kept.frames[this.next].clone();
            this.next += 1;
            return Poll::Ready(Some(Ok(Frame::data(frame))));
        }
        let Some(source) = kept.source.as_mut() else {
            if let Some(status) = &kept.failed {
                return Poll::Ready(Some(Err(status.clone())));
            }
            if !this.trailers_sent
                && let Some(trailers) = kept.trailers.clone()
            {
                this.trailers_sent = true;
                return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
            }
            return Poll::Ready(None);
        };
        let polled = Pin::new(source).poll_frame(cx);
        match polled {
            Poll::Pending => {
                if !kept.waiting.iter().any(|w| w.will_wake(cx.waker())) {
                    kept.waiting.push(cx.waker().clone());
                }
                Poll::Pending
            }
            Poll::Ready(None) => {
                kept.source = None;
                kept.wake_all();
                Poll::Ready(None)
            }
            Poll::Ready(Some(Err(status))) => {
                kept.source = None;
                kept.failed = Some(status.clone());
                kept.wake_all();
                Poll::Ready(Some(Err(status)))
            }
            Poll::Ready(Some(Ok(frame))) => {
                let frame = match frame.into_data() {
                    Ok(data) => {
                        kept.frames_read += 1;
                        this.next = kept.frames_read;
                        if !kept.overflowed {
                            if kept.kept_bytes + data.len() <= kept.limit {
                                kept.kept_bytes += data.len();
                                kept.frames.push(data.clone());
                            } else {
                                kept.overflowed = true;
                                kept.frames = Vec::new();
                            }
                        }
                        Frame::data(data)
                    }
                    Err(frame) => {
                        if let Some(trailers) = frame.trailers_ref() {
                            kept.trailers = Some(trailers.clone());
                            kept.source = None;
                            this.trailers_sent = true;
                        }
                        frame
                    }
                };
                kept.wake_all();
                Poll::Ready(Some(Ok(frame)))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.sent_everything()
    }
}

impl AttemptBody {
    /// Whether this attempt has sent everything: every kept frame, and a source that ended (or
    /// says it will yield nothing more), its trailers sent if it had any. Saying so lets the
    /// transport end the stream with the last data frame, as it would for the caller's own body.
    fn sent_everything(&self) -> bool {
        let kept = self.kept.lock();
        if self.next < kept.frames_read || kept.failed.is_some() {
            return false;
        }
        match &kept.source {
            Some(source) => source.is_end_stream(),
            None => kept.trailers.is_none() || self.trailers_sent,
        }
    }
}

impl Drop for AttemptBody {
    fn drop(&mut self) {
        // If this attempt was the one polling the source, another must take over.
        self.kept.lock().wake_all();
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;

    use super::*;

    fn body_of(chunks: &[&'static [u8]]) -> Body {
        let frames: Vec<Result<Frame<Bytes>, Status>> = chunks
            .iter()
            .map(|chunk| Ok(Frame::data(Bytes::from_static(chunk))))
            .collect();
        Body::new(http_body_util::StreamBody::new(tokio_stream::iter(frames)))
    }

    async fn read(body: Body) -> Vec<u8> {
        body.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn every_attempt_sends_the_whole_body_under_the_limit() {
        let replay = RequestReplay::new(body_of(&[b"ab", b"cd", b"ef"]), 16);
        assert_eq!(read(replay.attempt_body()).await, b"abcdef");
        assert!(replay.replayable());
        assert_eq!(read(replay.attempt_body()).await, b"abcdef");
    }

    #[tokio::test]
    async fn a_later_attempt_replays_what_an_earlier_one_read_then_reads_on() {
        let replay = RequestReplay::new(body_of(&[b"ab", b"cd", b"ef"]), 16);
        let mut first = replay.attempt_body();
        let frame = first.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"ab"));
        drop(first);
        assert_eq!(read(replay.attempt_body()).await, b"abcdef");
    }

    #[tokio::test]
    async fn past_the_limit_the_body_goes_on_but_cannot_be_sent_again() {
        let replay = RequestReplay::new(body_of(&[b"abcd", b"efgh"]), 6);
        assert_eq!(read(replay.attempt_body()).await, b"abcdefgh");
        assert!(!replay.replayable());
        let second = replay.attempt_body().collect().await;
        assert!(second.is_err(), "nothing kept to send again");
    }
}
