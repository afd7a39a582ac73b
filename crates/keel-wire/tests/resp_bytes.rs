//! Black-box RESP tests: bytes in, frames out; frames in, exact bytes out, for both
//! protocol versions; every split point of the input gives the same result.

use keel_wire::resp::encode::to_bytes;
use keel_wire::{DecodeMode, Decoder, Frame, Protocol, ProtocolError, RespLimits};

fn decoder(mode: DecodeMode) -> Decoder {
    Decoder::new(mode, RespLimits::default())
}

/// Decodes `bytes` at once, then again fed at every split point (the prefix, then the
/// whole), and byte by byte; all three must agree. Returns the one-shot result.
fn decode_all_ways(
    mode: DecodeMode,
    bytes: &[u8],
) -> Result<Option<(Frame, usize)>, ProtocolError> {
    let whole = decoder(mode).decode(bytes);
    for cut in 0..bytes.len() {
        let mut split = decoder(mode);
        match split.decode(&bytes[..cut]) {
            Ok(None) => assert_eq!(split.decode(bytes), whole, "split at {cut}"),
            Ok(Some(early)) => {
                panic!("a frame {early:?} completed before its last byte (cut {cut})")
            }
            Err(err) => {
                assert!(whole.is_err(), "cut {cut} failed with {err} but the whole did not")
            }
        }
    }
    let mut trickle = decoder(mode);
    let mut last = Ok(None);
    for end in 1..=bytes.len() {
        last = trickle.decode(&bytes[..end]);
        if !matches!(last, Ok(None)) {
            assert_eq!(end, bytes.len(), "finished before the end");
        }
    }
    if !bytes.is_empty() && whole.is_ok() {
        assert_eq!(last, whole, "byte by byte");
    }
    whole
}

fn reply(bytes: &[u8]) -> Frame {
    let (frame, used) = decode_all_ways(DecodeMode::Reply, bytes).unwrap().expect("complete");
    assert_eq!(used, bytes.len(), "the whole input is one frame");
    frame
}

fn request(bytes: &[u8]) -> Frame {
    let (frame, used) = decode_all_ways(DecodeMode::Request, bytes).unwrap().expect("complete");
    assert_eq!(used, bytes.len(), "the whole input is one frame");
    frame
}

fn bulks(words: &[&str]) -> Frame {
    Frame::Array(words.iter().map(|w| Frame::bulk(w.as_bytes())).collect())
}

#[test]
fn resp2_types_decode() {
    assert_eq!(reply(b"+OK\r\n"), Frame::simple("OK"));
    assert_eq!(reply(b"-ERR bad\r\n"), Frame::error("ERR bad"));
    assert_eq!(reply(b":-42\r\n"), Frame::Integer(-42));
    assert_eq!(reply(b"$5\r\nh\r\nlo\r\n"), Frame::bulk("h\r\nlo"));
    assert_eq!(reply(b"$0\r\n\r\n"), Frame::bulk(""));
    assert_eq!(reply(b"$-1\r\n"), Frame::Null);
    assert_eq!(reply(b"*-1\r\n"), Frame::NullArray);
    assert_eq!(reply(b"*0\r\n"), Frame::Array(vec![]));
    let nested =
        Frame::Array(vec![Frame::Integer(1), Frame::Array(vec![Frame::bulk("a")]), Frame::Null]);
    assert_eq!(reply(b"*3\r\n:1\r\n*1\r\n$1\r\na\r\n$-1\r\n"), nested);
}

#[test]
fn resp3_types_decode() {
    assert_eq!(reply(b"_\r\n"), Frame::Null);
    assert_eq!(reply(b"#t\r\n"), Frame::Boolean(true));
    assert_eq!(reply(b"#f\r\n"), Frame::Boolean(false));
    assert_eq!(reply(b",1.25\r\n"), Frame::Double(1.25));
    assert_eq!(reply(b",-inf\r\n"), Frame::Double(f64::NEG_INFINITY));
    assert_eq!(reply(b",1e3\r\n"), Frame::Double(1000.0));
    let nan = decoder(DecodeMode::Reply).decode(b",nan\r\n").unwrap().unwrap().0;
    assert!(matches!(nan, Frame::Double(x) if x.is_nan()), "NaN is not equal to itself");
    assert_eq!(
        reply(b"(-123456789012345678901234567890\r\n"),
        Frame::BigNumber(b"-123456789012345678901234567890".to_vec())
    );
    assert_eq!(reply(b"!8\r\nERR a\r\nb\r\n"), Frame::BulkError(b"ERR a\r\nb".to_vec()));
    assert_eq!(
        reply(b"=8\r\ntxt:some\r\n"),
        Frame::Verbatim { format: *b"txt", text: b"some".to_vec() }
    );
    let map = Frame::Map(vec![
        (Frame::simple("a"), Frame::Integer(1)),
        (Frame::bulk("b"), Frame::Boolean(false)),
    ]);
    assert_eq!(reply(b"%2\r\n+a\r\n:1\r\n$1\r\nb\r\n#f\r\n"), map);
    assert_eq!(
        reply(b"~2\r\n:1\r\n:2\r\n"),
        Frame::Set(vec![Frame::Integer(1), Frame::Integer(2)])
    );
    assert_eq!(
        reply(b">2\r\n+message\r\n$2\r\nhi\r\n"),
        Frame::Push(vec![Frame::simple("message"), Frame::bulk("hi")])
    );
    assert_eq!(reply(b"%0\r\n"), Frame::Map(vec![]));
    let attribute = Frame::Attribute {
        attributes: vec![(Frame::simple("key-popularity"), Frame::Double(0.5))],
        frame: Box::new(Frame::Array(vec![Frame::Integer(2)])),
    };
    assert_eq!(reply(b"|1\r\n+key-popularity\r\n,0.5\r\n*1\r\n:2\r\n"), attribute);
}

#[test]
fn malformed_replies_are_typed_errors() {
    let cases: [(&[u8], ProtocolError); 10] = [
        (b"?x\r\n", ProtocolError::UnknownType { got: b'?' }),
        (b":12a\r\n", ProtocolError::InvalidLine { kind: "integer" }),
        (b":+1\r\n", ProtocolError::InvalidLine { kind: "integer" }),
        (b"#x\r\n", ProtocolError::InvalidLine { kind: "boolean" }),
        (b"_x\r\n", ProtocolError::InvalidLine { kind: "null" }),
        (b",\r\n", ProtocolError::InvalidLine { kind: "double" }),
        (b"(12-\r\n", ProtocolError::InvalidLine { kind: "big number" }),
        (b"$2\r\nabcd", ProtocolError::MissingCrlf),
        (b"$-2\r\n", ProtocolError::InvalidBulkLength),
        (b"=3\r\ntxt\r\n", ProtocolError::InvalidVerbatim),
    ];
    for (bytes, expected) in cases {
        assert_eq!(
            decoder(DecodeMode::Reply).decode(bytes),
            Err(expected),
            "{}",
            String::from_utf8_lossy(bytes)
        );
    }
    assert_eq!(
        decoder(DecodeMode::Reply).decode(b"*x\r\n"),
        Err(ProtocolError::InvalidAggregateLength)
    );
    assert_eq!(
        decoder(DecodeMode::Reply).decode(b"%-1\r\n"),
        Err(ProtocolError::InvalidAggregateLength)
    );
}

#[test]
fn requests_are_arrays_of_bulk_strings() {
    assert_eq!(request(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"), bulks(&["GET", "k"]));
    let err = decoder(DecodeMode::Request).decode(b"*2\r\n$3\r\nGET\r\n:1\r\n").unwrap_err();
    assert_eq!(err, ProtocolError::ExpectedBulk { got: b':' });
    assert_eq!(err.reply_frame(), Frame::error("ERR Protocol error: expected '$', got ':'"));
    let err = decoder(DecodeMode::Request).decode(b"*1\r\n$-1\r\n").unwrap_err();
    assert_eq!(err, ProtocolError::InvalidBulkLength, "no null bulk strings in requests");
}

#[test]
fn inline_commands_are_split_like_redis() {
    assert_eq!(request(b"PING\r\n"), bulks(&["PING"]));
    assert_eq!(request(b"SET k \"a b\\n\"\n"), bulks(&["SET", "k", "a b\n"]));
    assert_eq!(request(b"  get  'it\\'s'\r\n"), bulks(&["get", "it's"]));
    let err = decoder(DecodeMode::Request).decode(b"get 'a''b'\r\n").unwrap_err();
    assert_eq!(err, ProtocolError::UnbalancedQuotes);
    assert_eq!(err.reply_frame(), Frame::error("ERR Protocol error: unbalanced quotes in request"));
}

#[test]
fn empty_requests_are_skipped() {
    // As Redis's `processMultibulkBuffer`: a multibulk length of 0 or less (`*-5` too)
    // is an empty request, skipped without a reply.
    let bytes = b"\r\n\n*0\r\n*-1\r\n*-5\r\nPING\r\n";
    let (frame, used) = decode_all_ways(DecodeMode::Request, bytes).unwrap().unwrap();
    assert_eq!((frame, used), (bulks(&["PING"]), bytes.len()));
    assert_eq!(decoder(DecodeMode::Request).decode(b"\r\n   \r\n").unwrap(), None);
}

#[test]
fn before_authentication_requests_hold_ten_words_and_16_kib() {
    let mut decoder = Decoder::new(DecodeMode::Request, RespLimits::unauthenticated());
    let auth = b"*3\r\n$4\r\nAUTH\r\n$5\r\nadmin\r\n$6\r\nsecret\r\n";
    let (frame, _) = decoder.decode(auth).unwrap().unwrap();
    assert_eq!(frame, bulks(&["AUTH", "admin", "secret"]));
    let eleven = decoder.decode(b"*11\r\n").unwrap_err();
    assert_eq!(eleven, ProtocolError::AggregateTooLong { len: 11, max: 10 });
    // Refused at the header, before the bytes it announces are awaited.
    let large = decoder.decode(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$16385\r\n").unwrap_err();
    assert!(matches!(large, ProtocolError::BulkTooLong { len: 16385, .. }), "{large:?}");
    let long_line = vec![b'a'; 16 * 1024 + 10];
    assert!(decoder.decode(&long_line).is_err(), "an inline request is bounded too");
    // Authenticated: the full limits from the next frame on.
    decoder.set_limits(RespLimits::default());
    assert!(decoder.decode(b"*11\r\n").unwrap().is_none(), "waits for its elements");
}

#[test]
fn pipelined_frames_come_out_one_at_a_time() {
    let mut buf = b"*1\r\n$4\r\nPING\r\nECHO hi\r\n*1\r\n$4\r\nQUIT\r\n".to_vec();
    let mut decoder = decoder(DecodeMode::Request);
    let mut frames = Vec::new();
    while let Some((frame, used)) = decoder.decode(&buf).unwrap() {
        frames.push(frame);
        buf.drain(..used);
    }
    assert_eq!(frames, [bulks(&["PING"]), bulks(&["ECHO", "hi"]), bulks(&["QUIT"])]);
    assert!(buf.is_empty());
}

#[test]
fn a_terabyte_bulk_header_is_refused_without_allocating() {
    let header = b"$1099511627776\r\n";
    let err = decoder(DecodeMode::Reply).decode(header).unwrap_err();
    assert_eq!(err, ProtocolError::BulkTooLong { len: 1 << 40, max: 512 * 1024 * 1024 });
    let err = decoder(DecodeMode::Request).decode(b"*1\r\n$1099511627776\r\n").unwrap_err();
    assert!(matches!(err, ProtocolError::BulkTooLong { .. }));
    // With the limits lifted, the decoder waits for the bytes instead of reserving them:
    // were it to allocate 1 TiB up front, this test would abort.
    let unlimited =
        RespLimits { bulk_bytes_max: u64::MAX, frame_bytes_max: u64::MAX, ..RespLimits::default() };
    assert_eq!(Decoder::new(DecodeMode::Reply, unlimited.clone()).decode(header).unwrap(), None);
    let unlimited = RespLimits { aggregate_len_max: u32::MAX, ..unlimited };
    assert_eq!(
        Decoder::new(DecodeMode::Reply, unlimited).decode(b"*4294967295\r\n").unwrap(),
        None
    );
}

#[test]
fn every_limit_is_enforced() {
    let limits = RespLimits {
        bulk_bytes_max: 4,
        aggregate_len_max: 2,
        depth_max: 2,
        line_bytes_max: 8,
        frame_bytes_max: 20,
    };
    let decode = |mode, bytes: &[u8]| Decoder::new(mode, limits.clone()).decode(bytes);
    assert_eq!(
        decode(DecodeMode::Reply, b"$5\r\n"),
        Err(ProtocolError::BulkTooLong { len: 5, max: 4 })
    );
    assert_eq!(
        decode(DecodeMode::Reply, b"*3\r\n"),
        Err(ProtocolError::AggregateTooLong { len: 3, max: 2 })
    );
    assert_eq!(decode(DecodeMode::Reply, b"%2\r\n").unwrap(), None, "two pairs are two elements");
    assert_eq!(
        decode(DecodeMode::Reply, b"*1\r\n*1\r\n*1\r\n"),
        Err(ProtocolError::TooDeep { max: 2 })
    );
    assert_eq!(decode(DecodeMode::Reply, b"+1234567890"), Err(ProtocolError::LineTooLong));
    assert_eq!(
        decode(DecodeMode::Reply, b"+12345678\r\n").unwrap().unwrap().0,
        Frame::simple("12345678")
    );
    assert_eq!(decode(DecodeMode::Request, b"PING PING"), Err(ProtocolError::LineTooLong));
    assert_eq!(
        decode(DecodeMode::Request, b"a b c\r\n"),
        Err(ProtocolError::AggregateTooLong { len: 3, max: 2 })
    );
    let blank_lines = b"\r\n".repeat(11);
    assert_eq!(
        decode(DecodeMode::Request, &blank_lines),
        Err(ProtocolError::FrameTooLarge { max: 20 })
    );
    let long = b"*2\r\n$4\r\nabcd\r\n$4\r\nabcd\r\n";
    assert_eq!(decode(DecodeMode::Reply, long), Err(ProtocolError::FrameTooLarge { max: 20 }));
}

#[test]
fn server_limits_follow_the_value_limit() {
    let limits = keel_types::Limits { value_bytes_max: 1000, ..keel_types::Limits::default() };
    let resp = RespLimits::for_server(&limits);
    assert_eq!(resp.bulk_bytes_max, 1000 + keel_wire::resp::BULK_BYTES_SLACK);
    assert!(resp.frame_bytes_max >= resp.bulk_bytes_max);
}

fn both(frame: &Frame) -> (String, String) {
    let text = |p| String::from_utf8(to_bytes(frame, p)).unwrap();
    (text(Protocol::Resp2), text(Protocol::Resp3))
}

#[test]
fn replies_encode_per_protocol_version() {
    let same = |frame: Frame, bytes: &str| {
        assert_eq!(both(&frame), (bytes.to_string(), bytes.to_string()))
    };
    same(Frame::ok(), "+OK\r\n");
    same(Frame::error("ERR x"), "-ERR x\r\n");
    same(Frame::Integer(-7), ":-7\r\n");
    same(Frame::bulk("v"), "$1\r\nv\r\n");
    same(Frame::Array(vec![Frame::Integer(1)]), "*1\r\n:1\r\n");
    let differ = |frame: Frame, resp2: &str, resp3: &str| {
        assert_eq!(both(&frame), (resp2.to_string(), resp3.to_string()), "{frame:?}");
    };
    differ(Frame::Null, "$-1\r\n", "_\r\n");
    differ(Frame::NullArray, "*-1\r\n", "_\r\n");
    differ(Frame::Boolean(true), ":1\r\n", "#t\r\n");
    differ(Frame::Boolean(false), ":0\r\n", "#f\r\n");
    differ(Frame::Double(2.5), "$3\r\n2.5\r\n", ",2.5\r\n");
    differ(Frame::Double(f64::INFINITY), "$3\r\ninf\r\n", ",inf\r\n");
    differ(Frame::BigNumber(b"-99".to_vec()), "$3\r\n-99\r\n", "(-99\r\n");
    differ(Frame::BulkError(b"ERR a\nb".to_vec()), "-ERR a b\r\n", "!7\r\nERR a\nb\r\n");
    differ(
        Frame::Verbatim { format: *b"txt", text: b"hi".to_vec() },
        "$2\r\nhi\r\n",
        "=6\r\ntxt:hi\r\n",
    );
    differ(Frame::Set(vec![Frame::Integer(1)]), "*1\r\n:1\r\n", "~1\r\n:1\r\n");
    differ(Frame::Push(vec![Frame::bulk("m")]), "*1\r\n$1\r\nm\r\n", ">1\r\n$1\r\nm\r\n");
    let map =
        Frame::Map(vec![(Frame::bulk("k"), Frame::Integer(1)), (Frame::simple("s"), Frame::Null)]);
    differ(map, "*4\r\n$1\r\nk\r\n:1\r\n+s\r\n$-1\r\n", "%2\r\n$1\r\nk\r\n:1\r\n+s\r\n_\r\n");
    let attribute = Frame::Attribute {
        attributes: vec![(Frame::simple("a"), Frame::Boolean(true))],
        frame: Box::new(Frame::Integer(5)),
    };
    differ(attribute, ":5\r\n", "|1\r\n+a\r\n#t\r\n:5\r\n");
}
