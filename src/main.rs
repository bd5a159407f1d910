//! `sandboxrun-operator`: see `sandboxrun_operator::cli`.
fn main() -> std::process::ExitCode {
    sandboxrun_operator::cli::main()
}
