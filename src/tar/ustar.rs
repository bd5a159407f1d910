//! Our tar dialect, written by the in-pod packer (`crate::inpod::pack`) and by the drain's
//! re-emitter (`crate::drain::archive`): ustar fields written as raw bytes (so a directory keeps
//! its trailing `/` and non-UTF-8 names survive), PAX records for what does not fit.

/// Name of the PAX `x` header entries we write (what a PAX-unaware reader would extract).
pub(crate) const PAX_HEADER_NAME: &[u8] = b"PaxHeader";
/// Name field placeholder when the real path is in a PAX record. Safe on purpose: a reader that
/// ignores PAX must not get a truncated path that could mean something else (`a/..`).
pub(crate) const LONG_NAME_PLACEHOLDER: &[u8] = b"pax-long-name";
/// Largest size the 11-digit octal ustar field holds.
pub(crate) const USTAR_MAX_SIZE: u64 = 0o777_7777_7777;
/// PAX key of a placeholder member: the file was dropped over the budget in the pod, and the
/// value is its size in decimal bytes (a vendor key, ignored by other readers).
pub(crate) const DROPPED_KEY: &[u8] = b"SANDBOXRUN.dropped";

const NAME: std::ops::Range<usize> = 0..100;
const LINK: std::ops::Range<usize> = 157..257;
const PREFIX: std::ops::Range<usize> = 345..500;

/// Writes path and link target into a ustar header block; returns the PAX records needed for
/// what did not fit (path, linkpath, size), empty when none are.
pub(crate) fn fill(block: &mut [u8; 512], path: &[u8], link: Option<&[u8]>, size: u64) -> Vec<u8> {
    let mut pax = Vec::new();
    block[NAME].fill(0);
    block[PREFIX].fill(0);
    match split(path) {
        Some((prefix, name)) => {
            block[PREFIX][..prefix.len()].copy_from_slice(prefix);
            block[NAME][..name.len()].copy_from_slice(name);
        }
        None => {
            block[NAME][..LONG_NAME_PLACEHOLDER.len()].copy_from_slice(LONG_NAME_PLACEHOLDER);
            pax.extend(record(b"path", path));
        }
    }
    block[LINK].fill(0);
    if let Some(link) = link {
        if link.len() <= LINK.len() {
            block[LINK][..link.len()].copy_from_slice(link);
        } else {
            block[LINK][..LONG_NAME_PLACEHOLDER.len()].copy_from_slice(LONG_NAME_PLACEHOLDER);
            pax.extend(record(b"linkpath", link));
        }
    }
    if size > USTAR_MAX_SIZE {
        pax.extend(record(b"size", size.to_string().as_bytes()));
    }
    pax
}

/// The PAX `x` header block that announces `records_len` bytes of PAX records (from [`fill`] and
/// [`record`]): what both the packer and the drain's re-emitter write in front of an entry whose
/// path, link target or size does not fit ustar.
pub(crate) fn pax_header(records_len: u64) -> [u8; 512] {
    let mut x = ::tar::Header::new_ustar();
    x.set_entry_type(::tar::EntryType::XHeader);
    x.set_mode(0o644);
    x.set_size(records_len);
    fill(x.as_mut_bytes(), PAX_HEADER_NAME, None, records_len);
    x.set_cksum();
    *x.as_bytes()
}

/// Splits a path into ustar (prefix, name) fields, if it fits.
fn split(path: &[u8]) -> Option<(&[u8], &[u8])> {
    if path.contains(&0) {
        return None;
    }
    if path.len() <= NAME.len() {
        return Some((&[], path));
    }
    // Split at a '/' (not the trailing one of a directory) leaving both halves in bounds.
    let body = path.strip_suffix(b"/").unwrap_or(path);
    body.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .map(|(i, _)| i)
        .find(|&i| i > 0 && i <= PREFIX.len() && path.len() - i - 1 <= NAME.len())
        .map(|i| (&path[..i], &path[i + 1..]))
}

/// One PAX record: `"<len> <key>=<value>\n"`, where len counts the whole record.
pub(crate) fn record(key: &[u8], value: &[u8]) -> Vec<u8> {
    let base = key.len() + value.len() + 3;
    let mut len = base + 1;
    while len != base + len.to_string().len() {
        len = base + len.to_string().len();
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(len.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(key);
    out.push(b'=');
    out.extend_from_slice(value);
    out.push(b'\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pax_header_announces_its_records_to_both_tar_readers() {
        let block = pax_header(42);
        let h = ::tar::Header::from_byte_slice(&block);
        assert_eq!(h.entry_type(), ::tar::EntryType::XHeader);
        assert_eq!(h.size().ok(), Some(42));
        assert_eq!(h.path_bytes().as_ref(), PAX_HEADER_NAME);
        let t = tokio_tar::Header::from_byte_slice(&block);
        assert_eq!(t.entry_type(), tokio_tar::EntryType::XHeader);
        assert_eq!(t.raw_entry_size().ok(), Some(42));
        assert_eq!(t.cksum().ok(), h.cksum().ok());
    }

    #[test]
    fn pax_record_length_counts_itself() {
        assert_eq!(record(b"path", b"abc"), b"12 path=abc\n".to_vec());
        let long = vec![b'x'; 95];
        let r = record(b"path", &long);
        let declared: usize =
            String::from_utf8_lossy(&r[..r.iter().position(|b| *b == b' ').unwrap_or(0)])
                .parse()
                .unwrap_or(0);
        assert_eq!(declared, r.len());
    }

    #[test]
    fn long_paths_split_into_prefix_and_name_or_go_to_pax() {
        let mut block = [0u8; 512];
        let path = format!("{}/{}", "d".repeat(120), "f".repeat(90));
        assert!(fill(&mut block, path.as_bytes(), None, 1).is_empty());
        assert_eq!(&block[PREFIX][..120], "d".repeat(120).as_bytes());
        let too_long = "e".repeat(300);
        let pax = fill(&mut block, too_long.as_bytes(), None, 1);
        assert!(String::from_utf8_lossy(&pax).contains(&format!("path={too_long}")));
        assert_eq!(
            &block[NAME][..LONG_NAME_PLACEHOLDER.len()],
            LONG_NAME_PLACEHOLDER
        );
    }
}
