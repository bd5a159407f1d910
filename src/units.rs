//! Quantities and durations: ONE grammar for each, shared by admission (the spec's `sizeLimit`
//! and `drainTimeout`), the pod builder (which refuses again what admission refused) and the
//! command-line flags (`--default-cap`, `--holder-*`, `--drain-timeout`, `--wait-drained`…), so a
//! value one of them accepts is never refused by another.
//!
//! - A quantity is the Kubernetes one (apimachinery `resource.Quantity`): an optional sign, a
//!   decimal number (`1`, `1.5`, `.5`), then a binary suffix `Ki Mi Gi Ti Pi Ei`, a decimal suffix
//!   `n u m k M G T P E`, or an exponent `e<n>` / `E<n>`. [`quantity_to_bytes`] reads it as a byte
//!   count (refusing negatives and fractions of a byte), [`quantity_value`] as a number (CPU `10m`).
//! - A duration is the CRD schema's `^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$` (`90s`, `5m`, `1h30m`,
//!   `500ms`, `1.5s`), positive ([`parse_duration`]); the doctor, which has no schema, gives the
//!   apiserver's verdict.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use thiserror::Error;

/// One kibibyte.
pub const KIB: u64 = 1024;
/// One mebibyte.
pub const MIB: u64 = 1024 * KIB;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;

/// Why a quantity is not a byte count (or not a quantity at all).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub(crate) enum QuantityError {
    /// Not of the form `<number><suffix>`.
    #[error("not a quantity (expected e.g. 512Mi, 2Gi, 1.5G or 1000000)")]
    Syntax,
    /// Negative.
    #[error("a byte quantity cannot be negative")]
    Negative,
    /// `m`, `u`, `n` or a negative exponent: fractions of a byte.
    #[error("suffix `{0}` is a fraction of a byte; use Ki, Mi, Gi, Ti, k, M, G or T")]
    FractionalSuffix(String),
    /// Larger than u64.
    #[error("too large")]
    Overflow,
}

/// A quantity split into its parts (the grammar, once).
struct Parts<'a> {
    negative: bool,
    /// Digits before the decimal point (may be empty: `.5`).
    int_part: &'a str,
    /// Digits after it (may be empty: `5`).
    frac_part: &'a str,
    /// The suffix as written.
    suffix: &'a str,
    /// 1024 (binary suffixes) or 10 (decimal suffixes and exponents).
    base: u32,
    /// Power of `base` the suffix stands for.
    exp: i32,
}

fn parts(text: &str) -> Result<Parts<'_>, QuantityError> {
    let s = text.trim();
    let (negative, s) = match s.as_bytes().first() {
        Some(b'+') => (false, &s[1..]),
        Some(b'-') => (true, &s[1..]),
        _ => (false, s),
    };
    let num_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(num_end);
    let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
    if (int_part.is_empty() && frac_part.is_empty())
        || (number.contains('.') && frac_part.is_empty())
        || frac_part.contains('.')
    {
        return Err(QuantityError::Syntax);
    }
    let (base, exp): (u32, i32) = match suffix {
        "" => (10, 0),
        "Ki" => (1024, 1),
        "Mi" => (1024, 2),
        "Gi" => (1024, 3),
        "Ti" => (1024, 4),
        "Pi" => (1024, 5),
        "Ei" => (1024, 6),
        "n" => (10, -9),
        "u" => (10, -6),
        "m" => (10, -3),
        "k" => (10, 3),
        "M" => (10, 6),
        "G" => (10, 9),
        "T" => (10, 12),
        "P" => (10, 15),
        "E" => (10, 18),
        other => match other.strip_prefix(['e', 'E']) {
            Some(e) => {
                let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(QuantityError::Syntax);
                }
                (10, e.parse::<i32>().map_err(|_| QuantityError::Overflow)?)
            }
            None => return Err(QuantityError::Syntax),
        },
    };
    Ok(Parts {
        negative,
        int_part,
        frac_part,
        suffix,
        base,
        exp,
    })
}

/// A Kubernetes quantity as a byte count: plain bytes, binary suffixes, decimal suffixes from
/// `k` up, exponents (`1e9`) and decimals (`1.5Gi`); fractional results round up (as
/// `Quantity.Value()` does in Go).
pub(crate) fn quantity_to_bytes(q: &Quantity) -> Result<u64, QuantityError> {
    let p = parts(&q.0)?;
    if p.negative {
        return Err(QuantityError::Negative);
    }
    let exp = u32::try_from(p.exp).map_err(|_| QuantityError::FractionalSuffix(p.suffix.into()))?;
    // value = digits / 10^frac_len * base^exp, computed in u128.
    let digits = format!("{}{}", p.int_part, p.frac_part);
    let digits = digits.trim_start_matches('0');
    if digits.len() > 30 {
        return Err(QuantityError::Overflow);
    }
    let mantissa: u128 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| QuantityError::Syntax)?
    };
    let multiplier = u128::from(p.base)
        .checked_pow(exp)
        .ok_or(QuantityError::Overflow)?;
    let divisor = 10u128
        .checked_pow(p.frac_part.len() as u32)
        .ok_or(QuantityError::Overflow)?;
    let scaled = mantissa
        .checked_mul(multiplier)
        .ok_or(QuantityError::Overflow)?;
    u64::try_from(scaled.div_ceil(divisor)).map_err(|_| QuantityError::Overflow)
}

/// A non-negative Kubernetes quantity as a number (`500m` is 0.5, `1Ki` 1024): precise enough to
/// compare two settings, e.g. a request with its limit.
pub(crate) fn quantity_value(text: &str) -> Result<f64, QuantityError> {
    let p = parts(text)?;
    if p.negative {
        return Err(QuantityError::Negative);
    }
    let value: f64 = format!("{}.{}0", p.int_part, p.frac_part)
        .parse()
        .map_err(|_| QuantityError::Syntax)?;
    let value = value * f64::from(p.base).powi(p.exp);
    if value.is_finite() {
        Ok(value)
    } else {
        Err(QuantityError::Overflow)
    }
}

/// Why a duration does not parse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not `<number><unit>` repeated, with units ms, s, m, h (the CRD schema's grammar).
    #[error("not a duration of the form 90s, 5m, 1h30m, 500ms (units: ms, s, m, h)")]
    Syntax,
    /// Zero.
    #[error("the duration must be positive")]
    NotPositive,
}

/// Parses a positive duration in the CRD schema's grammar `^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
/// (`90s`, `5m`, `1h30m`, `500ms`, `1.5s`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    if !matches_schema_duration(text) {
        return Err(DurationError::Syntax);
    }
    let d: jiff::SignedDuration = text.parse().map_err(|_| DurationError::Syntax)?;
    if !d.is_positive() {
        return Err(DurationError::NotPositive);
    }
    Duration::try_from(d).map_err(|_| DurationError::Syntax)
}

fn matches_schema_duration(text: &str) -> bool {
    let b = text.as_bytes();
    let mut i = 0;
    if b.is_empty() {
        return false;
    }
    while i < b.len() {
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i < b.len() && b[i] == b'.' {
            i += 1;
            let fs = i;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
            if i == fs {
                return false;
            }
        }
        if b[i..].starts_with(b"ms") {
            i += 2;
        } else if i < b.len() && matches!(b[i], b's' | b'm' | b'h') {
            i += 1;
        } else {
            return false;
        }
    }
    true
}

/// A duration in short words, `kubectl get` style: `45s`, `2m30s`, `1h2m3s` (never negative).
pub(crate) fn short_duration(d: jiff::SignedDuration) -> String {
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

    #[test]
    fn quantities_parse_to_bytes() {
        let b = |s: &str| quantity_to_bytes(&Quantity(s.into()));
        assert_eq!(b("1024"), Ok(1024));
        assert_eq!(b("1Ki"), Ok(1024));
        assert_eq!(b("512Mi"), Ok(512 * 1024 * 1024));
        assert_eq!(b("1.5Gi"), Ok(1536 * 1024 * 1024));
        assert_eq!(b("2Ti"), Ok(2 << 40));
        assert_eq!(b("1k"), Ok(1000));
        assert_eq!(b("1.5M"), Ok(1_500_000));
        assert_eq!(b("3G"), Ok(3_000_000_000));
        assert_eq!(b("1T"), Ok(1_000_000_000_000));
        assert_eq!(b("1e3"), Ok(1000));
        assert_eq!(b("1E+3"), Ok(1000));
        assert_eq!(b("0.5"), Ok(1), "fractional bytes round up");
        assert_eq!(b(".5Ki"), Ok(512));
        assert_eq!(b("+1Ki"), Ok(1024));
        assert_eq!(b("0"), Ok(0));
        assert_eq!(b("-1"), Err(QuantityError::Negative));
        assert_eq!(b("1m"), Err(QuantityError::FractionalSuffix("m".into())));
        assert_eq!(
            b("1e-3"),
            Err(QuantityError::FractionalSuffix("e-3".into()))
        );
        assert_eq!(b("100000000Ei"), Err(QuantityError::Overflow));
        for bad in [
            "", "Gi", "1.Gi", "1KiB", "1 Gi", "1.2.3", "0x10", "1e", "1kk",
        ] {
            assert_eq!(b(bad), Err(QuantityError::Syntax), "{bad}");
        }
    }

    #[test]
    fn quantities_parse_to_values_with_the_same_grammar() {
        for good in [
            "10m", "0.5", "1", ".5", "64Mi", "1Gi", "1e3", "2k", "+1", "1e-3",
        ] {
            assert!(quantity_value(good).is_ok(), "{good} refused");
        }
        for bad in ["lots", "-1", "1.2.3", "10mi", "1 Gi", "Mi", "1e", ".", "1."] {
            assert!(quantity_value(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(quantity_value("500m"), Ok(0.5));
        assert_eq!(quantity_value("1Ki"), Ok(1024.0));
        assert_eq!(quantity_value("1e9999"), Err(QuantityError::Overflow));
        // What is a byte count is the same number either way.
        for text in ["1Gi", "1.5M", "3e2", "7"] {
            let bytes = quantity_to_bytes(&Quantity(text.into())).expect("bytes");
            assert_eq!(quantity_value(text), Ok(bytes as f64), "{text}");
        }
    }

    #[test]
    fn durations_follow_the_schema_grammar_and_are_positive() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0s"), Err(DurationError::NotPositive));
        for bad in [
            "",
            "5",
            "5 m",
            "PT5M",
            "-5m",
            "-5s",
            "5min",
            "m",
            "1.s",
            "5d",
            "soon",
            " 5m",
            "1h 30m",
            "5 minutes",
        ] {
            assert_eq!(parse_duration(bad), Err(DurationError::Syntax), "{bad}");
        }
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
