//! Links the operator's release binary for the musl target (the image's) with the functions a
//! replica runs first, in the order of `link/hot-symbols.txt` (hack/code-order.sh, which also says
//! why: a busy replica then maps ~8 MiB of its executable instead of ~12, docs/performance.md
//! "Scale-out"). Through rust-lld, which every rustup toolchain ships; where it is missing the
//! binary is linked as before and the build says so. Other targets and profiles are untouched.

use std::path::{Path, PathBuf};
use std::process::Command;

const LIST: &str = "link/hot-symbols.txt";

fn main() {
    println!("cargo:rerun-if-changed={LIST}");
    println!("cargo:rerun-if-changed=build.rs");
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    if env("PROFILE") != "release" || env("CARGO_CFG_TARGET_ENV") != "musl" {
        return;
    }
    let list = Path::new(&env("CARGO_MANIFEST_DIR")).join(LIST);
    if !list.is_file() {
        println!("cargo:warning=no {LIST}: the binary is linked in the default order");
        return;
    }
    let Some(gcc_ld) = rust_lld_dir(&env("RUSTC"), &env("HOST")) else {
        println!(
            "cargo:warning=no rust-lld in the toolchain: the binary is linked in the default order"
        );
        return;
    };
    let bin = "cargo:rustc-link-arg-bin=sandboxrun-operator=";
    println!("{bin}-fuse-ld=lld");
    println!("{bin}-B{}", gcc_ld.display());
    println!("{bin}-Wl,--symbol-ordering-file={}", list.display());
    // Names from another toolchain or dependency version are skipped, not errors (--check counts them).
    println!("{bin}-Wl,--no-warn-symbol-ordering");
}

/// The toolchain's `gcc-ld` directory, whose `ld.lld` runs its rust-lld: `cc -B<dir> -fuse-ld=lld`.
fn rust_lld_dir(rustc: &str, host: &str) -> Option<PathBuf> {
    let out = Command::new(rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()?;
    let sysroot = String::from_utf8(out.stdout).ok()?;
    let dir = Path::new(sysroot.trim())
        .join("lib/rustlib")
        .join(host)
        .join("bin/gcc-ld");
    dir.join("ld.lld").is_file().then_some(dir)
}
