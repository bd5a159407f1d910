//! `sandboxrun-operator`: see `sandboxrun_operator::cmd`.
fn main() -> std::process::ExitCode {
    sandboxrun_operator::cmd::main()
}
