//! The answers Python publishes, and the decision for one hot request: answer it from them, or leave
//! it to Python (`Decision::Python`: the front calls Python's `dispatch`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use crate::wire;

/// The methods the front may answer itself, in the order of their metric slots.
pub const METHODS: [&str; 6] = [
    "NodeGroups",
    "NodeGroupForNode",
    "NodeGroupTargetSize",
    "NodeGroupGetOptions",
    "NodeGroupNodes",
    "NodeGroupTemplateNodeInfo",
];
pub const SERVICE: &str = "clusterautoscaler.cloudprovider.v1.externalgrpc.CloudProvider";

/// One published generation of answers: serialized response messages, exactly as the Python servicer
/// builds them, keyed by what each request looks up.
#[derive(Default)]
pub struct Tables {
    pub node_groups: Bytes,
    /// NodeGroupForNodeResponse for a node of no group.
    pub unmanaged: Bytes,
    /// providerID (or node name) -> index into `groups`. Shared with the tables before when Python says
    /// it did not change (a steady cluster: thousands of entries not built and held twice).
    pub for_node: Arc<HashMap<String, usize>>,
    /// Per group: its id and its NodeGroupForNodeResponse.
    pub groups: Vec<(String, Bytes)>,
    /// Group id -> whether Python has recorded a node's labels for it in the current snapshot (calls
    /// that carry labels for a group not yet recorded go to Python, which records them).
    pub observed: HashMap<String, AtomicBool>,
    pub target_size: HashMap<String, Bytes>,
    pub options: HashMap<String, Bytes>,
    /// Groups of the snapshot whose options depend on the caller's defaults (per-group options in the
    /// config): answered from what Python answered before for the same defaults bytes.
    pub options_by_defaults: HashSet<String>,
    pub nodes: HashMap<String, Bytes>,
    /// Group id -> the TemplateNodeInfo answer Python gave for it since these tables were published
    /// (learned, not published: a template is built only when asked); empty in every new generation.
    pub templates: RwLock<HashMap<String, Bytes>>,
}

/// At most this many (group, defaults) answers are remembered: a CA sends the same defaults every
/// time, so this bounds only what a client sending ever-changing defaults could make us hold.
const MAX_LEARNED_OPTIONS: usize = 4096;

/// What to do with one request.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// The serialized response message to send with status OK.
    Answer(Bytes),
    Python,
}

/// The current tables; `None` until Python publishes (and for good when it never does).
#[derive(Default)]
pub struct Published {
    current: RwLock<Option<Arc<Tables>>>,
    /// (group, serialized defaults) -> GetOptions answer, as Python gave it. Kept across publications:
    /// the answer depends only on the configured options (fixed for the process) and the defaults.
    learned_options: RwLock<HashMap<(String, Bytes), Bytes>>,
}

impl Published {
    pub fn publish(&self, tables: Tables) {
        *self.current.write().expect("tables lock") = Some(Arc::new(tables));
    }

    pub fn current(&self) -> Option<Arc<Tables>> {
        self.current.read().expect("tables lock").clone()
    }

    pub fn learn_options(&self, group: String, defaults: Bytes, answer: Bytes) {
        let mut learned = self.learned_options.write().expect("options lock");
        if learned.len() < MAX_LEARNED_OPTIONS {
            learned.insert((group, defaults), answer);
        }
    }

    fn learned_options(&self, group: &str, defaults: &[u8]) -> Option<Bytes> {
        let key = (group.to_string(), Bytes::copy_from_slice(defaults));
        self.learned_options.read().expect("options lock").get(&key).cloned()
    }

    /// Python answered TemplateNodeInfo of `group` with `answer` for the current tables.
    pub fn learn_template(&self, group: &str, answer: Bytes) {
        if let Some(tables) = self.current() {
            if tables.observed.contains_key(group) {
                tables
                    .templates
                    .write()
                    .expect("templates lock")
                    .insert(group.to_string(), answer);
            }
        }
    }

    /// The template of `group` changed (a node's labels were recorded): ask Python again.
    pub fn forget_template(&self, group: &str) {
        if let Some(tables) = self.current() {
            tables.templates.write().expect("templates lock").remove(group);
        }
    }

    pub fn mark_observed(&self, group: &str) {
        if let Some(tables) = self.current() {
            if let Some(flag) = tables.observed.get(group) {
                flag.store(true, Ordering::Relaxed);
            }
        }
    }
}

fn lookup(map: &HashMap<String, Bytes>, key: &[u8]) -> Decision {
    match std::str::from_utf8(key).ok().and_then(|k| map.get(k)) {
        Some(answer) => Decision::Answer(answer.clone()),
        None => Decision::Python, // empty id, unknown group, or an answer Python did not publish
    }
}

/// Answer `message` (the request bytes of `method`, an index into [`METHODS`]) or say it goes to Python.
pub fn decide(published: &Published, tables: &Tables, method: usize, message: &[u8]) -> Decision {
    let schema = match method {
        0 => wire::EMPTY_REQUEST,
        1 => wire::FOR_NODE_REQUEST,
        3 => wire::OPTIONS_REQUEST,
        _ => wire::ID_REQUEST,
    };
    if !wire::plain(message, schema) {
        return Decision::Python;
    }
    match method {
        0 => Decision::Answer(tables.node_groups.clone()),
        1 => {
            let node = wire::bytes_of(message, 1);
            let provider_id = wire::bytes_of(node, 1);
            let key = if provider_id.is_empty() {
                wire::bytes_of(node, 2)
            } else {
                provider_id
            };
            let found = std::str::from_utf8(key).ok().and_then(|k| tables.for_node.get(k));
            match found {
                None => Decision::Answer(tables.unmanaged.clone()),
                Some(&index) => {
                    let (group, answer) = &tables.groups[index];
                    let recorded = tables.observed.get(group).is_some_and(|f| f.load(Ordering::Relaxed));
                    if wire::has_field(node, 3) && !recorded {
                        Decision::Python
                    } else {
                        Decision::Answer(answer.clone())
                    }
                }
            }
        }
        2 => lookup(&tables.target_size, wire::bytes_of(message, 1)),
        3 => {
            let id = wire::bytes_of(message, 1);
            match std::str::from_utf8(id) {
                Ok(gid) if tables.options_by_defaults.contains(gid) => {
                    match published.learned_options(gid, wire::bytes_of(message, 2)) {
                        Some(answer) => Decision::Answer(answer),
                        None => Decision::Python,
                    }
                }
                _ => lookup(&tables.options, id),
            }
        }
        4 => lookup(&tables.nodes, wire::bytes_of(message, 1)),
        _ => {
            let learned = std::str::from_utf8(wire::bytes_of(message, 1))
                .ok()
                .and_then(|gid| tables.templates.read().expect("templates lock").get(gid).cloned());
            learned.map_or(Decision::Python, Decision::Answer)
        }
    }
}

/// The natively answered methods counted in [`CallMetrics`], (service, method) per slot: the hot
/// methods in the order of [`METHODS`], then health `Check`.
pub const COUNTED: [(&str, &str); 7] = [
    (SERVICE, METHODS[0]),
    (SERVICE, METHODS[1]),
    (SERVICE, METHODS[2]),
    (SERVICE, METHODS[3]),
    (SERVICE, METHODS[4]),
    (SERVICE, METHODS[5]),
    (crate::health::SERVICE, "Check"),
];
pub const HEALTH_CHECK: usize = 6;

/// Counts and a latency histogram per natively answered method (only answers with status OK are
/// counted), read by Python's Prometheus collector at scrape time and added to the series of the calls
/// Python answers.
pub struct CallMetrics {
    bounds: Vec<f64>,
    counts: Vec<AtomicU64>,
    /// per method: one slot per bound, then one for +Inf (not cumulative)
    buckets: Vec<Vec<AtomicU64>>,
    nanos: Vec<AtomicU64>,
}

impl CallMetrics {
    pub fn new(bounds: Vec<f64>) -> Self {
        let n = COUNTED.len();
        let slots = bounds.len() + 1;
        CallMetrics {
            counts: (0..n).map(|_| AtomicU64::new(0)).collect(),
            buckets: (0..n)
                .map(|_| (0..slots).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            nanos: (0..n).map(|_| AtomicU64::new(0)).collect(),
            bounds,
        }
    }

    pub fn record(&self, method: usize, seconds: f64) {
        let slot = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(self.bounds.len());
        self.buckets[method][slot].fetch_add(1, Ordering::Relaxed);
        self.nanos[method].fetch_add((seconds * 1e9) as u64, Ordering::Relaxed);
        self.counts[method].fetch_add(1, Ordering::Relaxed);
    }

    /// (service, method, calls, per-bucket counts with +Inf last, total seconds) for every method called.
    pub fn read(&self) -> Vec<(String, String, u64, Vec<u64>, f64)> {
        (0..COUNTED.len())
            .filter_map(|m| {
                let count = self.counts[m].load(Ordering::Relaxed);
                (count > 0).then(|| {
                    let buckets = self.buckets[m].iter().map(|b| b.load(Ordering::Relaxed)).collect();
                    let seconds = self.nanos[m].load(Ordering::Relaxed) as f64 / 1e9;
                    let (service, method) = COUNTED[m];
                    (service.to_string(), method.to_string(), count, buckets, seconds)
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string_field(number: u8, text: &[u8]) -> Vec<u8> {
        let mut out = vec![(number << 3) | 2, u8::try_from(text.len()).unwrap()];
        out.extend_from_slice(text);
        out
    }

    fn tables() -> Tables {
        let mut t = Tables {
            node_groups: Bytes::from_static(b"groups"),
            unmanaged: Bytes::from_static(b"none"),
            ..Tables::default()
        };
        t.groups.push(("pool-a".into(), Bytes::from_static(b"is pool-a")));
        t.for_node = Arc::new(HashMap::from([("scw://1".into(), 0)]));
        t.observed.insert("pool-a".into(), AtomicBool::new(false));
        t.target_size.insert("pool-a".into(), Bytes::from_static(b"size 3"));
        t
    }

    fn for_node(provider_id: &[u8], name: &[u8], labelled: bool) -> Vec<u8> {
        let mut node = string_field(1, provider_id);
        node.extend(string_field(2, name));
        if labelled {
            let mut entry = string_field(1, b"k");
            entry.extend(string_field(2, b"v"));
            node.extend(string_field(3, &entry));
        }
        string_field(1, &node)
    }

    #[test]
    fn answers_known_ids_and_leaves_the_rest_to_python() {
        let t = tables();
        let p = Published::default();
        assert_eq!(
            decide(&p, &t, 2, &string_field(1, b"pool-a")),
            Decision::Answer(Bytes::from_static(b"size 3"))
        );
        assert_eq!(
            decide(&p, &t, 2, &string_field(1, b"pool-x")),
            Decision::Python,
            "unknown group"
        );
        assert_eq!(decide(&p, &t, 2, &[]), Decision::Python, "empty id");
        assert_eq!(
            decide(&p, &t, 4, &string_field(1, b"pool-a")),
            Decision::Python,
            "not published"
        );
        assert_eq!(decide(&p, &t, 0, &[]), Decision::Answer(Bytes::from_static(b"groups")));
    }

    #[test]
    fn node_lookups_leave_unrecorded_labels_to_python_once_marked_they_are_answered() {
        let p = Published::default();
        p.publish(tables());
        let t = p.current().unwrap();
        let answer = Decision::Answer(Bytes::from_static(b"is pool-a"));
        assert_eq!(decide(&p, &t, 1, &for_node(b"scw://1", b"n1", false)), answer);
        assert_eq!(decide(&p, &t, 1, &for_node(b"scw://1", b"n1", true)), Decision::Python);
        p.mark_observed("pool-a");
        assert_eq!(decide(&p, &t, 1, &for_node(b"scw://1", b"n1", true)), answer);
        assert_eq!(
            decide(&p, &t, 1, &for_node(b"", b"scw://1", false)),
            answer,
            "the name stands in"
        );
        let none = Decision::Answer(Bytes::from_static(b"none"));
        assert_eq!(decide(&p, &t, 1, &for_node(b"scw://9", b"n9", true)), none);
        assert_eq!(decide(&p, &t, 1, &[]), none, "no node at all");
    }

    #[test]
    fn options_that_depend_on_the_defaults_are_answered_once_python_answered_them() {
        let p = Published::default();
        let mut t = tables();
        t.options_by_defaults.insert("pool-a".into());
        p.publish(t);
        let t = p.current().unwrap();
        let mut request = string_field(1, b"pool-a");
        request.extend(string_field(2, &[9, 0, 0, 0, 0, 0, 0, 0xe0, 0x3f])); // threshold 0.5
        assert_eq!(decide(&p, &t, 3, &request), Decision::Python);
        p.learn_options(
            "pool-a".into(),
            Bytes::copy_from_slice(wire::bytes_of(&request, 2)),
            Bytes::from_static(b"a"),
        );
        assert_eq!(decide(&p, &t, 3, &request), Decision::Answer(Bytes::from_static(b"a")));
        let other_defaults = string_field(1, b"pool-a");
        assert_eq!(
            decide(&p, &t, 3, &other_defaults),
            Decision::Python,
            "other defaults, other answer"
        );
        p.publish(tables()); // a snapshot without the group: Python says NOT_FOUND
        assert_eq!(decide(&p, &p.current().unwrap(), 3, &request), Decision::Python);
    }

    #[test]
    fn templates_are_answered_once_python_answered_them_until_forgotten_or_republished() {
        let p = Published::default();
        p.publish(tables());
        let request = string_field(1, b"pool-a");
        let t = p.current().unwrap();
        assert_eq!(decide(&p, &t, 5, &request), Decision::Python, "not learned yet");
        p.learn_template("pool-a", Bytes::from_static(b"template"));
        p.learn_template("pool-x", Bytes::from_static(b"no such group"));
        assert_eq!(
            decide(&p, &t, 5, &request),
            Decision::Answer(Bytes::from_static(b"template"))
        );
        assert_eq!(decide(&p, &t, 5, &string_field(1, b"pool-x")), Decision::Python);
        p.forget_template("pool-a");
        assert_eq!(decide(&p, &t, 5, &request), Decision::Python, "forgotten");
        p.learn_template("pool-a", Bytes::from_static(b"template"));
        p.publish(tables());
        assert_eq!(
            decide(&p, &p.current().unwrap(), 5, &request),
            Decision::Python,
            "a new generation"
        );
    }

    #[test]
    fn metrics_fill_the_bucket_of_each_latency() {
        let m = CallMetrics::new(vec![0.001, 0.01]);
        m.record(2, 0.0005);
        m.record(2, 0.005);
        m.record(2, 1.0);
        m.record(HEALTH_CHECK, 0.0001);
        let read = m.read();
        assert_eq!(read.len(), 2);
        let (service, name, count, buckets, seconds) = &read[0];
        assert_eq!(
            (service.as_str(), name.as_str(), *count, buckets.clone()),
            (SERVICE, "NodeGroupTargetSize", 3, vec![1, 1, 1])
        );
        assert!((seconds - 1.0055).abs() < 1e-6);
        assert_eq!(
            (read[1].0.as_str(), read[1].1.as_str(), read[1].2),
            ("grpc.health.v1.Health", "Check", 1)
        );
    }
}
