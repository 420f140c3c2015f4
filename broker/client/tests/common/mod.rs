//! A real quiver-broker in-process on loopback, plus condition waits with deadlines.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use quiver_broker::BrokerConfig;
use quiver_client::{
    Admin, ClientConfig, ConsumeOutcome, Listener, Message, Producer, ProducerConfig,
    PushConsumerConfig, ReceivedMessage, TopicSpec,
};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestBroker {
    pub addr: String,
    config: BrokerConfig,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), quiver_broker::BrokerError>>>,
    _data: Arc<tempfile::TempDir>,
}

impl TestBroker {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut BrokerConfig)) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind remoting");
        let data = Arc::new(tempfile::tempdir().expect("temp dir"));
        let mut config = Self::config(&listener, &data);
        adjust(&mut config);
        Self::launch(config, listener, data).await
    }

    /// Brokers that know each other as peers, so each route lists the whole cluster.
    pub async fn start_cluster(size: usize) -> Vec<Self> {
        Self::start_cluster_with(size, |_| {}).await
    }

    /// As [`Self::start_cluster`], each broker's config adjusted by `adjust`.
    pub async fn start_cluster_with(size: usize, adjust: impl Fn(&mut BrokerConfig)) -> Vec<Self> {
        let mut listeners = Vec::with_capacity(size);
        for _ in 0..size {
            listeners.push(
                TcpListener::bind("127.0.0.1:0")
                    .await
                    .expect("bind remoting"),
            );
        }
        let addrs: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().expect("addr").to_string())
            .collect();
        let mut brokers = Vec::with_capacity(size);
        for (index, listener) in listeners.into_iter().enumerate() {
            let data = Arc::new(tempfile::tempdir().expect("temp dir"));
            let mut config = Self::config(&listener, &data);
            config.broker_name = format!("broker-{index}");
            config.peers = addrs
                .iter()
                .filter(|a| **a != addrs[index])
                .cloned()
                .collect();
            adjust(&mut config);
            brokers.push(Self::launch(config, listener, data).await);
        }
        brokers
    }

    fn config(listener: &TcpListener, data: &tempfile::TempDir) -> BrokerConfig {
        let addr = listener.local_addr().expect("local addr").to_string();
        BrokerConfig {
            data_dir: data.path().to_path_buf(),
            listen: addr.clone(),
            http_listen: "127.0.0.1:0".into(),
            advertise: Some(addr),
            segment_size: 8 * 1024 * 1024,
            ..BrokerConfig::default()
        }
    }

    async fn launch(
        mut config: BrokerConfig,
        listener: TcpListener,
        data: Arc<tempfile::TempDir>,
    ) -> Self {
        let http = TcpListener::bind("127.0.0.1:0").await.expect("bind http");
        config.http_listen = http.local_addr().expect("http addr").to_string();
        let addr = listener.local_addr().expect("local addr").to_string();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(quiver_broker::run(
            config.clone(),
            listener,
            Some(http),
            async move {
                stopped.await.ok();
            },
        ));
        Self {
            addr,
            config,
            stop: Some(stop),
            task: Some(task),
            _data: data,
        }
    }

    /// Stops the broker and waits (bounded) for it to exit cleanly.
    pub async fn stop(mut self) {
        self.halt().await;
    }

    async fn halt(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let result = tokio::time::timeout(Duration::from_secs(15), task).await;
            let outcome = result
                .expect("broker stops within 15 s")
                .expect("broker task did not panic");
            outcome.expect("broker exits cleanly");
        }
    }

    /// Stops and starts the broker again on the same address and data directory.
    pub async fn restart(mut self) -> Self {
        self.halt().await;
        let started = Instant::now();
        let listener = loop {
            match TcpListener::bind(&self.addr).await {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(
                        started.elapsed() < Duration::from_secs(10),
                        "cannot rebind {}: {error}",
                        self.addr
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        Self::launch(self.config.clone(), listener, self._data.clone()).await
    }

    /// host:port of the broker's HTTP port (/metrics, /healthz, /readyz).
    pub fn http_addr(&self) -> &str {
        &self.config.http_listen
    }

    pub fn client(&self) -> ClientConfig {
        ClientConfig::new(&self.addr)
    }

    pub fn producer(&self) -> Producer {
        Producer::new(ProducerConfig::new(&self.addr))
    }

    pub async fn create_topic(&self, topic: &str, queues: u32) {
        let admin = Admin::new(self.client());
        admin
            .create_topic(&TopicSpec::new(topic, queues))
            .await
            .unwrap_or_else(|error| panic!("create topic {topic}: {error:?}"));
        admin.shutdown().await;
    }

    /// A consumer config with short timers so rebalances and commits happen within a test.
    pub fn consumer_config(&self, group: &str, topic: &str) -> PushConsumerConfig {
        let mut config = PushConsumerConfig::new(&self.addr, group).subscribe(topic, "*");
        config.long_poll = Duration::from_millis(500);
        config.heartbeat_interval = Duration::from_millis(500);
        config.rebalance_interval = Duration::from_millis(500);
        config.persist_interval = Duration::from_millis(200);
        config.retry_pause = Duration::from_millis(100);
        config
    }
}

impl Drop for TestBroker {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Polls `condition` until it holds or the deadline passes (then panics naming `what`).
pub async fn wait_until(what: &str, deadline: Duration, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < deadline,
            "timed out after {deadline:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Everything a listener saw, in delivery order.
#[derive(Clone, Default)]
pub struct Received {
    pub messages: Arc<Mutex<Vec<ReceivedMessage>>>,
}

impl Received {
    pub fn listener(&self) -> Listener {
        let messages = self.messages.clone();
        Arc::new(move |batch: &[ReceivedMessage]| {
            messages.lock().extend_from_slice(batch);
            ConsumeOutcome::Success
        })
    }

    pub fn len(&self) -> usize {
        self.messages.lock().len()
    }

    pub fn bodies(&self) -> Vec<String> {
        self.messages
            .lock()
            .iter()
            .map(|m| String::from_utf8_lossy(&m.body).into_owned())
            .collect()
    }

    /// How often each body was delivered.
    pub fn counts(&self) -> HashMap<String, usize> {
        let mut counts = HashMap::new();
        for body in self.bodies() {
            *counts.entry(body).or_default() += 1;
        }
        counts
    }
}

/// Sends `count` messages with bodies `{prefix}-{i}`; returns the bodies.
pub async fn produce(producer: &Producer, topic: &str, prefix: &str, count: usize) -> Vec<String> {
    let mut bodies = Vec::with_capacity(count);
    for i in 0..count {
        let body = format!("{prefix}-{i}");
        producer
            .send(Message::new(topic, body.clone()))
            .await
            .expect("send");
        bodies.push(body);
    }
    bodies
}
