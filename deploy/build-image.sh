#!/usr/bin/env bash
# Builds the `keel` container image from what is on this machine, pulling nothing: the
# release binary and the shared libraries it loads, on an empty base (`FROM scratch`).
#
#   deploy/build-image.sh [TAG]        # default tag keel:local
#   KEEL_BIN=path deploy/build-image.sh   # the image of a binary built already
#
# Also writes deploy/cluster.secret (mode 600) when it is missing: the secret the
# compose clusters' members prove to each other (docs/security.md).
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-keel:local}

keel=${KEEL_BIN:-}
if [ -z "$keel" ]; then
    cargo build --release -p keel
    keel=target/release/keel
fi
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root/data" "$root/tmp" "$root/etc/keel"
chmod 1777 "$root/tmp"
# The binary without its debug information (the image needs none).
objcopy --strip-debug "$keel" "$root/keel"
# Every shared library the binary loads, and the loader, at their paths.
for lib in $(ldd "$keel" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
done
cat > "$ctx/Dockerfile" <<'DOCKERFILE'
FROM scratch
COPY rootfs/ /
ENTRYPOINT ["/keel"]
CMD ["server", "--config", "/etc/keel/keel.toml"]
DOCKERFILE
docker build --quiet --tag "$tag" "$ctx"

secret=deploy/cluster.secret
if [ ! -s "$secret" ]; then
    (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret")
fi
echo "built $tag; cluster secret in $secret"
