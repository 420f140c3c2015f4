//! `MessagingService`: each call goes through [`guarded`] (authorised, then counted by
//! result code) to its family's file, which decodes it, calls the broker's services and maps
//! their errors (`status.rs`).

use std::future::Future;
use std::sync::Arc;

use quiver_grpc_proto::v2::messaging_service_server::MessagingService;
use quiver_grpc_proto::v2::{self, Code};
use tokio::sync::watch;
use tonic::codegen::BoxStream;
use tonic::{Request, Response, Status};

use super::auth::Caller;
use super::call::{guarded, name, Call};
use super::status::ok;
use super::{consume, route, send, telemetry, transaction};
use crate::acl::{Perm, Resource};
use crate::broker::Broker;

/// The service over one broker.
pub(crate) struct Messaging {
    broker: Arc<Broker>,
    /// Flips when the broker stops: Telemetry streams end, parked receives answer at once.
    stop: watch::Receiver<bool>,
}

impl Messaging {
    pub fn new(broker: Arc<Broker>, stop: watch::Receiver<bool>) -> Messaging {
        Messaging { broker, stop }
    }

    /// Calls of the newer `apache.rocketmq.v2` API that Quiver does not serve: refused at once
    /// (gRPC UNIMPLEMENTED), counted as NOT_IMPLEMENTED.
    fn not_served(&self, call: &'static str, instead: &str) -> Status {
        self.broker.grpc().count(call, Code::NotImplemented as i32);
        Status::unimplemented(format!("{call} is not supported by Quiver; {instead}"))
    }

    /// A call answered once, through [`guarded`].
    async fn unary<R, F, Fut>(
        &self,
        request: Request<R>,
        serve: F,
    ) -> Result<Response<R::Answer>, Status>
    where
        R: Call,
        F: FnOnce(Caller, R) -> Fut,
        Fut: Future<Output = Result<R::Answer, v2::Status>>,
    {
        Ok(Response::new(guarded(&self.broker, request, serve).await))
    }
}

#[tonic::async_trait]
impl MessagingService for Messaging {
    async fn query_route(
        &self,
        request: Request<v2::QueryRouteRequest>,
    ) -> Result<Response<v2::QueryRouteResponse>, Status> {
        let broker = &self.broker;
        self.unary(request, |caller, request| async move {
            let topic = name(request.topic.as_ref());
            let may_create = caller.may(broker, &[(Resource::topic(topic), Perm::PUB)]);
            route::query_route(broker, topic, may_create)
        })
        .await
    }

    async fn heartbeat(
        &self,
        request: Request<v2::HeartbeatRequest>,
    ) -> Result<Response<v2::HeartbeatResponse>, Status> {
        self.unary(request, |_, _| async {
            Ok(v2::HeartbeatResponse { status: Some(ok()) })
        })
        .await
    }

    async fn send_message(
        &self,
        request: Request<v2::SendMessageRequest>,
    ) -> Result<Response<v2::SendMessageResponse>, Status> {
        let broker = &self.broker;
        self.unary(request, |caller, request| async move {
            for message in &request.messages {
                let topic = name(message.topic.as_ref());
                broker
                    .grpc()
                    .sessions
                    .note_published(&caller.client_id, topic);
            }
            send::send(broker, &request, caller.remote).await
        })
        .await
    }

    async fn query_assignment(
        &self,
        request: Request<v2::QueryAssignmentRequest>,
    ) -> Result<Response<v2::QueryAssignmentResponse>, Status> {
        self.unary(request, |_, request| async move {
            route::query_assignment(&self.broker, name(request.topic.as_ref()))
        })
        .await
    }

    async fn end_transaction(
        &self,
        request: Request<v2::EndTransactionRequest>,
    ) -> Result<Response<v2::EndTransactionResponse>, Status> {
        self.unary(request, |_, request| async move {
            transaction::end(&self.broker, &request).await
        })
        .await
    }

    async fn telemetry(
        &self,
        request: Request<tonic::Streaming<v2::TelemetryCommand>>,
    ) -> Result<Response<BoxStream<v2::TelemetryCommand>>, Status> {
        let broker = &self.broker;
        guarded(broker, request, |caller, inbound| async move {
            Ok(telemetry::open(broker, caller, inbound, self.stop.clone()))
        })
        .await
        .into_result()
    }

    async fn notify_client_termination(
        &self,
        request: Request<v2::NotifyClientTerminationRequest>,
    ) -> Result<Response<v2::NotifyClientTerminationResponse>, Status> {
        self.unary(request, |caller, _| async move {
            self.broker.grpc().sessions.terminate(&caller.client_id);
            Ok(v2::NotifyClientTerminationResponse { status: Some(ok()) })
        })
        .await
    }

    async fn receive_message(
        &self,
        request: Request<v2::ReceiveMessageRequest>,
    ) -> Result<Response<BoxStream<v2::ReceiveMessageResponse>>, Status> {
        let broker = &self.broker;
        let responses = guarded(broker, request, |caller, request| async move {
            consume::receive(broker, &caller, &request, self.stop.clone()).await
        })
        .await;
        let stream = tokio_stream::iter(responses.into_iter().map(Ok));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn ack_message(
        &self,
        request: Request<v2::AckMessageRequest>,
    ) -> Result<Response<v2::AckMessageResponse>, Status> {
        self.unary(request, |_, request| consume::ack(&self.broker, request))
            .await
    }

    async fn change_invisible_duration(
        &self,
        request: Request<v2::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<v2::ChangeInvisibleDurationResponse>, Status> {
        self.unary(request, |_, request| {
            consume::change_invisible(&self.broker, request)
        })
        .await
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<v2::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<v2::ForwardMessageToDeadLetterQueueResponse>, Status> {
        self.unary(request, |_, request| {
            consume::forward_to_dead_letter(&self.broker, request)
        })
        .await
    }

    async fn pull_message(
        &self,
        _request: Request<v2::PullMessageRequest>,
    ) -> Result<Response<BoxStream<v2::PullMessageResponse>>, Status> {
        Err(self.not_served(
            "PullMessage",
            "consume with ReceiveMessage (a SimpleConsumer or PushConsumer)",
        ))
    }

    async fn update_offset(
        &self,
        _request: Request<v2::UpdateOffsetRequest>,
    ) -> Result<Response<v2::UpdateOffsetResponse>, Status> {
        Err(self.not_served("UpdateOffset", "acknowledge messages with AckMessage"))
    }

    async fn get_offset(
        &self,
        _request: Request<v2::GetOffsetRequest>,
    ) -> Result<Response<v2::GetOffsetResponse>, Status> {
        Err(self.not_served(
            "GetOffset",
            "consumer offsets are read over the remoting port",
        ))
    }

    async fn query_offset(
        &self,
        _request: Request<v2::QueryOffsetRequest>,
    ) -> Result<Response<v2::QueryOffsetResponse>, Status> {
        Err(self.not_served(
            "QueryOffset",
            "queue offsets are read over the remoting port",
        ))
    }
}
