//! Server reflection (`grpc.reflection.v1` and `v1alpha`, the same messages), answered natively from
//! the catalog Python sets: one ServerReflectionResponse per request message, as grpcio's servicer.
//!
//! * `file_by_filename`, `file_containing_symbol`: the file and its transitive imports, each once, the
//!   file first then breadth first (grpcio's order); NOT_FOUND for a file or symbol not in the catalog.
//!   Symbols are looked up exactly as listed: Python lists every name that should resolve.
//! * `file_containing_extension`: always NOT_FOUND (the services declare no extensions).
//! * `all_extension_numbers_of_type`: no numbers for a known symbol, NOT_FOUND for another.
//! * `list_services`: the services set.
//! * anything else (no request field, or bytes that are no ServerReflectionRequest): an error response
//!   INVALID_ARGUMENT, and the stream goes on.
//!
//! Every response carries `valid_host` (the request's host) and `original_request` (its bytes).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use crate::grpc;
use crate::wire::{self, field, Field, Kind};

pub const SERVICES: [&str; 2] = [
    "grpc.reflection.v1.ServerReflection",
    "grpc.reflection.v1alpha.ServerReflection",
];

const EXTENSION_REQUEST: &[Field] = &[field(1, Kind::Str), field(2, Kind::Varint)];
/// ServerReflectionRequest: host, then the oneof (file_by_filename, file_containing_symbol,
/// file_containing_extension, all_extension_numbers_of_type, list_services).
const REQUEST: &[Field] = &[
    field(1, Kind::Str),
    field(3, Kind::Str),
    field(4, Kind::Str),
    field(5, Kind::Message(EXTENSION_REQUEST)),
    field(6, Kind::Str),
    field(7, Kind::Str),
];

/// What the server describes: its services, its files (serialized FileDescriptorProto and the names
/// of the files each imports) and which file declares each symbol.
#[derive(Default, Debug)]
pub struct Catalog {
    services: Vec<String>,
    files: HashMap<String, (Bytes, Vec<String>)>,
    symbols: HashMap<String, String>,
}

impl Catalog {
    /// A catalog whose every import and symbol names one of its files.
    pub fn new(
        services: Vec<String>,
        files: Vec<(String, Bytes, Vec<String>)>,
        symbols: HashMap<String, String>,
    ) -> Result<Self, String> {
        let files: HashMap<String, (Bytes, Vec<String>)> = files
            .into_iter()
            .map(|(name, proto, imports)| (name, (proto, imports)))
            .collect();
        for (name, (_, imports)) in &files {
            if let Some(missing) = imports.iter().find(|i| !files.contains_key(*i)) {
                return Err(format!("file {name} imports {missing}, which is not among the files"));
            }
        }
        if let Some((symbol, file)) = symbols.iter().find(|(_, file)| !files.contains_key(*file)) {
            return Err(format!(
                "symbol {symbol} is in file {file}, which is not among the files"
            ));
        }
        Ok(Catalog {
            services,
            files,
            symbols,
        })
    }

    /// `name` and every file it imports, directly or not, each once: `name` first, then breadth first.
    fn closure(&self, name: &str) -> Option<Vec<Bytes>> {
        self.files.get(name)?;
        let mut order = vec![name];
        let mut seen = HashSet::from([name]);
        let mut next = 0;
        while let Some(&file) = order.get(next) {
            for import in &self.files[file].1 {
                if seen.insert(import.as_str()) {
                    order.push(import);
                }
            }
            next += 1;
        }
        Some(order.into_iter().map(|file| self.files[file].0.clone()).collect())
    }

    /// The ServerReflectionResponse to one serialized ServerReflectionRequest.
    pub fn answer(&self, request: &[u8]) -> Bytes {
        let mut out = Vec::new();
        if !wire::plain(request, REQUEST) {
            wire::put_bytes_field(&mut out, 2, request);
            error(&mut out, grpc::INVALID_ARGUMENT, "invalid argument");
            return Bytes::from(out);
        }
        let host = wire::bytes_of(request, 1);
        if !host.is_empty() {
            wire::put_bytes_field(&mut out, 1, host);
        }
        wire::put_bytes_field(&mut out, 2, request);
        // The oneof: the last of its fields on the wire wins, as protobuf decodes it.
        let asked = wire::fields(request).filter(|f| (3..=7).contains(&f.number)).last();
        let Some(asked) = asked else {
            error(&mut out, grpc::INVALID_ARGUMENT, "invalid argument");
            return Bytes::from(out);
        };
        let name = std::str::from_utf8(asked.bytes).unwrap_or_default();
        let files = match asked.number {
            3 => self.closure(name),
            4 => self.symbols.get(name).and_then(|file| self.closure(file)),
            6 if self.symbols.contains_key(name) => {
                let mut numbers = Vec::new();
                wire::put_bytes_field(&mut numbers, 1, name.as_bytes());
                wire::put_bytes_field(&mut out, 5, &numbers);
                return Bytes::from(out);
            }
            7 => {
                let mut list = Vec::new();
                for service in &self.services {
                    let mut one = Vec::new();
                    wire::put_bytes_field(&mut one, 1, service.as_bytes());
                    wire::put_bytes_field(&mut list, 1, &one);
                }
                wire::put_bytes_field(&mut out, 6, &list);
                return Bytes::from(out);
            }
            _ => None, // an extension, or the extensions of an unknown type
        };
        match files {
            Some(files) => {
                let mut response = Vec::new();
                for file in files {
                    wire::put_bytes_field(&mut response, 1, &file);
                }
                wire::put_bytes_field(&mut out, 4, &response);
            }
            None => error(&mut out, grpc::NOT_FOUND, "not found"),
        }
        Bytes::from(out)
    }
}

fn error(out: &mut Vec<u8>, code: u32, message: &str) {
    let mut response = Vec::new();
    wire::put_varint_field(&mut response, 1, u64::from(code));
    wire::put_bytes_field(&mut response, 2, message.as_bytes());
    wire::put_bytes_field(out, 7, &response);
}

/// The current catalog, replaced whole by Python.
#[derive(Default)]
pub struct Reflection {
    current: RwLock<Arc<Catalog>>,
}

impl Reflection {
    pub fn set(&self, catalog: Catalog) {
        *self.current.write().expect("reflection lock") = Arc::new(catalog);
    }

    pub fn current(&self) -> Arc<Catalog> {
        self.current.read().expect("reflection lock").clone()
    }
}

/// Answer a reflection stream: one response per request message, OK when the client half-closes,
/// DEADLINE_EXCEEDED when its deadline passes first.
pub async fn serve_stream(
    reflection: Arc<Reflection>,
    mut body: hyper::body::Incoming,
    mut deframer: grpc::Deframer,
    deadline: Option<std::time::Instant>,
    stream: grpc::Stream,
) {
    let far = tokio::time::Instant::now() + std::time::Duration::from_secs(86400 * 365);
    let until = deadline.map_or(far, Into::into);
    // The deadline bounds reading the requests and sending the answers alike.
    let served = tokio::time::timeout_at(until, async {
        loop {
            match grpc::next_message(&mut body, &mut deframer).await {
                Ok(Some(request)) => {
                    if !stream.send(&reflection.current().answer(&request.message)).await {
                        return None;
                    }
                }
                Ok(None) => return Some(grpc::Status::new(grpc::OK, "")),
                Err(status) => return status,
            }
        }
    });
    let end = match served.await {
        Ok(Some(status)) => status,
        Ok(None) => return, // the client broke the stream or left: nobody to answer
        Err(_) => grpc::Status::new(grpc::DEADLINE_EXCEEDED, "Deadline Exceeded"),
    };
    stream.finish(end).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> Catalog {
        let file = |name: &str, imports: &[&str]| {
            (
                name.to_string(),
                Bytes::from(format!("proto of {name}")),
                imports.iter().map(|s| s.to_string()).collect(),
            )
        };
        Catalog::new(
            vec!["pkg.Svc".into(), "grpc.health.v1.Health".into()],
            vec![
                file("svc.proto", &["a.proto", "b.proto"]),
                file("a.proto", &["c.proto"]),
                file("b.proto", &["c.proto", "a.proto"]),
                file("c.proto", &[]),
            ],
            HashMap::from([
                ("pkg.Svc".to_string(), "svc.proto".to_string()),
                ("pkg.C".to_string(), "c.proto".to_string()),
            ]),
        )
        .unwrap()
    }

    fn request(number: u64, text: &str) -> Vec<u8> {
        let mut out = Vec::new();
        wire::put_bytes_field(&mut out, 1, b"localhost");
        wire::put_bytes_field(&mut out, number, text.as_bytes());
        out
    }

    /// (field number, bytes) of each top-level field of a response.
    fn top(response: &[u8]) -> Vec<(u64, Vec<u8>)> {
        wire::fields(response).map(|f| (f.number, f.bytes.to_vec())).collect()
    }

    fn strings(message: &[u8]) -> Vec<String> {
        wire::fields(message)
            .map(|f| String::from_utf8(f.bytes.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_file_comes_with_its_transitive_imports_each_once_breadth_first() {
        let c = catalog();
        let asked = request(3, "svc.proto");
        let response = c.answer(&asked);
        let fields = top(&response);
        assert_eq!(fields[0], (1, b"localhost".to_vec()), "valid_host");
        assert_eq!(fields[1], (2, asked.clone()), "original_request");
        assert_eq!(fields[2].0, 4);
        assert_eq!(
            strings(&fields[2].1),
            [
                "proto of svc.proto",
                "proto of a.proto",
                "proto of b.proto",
                "proto of c.proto"
            ]
        );
        let by_symbol = top(&c.answer(&request(4, "pkg.C")));
        assert_eq!(strings(&by_symbol[2].1), ["proto of c.proto"]);
    }

    #[test]
    fn lists_services_and_answers_extension_questions() {
        let c = catalog();
        let fields = top(&c.answer(&request(7, "*")));
        assert_eq!(fields[2].0, 6);
        let names: Vec<String> = wire::fields(&fields[2].1).flat_map(|s| strings(s.bytes)).collect();
        assert_eq!(names, ["pkg.Svc", "grpc.health.v1.Health"]);
        let fields = top(&c.answer(&request(6, "pkg.C")));
        assert_eq!(
            fields[2],
            (5, vec![0x0a, 5, b'p', b'k', b'g', b'.', b'C']),
            "no numbers"
        );
    }

    #[test]
    fn unknown_names_are_not_found_and_empty_requests_invalid() {
        let c = catalog();
        let not_found = {
            let mut e = Vec::new();
            error(&mut e, grpc::NOT_FOUND, "not found");
            top(&e)[0].clone()
        };
        assert_eq!(
            not_found.1,
            [0x08, 5, 0x12, 9, b'n', b'o', b't', b' ', b'f', b'o', b'u', b'n', b'd']
        );
        for asked in [request(3, "nope.proto"), request(4, "pkg.Nope"), request(6, "pkg.Nope")] {
            assert_eq!(top(&c.answer(&asked))[2], not_found);
        }
        let mut extension = Vec::new();
        wire::put_bytes_field(&mut extension, 1, b"pkg.C");
        wire::put_varint_field(&mut extension, 2, 100);
        let mut asked = Vec::new();
        wire::put_bytes_field(&mut asked, 5, &extension);
        assert_eq!(top(&c.answer(&asked))[1], not_found, "no host: no valid_host field");
        let mut host_only = Vec::new();
        wire::put_bytes_field(&mut host_only, 1, b"h");
        assert_eq!(top(&c.answer(&host_only))[2].0, 7);
        assert_eq!(top(&c.answer(&request(1, "twice")))[1].0, 7, "a singular field twice");
        assert_eq!(top(&c.answer(&[0xff]))[1].0, 7, "undecodable");
    }

    #[test]
    fn the_last_oneof_field_wins() {
        let c = catalog();
        let mut asked = request(3, "nope.proto");
        wire::put_bytes_field(&mut asked, 7, b"");
        assert_eq!(top(&c.answer(&asked))[2].0, 6);
    }

    #[test]
    fn a_catalog_must_hold_every_file_it_names() {
        let missing_import = Catalog::new(
            vec![],
            vec![("a".into(), Bytes::new(), vec!["b".into()])],
            HashMap::new(),
        );
        assert!(missing_import.unwrap_err().contains("imports b"));
        let missing_file = Catalog::new(vec![], vec![], HashMap::from([("S".to_string(), "f".to_string())]));
        assert!(missing_file.unwrap_err().contains("symbol S"));
    }
}
