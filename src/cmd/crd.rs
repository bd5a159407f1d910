//! `sandboxrun-operator crd`: the SandboxRun CustomResourceDefinition as YAML (with
//! `--template`, the SandboxRunTemplate one; with `--cluster-template`, the
//! ClusterSandboxRunTemplate one; with `--pool`, the SandboxRunPool one).

use std::process::ExitCode;

/// `crd`'s flags.
#[derive(clap::Args, Debug, Default)]
pub(crate) struct CrdArgs {
    /// Print the SandboxRunTemplate CRD instead (docs/contract.md "Templates").
    #[arg(long)]
    pub(crate) template: bool,
    /// Print the ClusterSandboxRunTemplate CRD instead (docs/contract.md "Templates").
    #[arg(long, conflicts_with = "template")]
    pub(crate) cluster_template: bool,
    /// Print the SandboxRunPool CRD instead (docs/user-guide.md "Sandboxes for agents: warm
    /// pools").
    #[arg(long, conflicts_with_all = ["template", "cluster_template"])]
    pub(crate) pool: bool,
}

/// Prints the CRD.
pub(crate) fn main(args: &CrdArgs) -> ExitCode {
    use crate::crdgen::Which;
    let which = match (args.template, args.cluster_template, args.pool) {
        (_, _, true) => Which::Pool,
        (_, true, _) => Which::ClusterTemplate,
        (true, false, false) => Which::Template,
        (false, false, false) => Which::Run,
    };
    match crate::crdgen::crd_yaml(which) {
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
