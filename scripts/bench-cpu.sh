#!/usr/bin/env bash
# CPU per operation of a local 3-node Keel cluster under redis-benchmark, for A/B
# comparisons of builds: for each round and each binary given, starts a cluster (`keel
# up`), warms it with 200,000 SETs (so that a GET finds redis-benchmark's key), runs
# REQUESTS requests of TEST (set or get) with 50 clients at pipeline depth DEPTH against
# the leader, and prints the requests per second with the CPU time (user + system, from
# /proc/PID/stat) the leader, each follower (mean of the two) and all three servers spent
# per request, in microseconds.
#
# Usage: scripts/bench-cpu.sh TEST DEPTH REQUESTS ROUNDS KEEL_BIN...
#   e.g. scripts/bench-cpu.sh set 16 2000000 4 /tmp/keel-a /tmp/keel-b
# Binaries alternate within each round. CPU time per request moves less than requests per
# second between runs on a shared VM, but still by 5-10%: compare medians of rounds.
# Needs: redis-benchmark and redis-cli (apt-get install redis-tools), ss (iproute2).
# A benchmark, not a test: it prints figures and asserts nothing.
set -euo pipefail

if [[ $# -lt 5 ]]; then
    sed -n '10,11p' "$0" >&2
    exit 2
fi
test_name="$1" depth="$2" requests="$3" rounds="$4"
[[ "$test_name" == set || "$test_name" == get ]] || { echo "TEST is set or get" >&2; exit 2; }
for tool in redis-benchmark redis-cli ss; do
    command -v "$tool" >/dev/null || { echo "missing $tool" >&2; exit 2; }
done
shift 4
port_base="${KEEL_BENCH_PORT:-27379}"
# shellcheck source=scripts/cluster-lib.sh
source "$(cd "$(dirname "$0")" && pwd)/cluster-lib.sh"
hz="$(getconf CLK_TCK)"

ticks() { # pid: user + system clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat"
}

dir=""
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
    [[ -n "$dir" ]] && rm -rf "$dir"
    pid="" dir=""
}
trap cleanup EXIT

run_one() { # keel_bin
    local keel="$1" leader port rps pids=() before=() after=()
    for n in 0 1 2; do
        if [[ -n "$(ss -ltnH "sport = :$((port_base + n))")" ]]; then
            echo "port $((port_base + n)) is in use: another cluster? (KEEL_BENCH_PORT)" >&2
            exit 1
        fi
    done
    dir="$(mktemp -d)"
    "$keel" up --dir "$dir/keel" --base-port "$port_base" >"$dir/up.log" 2>&1 &
    pid=$!
    wait_write "$port_base"
    leader="$(leader_of "$port_base")"
    port=$((port_base + leader - 1))
    for n in 1 2 3; do
        pids+=("$(ss -ltnpH "sport = :$((port_base + n - 1))" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)")
    done
    redis-benchmark -p "$port" -c 50 -n 200000 -P "$depth" -t set -q >/dev/null 2>&1
    for p in "${pids[@]}"; do before+=("$(ticks "$p")"); done
    rps="$(redis-benchmark -p "$port" -c 50 -n "$requests" -P "$depth" -t "$test_name" -q 2>&1 \
        | tr '\r' '\n' | grep -o '[0-9.]* requests per second' | cut -d' ' -f1)"
    for p in "${pids[@]}"; do after+=("$(ticks "$p")"); done
    cleanup
    awk -v bin="$keel" -v rps="$rps" -v leader="$leader" -v hz="$hz" -v n="$requests" \
        -v b="${before[*]}" -v a="${after[*]}" 'BEGIN {
            split(b, x, " "); split(a, y, " ")
            for (i = 1; i <= 3; i++) { d[i] = (y[i] - x[i]) / hz * 1e6 / n; all += d[i] }
            printf "%s %s req/s leader %.3f follower %.3f all %.3f us/op\n",
                bin, rps, d[leader], (all - d[leader]) / 2, all
        }'
}

for _ in $(seq 1 "$rounds"); do
    for keel in "$@"; do
        run_one "$keel"
    done
done
