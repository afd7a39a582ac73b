//! The rejoin's fence, by hand on five nodes: the three shapes in which a restarted node
//! lost an operation that completed, each with one restart, messages held back, and a
//! partition that only picks which quorum answers. Each runs with the fence (the
//! operation survives) and without it (`unsafe_unfenced_rejoin`, the rule before: it is
//! lost), so each test fails on the old rule.
//!
//! Cast: C (node 1) coordinates the round; R (node 2) restarts, its earlier incarnation's
//! reply held back on the way to C; X (node 3) is read by the rejoin and only then answers
//! C; Y and Z (nodes 4 and 5) answer the later quorum with the new R.

use super::*;
use std::cell::RefCell;
use std::rc::Rc;

const C: u32 = 1;
const R: u32 = 2;
const X: u32 = 3;
const Y: u32 = 4;
const Z: u32 = 5;

type Held = Rc<RefCell<Vec<(NodeId, NodeId, Message)>>>;

/// From now on holds back every message `pick` chooses (it waits in `held` for
/// [`release`]); the rest are delivered.
fn hold(net: &mut Net, held: &Held, pick: impl Fn(u32, u32, &Message) -> bool + 'static) {
    let keep = held.clone();
    net.drop = Box::new(move |from, to, m| {
        let picked = pick(from.0, to.0, m);
        if picked {
            keep.borrow_mut().push((from, to, m.clone()));
        }
        picked
    });
}

/// Delivers the held messages `pick` chooses, in the order they were held.
fn release(net: &mut Net, held: &Held, pick: impl Fn(u32, u32, &Message) -> bool) -> usize {
    let all = std::mem::take(&mut *held.borrow_mut());
    let (go, stay): (Vec<_>, Vec<_>) = all.into_iter().partition(|(f, t, m)| pick(f.0, t.0, m));
    *held.borrow_mut() = stay;
    let released = go.len();
    net.queue.extend(go);
    released
}

/// Whether a message crosses between the node sets `a` and `b`.
fn across(a: &[u32], b: &[u32], from: u32, to: u32) -> bool {
    (a.contains(&from) && b.contains(&to)) || (b.contains(&from) && a.contains(&to))
}

fn submit(net: &mut Net, id: u32, session: u64, op: KiteOp) -> RequestTag {
    let tag = RequestTag(net.next_tag);
    net.next_tag += 1;
    let request = KiteRequest { tag, session, op, form: Default::default(), named: None };
    net.step(id, Input::Client(request));
    tag
}

fn answer(net: &Net, tag: RequestTag) -> Option<KiteResult> {
    net.replies.iter().find(|r| r.tag == tag).map(|r| r.result.clone().expect("ok"))
}

/// R crashes and boots as incarnation 1, which rejoins. Nothing held is lost: a reply its
/// earlier incarnation sent may still arrive.
fn restart_r(net: &mut Net) {
    let mut config = net.node(R).config().clone();
    config.incarnation = 1;
    config.rejoin = true;
    net.nodes[R as usize - 1] = KiteEngine::boot(config, 77, net.now).unwrap();
    net.queue.retain(|(from, to, _)| from.0 != R && to.0 != R);
    net.step(R, Input::Tick);
    net.settle(10);
    assert!(!net.node(R).status().rejoining, "R rejoined from X, Y and Z");
}

fn net(unfenced: bool) -> Net {
    Net::new(5, |c| c.unsafe_unfenced_rejoin = unfenced)
}

/// Shape 1: a release completes on {C, R's earlier incarnation, X after the rejoin read
/// it}; then an acquire on {R, Y, Z} reads the key. Returns what it read.
fn release_then_acquire_over_the_restarted_node(unfenced: bool) -> Option<Value> {
    let mut net = net(unfenced);
    let held: Held = Rc::default();
    // The release's value reaches R only; R's acknowledgement is held on its way to C.
    hold(&mut net, &held, |from, to, m| {
        let value = from == C && to != R && matches!(m, Message::Write { .. });
        value || (from == R && to == C) || (from == C && to == R && m.kind() != "write")
    });
    let tag = submit(&mut net, C, 1, KiteOp::Release { key: k("f"), value: v("released") });
    net.settle(2);
    assert_eq!(net.node(R).local(b"f").0, Some(v("released")), "R's earlier life had it");
    // R restarts cut off from C, and rejoins from X, Y and Z, none of which has the value.
    hold(&mut net, &held, |from, to, m| {
        let value = from == C && to != R && matches!(m, Message::Write { .. });
        value || across(&[C], &[R], from, to)
    });
    restart_r(&mut net);
    // The late acknowledgement reaches C, then X receives the value and answers.
    let acked = release(&mut net, &held, |from, to, m| {
        from == R && to == C && matches!(m, Message::WriteAck { by, .. } if by.incarnation == 0)
    });
    assert!(acked >= 1, "R's earlier life acknowledged the value");
    net.settle(1);
    release(&mut net, &held, |from, to, _| from == C && to == X);
    net.settle(1);
    let completed_early = answer(&net, tag).is_some();
    assert_eq!(completed_early, unfenced, "only the old rule counts the late acknowledgement");
    // C reaches the new R again (not Y or Z): the release completes either way.
    held.borrow_mut().retain(|(from, to, _)| !across(&[C], &[R], from.0, to.0));
    hold(&mut net, &held, |from, to, _| across(&[C, X], &[Y, Z], from, to));
    net.settle(100);
    assert!(answer(&net, tag).is_some(), "the release completed");
    // A partition picks the quorum {R, Y, Z}: it must see the completed release.
    hold(&mut net, &held, |from, to, _| across(&[C, X], &[R, Y, Z], from, to));
    let read = net.call(R, 9, KiteOp::Acquire { key: k("f") });
    value_of(&read)
}

#[test]
fn a_release_completed_across_a_restart_is_seen_by_a_quorum_holding_the_restarted_node() {
    let read = release_then_acquire_over_the_restarted_node(false);
    assert_eq!(read, Some(v("released")));
}

#[test]
fn without_the_fence_the_release_is_lost_to_that_quorum() {
    assert_eq!(release_then_acquire_over_the_restarted_node(true), None);
}

/// Shape 2: an FAA is accepted on {C, R's earlier incarnation, X after the rejoin read
/// it}, so chosen under the old rule; a second FAA runs on {R, Y, Z} before the first
/// commits. Returns what each read and the counter's final value.
fn two_faas_across_a_restart(unfenced: bool) -> (Option<Value>, Option<Value>, Option<Value>) {
    let mut net = net(unfenced);
    let held: Held = Rc::default();
    hold(&mut net, &held, |from, to, m| {
        let accept = from == C && to != R && matches!(m, Message::Accept { .. });
        accept || (from == R && to == C && matches!(m, Message::Accepted { .. }))
    });
    let first = submit(&mut net, C, 1, KiteOp::Faa { key: k("n"), delta: 1 });
    net.settle(2);
    assert!(net.node(R).accepted_rmw(b"n"), "R's earlier life accepted the first FAA");
    hold(&mut net, &held, |from, to, m| {
        let accept = from == C && to != R && matches!(m, Message::Accept { .. });
        accept || across(&[C], &[R], from, to)
    });
    restart_r(&mut net);
    release(&mut net, &held, |from, to, m| {
        from == R && to == C && matches!(m, Message::Accepted { by, .. } if by.incarnation == 0)
    });
    net.settle(1);
    // X accepts after the rejoin read it; what C sends next stays on C's side.
    hold(&mut net, &held, |from, to, m| {
        let accept = from == C && to != R && to != X && matches!(m, Message::Accept { .. });
        accept || across(&[C, X], &[R, Y, Z], from, to)
    });
    release(&mut net, &held, |from, to, m| {
        from == C && to == X && matches!(m, Message::Accept { .. })
    });
    net.settle(1);
    // The second FAA, at R, over {R, Y, Z}.
    let second = net.call(R, 2, KiteOp::Faa { key: k("n"), delta: 1 });
    // Heal: the first one finishes.
    release(&mut net, &held, |_, _, _| true);
    net.drop = Box::new(|_, _, _| false);
    net.settle(200);
    let first = answer(&net, first).expect("the first FAA completed");
    let total = net.call(Y, 3, KiteOp::Acquire { key: k("n") });
    (value_of(&first), value_of(&second), value_of(&total))
}

#[test]
fn two_faas_across_a_restart_read_different_values_and_both_count() {
    let (first, second, total) = two_faas_across_a_restart(false);
    assert_eq!(total, Some(v("2")), "both FAAs counted");
    let mut reads = [first, second];
    reads.sort();
    assert_eq!(reads, [None, Some(v("1"))], "one read 0, the other 1");
}

#[test]
fn without_the_fence_two_faas_both_read_zero_and_one_is_lost() {
    assert_eq!(two_faas_across_a_restart(true), (None, None, Some(v("1"))));
}

/// Shape 3: Z misses a write; the release after it goes slow, and its slow release (the
/// delinquent set {Z}) completes on {C, R's earlier incarnation, X after the rejoin read
/// it}. Z then acquires the release on {R, Y, Z} and reads the write. Returns what the
/// read found.
fn a_delinquent_node_reads_after_an_acquire_across_a_restart(unfenced: bool) -> Option<Value> {
    let mut net = net(unfenced);
    net.drop = Box::new(|from, to, m| {
        from.0 == C && to.0 == Z && matches!(m, Message::Write { key, .. } if key == &k("x"))
    });
    net.call(C, 1, KiteOp::Write { key: k("x"), value: v("data") });
    let held: Held = Rc::default();
    let slow =
        |m: &Message| matches!(m, Message::SlowRelease { .. } | Message::SlowReleaseAck { .. });
    hold(&mut net, &held, move |from, to, m| {
        let lost =
            from == C && to == Z && matches!(m, Message::Write { key, .. } if key == &k("x"));
        lost || (from == C && to != R && slow(m)) || (from == R && to == C && slow(m))
    });
    let tag = submit(&mut net, C, 1, KiteOp::Release { key: k("f"), value: v("1") });
    net.settle(3);
    assert_eq!(net.node(C).status().counters.releases_slow, 0, "the slow release is out");
    assert!(net.node(R).status().bits.iter().any(|(n, b)| *n == NodeId(Z) && *b == Bit::Set));
    hold(&mut net, &held, move |from, to, m| {
        let lost =
            from == C && to == Z && matches!(m, Message::Write { key, .. } if key == &k("x"));
        lost || (from == C && to != R && slow(m)) || across(&[C], &[R], from, to)
    });
    restart_r(&mut net);
    release(&mut net, &held, |from, to, m| {
        from == R
            && to == C
            && matches!(m, Message::SlowReleaseAck { by, .. } if by.incarnation == 0)
    });
    net.settle(1);
    release(&mut net, &held, |from, to, m| {
        from == C && to == X && matches!(m, Message::SlowRelease { .. })
    });
    net.settle(1);
    // C reaches the new R again, and not Z: the release completes either way.
    held.borrow_mut().retain(|(from, to, _)| !across(&[C], &[R], from.0, to.0));
    hold(&mut net, &held, |from, to, _| from == C && to == Z);
    net.settle(100);
    assert!(answer(&net, tag).is_some(), "the release completed");
    // A partition picks {R, Y, Z} for Z's acquire; Z then reads x.
    hold(&mut net, &held, |from, to, _| across(&[C, X], &[R, Y, Z], from, to));
    let flag = net.call(Z, 9, KiteOp::Acquire { key: k("f") });
    assert_eq!(value_of(&flag), Some(v("1")), "Z saw the release");
    let read = net.call(Z, 9, KiteOp::Read { key: k("x") });
    value_of(&read)
}

#[test]
fn a_slow_release_completed_across_a_restart_still_names_the_delinquent_node() {
    let read = a_delinquent_node_reads_after_an_acquire_across_a_restart(false);
    assert_eq!(read, Some(v("data")));
}

#[test]
fn without_the_fence_the_delinquent_node_reads_stale_data_after_the_acquire() {
    assert_eq!(a_delinquent_node_reads_after_an_acquire_across_a_restart(true), None);
}

#[test]
fn a_late_reply_of_an_earlier_incarnation_is_refused_and_counted() {
    // R's earlier life answers a read after C has heard of its restart.
    let mut net = net(false);
    net.call(C, 1, KiteOp::Write { key: k("a"), value: v("1") });
    net.settle(2);
    let held: Held = Rc::default();
    hold(&mut net, &held, |from, to, m| from == R && to == C && m.kind() == "read-reply");
    net.call(C, 1, KiteOp::Acquire { key: k("a") });
    assert!(!held.borrow().is_empty());
    hold(&mut net, &held, |_, _, _| false);
    restart_r(&mut net);
    // C learned of the new incarnation from its state request.
    release(&mut net, &held, |_, _, _| true);
    net.settle(1);
    let c = net.node(C).status().counters;
    assert!(c.replies_stale >= 1, "the late reply was refused: {c:?}");
    assert_eq!(c.incarnations_learned, 1, "C learned of R's restart once: {c:?}");
}
