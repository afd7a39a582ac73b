//! Clients over TLS (`client_tls_addr`), driven with `redis-cli --tls`: a certificate
//! authority, a server and a client certificate are made fresh for each run. Skipped
//! without `redis-cli`, unless `KEEL_REQUIRE_REDIS_TOOLS=1`.

mod common;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The PEM files of one run.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
    /// A client certificate from an authority the server does not trust.
    stranger_cert: PathBuf,
    stranger_key: PathBuf,
}

fn authority(name: &str) -> (Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

fn leaf(
    names: &[&str],
    purpose: ExtendedKeyUsagePurpose,
    issuer: &(Certificate, KeyPair),
) -> (String, String) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![purpose];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer.0, &issuer.1).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

fn make_pki(dir: &Path) -> Pki {
    std::fs::create_dir_all(dir).unwrap();
    let ca = authority("Keel test CA");
    let (server_cert, server_key) =
        leaf(&["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth, &ca);
    let (client_cert, client_key) = leaf(&["app"], ExtendedKeyUsagePurpose::ClientAuth, &ca);
    let other = authority("Another CA");
    let (stranger_cert, stranger_key) =
        leaf(&["stranger"], ExtendedKeyUsagePurpose::ClientAuth, &other);
    let pki = Pki {
        ca: dir.join("ca.pem"),
        server_cert: dir.join("server.pem"),
        server_key: dir.join("server.key"),
        client_cert: dir.join("client.pem"),
        client_key: dir.join("client.key"),
        stranger_cert: dir.join("stranger.pem"),
        stranger_key: dir.join("stranger.key"),
    };
    std::fs::write(&pki.ca, ca.0.pem()).unwrap();
    std::fs::write(&pki.server_cert, server_cert).unwrap();
    write_private(&pki.server_key, &server_key);
    std::fs::write(&pki.client_cert, client_cert).unwrap();
    write_private(&pki.client_key, &client_key);
    std::fs::write(&pki.stranger_cert, stranger_cert).unwrap();
    write_private(&pki.stranger_key, &stranger_key);
    pki
}

/// A node's TLS address: its client port + 300.
fn tls_addr(client: SocketAddr) -> SocketAddr {
    SocketAddr::new(client.ip(), client.port() + 300)
}

/// `redis-cli --tls` against `addr` with `extra` TLS flags: its output, or its error.
fn tls_cli(cli: &str, addr: SocketAddr, pki: &Pki, extra: &[&Path], args: &[&str]) -> String {
    let mut command = Command::new(cli);
    command.args(["--tls", "--cacert"]).arg(&pki.ca);
    if let [cert, key] = extra {
        command.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    let out = command
        .args(["-h", "127.0.0.1", "-p", &addr.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !text.is_empty() {
        text
    } else {
        format!("failed: {} {}", text, String::from_utf8_lossy(&out.stderr).trim())
    }
}

fn metric(cluster: &keel_server::local::LocalCluster, i: usize, name: &str) -> f64 {
    common::sample(&common::scrape(cluster.configs[i].http_addr.unwrap()), name).unwrap_or(0.0)
}

#[test]
fn clients_are_served_over_tls_and_mutual_tls_refuses_strangers() {
    let Some(cli) = common::tool("redis-cli") else { return };
    let pki = make_pki(&common::test_dir("tls-pki"));

    // 1. TLS beside plain TCP, no client certificates.
    let (cluster, _) = common::cluster("client-tls", |c| {
        c.client_tls_addr = Some(tls_addr(c.client_addr));
        c.tls_cert_file = Some(pki.server_cert.clone());
        c.tls_key_file = Some(pki.server_key.clone());
    });
    let (plain, tls) = (cluster.client_addrs()[1], tls_addr(cluster.client_addrs()[1]));
    let accepted = common::wait_until(common::LEADER_WAIT, || {
        tls_cli(cli, tls, &pki, &[], &["SET", "greeting", "over tls"]) == "OK"
    });
    assert!(accepted, "a write over TLS was never accepted");
    assert_eq!(tls_cli(cli, tls, &pki, &[], &["GET", "greeting"]), "over tls");
    let port = plain.port().to_string();
    assert_eq!(common::run(cli, &["-p", &port, "GET", "greeting"]).trim(), "over tls");
    // Plain RESP on the TLS port is not served: the handshake fails and the connection
    // closes without a reply.
    let before = metric(&cluster, 1, "keel_tls_handshakes_failed_total");
    let mut stream = TcpStream::connect(tls).unwrap();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stream.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    assert!(!reply.windows(4).any(|w| w == b"PONG"), "plain text served on the TLS port");
    assert!(
        common::wait_until(Duration::from_secs(10), || {
            metric(&cluster, 1, "keel_tls_handshakes_failed_total") > before
        }),
        "the failed handshake is counted"
    );
    common::finish(cluster);

    // 2. TLS only, and clients must present a certificate the configured authority signed.
    let cluster = common::start("client-mtls", |c| {
        c.client_tls_addr = Some(tls_addr(c.client_addr));
        c.tls_cert_file = Some(pki.server_cert.clone());
        c.tls_key_file = Some(pki.server_key.clone());
        c.tls_client_ca_file = Some(pki.ca.clone());
        c.client_plaintext = false;
    });
    let tls = tls_addr(cluster.client_addrs()[0]);
    let mine: [&Path; 2] = [&pki.client_cert, &pki.client_key];
    let accepted = common::wait_until(common::LEADER_WAIT, || {
        tls_cli(cli, tls, &pki, &mine, &["SET", "k", "mutual"]) == "OK"
    });
    assert!(accepted, "a write over mutual TLS was never accepted");
    assert_eq!(tls_cli(cli, tls, &pki, &mine, &["GET", "k"]), "mutual");
    let without = tls_cli(cli, tls, &pki, &[], &["GET", "k"]);
    assert!(without.starts_with("failed"), "served without a client certificate: {without}");
    let stranger: [&Path; 2] = [&pki.stranger_cert, &pki.stranger_key];
    let refused = tls_cli(cli, tls, &pki, &stranger, &["GET", "k"]);
    assert!(refused.starts_with("failed"), "served a stranger's certificate: {refused}");
    assert!(
        TcpStream::connect(cluster.client_addrs()[0]).is_err(),
        "the plain client port is not open"
    );
    common::finish(cluster);
}

#[test]
fn a_node_with_a_key_others_can_read_or_a_missing_file_does_not_start() {
    let dir = common::test_dir("tls-refusals");
    let pki = make_pki(&dir);
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_keel"));
    let loose = dir.join("loose.key");
    std::fs::copy(&pki.server_key, &loose).unwrap();
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let not_a_key = dir.join("not-a-key.pem");
    write_private(&not_a_key, &std::fs::read_to_string(&pki.ca).unwrap());
    for (key, expected) in [
        (loose.clone(), "readable by others"),
        (dir.join("absent.key"), "cannot read"),
        (not_a_key, "no usable private key"),
    ] {
        let started = keel_server::local::LocalCluster::start(
            &exe,
            3,
            &dir.join(format!("node-{}", key.file_name().unwrap().to_string_lossy())),
            None,
            |c| {
                c.client_tls_addr = Some(tls_addr(c.client_addr));
                c.tls_cert_file = Some(pki.server_cert.clone());
                c.tls_key_file = Some(key.clone());
            },
        )
        .expect("the node process starts");
        let log = started.log_path(0);
        let exited = common::wait_until(Duration::from_secs(20), || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.contains(expected))
        });
        assert!(exited, "{}: the node did not refuse with {expected:?}", key.display());
        drop(started);
    }
    let _ = std::fs::remove_dir_all(dir);
}
