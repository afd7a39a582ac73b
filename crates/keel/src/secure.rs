//! `keel up --secure`: what a local cluster needs to be reached only with a password and
//! over TLS, made under its directory on first start and reused by later starts: a
//! certificate authority (`tls/ca.pem`, its key `tls/ca.key`), one node certificate for
//! `localhost` and `127.0.0.1` signed by it (`tls/node.pem`, `tls/node.key`), the `admin`
//! user's password (`admin.password`) and the HTTP bearer token (`http.token`). Keys,
//! password and token are readable by their owner only.

use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The files of a secure local cluster.
#[derive(Clone, Debug)]
pub struct Secure {
    /// The authority clients trust (`redis-cli --cacert`).
    pub ca: PathBuf,
    /// The nodes' certificate chain.
    pub cert: PathBuf,
    /// The nodes' private key.
    pub key: PathBuf,
    /// The file holding the `admin` password.
    pub password_file: PathBuf,
    /// The `admin` password.
    pub password: String,
    /// The file holding the HTTP bearer token.
    pub token_file: PathBuf,
}

/// 64 hex digits from the system's random generator.
fn random_hex() -> String {
    keel_server::handshake::nonce().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Writes `text` to a new file at `path` that only its owner may read.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()
}

fn tls_error(e: rcgen::Error) -> std::io::Error {
    std::io::Error::other(format!("making the certificates: {e}"))
}

/// The secure cluster's files under `dir`: those a previous start made, or new ones.
pub fn prepare(dir: &Path) -> std::io::Result<Secure> {
    let tls = dir.join("tls");
    let secure = Secure {
        ca: tls.join("ca.pem"),
        cert: tls.join("node.pem"),
        key: tls.join("node.key"),
        password_file: dir.join("admin.password"),
        password: String::new(),
        token_file: dir.join("http.token"),
    };
    let made = [&secure.ca, &secure.cert, &secure.key, &secure.password_file, &secure.token_file];
    if made.iter().all(|path| path.exists()) {
        let password = std::fs::read_to_string(&secure.password_file)?.trim().to_string();
        return Ok(Secure { password, ..secure });
    }
    if made.iter().any(|path| path.exists()) {
        let reason = format!(
            "{} holds part of a secure cluster's files: remove them or use another --dir",
            dir.display()
        );
        return Err(std::io::Error::other(reason));
    }
    std::fs::create_dir_all(&tls)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(tls_error)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "Keel local cluster CA");
    let ca_key = KeyPair::generate().map_err(tls_error)?;
    let ca = ca_params.self_signed(&ca_key).map_err(tls_error)?;
    let names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    let mut node_params = CertificateParams::new(names).map_err(tls_error)?;
    node_params.distinguished_name.push(DnType::CommonName, "Keel local node");
    node_params.extended_key_usages =
        vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    let node_key = KeyPair::generate().map_err(tls_error)?;
    let node = node_params.signed_by(&node_key, &ca, &ca_key).map_err(tls_error)?;
    std::fs::write(&secure.ca, ca.pem())?;
    write_private(&tls.join("ca.key"), &ca_key.serialize_pem())?;
    std::fs::write(&secure.cert, node.pem())?;
    write_private(&secure.key, &node_key.serialize_pem())?;
    let password = random_hex()[..32].to_string();
    write_private(&secure.password_file, &format!("{password}\n"))?;
    write_private(&secure.token_file, &format!("{}\n", random_hex()))?;
    Ok(Secure { password, ..secure })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_start_reuses_the_files_and_a_partial_set_is_refused() {
        let dir = std::env::temp_dir().join(format!("keel-secure-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = prepare(&dir).unwrap();
        assert_eq!(first.password.len(), 32);
        let mode = |path: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(path).unwrap().permissions().mode() & 0o777
        };
        for secret in [&first.key, &first.password_file, &first.token_file] {
            assert_eq!(mode(secret), 0o600, "{}", secret.display());
        }
        assert_eq!(mode(&dir.join("tls/ca.key")), 0o600);
        let again = prepare(&dir).unwrap();
        assert_eq!(again.password, first.password);
        std::fs::remove_file(&first.token_file).unwrap();
        let partial = prepare(&dir).unwrap_err().to_string();
        assert!(partial.contains("part of a secure cluster's files"), "{partial}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
