//! `quiver groups create` writes a subscription group's FIFO flag and retry limit to every
//! broker (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP); `quiver groups list` shows them.

mod common;

use common::TestBroker;
use quiver_client::Admin;

async fn cli(server: &str, args: &[&str]) -> (i32, String, String) {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_quiver"));
    command.args(["--server", server]).args(args);
    command
        .env_remove("QUIVER_ACCESS_KEY")
        .env_remove("QUIVER_SECRET_KEY");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("joined")
        .expect("the CLI runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code().unwrap_or(-1), stdout, stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_are_created_with_their_settings_and_listed() {
    let broker = TestBroker::start().await;
    let (code, _, stderr) = cli(
        &broker.addr,
        &[
            "groups",
            "create",
            "orders",
            "--fifo",
            "--retry-max-times",
            "3",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (code, _, stderr) = cli(&broker.addr, &["groups", "create", "plain"]).await;
    assert_eq!(code, 0, "{stderr}");

    let configs = Admin::new(broker.client()).group_configs().await.unwrap();
    let orders = configs
        .iter()
        .find(|c| c.group_name == "orders")
        .expect("created");
    assert!(orders.consume_message_orderly);
    assert_eq!(orders.retry_max_times, 3);
    let plain = configs
        .iter()
        .find(|c| c.group_name == "plain")
        .expect("created");
    assert!(!plain.consume_message_orderly);
    assert_eq!(plain.retry_max_times, 16);

    let (code, stdout, stderr) = cli(&broker.addr, &["groups", "list"]).await;
    assert_eq!(code, 0, "{stderr}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("orders"))
        .expect("listed");
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells, ["orders", "true", "3", "true"], "{stdout}");
    let (code, stdout, _) = cli(&broker.addr, &["--output", "json", "groups", "list"]).await;
    assert_eq!(code, 0);
    assert!(
        stdout.contains(r#""consumeMessageOrderly": true"#),
        "{stdout}"
    );

    let (code, _, stderr) = cli(
        &broker.addr,
        &["groups", "create", "bad", "--retry-max-times", "-1"],
    )
    .await;
    assert_eq!(code, 2, "a negative limit is refused: {stderr}");
    broker.stop().await;
}
