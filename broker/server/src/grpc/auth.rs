//! Who is calling: the remote address, the `x-mq-*` metadata 5.x clients send with every call,
//! the `authorization` header (ACL), and the deadline (`grpc-timeout`).

use std::net::SocketAddr;
use std::time::Duration;

use quiver_grpc_proto::v2::Status;
use tonic::metadata::MetadataMap;

use super::listener::RemoteAddr;
use super::status;
use crate::acl::{GrpcCredentials, Perm, Resource};
use crate::broker::Broker;

/// The scheme of the `authorization` header 5.x clients send.
const AUTHORIZATION_SCHEME: &str = "MQv2-HMAC-SHA1";

/// The metadata of one call that the broker uses.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub remote: SocketAddr,
    pub client_id: String,
    /// (access key, signature, date time) when the call is signed.
    credentials: Option<(String, String, String)>,
    /// What the client's `grpc-timeout` leaves the call.
    pub timeout: Option<Duration>,
}

impl Caller {
    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        let metadata = request.metadata();
        let remote = request
            .extensions()
            .get::<RemoteAddr>()
            .map_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)), |addr| addr.0);
        let text = |key: &str| {
            metadata
                .get(key)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
        };
        let credentials = text("authorization")
            .and_then(|value| parse_authorization(&value))
            .zip(text("x-mq-date-time"))
            .map(|((access_key, signature), date_time)| (access_key, signature, date_time));
        Caller {
            remote,
            client_id: text("x-mq-client-id").unwrap_or_default(),
            credentials,
            timeout: grpc_timeout(metadata),
        }
    }

    fn credentials(&self) -> Option<GrpcCredentials<'_>> {
        self.credentials
            .as_ref()
            .map(|(access_key, signature, date_time)| GrpcCredentials {
                access_key,
                signature,
                date_time,
            })
    }

    /// Whether ACL is off or the caller may do `needs`; a no is not counted as a refusal.
    pub fn may(&self, broker: &Broker, needs: &[(Resource<'_>, Perm)]) -> bool {
        broker
            .acl()
            .as_ref()
            .is_none_or(|acl| acl.allows_grpc(self.credentials(), self.remote.ip(), needs))
    }

    /// Refuses the call unless ACL is off or the caller may do `needs` (UNAUTHORIZED for who
    /// it is, FORBIDDEN for what it asks).
    pub fn authorize(&self, broker: &Broker, needs: &[(Resource<'_>, Perm)]) -> Result<(), Status> {
        let Some(acl) = broker.acl() else {
            return Ok(());
        };
        acl.check_grpc(self.credentials(), self.remote.ip(), needs)
            .map_err(|(because, reason)| {
                tracing::debug!(remote = %self.remote, reason = because.label(), "gRPC call refused by ACL");
                status::of_acl(because, reason)
            })
    }
}

/// (access key, signature) of `MQv2-HMAC-SHA1 Credential=AK, SignedHeaders=x-mq-date-time,
/// Signature=HEX`.
fn parse_authorization(value: &str) -> Option<(String, String)> {
    let fields = value.trim().strip_prefix(AUTHORIZATION_SCHEME)?;
    let mut access_key = None;
    let mut signature = None;
    for field in fields.split(',') {
        match field.trim().split_once('=') {
            Some(("Credential", key)) => access_key = Some(key.trim().to_owned()),
            Some(("Signature", sig)) => signature = Some(sig.trim().to_owned()),
            _ => {}
        }
    }
    access_key.zip(signature)
}

/// The `grpc-timeout` header: digits and a unit (H, M, S, m, u, n).
fn grpc_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount.saturating_mul(3600)),
        "M" => Duration::from_secs(amount.saturating_mul(60)),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_authorization_header_gives_key_and_signature() {
        let header = "MQv2-HMAC-SHA1 Credential=AK1, SignedHeaders=x-mq-date-time, Signature=ABC0";
        assert_eq!(
            parse_authorization(header),
            Some(("AK1".to_owned(), "ABC0".to_owned()))
        );
        assert_eq!(parse_authorization("Basic abc"), None);
        assert_eq!(parse_authorization("MQv2-HMAC-SHA1 Credential=AK1"), None);
    }

    #[test]
    fn grpc_timeouts_read_in_their_unit() {
        let mut metadata = MetadataMap::new();
        for (text, expected) in [
            ("30S", Duration::from_secs(30)),
            ("2500m", Duration::from_millis(2500)),
            ("1M", Duration::from_secs(60)),
            ("7000000u", Duration::from_secs(7)),
        ] {
            metadata.insert("grpc-timeout", text.parse().unwrap());
            assert_eq!(grpc_timeout(&metadata), Some(expected), "{text}");
        }
        metadata.insert("grpc-timeout", "x".parse().unwrap());
        assert_eq!(grpc_timeout(&metadata), None);
    }
}
