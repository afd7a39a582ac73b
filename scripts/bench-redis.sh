#!/usr/bin/env bash
# Side by side: redis-benchmark (50 clients, -t set,get) against the leader of a local
# 3-node Keel cluster (server defaults: writes `memory`, reads `monotonic`) and against one Redis
# server (no persistence: --save '' --appendonly no), in one run, each without
# pipelining and with `-P 16` (16 requests in flight per connection).
#
# Usage: scripts/bench-redis.sh [REQUESTS]    (default 100000 per test without pipelining)
# PIPELINES="1 16" (the default) sets the pipeline depths run; a pipelined test sends
# PIPELINED_REQUESTS (default 10 x REQUESTS), so that it lasts about as long as one
# without (at 1M requests per second, 200,000 requests last 0.2 s, and such short runs
# moved by 20% from one to the next).
# ROUNDS (default 1) repeats the whole comparison, Keel's tests then Redis's in each round
# with both servers up throughout, and ends with the medians of each test and their
# ratio: single runs on a small VM move by 15% or more from one to the next.
# Needs: redis-benchmark and redis-server (apt-get install redis-tools redis-server).
# A benchmark, not a test: it prints figures and asserts nothing.
set -euo pipefail

requests="${1:-100000}"
pipelined_requests="${PIPELINED_REQUESTS:-$((requests * 10))}"
clients=50
keel_port="${KEEL_BENCH_PORT:-27379}"
redis_port="${REDIS_BENCH_PORT:-26379}"
root="$(cd "$(dirname "$0")/.." && pwd)"
keel="${KEEL_BIN:-$root/target/release/keel}"

for tool in redis-benchmark redis-server redis-cli; do
    command -v "$tool" >/dev/null || { echo "missing $tool: apt-get install redis-tools redis-server" >&2; exit 2; }
done
if [[ ! -x "$keel" ]]; then
    (cd "$root" && cargo build --release -p keel)
fi

dir="$(mktemp -d)"
keel_pid=""
redis_pid=""
cleanup() {
    [[ -n "$keel_pid" ]] && kill -INT "$keel_pid" 2>/dev/null && wait "$keel_pid" 2>/dev/null || true
    [[ -n "$redis_pid" ]] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

# shellcheck source=scripts/cluster-lib.sh
source "$root/scripts/cluster-lib.sh"

pipelines="${PIPELINES:-1 16}"
rounds="${ROUNDS:-1}"
results="$dir/results"

bench() { # label port: each test's summary line at each depth, kept in $results
    for depth in $pipelines; do
        n="$requests"
        [[ "$depth" -gt 1 ]] && n="$pipelined_requests"
        redis-benchmark -p "$2" -c "$clients" -n "$n" -P "$depth" -t set,get -q 2>&1 \
            | tr '\r' '\n' | grep 'requests per second' | sed "s/^/$1 -P $depth /" \
            | tee -a "$results"
    done
}

"$keel" up --dir "$dir/keel" --base-port "$keel_port" >"$dir/keel-up.log" 2>&1 &
keel_pid=$!
wait_ping "$keel_port"
wait_write "$keel_port"
leader="$(leader_of "$keel_port")"
node="$leader"
if [[ "${TARGET:-leader}" == "follower" ]]; then node=$(( leader % 3 + 1 )); fi
port=$(( keel_port + node - 1 ))
redis-server --port "$redis_port" --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
redis_pid=$!
wait_ping "$redis_port"
echo "== Keel: 3 nodes on loopback, redis-benchmark against n$node (port $port; the leader is n$leader)"
echo "== Redis $(redis-server --version | sed -E 's/.*v=([0-9.]+).*/\1/'): one server (port $redis_port)"
echo "== $rounds round(s), each Keel's tests then Redis's, both servers up throughout"
for round in $(seq 1 "$rounds"); do
    bench Keel "$port"
    bench Redis "$redis_port"
done

# Medians over the rounds, and Keel / Redis of the medians.
echo "== medians of $rounds round(s) (requests per second)"
awk '
    { key = $2 " " $3 " " $4; v[$1, key, ++n[$1, key]] = $5; keys[key] = 1 }
    function median(sys, key,   i, j, t, m, a) {
        m = n[sys, key]
        for (i = 1; i <= m; i++) a[i] = v[sys, key, i]
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return (m % 2) ? a[(m + 1) / 2] : (a[m / 2] + a[m / 2 + 1]) / 2
    }
    END {
        for (key in keys) {
            k = median("Keel", key); r = median("Redis", key)
            printf "%s Keel %.0f Redis %.0f Keel/Redis %.2fx\n", key, k, r, k / r
        }
    }' "$results" | sort
