#!/usr/bin/env bash
# Runs unit files of Redis's own TCL test suite, unmodified, in its external-server mode
# (`--host/--port`) against a fresh local Keel cluster per unit, and prints per unit how
# many tests passed, failed and were skipped.
#
# Usage: scripts/redis-suite.sh [--out DIR] REDIS_SRC [UNIT...]
#   REDIS_SRC  an unpacked Redis 7.0.15 source tree (only tests/ is read; it is copied to
#              a scratch dir and run from there, so the tree itself is never written to)
#   UNIT       unit names under tests/unit/ (default: type/string type/incr keyspace
#              multi expire protocol info-command)
#   --out DIR  results: DIR/<unit>.log (the suite's whole output), DIR/<unit>.keel.log
#              (`keel up`'s), DIR/<unit>.nodes/ (the nodes' logs), DIR/failures.txt
#              (unit<TAB>test<TAB>error line, one a line), DIR/summary.txt (the table),
#              DIR/commands.txt (command names the unit files send, by a rough grep,
#              with counts). Default: a fresh temporary dir.
# Environment:
#   KEEL_BIN        keel binary (default target/release/keel)
#   KEEL_BASE_PORT  `keel up --base-port` (default 17379; uses BASE..BASE+2, +100.., +200..;
#                   keep it below 32768 and away from 21079..21110, the suite's own port)
#   KEEL_UP_ARGS    extra `keel up` flags, word-split (e.g. "--keyspaces 11": the units
#                   SELECT databases 0, 1, 5, 9 and 10)
#   UNIT_TIMEOUT    wall-clock limit of one unit in seconds (default 600)
#   SUITE_TIMEOUT   the suite's --timeout: seconds without progress before it gives up
#                   (default 120)
#   SUITE_ARGS      extra test_helper.tcl flags, word-split (e.g. "--durable" to turn an
#                   error inside a test into a failed test instead of aborting the unit)
# Counting: `[ok]` lines pass; `[err]` and `[exception]` lines fail, and so does a unit
# that ends without the suite's "The End" for any other reason (timeout, crash): one
# failure more; `[skip]` and `[ignore]` (tests excluded by tag) are skipped. An
# `[exception]` aborts the rest of its unit, so "status" tells whether the unit ran to its
# end; percent is passed / (passed + failed) of what ran.
# Needs: tclsh (apt-get install tcl), redis-cli (apt-get install redis-tools), perl.
# The Redis tree (Debian bookworm's `redis` source package is upstream 7.0.15), once:
#   deb-src line for bookworm in /etc/apt/sources.list.d/, apt-get update, then
#   apt-get source --download-only redis   # redis_7.0.15.orig.tar.gz, pristine upstream
#   mkdir -p /work/redis-7.0.15 && tar xzf redis_7.0.15.orig.tar.gz -C /work/redis-7.0.15 --strip-components=1
set -euo pipefail

default_units=(type/string type/incr keyspace multi expire protocol info-command)
root="$(cd "$(dirname "$0")/.." && pwd)"
keel="${KEEL_BIN:-$root/target/release/keel}"
base_port="${KEEL_BASE_PORT:-17379}"
unit_timeout="${UNIT_TIMEOUT:-600}"
suite_timeout="${SUITE_TIMEOUT:-120}"
read -r -a keel_up_args <<<"${KEEL_UP_ARGS:-}"
read -r -a suite_args <<<"${SUITE_ARGS:-}"

usage() { sed -n '6,36p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "redis-suite: $*" >&2; exit 2; }

out=""
positional=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        --out) [[ $# -ge 2 ]] || usage; out="$2"; shift 2 ;;
        --out=*) out="${1#--out=}"; shift ;;
        -h|--help) usage ;;
        -*) die "unknown option $1 (see --help)" ;;
        *) positional+=("$1"); shift ;;
    esac
done
[[ ${#positional[@]} -ge 1 ]] || usage
redis_src="${positional[0]}"
units=("${positional[@]:1}")
[[ ${#units[@]} -gt 0 ]] || units=("${default_units[@]}")

# --- checks: nothing is fetched or built here --------------------------------------
[[ -d "$redis_src" ]] || die "no Redis source tree at '$redis_src' (unpack redis-7.0.15 there; see the header)"
redis_src="$(cd "$redis_src" && pwd)"
[[ -f "$redis_src/tests/test_helper.tcl" ]] \
    || die "'$redis_src' has no tests/test_helper.tcl: not a Redis source tree"
if [[ -f "$redis_src/src/version.h" ]] && ! grep -q '"7\.0\.15"' "$redis_src/src/version.h"; then
    echo "redis-suite: warning: $redis_src is not Redis 7.0.15 ($(grep -o '"[0-9.]*"' "$redis_src/src/version.h"))" >&2
fi
for u in "${units[@]}"; do
    [[ -f "$redis_src/tests/unit/$u.tcl" ]] || die "no unit '$u' ($redis_src/tests/unit/$u.tcl missing)"
done
[[ -e "$keel" ]] || die "no keel binary at $keel (cargo build --release -p keel, or set KEEL_BIN)"
[[ -x "$keel" ]] || die "$keel is not executable"
for tool in tclsh redis-cli perl timeout setsid; do
    command -v "$tool" >/dev/null || die "missing $tool (apt-get install tcl redis-tools)"
done
if ! [[ "$base_port" =~ ^[0-9]+$ ]] || (( base_port < 1024 || base_port + 400 >= 32768 )); then
    die "KEEL_BASE_PORT=$base_port: want 1024..32367 (below the ephemeral range)"
fi
if (( base_port + 400 > 21079 && base_port < 21111 )); then
    die "KEEL_BASE_PORT=$base_port overlaps the suite's own ports 21079..21110"
fi
client_port="$base_port"

if [[ -z "$out" ]]; then
    out="$(mktemp -d /tmp/redis-suite.XXXXXX)"
fi
mkdir -p "$out"
out="$(cd "$out" && pwd)"
: >"$out/failures.txt"

scratch="$(mktemp -d /tmp/redis-suite-run.XXXXXX)"
keel_pid=""
suite_pid=""

stop_cluster() {
    [[ -n "$keel_pid" ]] || return 0
    # keel up runs in its own session (setsid): its pid is the process group of it and
    # of every node it started. SIGINT to keel up first (it stops its nodes, as on
    # Ctrl-C), then KILL whatever of the group is left after 10 s.
    kill -INT "$keel_pid" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 -- "-$keel_pid" 2>/dev/null || break
        sleep 0.1
    done
    kill -KILL -- "-$keel_pid" 2>/dev/null || true
    wait "$keel_pid" 2>/dev/null || true
    keel_pid=""
}
stop_suite() {
    [[ -n "$suite_pid" ]] || return 0
    # `timeout` puts itself and the suite (its test server and test client) in a group.
    kill -TERM -- "-$suite_pid" 2>/dev/null || true
    sleep 0.5
    kill -KILL -- "-$suite_pid" 2>/dev/null || true
    wait "$suite_pid" 2>/dev/null || true
    suite_pid=""
}
cleanup() {
    stop_suite
    stop_cluster
    rm -rf "$scratch"
}
trap cleanup EXIT
trap 'echo "redis-suite: interrupted" >&2; exit 130' INT TERM HUP

# The binary is copied first, so that a rebuild during the run changes nothing.
cp "$keel" "$scratch/keel-bin"
keel_src="$keel"
keel="$scratch/keel-bin"

# The suite runs from a scratch copy of tests/ (it writes tests/tmp), with src/redis-cli
# and src/redis-benchmark, which a few units call, pointing at the installed ones.
cp -a "$redis_src/tests" "$scratch/tests"
mkdir -p "$scratch/src"
for tool in redis-cli redis-benchmark; do
    if command -v "$tool" >/dev/null; then ln -s "$(command -v "$tool")" "$scratch/src/$tool"; fi
done

start_cluster() { # log: a fresh cluster; sets keel_pid and client_port (its leader's)
    local log="$1" dir="$scratch/cluster"
    rm -rf "$dir"
    if redis-cli -p "$base_port" PING >/dev/null 2>&1; then
        echo "something already answers on port $base_port (set KEEL_BASE_PORT)" >&2
        return 1
    fi
    setsid "$keel" up --dir "$dir" --base-port "$base_port" "${keel_up_args[@]}" >"$log" 2>&1 &
    keel_pid=$!
    local pong="" line="" n leader
    for _ in $(seq 1 600); do
        kill -0 "$keel_pid" 2>/dev/null || { echo "keel up exited: $(tail -3 "$log")" >&2; return 1; }
        pong="$(redis-cli -p "$base_port" PING 2>/dev/null || true)"
        [[ "$pong" == PONG ]] && break
        sleep 0.1
    done
    [[ "$pong" == PONG ]] || { echo "no PONG on port $base_port after 60 s" >&2; return 1; }
    # `keel up` prints the leader once it has one: aim the suite at the leader of
    # keyspace 9 (the suite's database) when the cluster hosts it, else of keyspace 0.
    for _ in $(seq 1 600); do
        line="$(grep -m1 -E 'cluster up, leader n[0-9]|no leader yet|keyspace 9: leader n[0-9]' "$log" || true)"
        n="$(sed -nE 's/.*cluster up with ([0-9]+) keyspaces.*/\1/p' "$log")"
        if [[ -z "$line" && -n "$n" ]] && (( n <= 9 )); then
            line="$(grep -m1 -E 'keyspace 0: leader n[0-9]' "$log" || true)"
        fi
        [[ -n "$line" ]] && break
        sleep 0.1
    done
    leader="$(sed -nE 's/.*leader n([0-9]+).*/\1/p' <<<"$line")"
    client_port=$(( base_port + ${leader:-1} - 1 ))
    redis-cli -p "$client_port" PING >/dev/null 2>&1 \
        || { echo "n${leader:-1} (port $client_port) does not answer PING" >&2; return 1; }
}

# --- command names the units send --------------------------------------------------
# Rough: the word after `r`, `R n`, `r N` or a client variable ($rd, $r1, $rd2,
# $primary, $replica...) at the start of a Tcl command (line start, `[`, `{`, `;`), plus
# the subcommand of container commands. Comments are skipped; `r $var ...` is counted
# as (dynamic). Helpers the units call send more: assert_encoding -> OBJECT ENCODING,
# assert_refcount -> OBJECT REFCOUNT, debug_digest_value -> DEBUG DIGEST-VALUE (not sent
# under --tags -needs:debug), s FIELD / waitForBgrewriteaof -> INFO.
command_frequency() { # files...
    perl -e '
        my %container = map { $_ => 1 } qw(config object client debug function command script
            memory cluster acl latency slowlog xinfo pubsub module xgroup);
        my %method = map { $_ => 1 } qw(read close readraw deferred blocking reconnect write
            flush channel rawread attributes readingraw);
        my (%n, %sub);
        while (my $l = <>) {
            next if $l =~ /^\s*#/;
            while ($l =~ /(?:^|[\[{;])\s*(?:r|R\s+\d+|\$(?:r|rd|rr|client|primary|replica|master|slave)\d*)\s+(?:-?\d+\s+)?([^\s\]\}\[;]+)(?:\s+([^\s\]\}\[;]+))?/g) {
                my ($c, $s) = ($1, $2);
                if ($c =~ /^[\$\{]/) { $n{"(dynamic)"}++; next }
                $c = lc $c;
                next if $method{$c} || $c !~ /^[a-z][a-z0-9_|.-]*$/;
                $n{$c}++;
                $sub{"$c " . lc $s}++ if $container{$c} && defined $s && $s =~ /^[A-Za-z][A-Za-z-]*$/;
            }
        }
        for my $c (sort { $n{$b} <=> $n{$a} || $a cmp $b } keys %n) {
            printf "%5d  %s\n", $n{$c}, uc $c;
            for my $s (sort { $sub{$b} <=> $sub{$a} || $a cmp $b } grep { /^\Q$c\E / } keys %sub) {
                printf "%5d    %s\n", $sub{$s}, uc $s;
            }
        }
    ' "$@"
}

# --- one unit ----------------------------------------------------------------------
strip_ansi() { sed -E 's/\x1b\[[0-9;]*m//g'; }

# failures of a log: unit<TAB>test<TAB>first error line. An [err] is followed by its
# message line; an [exception]'s test is the first `test {...}` its Tcl stack names.
failures_of() { # unit log
    strip_ansi <"$2" | perl -ne '
        BEGIN { $unit = shift @ARGV }
        if ($want) {
            chomp; s/\s+$//;
            print "$unit\t$name\t$_\n"; $want = 0; next;
        }
        if (/^\[err\]: (.*?)(?: in tests\/unit\/\S+\.tcl)?\s*$/) { $name = $1; $want = 1; next }
        if (/^\[exception\]: Executing test client: (.*?)\.?\s*$/) { $ex = $1; $inex = 1; next }
        if ($inex && !defined $test && /^"test [{"]([^}"]*)[}"]/) { $test = $1 }
        if (/^cluster did not start: (.*)$/) { print "$unit\t(no cluster)\t$1\n" }
        if (/^\[TIMEOUT\]/) { print "$unit\t(timeout)\tno progress for the --timeout seconds\n" }
        if (/^### exit status (124|137)$/) { print "$unit\t(wall clock)\tkilled by UNIT_TIMEOUT\n" }
        END {
            print "$unit\t" . ($test // "(outside any test: start_server setup)") . "\t$ex\n" if $inex;
        }
    ' "$1"
}

run_unit() { # unit
    local unit="$1" name="${1//\//_}"
    local log="$out/$name.log" klog="$out/$name.keel.log"
    local port rc=0
    if ! start_cluster "$klog" 2>"$scratch/start.err"; then
        { echo "cluster did not start: $(cat "$scratch/start.err")"; echo "see $klog"; } >"$log"
        stop_cluster
        return 0
    fi
    port="$client_port"
    {
        echo "### keel cluster: $("$keel" --version 2>/dev/null || echo keel), client port $port"
        echo "### tclsh tests/test_helper.tcl --host 127.0.0.1 --port $port --single unit/$unit ..."
    } >"$log"
    (
        cd "$scratch"
        exec env TERM=dumb timeout --kill-after=15 "$unit_timeout" tclsh tests/test_helper.tcl \
            --host 127.0.0.1 --port "$port" --single "unit/$unit" --clients 1 \
            --timeout "$suite_timeout" \
            --tags -needs:debug --tags -needs:repl --tags -needs:save \
            --tags -needs:config-maxmemory --tags -needs:config-resetstat --tags -needs:reset \
            "${suite_args[@]}"
    ) >>"$log" 2>&1 </dev/null &
    suite_pid=$!
    wait "$suite_pid" || rc=$?
    suite_pid=""
    echo "### exit status $rc" >>"$log"
    stop_cluster
    # the nodes' own logs, for the server side of a failure
    mkdir -p "$out/$name.nodes"
    cp "$scratch"/cluster/n*.log "$out/$name.nodes/" 2>/dev/null || true
}

count_unit() { # unit: prints "passed failed skipped status"
    local log="$out/${1//\//_}.log" clean passed failed skipped status
    clean="$(strip_ansi <"$log")"
    passed="$(grep -c '^\[ok\]: ' <<<"$clean" || true)"
    failed="$(grep -cE '^\[(err|exception)\]: ' <<<"$clean" || true)"
    skipped="$(grep -cE '^\[(skip|ignore)\]: ' <<<"$clean" || true)"
    if grep -q '^\[exception\]: ' <<<"$clean"; then
        status=aborted
    elif grep -q '^\[TIMEOUT\]' <<<"$clean"; then
        status=timeout; failed=$((failed + 1))
    elif grep -q 'The End' <<<"$clean"; then
        status=completed
    elif grep -qE '^### exit status (124|137)$' <<<"$clean"; then
        status="killed-after-${unit_timeout}s"; failed=$((failed + 1))
    elif grep -q '^cluster did not start' <<<"$clean"; then
        status=no-cluster; failed=$((failed + 1))
    else
        status=killed; failed=$((failed + 1))
    fi
    echo "$passed $failed $skipped $status"
}

echo "keel: $keel_src ($(stat -c '%y' "$keel_src" | cut -d. -f1)); Redis tests: $redis_src; results: $out"
for unit in "${units[@]}"; do
    printf '%-14s ' "$unit"
    run_unit "$unit"
    failures_of "$unit" "$out/${unit//\//_}.log" >>"$out/failures.txt"
    read -r p f s st < <(count_unit "$unit")
    echo "passed $p, failed $f, skipped $s ($st)"
done

unit_files=()
for u in "${units[@]}"; do unit_files+=("$redis_src/tests/unit/$u.tcl"); done
command_frequency "${unit_files[@]}" >"$out/commands.txt"
for u in "${units[@]}"; do echo "$u"; done >"$out/units.txt"

{
    printf '%-14s | %6s | %6s | %7s | %7s | %s\n' unit passed failed skipped percent status
    printf -- '---------------+--------+--------+---------+---------+----------\n'
    tp=0 tf=0 ts=0
    for unit in "${units[@]}"; do
        read -r p f s st < <(count_unit "$unit")
        tp=$((tp + p)); tf=$((tf + f)); ts=$((ts + s))
        pct="-"
        (( p + f > 0 )) && pct="$(awk -v p="$p" -v f="$f" 'BEGIN { printf "%.1f%%", 100 * p / (p + f) }')"
        printf '%-14s | %6d | %6d | %7d | %7s | %s\n' "$unit" "$p" "$f" "$s" "$pct" "$st"
    done
    pct="-"
    (( tp + tf > 0 )) && pct="$(awk -v p="$tp" -v f="$tf" 'BEGIN { printf "%.1f%%", 100 * p / (p + f) }')"
    printf '%-14s | %6d | %6d | %7d | %7s |\n' total "$tp" "$tf" "$ts" "$pct"
} | tee "$out/summary.txt"
echo "failed tests and their error line: $out/failures.txt"
