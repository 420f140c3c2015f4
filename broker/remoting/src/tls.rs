//! TLS for connections (rustls, ring provider): PEM parsing shared with the broker's server
//! side, and the client side ([`TlsClientConfig`]) used by `quiver-client` and broker peers.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::AsyncRead;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::{Connection, Incoming, Options};

/// A TLS handshake must finish within this, on either side, so a silent peer pins no task.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of a TLS record carrying a handshake (a ClientHello opens with one).
pub const HANDSHAKE_RECORD: u8 = 0x16;

/// The reading half of a connection that may or may not be TLS.
pub type AnyRead = Box<dyn AsyncRead + Send + Unpin>;

/// The crypto provider every TLS config here is built with.
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The whole file, or an error naming it.
pub fn read_file(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("cannot read {}: {error}", path.display()))
}

/// Every certificate of a PEM text; at least one.
pub fn certificates_from_pem(
    pem: &[u8],
    source: &Path,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("{}: not PEM certificates: {error}", source.display()))?;
    if certificates.is_empty() {
        return Err(format!("{}: no CERTIFICATE in it", source.display()));
    }
    Ok(certificates)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) of a PEM text.
pub fn private_key_from_pem(pem: &[u8], source: &Path) -> Result<PrivateKeyDer<'static>, String> {
    PrivateKeyDer::from_pem_slice(pem)
        .map_err(|error| format!("{}: no usable PEM private key: {error}", source.display()))
}

/// The CA certificates of a PEM file as trust anchors.
pub fn root_store_from_pem(pem: &[u8], source: &Path) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for certificate in certificates_from_pem(pem, source)? {
        roots.add(certificate).map_err(|error| {
            format!("{}: not a usable CA certificate: {error}", source.display())
        })?;
    }
    Ok(roots)
}

/// How a client connects with TLS. Each PEM can come from a file or, for callers holding it in
/// memory (a Kubernetes Secret's data), as bytes; the bytes win when both are given.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct TlsClientConfig {
    /// CA certificates (PEM) the server's certificate must chain to; None (and no `ca_pem`):
    /// the Mozilla roots of `webpki-roots`.
    pub ca_file: Option<PathBuf>,
    /// Certificate chain (PEM) presented to servers that ask for one; with `key_file`.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// Name the server's certificate must carry; None: the host of the address dialled.
    pub server_name: Option<String>,
    /// `ca_file`'s content, in memory.
    pub ca_pem: Option<Vec<u8>>,
    /// `cert_file`'s and `key_file`'s contents, in memory.
    pub cert_pem: Option<Vec<u8>>,
    pub key_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for TlsClientConfig {
    // The private key's bytes stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let given = |pem: &Option<Vec<u8>>| pem.as_ref().map(|bytes| bytes.len());
        f.debug_struct("TlsClientConfig")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("server_name", &self.server_name)
            .field("ca_pem_len", &given(&self.ca_pem))
            .field("cert_pem_len", &given(&self.cert_pem))
            .field("key_pem_len", &given(&self.key_pem))
            .finish()
    }
}

/// A PEM given as bytes or as a file: its content and the name errors use.
fn pem_of(
    bytes: &Option<Vec<u8>>,
    file: &Option<PathBuf>,
    what: &str,
) -> Result<Option<(Vec<u8>, PathBuf)>, String> {
    match (bytes, file) {
        (Some(bytes), _) => Ok(Some((
            bytes.clone(),
            PathBuf::from(format!("{what} (in memory)")),
        ))),
        (None, Some(path)) => Ok(Some((read_file(path)?, path.clone()))),
        (None, None) => Ok(None),
    }
}

impl TlsClientConfig {
    /// Reads the PEMs into a connector: errors name the file (or in-memory PEM) at fault.
    pub fn connector(&self) -> Result<TlsClient, String> {
        let roots = match pem_of(&self.ca_pem, &self.ca_file, "CA")? {
            Some((pem, source)) => root_store_from_pem(&pem, &source)?,
            None => RootCertStore::from_iter(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|error| format!("TLS client settings: {error}"))?
            .with_root_certificates(roots);
        let cert = pem_of(&self.cert_pem, &self.cert_file, "client certificate")?;
        let key = pem_of(&self.key_pem, &self.key_file, "client key")?;
        let config = match (cert, key) {
            (Some((cert, cert_source)), Some((key, key_source))) => {
                let chain = certificates_from_pem(&cert, &cert_source)?;
                let key_der = private_key_from_pem(&key, &key_source)?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|error| format!("{}: {error}", cert_source.display()))?
            }
            (None, None) => builder.with_no_client_auth(),
            _ => return Err("a client certificate needs both a certificate and a key".into()),
        };
        Ok(TlsClient {
            connector: TlsConnector::from(Arc::new(config)),
            server_name: self.server_name.clone(),
        })
    }
}

/// A client TLS configuration, read once, for any number of connections.
#[derive(Clone)]
pub struct TlsClient {
    connector: TlsConnector,
    server_name: Option<String>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Handshakes over `stream` to `addr` (host:port) within [`HANDSHAKE_TIMEOUT`].
    pub async fn handshake(
        &self,
        stream: TcpStream,
        addr: &str,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let name = self.server_name.as_deref().unwrap_or_else(|| host_of(addr));
        let name = ServerName::try_from(name.to_owned()).map_err(|error| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("server name `{name}`: {error}"),
            )
        })?;
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, self.connector.connect(name, stream)).await {
            Ok(done) => done,
            Err(_) => Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("TLS handshake with {addr} took over {HANDSHAKE_TIMEOUT:?}"),
            )),
        }
    }
}

/// The host part of host:port, brackets of an IPv6 literal removed.
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

/// A [`Connection`] over a connected `stream` to `addr`, through TLS when `tls` is given.
pub async fn start(
    stream: TcpStream,
    addr: &str,
    tls: Option<&TlsClient>,
    options: Options,
) -> std::io::Result<(Connection, Incoming<AnyRead>)> {
    match tls {
        None => {
            let (reader, writer) = stream.into_split();
            Ok(Connection::from_parts(
                Box::new(reader) as AnyRead,
                writer,
                options,
            ))
        }
        Some(tls) => {
            let (reader, writer) = tokio::io::split(tls.handshake(stream, addr).await?);
            Ok(Connection::from_parts(
                Box::new(reader) as AnyRead,
                writer,
                options,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_of_drops_the_port_and_brackets() {
        assert_eq!(host_of("localhost:10911"), "localhost");
        assert_eq!(host_of("127.0.0.1:1"), "127.0.0.1");
        assert_eq!(host_of("[::1]:10911"), "::1");
    }

    #[test]
    fn bad_pem_is_an_error_naming_the_file() {
        let path = Path::new("/x/tls.crt");
        let error = certificates_from_pem(b"not pem", path).unwrap_err();
        assert!(error.contains("/x/tls.crt"), "{error}");
        assert!(private_key_from_pem(b"", path).is_err());
    }

    #[test]
    fn a_generated_certificate_and_key_make_a_connector() {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
        let config = TlsClientConfig {
            ca_file: Some(cert.clone()),
            cert_file: Some(cert),
            key_file: Some(key.clone()),
            ..TlsClientConfig::default()
        };
        config.connector().expect("valid files");
        let half = TlsClientConfig {
            key_file: Some(key),
            ..TlsClientConfig::default()
        };
        assert!(half.connector().is_err());
    }

    #[test]
    fn in_memory_pems_make_a_connector_and_win_over_files() {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let config = TlsClientConfig {
            ca_pem: Some(certified.cert.pem().into_bytes()),
            cert_pem: Some(certified.cert.pem().into_bytes()),
            key_pem: Some(certified.key_pair.serialize_pem().into_bytes()),
            // Never read: the bytes are given.
            ca_file: Some(PathBuf::from("/nonexistent/ca.crt")),
            ..TlsClientConfig::default()
        };
        config.connector().expect("valid PEM bytes");
        assert!(!format!("{config:?}").contains("PRIVATE KEY"));
        let bad = TlsClientConfig {
            ca_pem: Some(b"not pem".to_vec()),
            ..TlsClientConfig::default()
        };
        let error = bad.connector().unwrap_err();
        assert!(error.contains("CA (in memory)"), "{error}");
        let half = TlsClientConfig {
            cert_pem: Some(certified.cert.pem().into_bytes()),
            ..TlsClientConfig::default()
        };
        assert!(half.connector().is_err());
    }
}
