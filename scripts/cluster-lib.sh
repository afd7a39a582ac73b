# Shell functions the benchmark scripts share for a local Keel cluster (`keel up`) reached
# through redis-cli. Sourced, not run.

wait_ping() { # port: until something there answers PING
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

leader_of() { # port: prints the number (1-3) of the leader the node there reports
    local leader
    leader="$(redis-cli -p "$1" KEEL.STATUS | sed -nE 's/.*"leader":([0-9]+).*/\1/p')"
    if [[ ! "$leader" =~ ^[123]$ ]]; then
        echo "no leader in KEEL.STATUS on port $1" >&2
        return 1
    fi
    echo "$leader"
}
