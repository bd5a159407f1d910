//! `sandboxrun-operator`: see `sandboxrun_operator::cmd`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    sandboxrun_operator::cmd::main()
}
