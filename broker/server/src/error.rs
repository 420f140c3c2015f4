//! The broker's error type.

use std::path::PathBuf;

use crate::config::ConfigError;

/// Errors that stop the broker or fail a request.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("store operation `{op}` failed")]
    Store {
        op: &'static str,
        #[source]
        source: quiver_store::StoreError,
    },
    #[error("cannot persist {path}")]
    Persist {
        path: PathBuf,
        #[source]
        source: quiver_store::StoreError,
    },
    #[error("I/O error while {context}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("a blocking store task panicked or was cancelled")]
    Blocking(#[source] tokio::task::JoinError),
}

impl BrokerError {
    pub(crate) fn store(op: &'static str) -> impl FnOnce(quiver_store::StoreError) -> BrokerError {
        move |source| BrokerError::Store { op, source }
    }
}

/// An error and its sources on one line, for logs and remarks.
pub fn chain(error: &dyn std::error::Error) -> String {
    quiver_store::error_chain(error)
}

/// Logs a failure that repeats every round (a full disk) when it starts, changes and ends,
/// not every round.
#[derive(Debug, Default)]
pub struct FailureLog {
    last: Option<String>,
}

impl FailureLog {
    /// Records one round of `what`: `None` when it worked, else the error's text.
    pub fn record(&mut self, what: &str, failure: Option<String>) {
        if failure == self.last {
            return;
        }
        match &failure {
            Some(error) => tracing::error!(%error, "{what} failed"),
            None => tracing::info!("{what} works again"),
        }
        self.last = failure;
    }
}
