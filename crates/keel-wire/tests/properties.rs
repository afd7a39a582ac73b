//! Property tests: RESP frames round-trip through both protocol versions, decode the same
//! at every split point, and no input, however malformed, makes a decoder panic.

use keel_types::Limits;
use keel_wire::command::{parse, parse_frame};
use keel_wire::peer::{decode_frame, PeerLimits};
use keel_wire::resp::encode::to_bytes;
use keel_wire::{DecodeMode, Decoder, Frame, Protocol, RespLimits};
use proptest::collection::vec;
use proptest::prelude::*;

fn line() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>().prop_filter("no line breaks", |b| *b != b'\r' && *b != b'\n'), 0..12)
}

fn blob() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..16)
}

fn leaf() -> impl Strategy<Value = Frame> {
    prop_oneof![
        line().prop_map(Frame::Simple),
        line().prop_map(Frame::Error),
        any::<i64>().prop_map(Frame::Integer),
        blob().prop_map(|b| Frame::Bulk(b.into())),
        Just(Frame::Null),
        any::<bool>().prop_map(Frame::Boolean),
        any::<f64>()
            .prop_filter("NaN is not equal to itself", |x| !x.is_nan())
            .prop_map(Frame::Double),
        "-?[0-9]{1,40}".prop_map(|digits| Frame::BigNumber(digits.into_bytes())),
        blob().prop_map(Frame::BulkError),
        (any::<[u8; 3]>(), blob()).prop_map(|(format, text)| Frame::Verbatim { format, text }),
    ]
}

/// Any RESP3 frame except `NullArray` (RESP3 spells every null `_`).
fn frame() -> impl Strategy<Value = Frame> {
    leaf().prop_recursive(3, 24, 4, |inner| {
        let pairs = vec((inner.clone(), inner.clone()), 0..3);
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Frame::Array),
            vec(inner.clone(), 0..4).prop_map(Frame::Set),
            vec(inner.clone(), 0..4).prop_map(Frame::Push),
            pairs.clone().prop_map(Frame::Map),
            (pairs, inner).prop_map(|(attributes, frame)| Frame::Attribute {
                attributes,
                frame: Box::new(frame)
            }),
        ]
    })
}

/// What a frame becomes when written as RESP2 and read back.
fn downgrade(frame: &Frame) -> Frame {
    let all = |items: &[Frame]| items.iter().map(downgrade).collect();
    match frame {
        Frame::Boolean(value) => Frame::Integer(i64::from(*value)),
        Frame::Double(value) => Frame::Bulk(format!("{value}").into_bytes().into()),
        Frame::BigNumber(digits) => Frame::Bulk(digits.clone().into()),
        Frame::BulkError(text) => Frame::Error(
            text.iter().map(|&b| if b == b'\r' || b == b'\n' { b' ' } else { b }).collect(),
        ),
        Frame::Verbatim { text, .. } => Frame::Bulk(text.clone().into()),
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => Frame::Array(all(items)),
        Frame::Map(pairs) => {
            Frame::Array(pairs.iter().flat_map(|(k, v)| [downgrade(k), downgrade(v)]).collect())
        }
        Frame::Attribute { frame, .. } => downgrade(frame),
        other => other.clone(),
    }
}

fn decode_reply(bytes: &[u8]) -> Frame {
    let (frame, used) = Decoder::new(DecodeMode::Reply, RespLimits::default())
        .decode(bytes)
        .expect("an encoded frame decodes")
        .expect("an encoded frame is complete");
    assert_eq!(used, bytes.len());
    frame
}

proptest! {
    #[test]
    fn resp3_round_trips(frame in frame()) {
        prop_assert_eq!(decode_reply(&to_bytes(&frame, Protocol::Resp3)), frame);
    }

    #[test]
    fn resp2_round_trips_to_the_downgrade(frame in frame()) {
        prop_assert_eq!(decode_reply(&to_bytes(&frame, Protocol::Resp2)), downgrade(&frame));
    }

    #[test]
    fn any_split_point_decodes_the_same(frame in frame(), cut in any::<prop::sample::Index>()) {
        let bytes = to_bytes(&frame, Protocol::Resp3);
        let cut = cut.index(bytes.len());
        let mut decoder = Decoder::new(DecodeMode::Reply, RespLimits::default());
        prop_assert_eq!(decoder.decode(&bytes[..cut]).unwrap(), None);
        prop_assert_eq!(decoder.decode(&bytes).unwrap(), Some((frame, bytes.len())));
    }

    #[test]
    fn requests_decode_and_parse_at_any_split(words in vec(blob(), 1..5), cut in any::<prop::sample::Index>()) {
        let frame = Frame::Array(words.iter().cloned().map(|w| Frame::Bulk(w.into())).collect());
        let bytes = to_bytes(&frame, Protocol::Resp2);
        let cut = cut.index(bytes.len());
        let mut decoder = Decoder::new(DecodeMode::Request, RespLimits::default());
        prop_assert_eq!(decoder.decode(&bytes[..cut]).unwrap(), None);
        let (decoded, used) = decoder.decode(&bytes).unwrap().unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(&decoded, &frame);
        let _ = parse_frame(decoded, &Limits::default());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..64)) {
        let small = RespLimits { bulk_bytes_max: 8, aggregate_len_max: 3, depth_max: 2, line_bytes_max: 6, frame_bytes_max: 40 };
        for limits in [RespLimits::default(), small] {
            for mode in [DecodeMode::Request, DecodeMode::Reply] {
                if let Ok(Some((_, used))) = Decoder::new(mode, limits.clone()).decode(&bytes) {
                    prop_assert!(used <= bytes.len() && used > 0);
                }
            }
        }
    }

    #[test]
    fn mutated_frames_never_panic(frame in frame(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = to_bytes(&frame, Protocol::Resp3);
        let at = at.index(bytes.len());
        bytes[at] = byte;
        let _ = Decoder::new(DecodeMode::Reply, RespLimits::default()).decode(&bytes);
        let _ = Decoder::new(DecodeMode::Request, RespLimits::default()).decode(&bytes);
    }

    #[test]
    fn arbitrary_words_never_panic_the_parser(
        name in prop::sample::select(vec!["GET", "SET", "DEL", "EXISTS", "INCR", "INCRBY", "DECRBY", "MGET",
            "KEEL.CAS", "KEEL.SCAN", "HELLO", "CLIENT", "COMMAND", "CONFIG", "SELECT", "PING", "INFO", "X"]),
        args in vec(prop_oneof![blob(), prop::sample::select(vec!["LEVEL", "DURABILITY", "any", "durable",
            "WITHVERSION", "COUNT", "-nil", "+inf", "AUTH", "SETNAME", "3", "-1", "EX"]).prop_map(|s| s.as_bytes().to_vec())], 0..6),
    ) {
        let mut words = vec![name.as_bytes().to_vec()];
        words.extend(args);
        if let Err(err) = parse(words.into_iter().map(Into::into).collect(), &Limits::default()) {
            let line = to_bytes(&err.reply_frame(), Protocol::Resp2);
            prop_assert!(line.starts_with(b"-") && line.ends_with(b"\r\n"));
            prop_assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        }
    }

    #[test]
    fn arbitrary_peer_bytes_never_panic(body in vec(any::<u8>(), 0..96), checksum_ok in any::<bool>()) {
        // With a correct checksum the body reaches the message decoders.
        let crc = if checksum_ok { crc32c::crc32c(&body) } else { 0 };
        let bytes = [&(body.len() as u32).to_le_bytes()[..], &crc.to_le_bytes(), &body].concat();
        if let Ok(Some((_, used))) = decode_frame(&bytes, &PeerLimits::default()) {
            prop_assert_eq!(used, bytes.len());
        }
        let _ = decode_frame(&body, &PeerLimits::default());
    }
}
