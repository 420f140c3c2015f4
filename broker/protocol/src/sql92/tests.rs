use super::*;

fn props<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<&'a str> + 'a {
    move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

/// TRUE, FALSE, NULL or an evaluation error ("error") of `expression` over `pairs`.
fn eval(expression: &str, pairs: &[(&str, &str)]) -> &'static str {
    let selector = Selector::parse(expression).unwrap_or_else(|e| panic!("{expression}: {e}"));
    let lookup = props(pairs);
    match selector.evaluate(&lookup) {
        Ok(Some(true)) => "TRUE",
        Ok(Some(false)) => "FALSE",
        Ok(None) => "NULL",
        Err(_) => "error",
    }
}

fn refused(expression: &str) -> SelectorError {
    match Selector::parse(expression) {
        Ok(selector) => panic!("{expression} was accepted: {selector:?}"),
        Err(error) => error,
    }
}

#[test]
fn numeric_comparisons_read_properties_as_numbers() {
    for (a, expected) in [
        ("6", "TRUE"),
        ("5", "FALSE"),
        ("-7", "FALSE"),
        ("10", "TRUE"),
    ] {
        assert_eq!(eval("a > 5", &[("a", a)]), expected, "a = {a}");
    }
    assert_eq!(eval("a >= 5 AND a <= 5", &[("a", "5")]), "TRUE");
    assert_eq!(eval("a < 2.5", &[("a", "2")]), "TRUE");
    assert_eq!(eval("a > 2.5", &[("a", "2.75")]), "TRUE");
    assert_eq!(eval("a = 3", &[("a", "3")]), "TRUE");
    assert_eq!(eval("a = 3.0", &[("a", "3")]), "TRUE");
    assert_eq!(eval("a > -1", &[("a", "0")]), "TRUE");
    assert_eq!(eval("a > 5", &[("a", "10000000000")]), "TRUE");
    // A value that is not a number fails the evaluation: the message is not delivered.
    assert_eq!(eval("a > 5", &[("a", "abc")]), "error");
    assert_eq!(eval("a > 5", &[("a", "7.5")]), "error");
    assert_eq!(eval("a > 5.0", &[("a", "7.5")]), "TRUE");
    // Two properties are both read as doubles.
    assert_eq!(eval("a > b", &[("a", "10"), ("b", "9.5")]), "TRUE");
}

#[test]
fn missing_properties_are_null_and_logic_is_three_valued() {
    assert_eq!(eval("a > 5", &[]), "NULL");
    assert_eq!(eval("a IS NULL", &[]), "TRUE");
    assert_eq!(eval("a IS NOT NULL", &[]), "FALSE");
    assert_eq!(eval("a IS NOT NULL", &[("a", "")]), "TRUE");
    assert_eq!(eval("a > 5 AND b = 'x'", &[("b", "x")]), "NULL");
    assert_eq!(eval("a > 5 AND b = 'x'", &[("b", "y")]), "FALSE");
    assert_eq!(eval("a > 5 OR b = 'x'", &[("b", "x")]), "TRUE");
    assert_eq!(eval("a > 5 OR b = 'x'", &[("b", "y")]), "NULL");
    assert_eq!(eval("NOT (a > 5)", &[]), "NULL");
    assert_eq!(eval("NOT (a > 5)", &[("a", "1")]), "TRUE");
    assert_eq!(eval("a <> 'x'", &[]), "NULL");
    // Apache's asymmetry: a missing left side is NULL, a missing right side FALSE.
    assert_eq!(eval("a = b", &[("a", "1")]), "FALSE");
    assert_eq!(eval("a = b", &[("b", "1")]), "NULL");
    // The first FALSE of an AND (TRUE of an OR) decides before a later error.
    assert_eq!(
        eval("b = 'y' AND a > 5", &[("a", "x"), ("b", "n")]),
        "FALSE"
    );
    assert_eq!(
        eval("a > 5 AND b = 'y'", &[("a", "x"), ("b", "n")]),
        "error"
    );
    assert_eq!(eval("TRUE OR a > 5", &[("a", "x")]), "TRUE");
}

#[test]
fn strings_in_between_booleans_and_text() {
    assert_eq!(eval("TAGS = 'TagA'", &[("TAGS", "TagA")]), "TRUE");
    assert_eq!(eval("TAGS <> 'TagA'", &[("TAGS", "TagB")]), "TRUE");
    assert_eq!(
        eval("color IN ('red', 'blue')", &[("color", "blue")]),
        "TRUE"
    );
    assert_eq!(
        eval("color NOT IN ('red', 'blue')", &[("color", "blue")]),
        "FALSE"
    );
    assert_eq!(eval("color NOT IN ('red')", &[]), "NULL");
    assert_eq!(eval("a BETWEEN 1 AND 3", &[("a", "3")]), "TRUE");
    assert_eq!(eval("a BETWEEN 1 AND 3", &[("a", "4")]), "FALSE");
    assert_eq!(eval("a NOT BETWEEN 1 AND 3", &[("a", "4")]), "TRUE");
    assert_eq!(eval("a BETWEEN -2 AND 2.5", &[("a", "-1")]), "TRUE");
    assert_eq!(eval("flag = TRUE", &[("flag", "True")]), "TRUE");
    assert_eq!(eval("flag = FALSE", &[("flag", "yes")]), "TRUE");
    assert_eq!(eval("TRUE", &[]), "TRUE");
    assert_eq!(eval("NULL", &[]), "NULL");
    // A bare property is a condition that is never TRUE for a string value.
    assert_eq!(eval("flag", &[("flag", "true")]), "FALSE");
    assert_eq!(eval("flag", &[]), "NULL");
    assert_eq!(eval("s CONTAINS 'ell'", &[("s", "hello")]), "TRUE");
    assert_eq!(eval("s NOT CONTAINS 'ell'", &[("s", "hello")]), "FALSE");
    assert_eq!(
        eval("s STARTSWITH 'he' AND s ENDSWITH 'lo'", &[("s", "hello")]),
        "TRUE"
    );
    assert_eq!(eval("s NOT STARTSWITH 'x'", &[]), "FALSE");
    assert_eq!(eval("s = 'it''s'", &[("s", "it's")]), "TRUE");
}

#[test]
fn keywords_are_case_insensitive_with_apache_precedence() {
    assert_eq!(eval("a > 1 and b < 2 Or c = 'z'", &[("c", "z")]), "TRUE");
    // AND binds tighter than OR.
    assert_eq!(
        eval("x = 1 OR x = 2 AND y = 3", &[("x", "1"), ("y", "0")]),
        "TRUE"
    );
    assert_eq!(
        eval("(x = 1 OR x = 2) AND y = 3", &[("x", "1"), ("y", "0")]),
        "FALSE"
    );
    // BETWEEN's AND belongs to BETWEEN.
    assert_eq!(
        eval("a between 1 and 5 and b = 'x'", &[("a", "2"), ("b", "x")]),
        "TRUE"
    );
    assert_eq!(eval("NOT a = 'x' OR TRUE", &[]), "TRUE");
    assert_eq!(
        eval(
            "a = 1 -- a comment\n AND /* another */ b IS NULL",
            &[("a", "1")]
        ),
        "TRUE"
    );
}

#[test]
fn what_cannot_be_evaluated_is_refused_at_parse() {
    for bad in [
        "",
        "   ",
        "a >",
        "a > 5 AND",
        "(a > 5",
        "a > 5)",
        "a = 'open",
        "a > 'text'",
        "a > TRUE",
        "'x' < a",
        "a = NULL",
        "NULL = a",
        "TRUE = 1",
        "NOT a > 5",
        "a > 5 > 3",
        "5",
        "'x'",
        "a > 5 AND 3",
        "-a",
        "5 IN ('x')",
        "a IN ()",
        "a IN (1, 2)",
        "a BETWEEN 5 AND 1",
        "a BETWEEN NULL AND 1",
        "a BETWEEN 1",
        "a LIKE 'x%'",
        "a == 1",
        "a != 1",
        "a.b = 1",
        "a = 007",
        "a = 1 b = 2",
        "a CONTAINS b",
        "a IS 5",
        "#",
    ] {
        let error = refused(bad);
        assert!(error.column >= 1, "{bad}: {error}");
        assert!(error
            .to_string()
            .starts_with("invalid SQL92 expression at column"));
    }
    let error = refused("a > 5 AND b >");
    assert_eq!(error.column, 14, "{error}");
    assert!(refused("a = 1 AND NOT b > 2")
        .message
        .contains("cannot be compared"));
    assert!(refused("a = NULL").message.contains("IS NULL"));
}

#[test]
fn depth_is_bounded() {
    let deep = format!("{}a = 1{}", "(".repeat(10_000), ")".repeat(10_000));
    assert!(refused(&deep).message.contains("nested"));
    let chain = format!("a = 1{}", " = TRUE".repeat(10_000));
    assert!(refused(&chain).message.contains("nested"));
    let negations = format!("{}a", "- ".repeat(10_000));
    assert!(Selector::parse(&negations).is_err());
    // Long flat chains are fine: they add no depth.
    let wide = (0..5_000)
        .map(|i| format!("a = {i}"))
        .collect::<Vec<_>>()
        .join(" OR ");
    assert_eq!(eval(&wide, &[("a", "4999")]), "TRUE");
}

#[test]
fn matches_reads_rocketmq_properties() {
    let selector = Selector::parse("a > 5 AND TAGS = 'T'").unwrap();
    assert!(selector.matches_properties("a\u{1}6\u{2}TAGS\u{1}T\u{2}"));
    assert!(!selector.matches_properties("a\u{1}5\u{2}TAGS\u{1}T\u{2}"));
    assert!(!selector.matches_properties("TAGS\u{1}T\u{2}"));
    assert!(!selector.matches_properties("a\u{1}x\u{2}TAGS\u{1}T\u{2}"));
    assert_eq!(selector.expression(), "a > 5 AND TAGS = 'T'");
}

#[test]
fn expression_types() {
    assert!(expression_type::is_tag(None));
    assert!(expression_type::is_tag(Some("")));
    assert!(expression_type::is_tag(Some("TAG")));
    assert!(!expression_type::is_tag(Some("SQL92")));
    assert!(expression_type::is_sql92(Some("sql92")));
    assert!(!expression_type::is_sql92(None));
}
