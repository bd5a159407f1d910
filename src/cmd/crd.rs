//! `sandboxrun-operator crd`: the SandboxRun CustomResourceDefinition as YAML (with
//! `--template`, the SandboxRunTemplate one).

use std::process::ExitCode;

/// `crd`'s flags.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct CrdArgs {
    /// Print the SandboxRunTemplate CRD instead (docs/contract.md "Templates").
    #[arg(long)]
    pub(crate) template: bool,
}

/// Prints the CRD.
pub(crate) fn main(args: &CrdArgs) -> ExitCode {
    match crate::crdgen::crd_yaml(args.template) {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cannot render the CRD: {e}");
            ExitCode::from(1)
        }
    }
}
