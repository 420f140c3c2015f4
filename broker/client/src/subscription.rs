//! Tag subscriptions: `*` or `TagA || TagB`. The broker filters by tag hash; the client
//! re-checks the tag string because different tags can share a hash.

use std::collections::BTreeSet;

use crate::message::now_ms;

pub const SUBSCRIBE_ALL: &str = "*";

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub topic: String,
    expression: String,
    /// Empty means every tag (and untagged messages) match.
    tags: BTreeSet<String>,
    version: i64,
}

impl Subscription {
    pub fn new(topic: impl Into<String>, expression: &str) -> Self {
        let expression = expression.trim();
        let tags: BTreeSet<String> = if expression.is_empty() || expression == SUBSCRIBE_ALL {
            BTreeSet::new()
        } else {
            expression
                .split("||")
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from)
                .collect()
        };
        let expression = if tags.is_empty() {
            SUBSCRIBE_ALL.to_owned()
        } else {
            expression.to_owned()
        };
        Self {
            topic: topic.into(),
            expression,
            tags,
            version: now_ms(),
        }
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    pub fn tags(&self) -> &BTreeSet<String> {
        &self.tags
    }

    /// Changes when the subscription changes, so the broker knows to reload it.
    pub fn version(&self) -> i64 {
        self.version
    }

    /// Java `String.hashCode` of each tag, as heartbeats carry them.
    pub fn tag_codes(&self) -> Vec<i64> {
        self.tags
            .iter()
            .map(|t| quiver_protocol::record::tags_code(t))
            .collect()
    }

    pub fn matches(&self, tags: Option<&str>) -> bool {
        self.tags.is_empty() || tags.is_some_and(|t| self.tags.contains(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_matches_everything() {
        let sub = Subscription::new("t", "*");
        assert!(sub.matches(None));
        assert!(sub.matches(Some("A")));
        assert!(sub.tag_codes().is_empty());
    }

    #[test]
    fn tag_list_matches_only_listed_tags() {
        let sub = Subscription::new("t", "A || B");
        assert!(sub.matches(Some("A")));
        assert!(sub.matches(Some("B")));
        assert!(!sub.matches(Some("C")));
        assert!(!sub.matches(None));
        assert_eq!(sub.tag_codes(), vec![65, 66]);
    }
}
