//! The gRPC-over-HTTP/2 framing the front speaks (https://github.com/grpc/grpc/blob/master/doc/PROTOCOL-HTTP2.md):
//! statuses and their `grpc-message` encoding, the `grpc-timeout` header, length-prefixed messages in
//! both directions, and the three shapes of answer (one message, trailers only, a stream).

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use tokio::sync::mpsc;

pub type ResponseBody = BoxBody<Bytes, Infallible>;

pub const OK: u32 = 0;
pub const INVALID_ARGUMENT: u32 = 3;
pub const DEADLINE_EXCEEDED: u32 = 4;
pub const NOT_FOUND: u32 = 5;
pub const RESOURCE_EXHAUSTED: u32 = 8;
pub const UNIMPLEMENTED: u32 = 12;
pub const INTERNAL: u32 = 13;
pub const UNAVAILABLE: u32 = 14;

/// grpcio's default limit for a received message.
pub const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// A gRPC status other than a plain OK with a message: what goes in `grpc-status` and `grpc-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: u32,
    pub message: String,
}

impl Status {
    pub fn new(code: u32, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
        }
    }

    fn trailers(&self) -> HeaderMap {
        let mut map = HeaderMap::with_capacity(2);
        map.insert("grpc-status", HeaderValue::from(self.code));
        if !self.message.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&percent_encode(&self.message)) {
                map.insert("grpc-message", value);
            }
        }
        map
    }
}

/// `grpc-message` as the spec says: UTF-8, with every byte outside 0x20-0x7E, and `%`, as `%XX`.
pub fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for &byte in text.as_bytes() {
        if (0x20..=0x7e).contains(&byte) && byte != b'%' {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `grpc-timeout`: at most 8 digits then a unit (Hours, Minutes, Seconds, milli, micro, nano).
/// `None` when absent or malformed (grpcio ignores a malformed one too).
pub fn parse_timeout(value: &str) -> Option<Duration> {
    let (&unit, digits) = value.as_bytes().split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let amount: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return None,
    })
}

/// Splits length-prefixed messages out of a request body as its bytes arrive, refusing a compressed
/// message or one over [`MAX_REQUEST`] as soon as its 5-byte prefix is in (the rest is never read).
#[derive(Default)]
pub struct Deframer {
    buffer: BytesMut,
}

impl Deframer {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole message, if in.
    pub fn next_message(&mut self) -> Result<Option<Bytes>, Status> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let compressed = self.buffer[0];
        let length = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
        if compressed != 0 {
            return Err(Status::new(UNIMPLEMENTED, "compressed requests are not supported"));
        }
        if length > MAX_REQUEST {
            return Err(Status::new(
                RESOURCE_EXHAUSTED,
                format!("Received message larger than max ({length} vs. {MAX_REQUEST})"),
            ));
        }
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        self.buffer.advance(5);
        Ok(Some(self.buffer.split_to(length).freeze()))
    }

    /// The body ended: fine unless it ended inside a message.
    pub fn finish(&self) -> Result<(), Status> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let announced = (self.buffer.len() >= 5)
            .then(|| u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]))
            .map_or_else(String::new, |n| format!(" of {n}"));
        Err(Status::new(
            INTERNAL,
            format!(
                "the request ends inside a message frame ({} bytes{announced} after the 5-byte prefix)",
                self.buffer.len().saturating_sub(5)
            ),
        ))
    }
}

/// The next message of a streaming request body; `Ok(None)` when the client half-closed cleanly,
/// `Err(None)` when it broke the stream (nobody to answer).
pub async fn next_message(body: &mut Incoming, deframer: &mut Deframer) -> Result<Option<Bytes>, Option<Status>> {
    loop {
        if let Some(message) = deframer.next_message()? {
            return Ok(Some(message));
        }
        match body.frame().await {
            None => return deframer.finish().map(|()| None).map_err(Some),
            Some(Err(_)) => return Err(None),
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    deframer.push(data);
                }
            }
        }
    }
}

/// The one message of a unary request: exactly one, whole, plain, within the size limit.
pub async fn read_unary(mut body: Incoming) -> Result<Bytes, Status> {
    let mut deframer = Deframer::default();
    let broken = || Status::new(INTERNAL, "the client broke the request stream");
    let Some(message) = next_message(&mut body, &mut deframer)
        .await
        .map_err(|e| e.unwrap_or_else(broken))?
    else {
        return Err(Status::new(
            INTERNAL,
            "a unary call needs exactly one request message; the client sent none",
        ));
    };
    match next_message(&mut body, &mut deframer).await {
        Ok(None) => Ok(message),
        Ok(Some(_)) => Err(Status::new(
            INTERNAL,
            "a unary call needs exactly one request message; the client sent more",
        )),
        Err(e) => Err(e.unwrap_or_else(broken)),
    }
}

/// `message` with its 5-byte prefix (uncompressed), as one DATA frame.
pub fn framed(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    out.put_slice(message);
    out.freeze()
}

fn grpc_response(body: ResponseBody) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}

/// A unary OK answer: one length-prefixed message, then the `grpc-status: 0` trailers.
struct Answer {
    message: Option<Bytes>,
    done: bool,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(message) = self.message.take() {
            return Poll::Ready(Some(Ok(Frame::data(framed(&message)))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        self.done = true;
        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        Poll::Ready(Some(Ok(Frame::trailers(trailers))))
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

pub fn answer(message: Bytes) -> Response<ResponseBody> {
    grpc_response(
        Answer {
            message: Some(message),
            done: false,
        }
        .boxed(),
    )
}

/// A trailers-only answer: the status in the one HEADERS frame, which ends the stream.
pub fn trailers_only(status: &Status) -> Response<ResponseBody> {
    let mut response = grpc_response(Empty::new().boxed());
    response.headers_mut().extend(status.trailers());
    response
}

pub fn answer_or_status(result: Result<Bytes, Status>) -> Response<ResponseBody> {
    match result {
        Ok(message) => answer(message),
        Err(status) => trailers_only(&status),
    }
}

/// A plain HTTP refusal of a request that is no gRPC call (415 as gRPC servers answer, 405...).
pub fn not_grpc(code: StatusCode, why: &'static str) -> Response<ResponseBody> {
    let mut response = Response::new(Full::new(Bytes::from_static(why.as_bytes())).boxed());
    *response.status_mut() = code;
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("text/plain"));
    response
}

/// What a streaming answer's task sends: messages, then a final status (sent as trailers).
pub struct Stream {
    sender: mpsc::Sender<Frame<Bytes>>,
}

impl Stream {
    /// Sends `message`; false when the client is gone.
    pub async fn send(&self, message: &[u8]) -> bool {
        self.sender.send(Frame::data(framed(message))).await.is_ok()
    }

    pub async fn finish(self, status: Status) {
        let _ = self.sender.send(Frame::trailers(status.trailers())).await;
    }

    /// Resolves when the client has gone away (the answer's body was dropped).
    pub async fn closed(&self) {
        self.sender.closed().await
    }
}

struct Streamed(mpsc::Receiver<Frame<Bytes>>);

impl Body for Streamed {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|frame| frame.map(Ok))
    }
}

/// A streaming answer and the handle its producer (a task) feeds it through.
pub fn streamed() -> (Response<ResponseBody>, Stream) {
    let (sender, receiver) = mpsc::channel(8);
    (grpc_response(Streamed(receiver).boxed()), Stream { sender })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_encodes_what_the_spec_says() {
        assert_eq!(percent_encode("plain text: ok!"), "plain text: ok!");
        assert_eq!(percent_encode("100% sure"), "100%25 sure");
        assert_eq!(percent_encode("a\nb\t"), "a%0Ab%09");
        assert_eq!(percent_encode("déjà ✓"), "d%C3%A9j%C3%A0 %E2%9C%93");
        assert_eq!(percent_encode("\x7f~"), "%7F~");
    }

    #[test]
    fn parses_every_timeout_unit() {
        assert_eq!(parse_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_timeout("10S"), Some(Duration::from_secs(10)));
        assert_eq!(parse_timeout("250m"), Some(Duration::from_millis(250)));
        assert_eq!(parse_timeout("99999999u"), Some(Duration::from_micros(99_999_999)));
        assert_eq!(parse_timeout("7n"), Some(Duration::from_nanos(7)));
        assert_eq!(parse_timeout("0m"), Some(Duration::ZERO));
        for bad in ["", "S", "123456789S", "10s", "1.5S", "-1S", "10", "1 S", "é", "1é"] {
            assert_eq!(parse_timeout(bad), None, "{bad:?}");
        }
    }

    fn prefix(flag: u8, length: u32) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend(length.to_be_bytes());
        out
    }

    #[test]
    fn deframes_messages_split_across_chunks() {
        let mut d = Deframer::default();
        let mut wire = framed(b"hello").to_vec();
        wire.extend_from_slice(&framed(b""));
        d.push(&wire[..3]);
        assert_eq!(d.next_message(), Ok(None));
        d.push(&wire[3..8]);
        assert_eq!(d.next_message(), Ok(None));
        d.push(&wire[8..]);
        assert_eq!(d.next_message(), Ok(Some(Bytes::from_static(b"hello"))));
        assert_eq!(d.next_message(), Ok(Some(Bytes::new())), "an empty message");
        assert_eq!(d.next_message(), Ok(None));
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn refuses_compressed_oversized_and_truncated_frames() {
        let mut d = Deframer::default();
        d.push(&prefix(1, 3));
        assert_eq!(d.next_message().unwrap_err().code, UNIMPLEMENTED);

        let mut d = Deframer::default();
        d.push(&prefix(0, 5_000_000)); // refused on the prefix alone
        assert_eq!(
            d.next_message(),
            Err(Status::new(
                RESOURCE_EXHAUSTED,
                "Received message larger than max (5000000 vs. 4194304)"
            ))
        );
        let mut d = Deframer::default();
        d.push(&prefix(0, MAX_REQUEST as u32));
        assert_eq!(d.next_message(), Ok(None), "the limit itself is fine");

        let mut d = Deframer::default();
        d.push(&prefix(0, 10));
        d.push(b"abc");
        assert_eq!(d.next_message(), Ok(None));
        let truncated = d.finish().unwrap_err();
        assert_eq!(truncated.code, INTERNAL);
        assert!(truncated.message.contains("3 bytes of 10"), "{}", truncated.message);
        let mut d = Deframer::default();
        d.push(&[0, 0]);
        assert_eq!(d.finish().unwrap_err().code, INTERNAL, "a cut prefix");
    }

    #[test]
    fn statuses_go_in_trailers_percent_encoded() {
        let response = trailers_only(&Status::new(NOT_FOUND, "no group «x»"));
        let headers = response.headers();
        assert_eq!(headers["content-type"], "application/grpc");
        assert_eq!(headers["grpc-status"], "5");
        assert_eq!(headers["grpc-message"], "no group %C2%ABx%C2%BB");
        assert!(response.body().is_end_stream(), "trailers only");
    }
}
