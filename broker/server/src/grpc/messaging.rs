//! `MessagingService`: each call is authorised (ACL: the caller's account may do what the
//! call names) and handed to its family's file.

use std::sync::Arc;

use quiver_grpc_proto::v2::messaging_service_server::MessagingService;
use quiver_grpc_proto::v2::{self, ClientType, Code};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::auth::Caller;
use super::telemetry::{self, OUTBOUND_QUEUE};
use super::{consume, ok, route, send, status, transaction};
use crate::acl::{Perm, Resource};
use crate::broker::Broker;

use tonic::codegen::BoxStream;

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

    fn count(&self, call: &'static str, status: Option<&v2::Status>) {
        if let Some(status) = status {
            self.broker.grpc.count(call, status);
        }
    }

    /// Calls of the newer `apache.rocketmq.v2` API that Quiver does not serve: refused at once
    /// (gRPC UNIMPLEMENTED), counted as NOT_IMPLEMENTED.
    fn not_served(&self, call: &'static str, instead: &str) -> Status {
        let message = format!("{call} is not supported by Quiver; {instead}");
        self.count(call, Some(&status(Code::NotImplemented, message.clone())));
        Status::unimplemented(message)
    }
}

/// What a consumer's call needs: SUB on its topic and on its group.
fn consume_needs<'a>(group: &'a str, topic: &'a str) -> [(Resource<'a>, Perm); 2] {
    [
        (Resource::topic(topic), Perm::SUB),
        (Resource::group(group), Perm::SUB),
    ]
}

fn name(resource: Option<&v2::Resource>) -> &str {
    resource.map_or("", |resource| resource.name.as_str())
}

#[tonic::async_trait]
impl MessagingService for Messaging {
    async fn query_route(
        &self,
        request: Request<v2::QueryRouteRequest>,
    ) -> Result<Response<v2::QueryRouteResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topic = name(request.topic.as_ref());
        // Routes are answered to anyone (as Apache's name server); creating the topic needs
        // the right to send to it.
        let may_create = caller.may(&self.broker, &[(Resource::topic(topic), Perm::PUB)]);
        let route = route::query_route(&self.broker, topic, may_create);
        self.count("QueryRoute", route.status.as_ref());
        Ok(Response::new(route))
    }

    async fn heartbeat(
        &self,
        request: Request<v2::HeartbeatRequest>,
    ) -> Result<Response<v2::HeartbeatResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let group = name(request.group.as_ref());
        let needs: Vec<(Resource<'_>, Perm)> = match request.client_type() {
            ClientType::PushConsumer | ClientType::SimpleConsumer if !group.is_empty() => {
                vec![(Resource::group(group), Perm::SUB)]
            }
            _ => Vec::new(),
        };
        let status = match caller.authorize(&self.broker, &needs) {
            Ok(()) => ok(),
            Err(refused) => refused,
        };
        self.count("Heartbeat", Some(&status));
        Ok(Response::new(v2::HeartbeatResponse {
            status: Some(status),
        }))
    }

    async fn send_message(
        &self,
        request: Request<v2::SendMessageRequest>,
    ) -> Result<Response<v2::SendMessageResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topics: Vec<&str> = request
            .messages
            .iter()
            .map(|message| name(message.topic.as_ref()))
            .collect();
        let needs: Vec<(Resource<'_>, Perm)> = topics
            .iter()
            .map(|topic| (Resource::topic(topic), Perm::PUB))
            .collect();
        if let Err(refused) = caller.authorize(&self.broker, &needs) {
            self.count("SendMessage", Some(&refused));
            return Ok(Response::new(v2::SendMessageResponse {
                status: Some(refused),
                entries: Vec::new(),
            }));
        }
        for topic in &topics {
            self.broker
                .grpc
                .sessions
                .note_published(&caller.client_id, topic);
        }
        let response = send::send(&self.broker, &request, caller.remote).await;
        self.count("SendMessage", response.status.as_ref());
        Ok(Response::new(response))
    }

    async fn query_assignment(
        &self,
        request: Request<v2::QueryAssignmentRequest>,
    ) -> Result<Response<v2::QueryAssignmentResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topic = name(request.topic.as_ref());
        let group = name(request.group.as_ref());
        let needs = consume_needs(group, topic);
        let response = match caller.authorize(&self.broker, &needs) {
            Ok(()) => route::query_assignment(&self.broker, topic),
            Err(refused) => v2::QueryAssignmentResponse {
                status: Some(refused),
                assignments: Vec::new(),
            },
        };
        self.count("QueryAssignment", response.status.as_ref());
        Ok(Response::new(response))
    }

    async fn end_transaction(
        &self,
        request: Request<v2::EndTransactionRequest>,
    ) -> Result<Response<v2::EndTransactionResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let topic = name(request.topic.as_ref());
        let status = match caller.authorize(&self.broker, &[(Resource::topic(topic), Perm::PUB)]) {
            Ok(()) => transaction::end(&self.broker, &request).await,
            Err(refused) => refused,
        };
        self.count("EndTransaction", Some(&status));
        Ok(Response::new(v2::EndTransactionResponse {
            status: Some(status),
        }))
    }

    async fn telemetry(
        &self,
        request: Request<tonic::Streaming<v2::TelemetryCommand>>,
    ) -> Result<Response<BoxStream<v2::TelemetryCommand>>, Status> {
        let caller = Caller::of(&request);
        if let Err(refused) = caller.authorize(&self.broker, &[]) {
            self.count("Telemetry", Some(&refused));
            return Err(Status::unauthenticated(refused.message));
        }
        if caller.client_id.is_empty() {
            return Err(Status::invalid_argument(
                "a Telemetry stream needs the x-mq-client-id header",
            ));
        }
        self.count("Telemetry", Some(&ok()));
        let (outbound, commands) = mpsc::channel(OUTBOUND_QUEUE);
        tokio::spawn(telemetry::serve_stream(
            self.broker.clone(),
            caller.client_id,
            request.into_inner(),
            caller.remote,
            outbound,
            self.stop.clone(),
        ));
        Ok(Response::new(Box::pin(ReceiverStream::new(commands))))
    }

    async fn notify_client_termination(
        &self,
        request: Request<v2::NotifyClientTerminationRequest>,
    ) -> Result<Response<v2::NotifyClientTerminationResponse>, Status> {
        let caller = Caller::of(&request);
        let status = match caller.authorize(&self.broker, &[]) {
            Ok(()) => {
                self.broker.grpc.sessions.terminate(&caller.client_id);
                ok()
            }
            Err(refused) => refused,
        };
        self.count("NotifyClientTermination", Some(&status));
        Ok(Response::new(v2::NotifyClientTerminationResponse {
            status: Some(status),
        }))
    }

    async fn receive_message(
        &self,
        request: Request<v2::ReceiveMessageRequest>,
    ) -> Result<Response<BoxStream<v2::ReceiveMessageResponse>>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let group = name(request.group.as_ref());
        let topic = name(
            request
                .message_queue
                .as_ref()
                .and_then(|q| q.topic.as_ref()),
        );
        let needs = consume_needs(group, topic);
        let responses = match caller.authorize(&self.broker, &needs) {
            Ok(()) => consume::receive(&self.broker, &caller, &request, self.stop.clone()).await,
            Err(refused) => vec![v2::ReceiveMessageResponse {
                content: Some(v2::receive_message_response::Content::Status(refused)),
            }],
        };
        if let Some(v2::receive_message_response::Content::Status(status)) =
            responses.first().and_then(|first| first.content.as_ref())
        {
            self.count("ReceiveMessage", Some(status));
        }
        let stream = tokio_stream::iter(responses.into_iter().map(Ok));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn ack_message(
        &self,
        request: Request<v2::AckMessageRequest>,
    ) -> Result<Response<v2::AckMessageResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let group = name(request.group.as_ref());
        let topic = name(request.topic.as_ref());
        let needs = consume_needs(group, topic);
        let response = match caller.authorize(&self.broker, &needs) {
            Ok(()) => consume::ack(&self.broker, request).await,
            Err(refused) => v2::AckMessageResponse {
                status: Some(refused),
                entries: Vec::new(),
            },
        };
        self.count("AckMessage", response.status.as_ref());
        Ok(Response::new(response))
    }

    async fn change_invisible_duration(
        &self,
        request: Request<v2::ChangeInvisibleDurationRequest>,
    ) -> Result<Response<v2::ChangeInvisibleDurationResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let group = name(request.group.as_ref());
        let topic = name(request.topic.as_ref());
        let needs = consume_needs(group, topic);
        let response = match caller.authorize(&self.broker, &needs) {
            Ok(()) => consume::change_invisible(&self.broker, request).await,
            Err(refused) => v2::ChangeInvisibleDurationResponse {
                status: Some(refused),
                receipt_handle: String::new(),
            },
        };
        self.count("ChangeInvisibleDuration", response.status.as_ref());
        Ok(Response::new(response))
    }

    async fn forward_message_to_dead_letter_queue(
        &self,
        request: Request<v2::ForwardMessageToDeadLetterQueueRequest>,
    ) -> Result<Response<v2::ForwardMessageToDeadLetterQueueResponse>, Status> {
        let caller = Caller::of(&request);
        let request = request.into_inner();
        let group = name(request.group.as_ref());
        let topic = name(request.topic.as_ref());
        let needs = consume_needs(group, topic);
        let response = match caller.authorize(&self.broker, &needs) {
            Ok(()) => consume::forward_to_dead_letter(&self.broker, request).await,
            Err(refused) => v2::ForwardMessageToDeadLetterQueueResponse {
                status: Some(refused),
            },
        };
        self.count("ForwardMessageToDeadLetterQueue", response.status.as_ref());
        Ok(Response::new(response))
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
