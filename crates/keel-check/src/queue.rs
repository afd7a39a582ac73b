//! The replicated queue's checker (`KEEL.ENQUEUE`, `KEEL.DEQUEUE`), on a history recorded
//! by clients on real time: each enqueue and dequeue with its invocation, its completion
//! and what it was told.
//!
//! A queue whose enqueues and dequeues are `durable` is a linearizable FIFO queue whose
//! elements are numbered from 1 in the order they were enqueued. Each queue is checked
//! apart, by these rules (each broken one a violation of its own kind):
//! - `queue-dequeued-twice`: two acknowledged dequeues took the same element;
//! - `queue-phantom`: a dequeue took what no enqueue that may have run put there, or took
//!   it under another sequence number than its enqueue was told;
//! - `queue-order`: a dequeue that began after another one ended took an earlier element;
//! - `queue-enqueue-order`: an enqueue that began after another one ended was told an
//!   earlier sequence number;
//! - `queue-lost`: a dequeue found the queue empty although more acknowledged enqueues
//!   had finished before it began than dequeues could have taken: those that took an
//!   element and began before it ended, and every dequeue whose outcome is unknown.
//!
//! The last rule is what makes a lost element visible: a run ends by dequeuing until the
//! queue is found empty, and that final dequeue must account for every acknowledged
//! enqueue. It is conservative (an unknown dequeue counts as having taken an element), so
//! it never blames a correct queue.
//!
//! Every rule costs O(n log n) in the operations of its queue.

use std::collections::{BTreeMap, HashMap};

/// Most violations described (all are counted).
pub const VIOLATIONS_SHOWN_MAX: usize = 5;

/// What an enqueue was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// Acknowledged at `complete_ns` with the element's sequence number.
    Ok {
        /// When the reply arrived.
        complete_ns: u64,
        /// The element's sequence number.
        seq: u64,
    },
    /// Refused: certainly not applied.
    Fail,
    /// No answer: it may or may not have been applied.
    Unknown,
}

/// One enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Enqueue {
    /// The queue.
    pub queue: String,
    /// The element (unique in the history).
    pub value: String,
    /// When it was sent.
    pub invoke_ns: u64,
    /// What it was told.
    pub outcome: Enqueued,
}

/// What a dequeue was told.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dequeued {
    /// It took the element `value` numbered `seq`.
    Took {
        /// The element's sequence number.
        seq: u64,
        /// The element.
        value: String,
    },
    /// The queue was empty.
    Empty,
    /// No answer: it may have taken an element, or not.
    Unknown,
}

/// One dequeue (a refused one, certainly not applied, is not recorded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dequeue {
    /// The queue.
    pub queue: String,
    /// When it was sent.
    pub invoke_ns: u64,
    /// When its answer arrived (for an unknown outcome: when the client gave up).
    pub complete_ns: u64,
    /// What it was told.
    pub outcome: Dequeued,
}

/// The verdict on a history of queue operations.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Queues checked.
    pub queues: usize,
    /// Enqueues.
    pub enqueues: usize,
    /// Acknowledged enqueues.
    pub enqueued: usize,
    /// Dequeues that took an element.
    pub taken: usize,
    /// Dequeues that found their queue empty.
    pub empty: usize,
    /// Dequeues whose outcome is unknown.
    pub unknown: usize,
    /// Violations found, in total.
    pub violations_total: usize,
    /// The first violations, as `kind: detail` (at most [`VIOLATIONS_SHOWN_MAX`]).
    pub violations: Vec<String>,
}

impl Report {
    /// `ok` or `violation`.
    pub fn verdict(&self) -> &'static str {
        crate::verdict(self.violations_total == 0)
    }

    fn found(&mut self, kind: &str, detail: String) {
        self.violations_total += 1;
        if self.violations.len() < VIOLATIONS_SHOWN_MAX {
            self.violations.push(format!("{kind}: {detail}"));
        }
    }
}

/// Checks every queue of the history by the rules of the module doc.
pub fn check(enqueues: &[Enqueue], dequeues: &[Dequeue]) -> Report {
    let mut by_queue: BTreeMap<&str, (Vec<&Enqueue>, Vec<&Dequeue>)> = BTreeMap::new();
    for e in enqueues {
        by_queue.entry(&e.queue).or_default().0.push(e);
    }
    for d in dequeues {
        by_queue.entry(&d.queue).or_default().1.push(d);
    }
    let mut report = Report { queues: by_queue.len(), ..Report::default() };
    for (queue, (enqueues, dequeues)) in by_queue {
        check_queue(queue, &enqueues, &dequeues, &mut report);
    }
    report
}

fn check_queue(queue: &str, enqueues: &[&Enqueue], dequeues: &[&Dequeue], report: &mut Report) {
    report.enqueues += enqueues.len();
    let acked: Vec<(u64, u64, u64)> = enqueues
        .iter()
        .filter_map(|e| match e.outcome {
            Enqueued::Ok { complete_ns, seq } => Some((e.invoke_ns, complete_ns, seq)),
            _ => None,
        })
        .collect();
    report.enqueued += acked.len();
    // Each element by its value: what its enqueue was told (`None`: no answer).
    let told: HashMap<&str, Option<u64>> = enqueues
        .iter()
        .filter_map(|e| match e.outcome {
            Enqueued::Ok { seq, .. } => Some((e.value.as_str(), Some(seq))),
            Enqueued::Unknown => Some((e.value.as_str(), None)),
            Enqueued::Fail => None,
        })
        .collect();
    let took: Vec<(u64, u64, u64, &str)> = dequeues
        .iter()
        .filter_map(|d| match &d.outcome {
            Dequeued::Took { seq, value } => {
                Some((d.invoke_ns, d.complete_ns, *seq, value.as_str()))
            }
            _ => None,
        })
        .collect();
    report.taken += took.len();
    let unknown = dequeues.iter().filter(|d| d.outcome == Dequeued::Unknown).count();
    report.unknown += unknown;

    let mut seen: HashMap<u64, &str> = HashMap::new();
    for &(_, _, seq, value) in &took {
        if let Some(first) = seen.insert(seq, value) {
            report.found(
                "queue-dequeued-twice",
                format!("{queue}: element {seq} taken twice ({first}, then {value})"),
            );
        }
        match told.get(value) {
            None => report.found("queue-phantom", format!("{queue}: {value} was never enqueued")),
            Some(Some(s)) if *s != seq => report.found(
                "queue-phantom",
                format!("{queue}: {value} taken as element {seq}, enqueued as {s}"),
            ),
            _ => {}
        }
    }

    // Real-time order: an operation that began after another ended must be told a later
    // sequence number.
    let took_times: Vec<(u64, u64, u64)> = took.iter().map(|&(i, c, s, _)| (i, c, s)).collect();
    for (earlier, later) in real_time_inversions(&took_times) {
        report.found(
            "queue-order",
            format!("{queue}: element {later} taken after element {earlier} had been"),
        );
    }
    for (earlier, later) in real_time_inversions(&acked) {
        report.found(
            "queue-enqueue-order",
            format!("{queue}: an enqueue told {later} began after one told {earlier} ended"),
        );
    }

    // Found empty: the acknowledged enqueues finished before it began, against the
    // dequeues that could have taken them.
    let mut acked_done: Vec<u64> = acked.iter().map(|&(_, c, _)| c).collect();
    acked_done.sort_unstable();
    let mut took_began: Vec<u64> = took.iter().map(|&(i, ..)| i).collect();
    took_began.sort_unstable();
    for d in dequeues.iter().filter(|d| d.outcome == Dequeued::Empty) {
        report.empty += 1;
        let before = acked_done.partition_point(|&c| c < d.invoke_ns);
        let could_take = took_began.partition_point(|&i| i <= d.complete_ns) + unknown;
        if before > could_take {
            report.found(
                "queue-lost",
                format!(
                    "{queue}: found empty with {before} acknowledged enqueues before it and {could_take} dequeues that could have taken them"
                ),
            );
        }
    }
}

/// Pairs `(earlier, later)` of sequence numbers where an operation `(invoke, complete,
/// seq)` began after another ended and yet was told a smaller number: for each such
/// operation, against the largest number finished before it began.
fn real_time_inversions(ops: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
    let mut by_end: Vec<(u64, u64)> = ops.iter().map(|&(_, c, s)| (c, s)).collect();
    by_end.sort_unstable();
    // The largest sequence number among the operations finished by each point.
    let mut max_so_far = Vec::with_capacity(by_end.len());
    let mut max = 0;
    for &(_, s) in &by_end {
        max = max.max(s);
        max_so_far.push(max);
    }
    let mut out = Vec::new();
    for &(invoke, _, seq) in ops {
        let finished = by_end.partition_point(|&(c, _)| c < invoke);
        if finished > 0 && max_so_far[finished - 1] > seq {
            out.push((max_so_far[finished - 1], seq));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enq(value: &str, invoke_ns: u64, complete_ns: u64, seq: u64) -> Enqueue {
        Enqueue {
            queue: "q".into(),
            value: value.into(),
            invoke_ns,
            outcome: Enqueued::Ok { complete_ns, seq },
        }
    }

    fn deq(invoke_ns: u64, complete_ns: u64, outcome: Dequeued) -> Dequeue {
        Dequeue { queue: "q".into(), invoke_ns, complete_ns, outcome }
    }

    fn took(seq: u64, value: &str) -> Dequeued {
        Dequeued::Took { seq, value: value.into() }
    }

    fn kinds(report: &Report) -> Vec<&str> {
        report.violations.iter().map(|v| v.split(':').next().unwrap()).collect()
    }

    fn stock() -> Vec<Enqueue> {
        vec![enq("a", 0, 10, 1), enq("b", 11, 20, 2), enq("c", 21, 30, 3)]
    }

    #[test]
    fn a_correct_history_holds_even_with_unknown_outcomes() {
        let mut enqueues = stock();
        enqueues.push(Enqueue {
            queue: "q".into(),
            value: "maybe".into(),
            invoke_ns: 31,
            outcome: Enqueued::Unknown,
        });
        let dequeues = vec![
            deq(40, 50, took(1, "a")),
            // Concurrent dequeues may complete in either order.
            deq(60, 80, took(3, "c")),
            deq(61, 70, took(2, "b")),
            deq(81, 85, took(4, "maybe")),
            deq(90, 95, Dequeued::Empty),
        ];
        let report = check(&enqueues, &dequeues);
        assert_eq!(report.verdict(), "ok", "{:?}", report.violations);
        assert_eq!((report.enqueues, report.enqueued, report.taken, report.empty), (4, 3, 4, 1));
        // An unknown dequeue may have taken the last element.
        let dequeues = vec![
            deq(40, 50, took(1, "a")),
            deq(60, 70, took(2, "b")),
            deq(71, 72, Dequeued::Unknown),
            deq(90, 95, Dequeued::Empty),
        ];
        assert_eq!(check(&stock(), &dequeues).verdict(), "ok");
    }

    #[test]
    fn each_rule_catches_its_violation() {
        let twice = vec![deq(40, 50, took(1, "a")), deq(60, 70, took(1, "a"))];
        assert_eq!(kinds(&check(&stock(), &twice)), ["queue-dequeued-twice"]);
        let renumbered = vec![deq(40, 50, took(2, "a"))];
        assert_eq!(kinds(&check(&stock(), &renumbered)), ["queue-phantom"]);
        let invented = vec![deq(40, 50, took(9, "z"))];
        assert_eq!(kinds(&check(&stock(), &invented)), ["queue-phantom"]);
        let mut refused = stock();
        refused[2].outcome = Enqueued::Fail;
        let resurrected = vec![deq(40, 50, took(3, "c"))];
        assert_eq!(kinds(&check(&refused, &resurrected)), ["queue-phantom"]);
        let reordered = vec![deq(40, 50, took(2, "b")), deq(60, 70, took(1, "a"))];
        assert_eq!(kinds(&check(&stock(), &reordered)), ["queue-order"]);
        let enqueues = vec![enq("a", 0, 10, 2), enq("b", 11, 20, 1)];
        assert_eq!(kinds(&check(&enqueues, &[])), ["queue-enqueue-order"]);
        let lost = vec![deq(40, 50, took(1, "a")), deq(60, 70, Dequeued::Empty)];
        assert_eq!(kinds(&check(&stock(), &lost)), ["queue-lost"]);
        // An empty queue seen while the enqueues were still running is no loss.
        let early = vec![deq(5, 9, Dequeued::Empty)];
        assert_eq!(check(&stock(), &early).verdict(), "ok");
    }

    #[test]
    fn queues_are_checked_apart_and_violations_are_all_counted() {
        let mut enqueues = stock();
        enqueues.push(Enqueue { queue: "r".into(), ..enq("a", 0, 10, 1) });
        let mut dequeues = vec![deq(40, 50, took(1, "a"))];
        dequeues.push(Dequeue { queue: "r".into(), ..deq(40, 50, took(1, "a")) });
        let report = check(&enqueues, &dequeues);
        assert_eq!((report.queues, report.verdict()), (2, "ok"));
        let many: Vec<Dequeue> = (0..10).map(|i| deq(40 + i, 45 + i, took(1, "a"))).collect();
        let report = check(&stock(), &many);
        assert_eq!(report.violations_total, 9);
        assert_eq!(report.violations.len(), VIOLATIONS_SHOWN_MAX);
    }
}
