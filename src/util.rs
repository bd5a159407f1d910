//! Small shared helpers with no better home.

use sha2::{Digest, Sha256};

/// First 8 hex characters of the sha256 of `text`: a stable, short disambiguator for names.
pub fn short_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    hex::encode(&digest[..4])
}

/// A duration that did not parse.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("{text:?} is not a positive duration like 90s, 5m or 1h30m")]
pub struct DurationError {
    text: String,
}

/// Parses a positive duration in the friendly form used by the spec (`90s`, `5m`, `1h30m`, `500ms`).
pub fn parse_duration(text: &str) -> Result<std::time::Duration, DurationError> {
    let err = || DurationError {
        text: text.to_string(),
    };
    let d: jiff::SignedDuration = text.trim().parse().map_err(|_| err())?;
    if d.is_negative() || d.is_zero() {
        return Err(err());
    }
    std::time::Duration::try_from(d).map_err(|_| err())
}

/// Splits `key=value` options (store options from flags and environment).
pub fn parse_options(raw: &[String]) -> Result<Vec<(String, String)>, String> {
    raw.iter()
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            s.split_once('=')
                .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
                .ok_or_else(|| format!("store option {s:?} is not key=value"))
        })
        .collect()
}

/// A duration in short words, `kubectl get` style: `45s`, `2m30s`, `1h2m3s` (never negative).
pub fn short_duration(d: jiff::SignedDuration) -> String {
    let total = d.as_secs().max(0);
    let (h, m, s) = (total / 3600, total % 3600 / 60, total % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn friendly_durations_parse_and_nonsense_does_not() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn short_hash_is_stable_and_short() {
        assert_eq!(short_hash("a"), short_hash("a"));
        assert_ne!(short_hash("a"), short_hash("b"));
        assert_eq!(short_hash("a").len(), 8);
    }

    #[test]
    fn short_duration_reads_like_kubectl() {
        use jiff::SignedDuration as D;
        assert_eq!(short_duration(D::from_secs(3723)), "1h2m3s");
        assert_eq!(short_duration(D::from_secs(90)), "1m30s");
        assert_eq!(short_duration(D::from_secs(0)), "0s");
        assert_eq!(short_duration(D::from_secs(-5)), "0s");
    }
}
