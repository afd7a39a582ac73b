//! `keel repair-hard-state`: rebuilds a keyspace's damaged hard-state file, the repair a
//! node that refuses to start names (`docs/operations.md`, "Damaged hard state").
//!
//! The file held the node's epoch, vote and repair floor; nothing else on the disk
//! records the vote. [`keel_storage::Wal::rebuild_hard_state`] writes a new one with an
//! epoch past every epoch the node can have voted in (one past `--epoch`, or its log's or
//! snapshot's last epoch if later), no vote and no floor; its doc comment says why that is
//! safe when `--epoch` is the greatest epoch every other member reports.
//!
//! With `--new-disk` it writes the hard state a node must start from on a replaced or
//! wiped disk (a directory with no keel files), for the same reason.
//!
//! Exit codes: 0 rebuilt, 1 the rebuild failed (an I/O error), 2 refused (bad flags, a
//! directory that holds no keel files without `--new-disk` or some with it, or a hard
//! state that is intact).

use keel_storage::format::{
    decode_hard_state_file, parse_segment_name, parse_snapshot_name, DAMAGED_SUFFIX,
    HARD_STATE_NAME, TEMP_SUFFIX,
};
use keel_storage::FileStorage;
use keel_types::limits::EPOCH_MAX;
use keel_types::{Epoch, HardState};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// `keel repair-hard-state`.
#[derive(clap::Args)]
pub struct RepairHardStateArgs {
    /// The keyspace's directory, as the node's refusal names it: the node's `data_dir`
    /// for keyspace 0, `data_dir/keyspace-<id>` for keyspace `<id>`. Stop the node first.
    #[arg(long)]
    dir: PathBuf,
    /// For a leader (ORCA) keyspace: the greatest epoch every other member reports for
    /// this keyspace (`keel status`). For a Kite keyspace: this node's last incarnation.
    #[arg(long)]
    epoch: u64,
    /// The directory is new or empty (a replaced or wiped disk): write the hard state the
    /// node must start from, so it neither votes again in an epoch it may have voted in
    /// nor (Kite) comes back as an incarnation its peers already saw.
    #[arg(long)]
    new_disk: bool,
}

/// What the directory holds, as far as the repair cares.
struct Found {
    /// Segment, snapshot, hard-state (or its temporary) and set-aside files.
    keel_files: usize,
    /// Whether any segment or snapshot file is there (else: a Kite keyspace, or a leader
    /// keyspace that never wrote its log).
    log_or_snapshot: bool,
}

fn survey(dir: &Path) -> std::io::Result<Found> {
    let mut found = Found { keel_files: 0, log_or_snapshot: false };
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let Ok(name) = entry.file_name().into_string() else { continue };
        let data = parse_segment_name(&name).is_some() || parse_snapshot_name(&name).is_some();
        let other = name == HARD_STATE_NAME
            || name == format!("{HARD_STATE_NAME}{TEMP_SUFFIX}")
            || name.ends_with(DAMAGED_SUFFIX);
        found.keel_files += usize::from(data || other);
        found.log_or_snapshot |= data;
    }
    Ok(found)
}

fn show(hard_state: &HardState) -> String {
    let vote = hard_state.voted_for.map_or("none".to_string(), |n| format!("n{}", n.0));
    let floor = hard_state
        .repair_floor
        .map_or("none".to_string(), |f| format!("epoch {} index {}", f.epoch.0, f.index.0));
    format!("epoch {}, vote {vote}, repair floor {floor}", hard_state.epoch.0)
}

fn refuse(reason: impl std::fmt::Display) -> ExitCode {
    eprintln!("keel repair-hard-state: {reason}");
    ExitCode::from(2)
}

/// Runs `keel repair-hard-state`.
pub fn run(args: &RepairHardStateArgs) -> ExitCode {
    let dir = &args.dir;
    if args.epoch >= EPOCH_MAX {
        return refuse(format!("--epoch must be below {EPOCH_MAX}"));
    }
    if args.new_disk {
        if let Err(e) = std::fs::create_dir_all(dir) {
            return refuse(format!("cannot create {}: {e}", dir.display()));
        }
    }
    if !dir.is_dir() {
        return refuse(format!("{} is not a directory", dir.display()));
    }
    let found = match survey(dir) {
        Ok(found) => found,
        Err(e) => return refuse(format!("cannot read {}: {e}", dir.display())),
    };
    if found.keel_files == 0 && !args.new_disk {
        return refuse(format!(
            "{} holds no keel files (hard-state, log segments, snapshots): give the keyspace's \
             directory the node named (keyspace 0's is the node's data_dir, keyspace k's is \
             data_dir/keyspace-k), or --new-disk for a replaced or wiped disk",
            dir.display()
        ));
    }
    if found.keel_files > 0 && args.new_disk {
        return refuse(format!("{} holds keel files: it is not a new disk", dir.display()));
    }
    let file = dir.join(HARD_STATE_NAME);
    let damage = match std::fs::read(&file) {
        Ok(bytes) => match decode_hard_state_file(&bytes) {
            Ok(hard_state) => {
                return refuse(format!(
                    "{} is intact ({}): nothing to repair; the node starts from it as it is",
                    file.display(),
                    show(&hard_state)
                ))
            }
            Err(reason) => reason,
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "missing".to_string(),
        Err(e) => return refuse(format!("cannot read {}: {e}", file.display())),
    };
    // The server's limits for this keyspace (`keel_server::storage::storage_config`). Only
    // the log's record limit matters here (the segments are scanned with it); the
    // snapshot's limit does not, since the rebuild reads a snapshot's header alone, and
    // so it needs no keyspace's `state_bytes_max`: the largest is taken.
    // The log is read as the leader engine's (the only engine kind that keeps one: a
    // Kite keyspace's directory holds none, and reads as an empty log).
    let config = keel_server::storage::storage_config(u64::MAX);
    let rebuilt = <FileStorage>::open(dir, config)
        .and_then(|mut storage| storage.rebuild_hard_state(Epoch(args.epoch)));
    let hard_state = match rebuilt {
        Ok(hard_state) => hard_state,
        Err(e) => {
            eprintln!("keel repair-hard-state: the rebuild failed: {e}");
            return ExitCode::from(1);
        }
    };
    println!("{} was damaged ({damage}); rebuilt it: {}.", file.display(), show(&hard_state));
    if hard_state.epoch.0 > args.epoch.saturating_add(1) {
        println!(
            "The epoch is past --epoch + 1: the log or snapshot in the directory holds entries \
             of epoch {}.",
            hard_state.epoch.0
        );
    }
    println!(
        "Next: start the node. It joins with an epoch past the current leader's, which costs \
         one election; any repair floor the old file held is gone with it. See \
         docs/operations.md, \"Damaged hard state\"."
    );
    if !found.log_or_snapshot {
        println!(
            "No log or snapshot here: if this is a Kite keyspace, the node boots as incarnation \
             {}, which must be past every incarnation it had before (--epoch at least its last \
             one).",
            hard_state.epoch.0 + 1
        );
    }
    ExitCode::SUCCESS
}
