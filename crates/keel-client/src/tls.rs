//! TLS to a node's `client_tls_addr`: [`ClientTls`] trusts the authorities of a PEM file
//! (a cluster's own CA, as `keel up --secure` makes) and checks the node's certificate
//! against a name; with a certificate and key of its own it answers nodes that require
//! client certificates (`tls_client_ca_file`). rustls over ring, as the server uses.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use std::path::Path;
use std::sync::Arc;
use tokio_rustls::TlsConnector;

/// Largest PEM file read.
const PEM_BYTES_MAX: u64 = 1 << 20;

/// How a client reaches nodes over TLS. Cheap to clone.
#[derive(Clone)]
pub struct ClientTls {
    connector: TlsConnector,
    server_name: ServerName<'static>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("server_name", &self.server_name).finish()
    }
}

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

impl ClientTls {
    /// Trusts the authorities in the PEM file `ca` and expects nodes to present a
    /// certificate for `server_name` (a DNS name or an IP address). With `identity`
    /// (certificate chain, private key: PEM files) the client presents a certificate of
    /// its own. An error names the file and what is wrong with it.
    pub fn new(
        ca: &Path,
        server_name: &str,
        identity: Option<(&Path, &Path)>,
    ) -> Result<ClientTls, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in certificates(ca)? {
            roots.add(cert).map_err(|e| format!("{}: {e}", ca.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let config = match identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain = certificates(cert)?;
                let key_pem = read_pem(key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                    .map_err(|e| format!("{} holds no usable private key: {e}", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| format!("{} and {}: {e}", cert.display(), key.display()))?
            }
        };
        let server_name = ServerName::try_from(server_name.to_string())
            .map_err(|e| format!("{server_name}: not a server name: {e}"))?;
        Ok(ClientTls { connector: TlsConnector::from(Arc::new(config)), server_name })
    }

    /// The TLS handshake over an open connection.
    pub(crate) async fn handshake(
        &self,
        stream: tokio::net::TcpStream,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        self.connector.connect(self.server_name.clone(), stream).await
    }
}
