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

wait_ping() { # port
    for _ in $(seq 1 300); do
        [[ "$(redis-cli -p "$1" PING 2>/dev/null)" == "PONG" ]] && return 0
        sleep 0.1
    done
    echo "no answer on port $1" >&2
    return 1
}

wait_write() { # port: until the cluster has a leader and takes a write
    for _ in $(seq 1 300); do
        [[ "$(redis-cli -p "$1" SET bench:warmup 1 2>/dev/null)" == "OK" ]] && return 0
        sleep 0.1
    done
    echo "the cluster on port $1 never took a write" >&2
    return 1
}

pipelines="${PIPELINES:-1 16}"

bench() { # port: the summary line of each test at each depth (progress lines dropped)
    for depth in $pipelines; do
        n="$requests"
        [[ "$depth" -gt 1 ]] && n="$pipelined_requests"
        redis-benchmark -p "$1" -c "$clients" -n "$n" -P "$depth" -t set,get -q 2>&1 \
            | tr '\r' '\n' | grep 'requests per second' | sed "s/^/-P $depth /"
    done
}

"$keel" up --dir "$dir/keel" --base-port "$keel_port" >"$dir/keel-up.log" 2>&1 &
keel_pid=$!
wait_ping "$keel_port"
wait_write "$keel_port"
# Against the leader, where a client of a leader-based store sends its writes (node N
# listens on base port + N - 1); TARGET=follower aims at a follower instead.
leader="$(redis-cli -p "$keel_port" KEEL.STATUS | sed -E 's/.*"leader":([0-9]+).*/\1/')"
node="$leader"
if [[ "${TARGET:-leader}" == "follower" ]]; then node=$(( leader % 3 + 1 )); fi
port=$(( keel_port + node - 1 ))
echo "== Keel: 3 nodes on loopback, redis-benchmark against n$node (port $port; the leader is n$leader)"
bench "$port"
kill -INT "$keel_pid"; wait "$keel_pid" || true; keel_pid=""

echo "== Redis $(redis-server --version | sed -E 's/.*v=([0-9.]+).*/\1/'): one server (port $redis_port)"
redis-server --port "$redis_port" --save '' --appendonly no --dir "$dir" >"$dir/redis.log" 2>&1 &
redis_pid=$!
wait_ping "$redis_port"
bench "$redis_port"
