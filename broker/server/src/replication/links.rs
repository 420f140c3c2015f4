//! Connections to the other members of the group, opened on first use and dropped on error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use quiver_protocol::acl::Credentials;
use quiver_protocol::RemotingCommand;
use quiver_remoting::tls::TlsClientConfig;
use quiver_remoting::Connection;

use crate::peers::{connect, PeerError};

struct Link {
    connection: Connection,
    reading: tokio::task::JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.connection.close();
        self.reading.abort();
    }
}

pub(super) struct Links {
    credentials: Option<Arc<Credentials>>,
    tls: Option<TlsClientConfig>,
    open: tokio::sync::Mutex<HashMap<String, Arc<Link>>>,
}

/// Why a request to a member got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LinkError {
    #[error(transparent)]
    Connect(#[from] PeerError),
    #[error("member {address} did not answer")]
    Request {
        address: String,
        #[source]
        source: quiver_remoting::ConnectionError,
    },
}

impl Links {
    pub(super) fn new(credentials: Option<Credentials>, tls: Option<TlsClientConfig>) -> Links {
        Links {
            credentials: credentials.map(Arc::new),
            tls,
            open: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    async fn link(&self, address: &str) -> Result<Arc<Link>, PeerError> {
        let mut open = self.open.lock().await;
        if let Some(link) = open.get(address).filter(|l| !l.connection.is_closed()) {
            return Ok(link.clone());
        }
        let (connection, reading) =
            connect(address, self.credentials.clone(), self.tls.as_ref()).await?;
        let link = Arc::new(Link {
            connection,
            reading,
        });
        open.insert(address.to_owned(), link.clone());
        Ok(link)
    }

    /// Sends `request` to the member at `address` and waits at most `timeout` for its answer
    /// (any code). A failed connection is dropped, so the next request opens a new one.
    pub(super) async fn request(
        &self,
        address: &str,
        request: RemotingCommand,
        timeout: Duration,
    ) -> Result<RemotingCommand, LinkError> {
        let connect = tokio::time::timeout(timeout, self.link(address));
        let link = match connect.await {
            Ok(linked) => linked?,
            Err(_) => {
                return Err(LinkError::Connect(PeerError::Io {
                    address: address.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                }))
            }
        };
        match link.connection.request(request, timeout).await {
            Ok(answer) => Ok(answer),
            Err(source) => {
                self.open.lock().await.remove(address);
                Err(LinkError::Request {
                    address: address.to_owned(),
                    source,
                })
            }
        }
    }
}
