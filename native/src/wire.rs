//! Just enough of the protobuf wire format to read the hot requests (and to know when *not* to), the
//! health and reflection requests, and to write the few messages the front builds itself.
//!
//! A request is answered natively only when it has the plain shape the Python servicer would decode
//! without complaint: well-formed wire data, every known field of the wire type its schema says, each
//! singular field at most once (a repeated singular field merges in protobuf, which we do not copy),
//! valid UTF-8 in every string. Anything else is left to Python, which then answers exactly as it
//! always does (INVALID_ARGUMENT for undecodable bytes, for example). Unknown fields are skipped, as
//! protobuf keeps them without error.

/// What a field holds, as far as validation cares.
#[derive(Clone, Copy)]
pub enum Kind {
    Varint,
    Fixed64,
    Str,
    Message(&'static [Field]),
}

#[derive(Clone, Copy)]
pub struct Field {
    pub number: u64,
    pub kind: Kind,
    pub repeated: bool,
}

pub const fn field(number: u64, kind: Kind) -> Field {
    Field {
        number,
        kind,
        repeated: false,
    }
}

const fn repeated(number: u64, kind: Kind) -> Field {
    Field {
        number,
        kind,
        repeated: true,
    }
}

const MAP_ENTRY: &[Field] = &[field(1, Kind::Str), field(2, Kind::Str)];
/// ExternalGrpcNode: providerID, name, labels, annotations.
pub const NODE: &[Field] = &[
    field(1, Kind::Str),
    field(2, Kind::Str),
    repeated(3, Kind::Message(MAP_ENTRY)),
    repeated(4, Kind::Message(MAP_ENTRY)),
];
pub const FOR_NODE_REQUEST: &[Field] = &[field(1, Kind::Message(NODE))];
/// NodeGroupTargetSizeRequest, NodeGroupNodesRequest: one string id.
pub const ID_REQUEST: &[Field] = &[field(1, Kind::Str)];
const K8S_DURATION: &[Field] = &[field(1, Kind::Varint)];
const DURATION: &[Field] = &[field(1, Kind::Varint), field(2, Kind::Varint)];
const OPTIONS: &[Field] = &[
    field(1, Kind::Fixed64),
    field(2, Kind::Fixed64),
    field(3, Kind::Message(K8S_DURATION)),
    field(4, Kind::Message(K8S_DURATION)),
    field(5, Kind::Message(K8S_DURATION)),
    field(6, Kind::Varint),
    field(7, Kind::Varint),
    field(8, Kind::Message(DURATION)),
    field(9, Kind::Message(DURATION)),
    field(10, Kind::Message(DURATION)),
];
pub const OPTIONS_REQUEST: &[Field] = &[field(1, Kind::Str), field(2, Kind::Message(OPTIONS))];
pub const EMPTY_REQUEST: &[Field] = &[];

fn varint(data: &mut &[u8]) -> Option<u64> {
    let mut value = 0u64;
    for (index, shift) in (0..64).step_by(7).enumerate() {
        let byte = *data.first()?;
        *data = &data[1..];
        if index == 9 && byte > 1 {
            return None; // more than 64 bits
        }
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// One field as it sits on the wire: its number, its value for varints, its bytes for the others.
pub struct Raw<'a> {
    pub number: u64,
    pub wire_type: u64,
    pub value: u64,
    pub bytes: &'a [u8],
}

fn next_field<'a>(data: &mut &'a [u8]) -> Option<Raw<'a>> {
    let key = varint(data)?;
    let (number, wire_type) = (key >> 3, key & 7);
    if number == 0 || number > 536_870_911 {
        return None;
    }
    let mut value = 0;
    let bytes: &'a [u8] = match wire_type {
        0 => {
            value = varint(data)?;
            &[]
        }
        1 => {
            let (value, rest) = (data.get(..8)?, data.get(8..)?);
            *data = rest;
            value
        }
        2 => {
            let len = usize::try_from(varint(data)?).ok()?;
            let (value, rest) = (data.get(..len)?, data.get(len..)?);
            *data = rest;
            value
        }
        5 => {
            let (value, rest) = (data.get(..4)?, data.get(4..)?);
            *data = rest;
            value
        }
        _ => return None, // groups (3, 4) and invalid types: leave them to Python
    };
    Some(Raw {
        number,
        wire_type,
        value,
        bytes,
    })
}

/// The fields of `data` in wire order, up to the first malformed one (check with [`plain`] first).
pub fn fields(data: &[u8]) -> impl Iterator<Item = Raw<'_>> {
    let mut rest = data;
    std::iter::from_fn(move || next_field(&mut rest))
}

fn wire_type(kind: Kind) -> u64 {
    match kind {
        Kind::Varint => 0,
        Kind::Fixed64 => 1,
        Kind::Str | Kind::Message(_) => 2,
    }
}

/// Whether `data` is a message of `schema` in the plain shape described at the top of this file.
pub fn plain(data: &[u8], schema: &[Field]) -> bool {
    let mut rest = data;
    let mut seen: u64 = 0; // bit per schema position (schemas here have fewer than 64 fields)
    while !rest.is_empty() {
        let Some(raw) = next_field(&mut rest) else { return false };
        let Some(position) = schema.iter().position(|f| f.number == raw.number) else {
            continue;
        };
        let known = schema[position];
        if raw.wire_type != wire_type(known.kind) {
            return false;
        }
        if !known.repeated {
            if seen & (1 << position) != 0 {
                return false;
            }
            seen |= 1 << position;
        }
        let valid = match known.kind {
            Kind::Str => std::str::from_utf8(raw.bytes).is_ok(),
            Kind::Message(inner) => plain(raw.bytes, inner),
            Kind::Varint | Kind::Fixed64 => true,
        };
        if !valid {
            return false;
        }
    }
    true
}

/// The bytes of field `number` of a message already checked by [`plain`] (so at most one).
pub fn bytes_of(data: &[u8], number: u64) -> &[u8] {
    fields(data)
        .find(|raw| raw.number == number && raw.wire_type == 2)
        .map_or(&[], |raw| raw.bytes)
}

/// Whether a checked message has any occurrence of the length-delimited field `number`.
pub fn has_field(data: &[u8], number: u64) -> bool {
    fields(data).any(|raw| raw.number == number && raw.wire_type == 2)
}

pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A varint field (int32, enum, bool...): negative int32 values as their 64-bit two's complement.
pub fn put_varint_field(out: &mut Vec<u8>, number: u64, value: u64) {
    put_varint(out, number << 3);
    put_varint(out, value);
}

/// A length-delimited field: string, bytes or an embedded message.
pub fn put_bytes_field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
    put_varint(out, (number << 3) | 2);
    put_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(number: u64, wire_type: u64) -> u8 {
        u8::try_from((number << 3) | wire_type).unwrap()
    }

    fn string_field(number: u64, text: &[u8]) -> Vec<u8> {
        let mut out = vec![key(number, 2), u8::try_from(text.len()).unwrap()];
        out.extend_from_slice(text);
        out
    }

    #[test]
    fn reads_a_plain_id_request() {
        let request = string_field(1, b"pool-a");
        assert!(plain(&request, ID_REQUEST));
        assert_eq!(bytes_of(&request, 1), b"pool-a");
        assert!(plain(&[], ID_REQUEST));
        assert_eq!(bytes_of(&[], 1), b"");
    }

    #[test]
    fn refuses_what_python_would_decode_differently_or_not_at_all() {
        let mut twice = string_field(1, b"a");
        twice.extend(string_field(1, b"b"));
        assert!(!plain(&twice, ID_REQUEST), "a repeated singular field");
        assert!(!plain(&string_field(1, b"\xff\xfe"), ID_REQUEST), "invalid UTF-8");
        assert!(!plain(&[key(1, 0), 1], ID_REQUEST), "wrong wire type");
        assert!(!plain(&[key(1, 2), 9, b'a'], ID_REQUEST), "length past the end");
        assert!(!plain(&[key(1, 3)], ID_REQUEST), "a group");
        assert!(!plain(&[0x80], ID_REQUEST), "a truncated varint");
    }

    #[test]
    fn skips_unknown_fields() {
        let mut request = string_field(1, b"pool-a");
        request.extend([key(7, 0), 0x96, 0x01]);
        request.extend(string_field(9, b"\xff")); // unknown: not validated as a string
        assert!(plain(&request, ID_REQUEST));
        assert_eq!(bytes_of(&request, 1), b"pool-a");
    }

    #[test]
    fn validates_nested_nodes_and_their_labels() {
        let mut entry = string_field(1, b"zone");
        entry.extend(string_field(2, b"fr-par-1"));
        let mut node = string_field(1, b"scaleway://instance/fr-par-1/1");
        node.extend(string_field(3, &entry));
        node.extend(string_field(3, &entry)); // a map field repeats
        let request = string_field(1, &node);
        assert!(plain(&request, FOR_NODE_REQUEST));
        let inner = bytes_of(&request, 1);
        assert_eq!(bytes_of(inner, 1), b"scaleway://instance/fr-par-1/1");
        assert!(has_field(inner, 3));
        assert!(!has_field(inner, 4));

        let mut bad_entry = string_field(1, b"zone");
        bad_entry.extend(string_field(2, b"\xc3"));
        let bad = string_field(1, &string_field(3, &bad_entry));
        assert!(!plain(&bad, FOR_NODE_REQUEST), "invalid UTF-8 in a label value");
    }

    #[test]
    fn writes_what_it_reads() {
        let mut out = Vec::new();
        put_bytes_field(&mut out, 7, &[b'x'; 200]); // a two-byte length
        put_varint_field(&mut out, 2, 300);
        put_varint_field(&mut out, 1, (-1i32) as i64 as u64);
        let read: Vec<(u64, u64, u64, usize)> = fields(&out)
            .map(|f| (f.number, f.wire_type, f.value, f.bytes.len()))
            .collect();
        assert_eq!(read, vec![(7, 2, 0, 200), (2, 0, 300, 0), (1, 0, u64::MAX, 0)]);
    }

    #[test]
    fn checks_the_defaults_of_an_options_request() {
        let duration = [key(1, 0), 10, key(2, 0), 5];
        let mut defaults = vec![key(1, 1)];
        defaults.extend(0.5f64.to_le_bytes());
        defaults.extend(string_field(8, &duration));
        let mut request = string_field(1, b"pool-a");
        request.extend(string_field(2, &defaults));
        assert!(plain(&request, OPTIONS_REQUEST));
        let mut broken = string_field(1, b"pool-a");
        broken.extend(string_field(2, &[key(8, 2), 4, key(1, 0)]));
        assert!(!plain(&broken, OPTIONS_REQUEST), "a malformed nested duration");
    }
}
