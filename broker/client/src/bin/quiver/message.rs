//! `quiver message`: find messages by key or by id and print them with their properties.

use clap::Args;
use quiver_client::{Admin, ClientConfig, ClientError, KeyQuery, ReceivedMessage};

use crate::consume::message_json;
use crate::{parse_time_ms, Output};

#[derive(Args, Debug)]
pub struct MessageArgs {
    /// Topic to search: needed with --key, and with --id for a producer's message id.
    #[arg(long, short)]
    topic: Option<String>,
    /// A message key (one of KEYS) or unique key.
    #[arg(
        long,
        requires = "topic",
        required_unless_present = "id",
        conflicts_with = "id"
    )]
    key: Option<String>,
    /// A message id: the producer's id (UNIQ_KEY, with --topic), or an offset message id
    /// (store host and CommitLog offset: a send result's offset_msg_id).
    #[arg(long, required_unless_present = "key")]
    id: Option<String>,
    /// With --key: only messages stored at or after this time (ms since the epoch, or UTC as
    /// YYYY-MM-DDTHH:MM:SSZ). Default: the oldest.
    #[arg(long, value_parser = parse_time_arg, requires = "key")]
    begin: Option<i64>,
    /// With --key: only messages stored at or before this time. Default: now.
    #[arg(long, value_parser = parse_time_arg, requires = "key")]
    end: Option<i64>,
    /// With --key: at most this many messages from each broker (brokers return 64 at most).
    #[arg(long, default_value_t = 64, requires = "key")]
    max: u32,
}

fn parse_time_arg(raw: &str) -> Result<i64, String> {
    parse_time_ms(raw)
        .ok_or_else(|| format!("expected ms since the epoch or YYYY-MM-DDTHH:MM:SSZ, got {raw:?}"))
}

pub async fn run(client: ClientConfig, output: Output, args: MessageArgs) -> anyhow::Result<()> {
    let admin = Admin::new(client);
    let found = find(&admin, &args).await;
    admin.shutdown().await;
    let found = found?;
    if found.is_empty() {
        let what = match (&args.key, &args.id, &args.topic) {
            (Some(key), _, Some(topic)) => format!("message with key {key} in topic {topic}"),
            (_, Some(id), Some(topic)) => format!("message {id} in topic {topic}"),
            (_, Some(id), None) => format!("message {id}"),
            _ => "message".to_owned(),
        };
        return Err(ClientError::MessageNotFound { what }.into());
    }
    for message in &found {
        match output {
            Output::Json => println!("{}", details_json(message)),
            Output::Table => print!("{}", details_text(message)),
        }
    }
    if output == Output::Table {
        eprintln!("{} message(s)", found.len());
    }
    Ok(())
}

/// Messages with the key, or the message with the id: by unique key in the topic when one is
/// given, else (or when none is found) by offset message id.
async fn find(admin: &Admin, args: &MessageArgs) -> anyhow::Result<Vec<ReceivedMessage>> {
    if let (Some(key), Some(topic)) = (&args.key, &args.topic) {
        let query = KeyQuery {
            max_per_broker: args.max,
            begin_ms: args.begin.unwrap_or(0),
            end_ms: args.end.unwrap_or(i64::MAX),
            ..KeyQuery::new(topic.clone(), key.clone())
        };
        return Ok(admin.query_by_key(&query).await?);
    }
    let id = args.id.as_deref().expect("clap requires --key or --id");
    if let Some(topic) = &args.topic {
        let found = admin.query_by_unique_key(topic, id).await?;
        if !found.is_empty() || quiver_protocol::message::decode_offset_msg_id(id).is_err() {
            return Ok(found);
        }
    }
    match admin.view_message(id).await {
        Ok(message) => Ok(vec![message]),
        // A broker that answers but has no message there: nothing found.
        Err(ClientError::Broker { .. }) => Ok(Vec::new()),
        Err(error) => Err(error.into()),
    }
}

fn details_json(message: &ReceivedMessage) -> serde_json::Value {
    let mut json = message_json(message);
    json["offset_msg_id"] = message.offset_msg_id().into();
    json["commit_log_offset"] = message.commit_log_offset.0.into();
    json["flag"] = message.flag.into();
    json["sys_flag"] = message.sys_flag.into();
    json["born_timestamp_ms"] = message.born_timestamp_ms.into();
    json["born_host"] = message.born_host.to_string().into();
    json["store_host"] = message.store_host.to_string().into();
    json
}

/// One message as a block of `name  value` lines, properties last, then the body.
fn details_text(message: &ReceivedMessage) -> String {
    let mut lines = vec![
        ("topic", message.topic.clone()),
        ("msg_id", message.msg_id()),
        ("offset_msg_id", message.offset_msg_id()),
        (
            "queue",
            format!(
                "{}:{} offset {}",
                message.queue.broker_name, message.queue.queue_id, message.queue_offset
            ),
        ),
        ("tags", message.tags().unwrap_or("-").to_owned()),
        ("keys", message.keys().join(" ")),
        ("store_time_ms", message.store_timestamp_ms.to_string()),
        ("born_time_ms", message.born_timestamp_ms.to_string()),
        ("born_host", message.born_host.to_string()),
        ("store_host", message.store_host.to_string()),
        ("reconsume_times", message.reconsume_times.to_string()),
    ];
    for (name, value) in &message.properties {
        lines.push(("property", format!("{name}={value}")));
    }
    lines.push(("body", String::from_utf8_lossy(&message.body).into_owned()));
    let mut text: String = lines
        .iter()
        .map(|(name, value)| format!("{name:<16}{value}\n"))
        .collect();
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Wrapper {
        #[command(flatten)]
        args: MessageArgs,
    }

    #[test]
    fn key_needs_a_topic_and_one_of_key_or_id_is_required() {
        assert!(Wrapper::try_parse_from(["x", "--key", "k"]).is_err());
        assert!(Wrapper::try_parse_from(["x", "--topic", "t"]).is_err());
        assert!(Wrapper::try_parse_from(["x", "--topic", "t", "--key", "k", "--id", "i"]).is_err());
        let parsed = Wrapper::try_parse_from([
            "x",
            "-t",
            "t",
            "--key",
            "k",
            "--begin",
            "1970-01-01T00:00:01Z",
        ])
        .unwrap();
        assert_eq!(parsed.args.begin, Some(1000));
        assert!(Wrapper::try_parse_from(["x", "--id", "7F00000100002A9F0000000000000000"]).is_ok());
    }
}
