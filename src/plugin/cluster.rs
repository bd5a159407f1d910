//! The cluster as kubectl sees it: the kubeconfig (`--kubeconfig`, else `$KUBECONFIG`, else
//! `~/.kube/config`, else the in-cluster ServiceAccount), its context (`--context`, else the
//! current one) and that context's namespace, the default of `-n` (as kubectl's own default).

use std::path::PathBuf;

use clap::Args;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use thiserror::Error;

/// Which cluster and namespace: kubectl's own flags, so `kubectl sandboxrun … --context prod -n
/// jobs` reads as `kubectl get … --context prod -n jobs` does.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterArgs {
    /// Namespace of the run (default: the kubeconfig context's namespace, else `default`).
    #[arg(short = 'n', long, global = true)]
    pub namespace: Option<String>,
    /// The kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
}

/// Why the cluster cannot be reached.
#[derive(Debug, Error)]
pub enum ClusterError {
    /// No usable kubeconfig (nor in-cluster configuration).
    #[error("no usable kubeconfig: {0}")]
    Config(String),
    /// A client could not be built from it.
    #[error("cannot build a client from the kubeconfig: {0}")]
    Client(#[source] kube::Error),
}

/// The client configuration [`ClusterArgs`] name.
pub async fn config(args: &ClusterArgs) -> Result<Config, ClusterError> {
    if args.kubeconfig.is_none() && args.context.is_none() {
        return Config::infer()
            .await
            .map_err(|e| ClusterError::Config(e.to_string()));
    }
    let options = KubeConfigOptions {
        context: args.context.clone(),
        ..Default::default()
    };
    let config = match &args.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .map_err(|e| ClusterError::Config(format!("{}: {e}", path.display())))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    };
    config.map_err(|e| ClusterError::Config(e.to_string()))
}

/// A client and the namespace to use: `-n`, else the context's namespace.
pub async fn connect(args: &ClusterArgs) -> Result<(Client, String), ClusterError> {
    let config = config(args).await?;
    let namespace = namespace_or(args, &config.default_namespace);
    let client = Client::try_from(config).map_err(ClusterError::Client)?;
    Ok((client, namespace))
}

/// The namespace without talking to the cluster: `-n`, else the context's namespace, else
/// `default` when there is no kubeconfig at all (reading a store needs no cluster). A kubeconfig
/// or context named by a flag that cannot be used is an error, never silently `default`.
pub async fn namespace(args: &ClusterArgs) -> Result<String, ClusterError> {
    if let Some(n) = &args.namespace {
        return Ok(n.clone());
    }
    match config(args).await {
        Ok(config) => Ok(config.default_namespace),
        Err(e) if args.kubeconfig.is_none() && args.context.is_none() => {
            tracing::debug!(error = %e, "no kubeconfig: namespace `default`");
            Ok("default".to_string())
        }
        Err(e) => Err(e),
    }
}

fn namespace_or(args: &ClusterArgs, context_namespace: &str) -> String {
    args.namespace
        .clone()
        .unwrap_or_else(|| context_namespace.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: 'https://127.0.0.1:1'}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: one\n  context: {cluster: c, user: u, namespace: jobs}\n- name: two\n  context: {cluster: c, user: u}\ncurrent-context: one\n";

    fn kubeconfig() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("config");
        std::fs::write(&path, KUBECONFIG).expect("write kubeconfig");
        (dir, path)
    }

    #[tokio::test]
    async fn the_namespace_is_the_flag_else_the_contexts_else_default() {
        let (_dir, path) = kubeconfig();
        let mut args = ClusterArgs {
            kubeconfig: Some(path),
            ..Default::default()
        };
        let ns = |args: ClusterArgs| async move { namespace(&args).await.ok() };
        assert_eq!(
            ns(args.clone()).await.as_deref(),
            Some("jobs"),
            "the current context's"
        );
        args.context = Some("two".into());
        assert_eq!(
            ns(args.clone()).await.as_deref(),
            Some("default"),
            "a context without one"
        );
        args.namespace = Some("explicit".into());
        assert_eq!(ns(args.clone()).await.as_deref(), Some("explicit"));
        let missing = ClusterArgs {
            kubeconfig: Some("/nonexistent/kubeconfig".into()),
            ..Default::default()
        };
        assert!(matches!(
            namespace(&missing).await,
            Err(ClusterError::Config(m)) if m.contains("/nonexistent/kubeconfig")
        ));
    }

    #[tokio::test]
    async fn an_unknown_context_is_an_error_not_the_current_one() {
        let (_dir, path) = kubeconfig();
        let args = ClusterArgs {
            kubeconfig: Some(path),
            context: Some("nope".into()),
            ..Default::default()
        };
        assert!(config(&args).await.is_err());
        assert!(namespace(&args).await.is_err(), "not silently `default`");
    }
}
