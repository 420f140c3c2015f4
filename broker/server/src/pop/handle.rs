//! Receipt handles: which queue, offset and revision a received message is, as printable
//! ASCII. `1<kind><queue>.<offset>.<revision>`, kind `n` for the subscribed topic's queues and
//! `r` for the group's retry topic; the group and topic come with every call.

use quiver_store::PopKey;

/// A parsed receipt handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub retry: bool,
    pub queue_id: u32,
    pub offset: u64,
    pub revision: u64,
}

impl Handle {
    pub fn encode(&self) -> String {
        let kind = if self.retry { 'r' } else { 'n' };
        format!("1{kind}{}.{}.{}", self.queue_id, self.offset, self.revision)
    }

    /// None for anything this broker did not issue.
    pub fn parse(text: &str) -> Option<Handle> {
        let rest = text.strip_prefix('1')?;
        let retry = match rest.as_bytes().first()? {
            b'n' => false,
            b'r' => true,
            _ => return None,
        };
        let mut parts = rest[1..].split('.');
        let queue_id = parts.next()?.parse().ok()?;
        let offset = parts.next()?.parse().ok()?;
        let revision = parts.next()?.parse().ok()?;
        if parts.next().is_some() {
            return None;
        }
        Some(Handle {
            retry,
            queue_id,
            offset,
            revision,
        })
    }

    /// The POP state key the handle names for `group` subscribed to `topic`.
    pub fn key(&self, group: &str, topic: &str) -> PopKey {
        if self.retry {
            PopKey::new(group, &super::retry_topic(group, topic), self.queue_id)
        } else {
            PopKey::new(group, topic, self.queue_id)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_refuse_what_was_not_issued() {
        let handle = Handle {
            retry: true,
            queue_id: 3,
            offset: 1234,
            revision: 77,
        };
        let text = handle.encode();
        assert!(text.bytes().all(|b| b.is_ascii_graphic()), "{text}");
        assert_eq!(Handle::parse(&text), Some(handle));
        for bad in [
            "",
            "1",
            "2n1.2.3",
            "1x1.2.3",
            "1n1.2",
            "1n1.2.3.4",
            "1n-1.2.3",
            "1na.2.3",
        ] {
            assert_eq!(Handle::parse(bad), None, "{bad}");
        }
        assert_eq!(handle.key("g", "t").topic, "%RETRY%g_t");
    }
}
