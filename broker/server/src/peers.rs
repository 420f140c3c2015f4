//! The other brokers of the cluster (from `--peers`): polled for their name, permission and
//! topics so every broker answers routes for the whole cluster. The list follows the config
//! file while the broker runs ([`reload`]).

pub mod reload;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use quiver_protocol::acl::Credentials;
use quiver_protocol::code::{request, response};
use quiver_protocol::{ExtFields, RemotingCommand};
use quiver_remoting::tls::TlsClientConfig;
use quiver_remoting::{Connection, ConnectionError, Options};
use tokio::net::TcpStream;

use quiver_protocol::body::{TopicConfig, TopicConfigSerializeWrapper};

/// The GET_BROKER_CONFIG key naming where a broker serves gRPC.
pub const GRPC_ENDPOINT_KEY: &str = "grpcEndpoint";

/// The GET_BROKER_CONFIG key of a group member's route addresses: `id/host:port,...`, the
/// current master as id 0.
pub const GROUP_ADDRESSES_KEY: &str = "quiverGroupAddrs";

/// How often peers are asked for their state.
pub(crate) const POLL_INTERVAL: Duration = Duration::from_secs(2);
const PEER_TIMEOUT: Duration = Duration::from_secs(3);

/// Why a peer could not be asked for its state.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    #[error("cannot reach peer {address}")]
    Io {
        address: String,
        #[source]
        source: std::io::Error,
    },
    #[error("peer {address} did not answer")]
    Connection {
        address: String,
        #[source]
        source: ConnectionError,
    },
    #[error("peer {address} answered code {code}: {remark}")]
    Refused {
        address: String,
        code: i32,
        remark: String,
    },
    #[error("peer {address} sent an unreadable {what}: {reason}")]
    Body {
        address: String,
        what: &'static str,
        reason: String,
    },
}

/// What this broker knows about one peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub address: String,
    pub broker_name: String,
    pub cluster: String,
    pub permission: i32,
    pub topics: BTreeMap<String, TopicConfig>,
    /// Where the peer serves gRPC (its `grpcEndpoint`); None when it does not.
    pub grpc_endpoint: Option<String>,
    /// By broker id: its group's members when it is one (the master as 0), else itself as 0.
    pub addresses: BTreeMap<i64, String>,
}

/// The latest answer of each reachable peer.
pub struct PeerView {
    addresses: RwLock<Vec<String>>,
    known: RwLock<HashMap<String, PeerInfo>>,
}

impl PeerView {
    pub fn new(addresses: &[String]) -> PeerView {
        PeerView {
            addresses: RwLock::new(addresses.to_vec()),
            known: RwLock::new(HashMap::new()),
        }
    }

    /// Peers that answered, in configured order.
    pub fn snapshot(&self) -> Vec<PeerInfo> {
        let addresses = self.addresses.read();
        let known = self.known.read();
        addresses
            .iter()
            .filter_map(|address| known.get(address).cloned())
            .collect()
    }

    /// The peers to poll, in configured order.
    pub fn addresses(&self) -> Vec<String> {
        self.addresses.read().clone()
    }

    /// Takes a new list of peers: a new one is polled from the next round on, a removed one is
    /// forgotten at once (routes and cluster info leave it out). False when nothing changed.
    pub fn set_addresses(&self, addresses: &[String]) -> bool {
        let mut current = self.addresses.write();
        if current.as_slice() == addresses {
            return false;
        }
        *current = addresses.to_vec();
        self.known
            .write()
            .retain(|address, _| addresses.contains(address));
        true
    }

    /// Keeps a peer's answer, unless the peer left the list while it was asked.
    fn update(&self, info: PeerInfo) {
        let addresses = self.addresses.read();
        if addresses.contains(&info.address) {
            self.known.write().insert(info.address.clone(), info);
        }
    }

    fn forget(&self, address: &str) {
        self.known.write().remove(address);
    }
}

impl PeerView {
    /// One round: asks every peer but `own` (this broker's address) for its name,
    /// permission and topics; a peer that does not answer in time is forgotten. Nothing to do
    /// while the list is empty (it may gain peers later).
    pub async fn poll_all(
        &self,
        own: &str,
        credentials: Option<&Arc<Credentials>>,
        tls: Option<&TlsClientConfig>,
    ) {
        for address in self.addresses() {
            if address == own {
                continue;
            }
            let polled = poll(&address, credentials.cloned(), tls);
            match tokio::time::timeout(PEER_TIMEOUT, polled).await {
                Ok(Ok(info)) => self.update(info),
                Ok(Err(error)) => {
                    tracing::debug!(error = %crate::error::chain(&error), "peer poll failed");
                    self.forget(&address);
                }
                Err(_) => {
                    tracing::debug!(peer = %address, "peer poll timed out");
                    self.forget(&address);
                }
            }
        }
    }
}

/// `id/host:port,...` as GROUP_ADDRESSES_KEY lists them; entries that do not parse are left out.
fn parse_group_addresses(listed: &str) -> BTreeMap<i64, String> {
    listed
        .split(',')
        .filter_map(|entry| {
            let (id, address) = entry.trim().split_once('/')?;
            Some((id.parse().ok()?, address.to_owned()))
        })
        .collect()
}

/// A connection to a broker of the cluster and the task reading its answers (abort it after
/// closing): signed when `credentials` are given, over TLS when `tls` is.
pub(crate) async fn connect(
    address: &str,
    credentials: Option<Arc<Credentials>>,
    tls: Option<&TlsClientConfig>,
) -> Result<(Connection, tokio::task::JoinHandle<()>), PeerError> {
    let io_error = |source| PeerError::Io {
        address: address.to_string(),
        source,
    };
    let stream = TcpStream::connect(address).await.map_err(io_error)?;
    let options = Options {
        credentials,
        ..Options::new(address)
    };
    let connector = match tls {
        Some(tls) => Some(
            tls.connector()
                .map_err(|reason| io_error(std::io::Error::other(reason)))?,
        ),
        None => None,
    };
    let (connection, mut incoming) =
        quiver_remoting::tls::start(stream, address, connector.as_ref(), options)
            .await
            .map_err(io_error)?;
    // The reader routes the answers; the peer sends nothing else.
    let reading = tokio::spawn(async move { while let Ok(Some(_)) = incoming.next().await {} });
    Ok((connection, reading))
}

/// Asks one peer for its config and topics; signed when `credentials` are given, over TLS
/// when `tls` is (the files are read again each poll: a renewed certificate is used).
async fn poll(
    address: &str,
    credentials: Option<Arc<Credentials>>,
    tls: Option<&TlsClientConfig>,
) -> Result<PeerInfo, PeerError> {
    let (connection, reading) = connect(address, credentials, tls).await?;
    let answers = ask_config_and_topics(&connection, address).await;
    connection.close();
    reading.abort();
    let (config, topics) = answers?;
    let properties: HashMap<String, String> = String::from_utf8_lossy(&config.body)
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let body_error = |what: &'static str, reason: String| PeerError::Body {
        address: address.to_string(),
        what,
        reason,
    };
    let topics = TopicConfigSerializeWrapper::decode(&topics.body)
        .map_err(|e| body_error("topic table", crate::error::chain(&e)))?
        .topic_config_table;
    let broker_name = properties
        .get("brokerName")
        .cloned()
        .ok_or_else(|| body_error("broker config", "no brokerName".into()))?;
    Ok(PeerInfo {
        address: address.to_string(),
        broker_name,
        cluster: properties
            .get("brokerClusterName")
            .cloned()
            .unwrap_or_default(),
        permission: properties
            .get("brokerPermission")
            .and_then(|p| p.parse().ok())
            .unwrap_or(quiver_protocol::body::perm::READ_WRITE),
        topics,
        grpc_endpoint: properties
            .get(GRPC_ENDPOINT_KEY)
            .filter(|endpoint| !endpoint.is_empty())
            .cloned(),
        addresses: properties
            .get(GROUP_ADDRESSES_KEY)
            .map(|listed| parse_group_addresses(listed))
            .unwrap_or_else(|| BTreeMap::from([(0, address.to_string())])),
    })
}

async fn ask_config_and_topics(
    connection: &Connection,
    address: &str,
) -> Result<(RemotingCommand, RemotingCommand), PeerError> {
    let config = call(connection, address, request::GET_BROKER_CONFIG).await?;
    let topics = call(connection, address, request::GET_ALL_TOPIC_CONFIG).await?;
    Ok((config, topics))
}

async fn call(
    connection: &Connection,
    address: &str,
    code: i32,
) -> Result<RemotingCommand, PeerError> {
    let request = RemotingCommand::request(code, ExtFields::default());
    let reply = connection
        .request(request, PEER_TIMEOUT)
        .await
        .map_err(|source| PeerError::Connection {
            address: address.to_string(),
            source,
        })?;
    if reply.code != response::SUCCESS {
        return Err(PeerError::Refused {
            address: address.to_string(),
            code: reply.code,
            remark: reply.remark.unwrap_or_default(),
        });
    }
    Ok(reply)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(address: &str) -> PeerInfo {
        PeerInfo {
            address: address.to_owned(),
            broker_name: format!("b-{address}"),
            cluster: "C".to_owned(),
            permission: quiver_protocol::body::perm::READ_WRITE,
            topics: BTreeMap::new(),
            grpc_endpoint: None,
            addresses: BTreeMap::from([(0, address.to_owned())]),
        }
    }

    #[test]
    fn a_new_list_drops_removed_peers_and_keeps_no_late_answer_of_theirs() {
        let view = PeerView::new(&["a:1".to_owned(), "b:2".to_owned()]);
        view.update(info("a:1"));
        view.update(info("b:2"));
        assert!(!view.set_addresses(&["a:1".to_owned(), "b:2".to_owned()]));
        assert!(view.set_addresses(&["b:2".to_owned(), "c:3".to_owned()]));
        let names = |view: &PeerView| -> Vec<String> {
            view.snapshot()
                .into_iter()
                .map(|peer| peer.address)
                .collect()
        };
        assert_eq!(names(&view), ["b:2"], "a:1 forgotten, c:3 not polled yet");
        // An answer of a:1 asked before its removal arrives after it.
        view.update(info("a:1"));
        view.update(info("c:3"));
        assert_eq!(names(&view), ["b:2", "c:3"]);
        assert!(view.set_addresses(&[]));
        assert!(view.snapshot().is_empty() && view.addresses().is_empty());
    }

    #[test]
    fn a_group_members_addresses_keep_their_broker_ids() {
        let parsed = parse_group_addresses("0/10.0.0.2:10911, 1/10.0.0.1:10911,bad,x/h:1");
        assert_eq!(
            parsed,
            BTreeMap::from([
                (0, "10.0.0.2:10911".to_owned()),
                (1, "10.0.0.1:10911".to_owned())
            ])
        );
    }
}
