//! Group membership: heartbeats that announce this member and its subscriptions, leaving the
//! group, and the requests brokers send to the client (members changed, reset offsets).

use std::sync::Arc;

use quiver_protocol::body::{self as wire, ConsumerData, HeartbeatData};
use quiver_protocol::header::UnregisterClientRequestHeader;
use quiver_protocol::{code, ExtFields, RemotingCommand};
use tokio::sync::{mpsc, watch};

use crate::error::{ClientError, Result};
use crate::pull_from_where::ConsumeFromWhere;
use crate::remoting::{expect_success, InboundRequest};
use crate::subscription::Subscription;

use super::Inner;

/// How RocketMQ's wire names the policy (the timestamp itself is not sent in heartbeats).
fn wire_consume_from(from: ConsumeFromWhere) -> wire::ConsumeFromWhere {
    match from {
        ConsumeFromWhere::LastOffset => wire::ConsumeFromWhere::LastOffset,
        ConsumeFromWhere::FirstOffset => wire::ConsumeFromWhere::FirstOffset,
        ConsumeFromWhere::Timestamp(_) => wire::ConsumeFromWhere::Timestamp,
    }
}

/// This member as a heartbeat announces it: a push consumer in clustering mode.
fn consumer_data(
    group: &str,
    from: ConsumeFromWhere,
    subscriptions: &[Subscription],
) -> ConsumerData {
    ConsumerData {
        group_name: group.to_owned(),
        consume_type: wire::ConsumeType::ConsumePassively,
        message_model: wire::MessageModel::Clustering,
        consume_from_where: wire_consume_from(from),
        subscription_data_set: subscriptions.iter().map(Subscription::to_wire).collect(),
        unit_mode: false,
    }
}

impl Inner {
    /// One heartbeat to every known broker; fails only when none took it.
    pub(super) async fn send_heartbeats(&self) -> Result<()> {
        let heartbeat = HeartbeatData {
            client_id: self.core.client_id().to_owned(),
            producer_data_set: Vec::new(),
            consumer_data_set: vec![consumer_data(
                self.group(),
                self.config.consume_from,
                &self.subscriptions,
            )],
        };
        let body = heartbeat.encode();
        let brokers = self.core.known_brokers();
        if brokers.is_empty() {
            return Err(ClientError::NoRoute {
                topic: self.subscriptions[0].topic.clone(),
                purpose: "heartbeats",
            });
        }
        let mut last_error = None;
        let mut any_ok = false;
        for addr in brokers {
            let request = RemotingCommand::request(code::request::HEART_BEAT, ExtFields::default())
                .with_body(body.clone());
            match self
                .core
                .invoke(&addr, request)
                .await
                .and_then(|r| expect_success(&addr, code::request::HEART_BEAT, r))
            {
                Ok(_) => any_ok = true,
                Err(error) => {
                    tracing::warn!(%addr, %error, "heartbeat failed");
                    last_error = Some(error);
                }
            }
        }
        match (any_ok, last_error) {
            (false, Some(error)) => Err(error),
            _ => Ok(()),
        }
    }

    pub(super) async fn unregister(&self) {
        for addr in self.core.known_brokers() {
            let header = UnregisterClientRequestHeader {
                client_id: self.core.client_id().to_owned(),
                producer_group: None,
                consumer_group: Some(self.group().to_owned()),
            };
            let request =
                RemotingCommand::request(code::request::UNREGISTER_CLIENT, header.to_ext());
            if let Err(error) = self.core.invoke(&addr, request).await {
                tracing::debug!(%addr, %error, "unregister failed");
            }
        }
    }

    /// Handles broker-initiated requests until stopped.
    pub(super) async fn run_inbound(
        self: Arc<Self>,
        mut inbound: mpsc::UnboundedReceiver<InboundRequest>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let request = tokio::select! {
                request = inbound.recv() => match request { Some(r) => r, None => return },
                _ = stop.changed() => return,
            };
            if super::running_info::answer(&self, &request).await {
                continue;
            }
            let command = &request.command;
            let response_code = match command.code {
                code::request::NOTIFY_CONSUMER_IDS_CHANGED => {
                    self.rebalance_wanted.notify_one();
                    code::response::SUCCESS
                }
                code::request::RESET_CONSUMER_CLIENT_OFFSET => {
                    match self.reset_offsets(&request.addr, command).await {
                        Ok(()) => code::response::SUCCESS,
                        Err(error) => {
                            tracing::warn!(%error, "offset reset from the broker failed");
                            code::response::SYSTEM_ERROR
                        }
                    }
                }
                _ => code::response::REQUEST_CODE_NOT_SUPPORTED,
            };
            if !command.is_oneway() {
                let response = command.response_to(response_code, None);
                if let Err(error) = self.core.remoting.reply(&request.addr, response).await {
                    tracing::debug!(%error, "reply to broker request failed");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_announces_a_clustering_push_consumer_with_its_tags() {
        let subscriptions = [
            Subscription::new("orders", "TagA || TagB"),
            Subscription::new("%RETRY%billing", "*"),
        ];
        let data = consumer_data("billing", ConsumeFromWhere::FirstOffset, &subscriptions);
        assert_eq!(data.group_name, "billing");
        assert_eq!(data.consume_type, wire::ConsumeType::ConsumePassively);
        assert_eq!(data.message_model, wire::MessageModel::Clustering);
        assert_eq!(data.consume_from_where, wire::ConsumeFromWhere::FirstOffset);
        let orders = &data.subscription_data_set[0];
        assert_eq!(orders.sub_string, "TagA || TagB");
        assert_eq!(orders.tags_set, ["TagA", "TagB"]);
        // Java's "TagA".hashCode() and "TagB".hashCode().
        assert_eq!(orders.code_set, [2_598_919, 2_598_920]);
        let retry = &data.subscription_data_set[1];
        assert_eq!(
            (retry.topic.as_str(), retry.sub_string.as_str()),
            ("%RETRY%billing", "*")
        );
        assert!(retry.tags_set.is_empty() && retry.code_set.is_empty());
    }

    #[test]
    fn a_timestamp_start_is_announced_as_consume_from_timestamp() {
        assert_eq!(
            wire_consume_from(ConsumeFromWhere::Timestamp(1_700_000_000_000)),
            wire::ConsumeFromWhere::Timestamp
        );
        assert_eq!(
            wire_consume_from(ConsumeFromWhere::LastOffset),
            wire::ConsumeFromWhere::LastOffset
        );
    }
}
