//! The one way into a call, for every call the port serves: who calls ([`Caller`]), whether
//! its account may do what the call needs (ACL), the call's own work, and the count of its
//! answer by result code (`quiver_grpc_calls_total`). A request type says what it needs
//! ([`Call`]) and its answer how a refusal reads ([`Answer`]); [`guarded`] does the rest on
//! the handler's own task, with the needs on the stack where their number is fixed.

use std::future::Future;

use quiver_grpc_proto::v2::{self, ClientType, Code};
use tonic::codegen::BoxStream;
use tonic::Request;

use super::auth::Caller;
use crate::acl::{Perm, Resource};
use crate::broker::Broker;

/// A request of one call.
pub(crate) trait Call: Sized {
    /// The call's name in the counts.
    const NAME: &'static str;
    type Answer: Answer;
    /// The permissions the caller's account must hold.
    type Needs<'a>: AsRef<[(Resource<'a>, Perm)]>
    where
        Self: 'a;
    /// None: the call is answered to anyone, signed or not.
    fn needs(&self) -> Option<Self::Needs<'_>>;
}

/// What a call answers.
pub(crate) trait Answer {
    /// The answer to a refused call: by the ACL, or by the call for what it asks.
    fn refused(status: v2::Status) -> Self;
    /// The result code the answer is counted by; None: not counted.
    fn code(&self) -> Option<i32>;
}

/// Authorises the call, serves it with `serve` when allowed (its refusal answered as the
/// ACL's are), and counts its answer.
pub(crate) async fn guarded<R, F, Fut>(broker: &Broker, request: Request<R>, serve: F) -> R::Answer
where
    R: Call,
    F: FnOnce(Caller, R) -> Fut,
    Fut: Future<Output = Result<R::Answer, v2::Status>>,
{
    let caller = Caller::of(&request);
    let request = request.into_inner();
    let allowed = match request.needs() {
        Some(needs) => caller.authorize(broker, needs.as_ref()),
        None => Ok(()),
    };
    let served = match allowed {
        Ok(()) => serve(caller, request).await,
        Err(refused) => Err(refused),
    };
    let answer = served.unwrap_or_else(R::Answer::refused);
    if let Some(code) = answer.code() {
        broker.grpc().count(R::NAME, code);
    }
    answer
}

/// The name of a resource a request names; empty when it names none.
pub(crate) fn name(resource: Option<&v2::Resource>) -> &str {
    resource.map_or("", |resource| resource.name.as_str())
}

/// What a consumer's call needs: SUB on its topic and on its group.
fn consume_needs<'a>(group: &'a str, topic: &'a str) -> [(Resource<'a>, Perm); 2] {
    [
        (Resource::topic(topic), Perm::SUB),
        (Resource::group(group), Perm::SUB),
    ]
}

/// Calls that need the caller's account and nothing on a resource.
macro_rules! needs_an_account {
    ($($request:ty => $name:literal, $answer:ty;)*) => {$(
        impl Call for $request {
            const NAME: &'static str = $name;
            type Answer = $answer;
            type Needs<'a> = [(Resource<'a>, Perm); 0];
            fn needs(&self) -> Option<Self::Needs<'_>> {
                Some([])
            }
        }
    )*};
}

needs_an_account! {
    v2::NotifyClientTerminationRequest => "NotifyClientTermination",
        v2::NotifyClientTerminationResponse;
    tonic::Streaming<v2::TelemetryCommand> => "Telemetry", Opened;
}

/// A consumer's calls: SUB on the topic and the group they name.
macro_rules! consumes {
    ($($request:ty => $name:literal, $answer:ty, |$it:ident| $topic:expr;)*) => {$(
        impl Call for $request {
            const NAME: &'static str = $name;
            type Answer = $answer;
            type Needs<'a> = [(Resource<'a>, Perm); 2];
            fn needs(&self) -> Option<Self::Needs<'_>> {
                let $it = self;
                Some(consume_needs(name(self.group.as_ref()), $topic))
            }
        }
    )*};
}

consumes! {
    v2::QueryAssignmentRequest => "QueryAssignment", v2::QueryAssignmentResponse,
        |it| name(it.topic.as_ref());
    v2::ReceiveMessageRequest => "ReceiveMessage", Vec<v2::ReceiveMessageResponse>,
        |it| name(it.message_queue.as_ref().and_then(|queue| queue.topic.as_ref()));
    v2::AckMessageRequest => "AckMessage", v2::AckMessageResponse,
        |it| name(it.topic.as_ref());
    v2::ChangeInvisibleDurationRequest => "ChangeInvisibleDuration",
        v2::ChangeInvisibleDurationResponse, |it| name(it.topic.as_ref());
    v2::ForwardMessageToDeadLetterQueueRequest => "ForwardMessageToDeadLetterQueue",
        v2::ForwardMessageToDeadLetterQueueResponse, |it| name(it.topic.as_ref());
}

impl Call for v2::QueryRouteRequest {
    const NAME: &'static str = "QueryRoute";
    type Answer = v2::QueryRouteResponse;
    type Needs<'a> = [(Resource<'a>, Perm); 0];
    /// Routes are answered to anyone (as Apache's name server); creating the topic needs
    /// the right to send to it, which the route query asks itself.
    fn needs(&self) -> Option<Self::Needs<'_>> {
        None
    }
}

impl Call for v2::HeartbeatRequest {
    const NAME: &'static str = "Heartbeat";
    type Answer = v2::HeartbeatResponse;
    type Needs<'a> = Vec<(Resource<'a>, Perm)>;
    /// A consumer's heartbeat needs SUB on its group.
    fn needs(&self) -> Option<Self::Needs<'_>> {
        let group = name(self.group.as_ref());
        Some(match self.client_type() {
            ClientType::PushConsumer | ClientType::SimpleConsumer if !group.is_empty() => {
                vec![(Resource::group(group), Perm::SUB)]
            }
            _ => Vec::new(),
        })
    }
}

impl Call for v2::SendMessageRequest {
    const NAME: &'static str = "SendMessage";
    type Answer = v2::SendMessageResponse;
    type Needs<'a> = Vec<(Resource<'a>, Perm)>;
    /// PUB on the topic of each message.
    fn needs(&self) -> Option<Self::Needs<'_>> {
        Some(
            self.messages
                .iter()
                .map(|message| (Resource::topic(name(message.topic.as_ref())), Perm::PUB))
                .collect(),
        )
    }
}

impl Call for v2::EndTransactionRequest {
    const NAME: &'static str = "EndTransaction";
    type Answer = v2::EndTransactionResponse;
    type Needs<'a> = [(Resource<'a>, Perm); 1];
    /// PUB on the transaction's topic.
    fn needs(&self) -> Option<Self::Needs<'_>> {
        Some([(Resource::topic(name(self.topic.as_ref())), Perm::PUB)])
    }
}

/// Answers whose status line says how the call went.
macro_rules! answers_with_status {
    ($($response:ty),* $(,)?) => {$(
        impl Answer for $response {
            fn refused(status: v2::Status) -> Self {
                let mut answer = Self::default();
                answer.status = Some(status);
                answer
            }

            fn code(&self) -> Option<i32> {
                self.status.as_ref().map(|status| status.code)
            }
        }
    )*};
}

answers_with_status!(
    v2::QueryRouteResponse,
    v2::HeartbeatResponse,
    v2::SendMessageResponse,
    v2::QueryAssignmentResponse,
    v2::EndTransactionResponse,
    v2::NotifyClientTerminationResponse,
    v2::AckMessageResponse,
    v2::ChangeInvisibleDurationResponse,
    v2::ForwardMessageToDeadLetterQueueResponse,
);

/// A receive's responses: their first is the status.
impl Answer for Vec<v2::ReceiveMessageResponse> {
    fn refused(status: v2::Status) -> Self {
        vec![v2::ReceiveMessageResponse {
            content: Some(v2::receive_message_response::Content::Status(status)),
        }]
    }

    fn code(&self) -> Option<i32> {
        match self.first().and_then(|first| first.content.as_ref()) {
            Some(v2::receive_message_response::Content::Status(status)) => Some(status.code),
            _ => None,
        }
    }
}

/// What opening a Telemetry stream answers.
pub(crate) enum Opened {
    /// The commands the broker sends the client.
    Stream(BoxStream<v2::TelemetryCommand>),
    /// The ACL refused the caller: gRPC UNAUTHENTICATED.
    Refused(v2::Status),
    /// A request the stream cannot be opened for (not counted).
    Invalid(tonic::Status),
}

impl Answer for Opened {
    fn refused(status: v2::Status) -> Self {
        Opened::Refused(status)
    }

    fn code(&self) -> Option<i32> {
        match self {
            Opened::Stream(_) => Some(Code::Ok as i32),
            Opened::Refused(status) => Some(status.code),
            Opened::Invalid(_) => None,
        }
    }
}

impl Opened {
    pub(crate) fn into_result(
        self,
    ) -> Result<tonic::Response<BoxStream<v2::TelemetryCommand>>, tonic::Status> {
        match self {
            Opened::Stream(stream) => Ok(tonic::Response::new(stream)),
            Opened::Refused(refused) => Err(tonic::Status::unauthenticated(refused.message)),
            Opened::Invalid(invalid) => Err(invalid),
        }
    }
}
