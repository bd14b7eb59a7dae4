//! The native floor of the serving spike: a tonic (Rust) gRPC server for the CloudProvider reads the
//! benchmark's load client sends, answering from serialized answers a Python script built
//! (`python -m tests.bench.floor_server --native-answers`). Requests are not decoded beyond the one
//! field each lookup needs, answers are bytes: this is what a native serving core in front of the
//! Python domain would cost per call, the domain having published its snapshot as ready answers.
//!
//!     native-floor --answers FILE --address 127.0.0.1:0

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use base64::Engine;
use bytes::{Buf, BufMut, Bytes};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};

const SERVICE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";

/// The answers, as the Python side wrote them (base64 of serialized messages).
#[derive(serde::Deserialize)]
struct AnswerFile {
    refresh: String,
    node_groups: String,
    options: String,
    unmanaged: String,
    for_node: HashMap<String, String>, // providerID -> NodeGroupForNodeResponse
    target_size: HashMap<String, String>, // group id -> NodeGroupTargetSizeResponse
    nodes: HashMap<String, String>,    // group id -> NodeGroupNodesResponse
}

struct Answers {
    refresh: Bytes,
    node_groups: Bytes,
    options: Bytes,
    unmanaged: Bytes,
    for_node: HashMap<Bytes, Bytes>,
    target_size: HashMap<Bytes, Bytes>,
    nodes: HashMap<Bytes, Bytes>,
}

fn decode(text: &str) -> Bytes {
    Bytes::from(base64::engine::general_purpose::STANDARD.decode(text).expect("base64 answer"))
}

fn keyed(map: HashMap<String, String>) -> HashMap<Bytes, Bytes> {
    map.into_iter().map(|(k, v)| (Bytes::from(k), decode(&v))).collect()
}

/// The bytes of the first length-delimited field `number` of a message (enough for the string ids
/// and the embedded node these requests carry; other wire types are skipped).
fn field(mut data: &[u8], number: u64) -> Option<&[u8]> {
    fn varint(data: &mut &[u8]) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *data.first()?;
            *data = &data[1..];
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }
    while !data.is_empty() {
        let key = varint(&mut data)?;
        match key & 7 {
            0 => {
                varint(&mut data)?;
            }
            1 => data = data.get(8..)?,
            5 => data = data.get(4..)?,
            2 => {
                let len = varint(&mut data)? as usize;
                let (value, rest) = (data.get(..len)?, data.get(len..)?);
                if key >> 3 == number {
                    return Some(value);
                }
                data = rest;
            }
            _ => return None,
        }
    }
    None
}

#[derive(Clone, Copy)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        let len = src.remaining();
        Ok(Some(src.copy_to_bytes(len)))
    }
}

/// One RPC: which method, over the shared answers.
struct Method {
    name: &'static str,
    answers: Arc<Answers>,
}

impl UnaryService<Bytes> for Method {
    type Response = Bytes;
    type Future = std::future::Ready<Result<Response<Bytes>, Status>>;
    fn call(&mut self, request: Request<Bytes>) -> Self::Future {
        let a = &self.answers;
        let body = request.into_inner();
        let id = || field(&body, 1).map(Bytes::copy_from_slice).unwrap_or_default();
        let answer = match self.name {
            "Refresh" => Ok(a.refresh.clone()),
            "NodeGroups" => Ok(a.node_groups.clone()),
            "NodeGroupGetOptions" => Ok(a.options.clone()),
            "NodeGroupForNode" => {
                let provider_id = field(&body, 1).and_then(|node| field(node, 1)).unwrap_or_default();
                Ok(a.for_node.get(provider_id).unwrap_or(&a.unmanaged).clone())
            }
            "NodeGroupTargetSize" => a.target_size.get(&id()).cloned().ok_or_else(|| Status::not_found("no such group")),
            "NodeGroupNodes" => a.nodes.get(&id()).cloned().ok_or_else(|| Status::not_found("no such group")),
            _ => Err(Status::unimplemented("the native floor answers only the load client's reads")),
        };
        std::future::ready(answer.map(Response::new))
    }
}

#[derive(Clone)]
struct CloudProvider {
    answers: Arc<Answers>,
}

impl NamedService for CloudProvider {
    const NAME: &'static str = SERVICE;
}

impl tower::Service<http::Request<tonic::body::Body>> for CloudProvider {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let name = request.uri().path().rsplit('/').next().unwrap_or("").to_string();
        let name: &'static str = match name.as_str() {
            "Refresh" => "Refresh",
            "NodeGroups" => "NodeGroups",
            "NodeGroupForNode" => "NodeGroupForNode",
            "NodeGroupGetOptions" => "NodeGroupGetOptions",
            "NodeGroupTargetSize" => "NodeGroupTargetSize",
            "NodeGroupNodes" => "NodeGroupNodes",
            _ => "other",
        };
        let method = Method { name, answers: self.answers.clone() };
        Box::pin(async move { Ok(Grpc::new(RawCodec).unary(method, request).await) })
    }
}

fn main() {
    let mut answers_path = None;
    let mut address = "127.0.0.1:0".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--answers" => answers_path = args.next(),
            "--address" => address = args.next().expect("--address needs a value"),
            other => panic!("unknown argument {other}"),
        }
    }
    let text = std::fs::read_to_string(answers_path.expect("--answers FILE is required")).expect("answers file");
    let file: AnswerFile = serde_json::from_str(&text).expect("answers JSON");
    let answers = Arc::new(Answers {
        refresh: decode(&file.refresh),
        node_groups: decode(&file.node_groups),
        options: decode(&file.options),
        unmanaged: decode(&file.unmanaged),
        for_node: keyed(file.for_node),
        target_size: keyed(file.target_size),
        nodes: keyed(file.nodes),
    });
    // Two worker threads: the machine's cores; the CA's calls arrive one at a time anyway.
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&address).await.expect("bind");
        // No Nagle: a small answer would otherwise wait for the client's delayed ACK (40 ms).
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        tonic::transport::Server::builder()
            .add_service(CloudProvider { answers })
            .serve_with_incoming(incoming)
            .await
            .expect("serve");
    });
}
