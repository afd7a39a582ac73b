//! Readers for two Jepsen history formats (`docs/history-format.md`, "Jepsen formats").
//!
//! Layout: [`parse_register_log`] reads Jepsen's etcd register logs
//! (`INFO  jepsen.util - <process> <type> <f> <value>`); [`parse_kv_log`] reads one EDN
//! map per line (`{:process 0, :type :ok, :f :get, :key "7", :value ""}`). Both pair each
//! completion with the pending invocation of the same process, using line numbers as times,
//! and produce [`LinOp`]s. A small EDN tokenizer ([`parse_edn_map`]) sits at the bottom.
//!
//! Reading of event types (the same reading as Porcupine's tests of these files):
//! - `:ok`: completed as recorded.
//! - `:fail`: did not happen. For a cas it is a completed read that saw another value
//!   than `from`; for a read it constrains nothing and is dropped.
//! - `:info` (e.g. `:timed-out`), or an invocation never completed: unknown outcome; a
//!   write or cas stays pending forever, a read is dropped.
//! - A new invocation by a process that still has one pending leaves the old one pending
//!   forever (Jepsen renumbers such processes, so this does not occur in its logs).
//! - Events whose process is not an integer (the nemesis) are skipped.

use crate::error::{InputError, LineSource};
use crate::model::{Action, LinOp};
use std::collections::BTreeMap;
use std::io::BufRead;

/// The key every operation of a register log touches.
pub const REGISTER_KEY: &str = "register";
/// The most events one Jepsen log may hold (a bound on the reader's memory).
pub const EVENTS_MAX: usize = 50_000_000;
/// The most entries one EDN map or vector may hold.
pub const EDN_ITEMS_MAX: usize = 64;

/// Event types of a Jepsen history.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EventType {
    Invoke,
    Ok,
    Fail,
    Info,
}

impl EventType {
    fn parse(text: &str) -> Option<EventType> {
        match text {
            ":invoke" => Some(EventType::Invoke),
            ":ok" => Some(EventType::Ok),
            ":fail" => Some(EventType::Fail),
            ":info" => Some(EventType::Info),
            _ => None,
        }
    }
}

/// An invocation waiting for its completion.
#[derive(Clone, Debug)]
struct Pending {
    line: u64,
    process: u64,
    f: String,
    key: String,
    value: Edn,
}

/// Pairs completions with invocations; shared by both formats.
struct Pairing {
    pending: BTreeMap<u64, Pending>,
    ops: Vec<LinOp>,
    events: usize,
}

/// Turns an invocation plus its completion into an op, given the format's rules.
type Complete<'a> = dyn Fn(&Pending, EventType, &Edn, u64) -> Result<Option<LinOp>, String> + 'a;
/// Turns an invocation that never completed into an op with unknown outcome.
type Abandon<'a> = dyn Fn(&Pending) -> Result<Option<LinOp>, String> + 'a;

impl Pairing {
    fn new() -> Pairing {
        Pairing { pending: BTreeMap::new(), ops: Vec::new(), events: 0 }
    }

    fn event(
        &mut self,
        lines: &LineSource<impl BufRead>,
        kind: EventType,
        pending: Pending,
        complete: &Complete<'_>,
        abandon: &Abandon<'_>,
    ) -> Result<(), InputError> {
        self.events += 1;
        if self.events > EVENTS_MAX {
            return Err(lines.error(format!("more than {EVENTS_MAX} events")));
        }
        let line = lines.line();
        if kind == EventType::Invoke {
            if let Some(old) = self.pending.insert(pending.process, pending) {
                self.abandon(&old, abandon).map_err(|m| lines.error(m))?;
            }
            return Ok(());
        }
        let Some(invoke) = self.pending.remove(&pending.process) else {
            return Err(lines.error(format!(
                "completion for process {} which has no pending invocation",
                pending.process
            )));
        };
        if invoke.f != pending.f {
            return Err(lines.error(format!(
                "completion :{} does not match the invocation :{} of line {}",
                pending.f, invoke.f, invoke.line
            )));
        }
        let op = if kind == EventType::Info {
            abandon(&invoke)
        } else {
            complete(&invoke, kind, &pending.value, line)
        };
        if let Some(op) = op.map_err(|m| lines.error(m))? {
            self.ops.push(op);
        }
        Ok(())
    }

    fn abandon(&mut self, old: &Pending, abandon: &Abandon<'_>) -> Result<(), String> {
        if let Some(op) = abandon(old)? {
            debug_assert!(op.complete.is_none());
            self.ops.push(op);
        }
        Ok(())
    }

    fn finish(mut self, abandon: &Abandon<'_>, file: &str) -> Result<Vec<LinOp>, InputError> {
        let pending = std::mem::take(&mut self.pending);
        for old in pending.values() {
            self.abandon(old, abandon).map_err(|m| InputError::new(file, old.line, m))?;
        }
        self.ops.sort_by_key(|op| op.invoke);
        Ok(self.ops)
    }
}

fn integer_text(value: &Edn) -> Result<String, String> {
    match value {
        Edn::Int(n) => Ok(n.to_string()),
        other => Err(format!("expected an integer, found {other:?}")),
    }
}

fn cas_pair(value: &Edn) -> Result<(String, String), String> {
    match value {
        Edn::Vector(items) if items.len() == 2 => {
            Ok((integer_text(&items[0])?, integer_text(&items[1])?))
        }
        other => Err(format!("expected [from to], found {other:?}")),
    }
}

fn register_action(invoke: &Pending, swapped: Option<bool>) -> Result<Action, String> {
    match invoke.f.as_str() {
        "write" => Ok(Action::Write { value: integer_text(&invoke.value)? }),
        "cas" => {
            let (from, to) = cas_pair(&invoke.value)?;
            Ok(Action::Cas { expected: Some(from), value: to, swapped })
        }
        other => Err(format!("unknown register operation :{other}")),
    }
}

fn register_complete(
    invoke: &Pending,
    kind: EventType,
    value: &Edn,
    line: u64,
) -> Result<Option<LinOp>, String> {
    let action = match (invoke.f.as_str(), kind) {
        ("read", EventType::Ok) => match value {
            Edn::Nil => Action::Read { result: None },
            other => Action::Read { result: Some(integer_text(other)?) },
        },
        ("read" | "write", EventType::Fail) => return Ok(None),
        ("cas", EventType::Fail) => register_action(invoke, Some(false))?,
        (_, EventType::Ok) => register_action(invoke, Some(true))?,
        (f, kind) => return Err(format!("unexpected {kind:?} completion of :{f}")),
    };
    Ok(Some(LinOp {
        id: invoke.line,
        client: invoke.process,
        key: invoke.key.clone(),
        action,
        invoke: invoke.line,
        complete: Some(line),
    }))
}

fn register_abandon(invoke: &Pending) -> Result<Option<LinOp>, String> {
    if invoke.f == "read" {
        return Ok(None);
    }
    Ok(Some(LinOp {
        id: invoke.line,
        client: invoke.process,
        key: invoke.key.clone(),
        action: register_action(invoke, None)?,
        invoke: invoke.line,
        complete: None,
    }))
}

/// Reads a Jepsen etcd register log (`INFO  jepsen.util - <process> <type> <f> <value>`,
/// fields separated by tabs or spaces). Blank lines are skipped; any other line that is
/// not an event is an error naming the line.
pub fn parse_register_log<R: BufRead>(reader: R, file: &str) -> Result<Vec<LinOp>, InputError> {
    let mut lines = LineSource::new(reader, file);
    let mut pairing = Pairing::new();
    while let Some(text) = lines.next_line()? {
        let fields: Vec<&str> = text.split_whitespace().collect();
        if fields.is_empty() {
            continue;
        }
        if fields.len() < 7 || fields[0] != "INFO" || fields[1] != "jepsen.util" || fields[2] != "-"
        {
            return Err(lines.error(
                "not a Jepsen event line (expected 'INFO  jepsen.util - <process> <type> <f> <value>')",
            ));
        }
        let Ok(process) = fields[3].parse::<u64>() else {
            if fields[3].starts_with(':') {
                continue; // the nemesis
            }
            return Err(lines.error(format!("process '{}' is not an integer", fields[3])));
        };
        let kind = EventType::parse(fields[4])
            .ok_or_else(|| lines.error(format!("unknown event type '{}'", fields[4])))?;
        let f = fields[5]
            .strip_prefix(':')
            .filter(|f| matches!(*f, "read" | "write" | "cas"))
            .ok_or_else(|| lines.error(format!("unknown operation '{}'", fields[5])))?;
        let value_text = fields[6..].join(" ");
        let value = parse_edn_value(&value_text).map_err(|m| lines.error(m))?;
        check_register_invoke(kind, f, &value).map_err(|m| lines.error(m))?;
        let pending = Pending {
            line: lines.line(),
            process,
            f: f.to_string(),
            key: REGISTER_KEY.to_string(),
            value,
        };
        pairing.event(&lines, kind, pending, &register_complete, &register_abandon)?;
    }
    pairing.finish(&register_abandon, file)
}

fn check_register_invoke(kind: EventType, f: &str, value: &Edn) -> Result<(), String> {
    if kind != EventType::Invoke {
        return Ok(());
    }
    match f {
        "read" => Ok(()),
        "write" => integer_text(value).map(|_| ()),
        _ => cas_pair(value).map(|_| ()),
    }
}

fn kv_action(invoke: &Pending, read: Option<&Edn>) -> Result<Action, String> {
    let text = |v: &Edn| match v {
        Edn::Str(s) => Ok(s.clone()),
        Edn::Int(n) => Ok(n.to_string()),
        other => Err(format!("expected a string value, found {other:?}")),
    };
    match invoke.f.as_str() {
        "get" => match read {
            Some(Edn::Nil) => Ok(Action::Read { result: None }),
            Some(v) => Ok(Action::Read { result: Some(text(v)?) }),
            None => Err("a get has no unknown-outcome form".to_string()),
        },
        "put" => Ok(Action::Write { value: text(&invoke.value)? }),
        "append" => Ok(Action::Append { suffix: text(&invoke.value)? }),
        other => Err(format!("unknown kv operation :{other}")),
    }
}

fn kv_complete(
    invoke: &Pending,
    kind: EventType,
    value: &Edn,
    line: u64,
) -> Result<Option<LinOp>, String> {
    if kind == EventType::Fail {
        return Ok(None);
    }
    debug_assert_eq!(kind, EventType::Ok);
    Ok(Some(LinOp {
        id: invoke.line,
        client: invoke.process,
        key: invoke.key.clone(),
        action: kv_action(invoke, Some(value))?,
        invoke: invoke.line,
        complete: Some(line),
    }))
}

fn kv_abandon(invoke: &Pending) -> Result<Option<LinOp>, String> {
    if invoke.f == "get" {
        return Ok(None);
    }
    Ok(Some(LinOp {
        id: invoke.line,
        client: invoke.process,
        key: invoke.key.clone(),
        action: kv_action(invoke, None)?,
        invoke: invoke.line,
        complete: None,
    }))
}

/// Reads a Jepsen kv log: one EDN map per line with `:process`, `:type`, `:f` (`:get`,
/// `:put`, `:append`), `:key` and `:value`; other entries are ignored. Blank lines are
/// skipped; any other malformed line is an error naming the line.
pub fn parse_kv_log<R: BufRead>(reader: R, file: &str) -> Result<Vec<LinOp>, InputError> {
    let mut lines = LineSource::new(reader, file);
    let mut pairing = Pairing::new();
    while let Some(text) = lines.next_line()? {
        if text.trim().is_empty() {
            continue;
        }
        let map = parse_edn_map(&text).map_err(|m| lines.error(m))?;
        let field = |name: &str| map.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let process = match field("process") {
            Some(Edn::Int(p)) if *p >= 0 => *p as u64,
            Some(Edn::Keyword(_)) => continue, // the nemesis
            other => return Err(lines.error(format!("bad or missing :process ({other:?})"))),
        };
        let kind = match field("type") {
            Some(Edn::Keyword(t)) => EventType::parse(&format!(":{t}")),
            _ => None,
        }
        .ok_or_else(|| lines.error("bad or missing :type"))?;
        let f = match field("f") {
            Some(Edn::Keyword(f)) if matches!(f.as_str(), "get" | "put" | "append") => f.clone(),
            other => return Err(lines.error(format!("bad or missing :f ({other:?})"))),
        };
        let key = match field("key") {
            Some(Edn::Str(k)) => k.clone(),
            Some(Edn::Int(k)) => k.to_string(),
            other => return Err(lines.error(format!("bad or missing :key ({other:?})"))),
        };
        let value = field("value").cloned().unwrap_or(Edn::Nil);
        if kind == EventType::Invoke && f != "get" && !matches!(value, Edn::Str(_) | Edn::Int(_)) {
            return Err(lines.error(format!(":{f} needs a string :value")));
        }
        let pending = Pending { line: lines.line(), process, f, key, value };
        pairing.event(&lines, kind, pending, &kv_complete, &kv_abandon)?;
    }
    pairing.finish(&kv_abandon, file)
}

/// One EDN value, as far as these formats need: atoms and flat vectors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Edn {
    /// `nil`.
    Nil,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
    /// A keyword, without its colon.
    Keyword(String),
    /// Any other bare word.
    Symbol(String),
    /// A vector of atoms.
    Vector(Vec<Edn>),
}

/// Reads one value: an atom or a flat vector.
pub fn parse_edn_value(text: &str) -> Result<Edn, String> {
    let mut tokens = Tokens { chars: text.char_indices().peekable(), text };
    let value = tokens.value()?.ok_or("missing value")?;
    if tokens.next_token()?.is_some() {
        return Err(format!("trailing text after value in '{text}'"));
    }
    Ok(value)
}

/// Reads one EDN map of keyword keys, e.g. `{:process 0, :type :ok}`.
pub fn parse_edn_map(text: &str) -> Result<Vec<(String, Edn)>, String> {
    let mut tokens = Tokens { chars: text.char_indices().peekable(), text };
    if tokens.next_token()? != Some(Token::Open('{')) {
        return Err("expected an EDN map starting with '{'".to_string());
    }
    let mut entries = Vec::new();
    loop {
        let key = match tokens.next_token()? {
            Some(Token::Close('}')) => break,
            Some(Token::Atom(Edn::Keyword(k))) => k,
            other => return Err(format!("expected a keyword key or '}}', found {other:?}")),
        };
        let value = tokens.value()?.ok_or("map ends after a key")?;
        if entries.len() >= EDN_ITEMS_MAX {
            return Err(format!("map with more than {EDN_ITEMS_MAX} entries"));
        }
        entries.push((key, value));
    }
    if tokens.next_token()?.is_some() {
        return Err("trailing text after the map".to_string());
    }
    Ok(entries)
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    Open(char),
    Close(char),
    Atom(Edn),
}

struct Tokens<'a> {
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    text: &'a str,
}

impl Tokens<'_> {
    /// A value: an atom, or a vector of atoms. `None` at end of input.
    fn value(&mut self) -> Result<Option<Edn>, String> {
        match self.next_token()? {
            None => Ok(None),
            Some(Token::Atom(atom)) => Ok(Some(atom)),
            Some(Token::Open('[')) => {
                let mut items = Vec::new();
                loop {
                    match self.next_token()? {
                        Some(Token::Close(']')) => return Ok(Some(Edn::Vector(items))),
                        Some(Token::Atom(atom)) if items.len() < EDN_ITEMS_MAX => items.push(atom),
                        other => return Err(format!("unsupported vector item {other:?}")),
                    }
                }
            }
            Some(other) => Err(format!("unexpected {other:?}")),
        }
    }

    fn next_token(&mut self) -> Result<Option<Token>, String> {
        while self.chars.next_if(|(_, c)| c.is_whitespace() || *c == ',').is_some() {}
        let Some((start, c)) = self.chars.next() else { return Ok(None) };
        match c {
            '{' | '[' | '(' => Ok(Some(Token::Open(c))),
            '}' | ']' | ')' => Ok(Some(Token::Close(c))),
            '"' => self.string().map(|s| Some(Token::Atom(Edn::Str(s)))),
            _ => {
                let mut end = start + c.len_utf8();
                while let Some((i, c)) = self.chars.next_if(|(_, c)| {
                    !c.is_whitespace()
                        && !matches!(c, ',' | '{' | '}' | '[' | ']' | '(' | ')' | '"')
                }) {
                    end = i + c.len_utf8();
                }
                Ok(Some(Token::Atom(word(&self.text[start..end]))))
            }
        }
    }

    fn string(&mut self) -> Result<String, String> {
        let mut out = String::new();
        loop {
            let Some((_, c)) = self.chars.next() else {
                return Err("unterminated string".to_string());
            };
            match c {
                '"' => return Ok(out),
                '\\' => match self.chars.next().map(|(_, c)| c) {
                    Some('n') => out.push('\n'),
                    Some('t') => out.push('\t'),
                    Some('r') => out.push('\r'),
                    Some(c @ ('"' | '\\')) => out.push(c),
                    other => return Err(format!("unsupported string escape {other:?}")),
                },
                c => out.push(c),
            }
        }
    }
}

fn word(text: &str) -> Edn {
    match text {
        "nil" => Edn::Nil,
        "true" => Edn::Bool(true),
        "false" => Edn::Bool(false),
        _ => {
            if let Some(k) = text.strip_prefix(':') {
                return Edn::Keyword(k.to_string());
            }
            text.parse::<i64>().map_or_else(|_| Edn::Symbol(text.to_string()), Edn::Int)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn register(text: &str) -> Result<Vec<LinOp>, InputError> {
        parse_register_log(text.as_bytes(), "etcd.log")
    }

    fn kv(text: &str) -> Result<Vec<LinOp>, InputError> {
        parse_kv_log(text.as_bytes(), "kv.txt")
    }

    #[test]
    fn register_pairs_and_reads_fail_and_info() {
        let ops = register(
            "INFO  jepsen.util - 0\t:invoke\t:write\t3\n\
             INFO  jepsen.util - 1\t:invoke\t:cas\t[3 4]\n\
             INFO  jepsen.util - 0   :ok     :write  3\n\
             INFO  jepsen.util - 1\t:fail\t:cas\t[3 4]\n\
             INFO  jepsen.util - 2\t:invoke\t:read\tnil\n\
             INFO  jepsen.util - 2\t:fail\t:read\t:timed-out\n\
             INFO  jepsen.util - 3\t:invoke\t:write\t1\n\
             INFO  jepsen.util - 3\t:info\t:write\t:timed-out\n\
             INFO  jepsen.util - 4\t:invoke\t:read\tnil\n\
             INFO  jepsen.util - 4\t:ok\t:read\tnil\n",
        )
        .unwrap();
        assert_eq!(ops.len(), 4);
        assert_eq!(ops[0].action, Action::Write { value: "3".into() });
        assert_eq!((ops[0].invoke, ops[0].complete), (1, Some(3)));
        let cas =
            Action::Cas { expected: Some("3".into()), value: "4".into(), swapped: Some(false) };
        assert_eq!(ops[1].action, cas);
        assert_eq!(ops[2].complete, None, "an :info write is pending forever");
        assert_eq!(ops[3].action, Action::Read { result: None });
    }

    #[test]
    fn register_unfinished_invocations_stay_pending() {
        let ops = register(
            "INFO  jepsen.util - 0\t:invoke\t:cas\t[1 2]\nINFO  jepsen.util - 1\t:invoke\t:read\tnil\n",
        )
        .unwrap();
        assert_eq!(ops.len(), 1, "the unfinished read is dropped");
        assert_eq!(ops[0].complete, None);
    }

    #[test]
    fn register_errors_name_file_and_line() {
        let e = register("INFO  jepsen.util - 0\t:invoke\t:read\tnil\ngarbage\n").unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("etcd.log", 2));
        assert!(e.to_string().starts_with("etcd.log:2: not a Jepsen event line"), "{e}");
        let e = register("INFO  jepsen.util - 0\t:ok\t:read\t1\n").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.message.contains("no pending invocation"), "{e}");
        let e = register("INFO  jepsen.util - 0\t:invoke\t:write\tx\n").unwrap_err();
        assert!(e.message.contains("integer"), "{e}");
        let e = register(
            "\nINFO  jepsen.util - 0\t:invoke\t:read\tnil\nINFO  jepsen.util - 0\t:ok\t:write\t1\n",
        )
        .unwrap_err();
        assert_eq!(e.line, 3);
        assert!(e.message.contains("does not match the invocation :read of line 2"), "{e}");
    }

    #[test]
    fn kv_pairs_and_ignores_extra_entries() {
        let ops = kv("{:process 0, :type :invoke, :f :append, :key \"4\", :value \"x 0 1 y\"}\n\
             {:process 1, :type :invoke, :f :get, :key \"4\", :value nil, :time 5}\n\
             {:process 0, :type :ok, :f :append, :key \"4\", :value \"x 0 1 y\"}\n\
             {:process 1, :type :ok, :f :get, :key \"4\", :value \"a\\\"b\"}\n\
             {:process :nemesis, :type :info, :f :start, :value nil}\n")
        .unwrap();
        assert_eq!(ops.len(), 2);
        assert_eq!(ops[0].action, Action::Append { suffix: "x 0 1 y".into() });
        assert_eq!(ops[1].action, Action::Read { result: Some("a\"b".into()) });
        assert_eq!((ops[1].invoke, ops[1].complete, ops[1].key.as_str()), (2, Some(4), "4"));
    }

    #[test]
    fn kv_errors_name_file_and_line() {
        let e = kv("{:process 0, :type :invoke, :f :get, :key \"4\", :value nil}\n{:process 0")
            .unwrap_err();
        assert_eq!((e.file.as_str(), e.line), ("kv.txt", 2));
        let e = kv("{:process 0, :type :invoke, :f :frob, :key \"4\"}").unwrap_err();
        assert!(e.to_string().starts_with("kv.txt:1: bad or missing :f"), "{e}");
        let e = kv("{:process 0, :type :ok, :f :get, :key \"4\", :value \"\"}").unwrap_err();
        assert!(e.message.contains("no pending invocation"), "{e}");
    }

    #[test]
    fn edn_values() {
        assert_eq!(parse_edn_value("nil"), Ok(Edn::Nil));
        assert_eq!(parse_edn_value("[3 4]"), Ok(Edn::Vector(vec![Edn::Int(3), Edn::Int(4)])));
        assert_eq!(parse_edn_value(":timed-out"), Ok(Edn::Keyword("timed-out".into())));
        assert!(parse_edn_value("[[1]]").is_err());
        assert!(parse_edn_value("\"abc").is_err());
        assert!(parse_edn_value("1 2").is_err());
    }
}
