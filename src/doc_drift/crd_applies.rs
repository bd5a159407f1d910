//! Every CRD, everywhere one is applied: the operator serves four kinds (runs, templates of
//! both scopes, pools), so a document or script that applies one CRD file by name (issue #56:
//! the docs applied three, the demo one) leaves a cluster where templated runs and warm pools
//! fail. They apply the directory (`crds/`, `dist/<version>/crds/`) instead.

use std::path::Path;

use super::shipped;

/// The documents and scripts that tell or run `kubectl apply` of the CRDs.
fn appliers() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<String> = [
        "README.md",
        "CONTRIBUTING.md",
        "charts/sandboxrun-operator/README.md",
    ]
    .map(String::from)
    .into();
    for (dir, ext) in [("docs", ".md"), ("hack", ".sh"), ("bench", ".sh")] {
        let path = root.join(dir);
        let entries =
            std::fs::read_dir(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(ext) {
                files.push(format!("{dir}/{name}"));
            }
        }
    }
    files.sort();
    files
}

/// The lines of `text` that `kubectl apply` one CRD file by name (`…/<plural>.sandbox.iterion.io.yaml`).
fn single_crd_applies(text: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.contains("kubectl apply") && l.contains(".sandbox.iterion.io.yaml"))
        .map(|l| l.trim().to_string())
        .collect()
}

#[test]
fn every_document_and_script_applies_all_four_crds_never_one_by_name() {
    let found: Vec<String> = appliers()
        .iter()
        .flat_map(|file| {
            single_crd_applies(&shipped(file))
                .into_iter()
                .map(move |line| format!("{file}: {line}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "apply the CRD directory (all four kinds), not one file:\n{}",
        found.join("\n")
    );
}

#[test]
fn a_single_crd_apply_is_found_and_a_directory_apply_is_not() {
    let text = "kubectl apply -f crds/sandboxruns.sandbox.iterion.io.yaml\n\
                kubectl apply --server-side -f dist/0.3.0/crds/\n\
                kubectl wait --for condition=established crd/sandboxruns.sandbox.iterion.io\n";
    assert_eq!(
        single_crd_applies(text),
        vec!["kubectl apply -f crds/sandboxruns.sandbox.iterion.io.yaml".to_string()]
    );
}
