//! A cross-check of causal consistency by saturation (Biswas and Enea, "On the Complexity
//! of Checking Transactional Consistency", OOPSLA 2019), on the register operations of
//! small histories whose register values are unique.
//!
//! Transactions are the committed ones and the client transactions not aborted, plus an
//! initial transaction that wrote every key's absent value. Write-read (wr): the one
//! transaction that wrote the value a read returned (the initial one for an absent value);
//! session order (so): consecutive transactions of a session (a move to another data
//! center without an attach starts a new one). Causal order hb = (so ∪ wr)⁺. Commit
//! order co is hb plus, for every read of `x` in t2 from t1 and every t3 ≠ t1 writing
//! `x` with t3 hb t2, the edge t3 → t1 (Biswas and Enea's axiom for causal consistency:
//! the premise is hb, not co; saturating with co in the premise to a fixpoint is the
//! serializability axiom, which valid causal histories break). The history is causally
//! consistent iff co is acyclic. A read must also return its
//! transaction's own last earlier write of the key when there is one, and a value some
//! other transaction wrote last of that key.
//!
//! The main checker ([`super::check`]) is stricter (a read returns the last write in the
//! arbitration order, not any causally consistent one), so a history this check rejects
//! must be rejected there too.

use super::history::{CausalHistory, ClientTx, Kind, Outcome, Seen, TxId, TxOp, Update};
use super::session::{self, Event};
use super::{has_updates, kind, Violation};
use std::collections::{BTreeMap, HashMap, HashSet};

/// The most transactions (committed and client) a history may have to be checked here.
pub const TXS_MAX: usize = 200;

/// One transaction: what it wrote last per key and what it read from others.
#[derive(Default)]
struct Node<'a> {
    id: Option<TxId>,
    last_writes: BTreeMap<&'a str, &'a str>,
    reads: Vec<(&'a str, Option<&'a str>)>,
}

/// Whether [`check`] applies to `history`: at most [`TXS_MAX`] transactions, and no
/// register value set twice for one key.
pub fn applicable(history: &CausalHistory) -> bool {
    nodes(history).is_some_and(|n| n.len() <= TXS_MAX + 1) && unique_values(history)
}

/// Checks the register operations of `history` by saturation; `Ok` also when it does not
/// apply ([`applicable`]). The violation's kind is [`kind::NOT_CAUSAL`].
pub fn check(history: &CausalHistory) -> Result<(), Violation> {
    if !applicable(history) {
        return Ok(());
    }
    let Some(mut nodes) = nodes(history) else { return Ok(()) };
    internal_reads(history)?;
    let n = nodes.len();
    let index: HashMap<TxId, usize> =
        nodes.iter().enumerate().filter_map(|(i, node)| node.id.map(|id| (id, i))).collect();
    let mut writer: HashMap<(&str, &str), usize> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for (&k, &v) in &node.last_writes {
            writer.insert((k, v), i);
        }
    }
    collect_reads(history, &mut nodes, &index);
    let mut co = Bits::new(n);
    let mut reads_from = Vec::new();
    for (i, node) in nodes.iter().enumerate().skip(1) {
        co.set(0, i);
        for &(key, value) in &node.reads {
            let from = match value {
                None => 0,
                Some(v) => match writer.get(&(key, v)) {
                    Some(&w) if w != i => w,
                    _ => {
                        return Err(not_causal(format!(
                        "tx {} read {key:?} = {v:?}, which no other committed transaction wrote \
                         last",
                        name(&nodes[i])
                    )))
                    }
                },
            };
            co.set(from, i);
            reads_from.push((key, from, i));
        }
    }
    session_order(history, &index, &mut co);
    co.close();
    saturate(&nodes, &reads_from, &co)
}

/// The transactions: the initial one, the committed ones (their cluster record first),
/// then the client ones not aborted and not committed; `None` when there are too many.
fn nodes(history: &CausalHistory) -> Option<Vec<Node<'_>>> {
    let mut nodes = vec![Node::default()];
    let mut seen = HashMap::new();
    for c in &history.committed {
        seen.insert(c.id, nodes.len());
        nodes.push(node(c.id, c.writes.iter().map(|(k, u)| (k.as_str(), u))));
        if nodes.len() > TXS_MAX + 1 {
            return None;
        }
    }
    for t in &history.txs {
        if t.outcome == Outcome::Aborted || seen.contains_key(&t.id) {
            continue;
        }
        let writes = t.ops.iter().filter_map(|op| match op {
            TxOp::Update { key, update } => Some((key.as_str(), update)),
            TxOp::Read { .. } => None,
        });
        let committed = matches!(t.outcome, Outcome::Committed { .. }) && has_updates(t);
        seen.insert(t.id, nodes.len());
        nodes.push(if committed { node(t.id, writes) } else { node(t.id, std::iter::empty()) });
        if nodes.len() > TXS_MAX + 1 {
            return None;
        }
    }
    Some(nodes)
}

fn node<'a>(id: TxId, writes: impl Iterator<Item = (&'a str, &'a Update)>) -> Node<'a> {
    let mut n = Node { id: Some(id), ..Node::default() };
    for (key, update) in writes {
        if let Update::Set { value } = update {
            n.last_writes.insert(key, value);
        }
    }
    n
}

/// Whether no register value is set twice for one key (by one or two transactions).
fn unique_values(history: &CausalHistory) -> bool {
    let committed: HashSet<TxId> = history.committed.iter().map(|c| c.id).collect();
    let cluster = history.committed.iter().flat_map(|c| c.writes.iter().map(|(k, u)| (k, u)));
    let clients = history.txs.iter().filter(|t| !committed.contains(&t.id)).flat_map(|t| {
        t.ops.iter().filter_map(|op| match op {
            TxOp::Update { key, update } => Some((key, update)),
            TxOp::Read { .. } => None,
        })
    });
    let mut values = HashSet::new();
    cluster.chain(clients).all(|(key, update)| match update {
        Update::Set { value } => values.insert((key.as_str(), value.as_str())),
        _ => true,
    })
}

/// Register reads after the transaction's own write of the key return that write.
fn internal_reads(history: &CausalHistory) -> Result<(), Violation> {
    for t in history.txs.iter().filter(|t| t.outcome != Outcome::Aborted) {
        let mut own: HashMap<&str, &str> = HashMap::new();
        for op in &t.ops {
            match op {
                TxOp::Update { key, update: Update::Set { value } } => {
                    own.insert(key, value);
                }
                TxOp::Read { key, kind: Kind::Register, seen: Seen::Register { value } } => {
                    if let Some(&mine) = own.get(key.as_str()) {
                        if value.as_deref() != Some(mine) {
                            return Err(not_causal(format!(
                                "tx {} read {key:?} = {value:?} after writing {mine:?}",
                                t.id
                            )));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Each client transaction's register reads of keys it had not written before.
fn collect_reads<'a>(
    history: &'a CausalHistory,
    nodes: &mut [Node<'a>],
    index: &HashMap<TxId, usize>,
) {
    for t in history.txs.iter().filter(|t| t.outcome != Outcome::Aborted) {
        let Some(&i) = index.get(&t.id) else { continue };
        let mut written = HashSet::new();
        for op in &t.ops {
            match op {
                TxOp::Update { key, update: Update::Set { .. } } => {
                    written.insert(key.as_str());
                }
                TxOp::Read { key, kind: Kind::Register, seen: Seen::Register { value } }
                    if !written.contains(key.as_str()) =>
                {
                    nodes[i].reads.push((key, value.as_deref()));
                }
                _ => {}
            }
        }
    }
}

/// Adds session order: consecutive transactions (not aborted) of a session, unless the
/// later one is at another data center with no attach there in between.
fn session_order(history: &CausalHistory, index: &HashMap<TxId, usize>, co: &mut Bits) {
    for events in session::sessions(history).values() {
        let mut last: Option<&ClientTx> = None;
        let mut attached = None;
        for event in events {
            match *event {
                Event::Sync(s) if !s.barrier => attached = Some(s.dc),
                Event::Sync(_) => {}
                Event::Tx(t) if t.outcome == Outcome::Aborted => {}
                Event::Tx(b) => {
                    if let Some(a) = last {
                        if a.dc == b.dc || attached == Some(b.dc) {
                            if let (Some(&x), Some(&y)) = (index.get(&a.id), index.get(&b.id)) {
                                co.set(x, y);
                            }
                        }
                    }
                    last = Some(b);
                    attached = None;
                }
            }
        }
    }
}

/// Adds, for every read of `x` in t2 from t1 and every other t3 writing `x` that
/// happens before t2 (in `hb`, closed), the edge t3 → t1; then looks for a cycle.
fn saturate(
    nodes: &[Node<'_>],
    reads_from: &[(&str, usize, usize)],
    hb: &Bits,
) -> Result<(), Violation> {
    let mut writers_of: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        for &key in node.last_writes.keys() {
            writers_of.entry(key).or_default().push(i);
        }
    }
    let mut co = hb.clone();
    for &(key, from, to) in reads_from {
        for &w in writers_of.get(key).map_or(&[][..], Vec::as_slice) {
            if w != from && w != to && hb.get(w, to) && !co.get(w, from) {
                co.add_closed(w, from);
            }
        }
    }
    match (0..nodes.len()).find(|&i| co.get(i, i)) {
        None => Ok(()),
        Some(i) => Err(not_causal(format!(
            "the commit order forced by session order and reads-from has a cycle through tx {}",
            name(&nodes[i])
        ))),
    }
}

fn name(node: &Node<'_>) -> String {
    node.id.map_or("(initial)".to_string(), |id| id.to_string())
}

fn not_causal(detail: String) -> Violation {
    Violation { kind: kind::NOT_CAUSAL, detail }
}

/// A relation on `n` nodes as rows of bits.
#[derive(Clone)]
struct Bits {
    n: usize,
    words: usize,
    rows: Vec<u64>,
}

impl Bits {
    fn new(n: usize) -> Bits {
        let words = n.div_ceil(64);
        Bits { n, words, rows: vec![0; n * words] }
    }

    fn get(&self, a: usize, b: usize) -> bool {
        (self.rows[a * self.words + b / 64] >> (b % 64)) & 1 == 1
    }

    fn set(&mut self, a: usize, b: usize) {
        self.rows[a * self.words + b / 64] |= 1 << (b % 64);
    }

    /// `row[a] |= row[b]`.
    fn or_row(&mut self, a: usize, b: usize) {
        for w in 0..self.words {
            let x = self.rows[b * self.words + w];
            self.rows[a * self.words + w] |= x;
        }
    }

    /// Transitive closure (Warshall's algorithm on rows).
    fn close(&mut self) {
        for k in 0..self.n {
            for i in 0..self.n {
                if self.get(i, k) {
                    self.or_row(i, k);
                }
            }
        }
    }

    /// Adds `a → b` to a closed relation and keeps it closed.
    fn add_closed(&mut self, a: usize, b: usize) {
        for u in 0..self.n {
            if u == a || self.get(u, a) {
                self.set(u, b);
                self.or_row(u, b);
            }
        }
    }
}
