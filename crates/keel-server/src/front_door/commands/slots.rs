//! `KEEL.SLOTS`: the steps of moving hash slots between the keyspaces of a sharded
//! cluster (`docs/operations.md`, *Moving slots*), each through the log of the
//! connection's keyspace, and `KEEL.SLOTS STATE`, what this node's replica of it applied.
//! `keel slots move` runs the steps in order; they are admin commands.

use super::super::conn::{Conn, Pending};
use super::super::dispatch::Turn;
use crate::placement::{Placement, SlotView};
use keel_types::slots::{SlotOp, SlotState};
use keel_types::{Command, CommandResult, KeyspaceId};
use keel_wire::reply::error_frame;
use keel_wire::resp::Frame;

/// Sends the step `op` to the connection's keyspace (`None`: answers `STATE`).
pub(crate) fn send(conn: &mut Conn, op: Option<SlotOp>, turn: Turn) -> Pending {
    let protocol = conn.protocol;
    let keyspaces = conn.keyspaces.clone();
    let Some(placement) = keyspaces.placement().filter(|p| p.sharded()) else {
        return Pending::ready(Frame::error("ERR KEEL.SLOTS needs a sharded cluster"), protocol);
    };
    let Some(op) = op else {
        let states = conn.node.metrics.slot_states();
        return Pending::ready(state_frame(&states), protocol);
    };
    if let Err(text) = check(placement, &keyspaces.slot_view(), conn.node.id, &op) {
        return Pending::ready(Frame::error(&text), protocol);
    }
    // Its log entries, and the refusals a leader answers forwarded requests with, decode
    // only at protocol 4 (`docs/operations.md`, *Rolling upgrade*).
    let protocols = keyspaces.node_metrics.peer_protocols();
    let older = protocols.into_iter().find(|(_, p)| *p < keel_wire::peer::SLOTS_PROTOCOL);
    if let Some((node, p)) = older {
        let text = format!(
            "ERR node {} speaks peer protocol {p}; moving slots needs {} on every member: finish the upgrade first",
            node.0,
            keel_wire::peer::SLOTS_PROTOCOL
        );
        return Pending::ready(Frame::error(&text), protocol);
    }
    let sent = conn.node.send(turn.submit(Command::Slot(op)));
    let reply = async move {
        match sent.answer().await.and_then(|reply| reply.result) {
            Ok(CommandResult::Items { items }) => Frame::Array(
                items
                    .into_iter()
                    .map(|(key, image, _)| Frame::Array(vec![Frame::Bulk(key), Frame::Bulk(image)]))
                    .collect(),
            ),
            Ok(CommandResult::Count { keys }) => Frame::Integer(keys as i64),
            Ok(CommandResult::Answer { answer: keel_types::coll::Answer::Array(list), .. }) => {
                let int = |a: keel_types::coll::Answer| match a {
                    keel_types::coll::Answer::Int(n) => Frame::Integer(n),
                    _ => Frame::Null,
                };
                Frame::Array(list.into_iter().map(int).collect())
            }
            Ok(_) => Frame::ok(),
            Err(error) => error_frame(&error),
        }
    };
    Pending::later(Box::pin(reply), protocol)
}

/// Why keyspace `id` may not take `op`, as far as the configuration tells (its engine
/// refuses steps that contradict its log): a move names another sharded keyspace; a
/// source moves slots it serves, a target slots it does not.
fn check(
    placement: &Placement,
    view: &SlotView,
    id: KeyspaceId,
    op: &SlotOp,
) -> Result<(), String> {
    let (first, last, other, importing) = match op {
        SlotOp::Import { first, last, from, .. } => (*first, *last, *from, true),
        SlotOp::Migrate { first, last, to, .. } => (*first, *last, *to, false),
        _ => return Ok(()),
    };
    let sharded = placement.groups.get(&other).is_some_and(|g| g.slots.is_some());
    if other == id || !sharded {
        return Err(format!("ERR keyspace {} is not another keyspace of the cluster", other.0));
    }
    for slot in first..=last {
        let configured = placement.owner(slot);
        if view.state(id, slot).is_none() && (configured == id) == importing {
            let whose = configured.0;
            return Err(format!(
                "ERR slot {slot} is keyspace {whose}'s: {} keyspace {} {} it",
                if importing { "a move into" } else { "a move out of" },
                id.0,
                if importing { "cannot import" } else { "cannot migrate" },
            ));
        }
    }
    Ok(())
}

/// `KEEL.SLOTS STATE`: per run of slots in the same state, `[first, last, state, other
/// keyspace or nil, keys held, move id]`.
fn state_frame(states: &crate::metrics::SlotStates) -> Frame {
    let mut runs: Vec<(u16, u16, &SlotState)> = Vec::new();
    for (slot, state) in states {
        match runs.last_mut() {
            Some((_, last, s)) if *last + 1 == *slot && *s == state => *last = *slot,
            _ => runs.push((*slot, *slot, state)),
        }
    }
    let row = |(first, last, state): (u16, u16, &SlotState)| {
        let held = match state {
            SlotState::Migrating { held, .. } => held.len(),
            _ => 0,
        };
        Frame::Array(vec![
            Frame::Integer(i64::from(first)),
            Frame::Integer(i64::from(last)),
            Frame::bulk(state.name()),
            state.other().map_or(Frame::Null, |k| Frame::Integer(i64::from(k.0))),
            Frame::Integer(held as i64),
            Frame::bulk(state.id().to_string()),
        ])
    };
    Frame::Array(runs.into_iter().map(row).collect())
}
