//! Kubernetes' name grammars (DNS-1123 labels and subdomains, qualified label/annotation keys,
//! label values), shared by admission, the namespace policies and the flags. Pure, a leaf.

/// DNS-1123 subdomain: at most 253 of `[a-z0-9-.]`, dot-separated DNS labels.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// A label or annotation key: `[prefix/]name`, prefix a DNS subdomain, name 1-63 of
/// `[A-Za-z0-9-_.]` starting and ending alphanumeric.
pub(crate) fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    prefix.is_none_or(is_dns1123_subdomain) && !name.is_empty() && is_label_value(name)
}

/// A label value: empty, or at most 63 of `[A-Za-z0-9-_.]` starting and ending alphanumeric.
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric()))
}

/// DNS-1123 label: 1-63 of `[a-z0-9-]`, starting and ending alphanumeric.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}
