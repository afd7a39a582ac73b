# Shell functions the benchmark scripts share for a local Keel cluster (`keel up`) reached
# through redis-cli. Sourced, not run.

poll_reply() { # port, expected reply, message on timeout, command words: until the reply is it
    local port="$1" want="$2" fail="$3"
    shift 3
    for _ in $(seq 1 300); do
        [[ "$(redis-cli -p "$port" "$@" 2>/dev/null)" == "$want" ]] && return 0
        sleep 0.1
    done
    echo "$fail" >&2
    return 1
}

wait_ping() { # port: until something there answers PING
    poll_reply "$1" PONG "no answer on port $1" PING
}

wait_write() { # port: until the cluster has a leader and takes a write
    poll_reply "$1" OK "the cluster on port $1 never took a write" SET bench:warmup 1
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
