//! Text as the operator shows it to people: cut to a byte bound on a character boundary (Event
//! notes, status messages, in-band notes), and made safe to print (`files ls`, `logs`).

use std::borrow::Cow;

/// The longest prefix of `text` of at most `limit` bytes that ends on a character boundary.
pub(crate) fn prefix(text: &str, limit: usize) -> &str {
    let mut end = text.len().min(limit);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Cuts `text` to at most `limit` bytes, on a character boundary.
pub(crate) fn truncate(text: &mut String, limit: usize) {
    let end = prefix(text, limit).len();
    text.truncate(end);
}

/// `text` as `files ls` prints it: control characters (C0, DEL, C1) and the backslash escaped
/// (`\x1b`, `\u{9b}`, `\\`), so a name from the pod can never drive the terminal or pass for
/// another line of the listing.
pub(crate) fn printable(text: &str) -> Cow<'_, str> {
    let needs = |c: char| c.is_control() || c == '\\';
    if !text.chars().any(needs) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x80 && c.is_control() => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// `text` cut to at most `limit` bytes on a character boundary, ending in `…` when cut (Event
/// notes, the workload's termination message in status).
pub(crate) fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let ellipsis = "…";
    format!(
        "{}{ellipsis}",
        prefix(text, limit.saturating_sub(ellipsis.len()))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_never_splits_a_character() {
        assert_eq!(prefix("héllo", 2), "h");
        assert_eq!(prefix("héllo", 3), "hé");
        assert_eq!(prefix("héllo", 100), "héllo");
        assert_eq!(prefix("", 0), "");
        assert_eq!(prefix("日本", 5), "日");
    }

    #[test]
    fn truncate_cuts_in_place_on_a_boundary() {
        let mut s = "ab€cd".to_string();
        truncate(&mut s, 4);
        assert_eq!(s, "ab");
        let mut s = "short".to_string();
        truncate(&mut s, 10);
        assert_eq!(s, "short");
    }

    #[test]
    fn cutting_keeps_whole_characters_and_marks_the_cut() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcdef", 5), "ab…");
        assert_eq!(cut("ééé", 5), "é…");
    }
}
