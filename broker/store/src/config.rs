//! Store configuration: a serde struct with documented defaults and `validate()`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// When an acknowledged append is durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    /// Acknowledge once in memory; a background thread flushes by interval or dirty pages.
    #[default]
    Async,
    /// Acknowledge only once fsynced; concurrent writers share one fsync (group commit).
    Sync,
}

impl FlushMode {
    /// The name in flags, config files and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            FlushMode::Async => "async",
            FlushMode::Sync => "sync",
        }
    }
}

impl std::fmt::Display for FlushMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FlushMode {
    type Err = String;

    fn from_str(name: &str) -> Result<FlushMode, String> {
        match name {
            "async" => Ok(FlushMode::Async),
            "sync" => Ok(FlushMode::Sync),
            other => Err(format!("`{other}` is not a flush mode: async or sync")),
        }
    }
}

/// Smallest accepted CommitLog segment: room for a maximal header plus some body.
pub const MIN_SEGMENT_SIZE_BYTES: u64 = 64 * 1024;

/// Configuration of a [`crate::MessageStore`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", default)]
pub struct StoreConfig {
    /// Root of `commitlog/`, `consumequeue/` and `checkpoint`. Default `./data`.
    pub data_dir: PathBuf,
    /// Size of each CommitLog segment file. Default 1 GiB; at least 64 KiB.
    pub segment_size_bytes: u64,
    /// 20-byte units per ConsumeQueue file. Default 300,000; at least 1.
    pub consume_queue_units_per_file: u64,
    /// Durability of an acknowledged append. Default `async`.
    pub flush_mode: FlushMode,
    /// Async mode: how often the flusher wakes. Default 500 ms; at least 1.
    pub flush_interval_ms: u64,
    /// Async mode: dirty 4 KiB pages that trigger a flush on a wake-up. Default 4.
    pub flush_least_pages: u64,
    /// Retention: CommitLog files older than this are deleted. Default 72 hours.
    pub file_reserved_hours: u64,
    /// Above this used/total ratio of the data file system, sends are refused (reads, offset
    /// commits and admin reads keep working) until usage drops. Default 0.90; in (0, 1].
    pub disk_high_water_ratio: f64,
    /// Retention: above this ratio, CommitLog files are deleted before `file_reserved_hours`,
    /// oldest first, but only those no subscribed group still has to read. Default 0.75.
    pub disk_clean_ratio: f64,
    /// Retention: above this ratio, the oldest CommitLog file is deleted even if a group has
    /// not read it yet (logged and counted). Default 0.85; at least `disk_clean_ratio`.
    pub disk_force_clean_ratio: f64,
    /// How often the data file system's usage is read to refuse or resume writes. Default
    /// 1000 ms; at least 10.
    pub disk_check_interval_ms: u64,
    /// Largest accepted encoded record. Default 4 MiB; at most half a segment.
    pub max_message_size_bytes: u32,
    /// Sync mode only: each CommitLog segment is zero-filled and fsynced before it takes
    /// writes (the next one in the background), so group-commit fsyncs write data only and
    /// never wait on block allocation. Costs one extra sequential write of each segment and
    /// up to one extra segment of disk. Default `false`: on the virtio disk we measure on,
    /// the extra writes slowed fsyncs more than skipping block allocation saved (docs/ARCHITECTURE.md, measured).
    /// Ignored in `async` mode.
    pub warm_segments: bool,
    /// Hash slots per message index file (`index/`): 4 bytes each, zero-filled when a file
    /// starts. Default 500,000 (2 MB); at least 1. Applies to files created afterwards.
    pub index_slots_per_file: u32,
    /// Entries per message index file: 32 bytes each, one per key and one per unique key of
    /// a message. Default 2,000,000 (64 MB); at least 1, at most 100,000,000. Applies to
    /// files created afterwards.
    pub index_entries_per_file: u32,
    /// Replicated broker groups: ConsumeQueue units (so `get`, `max_offset` and the dispatch
    /// hook) become visible only once `MessageStore::confirm` covers their records, so
    /// consumers never read a message a new master could truncate away. CommitLog bytes are
    /// still published at append (replicas read them). Default `false`: visible at append.
    pub publish_on_confirm: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            data_dir: PathBuf::from("./data"),
            segment_size_bytes: 1024 * 1024 * 1024,
            consume_queue_units_per_file: 300_000,
            flush_mode: FlushMode::Async,
            flush_interval_ms: 500,
            flush_least_pages: 4,
            file_reserved_hours: 72,
            disk_high_water_ratio: 0.90,
            disk_clean_ratio: 0.75,
            disk_force_clean_ratio: 0.85,
            disk_check_interval_ms: 1000,
            max_message_size_bytes: 4 * 1024 * 1024,
            warm_segments: false,
            index_slots_per_file: 500_000,
            index_entries_per_file: 2_000_000,
            publish_on_confirm: false,
        }
    }
}

/// A configuration value out of its bounds, naming the field.
#[derive(Debug, thiserror::Error)]
#[error("invalid store config `{field}`: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

impl StoreConfig {
    /// Whether CommitLog segments are zero-filled before use: `warm_segments` in Sync mode.
    pub(crate) fn warms_segments(&self) -> bool {
        self.warm_segments && self.flush_mode == FlushMode::Sync
    }

    /// Checks every bound; the error names the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |field, reason: String| Err(ConfigError { field, reason });
        if self.data_dir.as_os_str().is_empty() {
            return bad("data-dir", "must not be empty".into());
        }
        if self.segment_size_bytes < MIN_SEGMENT_SIZE_BYTES {
            return bad(
                "segment-size-bytes",
                format!(
                    "{} is below the minimum {MIN_SEGMENT_SIZE_BYTES}",
                    self.segment_size_bytes
                ),
            );
        }
        if self.segment_size_bytes > i32::MAX as u64 {
            // The blank filler stores the remaining length as an i32.
            return bad(
                "segment-size-bytes",
                format!(
                    "{} is above the maximum {}",
                    self.segment_size_bytes,
                    i32::MAX
                ),
            );
        }
        if self.consume_queue_units_per_file == 0 {
            return bad("consume-queue-units-per-file", "must be at least 1".into());
        }
        if self.flush_interval_ms == 0 {
            return bad("flush-interval-ms", "must be at least 1".into());
        }
        for (field, ratio) in [
            ("disk-high-water-ratio", self.disk_high_water_ratio),
            ("disk-clean-ratio", self.disk_clean_ratio),
            ("disk-force-clean-ratio", self.disk_force_clean_ratio),
        ] {
            if !(ratio > 0.0 && ratio <= 1.0) {
                return bad(field, format!("{ratio} is not in (0, 1]"));
            }
        }
        if self.disk_force_clean_ratio < self.disk_clean_ratio {
            return bad(
                "disk-force-clean-ratio",
                format!(
                    "{} is below disk-clean-ratio {}",
                    self.disk_force_clean_ratio, self.disk_clean_ratio
                ),
            );
        }
        if self.disk_check_interval_ms < 10 {
            return bad("disk-check-interval-ms", "must be at least 10".into());
        }
        if self.index_slots_per_file == 0 || self.index_slots_per_file > 100_000_000 {
            return bad(
                "index-slots-per-file",
                format!("{} is not in [1, 100000000]", self.index_slots_per_file),
            );
        }
        if self.index_entries_per_file == 0 || self.index_entries_per_file > 100_000_000 {
            return bad(
                "index-entries-per-file",
                format!("{} is not in [1, 100000000]", self.index_entries_per_file),
            );
        }
        if self.max_message_size_bytes < 128 {
            return bad("max-message-size-bytes", "must be at least 128".into());
        }
        if u64::from(self.max_message_size_bytes) > self.segment_size_bytes / 2 {
            return bad(
                "max-message-size-bytes",
                format!(
                    "{} is above half the segment size {}",
                    self.max_message_size_bytes, self.segment_size_bytes
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_kebab_case() {
        StoreConfig::default().validate().unwrap();
        let json = serde_json::to_value(StoreConfig::default()).unwrap();
        assert_eq!(json["segment-size-bytes"], 1024 * 1024 * 1024);
        assert_eq!(json["flush-mode"], "async");
        let parsed: StoreConfig = serde_json::from_str(r#"{"flush-mode":"sync"}"#).unwrap();
        assert_eq!(parsed.flush_mode, FlushMode::Sync);
        assert_eq!(parsed.flush_interval_ms, 500);
        assert!(!parsed.warm_segments);
        assert!(!parsed.warms_segments());
        assert_eq!(json["warm-segments"], false);
        let parsed: StoreConfig =
            serde_json::from_str(r#"{"flush-mode":"sync","warm-segments":true}"#).unwrap();
        assert!(parsed.warms_segments());
        assert!(!StoreConfig::default().warms_segments());
    }

    #[test]
    fn validate_names_the_bad_field() {
        let config = StoreConfig {
            segment_size_bytes: 1024,
            ..StoreConfig::default()
        };
        assert_eq!(config.validate().unwrap_err().field, "segment-size-bytes");
        let config = StoreConfig {
            disk_high_water_ratio: 1.5,
            ..StoreConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "disk-high-water-ratio"
        );
        let config = StoreConfig {
            disk_clean_ratio: 0.9,
            disk_force_clean_ratio: 0.8,
            ..StoreConfig::default()
        };
        assert_eq!(
            config.validate().unwrap_err().field,
            "disk-force-clean-ratio"
        );
    }
}
