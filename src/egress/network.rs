//! Egress host rules (ADR-006: "a malformed network-allowlist rule" must be refused at admission,
//! not discovered 30 s into a run). One parser, used by the admission rules now and by whatever
//! enforces egress (src/egress: the per-run NetworkPolicy and the egress proxy), so the grammar
//! and the verdict cannot drift between validation and enforcement.
//!
//! Grammar of one rule (`spec.network.rules[i]`):
//! - `!` before a pattern negates it (a bare `!` or a double `!!` is refused);
//! - `**` any host; `*.x` exactly one label before `x`; `**.x` one or more labels before `x`;
//! - a literal host (a valid DNS name, case-insensitive, one optional trailing dot);
//! - an IPv4/IPv6 literal (IPv6 optionally in brackets) or a CIDR `addr/prefix`;
//! - a host-name rule (a literal host or a `*.`/`**.` glob) may end in `:port` (1-65535): it then
//!   matches that port only; without a port a rule matches every port. Address rules (IP, CIDR,
//!   `**`) carry no port: the NetworkPolicy enforces them for every port.
//!
//! Evaluation is last-match-wins (see [`allows`]).
//!
//! CIDR with host bits set (`10.0.0.1/8`): accepted and read as its network (`10.0.0.0/8`), the
//! way Go's `net.ParseCIDR` reads it, but admission warns ([`Rule::cidr_host_bits_set`]): the
//! author probably meant either the single address or the network, and we cannot tell which.

use std::fmt;
use std::net::IpAddr;

use thiserror::Error;

use crate::api::NetworkMode;

/// What a rule matches, negation aside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// `**`: every host.
    AnyHost,
    /// `*.suffix`: exactly one label in front of `suffix`.
    OneLabel(String),
    /// `**.suffix`: one or more labels in front of `suffix`.
    AnyLabels(String),
    /// A literal DNS name (lower-cased, trailing dot removed).
    Host(String),
    /// An IP literal.
    Ip(IpAddr),
    /// A network; `network` has its host bits cleared.
    Cidr {
        /// The network address (host bits cleared).
        network: IpAddr,
        /// Prefix length.
        prefix: u8,
        /// Whether the rule as written had host bits set (admission warns).
        host_bits_set: bool,
    },
}

/// One parsed egress rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `!` in front: a match flips the mode's default verdict back.
    pub negated: bool,
    /// What the rule matches.
    pub pattern: Pattern,
    /// The one port it matches (host-name rules only); None: every port.
    pub port: Option<u16>,
}

/// Why a rule does not parse. The message is shown to the user with the rule and its index.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RuleError {
    /// The rule is the empty string.
    #[error("the rule is empty")]
    Empty,
    /// `!` with nothing after it.
    #[error("`!` must be followed by a pattern")]
    BareNegation,
    /// `!!x`.
    #[error("double negation `!!` is not allowed; write the pattern once, with at most one `!`")]
    DoubleNegation,
    /// Leading or trailing whitespace, or whitespace inside.
    #[error("the rule contains whitespace")]
    Whitespace,
    /// A `*` anywhere but the accepted glob forms.
    #[error("bad glob: only `**`, `*.<domain>` and `**.<domain>` are accepted (a `*` is a whole leading label)")]
    BadGlob,
    /// The part after `*.`/`**.`, or a literal host, is not a DNS name.
    #[error("`{0}` is not a valid DNS name: {1}")]
    BadHost(String, &'static str),
    /// A CIDR whose address or prefix does not parse.
    #[error("bad CIDR: {0}")]
    BadCidr(&'static str),
    /// A `:port` that is not 1-65535, or on a rule that cannot carry one.
    #[error("bad port: {0}")]
    BadPort(&'static str),
}

impl Rule {
    /// Parses one rule. Never trims: the text is validated exactly as it will be enforced.
    pub fn parse(text: &str) -> Result<Rule, RuleError> {
        if text.is_empty() {
            return Err(RuleError::Empty);
        }
        if text.chars().any(char::is_whitespace) {
            return Err(RuleError::Whitespace);
        }
        let (negated, body) = match text.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        if negated && body.is_empty() {
            return Err(RuleError::BareNegation);
        }
        if body.starts_with('!') {
            return Err(RuleError::DoubleNegation);
        }
        let (body, port) = split_port(body)?;
        let pattern = parse_pattern(body)?;
        if port.is_some()
            && matches!(
                pattern,
                Pattern::AnyHost | Pattern::Ip(_) | Pattern::Cidr { .. }
            )
        {
            return Err(RuleError::BadPort(
                "only host-name rules carry a port (an address rule covers every port)",
            ));
        }
        Ok(Rule {
            negated,
            pattern,
            port,
        })
    }

    /// Whether the rule matches `host` on `port` (None: a judgment on the host alone, which a rule
    /// with a port never matches).
    pub fn matches_at(&self, host: &str, port: Option<u16>) -> bool {
        self.port.is_none_or(|p| Some(p) == port) && self.matches(host)
    }

    /// Whether the pattern matches `host` (a DNS name or an IP literal), negation aside.
    pub fn matches(&self, host: &str) -> bool {
        let host = normalize_host(host);
        let ip = host.parse::<IpAddr>().ok();
        match &self.pattern {
            Pattern::AnyHost => true,
            Pattern::OneLabel(suffix) => {
                ip.is_none()
                    && strip_label_suffix(&host, suffix).is_some_and(|front| !front.contains('.'))
            }
            Pattern::AnyLabels(suffix) => {
                ip.is_none() && strip_label_suffix(&host, suffix).is_some()
            }
            Pattern::Host(name) => ip.is_none() && host == *name,
            Pattern::Ip(addr) => ip.is_some_and(|a| canonical(a) == canonical(*addr)),
            Pattern::Cidr {
                network, prefix, ..
            } => ip.is_some_and(|a| in_network(canonical(a), *network, *prefix)),
        }
    }

    /// Whether the rule is a CIDR written with host bits set (admission warns).
    pub(crate) fn cidr_host_bits_set(&self) -> bool {
        matches!(
            self.pattern,
            Pattern::Cidr {
                host_bits_set: true,
                ..
            }
        )
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.negated {
            f.write_str("!")?;
        }
        match &self.pattern {
            Pattern::AnyHost => f.write_str("**"),
            Pattern::OneLabel(s) => write!(f, "*.{s}"),
            Pattern::AnyLabels(s) => write!(f, "**.{s}"),
            Pattern::Host(h) => f.write_str(h),
            Pattern::Ip(a) => write!(f, "{a}"),
            Pattern::Cidr {
                network, prefix, ..
            } => write!(f, "{network}/{prefix}"),
        }?;
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// Whether egress to `host` is allowed under `mode` and `rules`: the LAST matching rule decides.
/// In `allowlist` a plain match allows and a negated match denies (default: deny); in `denylist`
/// a plain match denies and a negated match allows (default: allow); `open` allows everything.
/// Judged on the host alone: a rule with a port never matches here.
pub fn allows(mode: NetworkMode, rules: &[Rule], host: &str) -> bool {
    decide(mode, rules, host, None).0
}

/// [`allows`] on `host` and `port`, with the index of the rule that decided (None: the mode's
/// default did). The egress proxy judges with the port and names the rule in a refusal.
pub(crate) fn decide(
    mode: NetworkMode,
    rules: &[Rule],
    host: &str,
    port: Option<u16>,
) -> (bool, Option<usize>) {
    let default_allow = match mode {
        NetworkMode::Open => return (true, None),
        NetworkMode::Allowlist => false,
        NetworkMode::Denylist => true,
    };
    match rules
        .iter()
        .enumerate()
        .rev()
        .find(|(_, r)| r.matches_at(host, port))
    {
        None => (default_allow, None),
        // A plain match flips the default; a negated match restores it.
        Some((i, rule)) => (rule.negated == default_allow, Some(i)),
    }
}

impl Rule {
    /// Whether the rule is about addresses (an IP or a CIDR), not names.
    pub(crate) fn is_address(&self) -> bool {
        matches!(self.pattern, Pattern::Ip(_) | Pattern::Cidr { .. })
    }
}

/// `body` without a trailing `:port`, and the port: `name:port`, or `[v6]:port` (which its
/// pattern then refuses). An unbracketed IPv6 literal (several `:`) has no port.
fn split_port(body: &str) -> Result<(&str, Option<u16>), RuleError> {
    let split = if body.contains("://") {
        None
    } else if body.starts_with('[') {
        body.rfind("]:").map(|i| (&body[..=i], &body[i + 2..]))
    } else if body.matches(':').count() == 1 {
        body.rsplit_once(':')
    } else {
        None
    };
    let Some((host, port)) = split else {
        return Ok((body, None));
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RuleError::BadPort("a port is a number from 1 to 65535"));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok((host, Some(p))),
        _ => Err(RuleError::BadPort("a port is a number from 1 to 65535")),
    }
}

fn parse_pattern(body: &str) -> Result<Pattern, RuleError> {
    if body == "**" {
        return Ok(Pattern::AnyHost);
    }
    if let Some(suffix) = body.strip_prefix("**.") {
        return Ok(Pattern::AnyLabels(glob_suffix(suffix)?));
    }
    if let Some(suffix) = body.strip_prefix("*.") {
        return Ok(Pattern::OneLabel(glob_suffix(suffix)?));
    }
    if body.contains('*') {
        return Err(RuleError::BadGlob);
    }
    if body.contains("://") {
        return Err(RuleError::BadHost(
            body.to_string(),
            "a host rule has no scheme, port or path",
        ));
    }
    if let Some((addr, prefix)) = body.split_once('/') {
        return parse_cidr(addr, prefix);
    }
    let unbracketed = body.strip_prefix('[').and_then(|b| b.strip_suffix(']'));
    if let Some(inner) = unbracketed {
        return match inner.parse::<std::net::Ipv6Addr>() {
            Ok(a) => Ok(Pattern::Ip(IpAddr::V6(a))),
            Err(_) => Err(RuleError::BadHost(
                body.to_string(),
                "brackets only enclose an IPv6 address",
            )),
        };
    }
    if let Ok(addr) = body.parse::<IpAddr>() {
        return Ok(Pattern::Ip(addr));
    }
    if body.contains(':') {
        // Not an IP, and a port or scheme is not part of a host rule.
        return Err(RuleError::BadHost(
            body.to_string(),
            "a host rule has no scheme or port",
        ));
    }
    Ok(Pattern::Host(valid_dns_name(body)?))
}

fn glob_suffix(suffix: &str) -> Result<String, RuleError> {
    if suffix.contains('*') {
        return Err(RuleError::BadGlob);
    }
    if suffix.parse::<IpAddr>().is_ok() {
        return Err(RuleError::BadGlob);
    }
    valid_dns_name(suffix)
}

fn parse_cidr(addr: &str, prefix: &str) -> Result<Pattern, RuleError> {
    let addr: IpAddr = addr
        .parse()
        .map_err(|_| RuleError::BadCidr("the address is not an IPv4/IPv6 literal"))?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RuleError::BadCidr(
            "the prefix length is not a decimal number",
        ));
    }
    let prefix: u8 = prefix
        .parse()
        .map_err(|_| RuleError::BadCidr("the prefix length is not a number"))?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if prefix > max {
        return Err(if addr.is_ipv4() {
            RuleError::BadCidr("an IPv4 prefix length is at most 32")
        } else {
            RuleError::BadCidr("an IPv6 prefix length is at most 128")
        });
    }
    let network = mask(addr, prefix);
    Ok(Pattern::Cidr {
        network,
        prefix,
        host_bits_set: network != addr,
    })
}

/// `addr` with all but its first `prefix` bits cleared.
pub(crate) fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u32::MAX << (32 - u32::from(prefix))
            };
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = if prefix == 0 {
                0
            } else {
                u128::MAX << (128 - u32::from(prefix))
            };
            IpAddr::V6((bits & m).into())
        }
    }
}

fn in_network(addr: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (addr, network) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
            mask(addr, prefix) == network
        }
        _ => false,
    }
}

/// IPv4-mapped IPv6 addresses compare as IPv4, so `::ffff:10.0.0.1` is caught by `10.0.0.0/8`.
fn canonical(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(addr),
        v4 => v4,
    }
}

fn normalize_host(host: &str) -> String {
    let h = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase()
}

/// `host` minus `.suffix`, when `host` is `<something>.suffix` with `<something>` non-empty.
fn strip_label_suffix<'a>(host: &'a str, suffix: &str) -> Option<&'a str> {
    let front = host.strip_suffix(suffix)?.strip_suffix('.')?;
    (!front.is_empty()).then_some(front)
}

/// RFC 1123 host name: labels of 1..=63 letters, digits and hyphens, not starting or ending with
/// a hyphen, 253 characters at most; one trailing dot allowed. An all-numeric last label is
/// refused: `1.2.3` is a malformed IP address, not a host.
fn valid_dns_name(name: &str) -> Result<String, RuleError> {
    let bad = |why| Err(RuleError::BadHost(name.to_string(), why));
    let trimmed = name.strip_suffix('.').unwrap_or(name);
    if trimmed.is_empty() {
        return bad("it is empty");
    }
    if trimmed.len() > 253 {
        return bad("it is longer than 253 characters");
    }
    for label in trimmed.split('.') {
        if label.is_empty() {
            return bad("it has an empty label (`..`, or a leading or trailing dot)");
        }
        if label.len() > 63 {
            return bad("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        {
            return bad("labels hold only letters, digits and `-`");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("a label cannot start or end with `-`");
        }
    }
    if trimmed
        .rsplit('.')
        .next()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return bad("its last label is numeric (a malformed IP address?)");
    }
    Ok(trimmed.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(s: &str) -> Rule {
        Rule::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn accepted_forms_parse() {
        assert_eq!(rule("**").pattern, Pattern::AnyHost);
        assert_eq!(
            rule("*.example.com").pattern,
            Pattern::OneLabel("example.com".into())
        );
        assert_eq!(
            rule("**.Example.COM").pattern,
            Pattern::AnyLabels("example.com".into())
        );
        assert_eq!(
            rule("api.github.com").pattern,
            Pattern::Host("api.github.com".into())
        );
        assert_eq!(rule("localhost").pattern, Pattern::Host("localhost".into()));
        assert_eq!(
            rule("example.com.").pattern,
            Pattern::Host("example.com".into())
        );
        assert!(matches!(rule("10.1.2.3").pattern, Pattern::Ip(_)));
        assert!(matches!(rule("::1").pattern, Pattern::Ip(_)));
        assert!(matches!(rule("[2001:db8::1]").pattern, Pattern::Ip(_)));
        assert!(matches!(
            rule("10.0.0.0/8").pattern,
            Pattern::Cidr {
                prefix: 8,
                host_bits_set: false,
                ..
            }
        ));
        assert!(matches!(
            rule("2001:db8::/32").pattern,
            Pattern::Cidr { prefix: 32, .. }
        ));
        assert!(matches!(
            rule("0.0.0.0/0").pattern,
            Pattern::Cidr { prefix: 0, .. }
        ));
        let neg = rule("!*.ads.example.com");
        assert!(neg.negated);
        assert_eq!(neg.to_string(), "!*.ads.example.com");
    }

    #[test]
    fn malformed_rules_are_refused_with_a_reason() {
        assert_eq!(Rule::parse(""), Err(RuleError::Empty));
        assert_eq!(Rule::parse("!"), Err(RuleError::BareNegation));
        assert_eq!(Rule::parse("!!x.com"), Err(RuleError::DoubleNegation));
        assert_eq!(Rule::parse(" x.com"), Err(RuleError::Whitespace));
        for glob in [
            "a*b.com",
            "*",
            "***.x",
            "x.*",
            "*.*.com",
            "**.",
            "*.",
            "*x.com",
            "**.*.com",
            "*.10.0.0.1",
        ] {
            assert!(Rule::parse(glob).is_err(), "{glob} should be refused");
        }
        for cidr in [
            "10.0.0.0/33",
            "::/129",
            "10.0.0.0/",
            "10.0.0/8",
            "10.0.0.0/-1",
            "10.0.0.0/8/8",
            "x.com/8",
            "10.0.0.0/0x8",
        ] {
            assert!(
                matches!(Rule::parse(cidr), Err(RuleError::BadCidr(_))),
                "{cidr} should be a bad CIDR"
            );
        }
        for host in [
            "exa_mple.com",
            "-x.com",
            "x-.com",
            "a..b",
            ".x.com",
            "1.2.3",
            "https://x.com",
            "[x.com]",
        ] {
            assert!(
                matches!(Rule::parse(host), Err(RuleError::BadHost(..))),
                "{host} should be a bad host"
            );
        }
        assert!(Rule::parse(&format!("{}.com", "a".repeat(64))).is_err());
    }

    #[test]
    fn cidr_with_host_bits_is_read_as_its_network_and_flagged() {
        let r = rule("10.1.2.3/8");
        assert!(r.cidr_host_bits_set());
        assert_eq!(r.to_string(), "10.0.0.0/8");
        assert!(r.matches("10.200.0.1"));
        assert!(!rule("10.0.0.0/8").cidr_host_bits_set());
    }

    #[test]
    fn one_label_glob_matches_exactly_one_label() {
        let r = rule("*.example.com");
        assert!(r.matches("api.example.com"));
        assert!(r.matches("API.Example.com."));
        assert!(!r.matches("example.com"));
        assert!(!r.matches("a.b.example.com"));
        assert!(!r.matches("notexample.com"));
    }

    #[test]
    fn many_label_glob_matches_one_or_more_labels() {
        let r = rule("**.example.com");
        assert!(r.matches("api.example.com"));
        assert!(r.matches("a.b.example.com"));
        assert!(!r.matches("example.com"));
        assert!(!r.matches("badexample.com"));
        assert!(rule("**").matches("anything.at.all"));
        assert!(rule("**").matches("10.0.0.1"));
    }

    #[test]
    fn ip_rules_match_addresses_not_names() {
        assert!(rule("10.0.0.0/8").matches("10.9.9.9"));
        assert!(!rule("10.0.0.0/8").matches("11.0.0.1"));
        assert!(rule("10.0.0.0/8").matches("::ffff:10.0.0.1"));
        assert!(rule("::1").matches("[::1]"));
        assert!(rule("2001:db8::/32").matches("2001:db8:1::5"));
        assert!(!rule("2001:db8::/32").matches("10.0.0.1"));
        assert!(!rule("example.com").matches("10.0.0.1"));
        assert!(rule("example.com").matches("EXAMPLE.com"));
    }

    #[test]
    fn host_rules_may_carry_a_port_and_match_only_it() {
        let r = rule("api.example.com:443");
        assert_eq!(r.port, Some(443));
        assert_eq!(r.to_string(), "api.example.com:443");
        assert!(r.matches_at("api.example.com", Some(443)));
        assert!(!r.matches_at("api.example.com", Some(22)));
        assert!(
            !r.matches_at("api.example.com", None),
            "a host-only judgment"
        );
        assert_eq!(rule("!*.example.com:80").to_string(), "!*.example.com:80");
        assert_eq!(rule("**.example.com:8443").port, Some(8443));
        // Without a port: every port (the default).
        assert!(rule("api.example.com").matches_at("api.example.com", Some(22)));
        let rules: Vec<Rule> = ["**.example.com:443", "!ads.example.com"]
            .iter()
            .map(|s| rule(s))
            .collect();
        let at = |host, port| decide(NetworkMode::Allowlist, &rules, host, Some(port)).0;
        assert!(at("api.example.com", 443));
        assert!(!at("api.example.com", 22));
        assert!(!at("ads.example.com", 443));
        for bad in [
            "x.com:0",
            "x.com:65536",
            "x.com:",
            "x.com:https",
            "x.com:+443",
            "10.0.0.1:443",
            "10.0.0.0/8:443",
            "[::1]:443",
            "**:443",
        ] {
            assert!(
                matches!(Rule::parse(bad), Err(RuleError::BadPort(_))),
                "{bad} should be a bad port: {:?}",
                Rule::parse(bad)
            );
        }
        assert!(
            matches!(rule("::1").pattern, Pattern::Ip(_)),
            "IPv6 is not a port"
        );
    }

    #[test]
    fn last_match_wins() {
        let rules: Vec<Rule> = ["**.example.com", "!ads.example.com"]
            .iter()
            .map(|s| rule(s))
            .collect();
        assert!(allows(NetworkMode::Allowlist, &rules, "api.example.com"));
        assert!(!allows(NetworkMode::Allowlist, &rules, "ads.example.com"));
        assert!(!allows(NetworkMode::Allowlist, &rules, "other.org"));
        // Reversed order: the broad rule comes last and wins again.
        let rules: Vec<Rule> = ["!ads.example.com", "**.example.com"]
            .iter()
            .map(|s| rule(s))
            .collect();
        assert!(allows(NetworkMode::Allowlist, &rules, "ads.example.com"));
        // Denylist: a match denies, a negated match allows.
        let rules: Vec<Rule> = ["**", "!*.internal.corp"].iter().map(|s| rule(s)).collect();
        assert!(!allows(NetworkMode::Denylist, &rules, "evil.org"));
        assert!(allows(NetworkMode::Denylist, &rules, "git.internal.corp"));
        assert!(allows(NetworkMode::Denylist, &[], "evil.org"));
        assert!(allows(NetworkMode::Open, &rules, "evil.org"));
    }
}
