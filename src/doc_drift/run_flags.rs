//! The flags of `sandboxrun-operator run` and docs/operations.md: the "Every flag of `run`" table
//! is rendered from the command line's definition (clap), so a flag added, renamed or removed
//! without the doc fails [`the_run_flags_table_is_the_command_lines`]; and every flag the chart's
//! values table names is one the binary has ([`every_flag_the_values_table_names_exists`]).

use std::collections::BTreeSet;

use clap::CommandFactory;

use super::{cell, check_or_write, shipped};

const DOC: &str = "docs/operations.md";

/// The subcommand `name` of the binary's command line.
fn subcommand(name: &str) -> clap::Command {
    crate::cmd::Cli::command()
        .find_subcommand(name)
        .cloned()
        .unwrap_or_else(|| panic!("no subcommand {name}"))
}

/// The arguments a user sets by name (`--long`), in their declaration order: `--help`,
/// `--version` and hidden ones left out.
fn named_args(cmd: &clap::Command) -> Vec<&clap::Arg> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && a.get_long().is_some())
        .filter(|a| !matches!(a.get_id().as_str(), "help" | "version"))
        .collect()
}

fn long_names(cmd: &clap::Command) -> BTreeSet<String> {
    named_args(cmd)
        .into_iter()
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect()
}

/// One row: the flag, its environment variable, its default, its help's first paragraph.
fn row(arg: &clap::Arg) -> String {
    let flag = format!("`--{}`", arg.get_long().unwrap_or_default());
    let env = arg
        .get_env()
        .map(|e| format!("`{}`", e.to_string_lossy()))
        .unwrap_or_else(|| "—".into());
    let defaults: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|d| d.to_string_lossy().into_owned())
        .collect();
    let default = match defaults.as_slice() {
        [] => "—".to_string(),
        [d] if d.is_empty() => "`\"\"`".to_string(),
        ds => format!("`{}`", ds.join(",")),
    };
    let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
    format!("| {flag} | {env} | {default} | {} |\n", cell(&help))
}

/// The table docs/operations.md shows between its `run-flags` markers.
fn run_flags_table() -> String {
    let run = subcommand("run");
    let mut out =
        String::from("| Flag | Environment | Default | What it sets |\n|---|---|---|---|\n");
    for arg in named_args(&run) {
        out.push_str(&row(arg));
    }
    out
}

#[test]
fn the_run_flags_table_is_the_command_lines() {
    check_or_write(DOC, "run-flags", &run_flags_table());
}

/// The `--flags` named in the second column of docs/operations.md's values table (`| Value |
/// Flag | Default |`); a name ending in `*` stands for every flag it starts.
fn values_table_flags(doc: &str) -> BTreeSet<String> {
    let flag = regex::Regex::new(r"--[a-z][a-z0-9-]*\*?").unwrap_or_else(|e| panic!("{e}"));
    let mut lines = doc
        .lines()
        .skip_while(|l| !l.starts_with("| Value | Flag | Default |"));
    assert!(lines.next().is_some(), "{DOC} has no values table");
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.split(" | ").nth(1))
        .flat_map(|c| {
            flag.find_iter(c)
                .map(|m| m.as_str().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The named flags it has that `known` lacks.
fn unknown_flags(named: &BTreeSet<String>, known: &BTreeSet<String>) -> Vec<String> {
    named
        .iter()
        .filter(|f| match f.strip_suffix('*') {
            Some(prefix) => !known.iter().any(|k| k.starts_with(prefix)),
            None => !known.contains(*f),
        })
        .cloned()
        .collect()
}

#[test]
fn every_flag_the_values_table_names_exists() {
    // The table names the operator's flags, and the proxy's, the selftest's and the packer's
    // where a value reaches them.
    let known: BTreeSet<String> = ["run", "egress-proxy", "selftest", "pack"]
        .into_iter()
        .flat_map(|s| long_names(&subcommand(s)))
        .collect();
    let unknown = unknown_flags(&values_table_flags(&shipped(DOC)), &known);
    assert!(
        unknown.is_empty(),
        "{DOC}'s values table names flags the binary does not have: {unknown:?}"
    );
}

#[test]
fn a_flag_the_binary_lacks_is_found_in_the_values_table() {
    let doc = "| Value | Flag | Default |\n|---|---|---|\n| `a` | `--real`, `--gone` | 1 |\n\
               | `b` | `--webhook-*` (`--x`) | 2 |\n\nafter `--never`\n";
    let named = values_table_flags(doc);
    let known: BTreeSet<String> = ["--real", "--webhook-addr", "--x"].map(String::from).into();
    assert_eq!(unknown_flags(&named, &known), ["--gone"]);
    let without_webhook: BTreeSet<String> = ["--real", "--x"].map(String::from).into();
    assert_eq!(
        unknown_flags(&named, &without_webhook),
        ["--gone", "--webhook-*"]
    );
}

#[test]
fn the_table_has_a_row_for_every_run_flag_and_no_other() {
    let table = run_flags_table();
    let rows: BTreeSet<String> = table
        .lines()
        .skip(2)
        .filter_map(|l| l.split('`').nth(1).map(String::from))
        .collect();
    assert_eq!(rows, long_names(&subcommand("run")));
    assert!(rows.contains("--max-cap") && rows.contains("--store-url"));
}
