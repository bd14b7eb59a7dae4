//! The listening side: TCP (plaintext or TLS), HTTP/2, one gRPC call per stream. Hot reads the tables
//! can answer are answered here; every other stream is forwarded unchanged (headers, every message,
//! trailers, in both directions) to the grpcio server on a private unix socket.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, UnixStream};
use tokio::sync::{watch, Mutex};
use tokio_rustls::TlsAcceptor;

use crate::answers::{decide, CallMetrics, Decision, Published, METHODS, SERVICE};

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// grpcio's default limit for a received message; a larger hot request goes to grpcio to be refused.
const MAX_REQUEST: usize = 4 * 1024 * 1024;

/// What every connection shares.
pub struct Shared {
    pub published: Published,
    pub metrics: CallMetrics,
    upstream: Upstream,
}

impl Shared {
    pub fn new(upstream_path: String, bounds: Vec<f64>) -> Self {
        Shared {
            published: Published::default(),
            metrics: CallMetrics::new(bounds),
            upstream: Upstream {
                path: upstream_path,
                sender: Mutex::new(None),
            },
        }
    }
}

/// One HTTP/2 connection to the grpcio server, shared by every forwarded call, reopened when it closes.
struct Upstream {
    path: String,
    sender: Mutex<Option<SendRequest<ProxyBody>>>,
}

impl Upstream {
    async fn sender(&self) -> Result<SendRequest<ProxyBody>, String> {
        let mut guard = self.sender.lock().await;
        if let Some(sender) = guard.as_ref() {
            if !sender.is_closed() {
                return Ok(sender.clone());
            }
        }
        let stream = UnixStream::connect(&self.path)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (sender, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(connection);
        *guard = Some(sender.clone());
        Ok(sender)
    }

    async fn forward(&self, request: Request<ProxyBody>) -> Response<ProxyBody> {
        let mut sender = match self.sender().await {
            Ok(sender) => sender,
            Err(why) => return unavailable(&format!("the server's gRPC core is not reachable ({why})")),
        };
        if let Err(err) = sender.ready().await {
            return unavailable(&format!("the server's gRPC core closed the connection ({err})"));
        }
        match sender.send_request(request).await {
            Ok(response) => response.map(|body| body.boxed()),
            Err(err) => unavailable(&format!("the server's gRPC core did not answer ({err})")),
        }
    }
}

/// A trailers-only gRPC answer with status UNAVAILABLE (the client may retry).
fn unavailable(message: &str) -> Response<ProxyBody> {
    let mut response = Response::new(Empty::new().map_err(|never: Infallible| match never {}).boxed());
    let headers = response.headers_mut();
    headers.insert("content-type", HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static("14"));
    let text: String = message.chars().filter(|c| c.is_ascii_graphic() || *c == ' ').collect();
    if let Ok(value) = HeaderValue::from_str(&text.replace('%', "%25")) {
        headers.insert("grpc-message", value);
    }
    response
}

/// A unary OK answer: one length-prefixed message, then the `grpc-status: 0` trailers.
struct Answer {
    message: Option<Bytes>,
    done: bool,
}

impl Body for Answer {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(message) = self.message.take() {
            let mut framed = BytesMut::with_capacity(5 + message.len());
            framed.put_u8(0);
            framed.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
            framed.put(message);
            return Poll::Ready(Some(Ok(Frame::data(framed.freeze()))));
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

fn answer(message: Bytes) -> Response<ProxyBody> {
    let mut response = Response::new(
        Answer {
            message: Some(message),
            done: false,
        }
        .boxed(),
    );
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/grpc"));
    response
}

/// A request body already read in part: the frames read so far, then whatever is left.
struct Replayed {
    read: VecDeque<Frame<Bytes>>,
    rest: Option<Incoming>,
}

impl Body for Replayed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        if let Some(frame) = self.read.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
}

/// Which hot method a path names, if any.
fn hot_method(path: &str) -> Option<usize> {
    let method = path.strip_prefix('/')?.strip_prefix(SERVICE)?.strip_prefix('/')?;
    METHODS.iter().position(|m| *m == method)
}

/// The one message of a unary request body: read it whole (up to the size grpcio accepts), or give
/// back what was read so the request can be forwarded as it came.
async fn read_unary(mut body: Incoming) -> Result<Bytes, Replayed> {
    let mut frames = VecDeque::new();
    let mut data = BytesMut::new();
    loop {
        if body.is_end_stream() {
            break;
        }
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => {
                let is_data = frame.is_data();
                if let Some(chunk) = frame.data_ref() {
                    data.extend_from_slice(chunk);
                }
                frames.push_back(frame);
                if !is_data || data.len() > MAX_REQUEST + 5 {
                    return Err(Replayed {
                        read: frames,
                        rest: Some(body),
                    });
                }
            }
            // The client broke the stream: forwarding what arrived lets grpcio see the same.
            Some(Err(_)) => {
                return Err(Replayed {
                    read: frames,
                    rest: None,
                })
            }
        }
    }
    let mut whole = data.clone().freeze();
    let plain = whole.len() >= 5 && whole[0] == 0 && {
        let mut header = &whole[1..5];
        header.get_u32() as usize == whole.len() - 5
    };
    if !plain {
        return Err(Replayed {
            read: frames,
            rest: None,
        });
    }
    whole.advance(5);
    Ok(whole)
}

fn is_grpc(request: &Request<Incoming>) -> bool {
    request.method() == http::Method::POST
        && request
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"))
}

async fn handle(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<ProxyBody>, Infallible> {
    let started = Instant::now();
    let method = hot_method(request.uri().path()).filter(|_| is_grpc(&request));
    let tables = method.and_then(|_| shared.published.current());
    let (parts, body) = request.into_parts();
    let body: ProxyBody = match (method, tables) {
        (Some(method), Some(tables)) => match read_unary(body).await {
            Ok(message) => {
                if let Decision::Answer(bytes) = decide(&shared.published, &tables, method, &message) {
                    shared.metrics.record(method, started.elapsed().as_secs_f64());
                    return Ok(answer(bytes));
                }
                let mut framed = BytesMut::with_capacity(message.len() + 5);
                framed.put_u8(0);
                framed.put_u32(message.len() as u32);
                framed.put(message);
                Replayed {
                    read: VecDeque::from([Frame::data(framed.freeze())]),
                    rest: None,
                }
                .boxed()
            }
            Err(replayed) => replayed.boxed(),
        },
        _ => body.boxed(),
    };
    let mut forwarded = Request::from_parts(parts, body);
    if forwarded.uri().scheme().is_none() || forwarded.uri().authority().is_none() {
        let path = forwarded
            .uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_string();
        *forwarded.uri_mut() = format!("http://localhost{path}").parse().expect("a path makes a URI");
    }
    Ok(shared.upstream.forward(forwarded).await)
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
    let (accepted_tx, mut accepted_rx) = tokio::sync::mpsc::channel::<tokio::net::TcpStream>(64);
    let mut accepting = Vec::new();
    for listener in listeners {
        let tx = accepted_tx.clone();
        accepting.push(tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        // No Nagle: a small answer would otherwise wait for the client's delayed ACK.
                        let _ = stream.set_nodelay(true);
                        if tx.send(stream).await.is_err() {
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
            Some(stream) = accepted_rx.recv() => {
                let shared = shared.clone();
                let tls = tls.clone();
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| handle(shared.clone(), req));
                    let builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
                    match tls {
                        None => {
                            let connection = builder.serve_connection(TokioIo::new(stream), service);
                            let _ = watcher.watch(connection).await;
                        }
                        Some(acceptor) => {
                            // A failed handshake (no client certificate, untrusted one...) ends that connection only.
                            let Ok(Ok(stream)) = tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await else { return };
                            let connection = builder.serve_connection(TokioIo::new(stream), service);
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
