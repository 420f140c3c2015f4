//! The edge where what went wrong becomes a 5.x status: every refusal the gRPC calls answer
//! (the ACL's, the produce and transaction services', the POP service's) is mapped to its
//! `Code` here and nowhere else.

use quiver_grpc_proto::v2::{Code, Status};
use quiver_store::StoreError;

use crate::acl::RefusedBecause;
use crate::pop::PopError;
use crate::replication::ConfirmError;
use crate::service::ServiceError;

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

/// A service's refusal or failure (produce, transaction).
pub(crate) fn of_service(error: ServiceError) -> Status {
    let code = match &error {
        ServiceError::Forbidden(_) => Code::Forbidden,
        ServiceError::TopicNotFound(_) => Code::TopicNotFound,
        ServiceError::IllegalMessage(_) | ServiceError::BadRequest(_) => Code::BadRequest,
        ServiceError::BodyTooLarge(_) => Code::MessageBodyTooLarge,
        ServiceError::NotFound(_) => Code::NotFound,
        ServiceError::Busy(_) => Code::TooManyRequests,
        ServiceError::InvalidTransaction(_) => Code::InvalidTransactionId,
        // A sync send the in-sync replicas did not confirm in time.
        ServiceError::Replication(ConfirmError::Timeout(_) | ConfirmError::Deposed) => {
            Code::SlavePersistenceTimeout
        }
        ServiceError::Replication(ConfirmError::TooFewCopies { .. })
        | ServiceError::Store(_)
        | ServiceError::Broker(_) => Code::InternalServerError,
    };
    let message = match &error {
        // A full disk, or not the master: the producer retries elsewhere.
        ServiceError::Store(StoreError::WritesRefused(refusal)) => {
            format!("service not available now: {}", refusal.message)
        }
        error => crate::error::chain(error),
    };
    status(code, message)
}

/// A delivery time the broker does not take (beyond the timer's reach, or malformed).
pub(crate) fn of_delivery_time(error: ServiceError) -> Status {
    Status {
        code: Code::IllegalDeliveryTime as i32,
        ..of_service(error)
    }
}

/// A transaction's end refused: INVALID_TRANSACTION_ID for a transaction id naming no half
/// message of its topic and, as the remoting port's SYSTEM_ERROR always read here, for a
/// store or broker failure while ending.
pub(crate) fn of_ending(error: ServiceError) -> Status {
    match error {
        ServiceError::Store(StoreError::WritesRefused(_)) => of_service(error),
        ServiceError::Store(_) | ServiceError::Broker(_) => Status {
            code: Code::InvalidTransactionId as i32,
            ..of_service(error)
        },
        error => of_service(error),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::service::produce::check_body;

    #[test]
    fn bodies_refused_answer_their_own_codes() {
        let too_large = of_service(check_body(5, 4).unwrap_err());
        assert_eq!(too_large.code, Code::MessageBodyTooLarge as i32);
        assert_eq!(
            too_large.message,
            "message body of 5 bytes exceeds max-message-size 4"
        );
        assert_eq!(
            of_service(check_body(0, 4).unwrap_err()).code,
            Code::BadRequest as i32
        );
    }
}
