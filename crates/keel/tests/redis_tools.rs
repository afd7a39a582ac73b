//! `redis-cli` and `redis-benchmark` run unmodified against a Keel node. Skipped when the
//! tools are not installed, unless `KEEL_REQUIRE_REDIS_TOOLS=1`, which makes their
//! absence a failure (CI sets it after installing `redis-tools`).

mod common;

#[test]
fn redis_cli_and_redis_benchmark_work_unmodified() {
    let (Some(cli), Some(bench)) = (common::tool("redis-cli"), common::tool("redis-benchmark"))
    else {
        return;
    };
    let (cluster, _) = common::cluster("redis-tools", |_| {});
    let port = cluster.client_addrs()[1].port().to_string();
    // The first write may meet a leader change: retry it within a bound.
    let accepted = common::wait_until(common::LEADER_WAIT, || {
        common::run(cli, &["-p", &port, "SET", "greeting", "hello"]).trim() == "OK"
    });
    assert!(accepted, "the cluster never accepted a write");
    assert_eq!(common::run(cli, &["-p", &port, "GET", "greeting"]).trim(), "hello");
    assert_eq!(
        common::run(cli, &["-3", "-p", &port, "GET", "greeting", "LEVEL", "linearizable"]).trim(),
        "hello"
    );
    assert_eq!(
        common::run(cli, &["-p", &port, "SET", "c", "1", "DURABILITY", "durable"]).trim(),
        "OK"
    );
    assert_eq!(common::run(cli, &["-p", &port, "INCR", "c"]).trim(), "2");
    assert_eq!(common::run(cli, &["-p", &port, "PING"]).trim(), "PONG");
    let status = common::run(cli, &["-p", &port, "KEEL.STATUS"]);
    assert!(status.contains("durable_index"), "{status}");
    let out = common::run(bench, &["-p", &port, "-t", "set,get", "-n", "2000", "-q"]);
    assert!(out.contains("SET:") && out.contains("GET:"), "{out}");
    assert!(!out.contains("Error"), "{out}");
    common::finish(cluster);
}
