//! The Lua side of `EVAL` (`scripting`): one script run on a blocking thread of the
//! client runtime, in a fresh Lua 5.1 state with Redis's `redis` library, `KEYS` and
//! `ARGV`. Each `redis.call` is handed to the connection's task, which runs it on the
//! script's private copy of the keys and answers with the reply frame.
//!
//! The state holds the base, `table`, `string` and `math` libraries, and Redis's `cjson`
//! and `bit` (`lua_libs`), only (no `io`, `os`, `package`, `debug`, `dofile` or
//! `loadfile`), at most [`MEMORY_MAX`] bytes of heap, and
//! a hook that ends the script once `SCRIPT KILL` asks.

use bytes::Bytes;
use keel_wire::resp::Frame;
use mlua::{HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Most bytes a script's Lua heap may hold.
pub(crate) const MEMORY_MAX: usize = 256 * 1024 * 1024;
/// Instructions between two looks at the kill flag.
const HOOK_EVERY: u32 = 10_000;
/// Deepest table nesting a script's reply may have.
const REPLY_DEPTH_MAX: usize = 64;
/// What a killed script's client is told.
pub(crate) const KILLED: &str = "ERR Script killed by user with SCRIPT KILL...";

/// One `redis.call` or `redis.pcall`: its words, and where its reply goes.
pub(crate) struct Call {
    pub(crate) words: Vec<Bytes>,
    pub(crate) reply: oneshot::Sender<Frame>,
}

/// A script to run.
pub(crate) struct Job {
    /// The script's text.
    pub(crate) source: Bytes,
    /// Its SHA1, in hex (the chunk's name in error messages).
    pub(crate) sha: String,
    pub(crate) keys: Vec<Bytes>,
    pub(crate) args: Vec<Bytes>,
    /// Set by `SCRIPT KILL`.
    pub(crate) kill: Arc<AtomicBool>,
    /// Where its calls go.
    pub(crate) calls: mpsc::Sender<Call>,
}

/// Runs `job` to its end (blocking: call from a blocking thread): the script's reply, an
/// error reply if it failed, or [`KILLED`].
pub(crate) fn run(job: Job) -> Frame {
    let kill = job.kill.clone();
    match run_lua(job) {
        _ if kill.load(Ordering::Relaxed) => Frame::error(KILLED),
        Ok(frame) => frame,
        Err(e) => Frame::error(&format!("ERR {}", one_line(&e.to_string()))),
    }
}

fn run_lua(job: Job) -> mlua::Result<Frame> {
    let libs = StdLib::TABLE | StdLib::STRING | StdLib::MATH;
    let lua = Lua::new_with(libs, LuaOptions::new())?;
    lua.set_memory_limit(MEMORY_MAX)?;
    let kill = job.kill.clone();
    lua.set_hook(HookTriggers::new().every_nth_instruction(HOOK_EVERY), move |_, _| {
        match kill.load(Ordering::Relaxed) {
            true => Err(mlua::Error::runtime("Script killed by user with SCRIPT KILL")),
            false => Ok(mlua::VmState::Continue),
        }
    });
    let globals = lua.globals();
    for name in ["dofile", "loadfile"] {
        globals.set(name, Value::Nil)?;
    }
    globals.set("KEYS", strings(&lua, &job.keys)?)?;
    globals.set("ARGV", strings(&lua, &job.args)?)?;
    globals.set("redis", redis_library(&lua, job.calls)?)?;
    super::lua_libs::install(&lua)?;
    let chunk = lua.load(&job.source[..]).set_name(format!("@user_script:{}", job.sha));
    let function = chunk.into_function()?;
    // The script runs inside a protected call, so that an error value of any kind (the
    // table `redis.call` raises) comes back as its text.
    let runner: mlua::Function = lua
        .load(
            r#"local f = ...
            local ok, r = pcall(f)
            if ok then return true, r end
            if type(r) == "table" and r.err ~= nil then return false, r.err end
            return false, tostring(r)"#,
        )
        .set_name("=keel")
        .into_function()?;
    let (ok, value): (bool, Value) = runner.call(function)?;
    match ok {
        true => Ok(to_frame(&value, 0)),
        false => {
            let text = value.as_string().map(|s| s.to_string_lossy()).unwrap_or_default();
            let text = one_line(&text);
            // An error reply a command gave keeps its own code (`WRONGTYPE ...`).
            let coded = text
                .split(' ')
                .next()
                .is_some_and(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_uppercase()));
            Ok(Frame::error(&match coded {
                true => text,
                false => format!("ERR {text}"),
            }))
        }
    }
}

/// A Lua array of `words`.
fn strings(lua: &Lua, words: &[Bytes]) -> mlua::Result<mlua::Table> {
    let table = lua.create_table_with_capacity(words.len(), 0)?;
    for (i, word) in words.iter().enumerate() {
        table.raw_set(i + 1, lua.create_string(&word[..])?)?;
    }
    Ok(table)
}

/// The `redis` table: `call`, `pcall`, `error_reply`, `status_reply`, `sha1hex`, `log`
/// and its levels, `setresp` (2 only) and `set_repl` (accepted: the effects always
/// replicate).
fn redis_library(lua: &Lua, calls: mpsc::Sender<Call>) -> mlua::Result<mlua::Table> {
    let redis = lua.create_table()?;
    let pcall = lua.create_function(move |lua, args: MultiValue| {
        let words = words_of(lua, args)?;
        let (reply, answer) = oneshot::channel();
        let frame = match calls.blocking_send(Call { words, reply }) {
            Ok(()) => answer.blocking_recv().unwrap_or_else(|_| ended()),
            Err(_) => ended(),
        };
        to_lua(lua, frame)
    })?;
    redis.set("pcall", pcall.clone())?;
    let call: mlua::Function = lua
        .load(
            r#"local pcall = ...
            return function(...)
                local r = pcall(...)
                if type(r) == "table" and r.err ~= nil then error(r, 0) end
                return r
            end"#,
        )
        .set_name("=keel")
        .call(pcall)?;
    redis.set("call", call)?;
    redis.set(
        "error_reply",
        lua.create_function(|lua, text: mlua::String| {
            let table = lua.create_table()?;
            table.set("err", text)?;
            Ok(table)
        })?,
    )?;
    redis.set(
        "status_reply",
        lua.create_function(|lua, text: mlua::String| {
            let table = lua.create_table()?;
            table.set("ok", text)?;
            Ok(table)
        })?,
    )?;
    redis.set(
        "sha1hex",
        lua.create_function(|_, text: mlua::String| Ok(sha1_hex(&text.as_bytes())))?,
    )?;
    redis.set(
        "log",
        lua.create_function(|_, (level, text): (i64, mlua::String)| {
            tracing::info!(level, message = %text.to_string_lossy(), "script log");
            Ok(())
        })?,
    )?;
    for (name, level) in
        [("LOG_DEBUG", 0), ("LOG_VERBOSE", 1), ("LOG_NOTICE", 2), ("LOG_WARNING", 3)]
    {
        redis.set(name, level)?;
    }
    for (name, flag) in [("REPL_NONE", 0), ("REPL_AOF", 1), ("REPL_SLAVE", 2), ("REPL_REPLICA", 2)]
    {
        redis.set(name, flag)?;
    }
    redis.set("REPL_ALL", 3)?;
    redis.set("set_repl", lua.create_function(|_, _: i64| Ok(()))?)?;
    redis.set(
        "setresp",
        lua.create_function(|_, version: i64| match version {
            2 => Ok(()),
            _ => Err(mlua::Error::runtime("RESP version must be 2 in Keel's scripts")),
        })?,
    )?;
    Ok(redis)
}

/// The reply of a call whose connection's task is gone (the client left).
fn ended() -> Frame {
    Frame::error("ERR the script's connection is gone")
}

/// A call's words: strings, and numbers as Lua writes them.
fn words_of(lua: &Lua, args: MultiValue) -> mlua::Result<Vec<Bytes>> {
    if args.is_empty() {
        return Err(mlua::Error::runtime(
            "Please specify at least one argument for this redis lib call",
        ));
    }
    let mut words = Vec::with_capacity(args.len());
    for arg in args {
        let text = match arg {
            Value::String(s) => Some(s),
            Value::Integer(_) | Value::Number(_) => lua.coerce_string(arg)?,
            _ => None,
        };
        match text {
            Some(text) => words.push(Bytes::copy_from_slice(&text.as_bytes())),
            None => {
                return Err(mlua::Error::runtime(
                    "Lua redis lib command arguments must be strings or integers",
                ))
            }
        }
    }
    Ok(words)
}

/// A reply as Lua sees it (Redis's rules): integers are numbers, bulk strings strings,
/// nulls `false`, arrays tables, a status `{ok=...}`, an error `{err=...}`.
fn to_lua(lua: &Lua, frame: Frame) -> mlua::Result<Value> {
    let table_of = |field: &str, text: &[u8]| -> mlua::Result<Value> {
        let table = lua.create_table()?;
        table.set(field, lua.create_string(text)?)?;
        Ok(Value::Table(table))
    };
    let array = |items: Vec<Frame>| -> mlua::Result<Value> {
        let table = lua.create_table_with_capacity(items.len(), 0)?;
        for (i, item) in items.into_iter().enumerate() {
            table.raw_set(i + 1, to_lua(lua, item)?)?;
        }
        Ok(Value::Table(table))
    };
    Ok(match frame {
        Frame::Integer(n) => Value::Number(n as f64),
        Frame::Bulk(bytes) => Value::String(lua.create_string(&bytes[..])?),
        Frame::Null | Frame::NullArray => Value::Boolean(false),
        Frame::Simple(text) => return table_of("ok", &text),
        Frame::Error(text) | Frame::BulkError(text) => return table_of("err", &text),
        Frame::Boolean(b) => Value::Number(f64::from(u8::from(b))),
        Frame::Double(d) => Value::String(lua.create_string(d.to_string())?),
        Frame::BigNumber(text) => Value::String(lua.create_string(&text)?),
        Frame::Verbatim { text, .. } => Value::String(lua.create_string(&text)?),
        Frame::Array(items) | Frame::Set(items) | Frame::Push(items) => return array(items),
        Frame::Map(pairs) => return array(pairs.into_iter().flat_map(|(k, v)| [k, v]).collect()),
        Frame::Attribute { frame, .. } => return to_lua(lua, *frame),
    })
}

/// A script's result as a reply (Redis's rules): numbers are integers (truncated),
/// strings bulk strings, `true` 1, `false` and `nil` null, `{ok=...}` a status,
/// `{err=...}` an error, any other table the array of its items up to the first `nil`.
fn to_frame(value: &Value, depth: usize) -> Frame {
    match value {
        Value::Integer(n) => Frame::Integer(*n),
        Value::Number(n) => Frame::Integer(*n as i64),
        Value::String(s) => Frame::Bulk(Bytes::copy_from_slice(&s.as_bytes())),
        Value::Boolean(true) => Frame::Integer(1),
        Value::Table(table) => {
            if let Ok(Value::String(err)) = table.raw_get::<Value>("err") {
                return Frame::Error(err.as_bytes().to_vec());
            }
            if let Ok(Value::String(ok)) = table.raw_get::<Value>("ok") {
                return Frame::Simple(ok.as_bytes().to_vec());
            }
            if depth >= REPLY_DEPTH_MAX {
                return Frame::error("ERR reached lua stack limit");
            }
            let mut items = Vec::new();
            for i in 1.. {
                match table.raw_get::<Value>(i) {
                    Ok(Value::Nil) | Err(_) => break,
                    Ok(item) => items.push(to_frame(&item, depth + 1)),
                }
            }
            Frame::Array(items)
        }
        _ => Frame::Null,
    }
}

/// Error text on one line (a reply error cannot hold a line break).
fn one_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().trim().to_string()
}

/// `text`'s SHA1 in lowercase hex: a script's name in the cache.
pub(crate) fn sha1_hex(text: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY, text);
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(source: &str, answer: impl Fn(&[Bytes]) -> Frame + Send + 'static) -> Frame {
        let (calls, mut rx) = mpsc::channel::<Call>(1);
        let server = std::thread::spawn(move || {
            while let Some(call) = rx.blocking_recv() {
                let _ = call.reply.send(answer(&call.words));
            }
        });
        let job = Job {
            source: Bytes::copy_from_slice(source.as_bytes()),
            sha: sha1_hex(source.as_bytes()),
            keys: vec![Bytes::from_static(b"k")],
            args: vec![Bytes::from_static(b"7")],
            kill: Arc::new(AtomicBool::new(false)),
            calls,
        };
        let frame = run(job);
        server.join().unwrap();
        frame
    }

    #[test]
    fn replies_convert_both_ways_as_redis_converts_them() {
        let echo = |words: &[Bytes]| Frame::Array(words.iter().cloned().map(Frame::Bulk).collect());
        let frame = eval("return redis.call('get', KEYS[1], ARGV[1], 3, 2.5)", echo);
        let bulk = |s: &str| Frame::Bulk(Bytes::copy_from_slice(s.as_bytes()));
        assert_eq!(
            frame,
            Frame::Array(vec![bulk("get"), bulk("k"), bulk("7"), bulk("3"), bulk("2.5")])
        );
        let frame = eval("return {1, 2.9, true, false, 'x', {ok='fine'}, nil, 9}", |_| Frame::Null);
        let expected = vec![
            Frame::Integer(1),
            Frame::Integer(2),
            Frame::Integer(1),
            Frame::Null,
            bulk("x"),
            Frame::Simple(b"fine".to_vec()),
        ];
        assert_eq!(frame, Frame::Array(expected), "an array ends at its first nil");
        let status = eval("return redis.call('set', 'a', 'b')", |_| Frame::ok());
        assert_eq!(status, Frame::ok());
        let null = eval("return redis.call('get', 'a') == false", |_| Frame::Null);
        assert_eq!(null, Frame::Integer(1));
    }

    #[test]
    fn an_error_reply_raises_in_call_and_is_returned_by_pcall() {
        let wrong = |_: &[Bytes]| Frame::error("WRONGTYPE Operation against a key");
        let frame = eval("redis.call('incr', 'k'); return 1", wrong);
        assert_eq!(frame, Frame::error("WRONGTYPE Operation against a key"));
        let frame = eval("local r = redis.pcall('incr', 'k'); return r.err", wrong);
        assert_eq!(frame, Frame::Bulk(Bytes::from_static(b"WRONGTYPE Operation against a key")));
        let frame = eval("return redis.error_reply('My error')", wrong);
        assert_eq!(frame, Frame::error("My error"));
        let frame = eval("error('boom')", wrong);
        assert!(
            matches!(&frame, Frame::Error(t) if t.starts_with(b"ERR ") && t.ends_with(b"boom")),
            "{frame:?}"
        );
        let frame = eval("return redis.call()", wrong);
        assert!(
            matches!(&frame, Frame::Error(t) if t.ends_with(b"this redis lib call")),
            "{frame:?}"
        );
    }

    #[test]
    fn the_sandbox_has_no_files_or_processes_and_a_bounded_heap() {
        for name in ["io", "os", "dofile", "loadfile", "package", "debug"] {
            let frame = eval(&format!("return type({name})"), |_| Frame::Null);
            assert_eq!(frame, Frame::Bulk(Bytes::from_static(b"nil")), "{name}");
        }
        let frame =
            eval("local t = {} for i = 1, 1e6 do t[i] = string.rep('x', 1048576) .. i end", |_| {
                Frame::Null
            });
        assert!(
            matches!(&frame, Frame::Error(t) if String::from_utf8_lossy(t).contains("memory")),
            "{frame:?}"
        );
        assert_eq!(
            eval("return redis.sha1hex('')", |_| Frame::Null),
            Frame::Bulk(Bytes::from_static(b"da39a3ee5e6b4b0d3255bfef95601890afd80709"))
        );
    }

    #[test]
    fn a_killed_script_ends() {
        let kill = Arc::new(AtomicBool::new(false));
        let (calls, _rx) = mpsc::channel::<Call>(1);
        let job = Job {
            source: Bytes::from_static(b"while true do end"),
            sha: "x".into(),
            keys: vec![],
            args: vec![],
            kill: kill.clone(),
            calls,
        };
        let running = std::thread::spawn(move || run(job));
        // Killed before or after it starts, the script ends killed.
        kill.store(true, Ordering::Relaxed);
        assert_eq!(running.join().unwrap(), Frame::error(KILLED));
    }
}
