//! RocketMQ's SQL92 message selector (expression type `SQL92`): parsed once per subscription,
//! evaluated per message over its user properties (`TAGS` is one of them).
//!
//! The language is Apache's `SelectorParser.jj`, loosest binding first:
//!
//! ```text
//! selector   := or
//! or         := and ( OR and )*
//! and        := equality ( AND equality )*
//! equality   := comparison ( '=' comparison | '<>' comparison | IS [NOT] NULL )*
//! comparison := unary ( ('>' | '>=' | '<' | '<=') unary
//!                     | [NOT] BETWEEN unary AND unary
//!                     | [NOT] IN '(' string ( ',' string )* ')'
//!                     | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string )*
//! unary      := '+' unary | '-' unary | NOT unary | primary
//! primary    := string | integer | float | TRUE | FALSE | NULL | property | '(' or ')'
//! ```
//!
//! Keywords are case-insensitive, property names are not. As in Apache, `NOT` binds tighter
//! than comparisons (`NOT a > 5` is refused: write `NOT (a > 5)`), and the parser refuses
//! what can never be evaluated: `>` on strings or booleans, `= NULL`, `IN` on a non-property,
//! `BETWEEN` with its bounds the wrong way round.
//!
//! Evaluation is three-valued: a missing property is NULL, a comparison with NULL is NULL,
//! `AND`/`OR` follow SQL's truth tables, and only TRUE matches. A property (always a string)
//! compared with a number is read as a number; one that is not a number fails the whole
//! evaluation, and the message does not match, as in Apache. Where Quiver differs: integers
//! are 64-bit throughout (Apache reads a property compared with a literal within the int
//! range as an int, so a value beyond it fails), `0.0` is a valid literal (Apache refuses
//! float literals below `Double.MIN_VALUE`), and `TRUE = a` means `a = TRUE`.

mod eval;
mod lexer;
mod parser;

pub use eval::EvalError;

/// The expression types a subscription names (`expressionType`).
pub mod expression_type {
    /// `*` or `TagA || TagB`: filtered by the tag hash code in the ConsumeQueue.
    pub const TAG: &str = "TAG";
    /// A [`super::Selector`] over the message properties.
    pub const SQL92: &str = "SQL92";

    /// Apache's `ExpressionType.isTagType`: absent and empty mean TAG.
    pub fn is_tag(kind: Option<&str>) -> bool {
        kind.is_none_or(|kind| kind.is_empty() || kind == TAG)
    }

    /// Whether `kind` names SQL92 (the case of the letters aside).
    pub fn is_sql92(kind: Option<&str>) -> bool {
        kind.is_some_and(|kind| kind.eq_ignore_ascii_case(SQL92))
    }
}

/// Deepest expression tree accepted, so evaluating and dropping one never exhausts a stack.
pub const MAX_DEPTH: usize = 128;

/// Why an expression was refused, with the 1-based character column it was noticed at.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid SQL92 expression at column {column}: {message}")]
pub struct SelectorError {
    pub column: usize,
    pub message: String,
}

impl SelectorError {
    fn new(column: usize, message: impl Into<String>) -> SelectorError {
        SelectorError {
            column,
            message: message.into(),
        }
    }
}

/// A literal of the expression.
#[derive(Clone, Debug, PartialEq)]
enum Literal {
    Null,
    Bool(bool),
    Long(i64),
    Double(f64),
    Str(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ordering {
    Gt,
    Ge,
    Lt,
    Le,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TextOp {
    Contains,
    StartsWith,
    EndsWith,
}

/// A parsed expression. `AND` and `OR` chains are flat: evaluated left to right, the first
/// FALSE (TRUE) decides, as Apache's left-nested binary nodes do.
#[derive(Clone, Debug, PartialEq)]
enum Expr {
    Literal(Literal),
    Property(String),
    Negate(Box<Expr>),
    Not(Box<Expr>),
    /// A bare property used as a condition: TRUE only if it is a boolean TRUE (never, for
    /// string properties), NULL when missing.
    BoolCast(Box<Expr>),
    And(Vec<Expr>),
    Or(Vec<Expr>),
    /// `=` and `IS NULL` (against the NULL literal).
    Equal(Box<Expr>, Box<Expr>),
    Compare(Ordering, Box<Expr>, Box<Expr>),
    In {
        property: String,
        values: Vec<String>,
        negated: bool,
    },
    Text {
        op: TextOp,
        negated: bool,
        operand: Box<Expr>,
        search: String,
    },
}

/// A compiled SQL92 selector.
#[derive(Clone, Debug, PartialEq)]
pub struct Selector {
    expression: String,
    root: Expr,
}

impl Selector {
    /// Parses `expression`; never panics, whatever the text.
    pub fn parse(expression: &str) -> Result<Selector, SelectorError> {
        Ok(Selector {
            expression: expression.to_owned(),
            root: parser::parse(expression)?,
        })
    }

    /// The text it was parsed from.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// TRUE, FALSE or NULL (None) for one message; an error when a value cannot be compared.
    pub fn evaluate<'a>(
        &'a self,
        property: &dyn Fn(&str) -> Option<&'a str>,
    ) -> Result<Option<bool>, EvalError> {
        eval::condition(&self.root, property)
    }

    /// Whether a message with these properties is delivered: only when the expression is TRUE.
    pub fn matches<'a>(&'a self, property: &dyn Fn(&str) -> Option<&'a str>) -> bool {
        matches!(self.evaluate(property), Ok(Some(true)))
    }

    /// [`Selector::matches`] over properties in RocketMQ's `k\u{1}v\u{2}` form.
    pub fn matches_properties(&self, properties: &str) -> bool {
        self.matches(&|name| crate::record::property(properties, name))
    }
}

#[cfg(test)]
mod tests;
