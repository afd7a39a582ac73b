//! Keel's effect executor: the one place where an engine's outputs are carried out in
//! the order the contract on `keel_core::engine::Outputs` prescribes, over the
//! `keel_storage::Storage` trait. It does no I/O of its own and knows no runtime: the
//! server runs it on real files, sockets and a storage thread; the simulator and the
//! engine's scenario tests run the same code on a simulated disk in virtual time.
//!
//! Layout:
//! - [`op`]: [`StorageOp`] (disk work), [`Completion`] (disk work done), [`DiskInput`].
//! - [`front`]: [`Front`], on the engine loop: outputs to numbered operations and what
//!   may leave now (hard state before messages, truncation clamping, snapshots).
//! - [`worker`]: [`Worker`], on the disk: operations in order, one fsync per batch.
//! - [`hold`]: [`AppendHold`], between the two in a server: appends merged for a moment,
//!   so that a worker on a thread of its own is woken once for many steps.
//! - [`replica`]: [`Replica`], the loop body every host runs (the server's engine loop and
//!   the simulator's replicas): the engine in its [`EngineCell`], the front, the hold,
//!   batches, completions; what leaves goes through the host's [`Io`].
//! - [`virtual_disk`]: [`VirtualDisk`], the worker on virtual time (simulator, tests).
//! - [`budget`]: the byte budgets a replica spends on what clients make it hold
//!   ([`ByteBudget`] for forwarded replies, [`LinkAllowance`] for client values queued to
//!   a peer).
//!
//! A driver's loop, with a simulated disk standing in for files:
//!
//! ```
//! use keel_core::engine::{Engine, Input};
//! use keel_core::leader::{Config, LeaderEngine};
//! use keel_core::time::Time;
//! use keel_exec::{Front, Worker};
//! use keel_storage::{SimStorage, Storage, StorageConfig};
//! use keel_types::NodeId;
//!
//! let mut storage = SimStorage::new_sim(StorageConfig::default());
//! let recovered = storage.recover().unwrap();
//! let persisted = keel_core::engine::PersistedState {
//!     hard_state: recovered.hard_state,
//!     snapshot: recovered.snapshot,
//!     entries: recovered.entries,
//! };
//! let config = Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)]);
//! let mut engine = LeaderEngine::boot(config, persisted, 7, Time(0)).unwrap();
//! let mut front = Front::new(4096);
//! let mut worker = Worker::new(storage);
//!
//! let out = engine.step(Time(1_000_000_000), Input::Tick); // the election timer fires
//! let effects = front.carry_out(out);
//! // Hand `effects.ops` to the worker (a thread in the server), send `effects.messages`,
//! // return `effects.replies`, free `effects.release`, tick again by `effects.wake_at`.
//! let mut completions = Vec::new();
//! worker.run(effects.ops, &mut |c| completions.push(c)).unwrap();
//! for completion in completions {
//!     let done = front.complete(completion);
//!     // Send `done.messages`, return `done.replies`, then step the engine with the input.
//!     if let Some(input) = done.input {
//!         let out = engine.step(Time(1_000_000_001), input.into_input());
//!         front.carry_out(out);
//!     }
//! }
//! assert_eq!(effects.messages.len(), 2, "pre-votes to both peers, sent at once");
//! ```

pub mod budget;
pub mod front;
pub mod hold;
pub mod op;
pub mod replica;
pub mod virtual_disk;
pub mod worker;

pub use budget::{
    ByteBudget, LinkAllowance, LinkHold, FORWARDED_REPLIES_BYTES_MAX, LINK_BULK_BYTES_MAX,
};
pub use front::{Completed, Effects, Front};
pub use hold::{AppendHold, APPEND_HOLD_ENTRIES_MAX, APPEND_HOLD_NS};
pub use op::{Completion, DiskInput, StorageOp};
pub use replica::{EngineCell, Io, Refusal, Replica};
pub use virtual_disk::VirtualDisk;
pub use worker::{Applied, Worker};
