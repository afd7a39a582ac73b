#!/usr/bin/env bash
# Installs the peer systems `keel bench` compares against, from Debian packages:
# etcd-server (3.4), zookeeper (3.8), redis-server and redis-tools (7.0), and
# protobuf-compiler (protoc, to build keel with `--features etcd`).
# Idempotent: packages already installed are left alone; the system services the
# packages start are stopped and disabled, since `keel bench` runs its own clusters
# in temporary directories on free loopback ports.
set -euo pipefail

packages=(etcd-server etcd-client zookeeper redis-server redis-tools protobuf-compiler)
services=(etcd zookeeper redis-server)

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
    sudo_cmd=(sudo)
fi

missing=()
for package in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$package")
    fi
done

if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-peers: installing ${missing[*]}"
    "${sudo_cmd[@]}" apt-get update
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
else
    echo "install-peers: all peer packages already installed"
fi

# The packages start system-wide services on the default ports; the benchmark does not use them.
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
    for service in "${services[@]}"; do
        "${sudo_cmd[@]}" systemctl disable --now "$service" >/dev/null 2>&1 || true
    done
else
    for service in "${services[@]}"; do
        "${sudo_cmd[@]}" service "$service" stop >/dev/null 2>&1 || true
    done
fi

echo "install-peers: versions"
(command -v etcd >/dev/null && etcd --version 2>&1 | sed -n 1p) || echo "etcd: missing"
(command -v redis-server >/dev/null && redis-server --version) || echo "redis-server: missing"
(ls /usr/share/java/zookeeper-3*.jar 2>/dev/null) || echo "zookeeper: jar missing"
(command -v java >/dev/null && java -version 2>&1 | sed -n 1p) || echo "java: missing"
