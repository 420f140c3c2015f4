//! White-list address patterns of `plain_acl.yml`, in Apache's forms.

use std::net::IpAddr;

/// One `globalWhiteRemoteAddresses` entry or an account's `whiteRemoteAddress`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AddressPattern {
    /// Blank: matches nothing.
    Nothing,
    /// `*`, `*.*.*.*`, `*:*:*:*:*:*:*:*`: every address.
    Any,
    /// `192.168.0.{1,2}` or `10.0.0.1,10.0.0.2` (IPv4 or IPv6): these addresses.
    OneOf(Vec<IpAddr>),
    /// `192.168.*.*`, `192.168.1.1-100`, `10.*`: each IPv4 octet a number, a range or any.
    Octets([OctetRange; 4]),
}

/// The values one IPv4 octet may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OctetRange {
    pub low: u8,
    pub high: u8,
}

const ANY_OCTET: OctetRange = OctetRange { low: 0, high: 255 };

impl AddressPattern {
    /// Parses an entry; the error says what is wrong with it.
    pub fn parse(text: &str) -> Result<AddressPattern, String> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(AddressPattern::Nothing);
        }
        if matches!(text, "*" | "*.*.*.*" | "*:*:*:*:*:*:*:*") {
            return Ok(AddressPattern::Any);
        }
        if let Some(listed) = braced_list(text)? {
            return Ok(AddressPattern::OneOf(listed));
        }
        if text.contains(',') {
            let addresses = text.split(',').map(parse_ip).collect::<Result<_, _>>()?;
            return Ok(AddressPattern::OneOf(addresses));
        }
        if let Ok(address) = text.parse::<IpAddr>() {
            return Ok(AddressPattern::OneOf(vec![address]));
        }
        octet_ranges(text).map(AddressPattern::Octets)
    }

    pub fn matches(&self, address: IpAddr) -> bool {
        let address = canonical(address);
        match self {
            AddressPattern::Nothing => false,
            AddressPattern::Any => true,
            AddressPattern::OneOf(listed) => listed.contains(&address),
            AddressPattern::Octets(ranges) => match address {
                IpAddr::V4(v4) => ranges
                    .iter()
                    .zip(v4.octets())
                    .all(|(range, octet)| (range.low..=range.high).contains(&octet)),
                IpAddr::V6(_) => false,
            },
        }
    }
}

/// An IPv4 peer seen through an IPv6 socket (`::ffff:a.b.c.d`) as the IPv4 address it is.
fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn parse_ip(text: &str) -> Result<IpAddr, String> {
    text.trim()
        .parse::<IpAddr>()
        .map(canonical)
        .map_err(|_| format!("`{}` is not an IP address", text.trim()))
}

/// `a.b.c.{x,y}` (or an IPv6 prefix ending in `:{x,y}`): one address per listed last part.
fn braced_list(text: &str) -> Result<Option<Vec<IpAddr>>, String> {
    let Some(inner) = text.strip_suffix('}') else {
        return Ok(None);
    };
    let Some((prefix, listed)) = inner.split_once('{') else {
        return Err(format!("`{text}` has a `}}` without its `{{`"));
    };
    if !(prefix.ends_with('.') || prefix.ends_with(':')) {
        return Err(format!("`{text}`: the braces must hold the last part"));
    }
    let addresses = listed
        .split(',')
        .map(|last| parse_ip(&format!("{prefix}{}", last.trim())))
        .collect::<Result<_, _>>()?;
    Ok(Some(addresses))
}

/// `192.168.*.*`, `192.168.1.1-100`, `10.*` (missing trailing octets are any).
fn octet_ranges(text: &str) -> Result<[OctetRange; 4], String> {
    let parts: Vec<&str> = text.split('.').map(str::trim).collect();
    if parts.len() > 4 || (parts.len() < 4 && parts.last() != Some(&"*")) {
        return Err(format!(
            "`{text}` is neither an address nor a pattern like 192.168.*.* or 10.0.0.1-20"
        ));
    }
    let mut ranges = [ANY_OCTET; 4];
    for (range, part) in ranges.iter_mut().zip(&parts) {
        *range = octet_range(part).ok_or_else(|| format!("`{text}`: bad part `{part}`"))?;
    }
    Ok(ranges)
}

fn octet_range(part: &str) -> Option<OctetRange> {
    if part == "*" {
        return Some(ANY_OCTET);
    }
    let (low, high) = part.split_once('-').unwrap_or((part, part));
    let (low, high) = (low.trim().parse().ok()?, high.trim().parse().ok()?);
    (low <= high).then_some(OctetRange { low, high })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn apache_forms_match_what_they_say() {
        let cases: [(&str, &[&str], &[&str]); 7] = [
            ("", &[], &["127.0.0.1"]),
            ("*", &["127.0.0.1", "::1"], &[]),
            (
                "192.168.0.{1,2}",
                &["192.168.0.1", "192.168.0.2"],
                &["192.168.0.3"],
            ),
            ("10.0.0.1, 10.0.0.2", &["10.0.0.2"], &["10.0.0.3"]),
            ("192.168.*.*", &["192.168.7.9"], &["192.169.0.1", "::1"]),
            (
                "192.168.1.10-20",
                &["192.168.1.10", "192.168.1.20"],
                &["192.168.1.21"],
            ),
            ("10.*", &["10.1.2.3"], &["11.0.0.1"]),
        ];
        for (pattern, yes, no) in cases {
            let parsed = AddressPattern::parse(pattern).unwrap();
            for address in yes {
                assert!(
                    parsed.matches(ip(address)),
                    "{pattern} should match {address}"
                );
            }
            for address in no {
                assert!(
                    !parsed.matches(ip(address)),
                    "{pattern} should not match {address}"
                );
            }
        }
        let exact = AddressPattern::parse("127.0.0.1").unwrap();
        assert!(exact.matches(ip("127.0.0.1")));
        assert!(exact.matches(ip("::ffff:127.0.0.1")));
    }

    #[test]
    fn nonsense_is_an_error() {
        for bad in [
            "foo",
            "1.2.3.4.5",
            "1.2.300.*",
            "1.2.3.{a,b}",
            "1.2.9-3.*",
            "1.2.3",
        ] {
            assert!(AddressPattern::parse(bad).is_err(), "{bad}");
        }
    }
}
