//! Subscriptions by tag (`*` or `TagA || TagB`) or by SQL92 over the message properties.
//! The broker filters tags by hash and the client re-checks the tag string, because different
//! tags can share a hash; SQL92 is evaluated by the broker, and checked to parse here first.

use std::collections::BTreeSet;

use quiver_protocol::body::SubscriptionData;
use quiver_protocol::sql92::{expression_type, Selector, SelectorError};

use crate::error::ClientError;
use crate::message::now_ms;

pub const SUBSCRIBE_ALL: &str = "*";

/// How a consumer selects the messages of a topic, as Java's `MessageSelector`. A plain string
/// converts to a tag expression.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MessageSelector {
    /// `*` or `TagA || TagB`.
    Tag(String),
    /// A SQL92 condition over the message properties, e.g. `a > 5 AND TAGS = 'TagA'`.
    Sql92(String),
}

impl MessageSelector {
    pub fn by_tag(expression: impl Into<String>) -> MessageSelector {
        MessageSelector::Tag(expression.into())
    }

    pub fn by_sql(expression: impl Into<String>) -> MessageSelector {
        MessageSelector::Sql92(expression.into())
    }
}

impl From<&str> for MessageSelector {
    fn from(expression: &str) -> Self {
        MessageSelector::Tag(expression.to_owned())
    }
}

impl From<String> for MessageSelector {
    fn from(expression: String) -> Self {
        MessageSelector::Tag(expression)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscription {
    pub topic: String,
    expression: String,
    /// Empty means every tag (and untagged messages) match; always empty for SQL92.
    tags: BTreeSet<String>,
    sql92: bool,
    version: i64,
}

impl Subscription {
    /// A tag subscription.
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
            sql92: false,
            version: now_ms(),
        }
    }

    /// A SQL92 subscription; refused here when the expression does not parse.
    pub fn sql92(topic: impl Into<String>, expression: &str) -> Result<Self, SelectorError> {
        Selector::parse(expression)?;
        Ok(Self {
            topic: topic.into(),
            expression: expression.to_owned(),
            tags: BTreeSet::new(),
            sql92: true,
            version: now_ms(),
        })
    }

    /// A subscription of either kind.
    pub fn with_selector(
        topic: impl Into<String>,
        selector: &MessageSelector,
    ) -> Result<Self, ClientError> {
        match selector {
            MessageSelector::Tag(expression) => Ok(Self::new(topic, expression)),
            MessageSelector::Sql92(expression) => {
                Self::sql92(topic, expression).map_err(|error| ClientError::InvalidArgument {
                    what: "subscription",
                    reason: error.to_string(),
                })
            }
        }
    }

    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// `TAG` or `SQL92`, as heartbeats and pulls carry it.
    pub fn expression_type(&self) -> &'static str {
        if self.sql92 {
            expression_type::SQL92
        } else {
            expression_type::TAG
        }
    }

    /// The subscription as heartbeats and running-info answers carry it.
    pub fn to_wire(&self) -> SubscriptionData {
        SubscriptionData {
            topic: self.topic.clone(),
            sub_string: self.expression().to_owned(),
            tags_set: self.tags().iter().cloned().collect(),
            code_set: self.tag_codes().into_iter().map(|c| c as i32).collect(),
            sub_version: self.version(),
            expression_type: Some(self.expression_type().into()),
            ..Default::default()
        }
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

    /// Whether a delivered message with these tags is for this subscription; SQL92 is
    /// decided by the broker alone.
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
        assert_eq!(sub.expression_type(), "TAG");
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

    #[test]
    fn sql92_is_checked_here_and_filtered_by_the_broker() {
        let sub = Subscription::sql92("t", "a > 5 AND TAGS = 'A'").unwrap();
        assert_eq!(sub.expression(), "a > 5 AND TAGS = 'A'");
        assert_eq!(sub.expression_type(), "SQL92");
        assert!(sub.tags().is_empty() && sub.matches(None));
        assert!(Subscription::sql92("t", "a >").is_err());
        let error =
            Subscription::with_selector("t", &MessageSelector::by_sql("a = NULL")).unwrap_err();
        assert!(error.to_string().contains("IS NULL"), "{error}");
        let tag = Subscription::with_selector("t", &"A".into()).unwrap();
        assert_eq!(
            tag,
            Subscription {
                version: tag.version,
                ..Subscription::new("t", "A")
            }
        );
    }
}
