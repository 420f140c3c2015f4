//! serde helpers for peers that send numbers as strings, booleans as 0/1, and nulls.

use serde::de::{DeserializeOwned, Error};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

fn integer(value: &Value) -> Option<i64> {
    match value {
        Value::Number(number) => number.as_i64().or_else(|| {
            number
                .as_f64()
                .filter(|float| float.fract() == 0.0 && float.abs() < 9.0e15)
                .map(|float| float as i64)
        }),
        Value::String(text) => text.trim().parse().ok(),
        Value::Bool(flag) => Some(i64::from(*flag)),
        _ => None,
    }
}

/// An i64 sent as a number or a numeric string; null reads as 0.
pub fn i64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let value = Value::deserialize(deserializer)?;
    if value.is_null() {
        return Ok(0);
    }
    integer(&value).ok_or_else(|| D::Error::custom(format!("expected an integer, got {value}")))
}

/// An i32 sent as a number or a numeric string; null reads as 0.
pub fn i32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i32, D::Error> {
    let wide = i64(deserializer)?;
    i32::try_from(wide).map_err(|_| D::Error::custom(format!("{wide} is out of range for i32")))
}

/// A u32 sent as a number or a numeric string; null reads as 0.
pub fn u32<'de, D: Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let wide = i64(deserializer)?;
    u32::try_from(wide).map_err(|_| D::Error::custom(format!("{wide} is out of range for u32")))
}

/// An f64 sent as a number or a numeric string; null reads as 0.
pub fn f64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let value = Value::deserialize(deserializer)?;
    match &value {
        Value::Null => Ok(0.0),
        Value::Number(number) => number
            .as_f64()
            .ok_or_else(|| D::Error::custom("number out of range")),
        Value::String(text) => text
            .trim()
            .parse()
            .map_err(|_| D::Error::custom(format!("expected a number, got {value}"))),
        _ => Err(D::Error::custom(format!("expected a number, got {value}"))),
    }
}

/// A boolean sent as true/false, 0/1 or their string forms; null reads as false.
pub fn bool<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let value = Value::deserialize(deserializer)?;
    match &value {
        Value::Null => Ok(false),
        Value::Bool(flag) => Ok(*flag),
        Value::Number(_) => Ok(integer(&value).unwrap_or(0) != 0),
        Value::String(text) => match text.trim() {
            word if word.eq_ignore_ascii_case("true") || word == "1" => Ok(true),
            word if word.eq_ignore_ascii_case("false") || word == "0" || word.is_empty() => {
                Ok(false)
            }
            _ => Err(D::Error::custom(format!("expected a boolean, got {value}"))),
        },
        _ => Err(D::Error::custom(format!("expected a boolean, got {value}"))),
    }
}

/// A string that may arrive as a number or boolean; null reads as "".
pub fn string<'de, D: Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    let value = Value::deserialize(deserializer)?;
    Ok(match value {
        Value::Null => String::new(),
        Value::String(text) => text,
        other => other.to_string(),
    })
}

/// Any collection or struct where null means "empty".
pub fn or_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A list of i32 whose items may be numbers or strings; null reads as empty.
pub fn i32_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<i32>, D::Error> {
    let items: Option<Vec<Value>> = Option::deserialize(deserializer)?;
    items
        .unwrap_or_default()
        .iter()
        .map(|item| {
            integer(item)
                .and_then(|wide| i32::try_from(wide).ok())
                .ok_or_else(|| D::Error::custom(format!("expected an i32, got {item}")))
        })
        .collect()
}

/// A list of strings whose items may be numbers; null reads as empty.
pub fn string_list<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let items: Option<Vec<Value>> = Option::deserialize(deserializer)?;
    Ok(items
        .unwrap_or_default()
        .into_iter()
        .map(|item| match item {
            Value::String(text) => text,
            other => other.to_string(),
        })
        .collect())
}

/// Declares a Java enum that serializes as its name and reads its name or its ordinal.
macro_rules! java_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident { $( $(#[$variant_meta:meta])* $variant:ident = $ordinal:literal => $java:literal, )* }
        default $default:ident
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $( $(#[$variant_meta])* $variant, )* }

        impl Default for $name {
            fn default() -> Self {
                $name::$default
            }
        }

        impl $name {
            /// The Java constant name.
            pub fn java_name(self) -> &'static str {
                match self { $( $name::$variant => $java, )* }
            }

            /// The Java ordinal (what the C++ client sends).
            pub fn ordinal(self) -> i64 {
                match self { $( $name::$variant => $ordinal, )* }
            }

            pub fn from_java_name(name: &str) -> Option<Self> {
                match name { $( $java => Some($name::$variant), )* _ => None }
            }

            pub fn from_ordinal(ordinal: i64) -> Option<Self> {
                match ordinal { $( $ordinal => Some($name::$variant), )* _ => None }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.java_name())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                use serde::de::Error;
                let value = serde_json::Value::deserialize(deserializer)?;
                let parsed = match &value {
                    serde_json::Value::Null => Some($name::default()),
                    serde_json::Value::Number(number) => number.as_i64().and_then($name::from_ordinal),
                    serde_json::Value::String(text) => $name::from_java_name(text.trim())
                        .or_else(|| text.trim().parse().ok().and_then($name::from_ordinal)),
                    _ => None,
                };
                parsed.ok_or_else(|| D::Error::custom(format!(
                    concat!("unknown ", stringify!($name), " {}"), value)))
            }
        }
    };
}

pub(crate) use java_enum;
