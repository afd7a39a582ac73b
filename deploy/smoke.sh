#!/usr/bin/env bash
# The compose cluster end to end, from the host: builds the image (deploy/build-image.sh),
# starts the compose file given (default deploy/compose.yaml), and checks that `keel
# status` and redis-cli reach every node. Then, for each node in turn: a write, the node
# killed with SIGKILL, a durable write and every earlier write read back through another
# node, and the node started again, serving what was written. Then the leader frozen
# (docker pause) and, apart, cut from its peers (iptables inside its network namespace,
# through nsenter), each while another node takes a durable write that it serves once
# back. Everything the run created
# (containers, network, volumes) is removed at the end, on failure and on Ctrl-C too.
#
#   deploy/smoke.sh [deploy/compose.yaml | deploy/compose.5.yaml]
set -euo pipefail
cd "$(dirname "$0")/.."
file=${1:-deploy/compose.yaml}
nodes=$(grep -c '^  keel[0-9][0-9]*:$' "$file")
project="keelsmoke$nodes"
keel=${KEEL_BIN:-target/release/keel}
dc() { docker-compose -p "$project" -f "$file" "$@"; }
cleanup() { dc down -v --remove-orphans >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if ! built=$(deploy/build-image.sh 2>&1); then
    echo "$built" >&2
    exit 1
fi
cleanup
dc up -d >/dev/null 2>&1
addrs=()
for i in $(seq 1 "$nodes"); do addrs+=(--node "127.0.0.1:$((7378 + i))"); done

# Up to 60 s for a node to say it leads and every other live node to follow it.
await_leader() {
    for _ in $(seq 1 120); do
        if "$keel" status "${addrs[@]}" 2>/dev/null | grep -q '^leader n'; then return 0; fi
        sleep 0.5
    done
    echo "no leader within 60 s" >&2
    "$keel" status "${addrs[@]}" >&2 || true
    dc logs --tail 20 >&2 || true
    return 1
}
# Up to 30 s for `redis-cli -p PORT ARGS...` to answer EXPECTED.
await_reply() {
    local expected=$1 port=$2
    shift 2
    for _ in $(seq 1 60); do
        if [ "$(redis-cli -p "$port" "$@" 2>/dev/null)" = "$expected" ]; then return 0; fi
        sleep 0.5
    done
    echo "port $port: '$*' did not answer '$expected' within 30 s" >&2
    return 1
}

await_leader
"$keel" status "${addrs[@]}"
for i in $(seq 1 "$nodes"); do
    port=$((7378 + i))
    other=$((7378 + i % nodes + 1))
    await_reply OK "$port" SET "k$i" "v$i"
    dc kill -s SIGKILL "keel$i" >/dev/null 2>&1
    await_leader
    await_reply OK "$other" SET "after$i" x DURABILITY durable
    for j in $(seq 1 "$i"); do await_reply "v$j" "$other" GET "k$j"; done
    dc start "keel$i" >/dev/null 2>&1
    await_reply "v$i" "$port" GET "k$i"
    await_reply x "$port" GET "after$i"
    echo "node $i: killed and started again; the others served meanwhile, and it kept every write"
done
# The node `keel status` names leader.
leader() { "$keel" status "${addrs[@]}" 2>/dev/null | awk '/^leader n/ { sub("n", "", $2); print $2 }'; }
subnet=$(docker network inspect -f '{{(index .IPAM.Config 0).Subnet}}' "${project}_keel")

# The leader frozen (docker pause: its clock runs on), then thawed.
await_leader
l=$(leader)
other=$((7378 + l % nodes + 1))
dc pause "keel$l" >/dev/null 2>&1
await_reply OK "$other" SET paused x DURABILITY durable
[ "$(leader)" != "$l" ] || { echo "node $l still leads while frozen" >&2; exit 1; }
dc unpause "keel$l" >/dev/null 2>&1
await_reply x "$((7378 + l))" GET paused
echo "leader $l frozen: the others elected another and took a durable write; thawed, it serves it"

# The leader cut off from every peer inside its own network namespace, then healed.
await_leader
l=$(leader)
other=$((7378 + l % nodes + 1))
pid=$(docker inspect -f '{{.State.Pid}}' "$(dc ps -q "keel$l")")
cut() { nsenter --net="/proc/$pid/ns/net" iptables "$1" INPUT -s "$subnet" -j DROP &&
    nsenter --net="/proc/$pid/ns/net" iptables "$1" OUTPUT -d "$subnet" -j DROP; }
cut -A
await_reply OK "$other" SET partitioned x DURABILITY durable
[ "$(leader)" != "$l" ] || { echo "node $l still leads while cut off" >&2; exit 1; }
cut -D
await_reply x "$((7378 + l))" GET partitioned
echo "leader $l partitioned: the others elected another and took a durable write; healed, it serves it"

"$keel" status "${addrs[@]}"
echo "compose smoke ($file): $nodes nodes, each killed with SIGKILL and restarted, the leader frozen and partitioned; no write lost"
