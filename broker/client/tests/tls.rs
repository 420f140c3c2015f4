//! TLS on the remoting and HTTP ports, with the Rust client: permissive mode serves TLS and
//! plain clients; enforcing mode closes plain ones while TLS connections go on; client
//! certificates are checked when required; a certificate swapped on disk is served to new
//! connections without a restart; producers, pull and push consumers, admin and peer polls
//! work over TLS; bad handshakes fail alone; the HTTP port serves /metrics over TLS.
//! Certificates are made here with rcgen.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{wait_until, Received, TestBroker};
use quiver_broker::{BrokerConfig, ClientAuth, TlsMode};
use quiver_client::{
    Admin, ClientConfig, ConsumeFromWhere, Message, Producer, ProducerConfig, PullConsumer,
    PullStatus, PushConsumer, QueueSelector, Subscription, TlsConfig, TopicSpec,
};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

/// A CA and the files of a server certificate (for localhost and 127.0.0.1) and of a client
/// certificate it signed, as cert-manager's Secret lays them out.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    /// Writes a fresh CA and certificates into `dir`, `tag` naming the files.
    fn write(dir: &Path, tag: &str) -> Pki {
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("Quiver test CA {tag}"));
        let ca_key = KeyPair::generate().unwrap();
        let ca_cert = ca_params.self_signed(&ca_key).unwrap();
        let leaf = |names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut params = CertificateParams::new(names).unwrap();
            params.extended_key_usages = usages;
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca_cert, &ca_key).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let server_names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        // Client auth too: a broker presents it when it polls its peers.
        let server_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let (server_pem, server_key_pem) = leaf(server_names, server_usages);
        let (client_pem, client_key_pem) = leaf(
            vec!["client".into()],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        );
        let file = |name: &str, text: &str| {
            let path = dir.join(format!("{tag}-{name}"));
            std::fs::write(&path, text).unwrap();
            path
        };
        Pki {
            ca: file("ca.crt", &ca_cert.pem()),
            server_cert: file("tls.crt", &server_pem),
            server_key: file("tls.key", &server_key_pem),
            client_cert: file("client.crt", &client_pem),
            client_key: file("client.key", &client_key_pem),
        }
    }

    /// A client trusting this CA, without a certificate of its own.
    fn client(&self) -> TlsConfig {
        TlsConfig {
            ca_file: Some(self.ca.clone()),
            server_name: Some("localhost".into()),
            ..TlsConfig::default()
        }
    }

    /// A client trusting this CA and presenting the client certificate.
    fn client_with_certificate(&self) -> TlsConfig {
        TlsConfig {
            cert_file: Some(self.client_cert.clone()),
            key_file: Some(self.client_key.clone()),
            ..self.client()
        }
    }

    /// The broker serves this server certificate in `mode`.
    fn serve(&self, config: &mut BrokerConfig, mode: TlsMode) {
        config.tls_mode = mode;
        config.tls_cert_file = Some(self.server_cert.clone());
        config.tls_key_file = Some(self.server_key.clone());
        config.tls_ca_file = Some(self.ca.clone());
    }
}

fn producer(broker: &TestBroker, tls: Option<TlsConfig>) -> Producer {
    let mut config = ProducerConfig::new(&broker.addr);
    config.client = with_tls(config.client, tls);
    config.send_timeout = Duration::from_secs(5);
    config.retries = 0;
    Producer::new(config)
}

fn with_tls(client: ClientConfig, tls: Option<TlsConfig>) -> ClientConfig {
    match tls {
        Some(tls) => client.with_tls(tls),
        None => client,
    }
}

/// A broker serving `pki`'s certificate in `mode`, with `topic` created over TLS.
async fn start_with_topic(pki: &Pki, mode: TlsMode, topic: &str) -> TestBroker {
    let broker = TestBroker::start_with(|config| pki.serve(config, mode)).await;
    create_topic(&broker, Some(pki.client()), topic).await;
    broker
}

async fn create_topic(broker: &TestBroker, tls: Option<TlsConfig>, topic: &str) {
    let admin = Admin::new(with_tls(broker.client(), tls));
    admin
        .create_topic(&TopicSpec::new(topic, 1))
        .await
        .expect("create topic");
    admin.shutdown().await;
}

/// The bodies of queue 0 of `topic` from its first offset, read by a pull consumer.
async fn consume_all(broker: &TestBroker, tls: Option<TlsConfig>, topic: &str) -> Vec<String> {
    let consumer = PullConsumer::new(with_tls(broker.client(), tls), "tls-readers");
    let queue = consumer.queues(topic).await.expect("queues").remove(0);
    let offset = consumer.min_offset(&queue).await.expect("min offset");
    let pulled = consumer
        .pull(&queue, offset, 32, &Subscription::new(topic, "*"), None)
        .await
        .expect("pull");
    consumer.shutdown().await;
    match pulled.status {
        PullStatus::Found(messages) => messages
            .iter()
            .map(|message| String::from_utf8_lossy(&message.body).into_owned())
            .collect(),
        other => panic!("expected messages, got {other:?}"),
    }
}

async fn send(producer: &Producer, topic: &str, body: &str) -> quiver_client::Result<()> {
    producer
        .send_with(
            Message::new(topic, body.to_owned()),
            QueueSelector::QueueId(0),
        )
        .await
        .map(|_| ())
}

/// GET `path` over `stream` (HTTP/1.0, read to the end): the whole response.
async fn http_get_over(mut stream: impl AsyncRead + AsyncWrite + Unpin, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// A TLS stream to `addr` trusting `ca`.
async fn tls_stream(
    addr: &str,
    ca: &Path,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    let pem = std::fs::read(ca).unwrap();
    for cert in rustls::pki_types::pem::PemObject::pem_slice_iter(&pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let stream = TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, stream)
        .await
}

/// The value of a series of `metric` whose labels contain `label`, from a scrape.
fn series(scrape: &str, metric: &str, label: &str) -> u64 {
    scrape
        .lines()
        .find(|line| line.starts_with(metric) && line.contains(label))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
        .unwrap_or_else(|| panic!("no {metric}{{{label}}} in\n{scrape}"))
}

async fn plain_metrics(broker: &TestBroker) -> String {
    let stream = TcpStream::connect(broker.http_addr()).await.expect("http");
    http_get_over(stream, "/metrics").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permissive_mode_serves_tls_and_plain_clients_on_one_port() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let broker = start_with_topic(&pki, TlsMode::Permissive, "mixed").await;

    let tls_producer = producer(&broker, Some(pki.client()));
    let plain_producer = producer(&broker, None);
    send(&tls_producer, "mixed", "over-tls")
        .await
        .expect("TLS send");
    send(&plain_producer, "mixed", "plain")
        .await
        .expect("plain send");

    let expected = vec!["over-tls".to_string(), "plain".to_string()];
    assert_eq!(
        consume_all(&broker, Some(pki.client()), "mixed").await,
        expected
    );
    assert_eq!(consume_all(&broker, None, "mixed").await, expected);
    tls_producer.shutdown().await;
    plain_producer.shutdown().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforcing_mode_closes_plain_connections_while_tls_ones_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let broker = start_with_topic(&pki, TlsMode::Enforcing, "strict").await;
    let tls_producer = producer(&broker, Some(pki.client()));
    send(&tls_producer, "strict", "first")
        .await
        .expect("TLS send");

    let plain_producer = producer(&broker, None);
    let refused = send(&plain_producer, "strict", "plain").await;
    assert!(
        refused.is_err(),
        "a plain client must be refused: {refused:?}"
    );
    let scrape = plain_metrics(&broker).await;
    assert!(series(&scrape, "quiver_connections_closed_total", "tls-required") >= 1);

    // The TLS producer's open connection is unaffected.
    send(&tls_producer, "strict", "second")
        .await
        .expect("TLS send after the refusal");
    let bodies = consume_all(&broker, Some(pki.client()), "strict").await;
    assert_eq!(bodies, vec!["first".to_string(), "second".to_string()]);
    tls_producer.shutdown().await;
    plain_producer.shutdown().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_consumer_consumes_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let broker = start_with_topic(&pki, TlsMode::Enforcing, "pushed").await;
    let producer = producer(&broker, Some(pki.client()));
    for body in ["one", "two", "three"] {
        send(&producer, "pushed", body).await.expect("TLS send");
    }
    let received = Received::default();
    let mut config = broker
        .consumer_config("tls-pushers", "pushed")
        .consume_from(ConsumeFromWhere::FirstOffset);
    config.client = config.client.with_tls(pki.client());
    let consumer = PushConsumer::start(config, received.listener())
        .await
        .expect("start over TLS");
    wait_until("three messages pushed", Duration::from_secs(20), || {
        received.len() >= 3
    })
    .await;
    consumer.shutdown().await.expect("shutdown");
    let mut bodies = received.bodies();
    bodies.sort();
    assert_eq!(bodies, vec!["one", "three", "two"]);
    producer.shutdown().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_stalled_handshakes_fail_alone() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let broker = TestBroker::start_with(|config| pki.serve(config, TlsMode::Enforcing)).await;
    // A handshake record that is not a ClientHello, and one that stops after its first byte.
    let mut garbage = TcpStream::connect(&broker.addr).await.unwrap();
    garbage
        .write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0xde, 0xad, 0xbe, 0xef])
        .await
        .unwrap();
    let mut stalled = TcpStream::connect(&broker.addr).await.unwrap();
    stalled.write_all(&[0x16]).await.unwrap();

    create_topic(&broker, Some(pki.client()), "beside").await;
    let tls_producer = producer(&broker, Some(pki.client()));
    send(&tls_producer, "beside", "served")
        .await
        .expect("a TLS client beside them");
    let mut rest = Vec::new();
    let closed =
        tokio::time::timeout(Duration::from_secs(10), garbage.read_to_end(&mut rest)).await;
    assert!(closed.is_ok(), "the bad handshake's connection is closed");
    let scrape = plain_metrics(&broker).await;
    assert!(series(&scrape, "quiver_tls_handshake_failures_total", "protocol") >= 1);
    assert!(series(&scrape, "quiver_connections_closed_total", "tls-handshake") >= 1);
    tls_producer.shutdown().await;
    // Shutdown does not wait for the stalled handshake.
    broker.stop().await;
    drop(stalled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_client_certificates_are_checked() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let stranger = Pki::write(dir.path(), "b");
    let broker = TestBroker::start_with(|config| {
        pki.serve(config, TlsMode::Enforcing);
        config.tls_client_auth = ClientAuth::Require;
    })
    .await;
    create_topic(&broker, Some(pki.client_with_certificate()), "certified").await;

    let anonymous = producer(&broker, Some(pki.client()));
    let refused = send(&anonymous, "certified", "anonymous").await;
    assert!(refused.is_err(), "no client certificate: {refused:?}");
    // A certificate from another CA is refused too.
    let foreign = TlsConfig {
        cert_file: Some(stranger.client_cert.clone()),
        key_file: Some(stranger.client_key.clone()),
        ..pki.client()
    };
    let foreign_producer = producer(&broker, Some(foreign));
    let refused = send(&foreign_producer, "certified", "foreign").await;
    assert!(refused.is_err(), "a certificate of another CA: {refused:?}");

    let certified = producer(&broker, Some(pki.client_with_certificate()));
    send(&certified, "certified", "signed")
        .await
        .expect("send with a certificate");
    let bodies = consume_all(&broker, Some(pki.client_with_certificate()), "certified").await;
    assert_eq!(bodies, vec!["signed".to_string()]);
    let scrape = plain_metrics(&broker).await;
    assert!(
        series(
            &scrape,
            "quiver_tls_handshake_failures_total",
            "client-certificate"
        ) >= 1
    );
    for client in [anonymous, foreign_producer, certified] {
        client.shutdown().await;
    }
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_swapped_on_disk_is_served_to_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let old = Pki::write(dir.path(), "old");
    let broker = start_with_topic(&old, TlsMode::Enforcing, "rotated").await;
    let open_before = producer(&broker, Some(old.client()));
    send(&open_before, "rotated", "before")
        .await
        .expect("send before the swap");

    // A new CA and certificate replace the files in place, as a renewed Secret does.
    let kept_old_ca = dir.path().join("old-ca-kept.crt");
    std::fs::copy(&old.ca, &kept_old_ca).unwrap();
    let new = Pki::write(dir.path(), "new");
    std::fs::copy(&new.server_cert, &old.server_cert).unwrap();
    std::fs::copy(&new.server_key, &old.server_key).unwrap();
    std::fs::copy(&new.ca, &old.ca).unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let trusting_new = producer(&broker, Some(new.client()));
        let sent = send(&trusting_new, "rotated", "after").await;
        trusting_new.shutdown().await;
        if sent.is_ok() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new certificate was not served: {sent:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let old_ca_only = TlsConfig {
        ca_file: Some(kept_old_ca),
        ..old.client()
    };
    let trusting_old = producer(&broker, Some(old_ca_only));
    let refused = send(&trusting_old, "rotated", "old-ca").await;
    assert!(refused.is_err(), "new connections get the new certificate");
    // The connection opened before the swap keeps its session.
    send(&open_before, "rotated", "still-open")
        .await
        .expect("open connection after the swap");

    let bodies = consume_all(&broker, Some(new.client()), "rotated").await;
    assert_eq!(bodies, vec!["before", "after", "still-open"]);
    let scrape = plain_metrics(&broker).await;
    assert!(series(&scrape, "quiver_tls_reloads_total", "\"ok\"") >= 1);
    trusting_old.shutdown().await;
    open_before.shutdown().await;
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enforcing_brokers_poll_their_peers_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let brokers = TestBroker::start_cluster_with(2, |config| {
        pki.serve(config, TlsMode::Enforcing);
        config.tls_client_auth = ClientAuth::Require;
    })
    .await;
    let admin = Admin::new(brokers[0].client().with_tls(pki.client_with_certificate()));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let cluster = admin.cluster_info().await.expect("cluster info over TLS");
        if cluster.broker_addr_table.len() == 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the peer was not polled: {cluster:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    admin.shutdown().await;
    for broker in brokers {
        broker.stop().await;
    }
}

/// The HTTP port never asks for a client certificate (probes have none), even when the
/// remoting port requires one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_port_serves_metrics_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::write(dir.path(), "a");
    let broker = TestBroker::start_with(|config| {
        pki.serve(config, TlsMode::Enforcing);
        config.tls_client_auth = ClientAuth::Require;
        config.http_tls = true;
    })
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let scrape = loop {
        let stream = tls_stream(broker.http_addr(), &pki.ca)
            .await
            .expect("TLS to the HTTP port");
        let response = http_get_over(stream, "/metrics").await;
        if response.contains("quiver_broker_ready 1") {
            break response;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "not ready: {response}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(scrape.contains(" 200 OK"), "{scrape}");
    assert!(scrape.contains("quiver_tls_reloads_total"), "{scrape}");
    let plain = plain_metrics(&broker).await;
    assert!(
        !plain.contains("200 OK"),
        "plain HTTP must not be served: {plain}"
    );
    broker.stop().await;
}
