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

use crate::conn::{Conn, Reservation};
use std::sync::Arc;

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

/// `grpc-timeout`, decoded as grpc-go decodes it: 1 to 8 digits then a unit (Hours, Minutes, Seconds,
/// milli, micro, nano). The error says what is wrong (a call with one is refused INTERNAL).
pub fn decode_timeout(value: &str) -> Result<Duration, String> {
    if value.len() < 2 {
        return Err(format!("timeout string is too short: {value:?}"));
    }
    if value.len() > 9 {
        return Err(format!("timeout string is too long: {value:?}"));
    }
    let (&unit, digits) = value.as_bytes().split_last().expect("2 bytes at least");
    let scale: fn(u64) -> Duration = match unit {
        b'H' => |n| Duration::from_secs(n * 3600),
        b'M' => |n| Duration::from_secs(n * 60),
        b'S' => Duration::from_secs,
        b'm' => Duration::from_millis,
        b'u' => Duration::from_micros,
        b'n' => Duration::from_nanos,
        _ => return Err(format!("timeout unit is not recognized: {value:?}")),
    };
    if !digits.iter().all(u8::is_ascii_digit) {
        return Err(format!("timeout value is not a whole number: {value:?}"));
    }
    let amount: u64 = std::str::from_utf8(digits)
        .ok()
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| format!("timeout value is not a whole number: {value:?}"))?;
    Ok(scale(amount))
}

/// How the request's messages are compressed (`grpc-encoding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    Identity,
    Gzip,
    Deflate,
}

/// What `grpc-accept-encoding` says the front accepts (grpcio's list).
pub const ACCEPTED_ENCODINGS: &str = "identity,deflate,gzip";

impl Encoding {
    /// The request's encoding, or UNIMPLEMENTED naming what is accepted (the spec's answer).
    pub fn of(headers: &HeaderMap) -> Result<Encoding, Status> {
        let Some(value) = headers.get("grpc-encoding") else {
            return Ok(Encoding::Identity);
        };
        match value.as_bytes() {
            b"identity" => Ok(Encoding::Identity),
            b"gzip" => Ok(Encoding::Gzip),
            b"deflate" => Ok(Encoding::Deflate),
            other => Err(Status::new(
                UNIMPLEMENTED,
                format!(
                    "grpc-encoding {:?} is not supported; the server accepts {ACCEPTED_ENCODINGS}",
                    String::from_utf8_lossy(other)
                ),
            )),
        }
    }

    fn inflate(self, data: &[u8]) -> Result<Bytes, Status> {
        use std::io::Read;
        let limit = MAX_REQUEST as u64 + 1;
        let mut out = Vec::new();
        let read = match self {
            Encoding::Identity => return Ok(Bytes::copy_from_slice(data)),
            Encoding::Gzip => flate2::read::GzDecoder::new(data).take(limit).read_to_end(&mut out),
            Encoding::Deflate => flate2::read::ZlibDecoder::new(data).take(limit).read_to_end(&mut out),
        };
        read.map_err(|e| Status::new(INTERNAL, format!("the compressed request message is damaged ({e})")))?;
        if out.len() > MAX_REQUEST {
            return Err(Status::new(
                RESOURCE_EXHAUSTED,
                format!("Received message larger than max (over {MAX_REQUEST} bytes once decompressed)"),
            ));
        }
        Ok(Bytes::from(out))
    }
}

/// One request message, and the request bytes held for it until the call is done with it.
pub struct Received {
    pub message: Bytes,
    pub held: Reservation,
}

/// Splits length-prefixed messages out of a request body as its bytes arrive, refusing a message over
/// [`MAX_REQUEST`], or over what the connection and the process may hold, as soon as its 5-byte
/// prefix is in (the rest is never read), and decompressing what `grpc-encoding` compressed.
pub struct Deframer {
    buffer: BytesMut,
    encoding: Encoding,
    conn: Option<Arc<Conn>>,
    /// What the message being received holds.
    held: Option<Reservation>,
}

impl Default for Deframer {
    fn default() -> Self {
        Deframer::new(Encoding::Identity, None)
    }
}

impl Deframer {
    pub fn new(encoding: Encoding, conn: Option<Arc<Conn>>) -> Self {
        Deframer {
            buffer: BytesMut::new(),
            encoding,
            conn,
            held: None,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole message, if in.
    pub fn next_message(&mut self) -> Result<Option<Received>, Status> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let compressed = self.buffer[0];
        let length = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
        if compressed > 1 {
            return Err(Status::new(
                INTERNAL,
                format!("the message's compressed flag is {compressed}; it must be 0 or 1"),
            ));
        }
        if compressed == 1 && self.encoding == Encoding::Identity {
            return Err(Status::new(
                INTERNAL,
                "the message is flagged compressed but the request has no grpc-encoding",
            ));
        }
        if length > MAX_REQUEST {
            return Err(Status::new(
                RESOURCE_EXHAUSTED,
                format!("Received message larger than max ({length} vs. {MAX_REQUEST})"),
            ));
        }
        if self.held.is_none() {
            // A compressed message may grow to MAX_REQUEST once decompressed.
            let needed = length + if compressed == 1 { MAX_REQUEST } else { 0 };
            self.held = Some(match &self.conn {
                Some(conn) => conn.reserve(needed)?,
                None => Reservation::none(),
            });
            self.buffer.reserve(5 + length - self.buffer.len().min(5 + length));
        }
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        self.buffer.advance(5);
        let framed = self.buffer.split_to(length).freeze();
        let message = if compressed == 1 {
            self.encoding.inflate(&framed)?
        } else {
            framed
        };
        Ok(Some(Received {
            message,
            held: self.held.take().unwrap_or_else(Reservation::none),
        }))
    }

    /// Bytes of a further message are already in.
    pub fn has_more(&self) -> bool {
        !self.buffer.is_empty()
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
pub async fn next_message(body: &mut Incoming, deframer: &mut Deframer) -> Result<Option<Received>, Option<Status>> {
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

/// The one message of a unary request: whole, plain or decompressed, within the limits. It is
/// answered as soon as it is in, as grpcio does: the client's half-close is not waited for, and a
/// second message counts only if it came with the first.
pub async fn read_unary(mut body: Incoming, mut deframer: Deframer) -> Result<Received, Status> {
    let broken = || Status::new(INTERNAL, "the client broke the request stream");
    let Some(received) = next_message(&mut body, &mut deframer)
        .await
        .map_err(|e| e.unwrap_or_else(broken))?
    else {
        return Err(Status::new(
            INTERNAL,
            "a unary call needs exactly one request message; the client sent none",
        ));
    };
    if deframer.has_more() {
        return Err(Status::new(
            INTERNAL,
            "a unary call needs exactly one request message; the client sent more",
        ));
    }
    Ok(received)
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

/// How long a stream's final status may wait for a client that does not read.
pub const FINISH_WAIT: Duration = Duration::from_secs(5);

/// What a streaming answer's task sends: messages, then a final status (sent as trailers).
pub struct Stream {
    sender: mpsc::Sender<Frame<Bytes>>,
}

impl Stream {
    /// Sends `message`; false when the client is gone.
    pub async fn send(&self, message: &[u8]) -> bool {
        self.sender.send(Frame::data(framed(message))).await.is_ok()
    }

    /// Sends the final status; given up after [`FINISH_WAIT`] if the client reads nothing (the
    /// stream then ends without it).
    pub async fn finish(self, status: Status) {
        let trailers = Frame::trailers(status.trailers());
        let _ = tokio::time::timeout(FINISH_WAIT, self.sender.send(trailers)).await;
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
    fn decodes_every_timeout_unit_and_refuses_what_grpc_go_refuses() {
        assert_eq!(decode_timeout("2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(decode_timeout("3M"), Ok(Duration::from_secs(180)));
        assert_eq!(decode_timeout("10S"), Ok(Duration::from_secs(10)));
        assert_eq!(decode_timeout("250m"), Ok(Duration::from_millis(250)));
        assert_eq!(decode_timeout("99999999u"), Ok(Duration::from_micros(99_999_999)));
        assert_eq!(decode_timeout("7n"), Ok(Duration::from_nanos(7)));
        assert_eq!(decode_timeout("0m"), Ok(Duration::ZERO));
        assert_eq!(decode_timeout("00000001S"), Ok(Duration::from_secs(1)));
        for (bad, why) in [
            ("", "too short"),
            ("S", "too short"),
            ("123456789S", "too long"),
            ("10s", "unit"),
            ("abc", "unit"),
            ("10", "unit"),
            ("1.5S", "whole number"),
            ("-1S", "whole number"),
            ("+1S", "whole number"),
            ("1 S", "whole number"),
        ] {
            let refused = decode_timeout(bad).unwrap_err();
            assert!(refused.contains(why), "{bad:?}: {refused}");
        }
    }

    #[test]
    fn knows_the_encodings_it_accepts() {
        let mut headers = HeaderMap::new();
        assert_eq!(Encoding::of(&headers), Ok(Encoding::Identity));
        for (name, encoding) in [
            ("identity", Encoding::Identity),
            ("gzip", Encoding::Gzip),
            ("deflate", Encoding::Deflate),
        ] {
            headers.insert("grpc-encoding", name.parse().unwrap());
            assert_eq!(Encoding::of(&headers), Ok(encoding));
        }
        headers.insert("grpc-encoding", "snappy".parse().unwrap());
        let refused = Encoding::of(&headers).unwrap_err();
        assert_eq!(refused.code, UNIMPLEMENTED);
        assert!(refused.message.contains(ACCEPTED_ENCODINGS), "{}", refused.message);
    }

    #[test]
    fn decompresses_gzip_and_deflate_within_the_size_limit() {
        use std::io::Write;
        let plain = b"hello, compressed world".repeat(10);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&plain).unwrap();
        let mut zl = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
        zl.write_all(&plain).unwrap();
        for (encoding, body) in [
            (Encoding::Gzip, gz.finish().unwrap()),
            (Encoding::Deflate, zl.finish().unwrap()),
        ] {
            let mut d = Deframer::new(encoding, None);
            d.push(&prefix(1, body.len() as u32));
            d.push(&body);
            assert_eq!(&d.next_message().unwrap().unwrap().message[..], &plain[..]);
        }
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        bomb.write_all(&vec![0; MAX_REQUEST + 1]).unwrap();
        let bomb = bomb.finish().unwrap();
        let mut d = Deframer::new(Encoding::Gzip, None);
        d.push(&prefix(1, bomb.len() as u32));
        d.push(&bomb);
        assert_eq!(
            d.next_message().err().unwrap().code,
            RESOURCE_EXHAUSTED,
            "a decompression bomb"
        );
        let mut d = Deframer::new(Encoding::Gzip, None);
        d.push(&prefix(1, 3));
        d.push(b"xyz");
        assert_eq!(d.next_message().err().unwrap().code, INTERNAL, "damaged");
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
        assert!(message(&mut d).is_none());
        d.push(&wire[3..8]);
        assert!(message(&mut d).is_none());
        d.push(&wire[8..]);
        assert_eq!(message(&mut d), Some(Bytes::from_static(b"hello")));
        assert_eq!(message(&mut d), Some(Bytes::new()), "an empty message");
        assert!(message(&mut d).is_none());
        assert_eq!(d.finish(), Ok(()));
    }

    fn message(d: &mut Deframer) -> Option<Bytes> {
        d.next_message().unwrap().map(|r| r.message)
    }

    #[test]
    fn refuses_unannounced_compression_oversized_and_truncated_frames() {
        let mut d = Deframer::default();
        d.push(&prefix(1, 3));
        assert_eq!(
            d.next_message().err().unwrap(),
            Status::new(
                INTERNAL,
                "the message is flagged compressed but the request has no grpc-encoding"
            ),
            "the spec's code: INTERNAL"
        );
        let mut d = Deframer::default();
        d.push(&prefix(2, 3));
        assert_eq!(d.next_message().err().unwrap().code, INTERNAL);

        let mut d = Deframer::default();
        d.push(&prefix(0, 5_000_000)); // refused on the prefix alone
        assert_eq!(
            d.next_message().err().unwrap(),
            Status::new(
                RESOURCE_EXHAUSTED,
                "Received message larger than max (5000000 vs. 4194304)"
            )
        );
        let mut d = Deframer::default();
        d.push(&prefix(0, MAX_REQUEST as u32));
        assert!(message(&mut d).is_none(), "the limit itself is fine");

        let mut d = Deframer::default();
        d.push(&prefix(0, 10));
        d.push(b"abc");
        assert!(message(&mut d).is_none());
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
