//! The bounds of every broker setting: [`BrokerConfig::validate`] names the first bad field.

use quiver_protocol::body::perm;
use quiver_store::MIN_SEGMENT_SIZE_BYTES;

use super::{defaults, invalid, is_host_port, BrokerConfig, ClientAuth, ConfigError, TlsMode};

const MAX_MESSAGE_SIZE_LIMIT_BYTES: u32 = 15 * 1024 * 1024;

impl BrokerConfig {
    /// Checks every bound; the error names the first bad field.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_addresses()?;
        self.validate_sizes()?;
        self.validate_limits()?;
        // The disk settings are the store's: its check names the field at fault.
        self.store_config()
            .validate()
            .map_err(|error| invalid(error.field, error.reason))?;
        if self.shutdown_timeout_ms < 100 {
            return Err(invalid("shutdown-timeout-ms", "must be at least 100"));
        }
        self.validate_security()?;
        self.validate_tls()?;
        self.validate_transactions()?;
        self.validate_replication()?;
        Ok(())
    }

    /// The ACL file and the credentials for peers.
    fn validate_security(&self) -> Result<(), ConfigError> {
        if self
            .acl_file
            .as_ref()
            .is_some_and(|path| path.as_os_str().is_empty())
        {
            return Err(invalid("acl-file", "must not be empty"));
        }
        if self.peer_access_key.is_some() != self.peer_secret_key.is_some() {
            return Err(invalid(
                "peer-access-key",
                "peer-access-key and peer-secret-key go together",
            ));
        }
        Ok(())
    }

    /// TLS needs a certificate and key; client certificates need a CA.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        let files = [
            ("tls-cert-file", &self.tls_cert_file),
            ("tls-key-file", &self.tls_key_file),
            ("tls-ca-file", &self.tls_ca_file),
        ];
        for (field, path) in files {
            if path
                .as_ref()
                .is_some_and(|path| path.as_os_str().is_empty())
            {
                return Err(invalid(field, "must not be empty"));
            }
        }
        let serves_tls = self.tls_mode != TlsMode::Disabled || self.http_tls;
        let why = if self.http_tls {
            "http-tls"
        } else {
            "tls-mode"
        };
        if serves_tls && self.tls_cert_file.is_none() {
            return Err(invalid(
                "tls-cert-file",
                format!("{why} needs --tls-cert-file"),
            ));
        }
        if serves_tls && self.tls_key_file.is_none() {
            return Err(invalid(
                "tls-key-file",
                format!("{why} needs --tls-key-file"),
            ));
        }
        if self.tls_client_auth != ClientAuth::None {
            if self.tls_mode == TlsMode::Disabled {
                return Err(invalid(
                    "tls-client-auth",
                    "needs --tls-mode permissive or enforcing",
                ));
            }
            if self.tls_ca_file.is_none() {
                return Err(invalid(
                    "tls-ca-file",
                    "tls-client-auth needs --tls-ca-file",
                ));
            }
        }
        Ok(())
    }

    /// The check-back service's bounds.
    fn validate_transactions(&self) -> Result<(), ConfigError> {
        if self.transaction_timeout_ms < 100 {
            return Err(invalid("transaction-timeout-ms", "must be at least 100"));
        }
        if self.transaction_check_max == 0 {
            return Err(invalid("transaction-check-max", "must be at least 1"));
        }
        if self.transaction_check_interval_ms < 10 {
            return Err(invalid(
                "transaction-check-interval-ms",
                "must be at least 10",
            ));
        }
        Ok(())
    }

    /// The data directory, addresses and names.
    fn validate_addresses(&self) -> Result<(), ConfigError> {
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data-dir", "must not be empty"));
        }
        let addresses = [("listen", &self.listen), ("http-listen", &self.http_listen)]
            .into_iter()
            .chain(
                self.advertise
                    .iter()
                    .map(|advertise| ("advertise", advertise)),
            )
            .chain(self.grpc_listen().map(|listen| ("grpc-listen", listen)))
            .chain(
                self.grpc_advertise
                    .iter()
                    .map(|advertise| ("grpc-advertise", advertise)),
            )
            .chain(self.peers.iter().map(|peer| ("peers", peer)));
        for (field, value) in addresses {
            if !is_host_port(value) {
                return Err(invalid(field, format!("`{value}` is not host:port")));
            }
        }
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 127
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        };
        if !name_ok(&self.broker_name) {
            return Err(invalid("broker-name", "1..=127 chars of [A-Za-z0-9_.-]"));
        }
        if !name_ok(&self.cluster) {
            return Err(invalid("cluster", "1..=127 chars of [A-Za-z0-9_.-]"));
        }
        Ok(())
    }

    /// Segment, message and queue sizes, and the permission.
    fn validate_sizes(&self) -> Result<(), ConfigError> {
        if self.segment_size < MIN_SEGMENT_SIZE_BYTES {
            return Err(invalid("segment-size", "must be at least 65536 bytes"));
        }
        if u64::from(self.max_message_size) > self.segment_size / 2 {
            return Err(invalid(
                "max-message-size",
                format!(
                    "must be at most half of segment-size ({})",
                    self.segment_size / 2
                ),
            ));
        }
        if !(1..=1024).contains(&self.default_queue_nums) {
            return Err(invalid("default-queue-nums", "must be in 1..=1024"));
        }
        if self.max_message_size == 0 || self.max_message_size > MAX_MESSAGE_SIZE_LIMIT_BYTES {
            return Err(invalid("max-message-size", "must be in 1..=15728640"));
        }
        if !(1_000..=31_536_000_000).contains(&self.timer_max_delay_ms) {
            return Err(invalid(
                "timer-max-delay-ms",
                "must be in 1000..=31536000000",
            ));
        }
        if !perm::is_broker_permission(self.broker_permission) {
            return Err(invalid(
                "broker-permission",
                "must be 6 (read-write), 4 (read-only) or 2 (write-only)",
            ));
        }
        Ok(())
    }

    /// Connection, in-flight and timing bounds.
    fn validate_limits(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            ("max-connections", self.max_connections),
            (
                "max-connections-per-address",
                self.max_connections_per_address,
            ),
            ("max-parked-pulls", self.max_parked_pulls),
            (
                "max-parked-pulls-per-connection",
                self.max_parked_pulls_per_connection,
            ),
            (
                "max-inflight-per-connection",
                self.max_inflight_per_connection,
            ),
        ];
        if let Some((field, _)) = at_least_one.iter().find(|(_, value)| *value == 0) {
            return Err(invalid(field, "must be at least 1"));
        }
        let byte_budgets = [
            (
                "max-inflight-bytes",
                self.max_inflight_bytes,
                quiver_protocol::MAX_FRAME_BYTES,
            ),
            (
                "max-inflight-bytes-per-connection",
                self.max_inflight_bytes_per_connection,
                defaults::MIN_INFLIGHT_BYTES_PER_CONNECTION,
            ),
        ];
        for (field, bytes, least) in byte_budgets {
            if !(least..=u32::MAX as usize).contains(&bytes) {
                return Err(invalid(field, format!("must be in {least}..=4294967295")));
            }
        }
        if self.client_expiry_ms < 1000 {
            return Err(invalid("client-expiry-ms", "must be at least 1000"));
        }
        if (1..1000).contains(&self.idle_connection_timeout_ms) {
            return Err(invalid(
                "idle-connection-timeout-ms",
                "must be 0 (never) or at least 1000",
            ));
        }
        if (1..100).contains(&self.frame_read_timeout_ms) {
            return Err(invalid(
                "frame-read-timeout-ms",
                "must be 0 (no bound) or at least 100",
            ));
        }
        if self.persist_interval_ms < 100 {
            return Err(invalid("persist-interval-ms", "must be at least 100"));
        }
        if !(0..=64).contains(&self.max_reconsume_times) {
            return Err(invalid("max-reconsume-times", "must be in 0..=64"));
        }
        if self.file_reserved_hours == 0 {
            return Err(invalid("file-reserved-hours", "must be at least 1"));
        }
        Ok(())
    }

    fn validate_replication(&self) -> Result<(), ConfigError> {
        let members = self.members()?;
        let replicas = members.len().max(1) as u32;
        if !members.is_empty() && !members.contains_key(&self.replica_id) {
            return Err(invalid(
                "replica-id",
                format!("{} is not one of --group-members", self.replica_id),
            ));
        }
        if self.min_in_sync_replicas == 0 || self.min_in_sync_replicas > replicas {
            return Err(invalid(
                "min-in-sync-replicas",
                format!("must be in 1..={replicas} (the group's members)"),
            ));
        }
        if self.replica_lag_max_ms < 100 || self.master_timeout_ms < 100 {
            return Err(invalid(
                "master-timeout-ms",
                "master-timeout-ms and replica-lag-max-ms must be at least 100",
            ));
        }
        if self.replication_timeout_ms < 100 {
            return Err(invalid("replication-timeout-ms", "must be at least 100"));
        }
        if (1..100).contains(&self.shutdown_switchover_timeout_ms) {
            return Err(invalid(
                "shutdown-switchover-timeout-ms",
                "must be 0 (no handover) or at least 100",
            ));
        }
        Ok(())
    }
}
