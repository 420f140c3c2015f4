//! Recursive descent over the grammar in `mod.rs`, with Apache's checks of what each operator
//! accepts (its `instanceof` tests), made on the kinds of the operands.

use super::lexer::{tokenize, Spanned, Token};
use super::{Expr, Literal, Ordering, SelectorError, TextOp, MAX_DEPTH};

/// Parentheses and prefix operators nested at most this deep (bounds the parser's recursion).
const MAX_NESTING: usize = 64;

/// What Apache's checks ask of an operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Null,
    Bool,
    Number,
    Str,
    Property,
    /// A comparison or logical operator: a condition.
    Condition,
    /// A negated value (`-x`): a number or NULL at run time, but no literal.
    Negated,
}

impl Kind {
    fn describe(self) -> &'static str {
        match self {
            Kind::Null => "NULL",
            Kind::Bool => "a boolean literal",
            Kind::Number => "a number",
            Kind::Str => "a string literal",
            Kind::Property => "a property",
            Kind::Condition => "a condition",
            Kind::Negated => "a negated value",
        }
    }

    /// Apache's `BooleanExpression`: conditions and the TRUE, FALSE and NULL literals.
    fn is_boolean(self) -> bool {
        matches!(self, Kind::Condition | Kind::Bool | Kind::Null)
    }

    fn is_literal(self) -> bool {
        matches!(self, Kind::Null | Kind::Bool | Kind::Number | Kind::Str)
    }
}

struct Node {
    expr: Expr,
    kind: Kind,
    depth: usize,
}

struct Parser {
    tokens: Vec<Spanned>,
    at: usize,
    nesting: usize,
    /// Column just past the text, for errors at its end.
    end_column: usize,
}

pub(super) fn parse(text: &str) -> Result<Expr, SelectorError> {
    let mut parser = Parser {
        tokens: tokenize(text)?,
        at: 0,
        nesting: 0,
        end_column: text.chars().count() + 1,
    };
    if parser.tokens.is_empty() {
        return Err(SelectorError::new(1, "the expression is empty"));
    }
    let node = parser.or()?;
    if let Some(extra) = parser.tokens.get(parser.at) {
        return Err(SelectorError::new(
            extra.column,
            format!("unexpected {}", extra.token.describe()),
        ));
    }
    Ok(parser.condition(node, 1)?.expr)
}

impl Parser {
    fn peek(&self, ahead: usize) -> Option<&Token> {
        self.tokens.get(self.at + ahead).map(|s| &s.token)
    }

    fn column(&self) -> usize {
        self.tokens
            .get(self.at)
            .map_or(self.end_column, |s| s.column)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).map(|s| s.token.clone());
        self.at += usize::from(token.is_some());
        token
    }

    fn expect(&mut self, wanted: &Token) -> Result<(), SelectorError> {
        let column = self.column();
        match self.next() {
            Some(token) if token == *wanted => Ok(()),
            Some(token) => Err(SelectorError::new(
                column,
                format!("expected {}, found {}", wanted.describe(), token.describe()),
            )),
            None => Err(SelectorError::new(
                column,
                format!("expected {} before the end", wanted.describe()),
            )),
        }
    }

    fn node(
        &self,
        expr: Expr,
        kind: Kind,
        child_depth: usize,
        column: usize,
    ) -> Result<Node, SelectorError> {
        let depth = child_depth + 1;
        if depth > MAX_DEPTH {
            return Err(SelectorError::new(
                column,
                format!("the expression is nested more than {MAX_DEPTH} levels deep"),
            ));
        }
        Ok(Node { expr, kind, depth })
    }

    /// Apache's `asBooleanExpression`: a condition stays, a bare property is cast, the rest
    /// is refused.
    fn condition(&self, node: Node, column: usize) -> Result<Node, SelectorError> {
        match node.kind {
            kind if kind.is_boolean() => Ok(node),
            Kind::Property => self.node(
                Expr::BoolCast(Box::new(node.expr)),
                Kind::Condition,
                node.depth,
                column,
            ),
            kind => Err(SelectorError::new(
                column,
                format!("{} is not a condition", kind.describe()),
            )),
        }
    }

    /// `OR` and `AND` chains, flattened.
    fn chain(
        &mut self,
        joiner: &Token,
        operand: fn(&mut Parser) -> Result<Node, SelectorError>,
        build: fn(Vec<Expr>) -> Expr,
    ) -> Result<Node, SelectorError> {
        let column = self.column();
        let first = operand(self)?;
        if self.peek(0) != Some(joiner) {
            return Ok(first);
        }
        let first = self.condition(first, column)?;
        let mut depth = first.depth;
        let mut terms = vec![first.expr];
        while self.peek(0) == Some(joiner) {
            self.at += 1;
            let column = self.column();
            let term = operand(self)?;
            let term = self.condition(term, column)?;
            depth = depth.max(term.depth);
            terms.push(term.expr);
        }
        self.node(build(terms), Kind::Condition, depth, column)
    }

    fn or(&mut self) -> Result<Node, SelectorError> {
        self.chain(&Token::Or, Parser::and, Expr::Or)
    }

    fn and(&mut self) -> Result<Node, SelectorError> {
        self.chain(&Token::And, Parser::equality, Expr::And)
    }

    fn equality(&mut self) -> Result<Node, SelectorError> {
        let mut left = self.comparison()?;
        loop {
            let column = self.column();
            left = match self.peek(0) {
                Some(Token::Eq) => {
                    self.at += 1;
                    let right = self.comparison()?;
                    self.equal(left, right, column)?
                }
                Some(Token::NotEq) => {
                    self.at += 1;
                    let right = self.comparison()?;
                    let equal = self.equal(left, right, column)?;
                    self.not(equal, column)?
                }
                Some(Token::Is) => {
                    self.at += 1;
                    let negated = self.peek(0) == Some(&Token::Not);
                    self.at += usize::from(negated);
                    self.expect(&Token::Null)?;
                    let null = Node {
                        expr: Expr::Literal(Literal::Null),
                        kind: Kind::Null,
                        depth: 1,
                    };
                    let is_null = self.node(
                        Expr::Equal(Box::new(left.expr), Box::new(null.expr)),
                        Kind::Condition,
                        left.depth,
                        column,
                    )?;
                    if negated {
                        self.not(is_null, column)?
                    } else {
                        is_null
                    }
                }
                _ => return Ok(left),
            };
        }
    }

    fn not(&self, node: Node, column: usize) -> Result<Node, SelectorError> {
        self.node(
            Expr::Not(Box::new(node.expr)),
            Kind::Condition,
            node.depth,
            column,
        )
    }

    /// `=`: NULL is refused on either side (`IS NULL` is the way), and a boolean literal on
    /// the left needs one on the right.
    fn equal(&self, left: Node, right: Node, column: usize) -> Result<Node, SelectorError> {
        if left.kind == Kind::Null || right.kind == Kind::Null {
            return Err(SelectorError::new(
                column,
                "NULL cannot be compared with '=' or '<>': use IS NULL or IS NOT NULL",
            ));
        }
        if left.kind == Kind::Bool && right.kind.is_literal() && right.kind != Kind::Bool {
            return Err(SelectorError::new(
                column,
                format!(
                    "a boolean literal cannot be compared with {}",
                    right.kind.describe()
                ),
            ));
        }
        self.node(
            Expr::Equal(Box::new(left.expr), Box::new(right.expr)),
            Kind::Condition,
            left.depth.max(right.depth),
            column,
        )
    }

    /// `>`, `>=`, `<`, `<=`: numbers, properties and negated values only.
    fn compare(
        &self,
        ordering: Ordering,
        left: Node,
        right: Node,
        column: usize,
    ) -> Result<Node, SelectorError> {
        for side in [&left, &right] {
            if side.kind.is_boolean() || side.kind == Kind::Str {
                return Err(SelectorError::new(
                    column,
                    format!(
                        "{} cannot be compared with '>', '>=', '<' or '<=' (numbers only)",
                        side.kind.describe()
                    ),
                ));
            }
        }
        self.node(
            Expr::Compare(ordering, Box::new(left.expr), Box::new(right.expr)),
            Kind::Condition,
            left.depth.max(right.depth),
            column,
        )
    }

    fn comparison(&mut self) -> Result<Node, SelectorError> {
        let mut left = self.unary()?;
        loop {
            let column = self.column();
            let negated = self.peek(0) == Some(&Token::Not)
                && matches!(
                    self.peek(1),
                    Some(
                        Token::Between
                            | Token::In
                            | Token::Contains
                            | Token::StartsWith
                            | Token::EndsWith
                    )
                );
            self.at += usize::from(negated);
            let ordering = match self.peek(0) {
                Some(Token::Gt) if !negated => Ordering::Gt,
                Some(Token::Ge) if !negated => Ordering::Ge,
                Some(Token::Lt) if !negated => Ordering::Lt,
                Some(Token::Le) if !negated => Ordering::Le,
                Some(Token::Between) => {
                    self.at += 1;
                    left = self.between(left, negated, column)?;
                    continue;
                }
                Some(Token::In) => {
                    self.at += 1;
                    left = self.in_list(left, negated, column)?;
                    continue;
                }
                Some(Token::Contains | Token::StartsWith | Token::EndsWith) => {
                    left = self.text(left, negated, column)?;
                    continue;
                }
                _ => return Ok(left),
            };
            self.at += 1;
            let right = self.unary()?;
            left = self.compare(ordering, left, right, column)?;
        }
    }

    /// `v BETWEEN lo AND hi` is `v >= lo AND v <= hi`; `NOT BETWEEN` is `v < lo OR v > hi`.
    fn between(
        &mut self,
        value: Node,
        negated: bool,
        column: usize,
    ) -> Result<Node, SelectorError> {
        let low = self.unary()?;
        self.expect(&Token::And)?;
        let high = self.unary()?;
        if !negated {
            if low.kind == Kind::Null || high.kind == Kind::Null {
                return Err(SelectorError::new(column, "BETWEEN bounds cannot be NULL"));
            }
            if let (Expr::Literal(lo), Expr::Literal(hi)) = (&low.expr, &high.expr) {
                if super::eval::literal_greater(lo, hi) {
                    return Err(SelectorError::new(
                        column,
                        "BETWEEN's lower bound is greater than its upper bound",
                    ));
                }
            }
        }
        let again = Node {
            expr: value.expr.clone(),
            kind: value.kind,
            depth: value.depth,
        };
        let (first, second, build): (_, _, fn(Vec<Expr>) -> Expr) = if negated {
            (Ordering::Lt, Ordering::Gt, Expr::Or)
        } else {
            (Ordering::Ge, Ordering::Le, Expr::And)
        };
        let lower = self.compare(first, value, low, column)?;
        let upper = self.compare(second, again, high, column)?;
        let depth = lower.depth.max(upper.depth);
        self.node(
            build(vec![lower.expr, upper.expr]),
            Kind::Condition,
            depth,
            column,
        )
    }

    fn string(&mut self, after: &str) -> Result<String, SelectorError> {
        let column = self.column();
        match self.next() {
            Some(Token::Str(text)) => Ok(text),
            Some(token) => Err(SelectorError::new(
                column,
                format!("{after} takes a string literal, found {}", token.describe()),
            )),
            None => Err(SelectorError::new(
                column,
                format!("{after} takes a string literal before the end"),
            )),
        }
    }

    fn in_list(&mut self, left: Node, negated: bool, column: usize) -> Result<Node, SelectorError> {
        let Expr::Property(property) = left.expr else {
            return Err(SelectorError::new(
                column,
                format!("IN applies to a property, not {}", left.kind.describe()),
            ));
        };
        self.expect(&Token::LParen)?;
        let mut values = vec![self.string("IN")?];
        while self.peek(0) == Some(&Token::Comma) {
            self.at += 1;
            values.push(self.string("IN")?);
        }
        self.expect(&Token::RParen)?;
        self.node(
            Expr::In {
                property,
                values,
                negated,
            },
            Kind::Condition,
            left.depth,
            column,
        )
    }

    fn text(&mut self, operand: Node, negated: bool, column: usize) -> Result<Node, SelectorError> {
        let (op, name) = match self.next() {
            Some(Token::Contains) => (TextOp::Contains, "CONTAINS"),
            Some(Token::StartsWith) => (TextOp::StartsWith, "STARTSWITH"),
            _ => (TextOp::EndsWith, "ENDSWITH"),
        };
        let search = self.string(name)?;
        self.node(
            Expr::Text {
                op,
                negated,
                operand: Box::new(operand.expr),
                search,
            },
            Kind::Condition,
            operand.depth,
            column,
        )
    }

    fn nested<T>(
        &mut self,
        column: usize,
        inner: impl FnOnce(&mut Parser) -> Result<T, SelectorError>,
    ) -> Result<T, SelectorError> {
        if self.nesting >= MAX_NESTING {
            return Err(SelectorError::new(
                column,
                format!("parentheses and prefix operators are nested more than {MAX_NESTING} deep"),
            ));
        }
        self.nesting += 1;
        let result = inner(self);
        self.nesting -= 1;
        result
    }

    fn unary(&mut self) -> Result<Node, SelectorError> {
        let column = self.column();
        match self.peek(0) {
            Some(Token::Plus) => {
                self.at += 1;
                self.nested(column, Parser::unary)
            }
            Some(Token::Minus) => {
                self.at += 1;
                let operand = self.nested(column, Parser::unary)?;
                self.node(
                    Expr::Negate(Box::new(operand.expr)),
                    Kind::Negated,
                    operand.depth,
                    column,
                )
            }
            Some(Token::Not) => {
                self.at += 1;
                let operand = self.nested(column, Parser::unary)?;
                let operand = self.condition(operand, column)?;
                self.not(operand, column)
            }
            _ => self.primary(),
        }
    }

    fn primary(&mut self) -> Result<Node, SelectorError> {
        let column = self.column();
        let literal = |literal, kind| {
            Ok(Node {
                expr: Expr::Literal(literal),
                kind,
                depth: 1,
            })
        };
        match self.next() {
            Some(Token::Str(text)) => literal(Literal::Str(text), Kind::Str),
            Some(Token::Integer(value)) => literal(Literal::Long(value), Kind::Number),
            Some(Token::Float(value)) => literal(Literal::Double(value), Kind::Number),
            Some(Token::True) => literal(Literal::Bool(true), Kind::Bool),
            Some(Token::False) => literal(Literal::Bool(false), Kind::Bool),
            Some(Token::Null) => literal(Literal::Null, Kind::Null),
            Some(Token::Ident(name)) => Ok(Node {
                expr: Expr::Property(name),
                kind: Kind::Property,
                depth: 1,
            }),
            Some(Token::LParen) => {
                let inner = self.nested(column, Parser::or)?;
                self.expect(&Token::RParen)?;
                Ok(inner)
            }
            Some(token) => Err(SelectorError::new(
                column,
                format!(
                    "unexpected {}: expected a value, a property or '('",
                    token.describe()
                ),
            )),
            None => Err(SelectorError::new(
                column,
                "the expression ends where a value was expected",
            )),
        }
    }
}
