//! `plain_acl.yml` in Apache's format, read into accounts and their permissions.

use std::collections::HashMap;
use std::net::IpAddr;

use serde::Deserialize;

use super::address::AddressPattern;

/// Apache's `Permission` bits: DENY wins; a needed PUB or SUB is granted by its bit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Perm(u8);

impl Perm {
    pub const DENY: Perm = Perm(1);
    pub const PUB: Perm = Perm(1 << 2);
    pub const SUB: Perm = Perm(1 << 3);

    /// DENY, PUB, SUB, PUB|SUB (or SUB|PUB), as the file writes them.
    pub fn parse(text: &str) -> Result<Perm, String> {
        match text.trim() {
            "DENY" => Ok(Perm::DENY),
            "PUB" => Ok(Perm::PUB),
            "SUB" => Ok(Perm::SUB),
            "PUB|SUB" | "SUB|PUB" => Ok(Perm(Perm::PUB.0 | Perm::SUB.0)),
            other => Err(format!(
                "`{other}` is not a permission (DENY, PUB, SUB or PUB|SUB)"
            )),
        }
    }

    /// Whether this owned permission grants `needed` (PUB or SUB).
    pub fn grants(self, needed: Perm) -> bool {
        self.0 & Perm::DENY.0 == 0 && self.0 & needed.0 != 0
    }

    /// "PUB" or "SUB", for remarks.
    pub fn name(self) -> &'static str {
        match self {
            Perm::PUB => "PUB",
            Perm::SUB => "SUB",
            Perm::DENY => "DENY",
            _ => "PUB|SUB",
        }
    }
}

/// What a request touches: a topic, or a consumer group (Apache's `%RETRY%<group>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource<'a> {
    Topic(&'a str),
    Group(&'a str),
}

/// The retry-topic prefix Apache names groups by.
const RETRY_PREFIX: &str = "%RETRY%";

impl<'a> Resource<'a> {
    /// A topic as a request names it: `%RETRY%<group>` is that group.
    pub fn topic(name: &'a str) -> Resource<'a> {
        match name.strip_prefix(RETRY_PREFIX) {
            Some(group) => Resource::Group(group),
            None => Resource::Topic(name),
        }
    }

    /// A group as a request names it (its retry-topic form too).
    pub fn group(name: &'a str) -> Resource<'a> {
        Resource::Group(name.strip_prefix(RETRY_PREFIX).unwrap_or(name))
    }
}

impl std::fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Resource::Topic(name) => write!(f, "topic \"{name}\""),
            Resource::Group(name) => write!(f, "group \"{name}\""),
        }
    }
}

/// One account of the file.
#[derive(Debug, Clone)]
pub struct Account {
    pub access_key: String,
    pub secret_key: String,
    /// Requests of this account from here are let through without a signature (Apache).
    pub white_address: AddressPattern,
    pub admin: bool,
    default_topic_perm: Perm,
    default_group_perm: Perm,
    topic_perms: HashMap<String, Perm>,
    group_perms: HashMap<String, Perm>,
}

impl Account {
    /// Whether the account may do `needed` on `resource`: its own entry for it, else its
    /// default; an admin without any entry may do everything (Apache's `checkPerm`).
    pub fn allows(&self, resource: Resource<'_>, needed: Perm) -> bool {
        if self.admin && self.topic_perms.is_empty() && self.group_perms.is_empty() {
            return true;
        }
        let owned = match resource {
            Resource::Topic(name) => self.topic_perms.get(name).copied(),
            Resource::Group(name) => self.group_perms.get(name).copied(),
        };
        let default = match resource {
            Resource::Topic(_) => self.default_topic_perm,
            Resource::Group(_) => self.default_group_perm,
        };
        owned.unwrap_or(default).grants(needed)
    }
}

/// Every account and the global white list, as one version of the file gave them.
#[derive(Debug, Clone, Default)]
pub struct Accounts {
    pub global_white: Vec<AddressPattern>,
    by_access_key: HashMap<String, Account>,
}

impl Accounts {
    pub fn get(&self, access_key: &str) -> Option<&Account> {
        self.by_access_key.get(access_key)
    }

    pub fn len(&self) -> usize {
        self.by_access_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_access_key.is_empty()
    }

    /// Whether `address` is on the global white list (no signature asked).
    pub fn globally_white(&self, address: IpAddr) -> bool {
        self.global_white.iter().any(|white| white.matches(address))
    }

    /// Parses the file's text; the error names the entry at fault.
    pub fn parse(text: &str) -> Result<Accounts, String> {
        if text.trim().is_empty() {
            return Ok(Accounts::default());
        }
        let file: PlainAclFile = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        let global_white = file
            .global_white_remote_addresses
            .unwrap_or_default()
            .iter()
            .map(|entry| {
                AddressPattern::parse(entry)
                    .map_err(|reason| format!("globalWhiteRemoteAddresses: {reason}"))
            })
            .collect::<Result<_, _>>()?;
        let mut by_access_key = HashMap::new();
        for entry in file.accounts.unwrap_or_default() {
            let account = entry.into_account()?;
            let key = account.access_key.clone();
            if by_access_key.insert(key.clone(), account).is_some() {
                return Err(format!("accessKey `{key}` is listed twice"));
            }
        }
        Ok(Accounts {
            global_white,
            by_access_key,
        })
    }
}

/// The file as Apache writes it (unknown keys, like `dataVersion`, are ignored).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct PlainAclFile {
    global_white_remote_addresses: Option<Vec<String>>,
    accounts: Option<Vec<AccountEntry>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct AccountEntry {
    access_key: Option<String>,
    secret_key: Option<String>,
    white_remote_address: Option<String>,
    #[serde(default)]
    admin: bool,
    default_topic_perm: Option<String>,
    default_group_perm: Option<String>,
    topic_perms: Option<Vec<String>>,
    group_perms: Option<Vec<String>>,
}

/// Apache refuses keys of 6 characters or fewer.
const MIN_KEY_CHARS: usize = 7;

impl AccountEntry {
    fn into_account(self) -> Result<Account, String> {
        let access_key = self.access_key.unwrap_or_default();
        let secret_key = self.secret_key.unwrap_or_default();
        if access_key.chars().count() < MIN_KEY_CHARS || secret_key.chars().count() < MIN_KEY_CHARS
        {
            return Err(format!(
                "account `{access_key}`: accessKey and secretKey must be at least {MIN_KEY_CHARS} characters"
            ));
        }
        let context = |reason: String| format!("account `{access_key}`: {reason}");
        let white_address =
            AddressPattern::parse(self.white_remote_address.as_deref().unwrap_or_default())
                .map_err(context)?;
        // Apache: a missing default is DENY.
        let default_perm = |text: Option<String>| text.map_or(Ok(Perm::DENY), |t| Perm::parse(&t));
        Ok(Account {
            white_address,
            admin: self.admin,
            default_topic_perm: default_perm(self.default_topic_perm).map_err(context)?,
            default_group_perm: default_perm(self.default_group_perm).map_err(context)?,
            topic_perms: resource_perms(self.topic_perms).map_err(context)?,
            group_perms: resource_perms(self.group_perms).map_err(context)?,
            secret_key,
            access_key,
        })
    }
}

/// `name=PERM` entries.
fn resource_perms(entries: Option<Vec<String>>) -> Result<HashMap<String, Perm>, String> {
    let mut perms = HashMap::new();
    for entry in entries.unwrap_or_default() {
        let Some((name, perm)) = entry.split_once('=') else {
            return Err(format!("`{entry}` is not NAME=PERM"));
        };
        let name = name.trim();
        let name = name.strip_prefix(RETRY_PREFIX).unwrap_or(name);
        if name.is_empty() {
            return Err(format!("`{entry}` names nothing"));
        }
        perms.insert(name.to_owned(), Perm::parse(perm)?);
    }
    Ok(perms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apache's sample `plain_acl.yml` (4.9), as users copy it.
    pub const APACHE_SAMPLE: &str = r#"
globalWhiteRemoteAddresses:
  - 10.10.103.*
  - 192.168.0.*

accounts:
  - accessKey: RocketMQ
    secretKey: 12345678
    whiteRemoteAddress:
    admin: false
    defaultTopicPerm: DENY
    defaultGroupPerm: SUB
    topicPerms:
      - topicA=DENY
      - topicB=PUB|SUB
      - topicC=SUB
    groupPerms:
      # the group should convert to retry topic
      - groupA=DENY
      - groupB=PUB|SUB
      - groupC=SUB

  - accessKey: rocketmq2
    secretKey: 12345678
    whiteRemoteAddress: 192.168.1.*
    # if it is admin, it could access all resources
    admin: true
"#;

    #[test]
    fn apache_sample_reads_as_apache_means_it() {
        let accounts = Accounts::parse(APACHE_SAMPLE).unwrap();
        assert_eq!(accounts.len(), 2);
        assert!(accounts.globally_white("10.10.103.7".parse().unwrap()));
        assert!(!accounts.globally_white("10.10.104.7".parse().unwrap()));
        let user = accounts.get("RocketMQ").unwrap();
        assert_eq!(user.secret_key, "12345678");
        assert!(!user.admin);
        assert!(!user.allows(Resource::Topic("topicA"), Perm::SUB));
        assert!(user.allows(Resource::Topic("topicB"), Perm::PUB));
        assert!(user.allows(Resource::Topic("topicC"), Perm::SUB));
        assert!(!user.allows(Resource::Topic("topicC"), Perm::PUB));
        assert!(!user.allows(Resource::Topic("other"), Perm::SUB));
        assert!(!user.allows(Resource::Group("groupA"), Perm::SUB));
        assert!(user.allows(Resource::Group("other"), Perm::SUB));
        assert!(user.allows(Resource::topic("%RETRY%groupC"), Perm::SUB));
        let admin = accounts.get("rocketmq2").unwrap();
        assert!(admin.admin);
        assert!(admin.allows(Resource::Topic("anything"), Perm::PUB));
        assert!(admin.white_address.matches("192.168.1.9".parse().unwrap()));
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let cases = [
            ("accounts: [ {accessKey: short, secretKey: 12345678} ]", "at least 7"),
            (
                "accounts: [ {accessKey: longenough, secretKey: 12345678, defaultTopicPerm: ALL} ]",
                "not a permission",
            ),
            (
                "accounts: [ {accessKey: longenough, secretKey: 12345678, topicPerms: [topicA]} ]",
                "NAME=PERM",
            ),
            (
                "accounts: [ {accessKey: longenough, secretKey: 12345678}, {accessKey: longenough, secretKey: 87654321} ]",
                "twice",
            ),
            ("globalWhiteRemoteAddresses: [ not-an-address ]", "globalWhiteRemoteAddresses"),
            ("accounts: {", ""),
        ];
        for (text, expected) in cases {
            let error = Accounts::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn an_empty_file_has_no_accounts() {
        assert!(Accounts::parse("").unwrap().is_empty());
    }
}
