//! The columns `kubectl get` prints for each kind (the CRDs' `additionalPrinterColumns`, from
//! src/api.rs) and what the documentation shows of them: the "Columns of `kubectl get`" table of
//! docs/user-guide.md is rendered from the CRDs
//! ([`the_columns_table_is_the_crds`]), and every `kubectl get` the README and the docs show with
//! its output has the header those columns print ([`every_shown_kubectl_get_has_the_crds_columns`]).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition,
};
use kube::CustomResourceExt;

use super::{cell, check_or_write, shipped};
use crate::api::{ClusterSandboxRunTemplate, SandboxRun, SandboxRunPool, SandboxRunTemplate};

const DOC: &str = "docs/user-guide.md";

/// The documents whose `console` blocks show `kubectl get` output.
const SHOWN_IN: [&str; 6] = [
    "README.md",
    "docs/user-guide.md",
    "docs/operations.md",
    "docs/gitops.md",
    "docs/architecture.md",
    "charts/sandboxrun-operator/README.md",
];

fn crds() -> [CustomResourceDefinition; 4] {
    [
        SandboxRun::crd(),
        SandboxRunTemplate::crd(),
        ClusterSandboxRunTemplate::crd(),
        SandboxRunPool::crd(),
    ]
}

fn columns(crd: &CustomResourceDefinition) -> Vec<CustomResourceColumnDefinition> {
    crd.spec
        .versions
        .first()
        .and_then(|v| v.additional_printer_columns.clone())
        .unwrap_or_default()
}

/// The table docs/user-guide.md shows between its `printer-columns` markers.
fn columns_table() -> String {
    let mut out =
        String::from("| Kind | Column | Shown | From | What it shows |\n|---|---|---|---|---|\n");
    for crd in crds() {
        let names = &crd.spec.names;
        let short = names.short_names.clone().unwrap_or_default().join("`, `");
        for c in columns(&crd) {
            let shown = if c.priority.unwrap_or(0) == 0 {
                "always"
            } else {
                "`-o wide`"
            };
            let what = c
                .description
                .as_deref()
                .map(cell)
                .unwrap_or_else(|| "—".into());
            out.push_str(&format!(
                "| {} (`{short}`) | `{}` | {shown} | `{}` | {what} |\n",
                names.kind,
                c.name.to_uppercase(),
                c.json_path
            ));
        }
    }
    out
}

#[test]
fn the_columns_table_is_the_crds() {
    check_or_write(DOC, "printer-columns", &columns_table());
}

/// The header `kubectl get <what> <args>` prints, when `what` names one of `crds`: NAMESPACE with
/// `-A`, NAME, then the columns (all of them with `-o wide`); `None` for any other resource or
/// output format.
fn expected_header(crds: &[CustomResourceDefinition], command: &str) -> Option<Vec<String>> {
    let mut words = command.split_whitespace().skip(2); // `kubectl get`
    let what = words.next()?;
    let crd = crds.iter().find(|crd| {
        let n = &crd.spec.names;
        let mut all = vec![n.plural.clone(), n.kind.to_lowercase()];
        all.extend(n.singular.clone());
        all.extend(n.short_names.clone().unwrap_or_default());
        all.iter()
            .any(|a| a == what || what.starts_with(&format!("{a}.")))
    })?;
    let args: Vec<&str> = words.take_while(|w| !w.starts_with('#')).collect();
    let mut wide = false;
    for (i, a) in args.iter().enumerate() {
        let output = a.strip_prefix("-o").or_else(|| a.strip_prefix("--output"));
        if let Some(o) = output {
            let o = o.trim_start_matches('=');
            let o = if o.is_empty() {
                args.get(i + 1).copied().unwrap_or("")
            } else {
                o
            };
            if o != "wide" {
                return None;
            }
            wide = true;
        }
    }
    let mut header = Vec::new();
    if args.iter().any(|a| *a == "-A" || *a == "--all-namespaces") {
        header.push("NAMESPACE".to_string());
    }
    header.push("NAME".to_string());
    header.extend(
        columns(crd)
            .into_iter()
            .filter(|c| wide || c.priority.unwrap_or(0) == 0)
            .map(|c| c.name.to_uppercase()),
    );
    Some(header)
}

/// Every `$ kubectl get …` line of a `console` block followed by a `NAME …` header line: the
/// line's number, the command and the header's words.
fn shown_gets(doc: &str) -> Vec<(usize, String, Vec<String>)> {
    let lines: Vec<&str> = doc.lines().collect();
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let command = l.strip_prefix("$ ")?.trim();
            let header = lines.get(i + 1)?;
            let is_get = command.starts_with("kubectl get ");
            let is_header = header.split_whitespace().any(|w| w == "NAME");
            (is_get && is_header).then(|| {
                let words = header.split_whitespace().map(String::from).collect();
                (i + 1, command.to_string(), words)
            })
        })
        .collect()
}

/// What `doc` shows that the CRDs would not print: `file:line: command: shown vs printed`.
fn wrong_headers(file: &str, doc: &str, crds: &[CustomResourceDefinition]) -> Vec<String> {
    shown_gets(doc)
        .into_iter()
        .filter_map(|(line, command, shown)| {
            let printed = expected_header(crds, &command)?;
            (printed != shown).then(|| {
                format!("{file}:{line}: `{command}` shows {shown:?}, kubectl prints {printed:?}")
            })
        })
        .collect()
}

#[test]
fn every_shown_kubectl_get_has_the_crds_columns() {
    let crds = crds();
    let wrong: Vec<String> = SHOWN_IN
        .iter()
        .flat_map(|f| wrong_headers(f, &shipped(f), &crds))
        .collect();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The README shows one, so this test reads what it claims to.
    assert!(!shown_gets(&shipped("README.md")).is_empty());
}

#[test]
fn a_shown_header_that_lost_a_column_is_found() {
    let crds = crds();
    let printed = |command: &str| expected_header(&crds, command).unwrap_or_default();
    let (plain, wide) = (
        printed("kubectl get sbr"),
        printed("kubectl get sbr -o wide"),
    );
    assert_eq!(plain[..2], ["NAME", "PHASE"]);
    assert!(wide.len() > plain.len() && wide.starts_with(&plain));
    let all_but_second = |h: &[String]| [&h[..1], &h[2..]].concat().join("  ");
    let doc = format!(
        "```console\n$ kubectl get sbr\n{}\nr  Running  r-sbr  1m\n\
         $ kubectl get sbr -o wide\n{}\n\
         $ kubectl get pods\nNAME READY\n$ kubectl get sbr -o yaml\nNAME\n\
         $ kubectl get sbr -A\nNAMESPACE {}\n$ kubectl get sbrp # the pools\n{}\n```\n",
        all_but_second(&plain),
        plain.join(" "),
        plain.join(" "),
        printed("kubectl get sbrp").join(" "),
    );
    let wrong = wrong_headers("d.md", &doc, &crds);
    assert_eq!(wrong.len(), 2, "{wrong:#?}");
    assert!(
        wrong[0].starts_with("d.md:2: `kubectl get sbr`"),
        "{}",
        wrong[0]
    );
    assert!(
        wrong[1].starts_with("d.md:5: `kubectl get sbr -o wide`"),
        "{}",
        wrong[1]
    );
}
