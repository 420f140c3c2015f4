//! Three-valued evaluation with Apache's conversions (`ComparisonExpression.__compare` with
//! string conversion on): a string meeting a number is read as one, a string meeting a
//! boolean is TRUE only if it says `true` (any case).

use std::cmp::Ordering as Order;

use super::{Expr, Literal, Ordering, TextOp};

/// A value during evaluation: a literal of the expression or a property of the message.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Value<'a> {
    Null,
    Bool(bool),
    Long(i64),
    Double(f64),
    Str(&'a str),
}

/// Why a message could not be evaluated; Apache then skips the message, and so does Quiver.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    #[error("property value {value:?} is not a number")]
    NotANumber { value: String },
    #[error("{found} is used where a condition is expected")]
    NotACondition { found: String },
}

type Lookup<'l, 'a> = &'l dyn Fn(&str) -> Option<&'a str>;

/// Evaluates a condition: TRUE, FALSE or NULL.
pub(super) fn condition<'a>(
    expr: &'a Expr,
    property: Lookup<'_, 'a>,
) -> Result<Option<bool>, EvalError> {
    match value(expr, property)? {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(b)),
        other => Err(EvalError::NotACondition {
            found: format!("{other:?}"),
        }),
    }
}

fn literal(literal: &Literal) -> Value<'_> {
    match literal {
        Literal::Null => Value::Null,
        Literal::Bool(b) => Value::Bool(*b),
        Literal::Long(n) => Value::Long(*n),
        Literal::Double(d) => Value::Double(*d),
        Literal::Str(s) => Value::Str(s),
    }
}

fn truth(b: Option<bool>) -> Value<'static> {
    b.map_or(Value::Null, Value::Bool)
}

fn value<'a>(expr: &'a Expr, property: Lookup<'_, 'a>) -> Result<Value<'a>, EvalError> {
    Ok(match expr {
        Expr::Literal(l) => literal(l),
        Expr::Property(name) => property(name).map_or(Value::Null, Value::Str),
        Expr::Negate(inner) => match value(inner, property)? {
            Value::Long(n) => Value::Long(n.wrapping_neg()),
            Value::Double(d) => Value::Double(-d),
            _ => Value::Null,
        },
        Expr::Not(inner) => truth(condition(inner, property)?.map(|b| !b)),
        Expr::BoolCast(inner) => match value(inner, property)? {
            Value::Null => Value::Null,
            Value::Bool(b) => Value::Bool(b),
            _ => Value::Bool(false),
        },
        Expr::And(terms) => truth(all(terms, property)?),
        Expr::Or(terms) => truth(any(terms, property)?),
        Expr::Equal(left, right) => {
            let (l, r) = (value(left, property)?, value(right, property)?);
            match (l, r) {
                (Value::Null, Value::Null) => Value::Bool(true),
                (Value::Null, _) => Value::Null,
                (_, Value::Null) => Value::Bool(false),
                (l, r) => Value::Bool(compare(l, r)? == Order::Equal),
            }
        }
        Expr::Compare(ordering, left, right) => truth(ordered(*ordering, left, right, property)?),
        Expr::In {
            property: name,
            values,
            negated,
        } => match property(name) {
            None => Value::Null,
            Some(found) => Value::Bool(values.iter().any(|v| v == found) != *negated),
        },
        Expr::Text {
            op,
            negated,
            operand,
            search,
        } => Value::Bool(text(*op, *negated, value(operand, property)?, search)),
    })
}

/// AND: the first FALSE decides (later terms are not evaluated); else NULL if any was NULL.
fn all<'a>(terms: &'a [Expr], property: Lookup<'_, 'a>) -> Result<Option<bool>, EvalError> {
    let mut unknown = false;
    for term in terms {
        match condition(term, property)? {
            Some(false) => return Ok(Some(false)),
            None => unknown = true,
            Some(true) => {}
        }
    }
    Ok((!unknown).then_some(true))
}

/// OR: the first TRUE decides; else NULL if any was NULL.
fn any<'a>(terms: &'a [Expr], property: Lookup<'_, 'a>) -> Result<Option<bool>, EvalError> {
    let mut unknown = false;
    for term in terms {
        match condition(term, property)? {
            Some(true) => return Ok(Some(true)),
            None => unknown = true,
            Some(false) => {}
        }
    }
    Ok((!unknown).then_some(false))
}

/// `<`, `<=`, `>`, `>=`: NULL if either side is (the right one is not evaluated when the left
/// is); two strings are both read as numbers.
fn ordered<'a>(
    ordering: Ordering,
    left: &'a Expr,
    right: &'a Expr,
    property: Lookup<'_, 'a>,
) -> Result<Option<bool>, EvalError> {
    let l = value(left, property)?;
    if l == Value::Null {
        return Ok(None);
    }
    let r = value(right, property)?;
    let order = match (l, r) {
        (_, Value::Null) => return Ok(None),
        (Value::Str(a), Value::Str(b)) => java_double_cmp(parse_double(a)?, parse_double(b)?),
        (l, r) => compare(l, r)?,
    };
    Ok(Some(match ordering {
        Ordering::Gt => order == Order::Greater,
        Ordering::Ge => order != Order::Less,
        Ordering::Lt => order == Order::Less,
        Ordering::Le => order != Order::Greater,
    }))
}

/// CONTAINS, STARTSWITH, ENDSWITH: FALSE (never NULL) for a missing or non-string value or an
/// empty search, whether negated or not.
fn text(op: TextOp, negated: bool, operand: Value<'_>, search: &str) -> bool {
    let Value::Str(text) = operand else {
        return false;
    };
    if search.is_empty() {
        return false;
    }
    let found = match op {
        TextOp::Contains => text.contains(search),
        TextOp::StartsWith => text.starts_with(search),
        TextOp::EndsWith => text.ends_with(search),
    };
    found != negated
}

/// Two non-NULL values, converted towards each other as Apache does; mixing a boolean with
/// a number orders as "less" (never equal).
fn compare(l: Value<'_>, r: Value<'_>) -> Result<Order, EvalError> {
    use Value::{Bool, Double, Long, Str};
    Ok(match (l, r) {
        (Long(a), Long(b)) => a.cmp(&b),
        (Double(a), Double(b)) => java_double_cmp(a, b),
        (Long(a), Double(b)) => java_double_cmp(a as f64, b),
        (Double(a), Long(b)) => java_double_cmp(a, b as f64),
        (Str(a), Str(b)) => a.cmp(b),
        (Bool(a), Bool(b)) => a.cmp(&b),
        (Long(a), Str(s)) => a.cmp(&parse_long(s)?),
        (Str(s), Long(b)) => parse_long(s)?.cmp(&b),
        (Double(a), Str(s)) => java_double_cmp(a, parse_double(s)?),
        (Str(s), Double(b)) => java_double_cmp(parse_double(s)?, b),
        (Bool(a), Str(s)) => a.cmp(&s.eq_ignore_ascii_case("true")),
        (Str(s), Bool(b)) => s.eq_ignore_ascii_case("true").cmp(&b),
        _ => Order::Less,
    })
}

/// Java's `Double.compareTo`: -0.0 below 0.0, NaN equal to itself and above everything.
fn java_double_cmp(a: f64, b: f64) -> Order {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Order::Equal,
        (true, false) => Order::Greater,
        (false, true) => Order::Less,
        (false, false) => a.total_cmp(&b),
    }
}

/// Java's `Long.valueOf`: an optional sign and ASCII digits, nothing else.
fn parse_long(text: &str) -> Result<i64, EvalError> {
    text.parse().map_err(|_| EvalError::NotANumber {
        value: text.to_owned(),
    })
}

/// Java's `Double.valueOf` for decimal text: blanks around it ignored, `NaN`, `Infinity`,
/// and a trailing `d` or `f` allowed.
fn parse_double(text: &str) -> Result<f64, EvalError> {
    let not_a_number = || EvalError::NotANumber {
        value: text.to_owned(),
    };
    let trimmed = text.trim_matches(|c: char| c <= ' ');
    let (negative, unsigned) = match trimmed.as_bytes().first() {
        Some(b'-') => (true, &trimmed[1..]),
        Some(b'+') => (false, &trimmed[1..]),
        _ => (false, trimmed),
    };
    let magnitude = match unsigned {
        "NaN" => f64::NAN,
        "Infinity" => f64::INFINITY,
        _ => {
            let digits = unsigned
                .strip_suffix(['d', 'D', 'f', 'F'])
                .unwrap_or(unsigned);
            let decimal = digits.bytes().any(|b| b.is_ascii_digit())
                && !digits.starts_with(['+', '-'])
                && digits
                    .bytes()
                    .all(|b| b.is_ascii_digit() || matches!(b, b'.' | b'e' | b'E' | b'+' | b'-'));
            if !decimal {
                return Err(not_a_number());
            }
            digits.parse::<f64>().map_err(|_| not_a_number())?
        }
    };
    Ok(if negative { -magnitude } else { magnitude })
}

/// Whether BETWEEN's literal bounds are the wrong way round (numbers only; other literals are
/// refused by the comparison itself).
pub(super) fn literal_greater(low: &Literal, high: &Literal) -> bool {
    let number = |l: &Literal| match l {
        Literal::Long(n) => Some(Value::Long(*n)),
        Literal::Double(d) => Some(Value::Double(*d)),
        _ => None,
    };
    match (number(low), number(high)) {
        (Some(l), Some(h)) => compare(l, h).is_ok_and(|order| order == Order::Greater),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_read_as_java_does() {
        assert_eq!(parse_double(" 2.5 ").unwrap(), 2.5);
        assert_eq!(parse_double("-1e3").unwrap(), -1000.0);
        assert_eq!(parse_double("7d").unwrap(), 7.0);
        assert!(parse_double("NaN").unwrap().is_nan());
        assert_eq!(parse_double("-Infinity").unwrap(), f64::NEG_INFINITY);
        for bad in ["", "abc", "inf", "nan", "1.2.3", "--1", "e5", "0x10"] {
            assert!(parse_double(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_long("+5").unwrap(), 5);
        assert!(parse_long(" 5").is_err());
        assert!(parse_long("5.0").is_err());
    }

    #[test]
    fn java_double_order() {
        assert_eq!(java_double_cmp(-0.0, 0.0), Order::Less);
        assert_eq!(java_double_cmp(f64::NAN, f64::INFINITY), Order::Greater);
        assert_eq!(java_double_cmp(-f64::NAN, f64::NAN), Order::Equal);
    }
}
