//! Typed access to a request's extFields.

use std::str::FromStr;

use quiver_protocol::{HeaderError, RemotingCommand};

/// Reads header fields by name with the parse errors RocketMQ clients expect.
pub struct Fields<'a>(pub &'a RemotingCommand);

impl<'a> Fields<'a> {
    pub fn str(&self, field: &'static str) -> Result<&'a str, HeaderError> {
        self.0.ext(field).ok_or(HeaderError::Missing { field })
    }

    pub fn opt_str(&self, field: &'static str) -> Option<&'a str> {
        self.0.ext(field).filter(|value| !value.is_empty())
    }

    pub fn parse<T: FromStr>(&self, field: &'static str) -> Result<T, HeaderError> {
        let value = self.str(field)?;
        value.trim().parse().map_err(|_| HeaderError::Invalid {
            field,
            value: value.to_string(),
        })
    }

    pub fn opt_parse<T: FromStr>(&self, field: &'static str) -> Result<Option<T>, HeaderError> {
        match self.0.ext(field) {
            None => Ok(None),
            Some(value) if value.is_empty() || value == "null" => Ok(None),
            Some(value) => value
                .trim()
                .parse()
                .map(Some)
                .map_err(|_| HeaderError::Invalid {
                    field,
                    value: value.to_string(),
                }),
        }
    }

    /// A queue id: a non-negative i32.
    pub fn queue_id(&self, field: &'static str) -> Result<u32, HeaderError> {
        let raw: i32 = self.parse(field)?;
        u32::try_from(raw).map_err(|_| HeaderError::Invalid {
            field,
            value: raw.to_string(),
        })
    }

    /// A queue offset: a non-negative i64.
    pub fn offset(&self, field: &'static str) -> Result<quiver_store::QueueOffset, HeaderError> {
        let raw: i64 = self.parse(field)?;
        u64::try_from(raw)
            .map(quiver_store::QueueOffset)
            .map_err(|_| HeaderError::Invalid {
                field,
                value: raw.to_string(),
            })
    }

    pub fn bool(&self, field: &'static str) -> bool {
        self.0
            .ext(field)
            .is_some_and(|value| value.eq_ignore_ascii_case("true"))
    }
}
