//! Black-box command tests: request bytes in, a typed command or the exact error line out.

use bytes::Bytes;
use keel_types::{Durability, ExpireCond, KeelError, Limits, ReadLevel, SetCond, Ttl};
use keel_wire::command::{
    parse_frame, ClientSubcommand, CommandQuery, OpMode, SetOptions, TtlForm,
};
use keel_wire::resp::encode::to_bytes;
use keel_wire::{ClientCommand, DecodeMode, Decoder, Protocol, RespLimits};

/// Decodes one request (RESP or inline) and parses it.
fn parse_bytes(bytes: &[u8]) -> Result<ClientCommand, String> {
    let mut decoder = Decoder::new(DecodeMode::Request, RespLimits::default());
    let (frame, used) = decoder.decode(bytes).expect("well-formed").expect("complete");
    assert_eq!(used, bytes.len());
    parse_frame(frame, &Limits::default()).map_err(|err| {
        // The error line as the client sees it, for both protocol versions.
        let line = to_bytes(&err.reply_frame(), Protocol::Resp2);
        assert_eq!(line, to_bytes(&err.reply_frame(), Protocol::Resp3));
        String::from_utf8(line).unwrap()
    })
}

/// Parses an inline request line.
fn parse(line: &str) -> Result<ClientCommand, String> {
    parse_bytes(format!("{line}\r\n").as_bytes())
}

fn error(line: &str) -> String {
    parse(line).expect_err("refused")
}

#[test]
fn get_and_set_take_keel_options() {
    let bytes =
        b"*5\r\n$3\r\nGET\r\n$1\r\nk\r\n$5\r\nLEVEL\r\n$9\r\nmonotonic\r\n$11\r\nWITHVERSION\r\n";
    let expected = ClientCommand::Get {
        key: b"k".to_vec().into(),
        level: Some(ReadLevel::Monotonic),
        with_version: true,
        mode: OpMode::Plain,
    };
    assert_eq!(parse_bytes(bytes), Ok(expected));
    assert_eq!(
        parse("get k"),
        Ok(ClientCommand::Get {
            key: b"k".to_vec().into(),
            level: None,
            with_version: false,
            mode: OpMode::Plain
        })
    );
    let set = ClientCommand::Set {
        key: b"k".to_vec().into(),
        value: b"v w".to_vec().into(),
        durability: Some(Durability::Durable),
        with_version: false,
        mode: OpMode::Plain,
        options: SetOptions::PLAIN,
    };
    assert_eq!(parse("SeT k \"v w\" durability DURABLE"), Ok(set));
}

#[test]
fn kite_barriers_and_strengths_are_option_words_and_faa_fetches() {
    let key: Bytes = b"k".to_vec().into();
    let get = parse("GET k acquire").unwrap();
    assert_eq!(
        get,
        ClientCommand::Get {
            key: key.clone(),
            level: None,
            with_version: false,
            mode: OpMode::Acquire
        }
    );
    let set = parse("set k v RELEASE").unwrap();
    assert_eq!(set.mode(), OpMode::Release);
    assert_eq!(parse("KEEL.CAS k -nil n WEAK").unwrap().mode(), OpMode::Weak);
    assert_eq!(parse("KEEL.CAS k -nil n strong DURABILITY memory").unwrap().mode(), OpMode::Strong);
    assert_eq!(
        parse("keel.faa k -3"),
        Ok(ClientCommand::Incr { key: key.clone(), delta: -3, fetch: true })
    );
    assert_eq!(parse("keel.faa k -3").unwrap().name(), "keel.faa");
    for twice in ["GET k ACQUIRE ACQUIRE", "SET k v RELEASE RELEASE", "KEEL.CAS k a b WEAK STRONG"]
    {
        assert_eq!(error(twice), "-ERR syntax error\r\n", "{twice}");
    }
    assert!(error("KEEL.FAA k").contains("wrong number of arguments"));
    assert!(error("KEEL.FAA k x").contains("not an integer"));
    assert_eq!(error("GET k RELEASE"), "-ERR syntax error\r\n");
}

/// The Redis options of `SET` (and the short forms) parse into the engine's `SET`.
#[test]
fn redis_set_options_parse_and_their_errors_are_worded_as_redis() {
    let options = |text: &str| match parse(text) {
        Ok(ClientCommand::Set { options, .. }) => options,
        other => panic!("{text}: {other:?}"),
    };
    let set = |cond, ttl, get| SetOptions { cond, ttl, get, integer_reply: false };
    assert_eq!(options("SET k v"), SetOptions::PLAIN);
    assert_eq!(options("SET k v EX 10 nx"), set(SetCond::IfAbsent, Ttl::After(10_000), false));
    assert_eq!(options("SET k v px 5 XX GET"), set(SetCond::IfPresent, Ttl::After(5), true));
    assert_eq!(options("SET k v EXAT 7"), set(SetCond::Always, Ttl::At(7_000), false));
    assert_eq!(options("SET k v KEEPTTL"), set(SetCond::Always, Ttl::Keep, false));
    assert_eq!(options("SETEX k 3 v"), set(SetCond::Always, Ttl::After(3_000), false));
    assert_eq!(options("PSETEX k 3 v"), set(SetCond::Always, Ttl::After(3), false));
    assert_eq!(options("GETSET k v"), set(SetCond::Always, Ttl::Clear, true));
    assert!(options("SETNX k v").integer_reply);
    assert_eq!(error("SET k v EX 0"), "-ERR invalid expire time in 'set' command\r\n");
    assert_eq!(error("SET k v PX -1"), "-ERR invalid expire time in 'set' command\r\n");
    let big = "SET k v EX 10000000000000000";
    assert_eq!(error(big), "-ERR invalid expire time in 'set' command\r\n");
    assert_eq!(error("SETEX k 0 v"), "-ERR invalid expire time in 'setex' command\r\n");
    for twice in ["SET k v NX XX", "SET k v EX 1 PX 1", "SET k v EX 1 KEEPTTL", "SET k v BOGUS"] {
        assert_eq!(error(twice), "-ERR syntax error\r\n", "{twice}");
    }
}

/// `EXPIRE` and its kin: units, conditions, `PERSIST`, and Redis's errors.
#[test]
fn expire_and_ttl_commands_parse_with_their_conditions() {
    let expire = |text: &str| match parse(text) {
        Ok(ClientCommand::Expire { ttl, cond, .. }) => (ttl, cond),
        other => panic!("{text}: {other:?}"),
    };
    assert_eq!(expire("EXPIRE k 2"), (Ttl::After(2_000), ExpireCond::Always));
    assert_eq!(expire("pexpire k 2 nx"), (Ttl::After(2), ExpireCond::IfNone));
    assert_eq!(expire("EXPIREAT k 2 XX"), (Ttl::At(2_000), ExpireCond::IfSome));
    assert_eq!(expire("PEXPIREAT k 2 gt"), (Ttl::At(2), ExpireCond::IfLater));
    assert_eq!(expire("EXPIRE k 2 XX LT"), (Ttl::After(2_000), ExpireCond::IfSomeEarlier));
    assert_eq!(expire("EXPIRE k -5"), (Ttl::At(0), ExpireCond::Always), "past: deletes");
    assert_eq!(expire("PERSIST k"), (Ttl::Clear, ExpireCond::IfSome));
    let nx = "-ERR NX and XX, GT or LT options at the same time are not compatible\r\n";
    assert_eq!(error("EXPIRE k 1 NX XX"), nx);
    assert_eq!(error("EXPIRE k 1 NX GT"), nx);
    let gt = "-ERR GT and LT options at the same time are not compatible\r\n";
    assert_eq!(error("EXPIRE k 1 GT LT"), gt);
    assert_eq!(error("EXPIRE k 1 FOO"), "-ERR Unsupported option FOO\r\n");
    let overflow = "EXPIRE k 9223370399119966";
    assert_eq!(error(overflow), "-ERR invalid expire time in 'expire' command\r\n");
    assert!(error("EXPIRE k x").contains("not an integer"));
    match parse("PTTL k LEVEL any") {
        Ok(ClientCommand::Ttl { form: TtlForm::Millis, level: Some(ReadLevel::Any), .. }) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(TtlForm::Seconds.answer(false, None, 0), -2);
    assert_eq!(TtlForm::Seconds.answer(true, None, 0), -1);
    assert_eq!(TtlForm::Seconds.answer(true, Some(10_400), 0), 10);
    assert_eq!(TtlForm::Seconds.answer(true, Some(10_600), 0), 11);
    assert_eq!(TtlForm::Millis.answer(true, Some(10), 20), 0, "past, not yet expired");
    assert_eq!(TtlForm::UnixSeconds.answer(true, Some(10_600), 0), 10);
}

#[test]
fn arity_errors_are_worded_as_redis() {
    assert_eq!(error("GET"), "-ERR wrong number of arguments for 'get' command\r\n");
    assert_eq!(error("set k"), "-ERR wrong number of arguments for 'set' command\r\n");
    assert_eq!(error("incr a b"), "-ERR wrong number of arguments for 'incr' command\r\n");
    assert_eq!(error("DEL"), "-ERR wrong number of arguments for 'del' command\r\n");
    assert_eq!(
        error("client setname"),
        "-ERR wrong number of arguments for 'client|setname' command\r\n"
    );
    assert_eq!(error("KEEL.CAS k v"), "-ERR wrong number of arguments for 'keel.cas' command\r\n");
}

#[test]
fn unknown_commands_echo_their_first_arguments() {
    assert_eq!(error("FOO"), "-ERR unknown command 'FOO', with args beginning with: \r\n");
    assert_eq!(
        error("foo a b"),
        "-ERR unknown command 'foo', with args beginning with: 'a' 'b' \r\n"
    );
    let long = "x".repeat(300);
    let line = error(&format!("{long} {long}"));
    let cut = "x".repeat(128);
    assert_eq!(
        line,
        format!("-ERR unknown command '{cut}', with args beginning with: '{cut}' \r\n")
    );
}

#[test]
fn unknown_commands_with_invalid_utf8_arguments_echo_a_bounded_text() {
    // Found by the `resp_request` fuzz target: each invalid byte shows as a 3-byte U+FFFD,
    // which once let the echoed arguments grow to three times their bound.
    let args = vec![Bytes::from(vec![0xff; 400]), Bytes::from(vec![0xff; 400])];
    let mut words = vec![Bytes::from_static(b"]\r")];
    words.extend(args);
    let err = keel_wire::command::parse(words, &Limits::default()).unwrap_err();
    let keel_wire::CommandError::UnknownCommand { args, .. } = err else { panic!("{err:?}") };
    assert!(args.len() <= 128 + 3 + 3, "{} bytes echoed", args.len());
    assert!(args.starts_with("'\u{fffd}"));
}

#[test]
fn levels_and_durabilities_must_be_known() {
    assert_eq!(
        error("GET k LEVEL x"),
        "-ERR unknown read level 'x' (expected one of: any, monotonic, linearizable)\r\n"
    );
    assert_eq!(
        error("SET k v DURABILITY fsync"),
        "-ERR unknown durability 'fsync' (expected one of: memory, replicated, durable)\r\n"
    );
    assert_eq!(error("GET k LEVEL"), "-ERR syntax error\r\n");
}

#[test]
fn counters_accept_strict_integers() {
    let incr = |delta| Ok(ClientCommand::Incr { key: b"c".to_vec().into(), delta, fetch: false });
    assert_eq!(parse("INCR c"), incr(1));
    assert_eq!(parse("decr c"), incr(-1));
    assert_eq!(parse("INCRBY c -5"), incr(-5));
    assert_eq!(parse("DECRBY c 9223372036854775807"), incr(-i64::MAX));
    assert_eq!(error("INCRBY c 1.5"), "-ERR value is not an integer or out of range\r\n");
    assert_eq!(error("INCRBY c 01"), "-ERR value is not an integer or out of range\r\n");
    assert_eq!(error("DECRBY c -9223372036854775808"), "-ERR decrement would overflow\r\n");
}

#[test]
fn multi_key_commands() {
    let keys = |names: &[&str]| {
        names.iter().map(|k| Bytes::copy_from_slice(k.as_bytes())).collect::<Vec<_>>()
    };
    assert_eq!(parse("DEL a b"), Ok(ClientCommand::Del { keys: keys(&["a", "b"]) }));
    assert_eq!(parse("EXISTS a a"), Ok(ClientCommand::Exists { keys: keys(&["a", "a"]) }));
    let mget = |names: &[&str], level| Ok(ClientCommand::MGet { keys: keys(names), level });
    assert_eq!(parse("MGET a b LEVEL any"), mget(&["a", "b"], Some(ReadLevel::Any)));
    assert_eq!(parse("MGET a level linearizable"), mget(&["a"], Some(ReadLevel::Linearizable)));
    assert_eq!(
        parse("MGET level any"),
        mget(&["level", "any"], None),
        "LEVEL needs a key before it"
    );
    assert_eq!(parse("MGET a"), mget(&["a"], None));
}

#[test]
fn cas_spells_absent_as_minus_nil() {
    let cas = |expected: Option<&str>, durability| {
        Ok(ClientCommand::Cas {
            key: b"k".to_vec().into(),
            expected: expected.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            new: b"n".to_vec().into(),
            durability,
            mode: OpMode::Plain,
        })
    };
    assert_eq!(parse("KEEL.CAS k -nil n"), cas(None, None));
    assert_eq!(
        parse("keel.cas k old n DURABILITY replicated"),
        cas(Some("old"), Some(Durability::Replicated))
    );
    assert_eq!(parse("KEEL.CAS k --nil n"), cas(Some("-nil"), None), "escaped sentinel");
    assert_eq!(parse("KEEL.CAS k ---x n"), cas(Some("--x"), None));
    assert_eq!(parse("KEEL.CAS k -5 n"), cas(Some("-5"), None));
    assert_eq!(parse("KEEL.CAS k \"\" n"), cas(Some(""), None), "empty is a value, not absent");
    assert_eq!(error("KEEL.CAS k a n WITHVERSION"), "-ERR syntax error\r\n");
}

#[test]
fn an_option_given_twice_is_a_syntax_error() {
    for line in [
        "GET a WITHVERSION WITHVERSION",
        "GET a LEVEL any LEVEL monotonic",
        "SET a v WITHVERSION WITHVERSION",
        "SET a v DURABILITY memory DURABILITY durable",
        "KEEL.CAS k a n DURABILITY memory DURABILITY memory",
        "KEEL.SCAN a +inf COUNT 2 COUNT 3",
        "KEEL.SCAN a +inf LEVEL any LEVEL any",
    ] {
        assert_eq!(error(line), "-ERR syntax error\r\n", "{line}");
    }
    assert!(parse("GET a LEVEL any WITHVERSION").is_ok(), "each once is fine");
}

#[test]
fn scan_takes_a_range_a_count_and_a_level() {
    let scan = |end: Option<&str>, count, level| {
        Ok(ClientCommand::Scan {
            start: b"a".to_vec().into(),
            end: end.map(|e| Bytes::copy_from_slice(e.as_bytes())),
            count,
            level,
        })
    };
    assert_eq!(parse("KEEL.SCAN a +inf"), scan(None, 10, None));
    assert_eq!(
        parse("KEEL.SCAN a z COUNT 100 LEVEL monotonic"),
        scan(Some("z"), 100, Some(ReadLevel::Monotonic))
    );
    assert_eq!(parse("KEEL.SCAN a ++inf"), scan(Some("+inf"), 10, None));
    assert_eq!(error("KEEL.SCAN a z COUNT -1"), "-ERR value is not an integer or out of range\r\n");
    assert_eq!(
        error("KEEL.SCAN a z COUNT 0"),
        "-ERR invalid argument: scan limit 0 outside 1..=10000\r\n"
    );
    assert_eq!(
        error("KEEL.SCAN a z COUNT 10001").len(),
        "-ERR invalid argument: scan limit 10001 outside 1..=10000\r\n".len()
    );
}

#[test]
fn keys_and_values_are_checked_against_limits() {
    let key = "k".repeat(1025);
    assert_eq!(
        error(&format!("GET {key}")),
        "-ERR key of 1025 bytes exceeds the limit of 1024 bytes\r\n"
    );
    let limits = Limits { value_bytes_max: 2, ..Limits::default() };
    let words =
        vec![Bytes::from_static(b"SET"), Bytes::from_static(b"k"), Bytes::from_static(b"abc")];
    let err = keel_wire::command::parse(words, &limits).unwrap_err();
    assert!(matches!(
        err,
        keel_wire::CommandError::Invalid(KeelError::ValueTooLarge { len: 3, max: 2 })
    ));
}

#[test]
fn handshake_commands_for_redis_tools() {
    assert_eq!(parse("PING"), Ok(ClientCommand::Ping { message: None }));
    assert_eq!(parse("ping hi"), Ok(ClientCommand::Ping { message: Some(b"hi".to_vec().into()) }));
    assert_eq!(parse("ECHO x"), Ok(ClientCommand::Echo { message: b"x".to_vec().into() }));
    assert_eq!(parse("COMMAND"), Ok(ClientCommand::Command(CommandQuery::All)));
    assert_eq!(parse("command count"), Ok(ClientCommand::Command(CommandQuery::Count)));
    assert_eq!(parse("COMMAND DOCS"), Ok(ClientCommand::Command(CommandQuery::Docs(vec![]))));
    assert_eq!(error("COMMAND FOO"), "-ERR unknown subcommand 'FOO'. Try COMMAND HELP.\r\n");
    assert_eq!(
        parse("CONFIG GET save"),
        Ok(ClientCommand::ConfigGet { parameters: vec![b"save".to_vec().into()] })
    );
    assert_eq!(parse("SELECT 0"), Ok(ClientCommand::Select { index: 0 }));
    assert_eq!(parse("SELECT 7"), Ok(ClientCommand::Select { index: 7 }));
    assert_eq!(error("SELECT -1"), "-ERR DB index is out of range\r\n");
    assert_eq!(parse("KEEL.KEYSPACES"), Ok(ClientCommand::Keyspaces));
    assert_eq!(parse("INFO Server"), Ok(ClientCommand::Info { sections: vec!["server".into()] }));
    assert_eq!(parse("KEEL.STATUS"), Ok(ClientCommand::Status));
    assert_eq!(parse("QUIT"), Ok(ClientCommand::Quit));
}

#[test]
fn client_subcommands() {
    let client = |sub| Ok(ClientCommand::Client(sub));
    assert_eq!(
        parse("CLIENT SETNAME app"),
        client(ClientSubcommand::SetName(b"app".to_vec().into()))
    );
    assert_eq!(parse("client getname"), client(ClientSubcommand::GetName));
    assert_eq!(parse("CLIENT ID"), client(ClientSubcommand::Id));
    let setinfo = ClientSubcommand::SetInfo {
        attribute: "lib-name".into(),
        value: b"redis-py".to_vec().into(),
    };
    assert_eq!(parse("CLIENT SETINFO LIB-NAME redis-py"), client(setinfo));
    assert_eq!(parse("CLIENT NO-EVICT on"), client(ClientSubcommand::NoEvict));
    assert_eq!(parse("CLIENT LIST"), client(ClientSubcommand::List { ids: Vec::new() }));
    assert_eq!(parse("CLIENT LIST ID 3 4"), client(ClientSubcommand::List { ids: vec![3, 4] }));
    let filter = keel_wire::command::KillFilter {
        id: Some(7),
        user: Some("app".into()),
        skip_me: false,
        ..Default::default()
    };
    let kill = ClientSubcommand::Kill { filter, old_form: false };
    assert_eq!(parse("CLIENT KILL ID 7 USER app SKIPME no"), client(kill));
    assert!(parse("CLIENT KILL ID 7 USER").is_err());
    assert_eq!(parse("CLIENT PAUSE 10"), client(ClientSubcommand::Other("pause".into())));
}

#[test]
fn hello_negotiates_the_protocol() {
    let hello = |protocol, auth: Option<(&str, &str)>, name: Option<&str>| {
        Ok(ClientCommand::Hello {
            protocol,
            auth: auth.map(|(u, p)| {
                (Bytes::copy_from_slice(u.as_bytes()), Bytes::copy_from_slice(p.as_bytes()))
            }),
            client_name: name.map(|n| Bytes::copy_from_slice(n.as_bytes())),
        })
    };
    assert_eq!(parse("HELLO"), hello(None, None, None));
    assert_eq!(parse("HELLO 3"), hello(Some(Protocol::Resp3), None, None));
    assert_eq!(
        parse("HELLO 2 AUTH default secret SETNAME app"),
        hello(Some(Protocol::Resp2), Some(("default", "secret")), Some("app"))
    );
    assert_eq!(error("HELLO 4"), "-NOPROTO unsupported protocol version\r\n");
    assert_eq!(error("HELLO x"), "-ERR Protocol version is not an integer or out of range\r\n");
    assert_eq!(error("HELLO 3 AUTH u"), "-ERR Syntax error in HELLO option 'AUTH'\r\n");
}

#[test]
fn requests_must_be_bulk_strings() {
    let frame = keel_wire::Frame::Array(vec![keel_wire::Frame::Integer(1)]);
    let err = parse_frame(frame, &Limits::default()).unwrap_err();
    assert_eq!(err, keel_wire::CommandError::NotBulkStrings);
    let err = keel_wire::command::parse(vec![], &Limits::default()).unwrap_err();
    assert_eq!(err, keel_wire::CommandError::Empty);
}

#[test]
fn data_commands_become_engine_operations() {
    use keel_types::Command;
    let ops = parse("DEL a b").unwrap().into_operations().unwrap();
    let deletes = vec![
        Command::Delete { key: b"a".to_vec().into() },
        Command::Delete { key: b"b".to_vec().into() },
    ];
    assert_eq!(ops.commands, deletes);
    let ops = parse("SET k v DURABILITY memory WITHVERSION").unwrap().into_operations().unwrap();
    assert_eq!(
        ops.commands,
        [Command::Put { key: b"k".to_vec().into(), value: b"v".to_vec().into() }]
    );
    assert_eq!(
        (ops.durability, ops.level, ops.with_version),
        (Some(Durability::Memory), None, true)
    );
    let ops = parse("MGET a LEVEL any").unwrap().into_operations().unwrap();
    assert_eq!((ops.commands.len(), ops.level), (1, Some(ReadLevel::Any)));
    let ops = parse("KEEL.SCAN a +inf COUNT 5").unwrap().into_operations().unwrap();
    assert_eq!(ops.commands, [Command::Scan { start: b"a".to_vec().into(), end: None, limit: 5 }]);
    assert_eq!(
        parse("PING").unwrap().into_operations(),
        Err(ClientCommand::Ping { message: None })
    );
}

#[test]
fn bitpos_and_object_encoding_compute_what_redis_answers() {
    use keel_wire::command::StringRead;
    use keel_wire::resp::Frame;
    let bitpos =
        |bit, range, value: Option<&[u8]>| match StringRead::BitPos(bit, range).answer(value) {
            Frame::Integer(n) => n,
            other => panic!("{other:?}"),
        };
    let v: &[u8] = &[0xff, 0xf0, 0x00];
    assert_eq!(bitpos(false, None, Some(v)), 12);
    assert_eq!(bitpos(true, Some((1, None, false)), Some(v)), 8);
    assert_eq!(bitpos(true, Some((2, None, false)), Some(v)), -1);
    assert_eq!(bitpos(false, None, Some(&[0xff])), 8, "clear bits past the end, no end given");
    assert_eq!(bitpos(false, Some((0, Some(-1), false)), Some(&[0xff])), -1, "end given");
    assert_eq!(bitpos(true, Some((9, Some(15), true)), Some(v)), 9, "in bits");
    assert_eq!(bitpos(false, Some((2, Some(1), false)), Some(v)), -1, "empty range");
    assert_eq!(bitpos(false, None, None), 0);
    assert_eq!(bitpos(true, None, None), -1);
    let encoding = |value: &[u8]| StringRead::Encoding.answer(Some(value));
    assert_eq!(encoding(b"1234"), Frame::Bulk(Bytes::from_static(b"int")));
    assert_eq!(encoding(b"01234"), Frame::Bulk(Bytes::from_static(b"embstr")));
    assert_eq!(encoding(&[b'x'; 45]), Frame::Bulk(Bytes::from_static(b"raw")));
    assert_eq!(StringRead::Encoding.answer(None), Frame::Null);
}

#[test]
fn msetnx_move_lcs_and_config_parse_as_redis() {
    use keel_wire::command::CommandError;
    let limits = Limits::default();
    let parse = |text: &str| {
        let words = text.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect();
        keel_wire::command::parse(words, &limits)
    };
    assert!(matches!(parse("MSETNX a 1 b 2"), Ok(ClientCommand::MSet { only_new: true, .. })));
    assert!(matches!(parse("MSETNX a"), Err(CommandError::WrongArity { .. })));
    assert!(matches!(
        parse("MOVE k 3"),
        Ok(ClientCommand::Transfer { to_db: Some(3), remove_source: true, replace: false, .. })
    ));
    assert!(matches!(parse("MOVE k x"), Err(CommandError::NotAnInteger)));
    assert!(matches!(parse("LCS a b LEN IDX"), Err(CommandError::LcsLenAndIdx)));
    assert!(matches!(parse("CONFIG SET a"), Err(CommandError::WrongArity { .. })));
    assert!(
        matches!(parse("CONFIG SET A 1 b 2"), Ok(ClientCommand::ConfigSet { pairs }) if pairs[0].0 == "a")
    );
    assert!(matches!(parse("INCRBYFLOAT k +inf"), Err(CommandError::NotFinite)));
    assert!(matches!(parse("SWAPDB 0 1"), Ok(ClientCommand::SwapDb { a: 0, b: 1 })));
    use keel_wire::command::ClientSubcommand::Unblock;
    let unblock = |text| {
        parse(text).map(|c| matches!(c, ClientCommand::Client(Unblock { id: 7, error: true })))
    };
    assert!(matches!(unblock("CLIENT UNBLOCK 7 error"), Ok(true)));
    assert!(matches!(unblock("CLIENT UNBLOCK 7 timeout"), Ok(false)));
    assert!(parse("CLIENT UNBLOCK 7 later").is_err());
    assert!(parse("SORT k BY w_* GET #").is_err(), "patterns are refused");
    assert!(matches!(parse("SORT k LIMIT 0 2 DESC ALPHA STORE d"), Ok(ClientCommand::Coll { .. })));
    assert!(matches!(parse("SORT_RO k"), Ok(ClientCommand::CollRead { .. })));
    assert!(parse("SORT_RO k STORE d").is_err());
    assert!(matches!(parse("SWAPDB x 1"), Err(CommandError::InvalidDbIndex("first"))));
    assert!(matches!(parse("SWAPDB 1 y"), Err(CommandError::InvalidDbIndex("second"))));
    assert!(matches!(parse("SWAPDB -1 1"), Err(CommandError::DbIndexOutOfRange)));
}

/// `docs/redis-compatibility.md` says "yes" of exactly the Redis commands in Keel's table
/// (`COMMAND`): each of them has a "yes" row (itself or a subcommand), and each command a
/// row says "yes" of is in the table.
#[test]
fn the_compatibility_table_matches_the_command_table() {
    use keel_wire::command::table::{find, COMMANDS};
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/redis-compatibility.md");
    let doc = std::fs::read_to_string(path).expect("the compatibility page");
    let yes: Vec<String> = doc
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once("` | yes |").map(|(name, _)| name.to_ascii_lowercase()))
        .collect();
    for spec in COMMANDS.iter().filter(|c| !c.name.starts_with("keel.")) {
        let listed =
            yes.iter().any(|n| n == spec.name || n.starts_with(&format!("{} ", spec.name)));
        assert!(listed, "{} runs but the page does not say so", spec.name);
    }
    for name in &yes {
        let command = name.split(' ').next().unwrap();
        assert!(
            find(command.as_bytes()).is_some(),
            "the page says yes of {name}, not in the table"
        );
    }
}

#[test]
fn keel_options_follow_the_redis_arguments_of_the_newer_commands() {
    use keel_wire::command::CommandError;
    let limits = Limits::default();
    let parse = |text: &str| {
        let words = text.split(' ').map(|w| Bytes::copy_from_slice(w.as_bytes())).collect();
        keel_wire::command::parse(words, &limits)
    };
    let durable = Some(Durability::Durable);
    assert!(matches!(parse("APPEND k v DURABILITY durable"),
        Ok(ClientCommand::Modify { durability, .. }) if durability == durable));
    assert!(matches!(parse("APPEND durability memory"),
        Ok(ClientCommand::Modify { ref key, durability: None, .. }) if &key[..] == b"durability"));
    assert!(matches!(parse("EXPIRE k 10 NX DURABILITY durable"),
        Ok(ClientCommand::Expire { durability, cond: ExpireCond::IfNone, .. }) if durability == durable));
    assert!(matches!(parse("RENAME a b DURABILITY durable"),
        Ok(ClientCommand::Transfer { durability, .. }) if durability == durable));
    assert!(matches!(
        parse("GETRANGE k 0 1 LEVEL any"),
        Ok(ClientCommand::ReadString { level: Some(ReadLevel::Any), .. })
    ));
    assert!(matches!(
        parse("BITCOUNT k LEVEL linearizable"),
        Ok(ClientCommand::ReadString { level: Some(ReadLevel::Linearizable), .. })
    ));
    assert!(matches!(parse("STRLEN k LEVEL nonsense"), Err(CommandError::UnknownName(_))));
    assert!(matches!(parse("STRLEN k DURABILITY durable"), Err(CommandError::WrongArity { .. })));
}
