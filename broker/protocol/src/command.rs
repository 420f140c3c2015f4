//! The remoting command: one request or response, header plus opaque body.

use bytes::Bytes;

pub use crate::ext_fields::ExtFields;

/// Flag bit 0: the command is a response.
pub const FLAG_RESPONSE: i32 = 1;
/// Flag bit 1: the request expects no response.
pub const FLAG_ONEWAY: i32 = 1 << 1;
/// Language tag we send.
pub const LANGUAGE_RUST: &str = "RUST";
/// What Apache brokers answer with, whatever the client's language: some clients check it.
pub const LANGUAGE_JAVA: &str = "JAVA";
/// Protocol version we report: Java's `MQVersion.Version.V4_9_4.ordinal()`.
pub const PROTOCOL_VERSION: i32 = 401;

/// How the header of a frame is serialized: the top byte of the header-length word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SerializeType {
    /// 0: a JSON object with code, language, version, opaque, flag, remark, extFields.
    #[default]
    Json,
    /// 1: RocketMQ's compact binary header (`RocketMQSerializable`).
    RocketMq,
}

impl SerializeType {
    /// The wire value in the top byte of the header-length word.
    pub fn wire_value(self) -> u8 {
        match self {
            SerializeType::Json => 0,
            SerializeType::RocketMq => 1,
        }
    }

    /// The serialize type for a wire value, if known.
    pub fn from_wire(value: u8) -> Option<Self> {
        match value {
            0 => Some(SerializeType::Json),
            1 => Some(SerializeType::RocketMq),
            _ => None,
        }
    }
}

/// Java's `LanguageCode` ordinals, used by the binary header (a u8) and sometimes in JSON.
const LANGUAGES: [&str; 13] = [
    "JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP",
    "OMS", "RUST",
];

/// The `LanguageCode` name for a wire ordinal; unknown ordinals read as "OTHER".
pub fn language_name(code: u8) -> &'static str {
    LANGUAGES.get(usize::from(code)).copied().unwrap_or("OTHER")
}

/// The wire ordinal of a `LanguageCode` name; unknown names map to OTHER (7).
pub fn language_code(name: &str) -> u8 {
    LANGUAGES
        .iter()
        .position(|known| known.eq_ignore_ascii_case(name))
        .and_then(|index| u8::try_from(index).ok())
        .unwrap_or(7)
}

/// One remoting command (request or response) as RocketMQ 4.x peers exchange it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemotingCommand {
    /// Request code for requests, response code for responses.
    pub code: i32,
    /// Sender's language tag ("JAVA", "CPP", ...): the Rust client sends "RUST"; the broker
    /// answers "JAVA", as Apache brokers do.
    pub language: String,
    pub version: i32,
    /// Correlates a response with its request; the caller assigns it for requests.
    pub opaque: i32,
    /// Bit 0 response, bit 1 oneway.
    pub flag: i32,
    pub remark: Option<String>,
    /// Custom header fields; values normalised to strings whatever JSON type the peer used.
    pub ext_fields: ExtFields,
    pub body: Bytes,
    /// More body bytes after `body`, sent as they are instead of joined first (a pull answer
    /// carries the stored records here, views of the mapped CommitLog). Decoding never fills it.
    pub body_chain: Vec<Bytes>,
    pub serialize_type: SerializeType,
}

impl RemotingCommand {
    /// A two-way request with the given code and header fields; the opaque is left at 0.
    pub fn request(code: i32, ext_fields: ExtFields) -> Self {
        RemotingCommand {
            code,
            language: LANGUAGE_RUST.to_owned(),
            version: PROTOCOL_VERSION,
            opaque: 0,
            flag: 0,
            remark: None,
            ext_fields,
            body: Bytes::new(),
            body_chain: Vec::new(),
            serialize_type: SerializeType::Json,
        }
    }

    /// A response to this request: echoes its opaque and serialize type, sets the response flag.
    pub fn response_to(&self, code: i32, remark: Option<String>) -> Self {
        RemotingCommand {
            code,
            language: LANGUAGE_RUST.to_owned(),
            version: PROTOCOL_VERSION,
            opaque: self.opaque,
            flag: FLAG_RESPONSE,
            remark,
            ext_fields: ExtFields::default(),
            body: Bytes::new(),
            body_chain: Vec::new(),
            serialize_type: self.serialize_type,
        }
    }

    pub fn is_response(&self) -> bool {
        self.flag & FLAG_RESPONSE != 0
    }

    pub fn is_oneway(&self) -> bool {
        self.flag & FLAG_ONEWAY != 0
    }

    /// Marks the request oneway: the peer sends no response.
    pub fn into_oneway(mut self) -> Self {
        self.flag |= FLAG_ONEWAY;
        self
    }

    pub fn with_body(mut self, body: Bytes) -> Self {
        self.body = body;
        self
    }

    /// Bytes of the body on the wire: `body` then every part of `body_chain`.
    pub fn body_len(&self) -> usize {
        self.body.len() + self.body_chain.iter().map(Bytes::len).sum::<usize>()
    }

    pub fn with_opaque(mut self, opaque: i32) -> Self {
        self.opaque = opaque;
        self
    }

    pub fn with_ext_fields(mut self, ext_fields: ExtFields) -> Self {
        self.ext_fields = ext_fields;
        self
    }

    pub fn with_remark(mut self, remark: impl Into<String>) -> Self {
        self.remark = Some(remark.into());
        self
    }

    pub fn with_serialize_type(mut self, serialize_type: SerializeType) -> Self {
        self.serialize_type = serialize_type;
        self
    }

    /// One extFields value, if present.
    pub fn ext(&self, key: &str) -> Option<&str> {
        self.ext_fields.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn response_echoes_opaque_and_serialize_type() {
        let request = RemotingCommand::request(10, ExtFields::default())
            .with_opaque(77)
            .with_serialize_type(SerializeType::RocketMq);
        let response = request.response_to(0, Some("ok".into()));
        assert_eq!(response.opaque, 77);
        assert_eq!(response.serialize_type, SerializeType::RocketMq);
        assert!(response.is_response());
        assert!(!response.is_oneway());
        assert!(!request.is_response());
    }

    #[test]
    fn oneway_flag_is_bit_one() {
        let request = RemotingCommand::request(15, ExtFields::default()).into_oneway();
        assert_eq!(request.flag, 2);
        assert!(request.is_oneway());
    }

    #[test]
    fn language_codes_map_both_ways() {
        assert_eq!(language_name(0), "JAVA");
        assert_eq!(language_name(1), "CPP");
        assert_eq!(language_name(12), "RUST");
        assert_eq!(language_name(200), "OTHER");
        assert_eq!(language_code("RUST"), 12);
        assert_eq!(language_code("cpp"), 1);
        assert_eq!(language_code("COBOL"), 7);
    }
}
