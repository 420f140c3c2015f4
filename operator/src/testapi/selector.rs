//! Label and field selectors: equality (`=`, `==`, `!=`) and existence (`key`, `!key`).

use serde_json::Value;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses `a=b,c!=d,e,!f`; set-based (`in`, `notin`) requirements are refused.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let mut requirements = Vec::new();
        for part in text
            .split(',')
            .map(str::trim)
            .filter(|part| !part.is_empty())
        {
            if part.contains(" in ") || part.contains(" notin ") || part.contains('(') {
                return Err(format!("set-based selector not supported: {part}"));
            }
            let requirement = if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some(key) = part.strip_prefix('!') {
                Requirement::Absent(key.trim().into())
            } else {
                Requirement::Exists(part.into())
            };
            requirements.push(requirement);
        }
        Ok(Selector(requirements))
    }

    /// Whether the labels of `object` satisfy every requirement.
    pub fn matches_labels(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.matches(|key| labels.get(key).and_then(Value::as_str).map(str::to_string))
    }

    /// Whether `metadata.name` / `metadata.namespace` satisfy every requirement.
    pub fn matches_fields(&self, object: &Value) -> bool {
        self.matches(|key| match key {
            "metadata.name" | "metadata.namespace" => {
                let field = key.trim_start_matches("metadata.");
                Some(object["metadata"][field].as_str().unwrap_or("").to_string())
            }
            _ => None,
        })
    }

    fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => lookup(key).as_deref() == Some(value),
            Requirement::NotEquals(key, value) => lookup(key).as_deref() != Some(value),
            Requirement::Exists(key) => lookup(key).is_some(),
            Requirement::Absent(key) => lookup(key).is_none(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn equality_and_existence() {
        let object = json!({"metadata": {"name": "a", "labels": {"app": "q", "tier": "x"}}});
        let matches = |text: &str| Selector::parse(text).unwrap().matches_labels(&object);
        assert!(matches(""));
        assert!(matches("app=q,tier==x"));
        assert!(matches("app,!missing"));
        assert!(!matches("app!=q"));
        assert!(!matches("app=other"));
        assert!(Selector::parse("app in (a,b)").is_err());
        let fields = Selector::parse("metadata.name=a").unwrap();
        assert!(fields.matches_fields(&object));
    }
}
