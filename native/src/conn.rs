//! Client connections: how many, how long each may stay silent, what each may hold, and how each ends.
//!
//! * [`Limits`]: the bounds an operator sets (`serving.*` in the config, docs/reference/config.md).
//! * [`Connections`]: every open connection. At `max_connections` a new one evicts the connection idle
//!   the longest (no open stream; one that never served a call first), so a flood of idle connections
//!   never locks out a prober or the CA; when every connection has an open stream, the new one is closed.
//!   While the replica does not lead ([`Connections::follow`]), every connection is sent away a short
//!   time after it stopped leading, and one that arrives later once it has been open a moment.
//! * [`Conn`]: one connection's open streams, last activity, request bytes held, age, and its GOAWAY signal.
//!   [`age_deadline`]: when its age sends it away, grpc-go's `MaxConnectionAge` (with +/-10 % jitter)
//!   and `MaxConnectionAgeGrace`.
//! * [`FrameWatch`]: the connection's byte stream, seen at HTTP/2 frame level: when the client's
//!   preface and SETTINGS are in (the handshake deadline), and its PINGs, held to grpc-go's
//!   enforcement policy (more than two too early: GOAWAY ENHANCE_YOUR_CALM `too_many_pings`, closed).
//!   hyper answers PINGs itself and tells nobody, so the policy needs the frames.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{watch, Notify};

use crate::grpc::{self, ResponseBody, Status};

/// What one connection may hold in request messages being received or waiting for Python.
pub const CONNECTION_REQUEST_BUFFER: usize = 4 * grpc::MAX_REQUEST;
/// Beyond this header list size the HTTP/2 layer itself refuses the stream (HTTP 431, and over four
/// times this it closes the connection); below it, a list over `max_header_list_size` is refused
/// RESOURCE_EXHAUSTED for that call only.
pub const HARD_HEADER_LIST_SIZE: u32 = 1024 * 1024;
/// grpc-go's enforcement policy: without an open stream a ping is due at most every two hours, and
/// the third ping too early closes the connection.
const PING_WITHOUT_STREAMS: Duration = Duration::from_secs(2 * 3600);
const MAX_PING_STRIKES: u32 = 2;

/// The bounds on client connections (see `server/config.py`, `serving.*`).
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_concurrent_streams: u32,
    /// Request header lists over this many bytes (names, values, 32 each) get RESOURCE_EXHAUSTED.
    pub max_header_list_size: u32,
    /// How often the server pings a connection (`None`: never), and how long it waits for the answer.
    pub keepalive_time: Option<Duration>,
    pub keepalive_timeout: Duration,
    /// The client's pings, while it has a stream open, may come this often at most.
    pub min_ping_interval: Duration,
    /// From accept to the client's HTTP/2 SETTINGS (TLS handshake included).
    pub handshake_timeout: Duration,
    /// A connection with no open stream this long gets GOAWAY (`None`: never).
    pub idle_timeout: Option<Duration>,
    /// Request message bytes the whole process holds at once (being received or waiting for Python).
    pub request_buffer: usize,
    /// A connection open this long (+/-10 %) gets GOAWAY (`None`: never); its calls then get
    /// `max_connection_age_grace` before it is closed (grpc-go's `MaxConnectionAge`, `...Grace`).
    pub max_connection_age: Option<Duration>,
    pub max_connection_age_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            max_concurrent_streams: 100,
            max_header_list_size: 16 * 1024,
            keepalive_time: Some(Duration::from_secs(60)),
            keepalive_timeout: Duration::from_secs(20),
            min_ping_interval: Duration::from_secs(300),
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Some(Duration::from_secs(300)),
            request_buffer: 64 * 1024 * 1024,
            max_connection_age: Some(Duration::from_secs(300)),
            max_connection_age_grace: Duration::from_secs(10),
        }
    }
}

/// Milliseconds since the first call: a connection's last activity fits an atomic.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// +/-10 %, as grpc-go spreads `MaxConnectionAge`, so that connections opened together do not all
/// reconnect at once.
const AGE_JITTER: f64 = 0.1;

/// A factor in [1 - AGE_JITTER, 1 + AGE_JITTER], different for every connection (the standard
/// library's randomly keyed hasher is random enough to spread reconnections).
fn age_jitter(id: u64) -> f64 {
    let unit = RandomState::new().hash_one(id) as f64 / u64::MAX as f64;
    1.0 - AGE_JITTER + 2.0 * AGE_JITTER * unit
}

/// The replica does not lead: connections go elsewhere (see [`Connections::follow`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Following {
    /// When it stopped leading (or started following, at start).
    pub since: tokio::time::Instant,
    /// Every connection goes away at `since + age` (by then a Service no longer sends clients here)...
    pub age: Duration,
    /// ... or, when it came later (a client that reached this replica directly, or a Service late to
    /// see it unready), once it has been open `late_age`.
    pub late_age: Duration,
    /// What its calls get after the GOAWAY.
    pub grace: Duration,
}

/// When `conn`'s age sends it away, and the grace its calls get then: the earlier of the configured
/// maximum age (with the connection's jitter) and, while the replica follows, the follower's deadline.
pub fn age_deadline(
    conn: &Conn,
    limits: &Limits,
    following: Option<Following>,
) -> Option<(tokio::time::Instant, Duration)> {
    let aged = limits
        .max_connection_age
        .map(|age| (conn.opened + age.mul_f64(conn.jitter), limits.max_connection_age_grace));
    let followed = following.map(|f| ((f.since + f.age).max(conn.opened + f.late_age), f.grace));
    match (aged, followed) {
        (Some(a), Some(f)) => Some(if f.0 < a.0 { f } else { a }),
        (a, f) => a.or(f),
    }
}

/// One client connection, shared by its task, its streams and the registry.
pub struct Conn {
    id: u64,
    /// When it was accepted, and its age's jitter factor.
    opened: tokio::time::Instant,
    jitter: f64,
    streams: AtomicUsize,
    last_active_ms: AtomicU64,
    served: AtomicBool,
    handshaken: AtomicBool,
    /// Request bytes this connection's calls hold, and the process's total (shared by every `Conn`).
    buffered: AtomicUsize,
    process_buffered: Arc<AtomicUsize>,
    process_limit: usize,
    /// `Some(grace)`: send GOAWAY, let open calls finish within `grace`, then close.
    goaway: watch::Sender<Option<Duration>>,
}

impl Conn {
    fn new(id: u64, process_buffered: Arc<AtomicUsize>, process_limit: usize) -> Self {
        Conn {
            id,
            opened: tokio::time::Instant::now(),
            jitter: age_jitter(id),
            streams: AtomicUsize::new(0),
            last_active_ms: AtomicU64::new(now_ms()),
            served: AtomicBool::new(false),
            handshaken: AtomicBool::new(false),
            buffered: AtomicUsize::new(0),
            process_buffered,
            process_limit,
            goaway: watch::Sender::new(None),
        }
    }

    /// A connection for one test: no registry, the default budgets.
    pub fn detached() -> Arc<Self> {
        Arc::new(Conn::new(0, Arc::default(), Limits::default().request_buffer))
    }

    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    pub fn handshaken(&self) -> bool {
        self.handshaken.load(Ordering::Relaxed)
    }

    fn idle_since_ms(&self) -> u64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    /// Ask the connection to go away: GOAWAY now, open calls get `grace` (the shortest asked wins).
    pub fn go_away(&self, grace: Duration) {
        self.goaway.send_if_modified(|current| match current {
            Some(old) if *old <= grace => false,
            _ => {
                *current = Some(grace);
                true
            }
        });
    }

    /// Resolves when the connection is asked to go away.
    pub async fn going_away(&self) -> Duration {
        let mut receiver = self.goaway.subscribe();
        let grace = receiver.wait_for(Option::is_some).await.ok().and_then(|grace| *grace);
        grace.unwrap_or(Duration::ZERO)
    }

    /// Hold `bytes` of request message for one call, or RESOURCE_EXHAUSTED naming the limit reached.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Result<Reservation, Status> {
        if bytes == 0 {
            return Ok(Reservation { conn: None, bytes: 0 });
        }
        let held = self.buffered.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let total = self.process_buffered.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let reservation = Reservation {
            conn: Some(self.clone()),
            bytes,
        };
        if held > CONNECTION_REQUEST_BUFFER {
            return Err(Status::new(
                grpc::RESOURCE_EXHAUSTED,
                format!(
                    "this connection's calls already hold {} bytes of request messages (at most {CONNECTION_REQUEST_BUFFER}); retry when they end",
                    held - bytes
                ),
            ));
        }
        if total > self.process_limit {
            return Err(Status::new(
                grpc::RESOURCE_EXHAUSTED,
                format!(
                    "the server holds {} bytes of request messages (at most {}, serving.request_buffer); retry later",
                    total - bytes,
                    self.process_limit
                ),
            ));
        }
        Ok(reservation)
    }
}

/// Request bytes held for one call; given back when dropped.
pub struct Reservation {
    conn: Option<Arc<Conn>>,
    bytes: usize,
}

impl Reservation {
    pub fn none() -> Self {
        Reservation { conn: None, bytes: 0 }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(conn) = &self.conn {
            conn.buffered.fetch_sub(self.bytes, Ordering::Relaxed);
            conn.process_buffered.fetch_sub(self.bytes, Ordering::Relaxed);
        }
    }
}

/// One open stream of a connection: counted from its request's headers until its answer is done.
pub struct StreamGuard(Arc<Conn>);

impl StreamGuard {
    pub fn new(conn: Arc<Conn>) -> Self {
        conn.streams.fetch_add(1, Ordering::Relaxed);
        conn.served.store(true, Ordering::Relaxed);
        conn.last_active_ms.store(now_ms(), Ordering::Relaxed);
        StreamGuard(conn)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.last_active_ms.store(now_ms(), Ordering::Relaxed);
        self.0.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

/// An answer's body, keeping its stream counted until hyper drops it (sent, or reset by the client).
pub struct Guarded {
    body: ResponseBody,
    _stream: StreamGuard,
}

impl Guarded {
    pub fn new(body: ResponseBody, stream: StreamGuard) -> Self {
        Guarded { body, _stream: stream }
    }
}

impl Body for Guarded {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Every open connection.
pub struct Connections {
    pub limits: Limits,
    /// `Some` while the replica does not lead: every connection task watches it.
    pub following: watch::Sender<Option<Following>>,
    open: Mutex<HashMap<u64, Arc<Conn>>>,
    next_id: AtomicU64,
    process_buffered: Arc<AtomicUsize>,
    closed: Notify,
}

/// Takes the connection out of the registry when its task ends, however it ends.
pub struct Registered {
    connections: Arc<Connections>,
    pub conn: Arc<Conn>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().expect("connections lock");
        open.remove(&self.conn.id);
        if open.is_empty() {
            self.connections.closed.notify_waiters();
        }
    }
}

impl Connections {
    pub fn new(limits: Limits) -> Self {
        Connections {
            limits,
            following: watch::Sender::new(None),
            open: Mutex::default(),
            next_id: AtomicU64::new(1),
            process_buffered: Arc::default(),
            closed: Notify::new(),
        }
    }

    /// Register a new connection; at the limit, evict the idle connection that served least recently
    /// (never-served ones first). `None` when every connection is busy: close the new one.
    pub fn admit(self: &Arc<Self>) -> Option<Registered> {
        let mut open = self.open.lock().expect("connections lock");
        if open.len() >= self.limits.max_connections {
            let victim = open
                .values()
                .filter(|c| c.open_streams() == 0 && c.goaway.borrow().is_none())
                .min_by_key(|c| (c.served.load(Ordering::Relaxed), c.idle_since_ms()))?;
            victim.go_away(Duration::ZERO);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(id, self.process_buffered.clone(), self.limits.request_buffer));
        open.insert(id, conn.clone());
        Some(Registered {
            connections: self.clone(),
            conn,
        })
    }

    pub fn count(&self) -> usize {
        self.open.lock().expect("connections lock").len()
    }

    /// GOAWAY to every connection; open calls get `grace`, then their connection closes.
    pub fn go_away_all(&self, grace: Duration) {
        for conn in self.open.lock().expect("connections lock").values() {
            conn.go_away(grace);
        }
    }

    /// The replica does not lead: every connection, open or to come, gets GOAWAY `age` after now (so a
    /// Service has stopped sending clients here by then, and the client's reconnection reaches the
    /// replica that leads), or, when it comes later, once it has been open `late_age`; its calls get
    /// `grace`. Asked again while following, nothing changes.
    pub fn follow(&self, age: Duration, late_age: Duration, grace: Duration) {
        self.following.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = Some(Following {
                since: tokio::time::Instant::now(),
                age,
                late_age,
                grace,
            });
            true
        });
    }

    /// The replica leads again: connections live their configured age (a GOAWAY already sent stands).
    pub fn lead(&self) {
        self.following.send_if_modified(|current| current.take().is_some());
    }

    /// Resolves once no connection is open.
    pub async fn all_closed(&self) {
        loop {
            let notified = self.closed.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Whether the idle deadline of `conn` has passed, and if not, when it will.
pub fn idle_deadline(conn: &Conn, idle: Duration) -> Result<(), tokio::time::Instant> {
    if conn.open_streams() > 0 {
        // Not idle; look again later (a stream's end restarts the count from then).
        return Err(tokio::time::Instant::now() + idle);
    }
    let now = now_ms();
    let due = conn.idle_since_ms().saturating_add(idle.as_millis() as u64);
    if now >= due {
        return Ok(());
    }
    Err(tokio::time::Instant::now() + Duration::from_millis(due - now))
}

pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// Follows frame boundaries in one direction of an HTTP/2 byte stream.
#[derive(Default)]
struct FrameCursor {
    preface_left: usize,
    header: [u8; 9],
    header_len: usize,
    payload_left: usize,
}

/// One frame's header: type, flags, stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FrameHead {
    kind: u8,
    flags: u8,
    stream: u32,
}

impl FrameCursor {
    fn expecting_preface() -> Self {
        FrameCursor {
            preface_left: PREFACE.len(),
            ..FrameCursor::default()
        }
    }

    /// Between two frames (or before the first).
    fn at_boundary(&self) -> bool {
        self.header_len == 0 && self.payload_left == 0 && self.preface_left == 0
    }

    /// Walk `data`, calling `seen` with each frame header completed in it.
    fn feed(&mut self, mut data: &[u8], mut seen: impl FnMut(FrameHead)) {
        while !data.is_empty() {
            if self.preface_left > 0 {
                let n = self.preface_left.min(data.len());
                self.preface_left -= n;
                data = &data[n..];
            } else if self.payload_left > 0 {
                let n = self.payload_left.min(data.len());
                self.payload_left -= n;
                data = &data[n..];
            } else {
                let n = (9 - self.header_len).min(data.len());
                self.header[self.header_len..self.header_len + n].copy_from_slice(&data[..n]);
                self.header_len += n;
                data = &data[n..];
                if self.header_len == 9 {
                    let h = self.header;
                    self.header_len = 0;
                    self.payload_left = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                    seen(FrameHead {
                        kind: h[3],
                        flags: h[4],
                        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
                    });
                }
            }
        }
    }
}

/// A GOAWAY frame: the last stream processed, an error code and debug data.
fn goaway_frame(last_stream: u32, code: u32, debug: &[u8]) -> Vec<u8> {
    let length = 8 + debug.len();
    let mut frame = Vec::with_capacity(9 + length);
    frame.extend_from_slice(&(length as u32).to_be_bytes()[1..]);
    frame.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
    frame.extend_from_slice(&(last_stream & 0x7fff_ffff).to_be_bytes());
    frame.extend_from_slice(&code.to_be_bytes());
    frame.extend_from_slice(debug);
    frame
}

/// The ping policy's verdict on one ping.
#[derive(Default)]
struct PingPolicy {
    last: Option<Instant>,
    strikes: u32,
    /// The server sent HEADERS or DATA since the last ping: that ping is not judged (grpc-go).
    reset: bool,
}

impl PingPolicy {
    /// Whether this ping makes too many.
    fn too_many(&mut self, now: Instant, open_streams: usize, min_interval: Duration) -> bool {
        let last = self.last.replace(now);
        if std::mem::take(&mut self.reset) {
            self.strikes = 0;
            return false;
        }
        let interval = if open_streams == 0 {
            PING_WITHOUT_STREAMS
        } else {
            min_interval
        };
        if last.is_some_and(|last| now.duration_since(last) < interval) {
            self.strikes += 1;
        }
        self.strikes > MAX_PING_STRIKES
    }
}

/// A connection's byte stream, watched frame by frame (see the module documentation).
pub struct FrameWatch<IO> {
    io: IO,
    conn: Arc<Conn>,
    min_ping_interval: Duration,
    incoming: FrameCursor,
    outgoing: FrameCursor,
    pings: PingPolicy,
    last_stream: u32,
    closed_for_pings: bool,
}

impl<IO> FrameWatch<IO> {
    pub fn new(io: IO, conn: Arc<Conn>, min_ping_interval: Duration) -> Self {
        FrameWatch {
            io,
            conn,
            min_ping_interval,
            incoming: FrameCursor::expecting_preface(),
            outgoing: FrameCursor::default(),
            pings: PingPolicy::default(),
            last_stream: 0,
            closed_for_pings: false,
        }
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncRead for FrameWatch<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.closed_for_pings {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "too many pings")));
        }
        let before = buf.filled().len();
        std::task::ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let (conn, min_interval) = (&this.conn, this.min_ping_interval);
        let (pings, last_stream) = (&mut this.pings, &mut this.last_stream);
        let mut too_many = false;
        this.incoming.feed(&buf.filled()[before..], |frame| match frame.kind {
            SETTINGS if frame.flags & ACK == 0 => conn.handshaken.store(true, Ordering::Relaxed),
            HEADERS => *last_stream = (*last_stream).max(frame.stream),
            PING if frame.flags & ACK == 0 => {
                too_many |= pings.too_many(Instant::now(), conn.open_streams(), min_interval)
            }
            _ => {}
        });
        if too_many {
            // GOAWAY ENHANCE_YOUR_CALM "too_many_pings" as grpc-go sends it (a grpc-go client then
            // doubles its keepalive time), if hyper is between two frames; then the connection closes.
            this.closed_for_pings = true;
            if this.outgoing.at_boundary() {
                let frame = goaway_frame(this.last_stream, ENHANCE_YOUR_CALM, b"too_many_pings");
                let _ = Pin::new(&mut this.io).poll_write(cx, &frame);
                let _ = Pin::new(&mut this.io).poll_flush(cx);
            }
            buf.set_filled(before);
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "too many pings")));
        }
        Poll::Ready(Ok(()))
    }
}

/// Bytes the server wrote: HEADERS or DATA among them excuse the client's next ping (grpc-go).
fn written_out(outgoing: &mut FrameCursor, pings: &mut PingPolicy, data: &[u8]) {
    outgoing.feed(data, |frame| {
        if matches!(frame.kind, HEADERS | DATA) {
            pings.reset = true;
        }
    });
}

impl<IO: AsyncRead + AsyncWrite + Unpin> AsyncWrite for FrameWatch<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.closed_for_pings {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "too many pings")));
        }
        let written = std::task::ready!(Pin::new(&mut this.io).poll_write(cx, data))?;
        written_out(&mut this.outgoing, &mut this.pings, &data[..written]);
        Poll::Ready(Ok(written))
    }

    /// hyper writes a frame's header and its payload as separate slices when the socket takes them.
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        slices: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.closed_for_pings {
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::ConnectionAborted, "too many pings")));
        }
        let written = std::task::ready!(Pin::new(&mut this.io).poll_write_vectored(cx, slices))?;
        let mut left = written;
        for slice in slices {
            let n = left.min(slice.len());
            written_out(&mut this.outgoing, &mut this.pings, &slice[..n]);
            left -= n;
            if left == 0 {
                break;
            }
        }
        Poll::Ready(Ok(written))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// The size of a request's header list as HTTP/2 counts it (what `max_header_list_size` bounds).
pub fn header_list_size(request: &http::request::Parts) -> usize {
    // RFC 9113 6.5.2: name and value octets plus 32 per field, pseudo-headers included.
    let pseudo = request.method.as_str().len()
        + request.uri.path().len()
        + request.uri.scheme_str().map_or(0, str::len)
        + request.uri.authority().map_or(0, |a| a.as_str().len())
        + ":method:path:scheme:authority".len()
        + 4 * 32;
    pseudo
        + request
            .headers
            .iter()
            .map(|(name, value)| name.as_str().len() + value.len() + 32)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        out.extend([kind, flags]);
        out.extend(stream.to_be_bytes());
        out.extend(payload);
        out
    }

    #[test]
    fn the_cursor_sees_every_frame_header_however_the_bytes_are_cut() {
        let mut wire = PREFACE.to_vec();
        wire.extend(frame(SETTINGS, 0, 0, &[0; 6]));
        wire.extend(frame(HEADERS, 4, 1, &[1, 2, 3]));
        wire.extend(frame(PING, 0, 0, &[0; 8]));
        wire.extend(frame(DATA, 1, 1, &[]));
        for chunk in [1, 2, 5, 9, 10, 1000] {
            let mut cursor = FrameCursor::expecting_preface();
            let mut seen = Vec::new();
            for piece in wire.chunks(chunk) {
                cursor.feed(piece, |f| seen.push((f.kind, f.flags, f.stream)));
            }
            assert_eq!(
                seen,
                [(SETTINGS, 0, 0), (HEADERS, 4, 1), (PING, 0, 0), (DATA, 1, 1)],
                "{chunk}"
            );
            assert!(cursor.at_boundary());
        }
        let mut cursor = FrameCursor::default();
        cursor.feed(&frame(DATA, 0, 1, &[0; 10])[..12], |_| {});
        assert!(!cursor.at_boundary(), "inside a payload");
    }

    #[test]
    fn pings_follow_grpc_gos_enforcement_policy() {
        let t0 = Instant::now();
        let five = Duration::from_secs(300);
        let mut policy = PingPolicy::default();
        assert!(!policy.too_many(t0, 1, five), "the first ping is never early");
        assert!(!policy.too_many(t0 + Duration::from_secs(1), 1, five), "strike 1");
        assert!(!policy.too_many(t0 + Duration::from_secs(2), 1, five), "strike 2");
        assert!(
            policy.too_many(t0 + Duration::from_secs(3), 1, five),
            "strike 3: too many"
        );

        let mut policy = PingPolicy::default();
        assert!(!policy.too_many(t0, 1, five));
        for i in 1..10 {
            policy.reset = true; // the server sent data since: a BDP ping
            assert!(!policy.too_many(t0 + Duration::from_secs(i), 1, five));
        }
        let mut policy = PingPolicy::default();
        for i in 0..10 {
            let at = t0 + five * i;
            assert!(
                !policy.too_many(at, 1, five),
                "every 5 minutes with a stream open is fine"
            );
        }
        let mut policy = PingPolicy::default();
        let strikes: Vec<bool> = (0..4).map(|i| policy.too_many(t0 + five * i, 0, five)).collect();
        assert_eq!(strikes, [false, false, false, true], "without a stream, 2 hours");
    }

    #[test]
    fn goaway_frames_carry_the_last_stream_the_code_and_the_reason() {
        let frame = goaway_frame(7, ENHANCE_YOUR_CALM, b"too_many_pings");
        assert_eq!(&frame[..9], [0, 0, 22, GOAWAY, 0, 0, 0, 0, 0]);
        assert_eq!(&frame[9..17], [0, 0, 0, 7, 0, 0, 0, 11]);
        assert_eq!(&frame[17..], b"too_many_pings");
    }

    #[test]
    fn request_bytes_are_held_within_both_budgets_and_given_back() {
        let conn = Conn::detached();
        let first = conn.reserve(grpc::MAX_REQUEST).unwrap();
        let more: Vec<Reservation> = (0..3).map(|_| conn.reserve(grpc::MAX_REQUEST).unwrap()).collect();
        let refused = conn.reserve(1).map(|_| ()).unwrap_err();
        assert_eq!(refused.code, grpc::RESOURCE_EXHAUSTED);
        assert!(refused.message.contains("this connection"), "{}", refused.message);
        drop(first);
        drop(more);
        assert_eq!(conn.buffered.load(Ordering::Relaxed), 0);
        assert_eq!(conn.process_buffered.load(Ordering::Relaxed), 0);

        let shared = Arc::new(AtomicUsize::new(0));
        let a = Arc::new(Conn::new(1, shared.clone(), 10));
        let b = Arc::new(Conn::new(2, shared.clone(), 10));
        let held = a.reserve(8).unwrap();
        let refused = b.reserve(3).map(|_| ()).unwrap_err();
        assert!(
            refused.message.contains("serving.request_buffer"),
            "{}",
            refused.message
        );
        drop(held);
        assert!(b.reserve(3).is_ok());
        assert_eq!(shared.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn idle_means_no_stream_for_the_whole_timeout() {
        let conn = Conn::detached();
        let idle = Duration::from_millis(20);
        assert!(idle_deadline(&conn, idle).is_err(), "just opened");
        let stream = StreamGuard::new(conn.clone());
        tokio::time::sleep(Duration::from_millis(30)).await;
        let next = idle_deadline(&conn, idle).unwrap_err();
        assert!(
            next + Duration::from_millis(5) >= tokio::time::Instant::now() + idle,
            "a stream is open: look again one timeout later, no busy loop"
        );
        drop(stream);
        assert!(
            idle_deadline(&conn, idle).is_err(),
            "the count starts again when the stream ends"
        );
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(idle_deadline(&conn, idle).is_ok());
    }

    #[tokio::test]
    async fn a_connections_age_is_the_earlier_of_the_maximum_and_the_followers() {
        let limits = Limits {
            max_connection_age: Some(Duration::from_secs(100)),
            max_connection_age_grace: Duration::from_secs(7),
            ..Limits::default()
        };
        let conn = Conn::detached();
        assert!((0.9..=1.1).contains(&conn.jitter), "{}", conn.jitter);
        let (at, grace) = age_deadline(&conn, &limits, None).unwrap();
        assert_eq!(at, conn.opened + Duration::from_secs(100).mul_f64(conn.jitter));
        assert_eq!(grace, Duration::from_secs(7));
        let never = Limits {
            max_connection_age: None,
            ..limits.clone()
        };
        assert_eq!(age_deadline(&conn, &never, None), None, "no maximum age: never");

        // Following since before it opened: the follower's deadline, or a moment after it opened.
        let following = Following {
            since: conn.opened - Duration::from_secs(2),
            age: Duration::from_secs(5),
            late_age: Duration::from_secs(1),
            grace: Duration::from_secs(2),
        };
        let (at, grace) = age_deadline(&conn, &never, Some(following)).unwrap();
        assert_eq!(
            (at, grace),
            (conn.opened + Duration::from_secs(3), Duration::from_secs(2))
        );
        let long_ago = Following {
            since: conn.opened - Duration::from_secs(30),
            ..following
        };
        let (at, _) = age_deadline(&conn, &limits, Some(long_ago)).unwrap();
        assert_eq!(
            at,
            conn.opened + Duration::from_secs(1),
            "came after the deadline: a moment"
        );
        // A maximum age that comes first wins.
        let later = Following {
            since: conn.opened + Duration::from_secs(200),
            ..following
        };
        let (at, grace) = age_deadline(&conn, &limits, Some(later)).unwrap();
        assert_eq!(
            (at, grace),
            (
                conn.opened + Duration::from_secs(100).mul_f64(conn.jitter),
                Duration::from_secs(7)
            )
        );
    }

    #[tokio::test]
    async fn follow_keeps_its_start_and_lead_ends_it() {
        let connections = Connections::new(Limits::default());
        assert!(connections.following.borrow().is_none());
        connections.follow(Duration::from_secs(5), Duration::from_secs(1), Duration::from_secs(1));
        let first = connections.following.borrow().unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        connections.follow(Duration::from_secs(5), Duration::from_secs(1), Duration::from_secs(1));
        assert_eq!(
            connections.following.borrow().unwrap(),
            first,
            "asked again: the same start"
        );
        connections.lead();
        assert!(connections.following.borrow().is_none());
    }

    #[test]
    fn jitter_spreads_ages() {
        let factors: Vec<f64> = (0..200).map(age_jitter).collect();
        assert!(factors.iter().all(|f| (0.9..=1.1).contains(f)));
        let (low, high) = (
            factors.iter().filter(|f| **f < 1.0).count(),
            factors.iter().filter(|f| **f > 1.0).count(),
        );
        assert!(low > 50 && high > 50, "{low} below, {high} above");
    }

    #[test]
    fn at_the_limit_the_longest_idle_connection_goes() {
        let connections = Arc::new(Connections::new(Limits {
            max_connections: 3,
            ..Limits::default()
        }));
        let gone = |r: &Registered| r.conn.goaway.borrow().is_some();
        let a = connections.admit().unwrap();
        let b = connections.admit().unwrap();
        let c = connections.admit().unwrap();
        let _a_busy = StreamGuard::new(a.conn.clone()); // a stream open: never evicted
        drop(StreamGuard::new(b.conn.clone())); // served, now idle
        let d = connections.admit().unwrap();
        assert!(gone(&c) && !gone(&b) && !gone(&a), "the never-served one goes first");
        drop(c);
        let e = connections.admit().unwrap();
        assert!(gone(&d) && !gone(&b), "never served beats served long ago");
        drop(d);
        let _b_busy = StreamGuard::new(b.conn.clone());
        let _e_busy = StreamGuard::new(e.conn.clone());
        assert!(
            connections.admit().is_none(),
            "every connection busy: the new one is closed"
        );
        assert_eq!(connections.count(), 3);
    }
}
