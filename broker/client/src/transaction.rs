//! The transactional producer, as RocketMQ's `TransactionMQProducer`: a half message is
//! sent, the local transaction runs, and END_TRANSACTION tells the broker to commit or roll
//! back; when that outcome never arrives the broker asks (CHECK_TRANSACTION_STATE) and the
//! check listener answers.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use quiver_protocol::header::{CheckTransactionStateRequestHeader, EndTransactionRequestHeader};
use quiver_protocol::message::{self as wire, sys_flag};
use quiver_protocol::{code, record, RemotingCommand};
use tokio::sync::{mpsc, watch};

use crate::client::ClientCore;
use crate::error::{ClientError, Result};
use crate::message::{Message, ReceivedMessage};
use crate::producer::{Producer, ProducerConfig, QueueSelector, SendResult};
use crate::remoting::InboundRequest;
use crate::MessageQueue;

/// The outcome of a local transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalTransactionState {
    Commit,
    Rollback,
    /// Not known yet: the broker checks back later.
    Unknown,
}

impl LocalTransactionState {
    /// The END_TRANSACTION `commitOrRollback` value (a sysFlag transaction type).
    pub fn wire_value(self) -> i32 {
        match self {
            LocalTransactionState::Commit => sys_flag::TRANSACTION_COMMIT,
            LocalTransactionState::Rollback => sys_flag::TRANSACTION_ROLLBACK,
            LocalTransactionState::Unknown => sys_flag::TRANSACTION_NOT_TYPE,
        }
    }
}

/// The application's side of a transaction. Both calls run on a blocking thread; a panic
/// counts as [`LocalTransactionState::Unknown`] (the broker asks again).
pub trait TransactionListener: Send + Sync + 'static {
    /// Runs the local transaction once the half message is stored.
    fn execute_local_transaction(
        &self,
        message: &Message,
        transaction_id: &str,
    ) -> LocalTransactionState;

    /// Tells the outcome of the transaction of a half message the broker asks about.
    fn check_local_transaction(&self, message: &ReceivedMessage) -> LocalTransactionState;
}

/// A half message's send and the outcome sent to the broker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransactionSendResult {
    pub send: SendResult,
    /// The message's unique id, which names the transaction.
    pub transaction_id: String,
    pub local_state: LocalTransactionState,
}

/// A producer of transactional messages. Cheap to share by reference; stop it with
/// [`TransactionProducer::shutdown`].
pub struct TransactionProducer {
    producer: Producer,
    listener: Arc<dyn TransactionListener>,
    stop: watch::Sender<bool>,
}

impl TransactionProducer {
    /// Starts the producer and its answering of the broker's checks. Needs a tokio runtime.
    pub fn start(config: ProducerConfig, listener: impl TransactionListener) -> Self {
        let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
        let core = ClientCore::with_inbound(config.client.clone(), inbound_tx);
        let producer = Producer::with_core(config, core);
        let listener: Arc<dyn TransactionListener> = Arc::new(listener);
        let (stop, stop_rx) = watch::channel(false);
        tokio::spawn(answer_checks(
            producer.clone(),
            listener.clone(),
            inbound_rx,
            stop_rx,
        ));
        Self {
            producer,
            listener,
            stop,
        }
    }

    pub fn client_id(&self) -> &str {
        self.producer.client_id()
    }

    /// Sends `message` as a half message, runs the local transaction and sends its outcome.
    pub async fn send_in_transaction(&self, message: Message) -> Result<TransactionSendResult> {
        let group = self.producer.config().group.clone();
        let mut message = message
            .with_property(wire::PROPERTY_TRANSACTION_PREPARED, "true")
            .with_property(wire::PROPERTY_PRODUCER_GROUP, group);
        // As RocketMQ's clients: a transactional message carries no delay level.
        message.properties.remove(wire::PROPERTY_DELAY);
        let send = self
            .producer
            .send_flagged(
                message.clone(),
                QueueSelector::RoundRobin,
                sys_flag::TRANSACTION_PREPARED,
            )
            .await?;
        let transaction_id = send.msg_id.clone();
        let listener = self.listener.clone();
        let (executed, id) = (message, transaction_id.clone());
        let local_state = tokio::task::spawn_blocking(move || {
            guarded(|| listener.execute_local_transaction(&executed, &id))
        })
        .await
        .unwrap_or(LocalTransactionState::Unknown);
        let addr = self.producer.core().broker_addr(&send.queue.broker_name)?;
        let (_, commit_log_offset) =
            wire::decode_offset_msg_id(&send.offset_msg_id).map_err(|_| {
                ClientError::InvalidArgument {
                    what: "offset msg id",
                    reason: format!("the broker answered `{}`", send.offset_msg_id),
                }
            })?;
        let header = EndTransactionRequestHeader {
            producer_group: self.producer.config().group.clone(),
            tran_state_table_offset: i64::try_from(send.queue_offset.0).unwrap_or(i64::MAX),
            commit_log_offset: i64::try_from(commit_log_offset).unwrap_or(i64::MAX),
            commit_or_rollback: local_state.wire_value(),
            from_transaction_check: Some(false),
            msg_id: send.msg_id.clone(),
            transaction_id: Some(transaction_id.clone()),
        };
        end_transaction(self.producer.core(), &addr, header).await?;
        Ok(TransactionSendResult {
            send,
            transaction_id,
            local_state,
        })
    }

    /// Stops answering checks, leaves the producer group and closes the connections.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        self.producer.shutdown().await;
    }
}

impl Drop for TransactionProducer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Runs a listener call; a panic is an unknown outcome.
fn guarded(call: impl FnOnce() -> LocalTransactionState) -> LocalTransactionState {
    catch_unwind(AssertUnwindSafe(call)).unwrap_or_else(|_| {
        tracing::warn!("the transaction listener panicked; the outcome is unknown");
        LocalTransactionState::Unknown
    })
}

async fn end_transaction(
    core: &ClientCore,
    addr: &str,
    header: EndTransactionRequestHeader,
) -> Result<()> {
    let request = RemotingCommand::request(code::request::END_TRANSACTION, header.to_ext());
    core.invoke_oneway(addr, request).await
}

/// Answers the broker's CHECK_TRANSACTION_STATE requests until stopped.
async fn answer_checks(
    producer: Producer,
    listener: Arc<dyn TransactionListener>,
    mut inbound: mpsc::UnboundedReceiver<InboundRequest>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let request = tokio::select! {
            request = inbound.recv() => match request { Some(r) => r, None => return },
            _ = stop.changed() => return,
        };
        if request.command.code != code::request::CHECK_TRANSACTION_STATE {
            refuse(&producer, request).await;
            continue;
        }
        let producer = producer.clone();
        let listener = listener.clone();
        tokio::spawn(async move {
            if let Err(error) = answer_check(&producer, listener, &request).await {
                tracing::warn!(addr = %request.addr, %error, "answering a transaction check failed");
            }
        });
    }
}

async fn refuse(producer: &Producer, request: InboundRequest) {
    let Some(response) = crate::remoting::not_handled(&request.command, "a transactional producer")
    else {
        return;
    };
    let _ = producer
        .core()
        .remoting
        .reply(&request.addr, response)
        .await;
}

/// Asks the check listener about the half message in the request and sends its answer.
async fn answer_check(
    producer: &Producer,
    listener: Arc<dyn TransactionListener>,
    request: &InboundRequest,
) -> Result<()> {
    let header =
        CheckTransactionStateRequestHeader::from_command(&request.command).map_err(|source| {
            ClientError::Header {
                addr: request.addr.clone(),
                request_code: code::request::CHECK_TRANSACTION_STATE,
                source,
            }
        })?;
    let (record, size) =
        record::decode(&request.command.body).map_err(|error| ClientError::InvalidArgument {
            what: "CHECK_TRANSACTION_STATE body",
            reason: error.to_string(),
        })?;
    let broker_name = header.broker_name.clone().unwrap_or_default();
    let queue = MessageQueue::new(&record.topic, &broker_name, record.queue_id);
    let message = ReceivedMessage::from_record(record, queue, size as u64);
    let msg_id = message.msg_id();
    let checked = message.clone();
    let state =
        tokio::task::spawn_blocking(move || guarded(|| listener.check_local_transaction(&checked)))
            .await
            .unwrap_or(LocalTransactionState::Unknown);
    let end = EndTransactionRequestHeader {
        producer_group: producer.config().group.clone(),
        tran_state_table_offset: header.tran_state_table_offset,
        commit_log_offset: header.commit_log_offset,
        commit_or_rollback: state.wire_value(),
        from_transaction_check: Some(true),
        msg_id,
        transaction_id: header.transaction_id.clone(),
    };
    end_transaction(producer.core(), &request.addr, end).await
}
