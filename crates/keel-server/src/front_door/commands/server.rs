//! Connection and introspection commands: `PING`, `ECHO`, `HELLO`, `CLIENT`, `COMMAND`,
//! `CONFIG GET`, `SELECT`, `QUIT`, `INFO`, `KEEL.STATUS`, `KEEL.KEYSPACES` and `KEEL.LOG`.
//!
//! - `KEEL.STATUS`: a bulk string of JSON (the connection's keyspace's entry of the
//!   `/status` document);
//! - `KEEL.KEYSPACES`: an array of `[id, name, engine]`, one per keyspace;
//! - `KEEL.LOG <from> <count>`: up to `count` log entries from index `from`, each a bulk
//!   string of JSON (for recording which writes survived), preceded by the snapshot's
//!   last index as an integer: `[snapshot_index, entry, entry, ...]`.
//!
//! Keyspaces: a connection starts in keyspace 0; `SELECT n` moves it to keyspace `n`
//! (Redis's `-ERR DB index is out of range` if the node does not host it), and every
//! later command of the connection goes there.

use super::acl::{permitted, NOAUTH, NO_AUTHENTICATION};
use super::parse_u64;
use crate::acl::Category;
use crate::driver::{KeyspaceHandle, Keyspaces};
use crate::front_door::conn::{Conn, Pending};
use bytes::Bytes;
use keel_types::LogIndex;
use keel_wire::command::{ClientSubcommand, CommandQuery};
use keel_wire::reply::error_frame;
use keel_wire::resp::{Frame, Protocol};
use keel_wire::ClientCommand;
use std::time::Duration;

/// How long a status or log query may wait for room in the engine's queue.
pub const QUERY_WAIT: Duration = Duration::from_secs(2);
/// The server name `HELLO` and `INFO` report.
pub const SERVER_NAME: &str = "keel";

/// `KEEL.LOG <from> <count>`, for users with the admin permission.
pub(crate) fn keel_log(conn: &Conn, words: &[Bytes]) -> Pending {
    let protocol = conn.protocol;
    if let Err(refusal) = permitted(conn, Some(Category::Admin)) {
        return Pending::ready(refusal, protocol);
    }
    let (Some(from), Some(count)) =
        (words.get(1).and_then(|w| parse_u64(w)), words.get(2).and_then(|w| parse_u64(w)))
    else {
        return Pending::ready(Frame::error("ERR usage: KEEL.LOG <from> <count>"), protocol);
    };
    if words.len() != 3 {
        return Pending::ready(
            Frame::error("ERR wrong number of arguments for 'keel.log' command"),
            protocol,
        );
    }
    let node = conn.node.clone();
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    Pending::later(
        Box::pin(async move {
            match node.log(LogIndex(from), count, QUERY_WAIT).await {
                Ok(page) => log_page_frame(&page),
                Err(e) => error_frame(&e),
            }
        }),
        protocol,
    )
}

/// A page of the log as `KEEL.LOG` answers it: the snapshot's index, then the entries
/// as JSON while their JSON stays within [`crate::driver::LOG_PAGE_BYTES_MAX`] (at least
/// one). The bound is on the bytes sent: JSON writes a value's bytes as an array of
/// numbers, up to four times its size, so the driver's count of value bytes is not it.
fn log_page_frame(page: &crate::driver::LogPage) -> Frame {
    let mut items = vec![Frame::Integer(page.snapshot_index.0 as i64)];
    let mut bytes = 0usize;
    for entry in &page.entries {
        let json = entry.to_json();
        bytes += json.len();
        if bytes > crate::driver::LOG_PAGE_BYTES_MAX && items.len() > 1 {
            break;
        }
        items.push(Frame::Bulk(json.into()));
    }
    Frame::Array(items)
}

/// Connection and introspection commands.
pub(crate) fn admin(conn: &mut Conn, command: ClientCommand) -> Pending {
    let protocol = conn.protocol;
    let ready = |frame: Frame| Pending::ready(frame, protocol);
    match command {
        ClientCommand::Ping { message: None } => ready(Frame::simple("PONG")),
        ClientCommand::Ping { message: Some(m) } | ClientCommand::Echo { message: m } => {
            ready(Frame::Bulk(m))
        }
        ClientCommand::Hello { protocol: asked, client_name, auth } => {
            hello(conn, asked, client_name, auth.is_some())
        }
        ClientCommand::Status => {
            let node = conn.node.clone();
            Pending::later(Box::pin(async move { status_frame(&node).await }), protocol)
        }
        ClientCommand::Keyspaces => ready(keyspaces_frame(&conn.keyspaces)),
        ClientCommand::Info { sections } => {
            let (node, keyspaces) = (conn.node.clone(), conn.keyspaces.clone());
            let after = conn.resolved.floor(node.id);
            let reply = async move {
                let keyspace = keyspace_section(&node, after, &sections).await;
                info_frame(&node, &keyspaces, keyspace, &sections).await
            };
            Pending::later(Box::pin(reply), protocol)
        }
        ClientCommand::Client(sub) => ready(client_frame(conn, sub)),
        ClientCommand::Command(query) => ready(command_frame(query)),
        ClientCommand::DebugSleep(how_long) => Pending::later(
            Box::pin(async move {
                tokio::time::sleep(how_long).await;
                Frame::ok()
            }),
            protocol,
        ),
        ClientCommand::ConfigGet { parameters } => ready(super::settings::get(conn, &parameters)),
        ClientCommand::ConfigSet { pairs } => ready(super::settings::set(conn, pairs)),
        ClientCommand::ConfigResetStat => ready(super::settings::reset_stat(conn)),
        ClientCommand::Time => ready(time_frame()),
        ClientCommand::Select { index } => match super::databases::select(conn, index) {
            Some((ks, _)) if conn.user.as_ref().is_some_and(|u| !u.may_use(ks)) => {
                let text = format!("NOPERM this user has no permissions to use keyspace {}", ks.0);
                ready(Frame::error(&text))
            }
            Some((ks, db)) => {
                conn.node = conn.keyspaces.get(ks).expect("select found it").clone();
                conn.db = db;
                if let Some(entry) = conn.entry() {
                    entry.set_db(index);
                }
                ready(Frame::ok())
            }
            None => ready(elsewhere(conn, index)),
        },
        ClientCommand::FunctionFlush | ClientCommand::Unwatch => ready(Frame::ok()),
        ClientCommand::Quit => ready(Frame::ok()).closing(),
        data => unreachable!("data command {} reached admin", data.name()),
    }
}

/// `COMMAND` and its subcommands, from `keel_wire::command::table`.
fn command_frame(query: CommandQuery) -> Frame {
    use keel_wire::command::table::{find, CommandSpec, COMMANDS};
    let info = |spec: &CommandSpec| {
        let words = |list: Vec<&str>| Frame::Array(list.into_iter().map(Frame::simple).collect());
        let (first, last, step) = spec.keys;
        Frame::Array(vec![
            Frame::bulk(spec.name),
            Frame::Integer(spec.arity),
            words(spec.flags.to_vec()),
            Frame::Integer(first),
            Frame::Integer(last),
            Frame::Integer(step),
            words(spec.categories()),
            Frame::Array(Vec::new()),
            Frame::Array(Vec::new()),
            Frame::Array(Vec::new()),
        ])
    };
    match query {
        CommandQuery::All => Frame::Array(COMMANDS.iter().map(info).collect()),
        CommandQuery::Count => Frame::Integer(COMMANDS.len() as i64),
        CommandQuery::List => Frame::Array(COMMANDS.iter().map(|c| Frame::bulk(c.name)).collect()),
        CommandQuery::Info(names) if names.is_empty() => {
            Frame::Array(COMMANDS.iter().map(info).collect())
        }
        CommandQuery::Info(names) => {
            Frame::Array(names.iter().map(|n| find(n).map_or(Frame::NullArray, info)).collect())
        }
        CommandQuery::Docs(names) => {
            let chosen: Vec<&CommandSpec> = match names.is_empty() {
                true => COMMANDS.iter().collect(),
                false => names.iter().filter_map(|n| find(n)).collect(),
            };
            let doc = |_: &CommandSpec| Frame::Map(Vec::new());
            Frame::Map(chosen.into_iter().map(|c| (Frame::bulk(c.name), doc(c))).collect())
        }
        CommandQuery::GetKeys(words) => match find(&words[0]) {
            None => Frame::error("ERR Invalid command specified"),
            Some(spec) => match spec.keys_of(&words) {
                Some(keys) if !keys.is_empty() => {
                    Frame::Array(keys.into_iter().map(|k| Frame::Bulk(k.clone())).collect())
                }
                Some(_) | None if spec.keys.0 == 0 => {
                    Frame::error("ERR The command has no key arguments")
                }
                _ => Frame::error("ERR Invalid number of arguments specified for command"),
            },
        },
    }
}

/// `TIME`: the node's clock as `[unix seconds, microseconds]`.
pub(crate) fn time_frame() -> Frame {
    let since_epoch =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Frame::Array(vec![
        Frame::bulk(since_epoch.as_secs().to_string()),
        Frame::bulk(since_epoch.subsec_micros().to_string()),
    ])
}

/// `HELLO [protocol] [SETNAME name]`: switches the protocol, for its own reply too. With
/// `AUTH` (`with_auth`) it is refused here: `acl::hello_auth` answers it before dispatch.
fn hello(
    conn: &mut Conn,
    asked: Option<Protocol>,
    client_name: Option<Bytes>,
    with_auth: bool,
) -> Pending {
    let refusal = match with_auth {
        // No user is configured: a password cannot be checked, so it is not accepted (as
        // Redis answers AUTH when no password is set).
        true if !conn.users.required() => Some(NO_AUTHENTICATION),
        // `hello_auth` answers a plain `HELLO ... AUTH` before this (on the hashing
        // thread); one reaching here came another way (inside `KEEL.REQ`).
        true => Some("ERR HELLO with AUTH must be sent on its own"),
        false if conn.users.required() && conn.user.is_none() => Some(NOAUTH),
        false => None,
    };
    if let Some(text) = refusal {
        return Pending::ready(Frame::error(text), conn.protocol);
    }
    if let Some(asked) = asked {
        conn.protocol = asked;
        conn.outbox.set_protocol(asked);
    }
    if client_name.is_some() {
        if let Some(entry) = conn.entry() {
            entry.set_name(client_name.clone());
        }
        conn.name = client_name;
    }
    Pending::ready(hello_frame(conn), conn.protocol)
}

fn hello_frame(conn: &Conn) -> Frame {
    let pair = |k: &str, v: Frame| (Frame::bulk(k), v);
    Frame::Map(vec![
        pair("server", Frame::bulk(SERVER_NAME)),
        pair("version", Frame::bulk(env!("CARGO_PKG_VERSION"))),
        pair("proto", Frame::Integer(i64::from(conn.protocol.version()))),
        pair("id", Frame::Integer(conn.client.0 as i64)),
        pair("mode", Frame::bulk("cluster")),
        pair("role", Frame::bulk("master")),
        pair("modules", Frame::Array(Vec::new())),
    ])
}

/// Most characters of an unknown subcommand quoted back in its error.
const ERROR_NAME_CHARS_MAX: usize = 64;

fn client_frame(conn: &mut Conn, sub: ClientSubcommand) -> Frame {
    match sub {
        ClientSubcommand::SetName(name) => {
            if let Some(entry) = conn.entry() {
                entry.set_name(Some(name.clone()));
            }
            conn.name = Some(name);
            Frame::ok()
        }
        ClientSubcommand::List { ids } => {
            let text = conn.registered.as_ref().map(|(c, _)| c.list(&ids)).unwrap_or_default();
            Frame::Verbatim { format: *b"txt", text: text.into_bytes() }
        }
        ClientSubcommand::Info => {
            let text = conn.entry().map(|e| e.line() + "\n").unwrap_or_default();
            Frame::Verbatim { format: *b"txt", text: text.into_bytes() }
        }
        ClientSubcommand::Kill { filter, old_form } => {
            let me = conn.client.0;
            let killed = conn.registered.as_ref().map_or(0, |(clients, _)| clients.kill(&filter, me));
            match (old_form, killed) {
                (true, 0) => Frame::error("ERR No such client"),
                (true, _) => Frame::ok(),
                (false, n) => Frame::Integer(n as i64),
            }
        }
        ClientSubcommand::NoEvict => Frame::ok(),
        ClientSubcommand::Reply(mode) => {
            // Written only for `ON`: `dispatch::handle` silences the others.
            conn.reply = mode;
            Frame::ok()
        }
        ClientSubcommand::Other(sub) if sub == "tracking" || sub == "caching" => Frame::error(
            "ERR CLIENT TRACKING is not supported: Keel sends no invalidation messages (cache reads with LEVEL any instead)",
        ),
        ClientSubcommand::GetName => conn.name.clone().map_or(Frame::Null, Frame::Bulk),
        ClientSubcommand::Id => Frame::Integer(conn.client.0 as i64),
        ClientSubcommand::Unblock { id, error } => {
            Frame::Integer(i64::from(super::collections::unblock(id, error)))
        }
        ClientSubcommand::SetInfo { .. } => Frame::ok(),
        // Not pretended: `CLIENT LIST`, `KILL` and the rest are refused as Redis refuses
        // a subcommand it does not know.
        ClientSubcommand::Other(sub) => {
            let shown: String = sub.chars().take(ERROR_NAME_CHARS_MAX).collect();
            Frame::error(&format!("ERR unknown subcommand '{shown}'. Try CLIENT HELP."))
        }
    }
}

async fn status_frame(node: &KeyspaceHandle) -> Frame {
    match node.report(QUERY_WAIT).await {
        Ok(report) => {
            let doc = crate::http::keyspace_status(node, &report);
            Frame::Bulk(doc.to_string().into_bytes().into())
        }
        Err(e) => error_frame(&e),
    }
}

/// `KEEL.KEYSPACES`: `[id, name, engine]` per keyspace, by id.
fn keyspaces_frame(keyspaces: &Keyspaces) -> Frame {
    let rows = keyspaces.iter().map(|k| {
        Frame::Array(vec![
            Frame::Integer(i64::from(k.id.0)),
            Frame::bulk(k.name.as_bytes()),
            Frame::bulk(k.kind.name()),
        ])
    });
    Frame::Array(rows.collect())
}

/// The sections of an `INFO` reply asked for (none, `all`, `everything` or `default`: every
/// section; names Keel does not have: nothing, as Redis answers them).
/// The sections `asked` names, in their order of `sections`, each once: by name, or
/// `default` (none asked: the same), `all` or `everything` (`all` and `everything` add
/// the sections not in the default, as Redis's `commandstats`).
fn info_text(asked: &[String], sections: &[(&str, String, bool)]) -> String {
    let any = |word: &str| asked.iter().any(|a| a == word);
    let every = any("all") || any("everything");
    let default = asked.is_empty() || any("default");
    let chosen: Vec<String> = sections
        .iter()
        .filter(|(name, _, in_default)| {
            every || (default && *in_default) || any(&name.to_ascii_lowercase())
        })
        .map(|(name, body, _)| format!("# {name}\r\n{body}"))
        .collect();
    chosen.join("\r\n")
}

/// Redis's `Memory`, `CPU` and `Commandstats` sections from this process: its resident
/// memory (as `used_memory`, which in Redis is what its allocator holds), its CPU time,
/// and the keyspace's requests per engine operation.
fn process_sections(node: &KeyspaceHandle) -> (String, String, String) {
    let page = 4096u64;
    let resident = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1).and_then(|n| n.parse::<u64>().ok()))
        .map_or(0, |pages| pages * page);
    let memory = format!("used_memory:{resident}\r\nused_memory_rss:{resident}\r\n");
    let seconds = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    let usage = |who| nix::sys::resource::getrusage(who).ok();
    let (own, children) = (
        usage(nix::sys::resource::UsageWho::RUSAGE_SELF),
        usage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN),
    );
    let times = |u: Option<nix::sys::resource::Usage>| {
        u.map_or((0.0, 0.0), |u| (seconds(u.system_time()), seconds(u.user_time())))
    };
    let ((sys, user), (sys_c, user_c)) = (times(own), times(children));
    let cpu = format!(
        "used_cpu_sys:{sys:.6}\r\nused_cpu_user:{user:.6}\r\nused_cpu_sys_children:{sys_c:.6}\r\nused_cpu_user_children:{user_c:.6}\r\n"
    );
    let commandstats = node
        .metrics
        .calls_by_op()
        .into_iter()
        .map(|(op, ok, failed)| {
            format!("cmdstat_{op}:calls={},rejected_calls=0,failed_calls={failed}\r\n", ok + failed)
        })
        .collect();
    (memory, cpu, commandstats)
}

/// Redis's `Keyspace` section: `dbN:keys=K` for each database of the connection's
/// keyspace holding keys (Keel counts no expiring keys per database, so the line has no
/// `expires` or `avg_ttl`). Counted by the engine only when the section is asked for
/// (it is in the default sections, as Redis's): one count per database.
async fn keyspace_section(
    node: &KeyspaceHandle,
    after: LogIndex,
    asked: &[String],
) -> Option<String> {
    let any = |word: &str| asked.iter().any(|a| a == word);
    let wanted =
        asked.is_empty() || ["default", "all", "everything", "keyspace"].iter().any(|w| any(w));
    if !wanted || node.kind != keel_core::engine::EngineKind::Orca {
        return None;
    }
    let mut lines = String::new();
    for db in 0..super::databases::DATABASES as u8 {
        let count = keel_types::Command::Count { db };
        let (client, request) = (keel_types::ClientId(1), keel_types::RequestId(1));
        let submit = super::plain_submit(client, request, count, None, after);
        match node.send(submit).answer().await.and_then(|r| r.result) {
            Ok(keel_types::CommandResult::Count { keys }) if keys > 0 => {
                lines.push_str(&format!("db{db}:keys={keys}\r\n"));
            }
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    Some(lines)
}

/// The refusal of `SELECT index` for a keyspace this node does not host: where it is
/// served (a placed cluster), or Redis's out-of-range error.
fn elsewhere(conn: &Conn, index: u32) -> Frame {
    let id = keel_types::KeyspaceId(index);
    let Some(placement) = conn.keyspaces.placement() else {
        return keel_wire::CommandError::DbIndexOutOfRange.reply_frame();
    };
    let Some(group) = placement.groups.get(&id) else {
        return keel_wire::CommandError::DbIndexOutOfRange.reply_frame();
    };
    let at: Vec<String> = group
        .replicas
        .iter()
        .map(|n| placement.client_addr(*n).unwrap_or_else(|| format!("node {}", n.0)))
        .collect();
    Frame::error(&format!(
        "ERR keyspace {index} is not on this node: its replicas serve it at {}",
        at.join(", ")
    ))
}

async fn info_frame(
    node: &KeyspaceHandle,
    keyspaces: &Keyspaces,
    keyspace: Option<String>,
    asked: &[String],
) -> Frame {
    match node.report(QUERY_WAIT).await {
        Ok(report) => {
            let s = &report.status;
            let field = |name: &str| s.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
            let role = if s.get("role").and_then(|v| v.as_str()) == Some("leader") {
                "master"
            } else {
                "slave"
            };
            let server = format!(
                "redis_version:7.0.0\r\nkeel_version:{}\r\nkeel_node:{}\r\nkeel_keyspace:{}\r\n",
                env!("CARGO_PKG_VERSION"),
                node.node_id.0,
                node.id.0,
            );
            let replication = format!(
                "role:{role}\r\nkeel_epoch:{}\r\nkeel_leader:{}\r\nkeel_durable_index:{}\r\nkeel_applied_index:{}\r\n",
                field("epoch"),
                field("leader"),
                field("durable_index"),
                field("applied_index"),
            );
            let replication =
                format!("{replication}master_repl_offset:{}\r\n", field("applied_index"));
            let (memory, cpu, commandstats) = process_sections(node);
            let node_metrics = &keyspaces.node_metrics;
            let load =
                |n: &std::sync::atomic::AtomicU64| n.load(std::sync::atomic::Ordering::Relaxed);
            let clients = format!(
                "connected_clients:{}\r\nblocked_clients:{}\r\n",
                load(&node_metrics.connections_active),
                load(&super::collections::BLOCKED)
            );
            let calls = node.metrics.calls_by_op();
            let processed: u64 = calls.iter().map(|(_, ok, failed)| ok + failed).sum();
            let failed: u64 = calls.iter().map(|(_, _, failed)| failed).sum();
            let expired = s.pointer("/counters/keys_expired").and_then(|v| v.as_u64()).unwrap_or(0);
            let stats = format!(
                "total_commands_processed:{processed}\r\ntotal_error_replies:{failed}\r\nrejected_connections:{}\r\nexpired_keys:{expired}\r\nevicted_keys:0\r\nkeel_busy_refusals:{}\r\n",
                load(&node_metrics.connections_refused),
                load(&node.metrics.busy_refusals),
            );
            let mut sections = vec![
                ("Server", server, true),
                ("Clients", clients, true),
                ("Memory", memory, true),
                ("Stats", stats, true),
                ("Replication", replication, true),
                ("CPU", cpu, true),
                ("Cluster", super::cluster::info_section(keyspaces), true),
                ("Commandstats", commandstats, false),
            ];
            if let Some(keyspace) = keyspace {
                sections.push(("Keyspace", keyspace, true));
            }
            Frame::bulk(info_text(asked, &sections))
        }
        Err(e) => error_frame(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::{info_text, log_page_frame};
    use crate::front_door::handle;
    use crate::front_door::tests::{conn, ready_text, words};
    use keel_types::{Command, KeyspaceId};
    use keel_wire::resp::{Frame, Protocol};

    #[test]
    fn a_log_page_holds_at_most_its_cap_in_the_bytes_it_sends() {
        use keel_types::{ClientId, Durability, EntryPayload, Epoch, LogIndex, RequestId};
        let write = |index: u64| keel_types::Entry {
            epoch: Epoch(1),
            index: LogIndex(index),
            payload: EntryPayload::Write {
                client: ClientId(1),
                request: RequestId(index),
                durability: Durability::Memory,
                command: Command::Put { key: "k".into(), value: vec![200u8; 300 << 10].into() },
            },
        };
        // Six values of 300 KiB: 1.8 MiB of values, within the driver's count, but about
        // 1.2 MB of JSON each: three fit in 4 MiB.
        let entries = (1..=6).map(|i| Box::new(write(i)) as Box<_>).collect();
        let page = crate::driver::LogPage { entries, snapshot_index: LogIndex(0) };
        let Frame::Array(items) = log_page_frame(&page) else { panic!("an array") };
        assert_eq!(items.len(), 1 + 3, "the snapshot index and three entries");
        let sent: usize =
            items.iter().map(|f| keel_wire::resp::encode::to_bytes(f, Protocol::Resp2).len()).sum();
        assert!(sent <= crate::driver::LOG_PAGE_BYTES_MAX + 64, "{sent}");
        let small = (1..=3).map(|i| keel_types::Entry {
            epoch: Epoch(1),
            index: LogIndex(i),
            payload: EntryPayload::Noop,
        });
        let entries = small.map(|e| Box::new(e) as Box<_>).collect();
        let page = crate::driver::LogPage { entries, snapshot_index: LogIndex(0) };
        let Frame::Array(items) = log_page_frame(&page) else { panic!("an array") };
        assert_eq!(items.len(), 4, "small entries all go");
    }

    #[test]
    fn info_answers_the_sections_asked_for() {
        let sections = [
            ("Server", "a:1\r\n".to_string(), true),
            ("Replication", "b:2\r\n".to_string(), true),
            ("Commandstats", "c:3\r\n".to_string(), false),
        ];
        let ask = |names: &[&str]| {
            let asked: Vec<String> = names.iter().map(|n| n.to_string()).collect();
            info_text(&asked, &sections)
        };
        let every = "# Server\r\na:1\r\n\r\n# Replication\r\nb:2\r\n";
        assert_eq!(ask(&[]), every);
        assert_eq!(ask(&["replication"]), "# Replication\r\nb:2\r\n");
        assert_eq!(ask(&["server", "replication"]), every);
        assert_eq!(ask(&["keyspace"]), "", "a section Keel does not have: nothing");
        let all = format!("{every}\r\n# Commandstats\r\nc:3\r\n");
        assert_eq!(ask(&["all"]), all, "all adds the sections not in the default");
        assert_eq!(ask(&["everything"]), all);
        assert_eq!(ask(&["default"]), every);
        assert_eq!(ask(&["commandstats"]), "# Commandstats\r\nc:3\r\n");
    }

    #[tokio::test]
    async fn client_subcommands_keel_does_not_have_are_refused_not_pretended() {
        let (mut c, _rx, _resolved) = conn();
        let text = ready_text(handle(&mut c, words(&["CLIENT", "PAUSE"])).await);
        assert_eq!(text, "ERR unknown subcommand 'pause'. Try CLIENT HELP.");
        let text = ready_text(handle(&mut c, words(&["CLIENT", "UNBLOCK", "99"])).await);
        assert_eq!(text, format!("{:?}", Frame::Integer(0)), "no connection 99 is blocked");
        let tracking = ready_text(handle(&mut c, words(&["CLIENT", "TRACKING", "on"])).await);
        assert!(tracking.contains("not supported"), "{tracking}");
        let ok = ready_text(handle(&mut c, words(&["CLIENT", "SETINFO", "LIB-NAME", "x"])).await);
        assert_eq!(ok, format!("{:?}", Frame::ok()), "what client libraries send at start");
    }

    #[tokio::test]
    async fn select_moves_the_connection_to_a_hosted_keyspace_or_a_database_of_keyspace_0() {
        let (mut c, _rx, _resolved) = conn();
        assert_eq!(c.keyspace(), KeyspaceId(0));
        let text = ready_text(handle(&mut c, words(&["SELECT", "16"])).await);
        assert_eq!(text, "ERR DB index is out of range");
        assert_eq!(c.keyspace(), KeyspaceId(0));
        // No keyspace 1: database 1 of keyspace 0.
        assert_eq!(ready_text(handle(&mut c, words(&["SELECT", "1"])).await), "Simple([79, 75])");
        assert_eq!((c.keyspace(), c.db), (KeyspaceId(0), 1));
        assert_eq!(ready_text(handle(&mut c, words(&["SELECT", "2"])).await), "Simple([79, 75])");
        assert_eq!((c.keyspace(), c.db), (KeyspaceId(2), 0));
        let listed = ready_text(handle(&mut c, words(&["KEEL.KEYSPACES"])).await);
        assert!(listed.contains("Integer(2)"), "{listed}");
    }

    #[tokio::test]
    async fn hello_switches_the_protocol_for_its_own_reply() {
        let (mut c, _rx, _resolved) = conn();
        let pending = handle(&mut c, words(&["HELLO", "3"])).await;
        assert_eq!(pending.protocol, Protocol::Resp3);
        assert_eq!(c.protocol, Protocol::Resp3);
        let quit = handle(&mut c, words(&["QUIT"])).await;
        assert!(quit.close, "QUIT closes after its reply");
    }
}
