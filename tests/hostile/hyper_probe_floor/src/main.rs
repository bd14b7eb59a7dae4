//! hyper's HTTP/1.1 server answering `GET /healthz` with `ok` on 127.0.0.1:<port> (first argument, 0 for
//! any), the address printed on stdout; two runtime threads, like the native front. Every connection gets
//! a 5 s header read timeout, as the probe port's `http.request_timeout`.
use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};

async fn answer(request: Request<hyper::body::Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (status, body) = if request.uri().path() == "/healthz" { (200, "ok\n") } else { (404, "not found\n") };
    Ok(Response::builder().status(status).body(Full::new(Bytes::from_static(body.as_bytes()))).unwrap())
}

fn main() {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let mut http = hyper::server::conn::http1::Builder::new();
                http.timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(5));
                let _ = http.serve_connection(TokioIo::new(stream), hyper::service::service_fn(answer)).await;
            });
        }
    });
}
