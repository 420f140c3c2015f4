//! `spec.security`'s Secrets: read each pass, their data hashed into the pod template (a change
//! rolls the pods), the admin account and the TLS trust taken out for the operator's own calls.
//! A Secret that is missing or lacks a key is a [`Problem`] naming it, never an error or a panic.

use super::broker::Problem;
use super::{Context, Error};
use crate::admin::BrokerAccess;
use crate::crd::{Broker, SecuritySpec, TlsClientAuth, TlsSpec};
use crate::desired::{self, ACCESS_KEY_KEY, SECRET_KEY_KEY, TLS_CA_KEY, TLS_CERT_KEY, TLS_KEY_KEY};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use quiver_client::TlsConfig;
use quiver_protocol::acl::Credentials;
use std::collections::BTreeMap;

/// Degraded reason: a Secret `spec.security` names is missing or lacks a key.
pub const REASON_SECRET: &str = "SecuritySecretUnavailable";

/// What the brokers' Secrets give this pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Resolved {
    /// Hash of the referenced Secrets' data; None when the spec names no Secret.
    pub hash: Option<String>,
    /// How the operator's admin calls reach the brokers: signed with the admin account, over
    /// TLS trusting the TLS Secret's CA.
    pub access: BrokerAccess,
}

/// Found Secrets: name and data.
type Found<'a> = [(&'a str, BTreeMap<String, Vec<u8>>)];

/// One Secret the spec names, and the keys it must hold.
struct Wanted<'a> {
    name: &'a str,
    field: &'static str,
    keys: Vec<&'a str>,
}

/// The Secrets of `security` in a fixed order (ACL, admin credentials, TLS).
fn wanted(security: &SecuritySpec) -> Vec<Wanted<'_>> {
    let mut wanted = Vec::new();
    if let Some(acl) = &security.acl {
        wanted.push(Wanted {
            name: &acl.secret_name,
            field: "spec.security.acl",
            keys: vec![acl.key.as_str()],
        });
    }
    if let Some(admin) = &security.admin_credentials {
        wanted.push(Wanted {
            name: &admin.secret_name,
            field: "spec.security.adminCredentials",
            keys: vec![ACCESS_KEY_KEY, SECRET_KEY_KEY],
        });
    }
    if let Some(tls) = &security.tls {
        // Without client certificates ca.crt may be absent (a public issuer's certificate):
        // the operator then trusts the public roots.
        let mut keys = vec![TLS_CERT_KEY, TLS_KEY_KEY];
        if tls.client_auth != TlsClientAuth::None {
            keys.push(TLS_CA_KEY);
        }
        wanted.push(Wanted {
            name: &tls.secret_name,
            field: "spec.security.tls",
            keys,
        });
    }
    wanted
}

/// Reads the Secrets of `broker.spec.security` in `namespace`. Err only when the API call
/// fails; a missing Secret or key is `Ok(Err(problem))`.
pub async fn resolve(
    broker: &Broker,
    namespace: &str,
    ctx: &Context,
) -> Result<Result<Resolved, Problem>, Error> {
    let Some(security) = &broker.spec.security else {
        return Ok(Ok(Resolved::default()));
    };
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    let mut found: Vec<(&str, BTreeMap<String, Vec<u8>>)> = Vec::new();
    for wanted in wanted(security) {
        let secret = secrets
            .get_opt(wanted.name)
            .await
            .map_err(Error::kube(format!("reading Secret {}", wanted.name)))?;
        let Some(secret) = secret else {
            let message = format!(
                "Secret {namespace}/{} named by {} does not exist",
                wanted.name, wanted.field
            );
            return Ok(Err(Problem::new(REASON_SECRET, message)));
        };
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| (key, value.0))
            .collect();
        if let Some(key) = wanted.keys.iter().find(|key| !data.contains_key(**key)) {
            let message = format!(
                "Secret {namespace}/{} named by {} has no key {key}",
                wanted.name, wanted.field
            );
            return Ok(Err(Problem::new(REASON_SECRET, message)));
        }
        found.push((wanted.name, data));
    }
    Ok(from_secrets(security, namespace, &found))
}

/// Makes the admin reach `broker`'s brokers with its access (account, TLS), for callers other
/// than the Broker's own reconcile (a ConsumerGroup's may run first after a restart). A Secret
/// problem keeps the access in use: the Broker's Degraded condition names it.
pub async fn use_broker_access(
    broker: &Broker,
    namespace: &str,
    ctx: &Context,
) -> Result<(), Error> {
    if let Ok(resolved) = resolve(broker, namespace, ctx).await? {
        let scope = desired::broker_scope(broker);
        ctx.admin.use_access(&scope, resolved.access);
    }
    Ok(())
}

/// The hash, the admin account and the TLS settings from the Secrets' data, in [`wanted`]'s
/// order.
fn from_secrets(
    security: &SecuritySpec,
    namespace: &str,
    found: &Found<'_>,
) -> Result<Resolved, Problem> {
    let hash = (!found.is_empty())
        .then(|| desired::security_hash(found.iter().map(|(name, data)| (*name, data))));
    let account = match &security.admin_credentials {
        None => None,
        Some(admin) => Some(admin_account(&admin.secret_name, namespace, found)?),
    };
    let tls = security.tls.as_ref().map(|tls| operator_tls(tls, found));
    Ok(Resolved {
        hash,
        access: BrokerAccess { account, tls },
    })
}

fn secret_data<'a>(found: &'a Found<'_>, name: &str) -> Option<&'a BTreeMap<String, Vec<u8>>> {
    found
        .iter()
        .find(|(found_name, _)| *found_name == name)
        .map(|(_, data)| data)
}

/// The account in the admin credentials Secret `name`.
fn admin_account(name: &str, namespace: &str, found: &Found<'_>) -> Result<Credentials, Problem> {
    let data = secret_data(found, name);
    let text = |key: &str| {
        data.and_then(|data| data.get(key))
            .and_then(|value| std::str::from_utf8(value).ok())
            .map(str::trim)
            .filter(|value| !value.is_empty())
    };
    match (text(ACCESS_KEY_KEY), text(SECRET_KEY_KEY)) {
        (Some(access_key), Some(secret_key)) => Ok(Credentials::new(access_key, secret_key)),
        _ => {
            let message = format!(
                "Secret {namespace}/{name} named by spec.security.adminCredentials needs \
                 non-empty UTF-8 {ACCESS_KEY_KEY} and {SECRET_KEY_KEY}"
            );
            Err(Problem::new(REASON_SECRET, message))
        }
    }
}

/// The operator's TLS to the brokers: trusting the Secret's ca.crt (the public roots without
/// one), verifying the dialled name, and presenting the brokers' own certificate only where
/// they require one.
fn operator_tls(tls: &TlsSpec, found: &Found<'_>) -> TlsConfig {
    let data = secret_data(found, &tls.secret_name);
    // An empty key counts as absent (some issuers write ca.crt empty).
    let pem = |key: &str| {
        data.and_then(|data| data.get(key))
            .filter(|pem| !pem.is_empty())
            .cloned()
    };
    let client_certificate = tls.client_auth == TlsClientAuth::Require;
    TlsConfig {
        ca_pem: pem(TLS_CA_KEY),
        cert_pem: pem(TLS_CERT_KEY).filter(|_| client_certificate),
        key_pem: pem(TLS_KEY_KEY).filter(|_| client_certificate),
        ..TlsConfig::default()
    }
}

/// Whether a Secret named `name` in `namespace` is one `broker` references.
pub fn references(broker: &Broker, namespace: &str, name: &str) -> bool {
    broker.metadata.namespace.as_deref() == Some(namespace)
        && broker
            .spec
            .security
            .as_ref()
            .is_some_and(|security| wanted(security).iter().any(|w| w.name == name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{AclSecret, SecretRef, TlsMode, TlsSpec};

    fn data(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        entries
            .iter()
            .map(|(key, value)| (key.to_string(), value.as_bytes().to_vec()))
            .collect()
    }

    fn security() -> SecuritySpec {
        SecuritySpec {
            acl: Some(AclSecret {
                secret_name: "acl".into(),
                key: "plain_acl.yml".into(),
            }),
            admin_credentials: Some(SecretRef {
                secret_name: "admin".into(),
            }),
            tls: Some(TlsSpec {
                secret_name: "tls".into(),
                mode: TlsMode::Enforcing,
                client_auth: TlsClientAuth::Require,
                http: false,
            }),
        }
    }

    #[test]
    fn the_wanted_keys_follow_the_spec() {
        let security = security();
        let keys: Vec<(&str, Vec<&str>)> = wanted(&security)
            .into_iter()
            .map(|w| (w.name, w.keys))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("acl", vec!["plain_acl.yml"]),
                ("admin", vec!["accessKey", "secretKey"]),
                ("tls", vec!["tls.crt", "tls.key", "ca.crt"]),
            ]
        );
    }

    #[test]
    fn the_admin_account_is_read_and_the_hash_follows_the_data() {
        let security = security();
        let admin = data(&[("accessKey", "operator1"), ("secretKey", "s3cret\n")]);
        let acl = data(&[("plain_acl.yml", "accounts: []")]);
        let resolved = from_secrets(
            &security,
            "ns",
            &[("acl", acl.clone()), ("admin", admin.clone())],
        )
        .expect("valid");
        let account = resolved.access.account.expect("account");
        assert_eq!(
            (account.access_key.as_str(), account.secret_key.as_str()),
            ("operator1", "s3cret")
        );
        let changed = data(&[("plain_acl.yml", "accounts: [x]")]);
        let other = from_secrets(&security, "ns", &[("acl", changed), ("admin", admin)]).unwrap();
        assert_ne!(resolved.hash, other.hash);
        assert_eq!(resolved.hash.as_ref().map(String::len), Some(40));
    }

    #[test]
    fn an_empty_secret_key_is_a_problem_naming_the_secret() {
        let admin = data(&[("accessKey", "operator1"), ("secretKey", "")]);
        let problem = from_secrets(&security(), "ns", &[("admin", admin)]).unwrap_err();
        assert_eq!(problem.reason, REASON_SECRET);
        assert!(problem.message.contains("ns/admin"), "{}", problem.message);
    }

    #[test]
    fn the_operator_trusts_the_tls_secrets_ca_and_presents_its_certificate_when_required() {
        let mut security = security();
        let tls_data = data(&[("tls.crt", "CERT"), ("tls.key", "KEY"), ("ca.crt", "CA")]);
        let admin = data(&[("accessKey", "operator1"), ("secretKey", "s3cret")]);
        let found = [("admin", admin), ("tls", tls_data)];
        let tls = from_secrets(&security, "ns", &found).unwrap().access.tls;
        let tls = tls.expect("TLS on");
        assert_eq!(tls.ca_pem.as_deref(), Some(&b"CA"[..]));
        assert_eq!(tls.cert_pem.as_deref(), Some(&b"CERT"[..]));
        assert_eq!(tls.key_pem.as_deref(), Some(&b"KEY"[..]));
        assert_eq!(tls.server_name, None, "the dialled pod name is verified");
        if let Some(spec) = security.tls.as_mut() {
            spec.client_auth = TlsClientAuth::Optional;
        }
        let tls = from_secrets(&security, "ns", &found).unwrap().access.tls;
        let tls = tls.expect("TLS on");
        assert_eq!((tls.cert_pem, tls.key_pem), (None, None));
        security.tls = None;
        let resolved = from_secrets(&security, "ns", &found[..1]).unwrap();
        assert_eq!(resolved.access.tls, None);
    }
}
