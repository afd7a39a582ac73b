//! `keel up --secure`: `redis-cli --tls` with the admin password is served, without one it
//! gets `NOAUTH`, with a wrong one `WRONGPASS`; `/status` over HTTPS answers only with the
//! bearer token; keel's own commands reach it over TLS with `--tls-ca` and `--user`, and
//! fail without either or with an authority that did not sign the nodes' certificate.
//! Skipped without `redis-cli`, unless `KEEL_REQUIRE_REDIS_TOOLS=1`.

mod common;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// `redis-cli --tls` against `port` with `args`: its output, then its error (a warning
/// about passwords on the command line, or why it failed), trimmed.
fn cli(tool: &str, ca: &Path, port: u16, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(["--tls", "--cacert"])
        .arg(ca)
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli runs");
    format!(
        "{} {}",
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
    .trim()
    .to_string()
}

/// `GET /status` over HTTPS, trusting `ca`, with `token` if given: the response.
fn https_status(ca: &Path, port: u16, token: Option<&str>) -> String {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("localhost").unwrap();
    let mut tls = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tcp = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut stream = rustls::Stream::new(&mut tls, &mut tcp);
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request =
        format!("GET /status HTTP/1.1\r\nHost: localhost\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    String::from_utf8_lossy(&response).into_owned()
}

#[test]
fn a_secure_local_cluster_wants_its_password_over_tls_and_its_token_over_https() {
    let Some(tool) = common::tool("redis-cli") else { return };
    let dir = common::test_dir("up-secure");
    // Held until the test ends, so that no other cluster draws these ports meanwhile.
    let block = keel_server::local::reserve_port_block(3).expect("a free block of ports");
    let base = block.base();
    let (up, printed) = common::Up::secure_printing(&dir, base);
    assert!(printed.contains("redis-cli --tls --cacert"), "{printed}");
    let ca = dir.join("tls/ca.pem");
    let password = std::fs::read_to_string(dir.join("admin.password")).unwrap();
    let password = password.trim();
    let token = std::fs::read_to_string(dir.join("http.token")).unwrap();
    let port = base + 300;
    let admin = ["--user", "admin", "--pass", password];
    let set = [&admin[..], &["SET", "greeting", "secure"]].concat();
    assert!(
        common::wait_until(common::LEADER_WAIT, || cli(tool, &ca, port, &set).starts_with("OK")),
        "the admin's write over TLS: {}",
        cli(tool, &ca, port, &set)
    );
    let get = [&admin[..], &["GET", "greeting"]].concat();
    assert!(cli(tool, &ca, port, &get).starts_with("secure"), "{}", cli(tool, &ca, port, &get));
    let anonymous = cli(tool, &ca, port, &["GET", "greeting"]);
    assert!(anonymous.contains("NOAUTH"), "{anonymous}");
    let wrong = cli(tool, &ca, port, &["--user", "admin", "--pass", "not-it", "GET", "greeting"]);
    assert!(wrong.contains("WRONGPASS"), "{wrong}");
    let http = base + 200;
    let with = https_status(&ca, http, Some(token.trim()));
    assert!(with.starts_with("HTTP/1.1 200") && with.contains("keyspaces"), "{with}");
    let without = https_status(&ca, http, None);
    assert!(without.starts_with("HTTP/1.1 401"), "{without}");

    // What holds values, password hashes or keys is its owner's only.
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        for id in 1..=3 {
            assert_eq!(mode(&dir.join(format!("n{id}"))), 0o700, "node {id}'s data directory");
            for file in [format!("n{id}.toml"), format!("n{id}.log")] {
                assert_eq!(mode(&dir.join(&file)), 0o600, "{file}");
            }
        }
        for file in ["admin.password", "http.token", "cluster.secret", "tls/node.key"] {
            assert_eq!(mode(&dir.join(file)), 0o600, "{file}");
        }
    }

    // keel's own client: TLS trusting the cluster's CA, the admin's password.
    let node = format!("localhost:{port}");
    let keel = |args: &[&str], ca: Option<&Path>, pass: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.args(args).args(["--node", &node]);
        if let Some(ca) = ca {
            command.arg("--tls-ca").arg(ca);
        }
        if let Some(pass) = pass {
            command.args(["--user", "admin"]).env("KEEL_PASSWORD", pass);
        }
        let out = command.output().expect("keel runs");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, text) = keel(&["set", "from-keel", "over-tls"], Some(&ca), Some(password));
    assert!(ok && text.starts_with("OK"), "keel set over TLS: {text}");
    let (ok, text) = keel(&["get", "greeting"], Some(&ca), Some(password));
    assert!(ok && text.starts_with("secure"), "keel get over TLS: {text}");
    let (ok, text) = keel(&["status"], Some(&ca), Some(password));
    let answered = text.contains(&format!("127.0.0.1:{port}")) && !text.contains("unreachable");
    assert!(ok && answered && text.contains("epoch"), "keel status over TLS: {text}");
    let (ok, text) = keel(&["get", "greeting"], Some(&ca), None);
    assert!(!ok && text.contains("NOAUTH"), "without a password: {text}");
    let (ok, text) = keel(&["get", "greeting"], None, Some(password));
    assert!(!ok, "plain RESP to the TLS port: {text}");
    // The node's own certificate is no authority: the handshake must fail.
    let (ok, text) = keel(&["get", "greeting"], Some(&dir.join("tls/node.pem")), Some(password));
    assert!(!ok && text.contains("TLS handshake"), "an authority that signed nothing: {text}");

    drop(up);
    let _ = std::fs::remove_dir_all(dir);
}
