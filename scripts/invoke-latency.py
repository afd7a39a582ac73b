#!/usr/bin/env python3
"""Latency of KEEL.INVOKE's views against plain GETs, on a running cluster.

Usage: scripts/invoke-latency.py [--addr HOST:PORT] [--n N] [--key KEY]

Connects to ADDR (default 127.0.0.1:7380, a follower of `keel up`'s default cluster once
node 1 leads), switches to RESP3, writes KEY once at `durable`, then times, N times each,
in turn: GET at `any`, GET at `linearizable`, and KEEL.INVOKE GET ... LEVELS any
linearizable (the time to its preliminary push and to its final reply). Prints the
medians and 99th percentiles in microseconds as one JSON object. Standard library only.
"""

import argparse
import json
import socket
import statistics
import time


def encode(*words):
    out = [b"*%d\r\n" % len(words)]
    for word in words:
        data = word.encode() if isinstance(word, str) else word
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


class Conn:
    def __init__(self, addr):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def send(self, *words):
        self.sock.sendall(encode(*words))

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def frame(self):
        """One whole frame: ('push', items), ('error', text) or ('value', parsed)."""
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return ("value", rest)
        if kind in (b"-", b"!"):
            return ("error", rest)
        if kind == b"_":
            return ("value", None)
        if kind == b"$":
            size = int(rest)
            if size < 0:
                return ("value", None)
            while len(self.buf) < size + 2:
                self.buf += self.sock.recv(65536)
            data, self.buf = self.buf[:size], self.buf[size + 2:]
            return ("value", data)
        if kind in (b"*", b">", b"%"):
            count = int(rest) * (2 if kind == b"%" else 1)
            items = [self.frame()[1] for _ in range(count)]
            return ("push" if kind == b">" else "value", items)
        raise ValueError(f"unexpected reply {line!r}")


def percentiles(samples):
    ordered = sorted(samples)
    return {
        "p50_us": round(statistics.median(ordered), 1),
        "p99_us": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 1),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--addr", default="127.0.0.1:7380")
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--key", default="invoke-latency")
    args = parser.parse_args()
    conn = Conn(args.addr)
    conn.send("HELLO", "3")
    conn.frame()
    conn.send("SET", args.key, "v", "DURABILITY", "durable")
    kind, reply = conn.frame()
    if kind == "error":
        raise SystemExit(f"SET failed: {reply!r}")
    timings = {"get_any": [], "get_linearizable": [], "invoke_preliminary": [], "invoke_final": []}
    for _ in range(args.n):
        for level in ("any", "linearizable"):
            start = time.perf_counter()
            conn.send("GET", args.key, "LEVEL", level)
            kind, reply = conn.frame()
            if kind == "error":
                raise SystemExit(f"GET failed: {reply!r}")
            timings[f"get_{level}"].append((time.perf_counter() - start) * 1e6)
        start = time.perf_counter()
        conn.send("KEEL.INVOKE", "GET", args.key, "LEVELS", "any", "linearizable", "NOCONFIRM")
        kind, reply = conn.frame()
        if kind != "push":
            raise SystemExit(f"expected a push first, got {kind}: {reply!r}")
        timings["invoke_preliminary"].append((time.perf_counter() - start) * 1e6)
        kind, reply = conn.frame()
        if kind == "error":
            raise SystemExit(f"KEEL.INVOKE failed: {reply!r}")
        timings["invoke_final"].append((time.perf_counter() - start) * 1e6)
    result = {"addr": args.addr, "n": args.n}
    result.update({name: percentiles(samples) for name, samples in timings.items()})
    print(json.dumps(result))


if __name__ == "__main__":
    main()
