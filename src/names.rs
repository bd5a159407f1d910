//! Kubernetes' name grammars (DNS-1123 labels and subdomains, qualified label/annotation keys,
//! label values) and the grammar of a clean container path, shared by admission, the pod
//! builder, the namespace policies and the flags; and the names and labels the operator gives
//! what it creates (its pods, their holder container, the labels that tie them to a run), which
//! the pod builder, the drain, the egress proxy and the controller share. Pure, a leaf.

use sha2::{Digest, Sha256};

/// Name of the user's container.
pub(crate) const WORKLOAD_CONTAINER: &str = "workload";
/// Name of the operator-owned container the drain execs into.
pub const HOLDER_CONTAINER: &str = "holder";
/// Label carrying the owning run's uid (names can exceed a label value's 63 characters).
pub const RUN_UID_LABEL: &str = "sandbox.iterion.io/run-uid";

/// Label every object the operator creates carries, with value [`MANAGED_BY`].
pub(crate) const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
/// Value of [`MANAGED_BY_LABEL`].
pub(crate) const MANAGED_BY: &str = "sandboxrun-operator";

/// Name of the pod of a run: the run's name with a suffix, shortened with a hash of the full name
/// when it would exceed the 253 characters of a DNS subdomain.
pub fn pod_name(run_name: &str) -> String {
    const SUFFIX: &str = "-sbr";
    if run_name.len() + SUFFIX.len() <= 253 {
        return format!("{run_name}{SUFFIX}");
    }
    let digest = short_hash(run_name);
    let keep = 253 - SUFFIX.len() - digest.len() - 1;
    let head = run_name[..keep].trim_end_matches(['-', '.']);
    format!("{head}-{digest}{SUFFIX}")
}

/// Name of the pod of a run's `attempt`-th attempt (from 1; docs/user-guide.md "Retries"): the
/// first attempt's is [`pod_name`], a later one's is that name with `-a<attempt>`. An attempt
/// pod's name never ends in `-sbr`, so no run's first pod can take a later attempt's name.
pub fn attempt_pod_name(run_name: &str, attempt: u32) -> String {
    let first = pod_name(run_name);
    if attempt <= 1 {
        return first;
    }
    let suffix = format!("-a{attempt}");
    if first.len() + suffix.len() <= 253 {
        return format!("{first}{suffix}");
    }
    let keep = 253 - suffix.len();
    let head = first[..keep].trim_end_matches(['-', '.']);
    format!("{head}{suffix}")
}

/// First 8 hex characters of the sha256 of `text`: a stable, short disambiguator for names.
pub(crate) fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    hex::encode(&digest[..4])
}

/// Field manager of every status write (server-side apply, one manager), and the Events' reporter.
pub(crate) const MANAGER: &str = "sandboxrun-operator";

/// The label selector of every object the operator manages.
pub(crate) fn managed_by_selector() -> String {
    format!("{MANAGED_BY_LABEL}={MANAGED_BY}")
}

/// Why `path` is not a clean absolute container path — absolute, not `/`, no NUL, no trailing
/// `/`, no empty (`//`), `.` or `..` component — as a phrase completing "path `x` …"; None when
/// it is clean. Admission refuses such paths and the pod builder refuses them again
/// (docs/contract.md "The operator never builds a pod its own rules refuse"): a mount at
/// `/sandboxrun-readback/../usr/local/bin` would land over the holder's own binary.
pub(crate) fn unclean_path(path: &str) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("is not absolute");
    }
    if path == "/" {
        return Some("is the root directory");
    }
    if path.contains('\0') {
        return Some("contains a NUL byte");
    }
    if path.ends_with('/') {
        return Some("ends with `/` (not normalized)");
    }
    path[1..].split('/').find_map(|seg| match seg {
        "" => Some("contains `//` (not normalized)"),
        "." | ".." => Some("contains `.` or `..` segments (not normalized)"),
        _ => None,
    })
}

/// Label and annotation prefix the operator keeps for itself on run pods.
pub(crate) const RESERVED_PREFIX: &str = "sandbox.iterion.io/";

/// Whether a pod label key is the operator's: its prefix, or a key it sets itself (the pod
/// builder's labels; admission refuses them in `spec.podLabels`).
pub(crate) fn reserved_key(key: &str) -> bool {
    key.starts_with(RESERVED_PREFIX)
        || key == "app.kubernetes.io/managed-by"
        || key == "app.kubernetes.io/name"
}

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
