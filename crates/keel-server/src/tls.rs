//! TLS for clients: the acceptor a node serves `client_tls_addr` with, built from PEM
//! files (`tls_cert_file`, `tls_key_file`, and `tls_client_ca_file` to require client
//! certificates signed by that authority). rustls over ring, the provider the peer
//! handshake already uses; TLS 1.2 and 1.3 with rustls's safe defaults.

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsAcceptor;

/// Largest PEM file read (a certificate chain or a bundle of authorities).
const PEM_BYTES_MAX: u64 = 1 << 20;

/// The files a TLS listener is built from.
#[derive(Clone, Debug)]
pub struct TlsFiles<'a> {
    /// The node's certificate chain (PEM), its own certificate first.
    pub cert: &'a Path,
    /// The private key of that certificate (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key: &'a Path,
    /// When given, clients must present a certificate this authority (PEM, one or more
    /// certificates) signed.
    pub client_ca: Option<&'a Path>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a PEM file of at most [`PEM_BYTES_MAX`] bytes.
fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if meta.len() > PEM_BYTES_MAX {
        return Err(format!("{} is larger than {PEM_BYTES_MAX} bytes", path.display()));
    }
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if !crate::config::private_file(&meta) {
        return Err(format!("{} is readable by others (chmod 600 it)", path.display()));
    }
    let pem = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| format!("{} holds no usable private key: {e}", path.display()))
}

/// The acceptor for `files`; an error names the file and what is wrong with it.
pub fn acceptor(files: &TlsFiles<'_>) -> Result<TlsAcceptor, String> {
    let certs = certificates(files.cert)?;
    let key = private_key(files.key)?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match files.client_ca {
        None => builder.with_no_client_auth(),
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in certificates(path)? {
                roots.add(cert).map_err(|e| format!("{}: {e}", path.display()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider())
                .build()
                .map_err(|e| format!("{}: {e}", path.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}
