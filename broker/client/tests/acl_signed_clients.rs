//! With ACL on, the Rust client signs every request of its producer, push consumer and admin
//! with the account of its config: allowed work goes through; unsigned or under-privileged
//! work is refused with NO_PERMISSION (16) and the broker's remark.

mod common;

use std::time::Duration;

use common::{produce, wait_until, Received, TestBroker};
use quiver_client::{
    Admin, ClientError, ConsumeFromWhere, Message, Producer, ProducerConfig, PushConsumer,
    TopicSpec,
};

const ACCOUNTS: &str = r#"
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    topicPerms:
      - signed=PUB
  - accessKey: consumer1
    secretKey: consumer-secret
    topicPerms:
      - signed=SUB
    groupPerms:
      - signed-readers=SUB
  - accessKey: operator1
    secretKey: operator-secret
    admin: true
"#;

fn refusal(error: ClientError) -> (i32, String) {
    match error {
        ClientError::Broker { code, remark, .. } => (code, remark),
        other => panic!("expected a broker refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signed_producer_consumer_and_admin_work_and_others_are_refused() {
    let acl_dir = tempfile::tempdir().unwrap();
    let acl_file = acl_dir.path().join("plain_acl.yml");
    std::fs::write(&acl_file, ACCOUNTS).unwrap();
    let broker = TestBroker::start_with(|config| config.acl_file = Some(acl_file)).await;

    let admin = Admin::new(
        broker
            .client()
            .with_credentials("operator1", "operator-secret"),
    );
    admin
        .create_topic(&TopicSpec::new("signed", 2))
        .await
        .expect("the admin account creates topics");

    let mut config = ProducerConfig::new(&broker.addr);
    config.client = config
        .client
        .with_credentials("producer1", "producer-secret");
    let producer = Producer::new(config);
    let bodies = produce(&producer, "signed", "m", 10).await;

    let unsigned = broker.producer();
    let (code, remark) = refusal(
        unsigned
            .send(Message::new("signed", "unsigned"))
            .await
            .expect_err("unsigned sends are refused"),
    );
    assert_eq!(code, 16);
    assert!(remark.contains("no signature"), "{remark}");

    let mut consumer_config = broker
        .consumer_config("signed-readers", "signed")
        .consume_from(ConsumeFromWhere::FirstOffset);
    consumer_config.client = consumer_config
        .client
        .with_credentials("consumer1", "consumer-secret");
    let received = Received::default();
    let consumer = PushConsumer::start(consumer_config, received.listener())
        .await
        .expect("consumer starts");
    wait_until("every message consumed", Duration::from_secs(30), || {
        received.len() >= bodies.len()
    })
    .await;
    let mut got = received.bodies();
    got.sort();
    let mut want = bodies.clone();
    want.sort();
    assert_eq!(got, want);
    consumer.shutdown().await.expect("consumer stops");

    let not_admin = Admin::new(
        broker
            .client()
            .with_credentials("consumer1", "consumer-secret"),
    );
    let (code, remark) = refusal(
        not_admin
            .create_topic(&TopicSpec::new("other", 1))
            .await
            .expect_err("a non-admin cannot create topics"),
    );
    assert_eq!(code, 16);
    assert!(remark.contains("needs an admin account"), "{remark}");
    admin.shutdown().await;
    not_admin.shutdown().await;
    broker.stop().await;
}

/// Runs the `quiver` CLI against `server` with `env`; (exit code, stderr).
async fn cli(server: &str, env: &[(&str, &str)], args: &[&str]) -> (i32, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quiver"));
    command.args(["--server", server]).args(args);
    command
        .env_remove("QUIVER_ACCESS_KEY")
        .env_remove("QUIVER_SECRET_KEY");
    command.envs(env.iter().copied());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("the CLI runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code().unwrap_or(-1), stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_signs_from_flags_or_the_environment() {
    let acl_dir = tempfile::tempdir().unwrap();
    let acl_file = acl_dir.path().join("plain_acl.yml");
    std::fs::write(&acl_file, ACCOUNTS).unwrap();
    let broker = TestBroker::start_with(|config| config.acl_file = Some(acl_file)).await;
    let admin_env = [
        ("QUIVER_ACCESS_KEY", "operator1"),
        ("QUIVER_SECRET_KEY", "operator-secret"),
    ];
    let (code, stderr) = cli(&broker.addr, &admin_env, &["topics", "create", "signed"]).await;
    assert_eq!(code, 0, "{stderr}");
    let producer = [
        "--access-key",
        "producer1",
        "--secret-key",
        "producer-secret",
    ];
    let (code, stderr) = cli(
        &broker.addr,
        &[],
        &[&producer[..], &["produce", "-t", "signed", "hello"]].concat(),
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (code, stderr) = cli(
        &broker.addr,
        &[],
        &[&producer[..], &["topics", "create", "other"]].concat(),
    )
    .await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("needs an admin account"), "{stderr}");
    let (code, stderr) = cli(&broker.addr, &[], &["produce", "-t", "signed", "unsigned"]).await;
    assert_eq!(code, 5, "{stderr}");
    assert!(stderr.contains("no signature"), "{stderr}");
    broker.stop().await;
}
