//! ACL as RocketMQ 4.x clients speak it: every request's `AccessKey` and `Signature` are
//! checked against the accounts of a `plain_acl.yml` (Apache's format), then the
//! permissions its code needs ([`needs`]). The file is read again when it changes.

mod accounts;
mod address;
mod needs;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use quiver_protocol::code::request;
use quiver_protocol::{acl as signing, RemotingCommand};

pub use accounts::{Account, Accounts, Perm, Resource};
pub use address::AddressPattern;
pub use needs::{is_open_lookup, needs_admin};

use crate::config::ConfigError;

/// How often the file's metadata is looked at for a change.
/// A request the accounts do not allow, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Denied(pub String);

pub const RELOAD_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Why a request was refused: the `reason` label of `quiver_acl_refusals_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusedBecause {
    /// No `AccessKey` or no `Signature`.
    NoSignature,
    /// An `AccessKey` no account has.
    UnknownAccount,
    SignatureMismatch,
    /// An admin code from an account that is not admin.
    AdminRequired,
    /// A topic or group the account may not publish to or subscribe to.
    NoPermission,
}

impl RefusedBecause {
    pub const ALL: [RefusedBecause; 5] = [
        RefusedBecause::NoSignature,
        RefusedBecause::UnknownAccount,
        RefusedBecause::SignatureMismatch,
        RefusedBecause::AdminRequired,
        RefusedBecause::NoPermission,
    ];

    pub fn label(self) -> &'static str {
        match self {
            RefusedBecause::NoSignature => "no-signature",
            RefusedBecause::UnknownAccount => "unknown-account",
            RefusedBecause::SignatureMismatch => "signature-mismatch",
            RefusedBecause::AdminRequired => "admin-required",
            RefusedBecause::NoPermission => "no-permission",
        }
    }
}

/// What identifies one version of the file on disk.
pub(crate) type FileStamp = Option<(SystemTime, u64, u64)>;

/// The accounts in force, the file they came from and the counters of what was refused.
pub struct Acl {
    path: PathBuf,
    accounts: RwLock<Accounts>,
    stamp: Mutex<FileStamp>,
    refusals: [AtomicU64; RefusedBecause::ALL.len()],
    reloads: AtomicU64,
    reload_failures: AtomicU64,
}

impl Acl {
    /// Reads the file; a broker with ACL on does not start without a valid one. Blocking.
    pub fn load(path: &Path) -> Result<Acl, ConfigError> {
        let stamp = stamp_of(path);
        let accounts = read_accounts(path).map_err(|reason| ConfigError::Invalid {
            field: "acl-file",
            reason,
        })?;
        tracing::info!(path = %path.display(), accounts = accounts.len(), "ACL on");
        Ok(Acl {
            path: path.to_path_buf(),
            accounts: RwLock::new(accounts),
            stamp: Mutex::new(stamp),
            refusals: Default::default(),
            reloads: AtomicU64::new(0),
            reload_failures: AtomicU64::new(0),
        })
    }

    /// Lets `req` from `remote` through, or says why not and counts it.
    pub fn check(&self, req: &RemotingCommand, remote: IpAddr) -> Result<(), Denied> {
        let accounts = self.accounts.read();
        check(&accounts, req, remote).map_err(|(because, remark)| {
            self.refusals[because as usize].fetch_add(1, Ordering::Relaxed);
            Denied(remark)
        })
    }

    /// Whether a route lookup (answered to anyone, as Apache's name server does) may create
    /// the missing `topic`: only for a request that a send to the topic would pass.
    pub fn may_create_topic(&self, req: &RemotingCommand, remote: IpAddr, topic: &str) -> bool {
        let accounts = self.accounts.read();
        match authenticate(&accounts, req, remote) {
            Ok(Some(account)) => {
                let (resource, perm) = needs::sending_to(Some(topic));
                resource.is_none_or(|resource| account.allows(resource, perm))
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Reads the file again if it changed since last time; a file that does not parse keeps
    /// the accounts in force, is logged and counted. Blocking.
    pub fn reload_if_changed(&self) {
        let stamp = stamp_of(&self.path);
        {
            let mut last = self.stamp.lock();
            if *last == stamp {
                return;
            }
            *last = stamp;
        }
        match read_accounts(&self.path) {
            Ok(accounts) => {
                tracing::info!(path = %self.path.display(), accounts = accounts.len(), "ACL file reloaded");
                *self.accounts.write() = accounts;
                self.reloads.fetch_add(1, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::error!(path = %self.path.display(), %error, "ACL file not reloaded; the previous accounts stay in force");
                self.reload_failures.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// (reason, requests refused so far) for every reason.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        RefusedBecause::ALL
            .iter()
            .map(|&because| {
                let count = self.refusals[because as usize].load(Ordering::Relaxed);
                (because.label(), count)
            })
            .collect()
    }

    /// (reloads that took, reloads that failed) since start.
    pub fn reload_counts(&self) -> (u64, u64) {
        (
            self.reloads.load(Ordering::Relaxed),
            self.reload_failures.load(Ordering::Relaxed),
        )
    }

    pub fn account_count(&self) -> usize {
        self.accounts.read().len()
    }
}

fn read_accounts(path: &Path) -> Result<Accounts, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
    Accounts::parse(&text).map_err(|reason| format!("{}: {reason}", path.display()))
}

/// Modification time, length and inode: a rewrite or a swapped symlink (a mounted Kubernetes
/// Secret) changes one of them.
pub(crate) fn stamp_of(path: &Path) -> FileStamp {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len(), metadata.ino()))
}

type Refused = (RefusedBecause, String);

/// Characters of an unknown access key a remark quotes.
const SHOWN_KEY_CHARS: usize = 64;

/// Apache's order: the global white list, the account, its white address, the signature,
/// the admin flag, then each resource.
fn check(accounts: &Accounts, req: &RemotingCommand, remote: IpAddr) -> Result<(), Refused> {
    match authenticate(accounts, req, remote)? {
        Some(account) => authorize(account, req),
        None => Ok(()),
    }
}

/// The account that signed `req`; None when its address is white-listed (no signature
/// asked, every permission granted, as in Apache).
fn authenticate<'a>(
    accounts: &'a Accounts,
    req: &RemotingCommand,
    remote: IpAddr,
) -> Result<Option<&'a Account>, Refused> {
    if accounts.globally_white(remote) {
        return Ok(None);
    }
    let Some(access_key) = req.ext(signing::ACCESS_KEY) else {
        return Err((
            RefusedBecause::NoSignature,
            format!(
                "ACL: no signature: request code {} ({}) carries no AccessKey",
                req.code,
                code_name(req.code)
            ),
        ));
    };
    let Some(account) = accounts.get(access_key) else {
        // The key is the client's: a remark (and log line) quotes a bounded part of it.
        let shown: String = access_key.chars().take(SHOWN_KEY_CHARS).collect();
        return Err((
            RefusedBecause::UnknownAccount,
            format!("ACL: no account has access key \"{shown}\""),
        ));
    };
    if account.white_address.matches(remote) {
        return Ok(None);
    }
    if req.ext(signing::SIGNATURE).is_none() {
        return Err((
            RefusedBecause::NoSignature,
            format!("ACL: no signature: access key \"{access_key}\" sent no Signature"),
        ));
    }
    if !signing::verify(req, &account.secret_key) {
        return Err((
            RefusedBecause::SignatureMismatch,
            format!("ACL: signature mismatch for access key \"{access_key}\" (wrong secret key?)"),
        ));
    }
    Ok(Some(account))
}

/// Whether the account may run `req`'s code on what it names.
fn authorize(account: &Account, req: &RemotingCommand) -> Result<(), Refused> {
    let access_key = &account.access_key;
    if needs_admin(req.code) && !account.admin {
        return Err((
            RefusedBecause::AdminRequired,
            format!(
                "ACL: request code {} ({}) needs an admin account; access key \"{access_key}\" is not admin",
                req.code,
                code_name(req.code)
            ),
        ));
    }
    needs::each_need(req, |resource, perm| {
        if account.allows(resource, perm) {
            return Ok(());
        }
        Err((
            RefusedBecause::NoPermission,
            format!(
                "ACL: access key \"{access_key}\" has no {} permission on {resource}",
                perm.name()
            ),
        ))
    })
}

/// A 5.x client's credentials: the `authorization` header's `Credential` and `Signature`,
/// and the `x-mq-date-time` header they sign.
#[derive(Clone, Copy, Debug)]
pub struct GrpcCredentials<'a> {
    pub access_key: &'a str,
    /// Hex of HMAC-SHA1(secret key, date time), either case.
    pub signature: &'a str,
    pub date_time: &'a str,
}

impl Acl {
    /// A gRPC call from `remote` needing `needs`, checked in the remoting port's order
    /// (global white list, account, its white address, signature, each resource) against
    /// the same accounts; a refusal is counted under the same reasons.
    pub fn check_grpc(
        &self,
        credentials: Option<GrpcCredentials<'_>>,
        remote: IpAddr,
        needs: &[(Resource<'_>, Perm)],
    ) -> Result<(), (RefusedBecause, String)> {
        let checked = self.judge_grpc(credentials, remote, needs);
        if let Err((because, _)) = &checked {
            self.refusals[*because as usize].fetch_add(1, Ordering::Relaxed);
        }
        checked
    }

    /// Whether a gRPC call could do `needs`, without counting a refusal (a route query asks
    /// whether it may create the topic, and is answered either way).
    pub fn allows_grpc(
        &self,
        credentials: Option<GrpcCredentials<'_>>,
        remote: IpAddr,
        needs: &[(Resource<'_>, Perm)],
    ) -> bool {
        self.judge_grpc(credentials, remote, needs).is_ok()
    }

    fn judge_grpc(
        &self,
        credentials: Option<GrpcCredentials<'_>>,
        remote: IpAddr,
        needs: &[(Resource<'_>, Perm)],
    ) -> Result<(), (RefusedBecause, String)> {
        let accounts = self.accounts.read();
        authenticate_grpc(&accounts, credentials, remote).and_then(|account| {
            let Some(account) = account else {
                return Ok(());
            };
            for (resource, perm) in needs {
                if !account.allows(*resource, *perm) {
                    return Err((
                        RefusedBecause::NoPermission,
                        format!(
                            "ACL: access key \"{}\" has no {} permission on {resource}",
                            account.access_key,
                            perm.name()
                        ),
                    ));
                }
            }
            Ok(())
        })
    }
}

/// The account that signed a gRPC call; None when its address is white-listed.
fn authenticate_grpc<'a>(
    accounts: &'a Accounts,
    credentials: Option<GrpcCredentials<'_>>,
    remote: IpAddr,
) -> Result<Option<&'a Account>, Refused> {
    if accounts.globally_white(remote) {
        return Ok(None);
    }
    let Some(credentials) = credentials else {
        return Err((
            RefusedBecause::NoSignature,
            "ACL: no signature: the call carries no authorization header".to_owned(),
        ));
    };
    let Some(account) = accounts.get(credentials.access_key) else {
        let shown: String = credentials
            .access_key
            .chars()
            .take(SHOWN_KEY_CHARS)
            .collect();
        return Err((
            RefusedBecause::UnknownAccount,
            format!("ACL: no account has access key \"{shown}\""),
        ));
    };
    if account.white_address.matches(remote) {
        return Ok(None);
    }
    let expected = grpc_signature(&account.secret_key, credentials.date_time);
    if !expected.eq_ignore_ascii_case(credentials.signature) {
        return Err((
            RefusedBecause::SignatureMismatch,
            format!(
                "ACL: signature mismatch for access key \"{}\" (wrong secret key?)",
                credentials.access_key
            ),
        ));
    }
    Ok(Some(account))
}

/// Hex of HMAC-SHA1(secret key, date time): what 5.x clients put in `Signature=`.
pub fn grpc_signature(secret_key: &str, date_time: &str) -> String {
    use hmac::Mac as _;
    let mut mac = hmac::Hmac::<sha1::Sha1>::new_from_slice(secret_key.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(date_time.as_bytes());
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|byte| format!("{byte:02X}"))
        .collect()
}

fn code_name(code: i32) -> &'static str {
    request::name(code).unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests;
