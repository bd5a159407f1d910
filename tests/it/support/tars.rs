//! Tar streams the tests feed the drain in place of the real packer.

/// The first `sent` bytes of a tar whose one member (`big.bin`) claims `size` bytes: the start of
/// a stream that a stalled or cut-off packer would send.
pub fn truncated_tar(size: u64, sent: u64) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_path("big.bin").expect("path");
    h.set_size(size);
    h.set_mode(0o644);
    h.set_mtime(1_700_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut out = h.as_bytes().to_vec();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    out.reserve(sent as usize);
    for _ in 0..sent / 8 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}
