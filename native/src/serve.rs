//! The listening side: TCP (plaintext or TLS), HTTP/2, one gRPC call per stream, routed by its path:
//!
//! 1. a hot read the published tables answer: answered here, on the runtime's threads, without the GIL;
//! 2. a method Python serves (`methods`): its one request message is read and checked here, then
//!    [`Dispatch::dispatch`] runs on tokio's blocking pool (at most `python_threads` at once), racing the
//!    client's deadline;
//! 3. `grpc.health.v1.Health` and server reflection: answered here (`health.rs`, `reflection.rs`);
//! 4. anything else: UNIMPLEMENTED `Method not found!`, as grpcio answers, without reading the request.

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use hyper::body::Incoming;
use std::future::Future;

use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::answers::{decide, CallMetrics, Decision, Published, HEALTH_CHECK, METHODS, SERVICE};
use crate::coalesce::{Coalescing, InlineFirst};
use crate::conn::{
    age_deadline, header_list_size, idle_deadline, Conn, Connections, FrameWatch, Guarded, Limits, Registered,
    Reservation, StreamGuard, HARD_HEADER_LIST_SIZE,
};
use crate::grpc::{
    self, answer, answer_or_status, read_unary, trailers_only, Deframer, Encoding, Received, ResponseBody, Status,
};
use crate::health::{self, Health};
use crate::reflection::{self, Reflection};

/// The answer when Python's `dispatch` raised (its traceback is in the log).
pub const DISPATCH_FAILED: &str = "the server failed to answer; see its log";

/// One unary call for Python.
pub struct Call {
    /// The full path, `/package.Service/Method`.
    pub method: String,
    pub request: Bytes,
    /// The request bytes held for the call until Python is done with it.
    pub held: Reservation,
    pub deadline: Option<Instant>,
    /// The request's headers but the gRPC protocol's own and binary (`-bin`) ones.
    pub metadata: Vec<(String, String)>,
    /// As grpcio says it: `ipv4:127.0.0.1:5555`, `ipv6:[::1]:5555`.
    pub peer: Arc<str>,
}

/// Who answers the calls the front does not: Python, in the extension.
pub trait Dispatch: Send + Sync + 'static {
    /// Runs on the blocking pool. `Ok`: the response message, status OK; `Err`: the status to answer.
    fn dispatch(&self, call: Call) -> Result<Bytes, Status>;
}

/// How long a connection asked to go away because it is idle may take to close.
const IDLE_CLOSE_GRACE: Duration = Duration::from_secs(1);
/// The least time a connection asked to go away is given, to write its GOAWAY.
const GOAWAY_WRITE: Duration = Duration::from_millis(100);

/// What every connection shares.
pub struct Shared {
    pub published: Published,
    pub metrics: CallMetrics,
    pub health: Health,
    pub reflection: Arc<Reflection>,
    pub connections: Arc<Connections>,
    limits: Limits,
    /// The full paths `dispatch` serves.
    methods: HashSet<String>,
    dispatch: Box<dyn Dispatch>,
    /// Turns `Some(grace)` when the front stops: long-lived streams (health `Watch`) end then.
    stopping: watch::Receiver<Option<Duration>>,
}

impl Shared {
    pub fn new(
        bounds: Vec<f64>,
        methods: HashSet<String>,
        dispatch: Box<dyn Dispatch>,
        stopping: watch::Receiver<Option<Duration>>,
        limits: Limits,
    ) -> Self {
        Shared {
            connections: Arc::new(Connections::new(limits.clone())),
            limits,
            published: Published::default(),
            metrics: CallMetrics::new(bounds),
            health: Health::default(),
            reflection: Arc::default(),
            methods,
            dispatch,
            stopping,
        }
    }
}

/// Which hot method a path names, if any.
fn hot_method(path: &str) -> Option<usize> {
    let method = path.strip_prefix('/')?.strip_prefix(SERVICE)?.strip_prefix('/')?;
    METHODS.iter().position(|m| *m == method)
}

fn is_reflection(path: &str) -> bool {
    reflection::SERVICES.iter().any(|service| {
        path.strip_prefix('/')
            .and_then(|p| p.strip_prefix(service))
            .is_some_and(|m| m == "/ServerReflectionInfo")
    })
}

/// The plain HTTP answer to a request that is no gRPC call, if it is none.
fn refusal(request: &Request<Incoming>) -> Option<Response<ResponseBody>> {
    if request.method() != http::Method::POST {
        return Some(grpc::not_grpc(
            StatusCode::METHOD_NOT_ALLOWED,
            "gRPC calls are POST requests\n",
        ));
    }
    let content_type = request.headers().get("content-type").map(|v| v.as_bytes());
    let grpc = content_type.is_some_and(|v| {
        v.strip_prefix(b"application/grpc")
            .is_some_and(|rest| rest.is_empty() || rest[0] == b'+' || rest[0] == b';')
    });
    (!grpc).then(|| {
        grpc::not_grpc(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "not a gRPC request: the content-type is not application/grpc\n",
        )
    })
}

/// The headers Python sees as the call's metadata.
fn metadata(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            !matches!(
                name,
                "content-type" | "te" | "grpc-timeout" | "grpc-encoding" | "grpc-accept-encoding"
            ) && !name.ends_with("-bin")
        })
        .filter_map(|(name, value)| Some((name.as_str().to_string(), value.to_str().ok()?.to_string())))
        .collect()
}

/// A peer as grpcio names it (an IPv4 client of a dual-stack socket is an IPv4 peer).
pub fn peer_name(address: SocketAddr) -> String {
    match address.ip().to_canonical() {
        IpAddr::V4(ip) => format!("ipv4:{ip}:{}", address.port()),
        IpAddr::V6(ip) => format!("ipv6:[{ip}]:{}", address.port()),
    }
}

/// Sets its flag when dropped: the call's future was dropped (answered, expired, or the client left).
struct Abandoned(Arc<AtomicBool>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Python's answer to `call`, or DEADLINE_EXCEEDED the moment the deadline passes (Python's answer is
/// then dropped). A call still queued for the pool when abandoned never reaches Python.
async fn call_python(shared: &Arc<Shared>, call: Call) -> Response<ResponseBody> {
    let deadline = call.deadline;
    let abandoned = Arc::new(AtomicBool::new(false));
    let _abandoned_on_drop = Abandoned(abandoned.clone());
    let worker = shared.clone();
    let task = tokio::task::spawn_blocking(move || {
        if abandoned.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(expired());
        }
        worker.dispatch.dispatch(call)
    });
    let joined = match deadline {
        None => task.await,
        Some(deadline) => match tokio::time::timeout_at(deadline.into(), task).await {
            Ok(joined) => joined,
            Err(_) => return trailers_only(&expired()),
        },
    };
    // A panic in the extension's own code: answer as if `dispatch` had raised.
    answer_or_status(joined.unwrap_or_else(|_| Err(Status::new(grpc::INTERNAL, DISPATCH_FAILED))))
}

/// `future`'s answer, or DEADLINE_EXCEEDED once `deadline` passes.
async fn within<T>(deadline: Option<Instant>, future: impl Future<Output = Result<T, Status>>) -> Result<T, Status> {
    match deadline {
        None => future.await,
        Some(deadline) => tokio::time::timeout_at(deadline.into(), future)
            .await
            .unwrap_or_else(|_| Err(expired())),
    }
}

fn expired() -> Status {
    Status::new(grpc::DEADLINE_EXCEEDED, "Deadline Exceeded")
}

/// DEADLINE_EXCEEDED if `deadline` has passed (a message read in time may be answered too late).
fn still_in_time(deadline: Option<Instant>) -> Result<(), Status> {
    match deadline {
        Some(deadline) if Instant::now() >= deadline => Err(expired()),
        _ => Ok(()),
    }
}

/// What the headers of a gRPC call say before its body is read: its deadline and encoding, or the
/// status that refuses it (UNIMPLEMENTED only for an encoding it does not know).
fn admit(
    shared: &Shared,
    parts: &http::request::Parts,
    started: Instant,
) -> Result<(Option<Instant>, Encoding), Status> {
    let size = header_list_size(parts);
    let limit = shared.limits.max_header_list_size as usize;
    if size > limit {
        return Err(Status::new(
            grpc::RESOURCE_EXHAUSTED,
            format!("the request's metadata is {size} bytes, over the server's limit of {limit} (serving.max_header_list_size)"),
        ));
    }
    let deadline = match parts.headers.get("grpc-timeout") {
        None => None,
        Some(value) => {
            let timeout = value
                .to_str()
                .map_err(|_| "timeout value is not ASCII".to_string())
                .and_then(grpc::decode_timeout);
            match timeout {
                // A deadline too far to represent is none.
                Ok(timeout) => started.checked_add(timeout),
                Err(why) => return Err(Status::new(grpc::INTERNAL, format!("malformed grpc-timeout: {why}"))),
            }
        }
    };
    Ok((deadline, Encoding::of(&parts.headers)?))
}

async fn handle(
    shared: Arc<Shared>,
    conn: Arc<Conn>,
    peer: Arc<str>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let started = Instant::now();
    if let Some(refusal) = refusal(&request) {
        return Ok(refusal);
    }
    let (parts, body) = request.into_parts();
    let (deadline, encoding) = match admit(&shared, &parts, started) {
        Ok(admitted) => admitted,
        Err(status) => {
            let mut refusal = trailers_only(&status);
            if status.code == grpc::UNIMPLEMENTED {
                // The spec: name the encodings the server accepts.
                let accepted = http::HeaderValue::from_static(grpc::ACCEPTED_ENCODINGS);
                refusal.headers_mut().insert("grpc-accept-encoding", accepted);
            }
            return Ok(refusal);
        }
    };
    let path = parts.uri.path();
    let python = || shared.methods.contains(path); // off the hot path: only once the tables say no
    let deframer = || Deframer::new(encoding, Some(conn.clone()));
    // The deadline bounds the whole call from its headers on: reading the request included.
    let read = |body| within(deadline, read_unary(body, deframer()));
    let to_python = |received: Received| Call {
        method: path.to_string(),
        request: received.message,
        held: received.held,
        deadline,
        metadata: metadata(&parts.headers),
        peer,
    };
    let hot = hot_method(path).and_then(|method| Some((method, shared.published.current()?)));
    if let Some((method, tables)) = hot {
        let received = match read(body).await.and_then(|r| still_in_time(deadline).map(|()| r)) {
            Ok(received) => received,
            Err(status) => return Ok(trailers_only(&status)),
        };
        return Ok(match decide(&shared.published, &tables, method, &received.message) {
            Decision::Answer(bytes) => {
                shared.metrics.record(method, started.elapsed().as_secs_f64());
                answer(bytes)
            }
            Decision::Python if python() => call_python(&shared, to_python(received)).await,
            Decision::Python => trailers_only(&method_not_found()),
        });
    }
    if python() {
        return Ok(match read(body).await {
            Ok(received) => call_python(&shared, to_python(received)).await,
            Err(status) => trailers_only(&status),
        });
    }
    Ok(
        match path.strip_prefix('/').and_then(|p| p.strip_prefix(health::SERVICE)) {
            Some("/Check") => {
                let result = read(body)
                    .await
                    .and_then(|received| still_in_time(deadline).map(|()| received))
                    .and_then(|received| health::check(&shared.health, &received.message));
                if result.is_ok() {
                    shared.metrics.record(HEALTH_CHECK, started.elapsed().as_secs_f64());
                }
                answer_or_status(result)
            }
            Some("/Watch") => match read(body)
                .await
                .and_then(|received| health::requested_service(&received.message))
            {
                Ok(service) => {
                    let (response, stream) = grpc::streamed();
                    let statuses = shared.health.watch(&service);
                    let ends = health::Ends {
                        deadline: deadline.map(Into::into),
                        stopping: shared.stopping.clone(),
                        conn: conn.clone(),
                    };
                    tokio::spawn(health::watch_stream(statuses, stream, ends));
                    response
                }
                Err(status) => trailers_only(&status),
            },
            _ if is_reflection(path) => {
                let (response, stream) = grpc::streamed();
                let reflection = shared.reflection.clone();
                tokio::spawn(reflection::serve_stream(reflection, body, deframer(), deadline, stream));
                response
            }
            _ => trailers_only(&method_not_found()),
        },
    )
}

fn method_not_found() -> Status {
    Status::new(grpc::UNIMPLEMENTED, "Method not found!")
}

/// TCP keepalive (a peer gone without a FIN is found even with no HTTP/2 ping due) and, with
/// keep-alive pings on, TCP_USER_TIMEOUT at the ping timeout, as grpc-go sets them.
fn tune_socket(stream: &TcpStream, limits: &Limits) {
    let socket = socket2::SockRef::from(stream);
    let _ = socket.set_tcp_nodelay(true); // a small answer would otherwise wait for the client's delayed ACK
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(TCP_KEEPALIVE_TIME)
        .with_interval(TCP_KEEPALIVE_INTERVAL)
        .with_retries(TCP_KEEPALIVE_RETRIES);
    let _ = socket.set_tcp_keepalive(&keepalive);
    if limits.keepalive_time.is_some() {
        let _ = socket.set_tcp_user_timeout(Some(limits.keepalive_timeout));
    }
}

/// TCP keepalive: first probe after a minute of silence, then every 10 s; 3 unanswered close it.
const TCP_KEEPALIVE_TIME: Duration = Duration::from_secs(60);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_RETRIES: u32 = 3;

/// Serve one accepted connection until it ends, its handshake, idle time or age runs out, or it is
/// asked to go away.
async fn connection(
    stream: TcpStream,
    peer: Arc<str>,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    registered: Registered,
) {
    let limits = &shared.connections.limits;
    let handshake_deadline = tokio::time::Instant::now() + limits.handshake_timeout;
    tune_socket(&stream, limits);
    match tls {
        None => drive(stream, peer, shared, registered, handshake_deadline).await,
        Some(acceptor) => {
            // A failed or stalled handshake (no client certificate, untrusted one...) ends that connection only.
            let accepted = tokio::time::timeout_at(handshake_deadline, acceptor.accept(stream)).await;
            if let Ok(Ok(stream)) = accepted {
                drive(stream, peer, shared, registered, handshake_deadline).await;
            }
        }
    }
}

async fn drive<IO>(
    io: IO,
    peer: Arc<str>,
    shared: Arc<Shared>,
    registered: Registered,
    handshake_deadline: tokio::time::Instant,
) where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn = registered.conn.clone();
    let limits = shared.connections.limits.clone();
    // Whether the replica leads: while it does not, the connection's age is short (Connections::follow).
    let mut following = shared.connections.following.subscribe();
    // FrameWatch inside Coalescing: its own GOAWAY write goes straight to the socket, never held a turn.
    let watched = Coalescing::new(FrameWatch::new(io, conn.clone(), limits.min_ping_interval));
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |request| {
            let stream = StreamGuard::new(conn.clone());
            let answer = handle(shared.clone(), conn.clone(), peer.clone(), request);
            async move {
                answer
                    .await
                    .map(|response| response.map(|body| Guarded::new(body, stream)))
            }
        })
    };
    let mut builder = hyper::server::conn::http2::Builder::new(InlineFirst);
    builder
        .timer(TokioTimer::new())
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(HARD_HEADER_LIST_SIZE.max(limits.max_header_list_size))
        .keep_alive_interval(limits.keepalive_time)
        .keep_alive_timeout(limits.keepalive_timeout);
    let connection = builder.serve_connection(TokioIo::new(watched), service);
    tokio::pin!(connection);
    let far = tokio::time::Instant::now() + Duration::from_secs(86400 * 365);
    let mut closing_until: Option<tokio::time::Instant> = None;
    let mut handshake_pending = true;
    let mut following_open = true;
    loop {
        let aged = if closing_until.is_none() {
            age_deadline(&conn, &limits, *following.borrow_and_update())
        } else {
            None
        };
        let idle_check = match limits.idle_timeout {
            Some(idle) if closing_until.is_none() => match idle_deadline(&conn, idle) {
                Ok(()) => {
                    connection.as_mut().graceful_shutdown();
                    closing_until = Some(tokio::time::Instant::now() + IDLE_CLOSE_GRACE);
                    far
                }
                Err(next) => next,
            },
            _ => far,
        };
        tokio::select! {
            _ = connection.as_mut() => break,
            () = tokio::time::sleep_until(handshake_deadline), if handshake_pending => {
                if !conn.handshaken() {
                    break; // no HTTP/2 preface and SETTINGS in time: close without a word
                }
                handshake_pending = false;
            }
            () = tokio::time::sleep_until(idle_check), if closing_until.is_none() => {}
            grace = conn.going_away(), if closing_until.is_none() => {
                connection.as_mut().graceful_shutdown();
                // Even with no grace, the GOAWAY itself gets a moment to leave.
                closing_until = Some(tokio::time::Instant::now() + grace.max(GOAWAY_WRITE));
            }
            () = tokio::time::sleep_until(aged.map_or(far, |(at, _)| at)), if aged.is_some() => {
                // Its age: GOAWAY (the client reconnects, through a Service to the replica that leads),
                // open calls get the grace, then the connection closes (grpc-go's MaxConnectionAge).
                connection.as_mut().graceful_shutdown();
                let grace = aged.map_or(Duration::ZERO, |(_, grace)| grace);
                closing_until = Some(tokio::time::Instant::now() + grace.max(GOAWAY_WRITE));
            }
            changed = following.changed(), if closing_until.is_none() && following_open => {
                following_open = changed.is_ok(); // the age is computed again at the top of the loop
            }
            () = tokio::time::sleep_until(closing_until.unwrap_or(far)), if closing_until.is_some() => break,
        }
    }
    drop(registered);
}

/// Accept connections until `stop` says so, then let open calls finish for at most the grace the
/// stop carries and close what is left.
pub async fn serve(
    listeners: Vec<TcpListener>,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let (accepted_tx, mut accepted_rx) = tokio::sync::mpsc::channel::<(TcpStream, SocketAddr)>(64);
    let mut accepting = Vec::new();
    for listener in listeners {
        let tx = accepted_tx.clone();
        accepting.push(tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok(accepted) => {
                        if tx.send(accepted).await.is_err() {
                            return;
                        }
                    }
                    // Out of file descriptors and the like: wait instead of spinning on the error.
                    Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        }));
    }
    drop(accepted_tx);
    let grace = loop {
        tokio::select! {
            changed = stop.changed() => {
                if changed.is_err() { break Duration::ZERO; }
                if let Some(grace) = *stop.borrow() { break grace; }
            }
            Some((stream, address)) = accepted_rx.recv() => {
                // At the limit with every connection busy: the new one is closed at once.
                let Some(registered) = shared.connections.admit() else { continue };
                let peer: Arc<str> = peer_name(address).into();
                tokio::spawn(connection(stream, peer, tls.clone(), shared.clone(), registered));
            }
        }
    };
    for task in accepting {
        task.abort(); // closes the listening sockets: new connections are refused from here on
    }
    shared.connections.go_away_all(grace);
    let _ = tokio::time::timeout(grace + IDLE_CLOSE_GRACE, shared.connections.all_closed()).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_peers_as_grpcio_does() {
        assert_eq!(peer_name("127.0.0.1:5555".parse().unwrap()), "ipv4:127.0.0.1:5555");
        assert_eq!(peer_name("[::1]:5555".parse().unwrap()), "ipv6:[::1]:5555");
        assert_eq!(peer_name("[::ffff:10.0.0.1]:80".parse().unwrap()), "ipv4:10.0.0.1:80");
    }

    #[test]
    fn metadata_keeps_the_callers_headers_only() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("content-type", "application/grpc"),
            ("te", "trailers"),
            ("grpc-timeout", "1S"),
            ("grpc-encoding", "identity"),
            ("grpc-accept-encoding", "gzip"),
            ("user-agent", "grpc-go/1.0"),
            ("x-request-id", "abc"),
            ("trace-bin", "AAEC"),
        ] {
            headers.append(name, value.parse().unwrap());
        }
        assert_eq!(
            metadata(&headers),
            [
                ("user-agent".to_string(), "grpc-go/1.0".to_string()),
                ("x-request-id".to_string(), "abc".to_string())
            ]
        );
    }

    #[test]
    fn routes_by_path() {
        assert_eq!(hot_method(&format!("/{SERVICE}/NodeGroupNodes")), Some(4));
        assert_eq!(hot_method(&format!("/{SERVICE}/Refresh")), None);
        assert!(is_reflection(
            "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo"
        ));
        assert!(is_reflection(
            "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"
        ));
        assert!(!is_reflection("/grpc.reflection.v1.ServerReflection/Other"));
    }
}
