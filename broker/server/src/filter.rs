//! Consumer filters: what a subscription lets through on pull. TAG expressions are matched by
//! the ConsumeQueue unit's tags code, without reading the CommitLog; SQL92 expressions
//! against each record's properties.

use std::sync::Arc;

use quiver_protocol::record::{properties_of, property, tags_code};
use quiver_protocol::sql92::{expression_type, Selector, SelectorError};

/// A compiled subscription expression.
#[derive(Debug, Clone, PartialEq)]
pub enum ConsumerFilter {
    /// `*` or empty: every message.
    All,
    /// `TagA || TagB`: the Java hash codes of the tags.
    Tags(Vec<i64>),
    /// A SQL92 selector over the message properties (`TAGS` among them).
    Sql92(Selector),
}

/// Why a subscription cannot be served; never served as something else.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FilterError {
    #[error("the SQL92 expression {expression:?} is invalid")]
    Parse {
        expression: String,
        #[source]
        source: SelectorError,
    },
    #[error(
        "the broker does not support consumer to filter message by {kind}: subscribe by TAG \
         or SQL92"
    )]
    Unsupported { kind: String },
}

/// A subscription's filter as compiled when it was registered or pulled with.
pub type CompiledFilter = Result<Arc<ConsumerFilter>, FilterError>;

impl ConsumerFilter {
    /// Compiles an expression of `kind` (`expressionType`: absent or TAG, or SQL92).
    pub fn compile(kind: Option<&str>, expression: &str) -> Result<ConsumerFilter, FilterError> {
        if expression_type::is_tag(kind) {
            return Ok(ConsumerFilter::tags(expression));
        }
        if !expression_type::is_sql92(kind) {
            return Err(FilterError::Unsupported {
                kind: kind.unwrap_or_default().to_owned(),
            });
        }
        Selector::parse(expression)
            .map(ConsumerFilter::Sql92)
            .map_err(|source| FilterError::Parse {
                expression: expression.to_owned(),
                source,
            })
    }

    /// RocketMQ's TAG expression: `*`, empty, or `a || b`.
    fn tags(expression: &str) -> ConsumerFilter {
        let expression = expression.trim();
        if expression.is_empty() || expression == "*" {
            return ConsumerFilter::All;
        }
        let codes: Vec<i64> = expression
            .split("||")
            .map(str::trim)
            .filter(|tag| !tag.is_empty())
            .map(tags_code)
            .collect();
        if codes.is_empty() {
            ConsumerFilter::All
        } else {
            ConsumerFilter::Tags(codes)
        }
    }

    /// The first test, on the ConsumeQueue unit's tags code.
    pub fn accepts_tags_code(&self, code: i64) -> bool {
        match self {
            ConsumerFilter::All | ConsumerFilter::Sql92(_) => true,
            ConsumerFilter::Tags(codes) => codes.contains(&code),
        }
    }

    /// The selector, when records must be read to be filtered.
    pub fn selector(&self) -> Option<&Selector> {
        match self {
            ConsumerFilter::Sql92(selector) => Some(selector),
            _ => None,
        }
    }
}

/// Whether a stored record's properties satisfy `selector`; a record whose properties cannot
/// be read is not delivered through a property filter.
pub fn record_matches(selector: &Selector, record: &[u8]) -> bool {
    properties_of(record)
        .is_some_and(|properties| selector.matches(&|name| property(properties, name)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_expressions() {
        assert_eq!(
            ConsumerFilter::compile(None, "*").unwrap(),
            ConsumerFilter::All
        );
        assert_eq!(
            ConsumerFilter::compile(Some("TAG"), "").unwrap(),
            ConsumerFilter::All
        );
        let filter = ConsumerFilter::compile(Some(""), "a || b").unwrap();
        assert!(filter.accepts_tags_code(tags_code("a")));
        assert!(filter.accepts_tags_code(tags_code("b")));
        assert!(!filter.accepts_tags_code(tags_code("c")));
        assert!(filter.selector().is_none());
    }

    #[test]
    fn sql92_expressions_compile_or_say_why_not() {
        let filter = ConsumerFilter::compile(Some("SQL92"), "a > 5").unwrap();
        assert!(filter.accepts_tags_code(0));
        assert!(filter.selector().is_some());
        let error = ConsumerFilter::compile(Some("SQL92"), "a >").unwrap_err();
        let remark = crate::error::chain(&error);
        assert!(
            remark.contains("\"a >\"") && remark.contains("column"),
            "{remark}"
        );
        let error = ConsumerFilter::compile(Some("XPATH"), "//a").unwrap_err();
        assert!(error.to_string().contains("XPATH"));
    }
}
