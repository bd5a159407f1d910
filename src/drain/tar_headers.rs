//! What the drain reads of a tar entry's headers besides the parser's answer: where the parser
//! will read the next header, an entry's PAX records, and names and bounded renderings for the
//! records of what was not stored.

use tokio::io::AsyncRead;

/// Where the parser reads the header after `entry`: its content starts at its file position and
/// the parser skips what it takes as the entry's size, padded to a block. That size is the
/// effective one (a PAX `size` record overrides the header's), except for an old GNU sparse entry
/// (`S`), whose effective size is the expanded file while the parser skips only the stored bytes
/// (the header's size, or its PAX `size`). Counting anything else — e.g. the larger of the header
/// and PAX sizes — would let a hostile stream widen the header window to what it pleases.
pub(super) async fn parser_next_header<R: AsyncRead + Unpin>(
    entry: &mut tokio_tar::Entry<R>,
) -> u64 {
    let skipped = if entry.header().entry_type().as_byte() == b'S' {
        match pax_value(entry, b"size").await {
            Some(v) => std::str::from_utf8(&v)
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0),
            None => entry.header().raw_entry_size().unwrap_or(0),
        }
    } else {
        entry.effective_size()
    };
    entry
        .raw_file_position()
        .saturating_add(skipped.div_ceil(512).saturating_mul(512))
}

/// `bytes` rendered lossily, cut to at most `limit` bytes (on a character boundary) with the
/// full length said when cut.
pub(super) fn bounded_lossy(bytes: &[u8], limit: usize) -> String {
    if bytes.len() <= limit {
        return String::from_utf8_lossy(bytes).into_owned();
    }
    let mut text = String::from_utf8_lossy(&bytes[..limit]).into_owned();
    text.push_str(&format!("... ({} bytes)", bytes.len()));
    text
}

/// Words for an extension header's type flag.
pub(super) fn extension_name(type_byte: u8) -> &'static str {
    match type_byte {
        b'L' => "a GNU long name",
        b'K' => "a GNU long link",
        _ => "a PAX extended header",
    }
}

/// The value of the last PAX record `key` of a file, directory or symlink entry, if it has one.
/// Only called for those kinds, whose PAX records the parser already holds: reads nothing from
/// the stream (the records were bounded by the header window when they were parsed).
pub(super) async fn pax_value<R: AsyncRead + Unpin>(
    entry: &mut tokio_tar::Entry<R>,
    key: &[u8],
) -> Option<Vec<u8>> {
    match entry.pax_extensions().await {
        Ok(Some(records)) => records
            .flatten()
            .filter(|r| r.key_bytes() == key)
            .last()
            .map(|r| r.value_bytes().to_vec()),
        _ => None,
    }
}

/// Whether a regular entry carries GNU sparse PAX records (its content is a sparse map, not data).
pub(super) async fn has_gnu_sparse_records<R: AsyncRead + Unpin>(
    entry: &mut tokio_tar::Entry<R>,
) -> bool {
    // Only ever called for regular entries, whose PAX records the parser already holds: this
    // reads nothing from the stream.
    match entry.pax_extensions().await {
        Ok(Some(records)) => records
            .flatten()
            .any(|r| r.key_bytes().starts_with(b"GNU.sparse.")),
        _ => false,
    }
}
