//! The egress settings a filtered run needs from the operator under test: the proxy's address
//! and namespace on the bed, and the secret its tokens are signed with (in a file, as the chart
//! mounts it).

use std::path::Path;

use super::host_dir;
use super::operator::Operator;

/// The secret the operator signs egress tokens with in these tests.
pub const EGRESS_TOKEN_SECRET: &str = "bed-egress-token-secret-0123456789";

/// A file holding [`EGRESS_TOKEN_SECRET`] (a line, as a mounted Secret has it).
pub fn egress_secret_file() -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(f.path(), format!("{EGRESS_TOKEN_SECRET}\n")).expect("write secret");
    f
}

/// The operator watching `ns` with the egress proxy `egress.sys.svc:3128`, its tokens signed
/// with the secret in `secret`, a `file://` store of its own (`store-<tag>-<ns>`), and `more`
/// flags.
pub fn egress_operator(ns: &str, tag: &str, secret: &Path, more: &[&str]) -> Operator {
    let store = host_dir(&format!("store-{tag}-{ns}"));
    Operator::builder(ns, &format!("file://{}", store.display()))
        .flags(&[
            "--egress-proxy-url",
            "http://egress.sys.svc:3128",
            "--egress-proxy-namespace",
            "sys",
            "--egress-token-secret-file",
            secret.to_str().expect("utf-8 path"),
        ])
        .flags(more)
        .start()
}
