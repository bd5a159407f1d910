//! Words cut to a size on a character boundary: Event notes (the apiserver caps them at 1 KiB)
//! and the workload's termination message in status.

/// `text` cut to at most `limit` bytes on a character boundary, ending in `…` when cut.
pub(crate) fn cut(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let ellipsis = "…";
    let end = floor_char_boundary(text, limit.saturating_sub(ellipsis.len()));
    format!("{}{ellipsis}", &text[..end])
}

/// `text` truncated to at most `limit` bytes on a character boundary, with no mark.
pub(crate) fn truncate(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let end = floor_char_boundary(&text, limit);
        text.truncate(end);
    }
    text
}

/// The largest character boundary of `text` at or before `index`.
fn floor_char_boundary(text: &str, index: usize) -> usize {
    let mut end = index.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutting_keeps_whole_characters() {
        assert_eq!(cut("abc", 3), "abc");
        assert_eq!(cut("abcdef", 5), "ab…");
        assert_eq!(cut("ééé", 5), "é…");
        assert_eq!(truncate("ééé".to_string(), 5), "éé");
        assert_eq!(truncate("abc".to_string(), 10), "abc");
    }
}
