//! Property tests of the SQL92 selector: on generated expressions and messages it agrees with
//! a straightforward reference evaluation, and no text makes the parser or evaluator panic.

use proptest::prelude::*;
use quiver_protocol::sql92::Selector;

const NAMES: [&str; 4] = ["a", "b", "TAGS", "color"];
const VALUES: [&str; 12] = [
    "0", "3", "5", "7", "12", "-3", "2.5", "07", "abc", "", "TagA", "true",
];
const WORDS: [&str; 5] = ["abc", "TagA", "", "it's", "7"];

#[derive(Clone, Debug)]
enum Literal {
    Long(i64),
    Double(f64),
    Str(&'static str),
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

/// A generated condition, kept to what the grammar accepts.
#[derive(Clone, Debug)]
enum Cond {
    Compare(&'static str, Op, Literal),
    Between(&'static str, i64, i64, bool),
    In(&'static str, Vec<&'static str>, bool),
    IsNull(&'static str, bool),
    Const(bool),
    Not(Box<Cond>),
    And(Box<Cond>, Box<Cond>),
    Or(Box<Cond>, Box<Cond>),
}

/// The reference's outcome: SQL's three values, or "this message cannot be evaluated".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Truth {
    True,
    False,
    Unknown,
    Error,
}

fn known(b: bool) -> Truth {
    if b {
        Truth::True
    } else {
        Truth::False
    }
}

fn order(op: Op, ord: std::cmp::Ordering) -> bool {
    use std::cmp::Ordering::*;
    match op {
        Op::Eq => ord == Equal,
        Op::Ne => ord != Equal,
        Op::Gt => ord == Greater,
        Op::Ge => ord != Less,
        Op::Lt => ord == Less,
        Op::Le => ord != Greater,
    }
}

fn reference(cond: &Cond, message: &[(&str, &str)]) -> Truth {
    let get = |name: &str| message.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
    match cond {
        Cond::Const(b) => known(*b),
        Cond::IsNull(name, negated) => known(get(name).is_none() != *negated),
        Cond::In(name, list, negated) => match get(name) {
            None => Truth::Unknown,
            Some(v) => known(list.contains(&v) != *negated),
        },
        Cond::Compare(name, op, literal) => {
            let Some(v) = get(name) else {
                return Truth::Unknown;
            };
            let ord = match literal {
                Literal::Str(s) => v.cmp(*s),
                Literal::Long(n) => match v.parse::<i64>() {
                    Ok(x) => x.cmp(n),
                    Err(_) => return Truth::Error,
                },
                Literal::Double(d) => match v.parse::<f64>() {
                    Ok(x) => x.partial_cmp(d).expect("no NaN here"),
                    Err(_) => return Truth::Error,
                },
            };
            known(order(*op, ord))
        }
        Cond::Between(name, low, high, negated) => match get(name).map(str::parse::<i64>) {
            None => Truth::Unknown,
            Some(Err(_)) => Truth::Error,
            Some(Ok(x)) => known((*low <= x && x <= *high) != *negated),
        },
        Cond::Not(inner) => match reference(inner, message) {
            Truth::True => Truth::False,
            Truth::False => Truth::True,
            other => other,
        },
        Cond::And(l, r) => junction(reference(l, message), || reference(r, message), false),
        Cond::Or(l, r) => junction(reference(l, message), || reference(r, message), true),
    }
}

/// AND (`decisive` FALSE) or OR (`decisive` TRUE), left to right: an error stops it, the
/// decisive value decides without the right side.
fn junction(left: Truth, right: impl FnOnce() -> Truth, decisive: bool) -> Truth {
    let decides = known(decisive);
    if left == Truth::Error || left == decides {
        return left;
    }
    let right = right();
    if right == Truth::Error || right == decides {
        return right;
    }
    if left == Truth::Unknown || right == Truth::Unknown {
        Truth::Unknown
    } else {
        known(!decisive)
    }
}

/// Keywords in a case picked by `upper`.
fn kw(word: &str, upper: bool) -> String {
    if upper {
        word.to_uppercase()
    } else {
        word.to_lowercase()
    }
}

fn render(cond: &Cond, upper: bool) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "''"));
    match cond {
        Cond::Const(b) => kw(if *b { "true" } else { "false" }, upper),
        Cond::IsNull(name, negated) => {
            let not = if *negated { " NOT" } else { "" };
            format!("{name} {}", kw(&format!("IS{not} NULL"), upper))
        }
        Cond::In(name, list, negated) => {
            let items: Vec<String> = list.iter().map(|s| quote(s)).collect();
            let not = if *negated { "NOT " } else { "" };
            format!(
                "{name} {}({})",
                kw(&format!("{not}IN "), upper),
                items.join(", ")
            )
        }
        Cond::Compare(name, op, literal) => {
            let op = match op {
                Op::Eq => "=",
                Op::Ne => "<>",
                Op::Gt => ">",
                Op::Ge => ">=",
                Op::Lt => "<",
                Op::Le => "<=",
            };
            let literal = match literal {
                Literal::Long(n) if *n < 0 => format!("-{}", n.unsigned_abs()),
                Literal::Long(n) => n.to_string(),
                Literal::Double(d) => format!("{d:?}"),
                Literal::Str(s) => quote(s),
            };
            format!("{name} {op} {literal}")
        }
        Cond::Between(name, low, high, negated) => {
            let not = if *negated { "NOT " } else { "" };
            format!(
                "{name} {} {low} {} {high}",
                kw(&format!("{not}BETWEEN"), upper),
                kw("AND", upper)
            )
        }
        Cond::Not(inner) => format!("{} ({})", kw("NOT", upper), render(inner, upper)),
        // AND binds tighter than OR: only an OR inside an AND needs parentheses.
        Cond::And(l, r) => {
            let side = |c: &Cond| match c {
                Cond::Or(..) => format!("({})", render(c, upper)),
                _ => render(c, upper),
            };
            format!("{} {} {}", side(l), kw("AND", upper), side(r))
        }
        Cond::Or(l, r) => format!(
            "{} {} {}",
            render(l, upper),
            kw("OR", upper),
            render(r, upper)
        ),
    }
}

fn name() -> impl Strategy<Value = &'static str> {
    prop::sample::select(NAMES.to_vec())
}

fn leaf() -> impl Strategy<Value = Cond> {
    let number = prop_oneof![
        (-4i64..14).prop_map(Literal::Long),
        prop::sample::select(vec![2.5, 0.5, 7.0, -3.0]).prop_map(Literal::Double),
    ];
    let ordering = prop::sample::select(vec![Op::Gt, Op::Ge, Op::Lt, Op::Le, Op::Eq, Op::Ne]);
    let equality = prop::sample::select(vec![Op::Eq, Op::Ne]);
    let word = prop::sample::select(WORDS.to_vec());
    prop_oneof![
        (name(), ordering, number).prop_map(|(n, op, l)| Cond::Compare(n, op, l)),
        (name(), equality, word).prop_map(|(n, op, w)| Cond::Compare(n, op, Literal::Str(w))),
        (name(), -4i64..14, 0i64..8, any::<bool>()).prop_map(|(n, low, span, not)| Cond::Between(
            n,
            low,
            low + span,
            not
        )),
        (
            name(),
            prop::collection::vec(word_or_value(), 1..4),
            any::<bool>()
        )
            .prop_map(|(n, list, not)| Cond::In(n, list, not)),
        (name(), any::<bool>()).prop_map(|(n, not)| Cond::IsNull(n, not)),
        any::<bool>().prop_map(Cond::Const),
    ]
}

fn word_or_value() -> impl Strategy<Value = &'static str> {
    prop::sample::select([WORDS.as_slice(), VALUES.as_slice()].concat())
}

fn condition() -> impl Strategy<Value = Cond> {
    leaf().prop_recursive(5, 40, 2, |inner| {
        prop_oneof![
            inner.clone().prop_map(|c| Cond::Not(Box::new(c))),
            (inner.clone(), inner.clone()).prop_map(|(l, r)| Cond::And(Box::new(l), Box::new(r))),
            (inner.clone(), inner).prop_map(|(l, r)| Cond::Or(Box::new(l), Box::new(r))),
        ]
    })
}

fn message() -> impl Strategy<Value = Vec<(&'static str, &'static str)>> {
    prop::collection::vec(
        (
            name(),
            prop::option::of(prop::sample::select(VALUES.to_vec())),
        ),
        0..5,
    )
    .prop_map(|pairs| {
        let mut message: Vec<(&str, &str)> = Vec::new();
        for (name, value) in pairs {
            if let Some(value) = value {
                if !message.iter().any(|(k, _)| *k == name) {
                    message.push((name, value));
                }
            }
        }
        message
    })
}

/// Text made of the language's own pieces (and a few foreign ones), in any order.
fn token_soup() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec![
            "a",
            "TAGS",
            "AND",
            "or",
            "NOT",
            "IN",
            "BETWEEN",
            "IS",
            "NULL",
            "TRUE",
            "false",
            "CONTAINS",
            "(",
            ")",
            ",",
            "=",
            "<>",
            ">",
            ">=",
            "<",
            "<=",
            "+",
            "-",
            "5",
            "2.5",
            "1e3",
            ".",
            "'x'",
            "'",
            "''",
            "--",
            "/*",
            "*/",
            "\n",
            "é",
            "0",
            "07",
            "9999999999999999999",
        ]),
        0..24,
    )
    .prop_map(|parts| parts.join(" "))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn agrees_with_the_reference(cond in condition(), upper in any::<bool>(), message in message()) {
        let text = render(&cond, upper);
        let selector = Selector::parse(&text).map_err(|e| TestCaseError::fail(format!("{text}: {e}")))?;
        let lookup = |name: &str| message.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
        let got = match selector.evaluate(&lookup) {
            Ok(Some(true)) => Truth::True,
            Ok(Some(false)) => Truth::False,
            Ok(None) => Truth::Unknown,
            Err(_) => Truth::Error,
        };
        let expected = reference(&cond, &message);
        prop_assert_eq!(got, expected, "{} over {:?}", text, message);
        prop_assert_eq!(selector.matches(&lookup), expected == Truth::True);
    }

    #[test]
    fn arbitrary_text_never_panics(text in ".{0,80}", message in message()) {
        if let Ok(selector) = Selector::parse(&text) {
            let lookup = |name: &str| message.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
            let _ = selector.evaluate(&lookup);
        }
    }

    #[test]
    fn token_soup_never_panics(text in token_soup(), message in message()) {
        match Selector::parse(&text) {
            Ok(selector) => {
                let lookup = |name: &str| message.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
                let _ = selector.evaluate(&lookup);
            }
            Err(error) => {
                prop_assert!(error.column >= 1 && error.column <= text.chars().count() + 1);
            }
        }
    }
}
