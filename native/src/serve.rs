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
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::answers::{decide, CallMetrics, Decision, Published, HEALTH_CHECK, METHODS, SERVICE};
use crate::coalesce::{Coalescing, InlineFirst};
use crate::grpc::{self, answer, answer_or_status, read_unary, trailers_only, ResponseBody, Status};
use crate::health::{self, Health};
use crate::reflection::{self, Reflection};

/// The answer when Python's `dispatch` raised (its traceback is in the log).
pub const DISPATCH_FAILED: &str = "the server failed to answer; see its log";

/// One unary call for Python.
pub struct Call {
    /// The full path, `/package.Service/Method`.
    pub method: String,
    pub request: Bytes,
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

/// What every connection shares.
pub struct Shared {
    pub published: Published,
    pub metrics: CallMetrics,
    pub health: Health,
    pub reflection: Arc<Reflection>,
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
    ) -> Self {
        Shared {
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
    let expired = || Status::new(grpc::DEADLINE_EXCEEDED, "Deadline Exceeded");
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

async fn handle(
    shared: Arc<Shared>,
    peer: Arc<str>,
    request: Request<Incoming>,
) -> Result<Response<ResponseBody>, Infallible> {
    let started = Instant::now();
    if let Some(refusal) = refusal(&request) {
        return Ok(refusal);
    }
    let (parts, body) = request.into_parts();
    let path = parts.uri.path();
    let python = || shared.methods.contains(path); // off the hot path: only once the tables say no
    let deadline = || {
        let timeout = parts.headers.get("grpc-timeout")?.to_str().ok();
        started.checked_add(grpc::parse_timeout(timeout?)?)
    };
    let to_python = |request: Bytes| Call {
        method: path.to_string(),
        request,
        deadline: deadline(),
        metadata: metadata(&parts.headers),
        peer,
    };
    let hot = hot_method(path).and_then(|method| Some((method, shared.published.current()?)));
    if let Some((method, tables)) = hot {
        let message = match read_unary(body).await {
            Ok(message) => message,
            Err(status) => return Ok(trailers_only(&status)),
        };
        return Ok(match decide(&shared.published, &tables, method, &message) {
            Decision::Answer(bytes) => {
                shared.metrics.record(method, started.elapsed().as_secs_f64());
                answer(bytes)
            }
            Decision::Python if python() => call_python(&shared, to_python(message)).await,
            Decision::Python => trailers_only(&method_not_found()),
        });
    }
    if python() {
        return Ok(match read_unary(body).await {
            Ok(message) => call_python(&shared, to_python(message)).await,
            Err(status) => trailers_only(&status),
        });
    }
    Ok(
        match path.strip_prefix('/').and_then(|p| p.strip_prefix(health::SERVICE)) {
            Some("/Check") => {
                let result = read_unary(body)
                    .await
                    .and_then(|message| health::check(&shared.health, &message));
                if result.is_ok() {
                    shared.metrics.record(HEALTH_CHECK, started.elapsed().as_secs_f64());
                }
                answer_or_status(result)
            }
            Some("/Watch") => match read_unary(body).await.and_then(|m| health::requested_service(&m)) {
                Ok(service) => {
                    let (response, stream) = grpc::streamed();
                    let statuses = shared.health.watch(&service);
                    let until = deadline().map(Into::into);
                    tokio::spawn(health::watch_stream(statuses, stream, until, shared.stopping.clone()));
                    response
                }
                Err(status) => trailers_only(&status),
            },
            _ if is_reflection(path) => {
                let (response, stream) = grpc::streamed();
                tokio::spawn(reflection::serve_stream(shared.reflection.clone(), body, stream));
                response
            }
            _ => trailers_only(&method_not_found()),
        },
    )
}

fn method_not_found() -> Status {
    Status::new(grpc::UNIMPLEMENTED, "Method not found!")
}

/// Accept connections until `stop` says so, then let open calls finish for at most the grace the
/// stop carries and close what is left.
pub async fn serve(
    listeners: Vec<TcpListener>,
    tls: Option<TlsAcceptor>,
    shared: Arc<Shared>,
    mut stop: watch::Receiver<Option<Duration>>,
) {
    let graceful = GracefulShutdown::new();
    let (accepted_tx, mut accepted_rx) = tokio::sync::mpsc::channel::<(tokio::net::TcpStream, SocketAddr)>(64);
    let mut accepting = Vec::new();
    for listener in listeners {
        let tx = accepted_tx.clone();
        accepting.push(tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok(accepted) => {
                        // No Nagle: a small answer would otherwise wait for the client's delayed ACK.
                        let _ = accepted.0.set_nodelay(true);
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
                let shared = shared.clone();
                let tls = tls.clone();
                let watcher = graceful.watcher();
                let peer: Arc<str> = peer_name(address).into();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), peer.clone(), req));
                    let builder = hyper::server::conn::http2::Builder::new(InlineFirst);
                    match tls {
                        None => {
                            let connection = builder.serve_connection(TokioIo::new(Coalescing::new(stream)), service);
                            let _ = watcher.watch(connection).await;
                        }
                        Some(acceptor) => {
                            // A failed handshake (no client certificate, untrusted one...) ends that connection only.
                            let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await else { return };
                            let connection = builder.serve_connection(TokioIo::new(Coalescing::new(stream)), service);
                            let _ = watcher.watch(connection).await;
                        }
                    }
                });
            }
        }
    };
    for task in accepting {
        task.abort(); // closes the listening sockets: new connections are refused from here on
    }
    let _ = tokio::time::timeout(grace, graceful.shutdown()).await;
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
