//! What one leader engine step costs with many requests waiting.
//!
//! A 3-node leader (its followers played by hand-made replies) holds `n` requests
//! waiting: half `replicated` writes not yet committed, half `monotonic` reads of those
//! keys waiting for a durability round. It then steps inputs that answer none of them: a
//! tick, an `any` read, one more `memory` write, and a follower's heartbeat reply. The
//! median time of each, over many steps, for `n` of 10, 1,000 and 10,000.
//!
//! `cargo bench -p keel-core --bench step` (a benchmark, not a test: it asserts nothing).

use keel_core::engine::{Engine, Input};
use keel_core::leader::{ClientRequest, Config, LeaderEngine, Message, RequestTag, Role};
use keel_core::time::Time;
use keel_types::{ClientId, Command, Durability, LogIndex, NodeId, ReadLevel, RequestId};
use std::time::Instant;

const MS: u64 = 1_000_000;

/// Node 1, leader of 3, with every entry so far acknowledged by both followers.
fn leader(now: &mut Time) -> LeaderEngine {
    let mut config = Config::new(NodeId(1), vec![NodeId(1), NodeId(2), NodeId(3)]);
    config.pending_requests_max = 20_000; // room for the 10,000 waiting and more
    let mut engine = LeaderEngine::boot(config, Default::default(), 7, *now).expect("boots");
    let mut epoch = None;
    for _ in 0..1000 {
        now.0 += 10 * MS;
        let out = engine.step(*now, Input::Tick);
        if let Some((_, Message::PreVote { epoch: e, .. })) = out.messages.first() {
            epoch = Some(*e);
            break;
        }
    }
    let epoch = epoch.expect("the election timer fired");
    let out = engine.step(*now, message(2, Message::PreVoteReply { epoch, granted: true }));
    let epoch = match out.messages.first() {
        Some((_, Message::RequestVote { epoch, .. })) => *epoch,
        other => panic!("expected a vote request, got {other:?}"),
    };
    engine.step(*now, message(2, Message::Vote { epoch, granted: true }));
    assert_eq!(engine.role_kind(), Role::Leader);
    acknowledge(&mut engine, now);
    engine
}

fn message(from: u32, message: Message) -> Input<Message, ClientRequest> {
    Input::Message { from: NodeId(from), message }
}

/// Both followers acknowledge the whole log (persisted and applied) just now, and the
/// leader's own disk has it too.
fn acknowledge(engine: &mut LeaderEngine, now: &mut Time) {
    let status = engine.status();
    let last = status.last_index;
    now.0 += 1000;
    engine.step(*now, Input::LogSynced { index: last });
    for from in [2, 3] {
        now.0 += 1000;
        let reply = Message::AppendReply {
            epoch: status.epoch,
            success: true,
            last_index: last,
            persisted_index: last,
            applied_index: last,
            match_index: last,
            released: false,
            echo_sent_at: *now,
            sent_at: *now,
        };
        engine.step(*now, message(from, reply));
    }
}

fn request(tag: u64, command: Command) -> ClientRequest {
    ClientRequest {
        tag: RequestTag(tag),
        client: ClientId(tag),
        request: RequestId(1),
        command,
        durability: None,
        level: None,
        after: keel_types::LogIndex::ZERO,
        mode: Default::default(),
        named: false,
    }
}

fn main() {
    println!("| waiting | tick | any read | memory write | heartbeat reply |");
    println!("|---:|---:|---:|---:|---:|");
    for n in [10u64, 1_000, 10_000] {
        let mut now = Time(1_000 * MS);
        let mut engine = leader(&mut now);
        let mut answered = 0;
        for i in 0..n / 2 {
            let key = format!("k{i}").into_bytes();
            let write = ClientRequest {
                durability: Some(Durability::Replicated),
                ..request(
                    1_000_000 + i,
                    Command::Put { key: key.clone().into(), value: vec![1; 16].into() },
                )
            };
            now.0 += 100;
            answered += engine.step(now, Input::Client(write)).replies.len();
            let get = Command::Get { key: key.into() };
            let read =
                ClientRequest { level: Some(ReadLevel::Monotonic), ..request(2_000_000 + i, get) };
            answered += engine.step(now, Input::Client(read)).replies.len();
        }
        let waiting = n as usize - answered;
        let steps = 2_000u64;
        let mut time =
            |engine: &mut LeaderEngine,
             make: &dyn Fn(u64, Time) -> Input<Message, ClientRequest>| {
                let mut samples = Vec::with_capacity(steps as usize);
                for i in 0..steps {
                    now.0 += 10;
                    let input = make(i, now);
                    let started = Instant::now();
                    let out = engine.step(now, input);
                    samples.push(started.elapsed().as_nanos() as u64);
                    drop(out);
                }
                samples.sort_unstable();
                samples[samples.len() / 2]
            };
        let tick = time(&mut engine, &|_, _| Input::Tick);
        let read = time(&mut engine, &|i, _| {
            let get = Command::Get { key: b"k0".to_vec().into() };
            Input::Client(ClientRequest {
                level: Some(ReadLevel::Any),
                ..request(3_000_000 + i, get)
            })
        });
        let write = time(&mut engine, &|i, _| {
            let put = Command::Put {
                key: format!("w{i}").into_bytes().into(),
                value: vec![2; 16].into(),
            };
            Input::Client(ClientRequest {
                durability: Some(Durability::Memory),
                ..request(4_000_000 + i, put)
            })
        });
        let epoch = engine.status().epoch;
        let heartbeat = time(&mut engine, &|_, now| {
            // The follower has the log only up to where the waiting requests began.
            let at = LogIndex(2);
            message(
                2,
                Message::AppendReply {
                    epoch,
                    success: true,
                    last_index: at,
                    persisted_index: at,
                    applied_index: at,
                    match_index: at,
                    released: false,
                    echo_sent_at: now,
                    sent_at: now,
                },
            )
        });
        let us = |ns: u64| format!("{:.1} µs", ns as f64 / 1000.0);
        println!(
            "| {n} ({waiting}) | {} | {} | {} | {} |",
            us(tick),
            us(read),
            us(write),
            us(heartbeat)
        );
    }
}
