#!/usr/bin/env bash
# Assertion density of Kite's and ORCA's production code in keel-core: assertions
# (assert!, assert_eq!, assert_ne!, debug_assert!, debug_assert_eq!, debug_assert_ne!)
# per 1,000 non-blank, non-comment lines. Test code is left out: files under a `tests/`
# directory, files that a `#[cfg(test)] mod name;` declares, and the inline
# `#[cfg(test)] mod name { ... }` blocks of production files.
#
# Usage: scripts/assertion-density.sh [DIR...]   (default: the kite and leader engines)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
if [ "$#" -eq 0 ]; then
    set -- "$root/crates/keel-core/src/kite" "$root/crates/keel-core/src/leader"
fi

# The files that `#[cfg(test)] mod name;` lines under $1 declare, one a line.
test_module_files() {
    find "$1" -name '*.rs' -print0 | sort -z | while IFS= read -r -d '' file; do
        local base
        case "$(basename "$file")" in
            mod.rs | lib.rs | main.rs) base=$(dirname "$file") ;;
            *) base="${file%.rs}" ;;
        esac
        awk '/^[[:space:]]*#\[cfg\(test\)\]/ { armed = 1; next }
             armed && match($0, /^[[:space:]]*(pub(\([a-z]+\))? )?mod [a-z_0-9]+;/) {
                 line = $0; sub(/^[[:space:]]*(pub(\([a-z]+\))? )?mod /, "", line)
                 sub(/;.*/, "", line); print line }
             { armed = 0 }' "$file" |
            while IFS= read -r name; do
                echo "$base/$name.rs"
                echo "$base/$name/mod.rs"
            done
    done
}

# Prints "<assertions> <lines>" for the production files under $1.
measure() {
    local dir=$1 skip
    skip=$(test_module_files "$dir")
    find "$dir" -name '*.rs' -not -path '*/tests/*' | sort | while IFS= read -r file; do
        grep -qxF "$file" <<<"$skip" || echo "$file"
    done | xargs awk '
        FNR == 1 { depth = 0; skipping = 0; armed = 0 }
        {
            line = $0
            stripped = line; gsub(/^[[:space:]]+|[[:space:]]+$/, "", stripped)
            if (!skipping && stripped ~ /^#\[cfg\(test\)\]/) { armed = 1; next }
            if (!skipping && armed && stripped ~ /^(pub(\([a-z]+\))? )?mod [a-z_0-9]+ *\{/) {
                skipping = 1; depth = 0
            }
            armed = 0
            if (skipping) {
                opened = gsub(/\{/, "{", line); closed = gsub(/\}/, "}", line)
                depth += opened - closed
                if (depth <= 0 && opened + closed > 0) skipping = 0
                next
            }
            if (stripped == "" || stripped ~ /^\/\//) next
            lines++
            rest = line
            while (match(rest, /(^|[^a-z_])(debug_)?assert(_eq|_ne)?!/)) {
                asserts++
                rest = substr(rest, RSTART + RLENGTH)
            }
        }
        END { printf "%d %d\n", asserts, lines }'
}

for dir in "$@"; do
    read -r asserts lines < <(measure "$dir")
    awk -v d="${dir#"$root"/}" -v a="$asserts" -v l="$lines" \
        'BEGIN { printf "%-32s %5d assertions %6d lines %6.1f per 1,000 lines\n", d, a, l, (l ? 1000 * a / l : 0) }'
done
