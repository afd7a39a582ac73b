//! The RESP encoder: writes a [`Frame`] as RESP3, or as RESP2 with the downgrades Redis
//! makes (maps become flat arrays, sets and pushes arrays, null `$-1`, booleans integers,
//! doubles and big numbers bulk strings, verbatim strings their text, bulk errors simple
//! errors, attributes dropped).
//!
//! Nested frames are walked with an explicit stack, never recursion. Lines (simple strings
//! and errors) have `\r` and `\n` replaced by spaces so a reply can never break framing.

use super::{Frame, Protocol};
use bytes::Bytes;

/// Bulk strings at least this long are not copied by [`encode_shared`].
pub const SHARED_BULK_BYTES_MIN: usize = 16 * 1024;

/// Appends `frame`, written for a connection speaking `protocol`, to `out`.
pub fn encode(frame: &Frame, protocol: Protocol, out: &mut Vec<u8>) {
    encode_with(frame, protocol, out, None);
}

/// As [`encode`], except that the body of each bulk string of at least
/// [`SHARED_BULK_BYTES_MIN`] bytes is not copied into `out`: it is pushed on `shared` as
/// `(offset, bytes)`, meaning that `bytes` go at `offset` of `out` (offsets ascend). The
/// encoding is `out` with each shared body spliced in at its offset. A writer sends the
/// pieces in turn, so that a reply of large values costs no copy of them and its buffer
/// stays small whatever the reply's size.
pub fn encode_shared(
    frame: &Frame,
    protocol: Protocol,
    out: &mut Vec<u8>,
    shared: &mut Vec<(usize, Bytes)>,
) {
    encode_with(frame, protocol, out, Some(shared));
}

fn encode_with(
    frame: &Frame,
    protocol: Protocol,
    out: &mut Vec<u8>,
    mut shared: Option<&mut Vec<(usize, Bytes)>>,
) {
    let len_before = out.len();
    let mut stack: Vec<&Frame> = vec![frame];
    // Each pass pops one frame and pushes only its children, so the loop runs once per
    // frame in the tree.
    while let Some(frame) = stack.pop() {
        match (frame, shared.as_deref_mut()) {
            (Frame::Bulk(bytes), Some(shared)) if bytes.len() >= SHARED_BULK_BYTES_MIN => {
                header(out, b'$', bytes.len() as i128);
                shared.push((out.len(), bytes.clone()));
                out.extend_from_slice(b"\r\n");
            }
            _ => encode_one(frame, protocol, out, &mut stack),
        }
    }
    assert!(out.len() >= len_before + 3, "every frame is at least a type byte and CRLF");
}

/// The encoding of `frame` as a new byte vector.
pub fn to_bytes(frame: &Frame, protocol: Protocol) -> Vec<u8> {
    let mut out = Vec::new();
    encode(frame, protocol, &mut out);
    out
}

/// Writes one frame's header (and, for scalars, its body); pushes its children on
/// `stack` in reverse so they are written in order.
fn encode_one<'f>(
    frame: &'f Frame,
    protocol: Protocol,
    out: &mut Vec<u8>,
    stack: &mut Vec<&'f Frame>,
) {
    let resp3 = protocol == Protocol::Resp3;
    match frame {
        Frame::Simple(text) => line(out, b'+', text),
        Frame::Error(text) => line(out, b'-', text),
        Frame::Integer(value) => header(out, b':', *value as i128),
        Frame::Bulk(bytes) => blob(out, b'$', bytes),
        Frame::Null | Frame::NullArray if resp3 => out.extend_from_slice(b"_\r\n"),
        Frame::Null => out.extend_from_slice(b"$-1\r\n"),
        Frame::NullArray => out.extend_from_slice(b"*-1\r\n"),
        Frame::Boolean(value) if resp3 => line(out, b'#', if *value { b"t" } else { b"f" }),
        Frame::Boolean(value) => header(out, b':', i128::from(*value)),
        Frame::Double(value) if resp3 => line(out, b',', double_text(*value).as_bytes()),
        Frame::Double(value) => blob(out, b'$', double_text(*value).as_bytes()),
        Frame::BigNumber(digits) if resp3 => line(out, b'(', digits),
        Frame::BigNumber(digits) => blob(out, b'$', digits),
        Frame::BulkError(text) if resp3 => blob(out, b'!', text),
        Frame::BulkError(text) => line(out, b'-', text),
        Frame::Verbatim { format, text } if resp3 => verbatim(out, format, text),
        Frame::Verbatim { text, .. } => blob(out, b'$', text),
        Frame::Array(items) => aggregate(out, b'*', items, stack),
        Frame::Set(items) => aggregate(out, if resp3 { b'~' } else { b'*' }, items, stack),
        Frame::Push(items) => aggregate(out, if resp3 { b'>' } else { b'*' }, items, stack),
        Frame::Map(pairs) => {
            let (type_byte, len) =
                if resp3 { (b'%', pairs.len()) } else { (b'*', pairs.len() * 2) };
            header(out, type_byte, len as i128);
            push_pairs(pairs, stack);
        }
        Frame::Attribute { attributes, frame } => {
            stack.push(frame);
            if resp3 {
                header(out, b'|', attributes.len() as i128);
                push_pairs(attributes, stack);
            }
        }
    }
}

/// Writes an aggregate header and queues its elements.
fn aggregate<'f>(out: &mut Vec<u8>, type_byte: u8, items: &'f [Frame], stack: &mut Vec<&'f Frame>) {
    header(out, type_byte, items.len() as i128);
    stack.extend(items.iter().rev());
}

/// Queues key-value pairs so that they are written key first, in order.
fn push_pairs<'f>(pairs: &'f [(Frame, Frame)], stack: &mut Vec<&'f Frame>) {
    for (key, value) in pairs.iter().rev() {
        stack.push(value);
        stack.push(key);
    }
}

/// Writes `type_byte`, a decimal number and CRLF.
fn header(out: &mut Vec<u8>, type_byte: u8, value: i128) {
    out.push(type_byte);
    out.extend_from_slice(value.to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// Writes a line, with any `\r` or `\n` in it replaced by a space.
fn line(out: &mut Vec<u8>, type_byte: u8, text: &[u8]) {
    out.push(type_byte);
    out.extend(text.iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(b"\r\n");
}

/// Writes a length-prefixed, binary-safe string.
fn blob(out: &mut Vec<u8>, type_byte: u8, bytes: &[u8]) {
    header(out, type_byte, bytes.len() as i128);
    out.extend_from_slice(bytes);
    out.extend_from_slice(b"\r\n");
}

/// Writes a RESP3 verbatim string: the length counts the format and its colon.
fn verbatim(out: &mut Vec<u8>, format: &[u8; 3], text: &[u8]) {
    header(out, b'=', (text.len() + 4) as i128);
    out.extend_from_slice(format);
    out.push(b':');
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

/// A double as RESP3 spells it: shortest round-tripping decimal, `inf`, `-inf`, `nan`.
pub(crate) fn double_text(value: f64) -> String {
    if value.is_nan() {
        "nan".to_string()
    } else if value.is_infinite() {
        if value > 0.0 { "inf" } else { "-inf" }.to_string()
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_never_carry_line_breaks() {
        let bytes = to_bytes(&Frame::error("ERR a\r\nb"), Protocol::Resp2);
        assert_eq!(bytes, b"-ERR a  b\r\n");
        assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
    }

    #[test]
    fn shared_bodies_spliced_back_give_the_same_bytes() {
        let big = Bytes::from(vec![b'x'; SHARED_BULK_BYTES_MIN]);
        let frame = Frame::Array(vec![
            Frame::Bulk(big.clone()),
            Frame::Bulk(Bytes::from_static(b"small")),
            Frame::Map(vec![(Frame::Bulk(big.clone()), Frame::Integer(7))]),
        ]);
        for protocol in [Protocol::Resp2, Protocol::Resp3] {
            let (mut out, mut shared) = (Vec::new(), Vec::new());
            encode_shared(&frame, protocol, &mut out, &mut shared);
            assert_eq!(shared.len(), 2, "only the large bodies are shared");
            assert!(out.len() < 100, "and not copied");
            let mut spliced = Vec::new();
            let mut at = 0;
            for (offset, bytes) in &shared {
                spliced.extend_from_slice(&out[at..*offset]);
                spliced.extend_from_slice(bytes);
                at = *offset;
            }
            spliced.extend_from_slice(&out[at..]);
            assert_eq!(spliced, to_bytes(&frame, protocol));
        }
    }

    #[test]
    fn doubles_spell_special_values() {
        assert_eq!(double_text(f64::INFINITY), "inf");
        assert_eq!(double_text(f64::NEG_INFINITY), "-inf");
        assert_eq!(double_text(f64::NAN), "nan");
        assert_eq!(double_text(1.5), "1.5");
    }
}
