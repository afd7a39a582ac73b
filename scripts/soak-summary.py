#!/usr/bin/env python3
"""Summarizes the JSON lines of `keel torture --json` (one object per schedule).

Usage: scripts/soak-summary.py FILE.jsonl [FILE.jsonl ...]

Prints, over every schedule in the files: the seeds, how many schedules held and how
many did not (each failure with its seed, verdict and counterexample), the faults by
kind, the operations checked (key-value, queue, Kite), how many schedules the Kite
checks judged, and the schedules' durations. A reading aid for docs/results; it checks
nothing itself (the verdicts are the harness's).
"""

import collections
import json
import sys


def main(paths):
    schedules = []
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    schedules.append(json.loads(line))
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{number}: not JSON: {e}")
    if not schedules:
        sys.exit("no schedules")
    seeds = sorted(s["seed"] for s in schedules)
    verdicts = collections.Counter(s.get("verdict") for s in schedules)
    faults = collections.Counter(
        f["kind"] for s in schedules for f in s.get("faults") or [] if isinstance(f, dict)
    )
    checks = [s.get("checks") or {} for s in schedules]
    kite = [s.get("kite") or {} for s in schedules]
    judged = [k for k in kite if k.get("judged")]
    elapsed = sorted(s["elapsed_s"] for s in schedules if "elapsed_s" in s)

    def total(rows, key):
        return sum(r.get(key) or 0 for r in rows)

    print(f"schedules: {len(schedules)}, seeds {seeds[0]}..{seeds[-1]}"
          f" ({len(set(seeds))} distinct)")
    print("verdicts: " + ", ".join(f"{v} {n}" for v, n in verdicts.most_common()))
    for s in schedules:
        if s.get("verdict") != "ok":
            why = str(s.get("counterexample"))[:300]
            print(f"  seed {s['seed']}: {s.get('verdict')}: {why}")
    print(f"faults: {sum(faults.values())} ("
          + ", ".join(f"{k} {n}" for k, n in sorted(faults.items())) + ")")
    print(f"key-value operations recorded: {total(schedules, 'ops')}"
          f" (ok {total(schedules, 'ok')}, failed {total(schedules, 'failed')},"
          f" unknown {total(schedules, 'unknown')})")
    print(f"monotonic reads checked: {total(checks, 'monotonic_reads')},"
          f" linearizable ops checked: {total(checks, 'linearizable_ops')},"
          f" views: {total(checks, 'views')}")
    print(f"queue: {total(checks, 'queue_enqueued')} acknowledged enqueues,"
          f" {total(checks, 'queue_taken')} taken")
    print(f"kite: {total(kite, 'ops')} operations; judged in {len(judged)} schedules"
          f" ({total(judged, 'pairs')} message-passing pairs, {total(judged, 'faas')} FAAs,"
          f" {total(judged, 'swaps')} CAS swaps)")
    if elapsed:
        middle = elapsed[len(elapsed) // 2]
        print(f"elapsed per schedule: min {elapsed[0]} s, median {middle} s,"
              f" max {elapsed[-1]} s, total {sum(elapsed) / 60:.1f} min")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
