//! `keel slots move|state`: moves hash slots from one keyspace of a sharded cluster to
//! another while both serve (`docs/operations.md`, *Moving slots*), by the steps of
//! `KEEL.SLOTS`, each through the log of the keyspace it changes:
//!
//! 1. the target imports the slots, the source migrates them;
//! 2. slot by slot, the source holds a batch of its keys and answers their images, the
//!    target writes them, the source deletes them (until it holds none);
//! 3. the target owns the slots, the source gives them up.
//!
//! Every step is idempotent and names the move (its id): a step asked again after a lost
//! answer changes nothing more, a late copy of an earlier move's step nothing at all, and
//! a move that stopped half way is finished by running the same command again with its
//! id. Each step is answered once durable, whatever the keyspace's default.

use crate::client_cmds::{resolve, Access, NodeAddr};
use anyhow::{bail, Context};
use keel_client::{Client, ClientError};
use keel_types::KeelError;
use keel_wire::resp::Frame;
use keel_wire::slots::SlotRanges;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `keel slots ...`.
#[derive(Debug, Clone, clap::Args)]
pub struct SlotsArgs {
    #[command(subcommand)]
    pub action: SlotsAction,
}

/// What `keel slots` does.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SlotsAction {
    /// Move slots from one keyspace to another while both serve.
    Move(MoveArgs),
    /// Show the slot states a node's replica of a keyspace applied.
    State(StateArgs),
}

/// `keel slots move`.
#[derive(Debug, Clone, clap::Args)]
pub struct MoveArgs {
    /// The slots, as ranges: `0-99,200`.
    #[arg(long)]
    pub slots: String,
    /// The keyspace that serves them now.
    #[arg(long)]
    pub from: u32,
    /// The keyspace they move to.
    #[arg(long)]
    pub to: u32,
    /// Client addresses of nodes hosting the source keyspace (one at least; repeat it).
    #[arg(long = "source", required = true, value_parser = resolve)]
    pub source: Vec<NodeAddr>,
    /// Client addresses of nodes hosting the target keyspace (one at least; repeat it).
    #[arg(long = "target", required = true, value_parser = resolve)]
    pub target: Vec<NodeAddr>,
    /// Keys moved per step.
    #[arg(long, default_value_t = 100)]
    pub batch: u32,
    /// Give up after this many seconds of failed attempts in a row.
    #[arg(long, default_value_t = 60)]
    pub wait: u64,
    /// The move's id: to finish a move that stopped half way, the id it printed
    /// (default: a new move, the clock's microseconds).
    #[arg(long)]
    pub id: Option<u64>,
    #[command(flatten)]
    access: Access,
}

/// `keel slots state`: the node and keyspace to ask.
#[derive(Debug, Clone, clap::Args)]
pub struct StateArgs {
    #[command(flatten)]
    target: crate::client_cmds::Target,
}

/// Runs `keel slots`.
pub fn slots(args: &SlotsArgs) -> ExitCode {
    crate::client_cmds::run(async {
        match &args.action {
            SlotsAction::Move(args) => move_slots(args).await,
            SlotsAction::State(args) => {
                let target = &args.target;
                let node = std::slice::from_ref(&target.node);
                let client = Client::new(target.access.config(node, target.keyspace)?);
                let frame = client.call_node(0, &[b"KEEL.SLOTS", b"STATE"]).await?;
                for row in rows(&frame) {
                    println!("{row}");
                }
                Ok(())
            }
        }
    })
}

/// `KEEL.SLOTS STATE`'s rows as text: `first-last state keyspace held n move id`.
fn rows(frame: &Frame) -> Vec<String> {
    let Frame::Array(rows) = frame else { return Vec::new() };
    let int = |f: &Frame| match f {
        Frame::Integer(n) => n.to_string(),
        _ => "-".into(),
    };
    rows.iter()
        .filter_map(|row| match row {
            Frame::Array(f) if f.len() == 6 => {
                let state = match &f[2] {
                    Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "?".into(),
                };
                let id = match &f[5] {
                    Frame::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "?".into(),
                };
                let (first, last, other, held) = (int(&f[0]), int(&f[1]), int(&f[3]), int(&f[4]));
                Some(format!("{first}-{last} {state} {other} held {held} move {id}"))
            }
            _ => None,
        })
        .collect()
}

/// One keyspace's side of a move: a client of its nodes.
struct Side {
    name: &'static str,
    client: Arc<Client>,
    wait: Duration,
}

impl Side {
    async fn open(
        name: &'static str,
        access: &Access,
        nodes: &[NodeAddr],
        keyspace: u32,
        wait: Duration,
    ) -> anyhow::Result<Side> {
        let client = Client::new(access.config(nodes, keyspace)?);
        Ok(Side { name, client, wait })
    }

    /// The highest move id the slot states of the side's keyspace name, as a node of it
    /// sees them.
    async fn last_move(&self) -> anyhow::Result<u64> {
        let (frame, _) = self.client.call(&[b"KEEL.SLOTS", b"STATE"]).await?;
        let Frame::Array(rows) = frame else { bail!("STATE answered {frame:?}") };
        let id = |row: &Frame| match row {
            Frame::Array(f) => match f.last() {
                Some(Frame::Bulk(b)) => String::from_utf8_lossy(b).parse::<u64>().ok(),
                _ => None,
            },
            _ => None,
        };
        Ok(rows.iter().filter_map(id).max().unwrap_or(0))
    }

    /// `KEEL.SLOTS words...`, asked again while the answer is lost, the keyspace has no
    /// leader, or the step must wait (`TRYAGAIN`), for at most the side's wait in a row.
    async fn step(&self, words: &[&[u8]]) -> anyhow::Result<Frame> {
        let mut all: Vec<&[u8]> = vec![b"KEEL.SLOTS"];
        all.extend_from_slice(words);
        let deadline = Instant::now() + self.wait;
        loop {
            let error = match self.client.call(&all).await {
                Ok((frame, _)) => return Ok(frame),
                Err(error) => error,
            };
            let passing = matches!(
                &error,
                ClientError::Keel(
                    KeelError::Busy(_)
                        | KeelError::NotLeader { .. }
                        | KeelError::Timeout
                        | KeelError::TryAgain(_)
                        | KeelError::Unavailable(_)
                ) | ClientError::Connection(_)
            ) || error.is_retryable();
            if !passing || Instant::now() >= deadline {
                let what = String::from_utf8_lossy(words[0]).to_lowercase();
                return Err(anyhow::Error::from(error).context(format!("{} {what}", self.name)));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Runs `keel slots move`.
async fn move_slots(args: &MoveArgs) -> anyhow::Result<()> {
    let ranges = SlotRanges::parse(&args.slots).map_err(anyhow::Error::msg)?;
    if args.from == args.to {
        bail!("--from and --to name the same keyspace");
    }
    let wait = Duration::from_secs(args.wait);
    let source = Side::open("source", &args.access, &args.source, args.from, wait).await?;
    let target = Side::open("target", &args.access, &args.target, args.to, wait).await?;
    let (from, to) = (args.from.to_string(), args.to.to_string());
    let batch = args.batch.clamp(1, keel_types::slots::SLOT_BATCH_MAX as u32).to_string();
    // Move ids increase from one move of a slot to the next: the clock's microseconds,
    // above every id either keyspace's states name, or the id given (to finish a move
    // that stopped half way). A step of a lower id than a slot's state is refused.
    let id = match args.id {
        Some(id) => id,
        None => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            let now = now.map_or(1, |d| d.as_micros() as u64);
            let last = source.last_move().await?.max(target.last_move().await?);
            now.max(last + 1)
        }
    };
    eprintln!("move {id} (to finish it if it stops, run again with --id {id})");
    let id = id.to_string();
    let mut moved = 0u64;
    let started = Instant::now();
    for &(first, last) in ranges.ranges() {
        let (a, b) = (first.to_string(), last.to_string());
        let (a, b) = (a.as_bytes(), b.as_bytes());
        target.step(&[b"IMPORT", id.as_bytes(), from.as_bytes(), a, b]).await?;
        source.step(&[b"MIGRATE", id.as_bytes(), to.as_bytes(), a, b]).await?;
        // Ordered after the migration: no key of these slots is created at the source
        // from here on, so the slots holding keys now are all there is to empty.
        let occupied = source.step(&[b"OCCUPIED", a, b]).await?;
        for slot in occupied_slots(&occupied)? {
            let words = Batch { id: id.as_bytes(), slot, count: batch.as_bytes() };
            moved += move_keys(&source, &target, words).await?;
        }
        target.step(&[b"OWN", id.as_bytes(), a, b]).await?;
        source.step(&[b"GIVE", id.as_bytes(), a, b]).await?;
        println!("slots {first}-{last}: keyspace {from} -> keyspace {to}");
    }
    let secs = started.elapsed().as_secs_f64();
    println!("moved {} slots, {moved} keys, in {secs:.1} s", ranges.count());
    Ok(())
}

/// The slots `OCCUPIED` answered (slot, count, slot, count, ...).
fn occupied_slots(frame: &Frame) -> anyhow::Result<Vec<u16>> {
    let Frame::Array(list) = frame else { bail!("OCCUPIED answered {frame:?}") };
    let mut slots = Vec::new();
    for pair in list.chunks(2) {
        match pair {
            [Frame::Integer(slot), Frame::Integer(_)] => {
                slots.push(u16::try_from(*slot).context("a slot")?);
            }
            _ => bail!("OCCUPIED answered {frame:?}"),
        }
    }
    Ok(slots)
}

/// Most bytes of images in one `FILL`.
const FILL_BYTES_MAX: usize = 4 << 20;

/// What every batch of one slot's keys names: the move, the slot, how many keys.
struct Batch<'a> {
    id: &'a [u8],
    slot: u16,
    count: &'a [u8],
}

/// Moves every key of the batch's slot from `source` to `target`, a batch at a time;
/// how many.
async fn move_keys(source: &Side, target: &Side, batch: Batch<'_>) -> anyhow::Result<u64> {
    let slot_word = batch.slot.to_string();
    let slot = slot_word.as_bytes();
    let mut moved = 0;
    loop {
        let held = source.step(&[b"HOLD", batch.id, slot, batch.count]).await?;
        let Frame::Array(items) = held else { bail!("HOLD answered {held:?}") };
        if items.is_empty() {
            return Ok(moved);
        }
        let mut pairs = Vec::with_capacity(items.len());
        for item in &items {
            match item {
                Frame::Array(pair) => match pair.as_slice() {
                    [Frame::Bulk(key), Frame::Bulk(image)] => pairs.push((key, image)),
                    _ => bail!("HOLD answered an item of another shape"),
                },
                _ => bail!("HOLD answered an item of another shape"),
            }
        }
        for chunk in chunks(&pairs) {
            let mut words: Vec<&[u8]> = vec![b"FILL", batch.id, slot];
            for (key, image) in chunk {
                words.push(key);
                words.push(image);
            }
            target.step(&words).await?;
        }
        let mut words: Vec<&[u8]> = vec![b"RELEASE", batch.id, slot];
        words.extend(pairs.iter().map(|(key, _)| key.as_ref()));
        source.step(&words).await?;
        moved += pairs.len() as u64;
    }
}

/// `pairs` in runs of at most [`FILL_BYTES_MAX`] bytes (one pair at least each).
fn chunks<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<&[(K, V)]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, (k, v)) in pairs.iter().enumerate() {
        let size = k.as_ref().len() + v.as_ref().len();
        if i > start && bytes + size > FILL_BYTES_MAX {
            out.push(&pairs[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < pairs.len() {
        out.push(&pairs[start..]);
    }
    out
}
