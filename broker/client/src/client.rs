//! What producers, consumers and the admin share: the connections, the name-server
//! addresses, the route cache and the client id.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use quiver_protocol::acl::Credentials;
use quiver_protocol::body::{perm, TopicRouteData};
use quiver_protocol::header::GetRouteInfoRequestHeader;
use quiver_protocol::{code, RemotingCommand};
use tokio::sync::mpsc;

use crate::error::{ClientError, Result};
use crate::remoting::{expect_success, InboundRequest, RemotingClient};
use crate::MessageQueue;
use crate::TlsConfig;

/// Where and how a client connects.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Name-server addresses (any Quiver broker answers route look-ups), tried in order.
    pub name_servers: Vec<String>,
    /// Deadline of one request/response exchange.
    pub request_timeout: Duration,
    /// A cached route older than this is looked up again before use.
    pub route_ttl: Duration,
    /// The ACL account every request is signed with; None: unsigned.
    pub credentials: Option<Credentials>,
    /// Every connection (name servers, brokers) is TLS when set; None: plain.
    pub tls: Option<TlsConfig>,
}

impl ClientConfig {
    /// From a comma-separated `host:port[,host:port]` list.
    pub fn new(servers: &str) -> Self {
        Self {
            name_servers: servers
                .split([',', ';'])
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            request_timeout: Duration::from_secs(3),
            route_ttl: Duration::from_secs(30),
            credentials: None,
            tls: None,
        }
    }

    /// Opens every connection with TLS (brokers with `--tls-mode enforcing` refuse plain ones).
    pub fn with_tls(mut self, tls: TlsConfig) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Signs every request with this account (brokers with ACL on refuse unsigned ones).
    pub fn with_credentials(mut self, access_key: &str, secret_key: &str) -> Self {
        self.credentials = Some(Credentials::new(access_key, secret_key));
        self
    }

    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }
}

/// One broker's master address plus the topic's queues on it, as the route says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicRoute {
    pub topic: String,
    /// broker name -> master address.
    pub brokers: BTreeMap<String, String>,
    /// Queues a producer may write (permission bit 2), sorted.
    pub write_queues: Vec<MessageQueue>,
    /// Queues a consumer may read (permission bit 4), sorted.
    pub read_queues: Vec<MessageQueue>,
}

impl TopicRoute {
    pub fn from_route_data(topic: &str, data: &TopicRouteData) -> Self {
        let mut brokers = BTreeMap::new();
        for broker in &data.broker_datas {
            if let Some(addr) = broker.master_addr() {
                brokers.insert(broker.broker_name.clone(), addr.to_owned());
            }
        }
        let mut write_queues = Vec::new();
        let mut read_queues = Vec::new();
        for queue_data in &data.queue_datas {
            if !brokers.contains_key(&queue_data.broker_name) {
                continue;
            }
            let queue = |queue_id: u32| MessageQueue::new(topic, &queue_data.broker_name, queue_id);
            if perm::is_writeable(queue_data.perm) {
                write_queues.extend((0..queue_data.write_queue_nums).map(queue));
            }
            if perm::is_readable(queue_data.perm) {
                read_queues.extend((0..queue_data.read_queue_nums).map(queue));
            }
        }
        write_queues.sort();
        read_queues.sort();
        Self {
            topic: topic.to_owned(),
            brokers,
            write_queues,
            read_queues,
        }
    }

    pub fn broker_addr(&self, broker_name: &str) -> Option<&str> {
        self.brokers.get(broker_name).map(String::as_str)
    }
}

/// The shared client state; producers and consumers hold it in an `Arc`.
pub struct ClientCore {
    pub(crate) remoting: RemotingClient,
    pub(crate) config: ClientConfig,
    pub(crate) client_id: String,
    routes: Mutex<HashMap<String, (Instant, Arc<TopicRoute>)>>,
    /// broker name -> address, learnt from every route fetched.
    broker_addrs: Mutex<BTreeMap<String, String>>,
    next_name_server: AtomicUsize,
}

impl ClientCore {
    pub fn new(config: ClientConfig) -> Arc<Self> {
        Self::build(config, RemotingClient::new())
    }

    /// A core whose broker-initiated requests go to `inbound` (push consumers).
    pub fn with_inbound(
        config: ClientConfig,
        inbound: mpsc::UnboundedSender<InboundRequest>,
    ) -> Arc<Self> {
        Self::build(config, RemotingClient::with_inbound(inbound))
    }

    fn build(config: ClientConfig, remoting: RemotingClient) -> Arc<Self> {
        Arc::new(Self {
            remoting: remoting
                .with_credentials(config.credentials.clone())
                .with_tls(config.tls.clone()),
            config,
            client_id: new_client_id(),
            routes: Mutex::new(HashMap::new()),
            broker_addrs: Mutex::new(BTreeMap::new()),
            next_name_server: AtomicUsize::new(0),
        })
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    pub fn request_timeout(&self) -> Duration {
        self.config.request_timeout
    }

    /// Request/response with the default timeout.
    pub async fn invoke(&self, addr: &str, request: RemotingCommand) -> Result<RemotingCommand> {
        self.remoting
            .invoke(addr, request, self.config.request_timeout)
            .await
    }

    pub async fn invoke_oneway(&self, addr: &str, request: RemotingCommand) -> Result<()> {
        self.remoting.invoke_oneway(addr, request).await
    }

    /// Sends to the name servers, starting with the last one that worked, until one answers.
    pub async fn invoke_name_server(
        &self,
        request: RemotingCommand,
    ) -> Result<(String, RemotingCommand)> {
        let servers = &self.config.name_servers;
        if servers.is_empty() {
            return Err(ClientError::InvalidArgument {
                what: "name server",
                reason: "no address given".into(),
            });
        }
        let start = self.next_name_server.load(Ordering::Relaxed);
        let mut last_error = None;
        for attempt in 0..servers.len() {
            let index = (start + attempt) % servers.len();
            let addr = &servers[index];
            match self.invoke(addr, request.clone()).await {
                Ok(response) => {
                    self.next_name_server.store(index, Ordering::Relaxed);
                    return Ok((addr.clone(), response));
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(ClientError::Shutdown))
    }

    /// Asks a name server for the topic's route and caches it.
    pub async fn fetch_route(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        let header = GetRouteInfoRequestHeader {
            topic: topic.to_owned(),
        };
        let request =
            RemotingCommand::request(code::request::GET_ROUTEINFO_BY_TOPIC, header.to_ext());
        let (addr, response) = self.invoke_name_server(request).await?;
        if response.code == code::response::TOPIC_NOT_EXIST {
            self.routes.lock().remove(topic);
            return Err(ClientError::TopicNotFound {
                topic: topic.to_owned(),
            });
        }
        let response = expect_success(&addr, code::request::GET_ROUTEINFO_BY_TOPIC, response)?;
        let data = TopicRouteData::decode(&response.body).map_err(|source| ClientError::Body {
            addr: addr.clone(),
            request_code: code::request::GET_ROUTEINFO_BY_TOPIC,
            source,
        })?;
        let route = Arc::new(TopicRoute::from_route_data(topic, &data));
        self.broker_addrs
            .lock()
            .extend(route.brokers.iter().map(|(n, a)| (n.clone(), a.clone())));
        self.routes
            .lock()
            .insert(topic.to_owned(), (Instant::now(), route.clone()));
        Ok(route)
    }

    /// The cached route, fetched on first use and again once older than the TTL.
    pub async fn route(&self, topic: &str) -> Result<Arc<TopicRoute>> {
        let cached = self.routes.lock().get(topic).cloned();
        if let Some((fetched, route)) = cached {
            if fetched.elapsed() < self.config.route_ttl {
                return Ok(route);
            }
        }
        self.fetch_route(topic).await
    }

    /// Refreshes every cached route (called on a timer by long-lived clients).
    pub async fn refresh_routes(&self) {
        let topics: Vec<String> = self.routes.lock().keys().cloned().collect();
        for topic in topics {
            if let Err(error) = self.fetch_route(&topic).await {
                tracing::debug!(%topic, %error, "route refresh failed");
            }
        }
    }

    pub fn broker_addr(&self, broker_name: &str) -> Result<String> {
        self.broker_addrs
            .lock()
            .get(broker_name)
            .cloned()
            .ok_or_else(|| ClientError::NoBrokerAddress {
                broker_name: broker_name.to_owned(),
            })
    }

    /// Every broker address learnt from routes.
    pub fn known_brokers(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self.broker_addrs.lock().values().cloned().collect();
        addrs.sort();
        addrs.dedup();
        addrs
    }

    pub async fn shutdown(&self) {
        self.remoting.close_all().await;
    }
}

/// `ip@pid#n`: unique per client instance, also when a process runs several.
fn new_client_id() -> String {
    static INSTANCE: AtomicU64 = AtomicU64::new(0);
    let instance = INSTANCE.fetch_add(1, Ordering::Relaxed);
    let nonce: u32 = rand::random();
    format!("127.0.0.1@{}#{instance}#{nonce:08x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use quiver_protocol::body::{BrokerData, QueueData};

    use super::*;

    fn broker(name: &str, addr: &str) -> BrokerData {
        BrokerData {
            cluster: "c".into(),
            broker_name: name.into(),
            broker_addrs: BTreeMap::from([(0, addr.to_owned())]),
            ..Default::default()
        }
    }

    fn queues(name: &str, nums: u32, perm: i32) -> QueueData {
        QueueData {
            broker_name: name.into(),
            read_queue_nums: nums,
            write_queue_nums: nums,
            perm,
            ..Default::default()
        }
    }

    #[test]
    fn read_only_broker_is_readable_but_not_writable() {
        let data = TopicRouteData {
            queue_datas: vec![queues("b0", 2, 6), queues("b1", 2, 4)],
            broker_datas: vec![
                broker("b0", "10.0.0.1:10911"),
                broker("b1", "10.0.0.2:10911"),
            ],
            ..Default::default()
        };
        let route = TopicRoute::from_route_data("t", &data);
        assert_eq!(route.write_queues.len(), 2);
        assert!(route.write_queues.iter().all(|q| q.broker_name == "b0"));
        assert_eq!(route.read_queues.len(), 4);
        assert_eq!(route.broker_addr("b1"), Some("10.0.0.2:10911"));
    }

    #[test]
    fn queues_of_a_broker_without_master_address_are_skipped() {
        let mut slave_only = broker("b1", "10.0.0.2:10911");
        slave_only.broker_addrs = BTreeMap::from([(1, "10.0.0.3:10911".to_owned())]);
        let data = TopicRouteData {
            queue_datas: vec![queues("b0", 1, 6), queues("b1", 1, 6)],
            broker_datas: vec![broker("b0", "10.0.0.1:10911"), slave_only],
            ..Default::default()
        };
        let route = TopicRoute::from_route_data("t", &data);
        assert_eq!(route.read_queues, vec![MessageQueue::new("t", "b0", 0)]);
    }

    #[test]
    fn server_lists_accept_commas_semicolons_and_spaces() {
        let config = ClientConfig::new(" a:1, b:2;c:3 ,");
        assert_eq!(config.name_servers, vec!["a:1", "b:2", "c:3"]);
    }
}
