//! Self-managed webhook certificates on the real apiserver: replicas starting together agree.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use sandboxrun_operator::admission::certs::ensure_secret;

use crate::support::*;

#[tokio::test]
async fn replicas_racing_to_create_the_webhook_secret_end_up_serving_the_same_certificate() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "certs").await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    let names = vec!["127.0.0.1".to_string(), "sandboxrun.svc".to_string()];
    let year = Duration::from_secs(365 * 86_400);
    let month = Duration::from_secs(30 * 86_400);
    let now = SystemTime::now();
    let calls = (0..4).map(|_| {
        let secrets = secrets.clone();
        let names = names.clone();
        let ns = ns.name.clone();
        async move { ensure_secret(&secrets, "webhook-tls", &ns, &names, now, year, month).await }
    });
    let results = futures::future::join_all(calls).await;
    let stored = secrets.get("webhook-tls").await.expect("the Secret exists");
    let stored_ca = stored
        .data
        .as_ref()
        .and_then(|d| d.get("ca.crt"))
        .map(|b| b.0.clone())
        .expect("ca.crt");
    for r in results {
        let bundle = r.expect("every replica gets a bundle, none fails on the race");
        assert_eq!(
            bundle.ca_cert_pem.as_bytes(),
            stored_ca.as_slice(),
            "every replica serves what is stored"
        );
    }
}
