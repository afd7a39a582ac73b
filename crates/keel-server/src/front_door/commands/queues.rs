//! The queue family: `KEEL.ENQUEUE`, `KEEL.DEQUEUE` and `KEEL.QPEEK` on the replicated
//! queues (kept under reserved keys by the engine's state machine), each mapped onto the
//! engine's commands. `KEEL.INVOKE` runs the first two as Correctables (`correctables`).

use super::result_reply;
use crate::driver::Submit;
use crate::front_door::conn::{Conn, Pending};
use crate::front_door::dispatch::Turn;
use keel_types::Command;
use keel_wire::ClientCommand;

/// Sends a queue command its [`Turn`] has come for.
pub(crate) fn send(conn: &mut Conn, command: ClientCommand, turn: Turn) -> Pending {
    let protocol = conn.protocol;
    match command {
        ClientCommand::Enqueue { queue, value, durability } => {
            let command = Command::Enqueue { queue, value };
            let sent = conn.node.send(Submit { durability, ..turn.submit(command) });
            Pending::write(sent, (result_reply, false), protocol, conn.floor())
        }
        ClientCommand::Dequeue { queue, durability } => {
            let sent =
                conn.node.send(Submit { durability, ..turn.submit(Command::Dequeue { queue }) });
            Pending::write(sent, (result_reply, false), protocol, conn.floor())
        }
        ClientCommand::QueuePeek { queue, level } => {
            let sent =
                conn.node.send(Submit { level, ..turn.submit(Command::QueuePeek { queue }) });
            Pending::engine(sent, (result_reply, false), protocol)
        }
        other => unreachable!("{} is not a queue command", other.name()),
    }
}
