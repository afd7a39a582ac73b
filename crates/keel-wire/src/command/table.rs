//! The commands Keel runs, as Redis's `COMMAND` describes them: arity, flags and where the
//! keys are. Cluster-aware clients read it to find a request's keys (`COMMAND INFO`,
//! `COMMAND GETKEYS`); `redis-cli` reads it for hints. A test keeps it and
//! `docs/redis-compatibility.md` in step.

/// One command: Redis's `COMMAND INFO` fields that clients use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommandSpec {
    /// The name, lowercase.
    pub name: &'static str,
    /// Redis's arity: the exact word count (name included), or its negation for "at least".
    pub arity: i64,
    /// Redis's flags (`write`, `readonly`, `fast`, ...).
    pub flags: &'static [&'static str],
    /// Position of the first key (0: none), of the last (negative: from the end), and the
    /// step between keys.
    pub keys: (i64, i64, i64),
}

impl CommandSpec {
    /// The ACL categories Redis reports for it, from its flags.
    pub fn categories(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        for (flag, category) in [("readonly", "@read"), ("write", "@write"), ("admin", "@admin")] {
            if self.flags.contains(&flag) {
                out.push(category);
            }
        }
        if self.flags.contains(&"fast") {
            out.push("@fast");
        } else {
            out.push("@slow");
        }
        out
    }

    /// The keys of `words` (the name first) by [`CommandSpec::keys`]: `None` when the
    /// command has no key arguments or the words do not fit its arity.
    pub fn keys_of<'a, T>(&self, words: &'a [T]) -> Option<Vec<&'a T>> {
        let n = words.len() as i64;
        let fits = if self.arity >= 0 { n == self.arity } else { n >= -self.arity };
        let (first, last, step) = self.keys;
        if first == 0 || !fits {
            return None;
        }
        let last = if last < 0 { n + last } else { last };
        let mut keys = Vec::new();
        let mut at = first;
        while at <= last && at < n {
            keys.push(&words[at as usize]);
            at += step.max(1);
        }
        Some(keys)
    }
}

const R: &[&str] = &["readonly"];
const RF: &[&str] = &["readonly", "fast"];
const W: &[&str] = &["write"];
const WF: &[&str] = &["write", "fast"];
const WD: &[&str] = &["write", "denyoom"];
const WDF: &[&str] = &["write", "denyoom", "fast"];
const CONN: &[&str] = &["loading", "stale", "fast"];
const SLOW: &[&str] = &["loading", "stale"];
const ADMIN: &[&str] = &["admin", "noscript", "loading", "stale"];
const PUBSUB: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const SCRIPT: &[&str] = &["noscript", "skip_monitor", "may_replicate", "no_mandatory_keys"];
const SCRIPT_RO: &[&str] = &["noscript", "skip_monitor", "no_mandatory_keys", "readonly"];
const NONE: (i64, i64, i64) = (0, 0, 0);
const ONE: (i64, i64, i64) = (1, 1, 1);
const ALL: (i64, i64, i64) = (1, -1, 1);
const TWO: (i64, i64, i64) = (1, 2, 1);

const fn c(
    name: &'static str,
    arity: i64,
    flags: &'static [&'static str],
    keys: (i64, i64, i64),
) -> CommandSpec {
    CommandSpec { name, arity, flags, keys }
}

/// Every command Keel runs, by name.
pub const COMMANDS: &[CommandSpec] = &[
    c("acl", -2, SLOW, NONE),
    c("append", 3, WDF, ONE),
    c("asking", 1, CONN, NONE),
    c("auth", -2, &["noscript", "loading", "stale", "fast", "no_auth"], NONE),
    c("bitcount", -2, R, ONE),
    c("bitpos", -3, R, ONE),
    c("blmove", 6, WD, TWO),
    c("blmpop", -5, W, NONE),
    c("blpop", -3, W, (1, -2, 1)),
    c("brpop", -3, W, (1, -2, 1)),
    c("brpoplpush", 4, WD, TWO),
    c("bzmpop", -5, W, NONE),
    c("bzpopmax", -3, WF, (1, -2, 1)),
    c("bzpopmin", -3, WF, (1, -2, 1)),
    c("client", -2, SLOW, NONE),
    c("cluster", -2, SLOW, NONE),
    c("command", -1, SLOW, NONE),
    c("config", -2, ADMIN, NONE),
    c("copy", -3, WD, TWO),
    c("dbsize", 1, RF, NONE),
    c("debug", -2, ADMIN, NONE),
    c("decr", 2, WDF, ONE),
    c("decrby", 3, WDF, ONE),
    c("del", -2, W, ALL),
    c("discard", 1, CONN, NONE),
    c("dump", 2, R, ONE),
    c("echo", 2, &["fast"], NONE),
    c("eval", -3, SCRIPT, NONE),
    c("eval_ro", -3, SCRIPT_RO, NONE),
    c("evalsha", -3, SCRIPT, NONE),
    c("evalsha_ro", -3, SCRIPT_RO, NONE),
    c("exec", 1, SLOW, NONE),
    c("exists", -2, RF, ALL),
    c("expire", -3, WF, ONE),
    c("expireat", -3, WF, ONE),
    c("expiretime", 2, RF, ONE),
    c("flushall", -1, W, NONE),
    c("flushdb", -1, W, NONE),
    c("function", -2, SLOW, NONE),
    c("get", 2, RF, ONE),
    c("getbit", 3, RF, ONE),
    c("getdel", 2, WF, ONE),
    c("getex", -2, WF, ONE),
    c("getrange", 4, R, ONE),
    c("getset", 3, WDF, ONE),
    c("hdel", -3, WF, ONE),
    c("hello", -1, &["noscript", "loading", "stale", "fast", "no_auth"], NONE),
    c("hexists", 3, RF, ONE),
    c("hget", 3, RF, ONE),
    c("hgetall", 2, R, ONE),
    c("hincrby", 4, WDF, ONE),
    c("hincrbyfloat", 4, WDF, ONE),
    c("hkeys", 2, R, ONE),
    c("hlen", 2, RF, ONE),
    c("hmget", -3, RF, ONE),
    c("hmset", -4, WDF, ONE),
    c("hrandfield", -2, R, ONE),
    c("hscan", -3, R, ONE),
    c("hset", -4, WDF, ONE),
    c("hsetnx", 4, WDF, ONE),
    c("hstrlen", 3, RF, ONE),
    c("hvals", 2, R, ONE),
    c("incr", 2, WDF, ONE),
    c("incrby", 3, WDF, ONE),
    c("incrbyfloat", 3, WDF, ONE),
    c("info", -1, SLOW, NONE),
    c("keel.cas", -4, WDF, ONE),
    c("keel.dequeue", -2, WF, ONE),
    c("keel.enqueue", -3, WDF, ONE),
    c("keel.faa", 3, WDF, ONE),
    c("keel.invoke", -3, SLOW, NONE),
    c("keel.keyspaces", 1, CONN, NONE),
    c("keel.log", 3, ADMIN, NONE),
    c("keel.node", 3, ADMIN, NONE),
    c("keel.qpeek", -2, RF, ONE),
    c("keel.req", -4, SLOW, NONE),
    c("keel.scan", -3, R, NONE),
    c("keel.session", -2, SLOW, NONE),
    c("keel.slots", -2, ADMIN, NONE),
    c("keel.status", 1, CONN, NONE),
    c("keys", 2, R, NONE),
    c("lcs", -3, R, TWO),
    c("lindex", 3, R, ONE),
    c("linsert", 5, WD, ONE),
    c("llen", 2, RF, ONE),
    c("lmove", 5, WD, TWO),
    c("lmpop", -4, W, NONE),
    c("lpop", -2, WF, ONE),
    c("lpos", -3, R, ONE),
    c("lpush", -3, WDF, ONE),
    c("lpushx", -3, WDF, ONE),
    c("lrange", 4, R, ONE),
    c("lrem", 4, W, ONE),
    c("lset", 4, WD, ONE),
    c("ltrim", 4, W, ONE),
    c("memory", -2, R, NONE),
    c("mget", -2, RF, ALL),
    c("move", 3, WF, ONE),
    c("mset", -3, WD, (1, -1, 2)),
    c("msetnx", -3, WD, (1, -1, 2)),
    c("multi", 1, CONN, NONE),
    c("object", -2, SLOW, NONE),
    c("persist", 2, WF, ONE),
    c("pexpire", -3, WF, ONE),
    c("pexpireat", -3, WF, ONE),
    c("pexpiretime", 2, RF, ONE),
    c("ping", -1, &["fast"], NONE),
    c("psetex", 4, WD, ONE),
    c("psubscribe", -2, PUBSUB, NONE),
    c("pttl", 2, RF, ONE),
    c("publish", 3, &["pubsub", "loading", "stale", "fast"], NONE),
    c("pubsub", -2, SLOW, NONE),
    c("punsubscribe", -1, PUBSUB, NONE),
    c("quit", -1, CONN, NONE),
    c("randomkey", 1, R, NONE),
    c("readonly", 1, CONN, NONE),
    c("readwrite", 1, CONN, NONE),
    c("rename", 3, W, TWO),
    c("renamenx", 3, WF, TWO),
    c("restore", -4, WD, ONE),
    c("rpop", -2, WF, ONE),
    c("rpoplpush", 3, WD, TWO),
    c("rpush", -3, WDF, ONE),
    c("rpushx", -3, WDF, ONE),
    c("sadd", -3, WDF, ONE),
    c("scan", -2, R, NONE),
    c("scard", 2, RF, ONE),
    c("script", -2, SLOW, NONE),
    c("sdiff", -2, R, ALL),
    c("sdiffstore", -3, WD, ALL),
    c("select", 2, CONN, NONE),
    c("set", -3, WD, ONE),
    c("setbit", 4, WD, ONE),
    c("setex", 4, WD, ONE),
    c("setnx", 3, WDF, ONE),
    c("setrange", 4, WD, ONE),
    c("sinter", -2, R, ALL),
    c("sintercard", -3, R, NONE),
    c("sinterstore", -3, WD, ALL),
    c("sismember", 3, RF, ONE),
    c("smembers", 2, R, ONE),
    c("smismember", -3, RF, ONE),
    c("smove", 4, WF, TWO),
    c("sort", -2, WD, ONE),
    c("sort_ro", -2, R, ONE),
    c("spop", -2, WF, ONE),
    c("spublish", 3, &["pubsub", "loading", "stale", "fast"], ONE),
    c("srandmember", -2, R, ONE),
    c("srem", -3, WF, ONE),
    c("sscan", -3, R, ONE),
    c("ssubscribe", -2, PUBSUB, ALL),
    c("strlen", 2, RF, ONE),
    c("subscribe", -2, PUBSUB, NONE),
    c("substr", 4, R, ONE),
    c("sunion", -2, R, ALL),
    c("sunionstore", -3, WD, ALL),
    c("sunsubscribe", -1, PUBSUB, ALL),
    c("swapdb", 3, WF, NONE),
    c("time", 1, CONN, NONE),
    c("touch", -2, RF, ALL),
    c("ttl", 2, RF, ONE),
    c("type", 2, RF, ONE),
    c("unlink", -2, WF, ALL),
    c("unsubscribe", -1, PUBSUB, NONE),
    c("unwatch", 1, CONN, NONE),
    c("watch", -2, CONN, ALL),
    c("zadd", -4, WDF, ONE),
    c("zcard", 2, RF, ONE),
    c("zcount", 4, RF, ONE),
    c("zdiff", -3, R, NONE),
    c("zdiffstore", -4, WD, ONE),
    c("zincrby", 4, WDF, ONE),
    c("zinter", -3, R, NONE),
    c("zintercard", -3, R, NONE),
    c("zinterstore", -4, WD, ONE),
    c("zlexcount", 4, RF, ONE),
    c("zmpop", -4, W, NONE),
    c("zmscore", -3, RF, ONE),
    c("zpopmax", -2, WF, ONE),
    c("zpopmin", -2, WF, ONE),
    c("zrandmember", -2, R, ONE),
    c("zrange", -4, R, ONE),
    c("zrangebylex", -4, R, ONE),
    c("zrangebyscore", -4, R, ONE),
    c("zrangestore", -5, WD, TWO),
    c("zrank", 3, RF, ONE),
    c("zrem", -3, WF, ONE),
    c("zremrangebylex", 4, W, ONE),
    c("zremrangebyrank", 4, W, ONE),
    c("zremrangebyscore", 4, W, ONE),
    c("zrevrange", -4, R, ONE),
    c("zrevrangebylex", -4, R, ONE),
    c("zrevrangebyscore", -4, R, ONE),
    c("zrevrank", 3, RF, ONE),
    c("zscan", -3, R, ONE),
    c("zscore", 3, RF, ONE),
    c("zunion", -3, R, NONE),
    c("zunionstore", -4, WD, ONE),
];

/// The spec of the command named `name` (any case).
pub fn find(name: &[u8]) -> Option<&'static CommandSpec> {
    let lower = String::from_utf8_lossy(name).to_ascii_lowercase();
    COMMANDS.binary_search_by(|c| c.name.cmp(lower.as_str())).ok().map(|i| &COMMANDS[i])
}

#[cfg(test)]
mod tests {
    use super::{find, COMMANDS};

    #[test]
    fn the_table_is_sorted_and_finds_keys_as_redis() {
        assert!(COMMANDS.windows(2).all(|w| w[0].name < w[1].name), "sorted, no repeats");
        let words = ["MSET", "a", "1", "b", "2"];
        assert_eq!(find(b"MSET").unwrap().keys_of(&words), Some(vec![&"a", &"b"]));
        assert_eq!(find(b"get").unwrap().keys_of(&["GET", "k"]), Some(vec![&"k"]));
        assert_eq!(find(b"get").unwrap().keys_of(&["GET"]), None, "arity");
        assert_eq!(find(b"ping").unwrap().keys_of(&["PING"]), None, "no keys");
        assert_eq!(
            find(b"lcs").unwrap().keys_of(&["LCS", "a", "b", "LEN"]),
            Some(vec![&"a", &"b"])
        );
        assert!(find(b"nope").is_none());
    }
}
