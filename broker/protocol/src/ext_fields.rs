//! A command's custom header fields (extFields): few short pairs, read once or twice each.
//!
//! The text of every key and value sits in one string and the pairs are ranges into it, so a
//! decoded header costs two allocations instead of two per field, and a lookup compares a
//! handful of short keys instead of hashing. A send's header held as a map of strings was the
//! largest single cost of a small send (a sixth of the broker's CPU, BENCHMARKS.md).

use std::fmt;
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};

/// extFields in arrival (or insertion) order; one value per key, a later insert replaces it
/// (a replaced or removed field's text stays in the string until the map is dropped: commands
/// live for one request).
#[derive(Default)]
pub struct ExtFields {
    text: String,
    pairs: Vec<(Range<u32>, Range<u32>)>,
    /// A bit per key held ([`key_bit`]; removals leave theirs): most absent keys are known
    /// absent without a comparison.
    key_bits: u64,
    /// Where the next lookup starts: after the last one found. Headers are read in the order
    /// they are written, so a typed header's reads find each field at the first comparison.
    next_lookup: AtomicU32,
}

/// A key's bit in `key_bits`, from its length and its first and last bytes.
fn key_bit(key: &str) -> u64 {
    let bytes = key.as_bytes();
    let (first, last) = (bytes.first().copied(), bytes.last().copied());
    let mixed =
        bytes.len() * 7 + usize::from(first.unwrap_or(0)) + 3 * usize::from(last.unwrap_or(0));
    1 << (mixed % 64)
}

impl Clone for ExtFields {
    fn clone(&self) -> Self {
        ExtFields {
            text: self.text.clone(),
            pairs: self.pairs.clone(),
            key_bits: self.key_bits,
            next_lookup: AtomicU32::new(0),
        }
    }
}

impl ExtFields {
    pub fn new() -> Self {
        Self::default()
    }

    /// Room for `pairs` fields of about a dozen bytes each.
    pub fn with_capacity(pairs: usize) -> Self {
        Self::sized(pairs, pairs * 16)
    }

    /// Room for `pairs` fields holding `text_bytes` of keys and values together.
    pub(crate) fn sized(pairs: usize, text_bytes: usize) -> Self {
        ExtFields {
            text: String::with_capacity(text_bytes),
            pairs: Vec::with_capacity(pairs),
            ..ExtFields::default()
        }
    }

    /// Sets `key` to `value`, replacing an earlier value of the same key.
    pub fn insert(&mut self, key: impl AsRef<str>, value: impl AsRef<str>) {
        let (key, value) = (key.as_ref(), value.as_ref());
        if let Some(at) = self.position(key) {
            self.pairs.remove(at);
        }
        self.push(key, value);
    }

    /// Appends a decoded field; a key repeated in one header keeps its last value, as a map
    /// would.
    pub(crate) fn push_decoded(&mut self, key: &str, value: &str) {
        match self.position(key) {
            Some(at) => {
                self.pairs.remove(at);
                self.push(key, value);
            }
            None => self.push(key, value),
        }
    }

    /// Appends a field whose key is not there: a typed header's fields are distinct.
    pub(crate) fn push_distinct(&mut self, key: &str, value: &str) {
        debug_assert!(!self.contains_key(key), "{key} set twice");
        self.push(key, value);
    }

    fn push(&mut self, key: &str, value: &str) {
        self.key_bits |= key_bit(key);
        let key = self.append_text(key);
        let value = self.append_text(value);
        self.pairs.push((key, value));
    }

    fn append_text(&mut self, part: &str) -> Range<u32> {
        let start = self.text.len();
        self.text.push_str(part);
        // A header is at most 16 MiB (a frame's length limit), far below u32.
        start as u32..self.text.len() as u32
    }

    fn slice(&self, range: &Range<u32>) -> &str {
        &self.text[range.start as usize..range.end as usize]
    }

    fn position(&self, key: &str) -> Option<usize> {
        if self.key_bits & key_bit(key) == 0 {
            return None;
        }
        let (text, wanted) = (self.text.as_bytes(), key.as_bytes());
        let matches = |(stored, _): &(Range<u32>, Range<u32>)| {
            stored.len() == wanted.len()
                && &text[stored.start as usize..stored.end as usize] == wanted
        };
        // Keys are distinct, so where the search starts changes only how soon it ends.
        let start = (self.next_lookup.load(Ordering::Relaxed) as usize).min(self.pairs.len());
        let found = match self.pairs[start..].iter().position(matches) {
            Some(at) => start + at,
            None => self.pairs[..start].iter().position(matches)?,
        };
        self.next_lookup.store(found as u32 + 1, Ordering::Relaxed);
        Some(found)
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.position(key).map(|at| self.slice(&self.pairs[at].1))
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.position(key).is_some()
    }

    /// Takes `key` out, returning its value.
    pub fn remove(&mut self, key: &str) -> Option<String> {
        let at = self.position(key)?;
        let (_, value) = self.pairs.remove(at);
        Some(self.slice(&value).to_owned())
    }

    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }

    /// The fields as (key, value), in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            text: &self.text,
            pairs: self.pairs.iter(),
        }
    }

    /// The fields' bytes, in order: for the binary encoder, which needs no `str`.
    pub(crate) fn iter_bytes(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let bytes = self.text.as_bytes();
        let slice = |range: &Range<u32>| &bytes[range.start as usize..range.end as usize];
        self.pairs
            .iter()
            .map(move |(key, value)| (slice(key), slice(value)))
    }

    pub fn keys(&self) -> impl Iterator<Item = &str> + '_ {
        self.iter().map(|(key, _)| key)
    }
}

impl<K: AsRef<str>, V: AsRef<str>> Extend<(K, V)> for ExtFields {
    fn extend<I: IntoIterator<Item = (K, V)>>(&mut self, fields: I) {
        for (key, value) in fields {
            self.insert(key, value);
        }
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for ExtFields {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(fields: I) -> Self {
        let mut ext = ExtFields::new();
        ext.extend(fields);
        ext
    }
}

/// The fields of an [`ExtFields`] as (key, value), in order.
pub struct Iter<'a> {
    text: &'a str,
    pairs: std::slice::Iter<'a, (Range<u32>, Range<u32>)>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let (key, value) = self.pairs.next()?;
        let slice = |range: &Range<u32>| &self.text[range.start as usize..range.end as usize];
        Some((slice(key), slice(value)))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.pairs.size_hint()
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a ExtFields {
    type Item = (&'a str, &'a str);
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for ExtFields {
    type Item = (String, String);
    type IntoIter = std::vec::IntoIter<(String, String)>;

    fn into_iter(self) -> Self::IntoIter {
        let owned: Vec<(String, String)> = self
            .iter()
            .map(|(key, value)| (key.to_owned(), value.to_owned()))
            .collect();
        owned.into_iter()
    }
}

/// Equal when they hold the same fields, whatever their order.
impl PartialEq for ExtFields {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && self
                .iter()
                .all(|(key, value)| other.get(key) == Some(value))
    }
}

impl Eq for ExtFields {}

impl fmt::Debug for ExtFields {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl serde::Serialize for ExtFields {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_replaces_and_keeps_the_others_in_order() {
        let mut ext = ExtFields::new();
        ext.insert("a", "1");
        ext.insert("b", "2");
        ext.insert("a", "3");
        assert_eq!(ext.get("a"), Some("3"));
        assert_eq!(ext.get("b"), Some("2"));
        assert_eq!(ext.len(), 2);
        assert_eq!(ext.keys().collect::<Vec<_>>(), ["b", "a"]);
        assert_eq!(ext.remove("b").as_deref(), Some("2"));
        assert!(!ext.contains_key("b"));
        assert_eq!(ext.get("missing"), None);
    }

    #[test]
    fn lookups_in_any_order_find_every_field_and_no_other() {
        let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
        let ext: ExtFields = keys
            .iter()
            .map(|key| (key.as_str(), key.as_str()))
            .collect();
        for key in keys.iter().rev().chain(&keys).step_by(3) {
            assert_eq!(ext.get(key), Some(key.as_str()));
        }
        for absent in ["", "k", "k40", "k1 ", "K1"] {
            assert_eq!(ext.get(absent), None, "{absent:?}");
        }
    }

    #[test]
    fn equality_ignores_order_and_a_decoded_repeat_keeps_the_last() {
        let forward: ExtFields = [("x", "1"), ("y", "2")].into_iter().collect();
        let backward: ExtFields = [("y", "2"), ("x", "1")].into_iter().collect();
        assert_eq!(forward, backward);
        let mut decoded = ExtFields::with_capacity(2);
        decoded.push_decoded("x", "old");
        decoded.push_decoded("y", "2");
        decoded.push_decoded("x", "1");
        assert_eq!(decoded, forward);
        assert_ne!(decoded, ExtFields::new());
        assert_eq!(
            serde_json::to_string(&forward).unwrap(),
            r#"{"x":"1","y":"2"}"#
        );
    }
}
