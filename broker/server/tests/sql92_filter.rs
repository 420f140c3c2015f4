//! SQL92 subscriptions: a pull delivers exactly the messages whose properties match, whether
//! the expression travels with the pull or comes from the group's heartbeat; an expression
//! that does not parse is refused clearly at heartbeat, CHECK_CLIENT_CONFIG and pull, and
//! the group's offsets never move past messages it did not get.

mod common;

use bytes::Bytes;
use common::{ext, ext_u64, pulled_bodies, v2_send_fields, Client, TestBroker};
use quiver_protocol::body::{
    CheckClientRequestBody, ConsumerData, GetConsumerListByGroupResponseBody, HeartbeatData,
    SubscriptionData,
};
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;

const TOPIC: &str = "SqlTopic";

/// Ten messages on queue 0: body `m<i>`, property `a` = i, tag `even` or `odd`.
async fn send_ten(client: &mut Client) {
    for i in 0..10 {
        let tag = if i % 2 == 0 { "even" } else { "odd" };
        let properties = format!("a\u{1}{i}\u{2}TAGS\u{1}{tag}\u{2}");
        let fields = v2_send_fields(TOPIC, "0", "0", &properties, false);
        let sent = client
            .call(
                request::SEND_MESSAGE_V2,
                fields,
                Bytes::from(format!("m{i}")),
            )
            .await;
        assert_eq!(sent.code, response::SUCCESS, "{sent:?}");
    }
}

/// A pull from queue 0; `subscription` = Some((type, expression)) sends it with the pull.
async fn pull(
    client: &mut Client,
    group: &str,
    offset: u64,
    max: u32,
    subscription: Option<(&str, &str)>,
) -> RemotingCommand {
    let (offset, max) = (offset.to_string(), max.to_string());
    let mut fields = ext(&[
        ("consumerGroup", group),
        ("topic", TOPIC),
        ("queueId", "0"),
        ("queueOffset", &offset),
        ("maxMsgNums", &max),
        ("sysFlag", if subscription.is_some() { "4" } else { "0" }),
        ("commitOffset", "-1"),
        ("suspendTimeoutMillis", "0"),
        ("subVersion", "0"),
    ]);
    if let Some((kind, expression)) = subscription {
        fields.insert("expressionType", kind);
        fields.insert("subscription", expression);
    }
    client
        .call(request::PULL_MESSAGE, fields, Bytes::new())
        .await
}

fn sql(expression: &str) -> SubscriptionData {
    SubscriptionData {
        topic: TOPIC.into(),
        sub_string: expression.into(),
        sub_version: 1,
        expression_type: Some("SQL92".into()),
        ..SubscriptionData::default()
    }
}

async fn heartbeat(client: &mut Client, group: &str, expression: &str) -> RemotingCommand {
    let body = HeartbeatData {
        client_id: "sql-client@1".into(),
        producer_data_set: vec![],
        consumer_data_set: vec![ConsumerData {
            group_name: group.into(),
            subscription_data_set: vec![sql(expression)],
            ..ConsumerData::default()
        }],
    };
    client
        .call(request::HEART_BEAT, ext(&[]), body.encode())
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sql92_pull_delivers_exactly_the_matching_messages() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(common::test_config(dir.path())).await;
    let mut client = broker.client().await;
    send_ten(&mut client).await;

    let got = pull(&mut client, "G", 0, 32, Some(("SQL92", "a > 5"))).await;
    assert_eq!(got.code, response::SUCCESS, "{got:?}");
    assert_eq!(pulled_bodies(&got), vec!["m6", "m7", "m8", "m9"]);
    assert_eq!(ext_u64(&got, "nextBeginOffset"), 10);

    let both = "a > 5 AND TAGS = 'even'";
    let got = pull(&mut client, "G", 0, 32, Some(("SQL92", both))).await;
    assert_eq!(pulled_bodies(&got), vec!["m6", "m8"]);

    let got = pull(&mut client, "G", 0, 2, Some(("SQL92", "a BETWEEN 2 AND 8"))).await;
    assert_eq!(pulled_bodies(&got), vec!["m2", "m3"]);
    assert_eq!(
        ext_u64(&got, "nextBeginOffset"),
        4,
        "skipped units are passed"
    );

    let got = pull(
        &mut client,
        "G",
        0,
        32,
        Some(("SQL92", "a IN ('1', '3') OR missing IS NOT NULL")),
    )
    .await;
    assert_eq!(pulled_bodies(&got), vec!["m1", "m3"]);

    // Nothing matches: the pull says so and where to go on, as Apache does.
    let got = pull(&mut client, "G", 0, 32, Some(("SQL92", "a > 100"))).await;
    assert_eq!(got.code, response::PULL_RETRY_IMMEDIATELY, "{got:?}");
    assert_eq!(ext_u64(&got, "nextBeginOffset"), 10);

    // Tag subscriptions keep filtering by tag.
    let got = pull(&mut client, "G", 0, 32, Some(("TAG", "odd"))).await;
    assert_eq!(pulled_bodies(&got), vec!["m1", "m3", "m5", "m7", "m9"]);

    // Without the subscription on the pull, the heartbeat's expression filters.
    let hb = heartbeat(&mut client, "HbGroup", "a <= 1").await;
    assert_eq!(hb.code, response::SUCCESS, "{hb:?}");
    let got = pull(&mut client, "HbGroup", 0, 32, None).await;
    assert_eq!(pulled_bodies(&got), vec!["m0", "m1"]);
    broker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_expression_is_refused_clearly_and_moves_no_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TestBroker::start(common::test_config(dir.path())).await;
    let mut client = broker.client().await;
    send_ten(&mut client).await;

    let got = pull(&mut client, "Bad", 0, 32, Some(("SQL92", "a >"))).await;
    assert_eq!(got.code, response::SUBSCRIPTION_PARSE_FAILED, "{got:?}");
    let remark = got.remark.unwrap_or_default();
    assert!(
        remark.contains("\"a >\"") && remark.contains("column 4"),
        "{remark}"
    );

    // CHECK_CLIENT_CONFIG validates as Java clients expect before they subscribe.
    for (kind, expression, code, says) in [
        ("SQL92", "a > 5 AND b IS NULL", response::SUCCESS, ""),
        ("TAG", "x || y", response::SUCCESS, ""),
        (
            "SQL92",
            "a > 'x'",
            response::SUBSCRIPTION_PARSE_FAILED,
            "column 3",
        ),
        ("XPATH", "//a", response::SYSTEM_ERROR, "XPATH"),
    ] {
        let body = CheckClientRequestBody {
            client_id: "c".into(),
            group: "Bad".into(),
            subscription_data: SubscriptionData {
                expression_type: Some(kind.into()),
                ..sql(expression)
            },
        };
        let checked = client
            .call(request::CHECK_CLIENT_CONFIG, ext(&[]), body.encode())
            .await;
        assert_eq!(checked.code, code, "{kind} {expression}: {checked:?}");
        let remark = checked.remark.unwrap_or_default();
        assert!(remark.contains(says), "{remark}");
    }

    // A heartbeat with a bad expression registers the member but says the subscription is
    // refused; its pulls (without their own expression, as the Go client's) are refused too.
    let hb = heartbeat(&mut client, "Bad", "a >").await;
    assert_eq!(hb.code, response::SUBSCRIPTION_PARSE_FAILED, "{hb:?}");
    let remark = hb.remark.unwrap_or_default();
    assert!(
        remark.contains("group Bad") && remark.contains(TOPIC),
        "{remark}"
    );
    let members = client
        .call(
            request::GET_CONSUMER_LIST_BY_GROUP,
            ext(&[("consumerGroup", "Bad")]),
            Bytes::new(),
        )
        .await;
    let ids = GetConsumerListByGroupResponseBody::decode(&members.body).unwrap();
    assert_eq!(ids.consumer_id_list, vec!["sql-client@1"]);
    let got = pull(&mut client, "Bad", 0, 32, None).await;
    assert_eq!(got.code, response::FILTER_DATA_NOT_EXIST, "{got:?}");
    assert!(got.remark.unwrap_or_default().contains("column"));

    let offset = client.query_offset("Bad", TOPIC, 0).await;
    assert_eq!(
        offset.code,
        response::QUERY_NOT_FOUND,
        "offsets did not move: {offset:?}"
    );

    // A corrected heartbeat replaces it.
    let hb = heartbeat(&mut client, "Bad", "a = 9").await;
    assert_eq!(hb.code, response::SUCCESS, "{hb:?}");
    let got = pull(&mut client, "Bad", 0, 32, None).await;
    assert_eq!(pulled_bodies(&got), vec!["m9"]);
    broker.stop().await;
}
