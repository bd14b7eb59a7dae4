//! `ca_externalgrpc_native.Front`: the native gRPC front of the server (see `server/native_front.py`).
//!
//! It owns the CA-facing listening socket, answers the hot reads from tables of serialized answers the
//! Python side publishes after every change, and forwards every other call, unchanged, to the grpcio
//! server on a private unix socket. Its threads never take the GIL.

pub mod answers;
pub mod serve;
pub mod wire;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use answers::Tables;
use serve::Shared;

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

/// The running front. Construct it to bind and serve; `stop` drains it.
#[pyclass(frozen, module = "ca_externalgrpc_native")]
struct Front {
    shared: Arc<Shared>,
    port: u16,
    stop: watch::Sender<Option<Duration>>,
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    done: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[pymethods]
impl Front {
    /// Bind `host:port` (every address the host resolves to; port 0 picks one) and serve, forwarding to
    /// the grpcio server listening on the unix socket `upstream`. `buckets`: the latency histogram's bounds.
    #[new]
    #[pyo3(signature = (host, port, upstream, buckets, cert=None, key=None, client_ca=None, threads=2))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        host: &str,
        port: u16,
        upstream: String,
        buckets: Vec<f64>,
        cert: Option<Vec<u8>>,
        key: Option<Vec<u8>>,
        client_ca: Option<Vec<u8>>,
        threads: usize,
    ) -> PyResult<Self> {
        let tls = match (cert, key) {
            (Some(cert), Some(key)) => {
                Some(tls_acceptor(&cert, &key, client_ca.as_deref()).map_err(PyValueError::new_err)?)
            }
            (None, None) => None,
            _ => return Err(PyValueError::new_err("cert and key go together")),
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads.max(1))
            .thread_name("native-front")
            .enable_all()
            .build()
            .map_err(|e| os_error(&e))?;
        let listeners = runtime.block_on(bind(host, port)).map_err(|e| os_error(&e))?;
        let bound = listeners[0].local_addr().map_err(|e| os_error(&e))?.port();
        let shared = Arc::new(Shared::new(upstream, buckets));
        let (stop, stopped) = watch::channel(None);
        let done = runtime.spawn(serve::serve(listeners, tls, shared.clone(), stopped));
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
        for_node: HashMap<String, usize>,
        observed: Vec<String>,
        target_size: HashMap<String, Vec<u8>>,
        options: HashMap<String, Vec<u8>>,
        options_by_defaults: Vec<String>,
        nodes: HashMap<String, Vec<u8>>,
    ) -> PyResult<()> {
        if let Some(bad) = for_node.values().find(|&&i| i >= groups.len()) {
            return Err(PyValueError::new_err(format!(
                "for_node names group index {bad} of {}",
                groups.len()
            )));
        }
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
        };
        self.shared.published.publish(tables);
        Ok(())
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

    /// (method, calls, per-bucket counts with +Inf last, total seconds) of the natively answered calls.
    fn native_calls(&self) -> Vec<(String, u64, Vec<u64>, f64)> {
        self.shared.metrics.read()
    }

    /// Stop accepting, let open calls finish for at most `grace` seconds, close the rest.
    fn stop(&self, py: Python<'_>, grace: f64) -> PyResult<()> {
        let Some(runtime) = self
            .runtime
            .lock()
            .map_err(|_| PyRuntimeError::new_err("poisoned"))?
            .take()
        else {
            return Ok(());
        };
        let done = self
            .done
            .lock()
            .map_err(|_| PyRuntimeError::new_err("poisoned"))?
            .take();
        let _ = self.stop.send(Some(Duration::from_secs_f64(grace.max(0.0))));
        py.allow_threads(move || {
            if let Some(done) = done {
                let _ = runtime.block_on(done);
            }
            runtime.shutdown_timeout(Duration::from_secs(1));
        });
        Ok(())
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
        match TcpListener::bind(address).await {
            Ok(listener) => listeners.push(listener),
            Err(err) => first_error = first_error.or(Some(err)),
        }
    }
    if listeners.is_empty() {
        return Err(first_error.unwrap_or_else(|| std::io::Error::other("the host resolves to no address")));
    }
    Ok(listeners)
}

#[pymodule]
fn ca_externalgrpc_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Front>()?;
    Ok(())
}
