//! The workload's proxy variables (docs/contract.md "ADR-006 network rules: validated and
//! enforced"): `HTTP_PROXY`/`HTTPS_PROXY` and their lowercase twins carry the proxy URL with the
//! run's credentials; `NO_PROXY`/`no_proxy` list what is reached directly.

use k8s_openapi::api::core::v1::EnvVar;

use crate::api::SandboxRun;
use crate::egress::mode::{egress_of, Egress};
use crate::egress::settings::EgressSettings;
use crate::egress::token::token;

/// Every variable the operator sets for the proxy; a user's own value of one is dropped.
pub(crate) const PROXY_ENV: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
];

/// The proxy variables of a run's workload: empty when its egress is open or denied outright,
/// when no proxy is configured, or when the proxy URL cannot carry credentials.
pub fn proxy_env(run: &SandboxRun, settings: &EgressSettings) -> Vec<EnvVar> {
    let (Some(proxy), Some(secret), Some(uid)) = (
        &settings.proxy,
        &settings.token_secret,
        run.metadata.uid.as_deref(),
    ) else {
        return Vec::new();
    };
    if !matches!(egress_of(run), Ok(Egress::Filtered { .. })) {
        return Vec::new();
    }
    let Some(url) = proxy_url(&proxy.url, uid, &token(&secret.0, uid)) else {
        return Vec::new();
    };
    let var = |name: &str, value: &str| EnvVar {
        name: name.to_string(),
        value: Some(value.to_string()),
        value_from: None,
    };
    vec![
        var("HTTP_PROXY", &url),
        var("HTTPS_PROXY", &url),
        var("http_proxy", &url),
        var("https_proxy", &url),
        var("NO_PROXY", &settings.no_proxy),
        var("no_proxy", &settings.no_proxy),
    ]
}

/// `base` with `uid:token` as userinfo.
pub fn proxy_url(base: &str, uid: &str, token: &str) -> Option<String> {
    let mut url = url::Url::parse(base).ok()?;
    url.set_username(uid).ok()?;
    url.set_password(Some(token)).ok()?;
    Some(url.to_string().trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;
    use crate::api::NetworkMode;
    use crate::egress::settings::{PeerSelector, ProxyPeer, TokenSecret};

    fn settings() -> EgressSettings {
        EgressSettings {
            proxy: Some(ProxyPeer {
                url: "http://proxy.sys.svc:3128".into(),
                selector: PeerSelector {
                    namespace: "sys".into(),
                    pod_labels: BTreeMap::from([("app".into(), "proxy".into())]),
                },
                port: 3128,
                canary_port: None,
                address: None,
            }),
            token_secret: Some(TokenSecret(Arc::from(b"s3cret".as_slice()))),
            ..EgressSettings::default()
        }
    }

    fn run(mode: NetworkMode, rules: &[&str]) -> SandboxRun {
        crate::testkit::sandbox_run("r")
            .uid("uid-1")
            .network(mode, rules)
            .build()
    }

    #[test]
    fn a_filtered_run_gets_the_proxy_with_its_token() {
        let env = proxy_env(
            &run(NetworkMode::Allowlist, &["**.example.com"]),
            &settings(),
        );
        let names: Vec<&str> = env.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names.len(), PROXY_ENV.len());
        for n in PROXY_ENV {
            assert!(names.contains(&n), "{n}");
        }
        let url = env[0].value.clone().unwrap();
        let t = token(b"s3cret", "uid-1");
        assert_eq!(url, format!("http://uid-1:{t}@proxy.sys.svc:3128"));
        assert_eq!(
            env[4].value.as_deref(),
            Some(crate::egress::settings::DEFAULT_NO_PROXY)
        );
    }

    #[test]
    fn open_denied_or_unconfigured_runs_get_no_proxy() {
        assert!(proxy_env(&run(NetworkMode::Open, &[]), &settings()).is_empty());
        assert!(proxy_env(&run(NetworkMode::Allowlist, &[]), &settings()).is_empty());
        let unconfigured = EgressSettings::default();
        assert!(proxy_env(&run(NetworkMode::Denylist, &["x.com"]), &unconfigured).is_empty());
    }
}
