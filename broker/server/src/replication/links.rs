//! Connections to the other members of the group, opened on first use and dropped on error.
//! Each member has its own slot: a connect to a member that drops packets waits out its own
//! deadline and never holds up messages to the others.

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

/// One member's connection, opened by the first request that finds none.
type Slot = Arc<tokio::sync::Mutex<Option<Arc<Link>>>>;

pub(super) struct Links {
    credentials: Option<Arc<Credentials>>,
    tls: Option<TlsClientConfig>,
    slots: parking_lot::Mutex<HashMap<String, Slot>>,
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
            slots: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    fn slot(&self, address: &str) -> Slot {
        self.slots
            .lock()
            .entry(address.to_owned())
            .or_default()
            .clone()
    }

    /// The open connection to `address`, or a new one; only requests to the same member
    /// wait while it connects.
    async fn link(&self, address: &str) -> Result<Arc<Link>, PeerError> {
        let slot = self.slot(address);
        let mut open = slot.lock().await;
        if let Some(link) = open.as_ref().filter(|l| !l.connection.is_closed()) {
            return Ok(link.clone());
        }
        let (connection, reading) =
            connect(address, self.credentials.clone(), self.tls.as_ref()).await?;
        let link = Arc::new(Link {
            connection,
            reading,
        });
        *open = Some(link.clone());
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
        let deadline = tokio::time::Instant::now() + timeout;
        let connect = tokio::time::timeout_at(deadline, self.link(address));
        let link = match connect.await {
            Ok(linked) => linked?,
            Err(_) => {
                return Err(LinkError::Connect(PeerError::Io {
                    address: address.to_owned(),
                    source: std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"),
                }))
            }
        };
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match link.connection.request(request, left).await {
            Ok(answer) => Ok(answer),
            Err(source) => {
                // Closed, so the next request opens a new one; never waits on the slot,
                // which a connect to the same member may hold.
                link.connection.close();
                Err(LinkError::Request {
                    address: address.to_owned(),
                    source,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_protocol::code::request;

    /// A member that drops packets stalls a connect until its deadline. Here a listener that
    /// accepts and never speaks stalls the TLS handshake the same way; while a request to it
    /// hangs, a request to another member (a closed port) must fail at once with its own
    /// error, not wait behind it and time out.
    #[tokio::test]
    async fn a_member_that_never_answers_holds_up_no_other() {
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_address = silent.local_addr().unwrap().to_string();
        let held = tokio::spawn(async move {
            let mut sockets = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                sockets.push(socket);
            }
        });
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed_address = closed.local_addr().unwrap().to_string();
        drop(closed);

        let links = Arc::new(Links::new(None, Some(TlsClientConfig::default())));
        let hanging = {
            let links = links.clone();
            tokio::spawn(async move {
                let ping = RemotingCommand::request(request::HEART_BEAT, Default::default());
                links
                    .request(&silent_address, ping, Duration::from_secs(30))
                    .await
            })
        };
        // Give the hanging request time to take its slot and start connecting.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let ping = RemotingCommand::request(request::HEART_BEAT, Default::default());
        let other = links
            .request(&closed_address, ping, Duration::from_secs(10))
            .await;
        match other {
            Err(LinkError::Connect(PeerError::Io { source, .. })) => assert_eq!(
                source.kind(),
                std::io::ErrorKind::ConnectionRefused,
                "the other member's own error, not a wait behind the silent one: {source}"
            ),
            other => panic!("expected the closed port's refusal, got {other:?}"),
        }
        assert!(
            !hanging.is_finished(),
            "the silent member's handshake still hangs"
        );
        hanging.abort();
        held.abort();
    }
}
