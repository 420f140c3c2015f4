//! Kubernetes' name and label validation (apimachinery's `util/validation`), as the API server
//! applies it to every object's metadata: `metadata.name` by kind, label keys and values.

use serde_json::Value;

/// Longest DNS-1123 and DNS-1035 label, and longest label value.
pub const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain.
pub const SUBDOMAIN_MAX: usize = 253;

fn is_alphanumeric(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters.
pub fn is_dns1123_label(text: &str) -> bool {
    text.len() <= LABEL_MAX
        && text.starts_with(is_alphanumeric)
        && text.ends_with(is_alphanumeric)
        && text.chars().all(|c| is_alphanumeric(c) || c == '-')
}

/// `[a-z]([-a-z0-9]*[a-z0-9])?`, at most 63 characters: Service names.
pub fn is_dns1035_label(text: &str) -> bool {
    is_dns1123_label(text) && text.starts_with(|c: char| c.is_ascii_lowercase())
}

/// DNS-1123 labels joined by dots, at most 253 characters: most object names.
pub fn is_dns1123_subdomain(text: &str) -> bool {
    text.len() <= SUBDOMAIN_MAX
        && text.split('.').all(|label| {
            !label.is_empty()
                && label.starts_with(is_alphanumeric)
                && label.ends_with(is_alphanumeric)
                && label.chars().all(|c| is_alphanumeric(c) || c == '-')
        })
}

/// Empty, or `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` of at most 63 characters.
pub fn is_label_value(text: &str) -> bool {
    let edge = |c: char| c.is_ascii_alphanumeric();
    text.is_empty()
        || (text.len() <= LABEL_MAX
            && text.starts_with(edge)
            && text.ends_with(edge)
            && text
                .chars()
                .all(|c| edge(c) || matches!(c, '-' | '_' | '.')))
}

/// A label key: an optional DNS-1123 subdomain prefix and `/`, then a name as a label value
/// (not empty).
pub fn is_label_key(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// Why the API server refuses `name` for an object of `kind`, worded as it does; None when it
/// takes it.
pub fn name_problem(kind: &str, name: &str) -> Option<String> {
    let (valid, rule) = match kind {
        "Service" => (is_dns1035_label(name), "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"),
        "StatefulSet" => (is_dns1123_label(name), "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"),
        _ => (is_dns1123_subdomain(name), "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"),
    };
    if valid {
        return None;
    }
    let max = if matches!(kind, "Service" | "StatefulSet") {
        LABEL_MAX
    } else {
        SUBDOMAIN_MAX
    };
    if name.len() > max {
        Some(format!("must be no more than {max} characters"))
    } else {
        Some(rule.to_string())
    }
}

/// Each invalid label of `labels` (a JSON object): its key and why, worded as the API server.
pub fn label_problems(labels: &Value) -> Vec<(String, String)> {
    let Some(labels) = labels.as_object() else {
        return Vec::new();
    };
    labels
        .iter()
        .filter_map(|(key, value)| {
            let value = value.as_str().unwrap_or_default();
            if !is_label_key(key) {
                Some((key.clone(), format!("Invalid value: \"{key}\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")))
            } else if value.len() > LABEL_MAX {
                Some((key.clone(), format!("Invalid value: \"{value}\": must be no more than {LABEL_MAX} characters")))
            } else if !is_label_value(value) {
                Some((key.clone(), format!("Invalid value: \"{value}\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character")))
            } else {
                None
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_names_follow_apimachinery() {
        assert!(is_dns1123_label(&"a".repeat(63)));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_label("7-up") && !is_dns1035_label("7-up"));
        assert!(!is_dns1123_label("a.b") && is_dns1123_subdomain("a.b"));
        assert!(!is_dns1123_subdomain("a..b") && !is_dns1123_subdomain("-a"));
        assert!(is_label_value("") && is_label_value("Qb_1.x") && !is_label_value("qb-"));
        assert!(!is_label_value(&"a".repeat(64)));
        assert!(is_label_key("app.kubernetes.io/name") && is_label_key("app"));
        assert!(!is_label_key("bad prefix/name") && !is_label_key("x/"));
    }

    #[test]
    fn names_are_checked_by_kind() {
        assert_eq!(name_problem("Service", "qb-headless"), None);
        assert!(name_problem("Service", "7qb").is_some());
        assert_eq!(name_problem("ConfigMap", "qb.config"), None);
        assert!(name_problem("StatefulSet", "qb.config").is_some());
        assert_eq!(
            name_problem("Service", &"q".repeat(64)).as_deref(),
            Some("must be no more than 63 characters")
        );
        let problems = label_problems(&serde_json::json!({"ok": "fine", "long": "v".repeat(64)}));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].0, "long");
    }
}
