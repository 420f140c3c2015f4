//! Tokens of the SQL92 selector, as Apache's `SelectorParser.jj` defines them: keywords and
//! identifiers case-insensitive, `'...'` strings with `''` for a quote, `--` and `/* */`
//! comments.

use super::SelectorError;

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Token {
    Not,
    And,
    Or,
    Between,
    In,
    True,
    False,
    Null,
    Is,
    Contains,
    StartsWith,
    EndsWith,
    Integer(i64),
    Float(f64),
    Str(String),
    Ident(String),
    Eq,
    NotEq,
    Gt,
    Ge,
    Lt,
    Le,
    LParen,
    RParen,
    Comma,
    Plus,
    Minus,
}

impl Token {
    /// How the token reads in an error message.
    pub(super) fn describe(&self) -> String {
        let fixed = match self {
            Token::Not => "NOT",
            Token::And => "AND",
            Token::Or => "OR",
            Token::Between => "BETWEEN",
            Token::In => "IN",
            Token::True => "TRUE",
            Token::False => "FALSE",
            Token::Null => "NULL",
            Token::Is => "IS",
            Token::Contains => "CONTAINS",
            Token::StartsWith => "STARTSWITH",
            Token::EndsWith => "ENDSWITH",
            Token::Eq => "=",
            Token::NotEq => "<>",
            Token::Gt => ">",
            Token::Ge => ">=",
            Token::Lt => "<",
            Token::Le => "<=",
            Token::LParen => "(",
            Token::RParen => ")",
            Token::Comma => ",",
            Token::Plus => "+",
            Token::Minus => "-",
            Token::Integer(value) => return value.to_string(),
            Token::Float(value) => return value.to_string(),
            Token::Str(text) => return format!("'{}'", text.replace('\'', "''")),
            Token::Ident(name) => return name.clone(),
        };
        fixed.to_owned()
    }
}

/// A token and the character column (from 1) it starts at.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Spanned {
    pub token: Token,
    pub column: usize,
}

fn keyword(word: &str) -> Option<Token> {
    const KEYWORDS: [(&str, Token); 12] = [
        ("NOT", Token::Not),
        ("AND", Token::And),
        ("OR", Token::Or),
        ("BETWEEN", Token::Between),
        ("IN", Token::In),
        ("TRUE", Token::True),
        ("FALSE", Token::False),
        ("NULL", Token::Null),
        ("IS", Token::Is),
        ("CONTAINS", Token::Contains),
        ("STARTSWITH", Token::StartsWith),
        ("ENDSWITH", Token::EndsWith),
    ];
    KEYWORDS
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(word))
        .map(|(_, token)| token.clone())
}

struct Lexer {
    chars: Vec<char>,
    at: usize,
}

/// Splits `text` into tokens; errors name the column of the offending character.
pub(super) fn tokenize(text: &str) -> Result<Vec<Spanned>, SelectorError> {
    let mut lexer = Lexer {
        chars: text.chars().collect(),
        at: 0,
    };
    let mut tokens = Vec::new();
    while let Some(start) = lexer.skip_blanks()? {
        let token = lexer.token()?;
        tokens.push(Spanned {
            token,
            column: start + 1,
        });
    }
    Ok(tokens)
}

impl Lexer {
    fn peek(&self, ahead: usize) -> Option<char> {
        self.chars.get(self.at + ahead).copied()
    }

    fn error(&self, column_index: usize, message: impl Into<String>) -> SelectorError {
        SelectorError::new(column_index + 1, message)
    }

    /// Skips white space and comments; the index of the next token, None at the end.
    fn skip_blanks(&mut self) -> Result<Option<usize>, SelectorError> {
        loop {
            match (self.peek(0), self.peek(1)) {
                (None, _) => return Ok(None),
                (Some(' ' | '\t' | '\n' | '\r' | '\u{c}'), _) => self.at += 1,
                (Some('-'), Some('-')) => {
                    while self.peek(0).is_some_and(|c| c != '\n' && c != '\r') {
                        self.at += 1;
                    }
                }
                (Some('/'), Some('*')) => {
                    let start = self.at;
                    self.at += 2;
                    loop {
                        match (self.peek(0), self.peek(1)) {
                            (None, _) => return Err(self.error(start, "comment is not closed")),
                            (Some('*'), Some('/')) => {
                                self.at += 2;
                                break;
                            }
                            _ => self.at += 1,
                        }
                    }
                }
                _ => return Ok(Some(self.at)),
            }
        }
    }

    fn token(&mut self) -> Result<Token, SelectorError> {
        let start = self.at;
        let c = self.peek(0).expect("skip_blanks saw a character");
        let two = |second: char, token: Token| (self.peek(1) == Some(second)).then_some(token);
        let (token, len) = match c {
            '=' => (Token::Eq, 1),
            '(' => (Token::LParen, 1),
            ')' => (Token::RParen, 1),
            ',' => (Token::Comma, 1),
            '+' => (Token::Plus, 1),
            '-' => (Token::Minus, 1),
            '>' => two('=', Token::Ge).map_or((Token::Gt, 1), |t| (t, 2)),
            '<' => two('=', Token::Le)
                .or_else(|| two('>', Token::NotEq))
                .map_or((Token::Lt, 1), |t| (t, 2)),
            '\'' => return self.string(),
            '0'..='9' | '.' => return self.number(),
            c if c.is_ascii_alphabetic() || c == '_' || c == '$' => return Ok(self.word()),
            other => {
                return Err(self.error(start, format!("unexpected character {other:?}")));
            }
        };
        self.at += len;
        Ok(token)
    }

    fn string(&mut self) -> Result<Token, SelectorError> {
        let start = self.at;
        self.at += 1;
        let mut text = String::new();
        loop {
            match (self.peek(0), self.peek(1)) {
                (None, _) => return Err(self.error(start, "string literal is not closed")),
                (Some('\''), Some('\'')) => {
                    text.push('\'');
                    self.at += 2;
                }
                (Some('\''), _) => {
                    self.at += 1;
                    return Ok(Token::Str(text));
                }
                (Some(c), _) => {
                    text.push(c);
                    self.at += 1;
                }
            }
        }
    }

    fn word(&mut self) -> Token {
        let start = self.at;
        while self
            .peek(0)
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$')
        {
            self.at += 1;
        }
        let word: String = self.chars[start..self.at].iter().collect();
        keyword(&word).unwrap_or(Token::Ident(word))
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while self.peek(0).is_some_and(|c| c.is_ascii_digit()) {
            self.at += 1;
        }
        self.at - start
    }

    /// `0`, `[1-9][0-9]*` with an optional `L`, or a float: `5.`, `5.5`, `.5`, `5E10`, `5.5e-3`.
    fn number(&mut self) -> Result<Token, SelectorError> {
        let start = self.at;
        let integer_digits = self.digits();
        let mut is_float = false;
        if self.peek(0) == Some('.') {
            self.at += 1;
            let fraction_digits = self.digits();
            if integer_digits == 0 && fraction_digits == 0 {
                return Err(self.error(start, "unexpected character '.'"));
            }
            is_float = true;
        }
        if matches!(self.peek(0), Some('e' | 'E')) {
            let mark = self.at;
            self.at += 1;
            if matches!(self.peek(0), Some('+' | '-')) {
                self.at += 1;
            }
            if self.digits() == 0 {
                // Not an exponent: `5e` is the number 5 then the name `e`, as JavaCC reads it.
                self.at = mark;
            } else {
                is_float = true;
            }
        }
        let text: String = self.chars[start..self.at].iter().collect();
        if is_float {
            return match text.parse::<f64>() {
                Ok(value) if value.is_finite() => Ok(Token::Float(value)),
                _ => Err(self.error(start, format!("number {text} is out of range"))),
            };
        }
        if matches!(self.peek(0), Some('l' | 'L')) {
            self.at += 1;
        }
        if text.len() > 1 && text.starts_with('0') {
            return Err(self.error(start, format!("number {text} has a leading zero")));
        }
        text.parse::<i64>()
            .map(Token::Integer)
            .map_err(|_| self.error(start, format!("number {text} is out of the long range")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str) -> Vec<Token> {
        tokenize(text)
            .unwrap()
            .into_iter()
            .map(|s| s.token)
            .collect()
    }

    #[test]
    fn keywords_are_case_insensitive_and_names_keep_their_case() {
        assert_eq!(
            tokens("a Is nOt NULL and Ab"),
            vec![
                Token::Ident("a".into()),
                Token::Is,
                Token::Not,
                Token::Null,
                Token::And,
                Token::Ident("Ab".into()),
            ]
        );
    }

    #[test]
    fn numbers_strings_operators_and_comments() {
        assert_eq!(
            tokens("1 10L 2.5 .5 5. 1e3 'it''s' <> >= <= -- note\n/* block */ ,"),
            vec![
                Token::Integer(1),
                Token::Integer(10),
                Token::Float(2.5),
                Token::Float(0.5),
                Token::Float(5.0),
                Token::Float(1000.0),
                Token::Str("it's".into()),
                Token::NotEq,
                Token::Ge,
                Token::Le,
                Token::Comma,
            ]
        );
    }

    #[test]
    fn bad_input_names_its_column() {
        let error = tokenize("a = 'open").unwrap_err();
        assert_eq!(error.column, 5);
        assert!(error.to_string().contains("not closed"), "{error}");
        assert_eq!(tokenize("a # 1").unwrap_err().column, 3);
        assert!(tokenize("a = 007").is_err());
        assert!(tokenize("a = 99999999999999999999").is_err());
        assert!(tokenize("a = 1e999").is_err());
        assert!(tokenize("/* open").is_err());
    }
}
