#!/usr/bin/env python3
"""Throughput of the reliable-queue pattern through redis-py: producers LPUSH jobs,
workers BLMOVE each to a processing list and LREM it when done. Prints jobs per second.

Usage: scripts/bench-jobs.py PORT [--jobs N] [--producers P] [--workers W] [--keel DURABILITY]
  --keel DURABILITY  append Keel's `DURABILITY d` to every write (memory, replicated,
                     durable); without it the commands are plain Redis (any server).
"""
import argparse, threading, time
import redis

p = argparse.ArgumentParser()
p.add_argument("port", type=int)
p.add_argument("--jobs", type=int, default=5000)
p.add_argument("--producers", type=int, default=4)
p.add_argument("--workers", type=int, default=8)
p.add_argument("--keel", default=None)
a = p.parse_args()
extra = ["DURABILITY", a.keel] if a.keel else []
r0 = redis.Redis(port=a.port)
r0.delete("jobs", "processing")
done = threading.Event()
count = [0]
lock = threading.Lock()

def produce(k):
    r = redis.Redis(port=a.port)
    for i in range(k, a.jobs, a.producers):
        r.execute_command("LPUSH", "jobs", f"job:{i}", *extra)

def work():
    r = redis.Redis(port=a.port)
    while True:
        job = r.execute_command("BLMOVE", "jobs", "processing", "RIGHT", "LEFT", "0.1", *extra)
        if job is None:
            if done.is_set():
                return
            continue
        r.execute_command("LREM", "processing", "1", job, *extra)
        with lock:
            count[0] += 1

start = time.time()
threads = [threading.Thread(target=produce, args=(k,)) for k in range(a.producers)]
workers = [threading.Thread(target=work) for _ in range(a.workers)]
for t in threads + workers:
    t.start()
for t in threads:
    t.join()
while count[0] < a.jobs:
    time.sleep(0.005)
elapsed = time.time() - start
done.set()
for t in workers:
    t.join()
print(f"{a.jobs} jobs in {elapsed:.2f}s: {a.jobs / elapsed:.0f} jobs/s")
