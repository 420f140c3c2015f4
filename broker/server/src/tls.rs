//! TLS on the remoting and HTTP ports: the server certificate (re-read when its files
//! change), the first-byte sniffing of permissive mode, bounded handshakes and their counters.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};
use quiver_remoting::tls::{self as pem, HANDSHAKE_RECORD, HANDSHAKE_TIMEOUT};
use rustls::server::WebPkiClientVerifier;
use rustls::ServerConfig;
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::config::{BrokerConfig, ClientAuth, ConfigError};

/// How often the certificate, key and CA files are read to look for a change. Contents are
/// compared, not mtimes: a Kubernetes Secret volume swaps a symlink.
pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// What the first byte of a new connection on a TLS-enabled remoting port says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FirstByte {
    /// A TLS handshake record (0x16): a ClientHello.
    Tls,
    /// Anything else: a RocketMQ frame's 4-byte big-endian length, whose first byte is 0x16
    /// only for frames over 369 MB, which no valid frame is.
    Plain,
}

/// Tells a TLS ClientHello from a plain RocketMQ frame by its first byte.
pub fn classify(first: u8) -> FirstByte {
    if first == HANDSHAKE_RECORD {
        FirstByte::Tls
    } else {
        FirstByte::Plain
    }
}

/// The first byte the client sent, without consuming it; None when it closed first.
pub async fn peek_first_byte(stream: &TcpStream) -> std::io::Result<Option<u8>> {
    let mut first = [0u8; 1];
    let read = stream.peek(&mut first).await?;
    Ok((read == 1).then_some(first[0]))
}

/// Why a TLS handshake failed: the `reason` label of `quiver_tls_handshake_failures_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// Not finished within the handshake bound (or no first byte in it).
    Timeout,
    /// A client certificate missing, or one the CA did not sign.
    ClientCertificate,
    /// Any other TLS error (no shared version or cipher, a bad record, an alert).
    Protocol,
    /// The connection failed or closed during the handshake.
    Io,
}

impl HandshakeFailure {
    pub const ALL: [HandshakeFailure; 4] = [
        HandshakeFailure::Timeout,
        HandshakeFailure::ClientCertificate,
        HandshakeFailure::Protocol,
        HandshakeFailure::Io,
    ];

    pub fn label(self) -> &'static str {
        match self {
            HandshakeFailure::Timeout => "timeout",
            HandshakeFailure::ClientCertificate => "client-certificate",
            HandshakeFailure::Protocol => "protocol",
            HandshakeFailure::Io => "io",
        }
    }

    fn of(error: &std::io::Error) -> HandshakeFailure {
        let tls_error = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        match tls_error {
            Some(rustls::Error::NoCertificatesPresented | rustls::Error::InvalidCertificate(_)) => {
                HandshakeFailure::ClientCertificate
            }
            Some(_) => HandshakeFailure::Protocol,
            None => HandshakeFailure::Io,
        }
    }
}

/// The files a server certificate comes from.
#[derive(Clone, Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
    client_auth: ClientAuth,
}

/// The files' bytes, to tell whether they changed.
type Contents = Vec<Vec<u8>>;

/// Which port a handshake is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    /// The remoting port: client certificates as `--tls-client-auth` says.
    Remoting,
    /// The HTTP port: never asks for a client certificate (Kubernetes probes have none).
    Http,
    /// The gRPC port: client certificates as the remoting port, and ALPN `h2` (gRPC clients
    /// refuse a TLS connection that did not negotiate HTTP/2).
    Grpc,
}

/// The server configs built from one version of the files.
struct Configs {
    remoting: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
    grpc: Arc<ServerConfig>,
}

impl Configs {
    fn build(files: &Files, contents: &Contents) -> Result<Configs, String> {
        let mut grpc = build(files, contents, files.client_auth)?;
        grpc.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Configs {
            remoting: Arc::new(build(files, contents, files.client_auth)?),
            http: Arc::new(build(files, contents, ClientAuth::None)?),
            grpc: Arc::new(grpc),
        })
    }
}

/// The certificate in force for new connections, how it got there and what failed.
pub struct TlsServer {
    files: Files,
    configs: RwLock<Configs>,
    last_contents: Mutex<Contents>,
    reloads: AtomicU64,
    reload_failures: AtomicU64,
    handshake_failures: [AtomicU64; HandshakeFailure::ALL.len()],
}

impl TlsServer {
    /// Reads the certificate, key and CA named by `config`; None when it serves no TLS.
    /// A broker with TLS on does not start without valid files. Blocking.
    pub fn load(config: &BrokerConfig) -> Result<Option<Arc<TlsServer>>, ConfigError> {
        let (Some(cert), Some(key)) = (&config.tls_cert_file, &config.tls_key_file) else {
            return Ok(None);
        };
        if !config.serves_tls() {
            return Ok(None);
        }
        let files = Files {
            cert: cert.clone(),
            key: key.clone(),
            ca: config.tls_ca_file.clone(),
            client_auth: config.tls_client_auth,
        };
        let contents = read_contents(&files).map_err(invalid)?;
        let configs = Configs::build(&files, &contents).map_err(invalid)?;
        tracing::info!(cert = %cert.display(), mode = ?config.tls_mode, client_auth = ?config.tls_client_auth,
            http_tls = config.http_tls, "TLS on");
        Ok(Some(Arc::new(TlsServer {
            files,
            configs: RwLock::new(configs),
            last_contents: Mutex::new(contents),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
            handshake_failures: Default::default(),
        })))
    }

    /// Handshakes as the server of `port` with the certificate in force, within the handshake
    /// bound; a failure is counted and logged at debug.
    pub async fn accept(
        &self,
        stream: TcpStream,
        port: Port,
    ) -> Result<TlsStream<TcpStream>, HandshakeFailure> {
        let config = {
            let configs = self.configs.read();
            match port {
                Port::Remoting => configs.remoting.clone(),
                Port::Http => configs.http.clone(),
                Port::Grpc => configs.grpc.clone(),
            }
        };
        let acceptor = TlsAcceptor::from(config);
        let failure = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => return Ok(stream),
            Ok(Err(error)) => {
                let failure = HandshakeFailure::of(&error);
                tracing::debug!(%error, reason = failure.label(), "TLS handshake failed");
                failure
            }
            Err(_) => HandshakeFailure::Timeout,
        };
        self.count_failure(failure);
        Err(failure)
    }

    pub fn count_failure(&self, failure: HandshakeFailure) {
        self.handshake_failures[failure as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Reads the files and, when their contents changed, serves the new certificate to new
    /// connections; files that do not make a certificate are logged and counted and the one
    /// in force is kept. Blocking.
    pub fn reload_if_changed(&self) {
        let contents = match read_contents(&self.files) {
            Ok(contents) => contents,
            Err(error) => return self.reload_failed(&error, None),
        };
        if *self.last_contents.lock() == contents {
            return;
        }
        match Configs::build(&self.files, &contents) {
            Ok(configs) => {
                *self.configs.write() = configs;
                *self.last_contents.lock() = contents;
                self.reloads.fetch_add(1, Ordering::Relaxed);
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(error) => self.reload_failed(&error, Some(contents)),
        }
    }

    /// Counts a failed reload once per bad version of the files, not once per poll.
    fn reload_failed(&self, error: &str, contents: Option<Contents>) {
        if let Some(contents) = contents {
            *self.last_contents.lock() = contents;
        }
        tracing::error!(%error, "TLS files not reloaded; the certificate in force is kept");
        self.reload_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// (reloads that took, reloads that failed) since start.
    pub fn reload_counts(&self) -> (u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_failures.load(Ordering::Relaxed),
        )
    }

    /// (reason, handshakes failed so far) for every reason.
    pub fn handshake_failures(&self) -> Vec<(&'static str, u64)> {
        HandshakeFailure::ALL
            .iter()
            .map(|&failure| {
                let count = self.handshake_failures[failure as usize].load(Ordering::Relaxed);
                (failure.label(), count)
            })
            .collect()
    }
}

fn invalid(reason: String) -> ConfigError {
    ConfigError::Invalid {
        field: "tls-cert-file",
        reason,
    }
}

fn read_contents(files: &Files) -> Result<Contents, String> {
    let mut contents = vec![pem::read_file(&files.cert)?, pem::read_file(&files.key)?];
    if let Some(ca) = &files.ca {
        contents.push(pem::read_file(ca)?);
    }
    Ok(contents)
}

/// A server config from the files' contents (cert, key, then the CA when given).
fn build(
    files: &Files,
    contents: &Contents,
    client_auth: ClientAuth,
) -> Result<ServerConfig, String> {
    let chain = pem::certificates_from_pem(&contents[0], &files.cert)?;
    let key = pem::private_key_from_pem(&contents[1], &files.key)?;
    let builder = ServerConfig::builder_with_provider(pem::provider())
        .with_safe_default_protocol_versions()
        .map_err(|error| format!("TLS server settings: {error}"))?;
    let builder = match (client_auth, &files.ca, contents.get(2)) {
        (ClientAuth::None, _, _) => builder.with_no_client_auth(),
        (auth, Some(ca), Some(ca_pem)) => {
            let roots = Arc::new(pem::root_store_from_pem(ca_pem, ca)?);
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, pem::provider());
            let verifier = match auth {
                ClientAuth::Optional => verifier.allow_unauthenticated(),
                _ => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|error| format!("{}: {error}", ca.display()))?;
            builder.with_client_cert_verifier(verifier)
        }
        _ => return Err("client certificates need --tls-ca-file".into()),
    };
    builder.with_single_cert(chain, key).map_err(|error| {
        format!(
            "{} and {}: {error}",
            files.cert.display(),
            files.key.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_hello_is_tls_and_a_frame_length_is_plain() {
        assert_eq!(classify(0x16), FirstByte::Tls);
        // A RocketMQ frame's length, big-endian: small frames start with 0x00.
        for frame_length in [0u32, 200, 4 * 1024 * 1024, 16 * 1024 * 1024] {
            assert_eq!(classify(frame_length.to_be_bytes()[0]), FirstByte::Plain);
        }
        // The smallest length whose first byte is 0x16 is ~369 MB: no valid frame.
        assert!(0x1600_0000u32 > quiver_protocol::MAX_FRAME_BYTES as u32);
    }

    #[test]
    fn handshake_failures_are_told_apart() {
        let io = |error: rustls::Error| std::io::Error::new(std::io::ErrorKind::InvalidData, error);
        assert_eq!(
            HandshakeFailure::of(&io(rustls::Error::NoCertificatesPresented)),
            HandshakeFailure::ClientCertificate
        );
        assert_eq!(
            HandshakeFailure::of(&io(rustls::Error::HandshakeNotComplete)),
            HandshakeFailure::Protocol
        );
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(HandshakeFailure::of(&reset), HandshakeFailure::Io);
    }

    fn write_certificate(dir: &std::path::Path) -> BrokerConfig {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, certified.cert.pem()).unwrap();
        std::fs::write(&key, certified.key_pair.serialize_pem()).unwrap();
        BrokerConfig {
            tls_mode: crate::config::TlsMode::Enforcing,
            tls_cert_file: Some(cert),
            tls_key_file: Some(key),
            ..BrokerConfig::default()
        }
    }

    #[test]
    fn a_bad_new_file_keeps_the_certificate_and_a_good_one_replaces_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = write_certificate(dir.path());
        let tls = TlsServer::load(&config).unwrap().expect("TLS on");
        tls.reload_if_changed();
        assert_eq!(
            tls.reload_counts(),
            (0, 0),
            "unchanged files are not reloaded"
        );
        let before = tls.configs.read().remoting.clone();
        std::fs::write(config.tls_cert_file.as_ref().unwrap(), "garbage").unwrap();
        tls.reload_if_changed();
        tls.reload_if_changed();
        assert_eq!(tls.reload_counts(), (0, 1), "one failure per bad version");
        assert!(Arc::ptr_eq(&before, &tls.configs.read().remoting));
        write_certificate(dir.path());
        tls.reload_if_changed();
        assert_eq!(tls.reload_counts(), (1, 1));
        assert!(!Arc::ptr_eq(&before, &tls.configs.read().remoting));
    }

    #[test]
    fn load_refuses_a_missing_key_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = BrokerConfig {
            tls_key_file: Some(dir.path().join("missing.key")),
            ..write_certificate(dir.path())
        };
        let error = TlsServer::load(&config).err().expect("no key").to_string();
        assert!(error.contains("missing.key"), "{error}");
    }
}
