//! `ca_externalgrpc_native.Front`: the whole gRPC server of the process when `serving.engine` is
//! `native` (see `server/native_front.py`), so that Python needs no grpcio at all.
//!
//! It owns the CA-facing listening socket (plaintext or TLS) and, per call:
//!
//! * answers the hot reads from tables of serialized answers Python publishes after every change, on
//!   its own threads, never taking the GIL;
//! * hands every other call of a method Python serves to Python's `dispatch`, on tokio's blocking pool;
//! * answers `grpc.health.v1.Health` (`Check`, `Watch`) and server reflection (`v1` and `v1alpha`)
//!   itself, from statuses and descriptors Python sets;
//! * answers UNIMPLEMENTED `Method not found!` to anything else.
//!
//! ```text
//! Front(host, port, buckets, dispatch, methods, cert=None, key=None, client_ca=None, threads=2, python_threads=8,
//!       max_connections=256, max_concurrent_streams=100, max_header_list_size=16384, keepalive_time=60.0,
//!       keepalive_timeout=20.0, min_ping_interval=300.0, handshake_timeout=10.0, idle_timeout=300.0,
//!       request_buffer=67108864, max_connection_age=300.0, max_connection_age_grace=10.0)
//! ```
//!
//! * `host`, `port`: where to listen (every address `host` resolves to; port 0 picks one, see `port`).
//! * `buckets`: the latency histogram bounds of `native_calls`.
//! * `dispatch(method: str, request: bytes, timeout: float | None, metadata: list[tuple[str, str]],
//!   peer: str) -> tuple[int, str, bytes]`: answers one unary call with (grpc status code, details,
//!   response message). `method` is the full path `/package.Service/Method`; `timeout` the seconds left
//!   of the client's deadline (`grpc-timeout`) when `dispatch` is called, `None` without one;
//!   `metadata` the request's headers but `content-type`, `te`, `grpc-timeout`, `grpc-encoding`,
//!   `grpc-accept-encoding` and binary (`-bin`) ones; `peer` as grpcio says it (`ipv4:127.0.0.1:5555`,
//!   `ipv6:[::1]:5555`). Status 0 sends the message; another status sends `details` (the message is
//!   ignored). If `dispatch` raises (or returns something else), its traceback is printed and the call
//!   answered INTERNAL `the server failed to answer; see its log`. When the client's deadline passes
//!   first, the call is answered DEADLINE_EXCEEDED `Deadline Exceeded` at that moment and Python's
//!   answer is dropped; a call the client abandoned before a pool thread took it never reaches Python.
//!   The deadline runs from the request's headers on every call: reading the request counts.
//! * `methods`: the full paths `dispatch` serves (all unary-unary). The request is checked before
//!   Python sees it: a message over 4 MiB (compressed or not) is RESOURCE_EXHAUSTED; no message,
//!   several, a truncated frame, or a compressed flag without `grpc-encoding` INTERNAL; an encoding
//!   other than identity, gzip and deflate UNIMPLEMENTED. A unary call is answered once its message is
//!   in, without waiting for the client's half-close. Health and reflection paths are always native.
//! * `cert`, `key`, `client_ca`: PEM bytes; with `client_ca`, clients must present a certificate it signed.
//! * `threads`: the runtime's worker threads (the network and the native answers).
//! * `python_threads`: at most this many `dispatch` (and `submit`) calls run at once.
//! * the limits on client connections (`serving.*` of `server/config.py`; seconds, `None` for never
//!   where it applies): see `conn::Limits`.
//!
//! Methods: `port`; `publish(...)`, `learn_options(group, defaults, answer)`, `mark_observed(group)`,
//! `learn_template(group, answer)`, `forget_template(group)` (the tables, see `answers.rs`);
//! `set_health(service, status)`, `shutdown_health()`; `set_reflection(services, files, symbols)`;
//! `submit(callable)`; `native_calls()`; `drop_connections(grace)`; `follow(age, late_age, grace)`, `lead()`;
//! `stop(grace)`.

pub mod answers;
pub mod coalesce;
pub mod conn;
pub mod grpc;
pub mod health;
pub mod reflection;
pub mod serve;
pub mod wire;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use answers::Tables;
use conn::Limits;
use grpc::Status;
use reflection::Catalog;
use serve::{Call, Dispatch, Shared, DISPATCH_FAILED};

/// A TLS acceptor with the semantics of the grpcio path: the server's key pair, and when a client CA
/// is given, a client certificate signed by it is required. ALPN says h2 (gRPC clients insist on it).
pub fn tls_acceptor(cert: &[u8], key: &[u8], client_ca: Option<&[u8]>) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| format!("tls.cert: not a PEM certificate chain ({e})"))?;
    if chain.is_empty() {
        return Err("tls.cert: no certificate in the file".into());
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| format!("tls.key: not a PEM private key ({e})"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_slice_iter(pem) {
                let ca = ca.map_err(|e| format!("tls.client_ca: not a PEM certificate ({e})"))?;
                roots
                    .add(ca)
                    .map_err(|e| format!("tls.client_ca: unusable certificate ({e})"))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("tls.client_ca: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls.cert and tls.key do not make a usable pair ({e})"))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn os_error(err: &std::io::Error) -> PyErr {
    PyOSError::new_err((err.raw_os_error().unwrap_or(0), err.to_string()))
}

/// Python's `dispatch` callable, called on a blocking-pool thread.
struct PyDispatch(Py<PyAny>);

impl Dispatch for PyDispatch {
    fn dispatch(&self, call: Call) -> Result<Bytes, Status> {
        Python::with_gil(|py| {
            let timeout = call
                .deadline
                .map(|deadline| deadline.saturating_duration_since(Instant::now()).as_secs_f64());
            let args = (
                call.method,
                PyBytes::new(py, &call.request),
                timeout,
                call.metadata,
                &*call.peer,
            );
            let answered = self.0.bind(py).call1(args).and_then(|result| {
                let (code, details, message): (u32, Option<String>, Bound<'_, PyAny>) = result.extract()?;
                if code == grpc::OK {
                    Ok(Ok(Bytes::copy_from_slice(message.downcast::<PyBytes>()?.as_bytes())))
                } else {
                    Ok(Err(Status::new(code, details.unwrap_or_default())))
                }
            });
            answered.unwrap_or_else(|err| {
                err.print(py);
                Err(Status::new(grpc::INTERNAL, DISPATCH_FAILED))
            })
        })
    }
}

/// The running front. Construct it to bind and serve; `stop` drains it.
#[pyclass(frozen, module = "ca_externalgrpc_native")]
struct Front {
    shared: Arc<Shared>,
    port: u16,
    stop: watch::Sender<Option<Duration>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    done: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

fn poisoned<T>(_: T) -> PyErr {
    PyRuntimeError::new_err("poisoned")
}

#[pymethods]
impl Front {
    /// Bind and serve; see the module documentation for the arguments.
    #[new]
    #[pyo3(signature = (
        host, port, buckets, dispatch, methods, cert=None, key=None, client_ca=None, threads=2, python_threads=8,
        max_connections=256, max_concurrent_streams=100, max_header_list_size=16384, keepalive_time=Some(60.0),
        keepalive_timeout=20.0, min_ping_interval=300.0, handshake_timeout=10.0, idle_timeout=Some(300.0),
        request_buffer=67108864, max_connection_age=Some(300.0), max_connection_age_grace=10.0,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: &str,
        port: u16,
        buckets: Vec<f64>,
        dispatch: Py<PyAny>,
        methods: Vec<String>,
        cert: Option<Vec<u8>>,
        key: Option<Vec<u8>>,
        client_ca: Option<Vec<u8>>,
        threads: usize,
        python_threads: usize,
        max_connections: usize,
        max_concurrent_streams: u32,
        max_header_list_size: u32,
        keepalive_time: Option<f64>,
        keepalive_timeout: f64,
        min_ping_interval: f64,
        handshake_timeout: f64,
        idle_timeout: Option<f64>,
        request_buffer: usize,
        max_connection_age: Option<f64>,
        max_connection_age_grace: f64,
    ) -> PyResult<Self> {
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| !d.is_zero())
                .ok_or_else(|| PyValueError::new_err(format!("{name} must be a positive number of seconds")))
        };
        let non_negative = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .map_err(|_| PyValueError::new_err(format!("{name} must be a number of seconds, 0 or more")))
        };
        if max_connections == 0 || max_concurrent_streams == 0 || max_header_list_size == 0 {
            return Err(PyValueError::new_err(
                "max_connections, max_concurrent_streams and max_header_list_size must be at least 1",
            ));
        }
        let limits = Limits {
            max_connections,
            max_concurrent_streams,
            max_header_list_size,
            keepalive_time: keepalive_time.map(|t| seconds("keepalive_time", t)).transpose()?,
            keepalive_timeout: seconds("keepalive_timeout", keepalive_timeout)?,
            min_ping_interval: seconds("min_ping_interval", min_ping_interval)?,
            handshake_timeout: seconds("handshake_timeout", handshake_timeout)?,
            idle_timeout: idle_timeout.map(|t| seconds("idle_timeout", t)).transpose()?,
            request_buffer,
            max_connection_age: max_connection_age
                .map(|t| seconds("max_connection_age", t))
                .transpose()?,
            max_connection_age_grace: non_negative("max_connection_age_grace", max_connection_age_grace)?,
        };
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => {
                Some(tls_acceptor(&cert, &key, client_ca.as_deref()).map_err(PyValueError::new_err)?)
            }
            (None, None) => None,
            _ => return Err(PyValueError::new_err("cert and key go together")),
        };
        if python_threads == 0 {
            return Err(PyValueError::new_err("python_threads must be at least 1"));
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .max_blocking_threads(python_threads)
            .thread_name("native-front")
            .enable_all()
            .build()
            .map_err(|e| os_error(&e))?;
        let listeners = runtime.block_on(bind(host, port)).map_err(|e| os_error(&e))?;
        let bound = listeners[0].local_addr().map_err(|e| os_error(&e))?.port();
        let (stop, stopping) = watch::channel(None);
        let methods: HashSet<String> = methods.into_iter().collect();
        let shared = Arc::new(Shared::new(
            buckets,
            methods,
            Box::new(PyDispatch(dispatch)),
            stopping.clone(),
            limits,
        ));
        let done = runtime.spawn(serve::serve(listeners, tls, shared.clone(), stopping));
        Ok(Front {
            shared,
            port: bound,
            stop,
            runtime: Mutex::new(Some(runtime)),
            done: Mutex::new(Some(done)),
        })
    }

    #[getter]
    fn port(&self) -> u16 {
        self.port
    }

    /// Replace the answer tables (each answer a serialized response message; see `server/native_front.py`).
    #[pyo3(signature = (node_groups, unmanaged, groups, for_node, observed, target_size, options, options_by_defaults, nodes))]
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        node_groups: Vec<u8>,
        unmanaged: Vec<u8>,
        groups: Vec<(String, Vec<u8>)>,
        for_node: Option<HashMap<String, usize>>,
        observed: Vec<String>,
        target_size: HashMap<String, Vec<u8>>,
        options: HashMap<String, Vec<u8>>,
        options_by_defaults: Vec<String>,
        nodes: HashMap<String, Vec<u8>>,
    ) -> PyResult<()> {
        let for_node = match for_node {
            Some(for_node) => {
                if let Some(bad) = for_node.values().find(|&&i| i >= groups.len()) {
                    return Err(PyValueError::new_err(format!(
                        "for_node names group index {bad} of {}",
                        groups.len()
                    )));
                }
                Arc::new(for_node)
            }
            // None: the same as in the tables published last, which had the same groups in the same order.
            None => self
                .shared
                .published
                .current()
                .filter(|last| last.groups.len() == groups.len())
                .map(|last| last.for_node.clone())
                .ok_or_else(|| PyValueError::new_err("for_node=None needs a last publication with as many groups"))?,
        };
        let observed_now: std::collections::HashSet<String> = observed.into_iter().collect();
        let bytes = |map: HashMap<String, Vec<u8>>| map.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect();
        let tables = Tables {
            node_groups: Bytes::from(node_groups),
            unmanaged: Bytes::from(unmanaged),
            observed: groups
                .iter()
                .map(|(gid, _)| (gid.clone(), AtomicBool::new(observed_now.contains(gid))))
                .collect(),
            groups: groups
                .into_iter()
                .map(|(gid, answer)| (gid, Bytes::from(answer)))
                .collect(),
            for_node,
            target_size: bytes(target_size),
            options: bytes(options),
            options_by_defaults: options_by_defaults.into_iter().collect(),
            nodes: bytes(nodes),
            templates: Default::default(),
        };
        self.shared.published.publish(tables);
        Ok(())
    }

    /// Python answered TemplateNodeInfo of `group` with `answer`: the front gives it until the next
    /// publication or `forget_template(group)`.
    fn learn_template(&self, group: &str, answer: Vec<u8>) {
        self.shared.published.learn_template(group, Bytes::from(answer));
    }

    /// The template of `group` may have changed: the next TemplateNodeInfo goes to Python.
    fn forget_template(&self, group: &str) {
        self.shared.published.forget_template(group);
    }

    /// Python answered GetOptions for `group` with `answer` to a request whose defaults were `defaults`.
    fn learn_options(&self, group: String, defaults: Vec<u8>, answer: Vec<u8>) {
        self.shared
            .published
            .learn_options(group, Bytes::from(defaults), Bytes::from(answer));
    }

    /// Python has recorded a node's labels for `group` in its current snapshot.
    fn mark_observed(&self, group: &str) {
        self.shared.published.mark_observed(group);
    }

    /// Set the health status of `service` ("" for the whole server): 0 UNKNOWN, 1 SERVING,
    /// 2 NOT_SERVING, 3 SERVICE_UNKNOWN. Ignored after `shutdown_health`.
    fn set_health(&self, service: &str, status: i32) -> PyResult<()> {
        if !(0..=3).contains(&status) {
            return Err(PyValueError::new_err(format!("health status {status} is not 0-3")));
        }
        self.shared.health.set(service, status);
        Ok(())
    }

    /// Every service set is NOT_SERVING from now on (grpcio's `enter_graceful_shutdown`).
    fn shutdown_health(&self) {
        self.shared.health.shutdown();
    }

    /// What reflection describes: `services` to list; `files` as (name, serialized
    /// FileDescriptorProto, names of the files it imports); `symbols`: fully-qualified name -> file.
    /// Every import and every symbol's file must be among `files`.
    fn set_reflection(
        &self,
        services: Vec<String>,
        files: Vec<(String, Vec<u8>, Vec<String>)>,
        symbols: HashMap<String, String>,
    ) -> PyResult<()> {
        let files = files
            .into_iter()
            .map(|(name, proto, imports)| (name, Bytes::from(proto), imports))
            .collect();
        let catalog = Catalog::new(services, files, symbols).map_err(PyValueError::new_err)?;
        self.shared.reflection.set(catalog);
        Ok(())
    }

    /// Run `callable()` on the pool `dispatch` runs on, and return at once (a raise is printed).
    /// RuntimeError once stopped.
    fn submit(&self, callable: Py<PyAny>) -> PyResult<()> {
        let runtime = self.runtime.lock().map_err(poisoned)?;
        let Some(runtime) = runtime.as_ref() else {
            return Err(PyRuntimeError::new_err("the front is stopped"));
        };
        runtime.spawn_blocking(move || {
            Python::with_gil(|py| {
                if let Err(err) = callable.call0(py) {
                    err.print(py);
                }
            })
        });
        Ok(())
    }

    /// (service, method, calls, per-bucket counts with +Inf last, total seconds) of the calls answered
    /// natively with status OK: the five table methods and health `Check`.
    fn native_calls(&self) -> Vec<(String, String, u64, Vec<u64>, f64)> {
        self.shared.metrics.read()
    }

    /// GOAWAY to every client connection, and keep listening: clients reconnect (a CA through its
    /// Service, to whichever replica serves next). Open calls get `grace` seconds, then their
    /// connection closes; health `Watch` streams end at once (UNAVAILABLE: the client watches again).
    fn drop_connections(&self, grace: f64) {
        self.shared
            .connections
            .go_away_all(Duration::from_secs_f64(grace.max(0.0)));
    }

    /// The replica does not lead (leader election): every connection, open or to come, gets GOAWAY
    /// `age` seconds from now, when a Service has stopped routing here and the client's reconnection
    /// reaches the leader, or, one that comes later, once it has been open `late_age` seconds; its
    /// calls get `grace` seconds. Until `lead()`; asked again meanwhile, the first start counts.
    fn follow(&self, age: f64, late_age: f64, grace: f64) -> PyResult<()> {
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .map_err(|_| PyValueError::new_err(format!("{name} must be a number of seconds, 0 or more")))
        };
        self.shared.connections.follow(
            seconds("age", age)?,
            seconds("late_age", late_age)?,
            seconds("grace", grace)?,
        );
        Ok(())
    }

    /// The replica leads: connections live their configured age again (one already sent away stays so).
    fn lead(&self) {
        self.shared.connections.lead();
    }

    /// Stop accepting, let open calls (those waiting on Python too) finish for at most `grace` seconds,
    /// close the rest and return; health `Watch` streams end at once (UNAVAILABLE).
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let Some(runtime) = self.runtime.lock().map_err(poisoned)?.take() else {
            return Ok(());
        };
        let done = self.done.lock().map_err(poisoned)?.take();
        let _ = self.stop.send(Some(Duration::from_secs_f64(grace.max(0.0))));
        py.allow_threads(move || {
            if let Some(done) = done {
                let _ = runtime.block_on(done);
            }
            // The grace is over: a `dispatch` still running finishes on its own thread, its answer
            // dropped; one not started yet never starts.
            runtime.shutdown_background();
        });
        Ok(())
    }
}

impl Drop for Front {
    /// Never stopped: do not wait for pool threads (they may be waiting for the GIL this drop holds).
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.get_mut().ok().and_then(Option::take) {
            runtime.shutdown_background();
        }
    }
}

async fn bind(host: &str, port: u16) -> std::io::Result<Vec<TcpListener>> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let host = if host.is_empty() { "::" } else { host };
    let mut addresses: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    addresses.dedup();
    let mut listeners: Vec<TcpListener> = Vec::new();
    let mut first_error = None;
    for mut address in addresses {
        if let Some(first) = listeners.first() {
            address.set_port(first.local_addr()?.port()); // port 0: every address on the one chosen
        }
        match listen_on(address) {
            Ok(listener) => listeners.push(listener),
            Err(err) => first_error = first_error.or(Some(err)),
        }
    }
    if listeners.is_empty() {
        return Err(first_error.unwrap_or_else(|| std::io::Error::other("the host resolves to no address")));
    }
    Ok(listeners)
}

/// A listening socket on `address`. The unspecified IPv6 address (`::`) takes IPv4 connections too,
/// whatever the host's `net.ipv6.bindv6only` says: `[::]` means every address (docs/reference/config.md).
fn listen_on(address: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if let std::net::SocketAddr::V6(v6) = address {
        socket.set_only_v6(!v6.ip().is_unspecified())?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

#[pymodule]
fn ca_externalgrpc_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Front>()?;
    Ok(())
}
