//! The edge where what went wrong becomes a 5.x status: every refusal the gRPC calls answer
//! (the ACL's, the shared send and transaction paths', the POP service's) is mapped to its
//! `Code` here and nowhere else.

use quiver_grpc_proto::v2::{Code, Status};
use quiver_protocol::code::response;

use crate::acl::RefusedBecause;
use crate::pop::PopError;
use crate::processor::{Refusal, SendError};

/// A status line of a response.
pub(crate) fn status(code: Code, message: impl Into<String>) -> Status {
    Status {
        code: code as i32,
        message: message.into(),
    }
}

pub(crate) fn ok() -> Status {
    status(Code::Ok, "OK")
}

/// An ACL refusal: FORBIDDEN for what the caller asks, UNAUTHORIZED for who it is.
pub(crate) fn of_acl(because: RefusedBecause, reason: String) -> Status {
    let code = match because {
        RefusedBecause::NoPermission | RefusedBecause::AdminRequired => Code::Forbidden,
        _ => Code::Unauthorized,
    };
    status(code, reason)
}

/// A refusal of the send and transaction paths the gRPC calls share with the remoting port.
pub(crate) fn of_refusal(refusal: &Refusal) -> Status {
    let code = match refusal.code {
        response::TOPIC_NOT_EXIST => Code::TopicNotFound,
        response::NO_PERMISSION => Code::Forbidden,
        response::MESSAGE_ILLEGAL => Code::BadRequest,
        response::SYSTEM_BUSY => Code::TooManyRequests,
        response::SUBSCRIPTION_GROUP_NOT_EXIST => Code::ConsumerGroupNotFound,
        response::SUBSCRIPTION_PARSE_FAILED => Code::IllegalFilterExpression,
        // A sync send the in-sync replicas did not confirm in time.
        response::FLUSH_SLAVE_TIMEOUT => Code::SlavePersistenceTimeout,
        _ => Code::InternalServerError,
    };
    status(code, refusal.remark.clone())
}

/// A send the store or the replicas did not acknowledge.
pub(crate) fn of_send(error: SendError) -> Status {
    of_refusal(&Refusal::from(error))
}

/// A delivery time the broker does not take (beyond the timer's reach, or malformed).
pub(crate) fn of_delivery_time(refusal: &Refusal) -> Status {
    Status {
        code: Code::IllegalDeliveryTime as i32,
        ..of_refusal(refusal)
    }
}

/// A transaction's end refused: a transaction id naming no half message of its topic is
/// INVALID_TRANSACTION_ID.
pub(crate) fn of_ending(refusal: Refusal) -> Status {
    if refusal.code == response::SYSTEM_ERROR {
        return status(Code::InvalidTransactionId, refusal.remark);
    }
    of_refusal(&refusal)
}

/// A failure of the broker itself (a blocking task that did not finish).
pub(crate) fn internal(error: &dyn std::error::Error) -> Status {
    status(Code::InternalServerError, crate::error::chain(error))
}

/// A failed POP call.
pub(crate) fn of_pop(error: &PopError) -> Status {
    let code = match error {
        PopError::InvalidHandle | PopError::HandleExpired => Code::InvalidReceiptHandle,
        PopError::TopicNotFound(_) => Code::TopicNotFound,
        PopError::ConsumeDisabled(_) => Code::Forbidden,
        PopError::Filter(_) => Code::IllegalFilterExpression,
        PopError::Store(_) | PopError::BadRecord { .. } | PopError::Task(_) => {
            Code::InternalServerError
        }
    };
    status(code, crate::error::chain(error))
}
