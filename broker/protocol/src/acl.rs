//! RocketMQ 4.x ACL signatures, as the clients' ACL hooks (Java `AclClientRPCHook`, the C++
//! client's `ClientRPCHook`) compute them and Apache's `PlainAccessValidator` checks them.
//!
//! The signed content is the values of the request's extFields, `Signature` left out, in the
//! order of their keys, then the body; the signature is Base64(HMAC-SHA1(content, secret key)).
//! The extFields include `AccessKey` (and `SecurityToken`, and whatever a client adds, like
//! the C++ client's `OnsChannel`), so the header's serialization (JSON or binary) does not
//! matter: both carry the same strings.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha1::Sha1;

use crate::RemotingCommand;

/// extFields key of the account's access key.
pub const ACCESS_KEY: &str = "AccessKey";
/// extFields key of the signature.
pub const SIGNATURE: &str = "Signature";
/// extFields key of an optional session token; signed like any other field.
pub const SECURITY_TOKEN: &str = "SecurityToken";
/// Java's `MixAll.UNIQUE_MSG_QUERY_FLAG`: added after signing by the Java admin, so Apache's
/// validator leaves it out of the content, as we do.
pub const UNIQUE_MSG_QUERY_FLAG: &str = "_UNIQUE_KEY_QUERY";

/// Bytes of an HMAC-SHA1.
const SIGNATURE_BYTES: usize = 20;

type HmacSha1 = Hmac<Sha1>;

/// An account's keys, as a client signs its requests with them.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub security_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret never reaches a log.
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field(
                "security_token",
                &self.security_token.as_ref().map(|_| "***"),
            )
            .finish_non_exhaustive()
    }
}

impl Credentials {
    pub fn new(access_key: impl Into<String>, secret_key: impl Into<String>) -> Credentials {
        Credentials {
            access_key: access_key.into(),
            secret_key: secret_key.into(),
            security_token: None,
        }
    }

    /// Adds `AccessKey` (and `SecurityToken`) to the request's extFields and signs it: call
    /// it once every other field and the body are final.
    pub fn sign(&self, command: &mut RemotingCommand) {
        let fields = &mut command.ext_fields;
        fields.insert(ACCESS_KEY, self.access_key.clone());
        if let Some(token) = &self.security_token {
            fields.insert(SECURITY_TOKEN, token.clone());
        }
        fields.remove(SIGNATURE);
        let signature = signature(command, &self.secret_key);
        command.ext_fields.insert(SIGNATURE, signature);
    }
}

/// The signature of `command`'s content under `secret_key`, Base64 as it travels.
pub fn signature(command: &RemotingCommand, secret_key: &str) -> String {
    let digest = content_mac(command, secret_key).finalize().into_bytes();
    base64::engine::general_purpose::STANDARD.encode(digest)
}

/// Whether `command` carries the signature of its content under `secret_key` (compared in
/// constant time). False when it carries none or one that is not Base64 of 20 bytes.
pub fn verify(command: &RemotingCommand, secret_key: &str) -> bool {
    let Some(claimed) = command.ext(SIGNATURE) else {
        return false;
    };
    let mut decoded = [0u8; SIGNATURE_BYTES + 3];
    let engine = base64::engine::general_purpose::STANDARD;
    match engine.decode_slice(claimed.as_bytes(), &mut decoded) {
        Ok(SIGNATURE_BYTES) => content_mac(command, secret_key)
            .verify_slice(&decoded[..SIGNATURE_BYTES])
            .is_ok(),
        _ => false,
    }
}

/// The HMAC fed with the signed content, without joining it first.
fn content_mac(command: &RemotingCommand, secret_key: &str) -> HmacSha1 {
    let mut mac =
        HmacSha1::new_from_slice(secret_key.as_bytes()).expect("HMAC takes a key of any length");
    for (_, value) in signed_fields(command) {
        mac.update(value.as_bytes());
    }
    mac.update(&command.body);
    for part in &command.body_chain {
        mac.update(part);
    }
    mac
}

/// The extFields that are signed, sorted by key (Java's `TreeMap`, C++'s `std::map`: the keys
/// are ASCII, so byte order is theirs).
fn signed_fields(command: &RemotingCommand) -> Vec<(&str, &str)> {
    let mut fields: Vec<(&str, &str)> = command
        .ext_fields
        .iter()
        .filter(|(key, _)| *key != SIGNATURE && *key != UNIQUE_MSG_QUERY_FLAG)
        .collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    fields
}

/// The bytes that are signed, joined (for tests and tools; signing never builds them).
pub fn signed_content(command: &RemotingCommand) -> Vec<u8> {
    let mut content: Vec<u8> = signed_fields(command)
        .into_iter()
        .flat_map(|(_, value)| value.as_bytes().iter().copied())
        .collect();
    content.extend_from_slice(&command.body);
    for part in &command.body_chain {
        content.extend_from_slice(part);
    }
    content
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::ExtFields;

    fn ext(pairs: &[(&str, &str)]) -> ExtFields {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Captured from the C++ client of PyPI `rocketmq` 0.4.4 (`set_session_credentials("ak1",
    /// "sk1", "ALIYUN")`): its route request as it reached a listener.
    #[test]
    fn matches_a_signature_the_cpp_client_sent() {
        let request = RemotingCommand::request(
            105,
            ext(&[
                ("AccessKey", "ak1"),
                ("OnsChannel", "ALIYUN"),
                ("Signature", "DEr6kxboJKOBYSz/5MPi6m1WhYY="),
                ("topic", "TopicA"),
            ]),
        );
        assert_eq!(signed_content(&request), b"ak1ALIYUNTopicA");
        assert!(verify(&request, "sk1"));
        assert!(!verify(&request, "sk2"));
    }

    #[test]
    fn sign_then_verify_and_any_change_breaks_it() {
        let credentials = Credentials::new("alice", "secret");
        let mut request = RemotingCommand::request(10, ext(&[("topic", "T"), ("queueId", "1")]))
            .with_body(Bytes::from_static(b"hello"));
        credentials.sign(&mut request);
        assert_eq!(request.ext(ACCESS_KEY), Some("alice"));
        assert_eq!(signed_content(&request), b"alice1Thello");
        assert!(verify(&request, "secret"));
        let mut changed = request.clone();
        changed.body = Bytes::from_static(b"hellO");
        assert!(!verify(&changed, "secret"));
        let mut changed = request.clone();
        changed.ext_fields.insert("queueId", "2");
        assert!(!verify(&changed, "secret"));
        // Signing again replaces the signature instead of signing it.
        credentials.sign(&mut request);
        assert!(verify(&request, "secret"));
    }

    #[test]
    fn unsigned_or_garbled_signatures_do_not_verify() {
        let mut request = RemotingCommand::request(10, ext(&[("topic", "T")]));
        assert!(!verify(&request, "secret"));
        for garbled in [
            "",
            "not base64!",
            "AAAA",
            "QUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFBQUFB",
        ] {
            request.ext_fields.insert(SIGNATURE, garbled);
            assert!(!verify(&request, "secret"), "{garbled}");
        }
    }

    #[test]
    fn the_unique_key_query_flag_is_not_signed() {
        let credentials = Credentials::new("ak", "sk");
        let mut request = RemotingCommand::request(12, ext(&[("topic", "T"), ("key", "k")]));
        credentials.sign(&mut request);
        request.ext_fields.insert(UNIQUE_MSG_QUERY_FLAG, "true");
        assert!(verify(&request, "sk"));
    }

    #[test]
    fn debug_hides_the_secret() {
        let mut credentials = Credentials::new("ak", "very-secret");
        credentials.security_token = Some("token-secret".into());
        let shown = format!("{credentials:?}");
        assert!(
            !shown.contains("very-secret") && !shown.contains("token-secret"),
            "{shown}"
        );
    }
}
