#!/usr/bin/env bash
# Bounded fuzzing, as CI runs it: every target of fuzz/ built with libFuzzer's coverage
# instrumentation on the stable toolchain (the same coverage passes cargo-fuzz adds, with
# debug assertions and overflow checks, but without AddressSanitizer, which needs
# nightly; the crates fuzzed forbid unsafe code), then run for FUZZ_SECONDS each on a
# scratch copy of its seed corpus with a fixed mutation seed, so that a run explores the
# same inputs each time and a crash is a change's doing. A crash fails the script and
# prints the input's path and the libFuzzer output. Longer runs, with AddressSanitizer:
# `cd fuzz && cargo +nightly fuzz run <target>` (docs/security.md, *Fuzzing*).
#
#   fuzz/smoke.sh                 # every target, FUZZ_SECONDS (default 10) each
#   FUZZ_SECONDS=60 fuzz/smoke.sh resp_request geo_message
set -euo pipefail
cd "$(dirname "$0")"
seconds="${FUZZ_SECONDS:-10}"
triple="$(rustc -vV | sed -n 's/^host: //p')"
# The flags cargo-fuzz gives rustc for libFuzzer (sanitizer coverage: 8-bit counters, the
# PC table, comparisons traced), for the fuzzed crates and their dependencies; `--target`
# keeps them off build scripts and procedural macros.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="$PWD/target/smoke"
cargo build --release --locked --bins --target "$triple"
bin="$CARGO_TARGET_DIR/$triple/release"

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(sed -n 's/^name = "\(.*\)"$/\1/p' Cargo.toml | grep -v '^keel-fuzz$')
fi
for target in "${targets[@]}"; do
  echo "-- $target (${seconds} s)"
  # A scratch copy of the corpus: what the run finds is not written into the repo.
  work="$(mktemp -d)"
  cp -r "corpus/$target/." "$work/" 2>/dev/null || true
  if ! (cd "$work" && "$bin/$target" "$work" -max_total_time="$seconds" -seed=1 \
    -rss_limit_mb=2048 -print_final_stats=1) >"$work.log" 2>&1; then
    tail -60 "$work.log"
    echo "fuzz target $target failed (its crash input is under $work)" >&2
    exit 1
  fi
  grep -E 'stat::number_of_executed_units' "$work.log" || true
  rm -rf "$work" "$work.log"
done
