//! The non-standard JSON that Java's fastjson writes, read and written here.
//!
//! fastjson writes `Map<MessageQueue, V>` with the key object itself as the key
//! (`{{"brokerName":"b","queueId":0,"topic":"T"}:{..}}`) and integer keys unquoted
//! (`{0:250}`). [`normalize`] turns that into standard JSON by quoting every non-string key
//! (an object key becomes the string of its compact JSON text); [`write()`] produces it again.

use serde_json::Value;

use crate::error::BodyError;

/// How integer-looking keys are written by [`write()`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntegerKeys {
    /// `{"0":250}`: standard JSON, what jsoncpp (the C++ client) needs.
    Quoted,
    /// `{0:250}`: what fastjson writes for `Map<Integer, _>`.
    Unquoted,
}

/// Keys nested inside keys deeper than this are refused: fastjson never nests them, and each
/// level re-escapes the level below, so deep nesting would grow the output exponentially.
const MAX_KEY_DEPTH: usize = 2;

/// Rewrites fastjson output into standard JSON; standard JSON passes through unchanged.
pub fn normalize(input: &str) -> Result<String, BodyError> {
    let mut out = String::with_capacity(input.len());
    normalize_into(input, &mut out, 0)?;
    Ok(out)
}

fn normalize_into(input: &str, out: &mut String, depth: usize) -> Result<(), BodyError> {
    let bytes = input.as_bytes();
    // true = inside an object, false = inside an array.
    let mut containers: Vec<bool> = Vec::new();
    let mut expect_key = false;
    let mut copied_to = 0;
    let mut index = 0;
    while index < bytes.len() {
        let byte = bytes[index];
        if expect_key && !byte.is_ascii_whitespace() && byte != b'"' && byte != b'}' {
            let end = key_end(bytes, index)?;
            out.push_str(&input[copied_to..index]);
            let key = input[index..end].trim();
            let key_text = if key.starts_with('{') || key.starts_with('[') {
                if depth >= MAX_KEY_DEPTH {
                    return Err(shape("object keys nested too deeply"));
                }
                let mut nested = String::with_capacity(key.len());
                normalize_into(key, &mut nested, depth + 1)?;
                compact(&nested)?
            } else {
                key.to_owned()
            };
            let quoted = serde_json::to_string(&key_text).map_err(|source| BodyError::Json {
                what: "fastjson key",
                source,
            })?;
            out.push_str(&quoted);
            copied_to = end;
            index = end;
            expect_key = false;
            continue;
        }
        match byte {
            b'"' => {
                index = string_end(bytes, index);
                expect_key = false;
                continue;
            }
            b'{' => {
                containers.push(true);
                expect_key = true;
            }
            b'[' => {
                containers.push(false);
                expect_key = false;
            }
            b'}' | b']' => {
                containers.pop();
                expect_key = false;
            }
            b',' => expect_key = containers.last() == Some(&true),
            b':' => expect_key = false,
            _ => {}
        }
        index += 1;
    }
    out.push_str(&input[copied_to..]);
    Ok(())
}

/// Re-serializes a key object compactly, so equal keys compare equal as strings.
fn compact(json: &str) -> Result<String, BodyError> {
    let value: Value = serde_json::from_str(json).map_err(|source| BodyError::Json {
        what: "fastjson key",
        source,
    })?;
    Ok(value.to_string())
}

fn shape(reason: &str) -> BodyError {
    BodyError::Shape {
        what: "fastjson",
        reason: reason.to_owned(),
    }
}

/// Index just past the string starting at `start` (a `"`), or the end of input if unclosed.
fn string_end(bytes: &[u8], start: usize) -> usize {
    let mut index = start + 1;
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 2,
            b'"' => return index + 1,
            _ => index += 1,
        }
    }
    bytes.len()
}

/// Index just past an unquoted key starting at `start`: a bracketed value or a bare token.
fn key_end(bytes: &[u8], start: usize) -> Result<usize, BodyError> {
    match bytes[start] {
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut index = start;
            while index < bytes.len() {
                match bytes[index] {
                    b'"' => {
                        index = string_end(bytes, index);
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Ok(index + 1);
                        }
                    }
                    _ => {}
                }
                index += 1;
            }
            Err(shape("unterminated object key"))
        }
        _ => {
            let end = bytes[start..]
                .iter()
                .position(|&byte| byte == b':' || byte.is_ascii_whitespace())
                .map(|offset| start + offset)
                .ok_or_else(|| shape("object key without a value"))?;
            if end == start {
                return Err(shape("empty object key"));
            }
            Ok(end)
        }
    }
}

/// Writes `value` as fastjson does: keys that hold a JSON object (the form [`normalize`] and
/// the MessageQueue-keyed maps produce) are written raw, integer keys per `integer_keys`.
pub fn write(value: &Value, integer_keys: IntegerKeys) -> String {
    let mut out = String::new();
    write_value(value, integer_keys, &mut out);
    out
}

fn write_value(value: &Value, integer_keys: IntegerKeys, out: &mut String) {
    match value {
        Value::Object(map) => {
            out.push('{');
            for (position, (key, item)) in map.iter().enumerate() {
                if position > 0 {
                    out.push(',');
                }
                write_key(key, integer_keys, out);
                out.push(':');
                write_value(item, integer_keys, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (position, item) in items.iter().enumerate() {
                if position > 0 {
                    out.push(',');
                }
                write_value(item, integer_keys, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_key(key: &str, integer_keys: IntegerKeys, out: &mut String) {
    if key.starts_with('{') {
        if let Ok(object @ Value::Object(_)) = serde_json::from_str::<Value>(key) {
            write_value(&object, integer_keys, out);
            return;
        }
    }
    if integer_keys == IntegerKeys::Unquoted && key.parse::<i64>().is_ok() {
        out.push_str(key);
        return;
    }
    out.push_str(&Value::String(key.to_owned()).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_keys_become_quoted_json_text() {
        let fastjson =
            r#"{"offsetTable":{{"brokerName":"b","queueId":0,"topic":"T"}:{"brokerOffset":5}}}"#;
        let standard = normalize(fastjson).unwrap();
        let value: Value = serde_json::from_str(&standard).unwrap();
        let table = value["offsetTable"].as_object().unwrap();
        let (key, item) = table.iter().next().unwrap();
        assert_eq!(key, r#"{"brokerName":"b","queueId":0,"topic":"T"}"#);
        assert_eq!(item["brokerOffset"], 5);
    }

    #[test]
    fn unquoted_integer_keys_become_strings() {
        let standard = normalize(r#"{"offsetTable":{"T@g":{0:250, 12 :7}}}"#).unwrap();
        let value: Value = serde_json::from_str(&standard).unwrap();
        assert_eq!(value["offsetTable"]["T@g"]["0"], 250);
        assert_eq!(value["offsetTable"]["T@g"]["12"], 7);
    }

    #[test]
    fn standard_json_passes_through_unchanged() {
        let standard = r#"{"a":[1,{"b":"x:{y}"}],"c\"d":{"e":null}}"#;
        assert_eq!(normalize(standard).unwrap(), standard);
    }

    #[test]
    fn strings_containing_braces_and_commas_are_left_alone() {
        let input = r#"{"k":"{,0:1}",5:"v"}"#;
        let value: Value = serde_json::from_str(&normalize(input).unwrap()).unwrap();
        assert_eq!(value["k"], "{,0:1}");
        assert_eq!(value["5"], "v");
    }

    #[test]
    fn write_produces_fastjson_form_and_normalize_reads_it_back() {
        let standard = r#"{"offsetTable":{"{\"brokerName\":\"b\",\"queueId\":1,\"topic\":\"T\"}":9},"t":{"3":4}}"#;
        let value: Value = serde_json::from_str(standard).unwrap();
        let fastjson = write(&value, IntegerKeys::Unquoted);
        assert_eq!(
            fastjson,
            r#"{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:9},"t":{3:4}}"#
        );
        let back: Value = serde_json::from_str(&normalize(&fastjson).unwrap()).unwrap();
        assert_eq!(back, value);
        assert_eq!(
            write(&value, IntegerKeys::Quoted),
            r#"{"offsetTable":{{"brokerName":"b","queueId":1,"topic":"T"}:9},"t":{"3":4}}"#
        );
    }

    #[test]
    fn keys_nested_in_keys_are_bounded() {
        let two_levels = r#"{{{"a":1}:2}:3}"#;
        let value: Value = serde_json::from_str(&normalize(two_levels).unwrap()).unwrap();
        assert_eq!(value.as_object().unwrap().len(), 1);
        let deep = format!("{}\"q\":1{}", "{{".repeat(12), "}:1".repeat(12));
        assert!(normalize(&deep).is_err());
    }

    #[test]
    fn malformed_keys_are_errors_not_panics() {
        assert!(normalize("{{\"a\":1").is_err());
        assert!(normalize("{5").is_err());
        let deep = format!("{}{}", "{".repeat(200), "}".repeat(200));
        let _ = normalize(&deep);
    }
}
