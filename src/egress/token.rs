//! Per-run proxy credentials (docs/contract.md "ADR-006 network rules: validated and enforced").
//!
//! The workload's proxy URL carries `<run uid>:<token>` as userinfo, where the token is
//! HMAC-SHA256(secret, run uid) in hex: nothing to store, nothing to forge without the secret,
//! and the proxy finds the run (and its current rules) by the uid it is shown.

use base64::Engine;
use ring::hmac;

/// The token of the run with this uid.
pub fn token(secret: &[u8], run_uid: &str) -> String {
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hex::encode(hmac::sign(&key, run_uid.as_bytes()).as_ref())
}

/// Whether `token` is the token of `run_uid` (constant time).
pub fn verify(secret: &[u8], run_uid: &str, token: &str) -> bool {
    let Ok(tag) = hex::decode(token) else {
        return false;
    };
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    hmac::verify(&key, run_uid.as_bytes(), &tag).is_ok()
}

/// The `(uid, token)` of a `Proxy-Authorization: Basic …` header value, if it is one.
pub(crate) fn parse_basic(header: &str) -> Option<(String, String)> {
    let (scheme, rest) = header.trim().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

/// A `Proxy-Authorization` header value for a run (what clients derive from the proxy URL).
pub fn basic_header(run_uid: &str, token: &str) -> String {
    let raw = format!("{run_uid}:{token}");
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(raw)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_only_for_their_run_and_secret() {
        let t = token(b"secret", "uid-1");
        assert_eq!(t.len(), 64);
        assert!(verify(b"secret", "uid-1", &t));
        assert!(!verify(b"secret", "uid-2", &t));
        assert!(!verify(b"other", "uid-1", &t));
        assert!(!verify(b"secret", "uid-1", "zz"));
        assert!(!verify(b"secret", "uid-1", ""));
    }

    #[test]
    fn basic_credentials_round_trip() {
        let h = basic_header("uid-1", "abc");
        assert_eq!(parse_basic(&h), Some(("uid-1".into(), "abc".into())));
        assert_eq!(parse_basic("Bearer x"), None);
        assert_eq!(parse_basic("Basic !!!"), None);
    }
}
