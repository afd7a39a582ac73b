//! The streaming RESP decoder.
//!
//! A [`Decoder`] reads one frame at a time from the front of a connection's read buffer.
//! It keeps the aggregates still open on an explicit stack (never recursion), so a frame
//! that arrives in pieces is read once, not re-read on every call.
//!
//! Contract with the caller: pass the buffer holding the bytes received so far. Between a
//! call that returns `Ok(None)` (need more bytes) and the next, only append to the buffer.
//! After `Ok(Some((frame, consumed)))`, drop the first `consumed` bytes before the next
//! call. After an error the connection is out of step: reply and close it.
//!
//! Every limit in [`RespLimits`] is checked on the header, before anything is allocated
//! for the element it announces; a bulk string is copied only once all its bytes are in.

use super::{inline, Frame, ProtocolError, RespLimits, AGGREGATE_PREALLOCATE_MAX};
use crate::num::parse_i64;

/// What the decoder expects to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeMode {
    /// A server reading requests: an array of bulk strings (`*2\r\n$3\r\nGET\r\n...`) or
    /// an inline command line. Empty requests (blank lines, `*0`) are skipped, as Redis does.
    Request,
    /// A client reading replies: any RESP2 or RESP3 frame.
    Reply,
}

/// The kinds of aggregate that stay open until their elements arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AggregateKind {
    Array,
    Set,
    Push,
    Map,
    Attribute,
}

/// An aggregate whose elements are still arriving.
#[derive(Debug)]
struct Open {
    kind: AggregateKind,
    /// Elements it needs in all (for a map, twice its pairs; an attribute, one more).
    wanted: u64,
    items: Vec<Frame>,
}

/// One element read from the buffer.
enum Element {
    /// A complete frame.
    Done(Frame),
    /// The header of an aggregate with `wanted` elements to follow.
    Open(AggregateKind, u64),
    /// Nothing (an empty request), to be skipped.
    Skip,
}

/// A streaming decoder for one connection. See the module docs for the buffer contract.
#[derive(Debug)]
pub struct Decoder {
    limits: RespLimits,
    mode: DecodeMode,
    /// The next byte to read.
    pos: usize,
    /// Aggregates still open, outermost first; never deeper than `limits.depth_max`.
    stack: Vec<Open>,
}

impl Decoder {
    /// A decoder for a fresh connection.
    pub fn new(mode: DecodeMode, limits: RespLimits) -> Decoder {
        assert!(limits.depth_max >= 1, "depth_max must allow a request");
        assert!(limits.line_bytes_max >= 1, "line_bytes_max must allow a header");
        Decoder { limits, mode, pos: 0, stack: Vec::new() }
    }

    /// The limits in force.
    pub fn limits(&self) -> &RespLimits {
        &self.limits
    }

    /// Changes the limits for the frames after the last one returned (a connection that
    /// authenticated moves from [`RespLimits::unauthenticated`] to its full limits).
    /// Only between frames: after a frame was returned or an error, never while one is
    /// half read.
    pub fn set_limits(&mut self, limits: RespLimits) {
        assert!(self.pos == 0 && self.stack.is_empty(), "limits change between frames only");
        assert!(limits.depth_max >= 1 && limits.line_bytes_max >= 1);
        self.limits = limits;
    }

    /// Reads the next frame from `buf`: `Ok(None)` when more bytes are needed,
    /// `Ok(Some((frame, consumed)))` when a frame is complete.
    pub fn decode(&mut self, buf: &[u8]) -> Result<Option<(Frame, usize)>, ProtocolError> {
        assert!(buf.len() >= self.pos, "the buffer lost bytes the decoder had read");
        let result = self.decode_inner(buf);
        if !matches!(result, Ok(None)) {
            self.pos = 0;
            self.stack.clear();
        }
        if let Ok(Some((_, consumed))) = &result {
            assert!(*consumed > 0 && *consumed <= buf.len());
        }
        result
    }

    fn decode_inner(&mut self, buf: &[u8]) -> Result<Option<(Frame, usize)>, ProtocolError> {
        // Each pass consumes at least one byte, so the loop is bounded by `buf.len()`.
        loop {
            let Some((element, next)) = self.element(buf)? else {
                return Ok(None);
            };
            assert!(next > self.pos, "every element consumes bytes");
            self.pos = next;
            let frame = match element {
                Element::Skip => {
                    debug_assert!(self.stack.is_empty());
                    continue;
                }
                Element::Open(kind, wanted) => match self.open(kind, wanted) {
                    Some(empty) => empty,
                    None => continue,
                },
                Element::Done(frame) => frame,
            };
            if let Some(complete) = self.attach(frame) {
                return Ok(Some((complete, self.pos)));
            }
        }
    }

    /// Pushes an aggregate, or returns it at once when it has no elements.
    fn open(&mut self, kind: AggregateKind, wanted: u64) -> Option<Frame> {
        if wanted == 0 {
            return Some(finish(kind, Vec::new()));
        }
        let capacity = wanted.min(u64::from(AGGREGATE_PREALLOCATE_MAX)) as usize;
        self.stack.push(Open { kind, wanted, items: Vec::with_capacity(capacity) });
        debug_assert!(self.stack.len() <= self.limits.depth_max as usize);
        None
    }

    /// Adds a finished frame to the innermost open aggregate, closing every aggregate it
    /// completes; returns the whole frame once the outermost one closes.
    fn attach(&mut self, mut frame: Frame) -> Option<Frame> {
        // Bounded by the stack depth: each pass pops one aggregate or returns.
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Some(frame);
            };
            top.items.push(frame);
            assert!(top.items.len() as u64 <= top.wanted, "an aggregate took too many elements");
            if (top.items.len() as u64) < top.wanted {
                return None;
            }
            let done = self.stack.pop().expect("the top exists");
            frame = finish(done.kind, done.items);
        }
    }

    /// Reads one element at `self.pos`: `None` if its bytes are not all in yet.
    fn element(&self, buf: &[u8]) -> Result<Option<(Element, usize)>, ProtocolError> {
        let Some(&type_byte) = buf.get(self.pos) else {
            return Ok(None);
        };
        let top_level = self.stack.is_empty();
        if self.mode == DecodeMode::Request {
            if top_level && type_byte != b'*' {
                return self.inline(buf);
            }
            if !top_level && type_byte != b'$' {
                return Err(ProtocolError::ExpectedBulk { got: type_byte });
            }
        }
        let Some((line, after)) = self.line(buf, self.pos + 1)? else {
            return Ok(None);
        };
        let element = match type_byte {
            b'*' | b'~' | b'>' | b'%' | b'|' => self.aggregate(type_byte, line)?,
            b'$' | b'!' | b'=' => return self.blob(buf, type_byte, line, after),
            _ => Element::Done(simple(type_byte, line)?),
        };
        Ok(Some((element, after)))
    }

    /// Finds the line starting at `from`: its bytes and the index after its `\r\n`.
    fn line<'b>(
        &self,
        buf: &'b [u8],
        from: usize,
    ) -> Result<Option<(&'b [u8], usize)>, ProtocolError> {
        let window_end = buf.len().min(from + self.limits.line_bytes_max as usize + 2);
        let window = buf.get(from..window_end).unwrap_or_default();
        match window.windows(2).position(|pair| pair == b"\r\n") {
            Some(len) => {
                debug_assert!(len <= self.limits.line_bytes_max as usize);
                let after = from + len + 2;
                self.check_span(after as u64)?;
                Ok(Some((&buf[from..from + len], after)))
            }
            None if window_end == from + self.limits.line_bytes_max as usize + 2 => {
                Err(ProtocolError::LineTooLong)
            }
            None => Ok(None),
        }
    }

    /// Refuses a frame that would end `end` bytes into the buffer if that is beyond the
    /// frame limit. Skipped empty requests before the frame count too: the caller holds
    /// them until the frame completes, so they must be bounded as well.
    fn check_span(&self, end: u64) -> Result<(), ProtocolError> {
        if end > self.limits.frame_bytes_max {
            return Err(ProtocolError::FrameTooLarge { max: self.limits.frame_bytes_max });
        }
        Ok(())
    }

    /// Reads an aggregate header; the length is checked against the limits first.
    fn aggregate(&self, type_byte: u8, line: &[u8]) -> Result<Element, ProtocolError> {
        let len = parse_i64(line).ok_or(ProtocolError::InvalidAggregateLength)?;
        let top_level = self.stack.is_empty();
        if type_byte == b'*' && len == -1 && self.mode == DecodeMode::Reply {
            return Ok(Element::Done(Frame::NullArray));
        }
        if self.mode == DecodeMode::Request && top_level && len <= 0 {
            return Ok(Element::Skip);
        }
        let len = u64::try_from(len).map_err(|_| ProtocolError::InvalidAggregateLength)?;
        let max = self.limits.aggregate_len_max;
        if len > u64::from(max) {
            return Err(ProtocolError::AggregateTooLong { len, max });
        }
        if self.stack.len() as u64 >= u64::from(self.limits.depth_max) {
            return Err(ProtocolError::TooDeep { max: self.limits.depth_max });
        }
        let (kind, wanted) = match type_byte {
            b'*' => (AggregateKind::Array, len),
            b'~' => (AggregateKind::Set, len),
            b'>' => (AggregateKind::Push, len),
            b'%' => (AggregateKind::Map, len * 2),
            b'|' => (AggregateKind::Attribute, len * 2 + 1),
            _ => unreachable!("called only for aggregate type bytes"),
        };
        debug_assert!(wanted >= len && wanted <= len * 2 + 1);
        Ok(Element::Open(kind, wanted))
    }

    /// Reads a length-prefixed element (bulk string, bulk error, verbatim string); the
    /// length is checked against the limits before its bytes are awaited or copied.
    fn blob(
        &self,
        buf: &[u8],
        type_byte: u8,
        line: &[u8],
        after: usize,
    ) -> Result<Option<(Element, usize)>, ProtocolError> {
        let len = parse_i64(line).ok_or(ProtocolError::InvalidBulkLength)?;
        if type_byte == b'$' && len == -1 && self.mode == DecodeMode::Reply {
            return Ok(Some((Element::Done(Frame::Null), after)));
        }
        let len = u64::try_from(len).map_err(|_| ProtocolError::InvalidBulkLength)?;
        if len > self.limits.bulk_bytes_max {
            return Err(ProtocolError::BulkTooLong { len, max: self.limits.bulk_bytes_max });
        }
        let end = (after as u64).saturating_add(len).saturating_add(2);
        self.check_span(end)?;
        if (buf.len() as u64) < end {
            return Ok(None);
        }
        // `end <= buf.len()`, so these fit in usize.
        let (data_end, end) = (after + len as usize, end as usize);
        if &buf[data_end..end] != b"\r\n" {
            return Err(ProtocolError::MissingCrlf);
        }
        let data = &buf[after..data_end];
        debug_assert_eq!(data.len() as u64, len, "exactly what the header announced");
        // Copied once, exactly sized: a value kept in the log or the state machine never
        // holds a read buffer alive.
        let frame = match type_byte {
            b'$' => Frame::Bulk(bytes::Bytes::copy_from_slice(data)),
            b'!' => Frame::BulkError(data.to_vec()),
            _ => verbatim(data.to_vec())?,
        };
        Ok(Some((Element::Done(frame), end)))
    }

    /// Reads an inline command line (request mode, top level).
    fn inline(&self, buf: &[u8]) -> Result<Option<(Element, usize)>, ProtocolError> {
        let from = self.pos;
        let max = self.limits.line_bytes_max as usize;
        let window_end = buf.len().min(from + max + 1);
        let Some(len) = buf[from..window_end].iter().position(|&b| b == b'\n') else {
            if window_end == from + max + 1 {
                return Err(ProtocolError::LineTooLong);
            }
            return Ok(None);
        };
        let after = from + len + 1;
        debug_assert!(after <= buf.len() && len <= max);
        self.check_span(after as u64)?;
        let words = inline::split(&buf[from..from + len])?;
        if words.len() as u64 > u64::from(self.limits.aggregate_len_max) {
            let max = self.limits.aggregate_len_max;
            return Err(ProtocolError::AggregateTooLong { len: words.len() as u64, max });
        }
        if words.is_empty() {
            return Ok(Some((Element::Skip, after)));
        }
        let frame = Frame::Array(words.into_iter().map(|w| Frame::Bulk(w.into())).collect());
        Ok(Some((Element::Done(frame), after)))
    }
}

/// Builds a closed aggregate from its elements.
fn finish(kind: AggregateKind, items: Vec<Frame>) -> Frame {
    match kind {
        AggregateKind::Array => Frame::Array(items),
        AggregateKind::Set => Frame::Set(items),
        AggregateKind::Push => Frame::Push(items),
        AggregateKind::Map => Frame::Map(pairs(items)),
        AggregateKind::Attribute => {
            let mut items = items;
            let frame = items.pop().expect("an attribute is followed by its frame");
            Frame::Attribute { attributes: pairs(items), frame: Box::new(frame) }
        }
    }
}

/// Groups an even number of frames into key-value pairs.
fn pairs(items: Vec<Frame>) -> Vec<(Frame, Frame)> {
    assert_eq!(items.len() % 2, 0, "pairs come from an even number of frames");
    let mut result = Vec::with_capacity(items.len() / 2);
    let mut iter = items.into_iter();
    while let (Some(key), Some(value)) = (iter.next(), iter.next()) {
        result.push((key, value));
    }
    result
}

/// Decodes a one-line element from its type byte and line.
fn simple(type_byte: u8, line: &[u8]) -> Result<Frame, ProtocolError> {
    let invalid = |kind| ProtocolError::InvalidLine { kind };
    let frame = match type_byte {
        b'+' => Frame::Simple(line.to_vec()),
        b'-' => Frame::Error(line.to_vec()),
        b':' => Frame::Integer(parse_i64(line).ok_or(invalid("integer"))?),
        b'_' if line.is_empty() => Frame::Null,
        b'_' => return Err(invalid("null")),
        b'#' => match line {
            b"t" => Frame::Boolean(true),
            b"f" => Frame::Boolean(false),
            _ => return Err(invalid("boolean")),
        },
        b',' => Frame::Double(parse_double(line).ok_or(invalid("double"))?),
        b'(' if is_big_number(line) => Frame::BigNumber(line.to_vec()),
        b'(' => return Err(invalid("big number")),
        got => return Err(ProtocolError::UnknownType { got }),
    };
    Ok(frame)
}

/// Parses a RESP3 double: decimal or exponent notation, `inf`, `-inf`, `nan`.
fn parse_double(line: &[u8]) -> Option<f64> {
    let text = std::str::from_utf8(line).ok()?;
    if text.is_empty() || text.starts_with(char::is_whitespace) {
        return None;
    }
    text.parse::<f64>().ok()
}

/// Whether a line is a big number: an optional `-`, then at least one digit.
pub(super) fn is_big_number(line: &[u8]) -> bool {
    let digits = line.strip_prefix(b"-").unwrap_or(line);
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

/// Splits a verbatim string's payload into its format and text.
fn verbatim(data: Vec<u8>) -> Result<Frame, ProtocolError> {
    if data.len() < 4 || data[3] != b':' {
        return Err(ProtocolError::InvalidVerbatim);
    }
    let format = [data[0], data[1], data[2]];
    Ok(Frame::Verbatim { format, text: data[4..].to_vec() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(bytes: &[u8]) -> Result<Option<(Frame, usize)>, ProtocolError> {
        Decoder::new(DecodeMode::Reply, RespLimits::default()).decode(bytes)
    }

    #[test]
    fn attribute_takes_the_frame_after_its_pairs() {
        let bytes = b"|1\r\n+ttl\r\n:3\r\n$1\r\nv\r\n";
        let (frame, used) = reply(bytes).unwrap().unwrap();
        let expected = Frame::Attribute {
            attributes: vec![(Frame::simple("ttl"), Frame::Integer(3))],
            frame: Box::new(Frame::bulk("v")),
        };
        assert_eq!(frame, expected);
        assert_eq!(used, bytes.len());
    }

    #[test]
    fn decoder_resumes_where_it_stopped() {
        let bytes = b"*2\r\n$3\r\nfoo\r\n:7\r\n";
        let mut decoder = Decoder::new(DecodeMode::Reply, RespLimits::default());
        assert_eq!(decoder.decode(&bytes[..12]).unwrap(), None);
        assert_eq!(decoder.stack.len(), 1, "the open array is kept, not re-read");
        let (frame, used) = decoder.decode(bytes).unwrap().unwrap();
        assert_eq!(frame, Frame::Array(vec![Frame::bulk("foo"), Frame::Integer(7)]));
        assert_eq!(used, bytes.len());
        assert!(decoder.stack.is_empty());
    }

    #[test]
    fn big_numbers_need_digits() {
        assert!(is_big_number(b"-123"));
        assert!(!is_big_number(b"-"));
        assert!(!is_big_number(b"12a"));
    }
}
