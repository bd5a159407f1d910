//! A store per namespace (docs/contract.md "A store per namespace"; issue #29 item 1), on the
//! real control plane with the bed's real object stores: two namespaces name two stores with
//! different credentials (the bed's S3 server s3s-fs and Azure's Azurite, each checking its own
//! key) in their `sandboxrun-store` ConfigMaps; their runs drain side by side, each into its own
//! store only, nothing into the operator's; `retention: Delete` deletes from the tenant's store
//! only that run's objects; `files get -n` reads each back from its namespace's store. A store
//! that cannot be used when a run would start (a Secret not there yet, a named ConfigMap that
//! does not exist, an endpoint the platform did not allow) holds the run without a pod, naming
//! it; a Secret deleted mid-run fails the drain loudly, naming the store; nothing falls back to
//! the operator's store. kwok plays the node; its exec runs
//! `sandboxrun-operator pack` on this host.
//!
//! A gs:// tenant store (its Secret a service-account key whose URLs name the bed's
//! fake-gcs-server) is proven on the reader's side only, as in tests/it/store_backends.rs:
//! fake-gcs-server takes none of object_store's XML writes, so a drain into it fails (loudly, and
//! that is checked), and the objects `files` reads back are copied in through its JSON API.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use object_store::ObjectStoreExt;
use sandboxrun_operator::api::{Phase, ReadBackPhase, Retention, SandboxRun};
use sandboxrun_operator::store::{run_dir, store_from_url};

use crate::support::*;

/// A tenant store of the bed: its ConfigMap data (without `secretName`), its Secret's data, and
/// how the test itself opens it (URL and options) to look inside.
struct TenantStore {
    url: String,
    options_line: String,
    secret: BTreeMap<String, String>,
    reader_options: Vec<(String, String)>,
}

/// The bed's S3 server (s3s-fs) under a fresh short prefix (s3s-fs names files after keys).
fn s3_tenant() -> TenantStore {
    let s3 = s3();
    TenantStore {
        url: format!("s3://{}/ta{:04x}", s3.bucket, rand_u32() & 0xffff),
        options_line: format!(
            "endpoint={}\nallow_http=true\nregion=us-east-1",
            s3.endpoint
        ),
        secret: [
            ("AWS_ACCESS_KEY_ID".to_string(), s3.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY".to_string(), s3.secret_key.clone()),
        ]
        .into(),
        reader_options: s3.options(),
    }
}

/// The bed's Azurite under a fresh prefix.
fn azure_tenant() -> TenantStore {
    let account = bed_setting("SANDBOXRUN_TEST_AZURE_ACCOUNT");
    let key = bed_setting("SANDBOXRUN_TEST_AZURE_KEY");
    let endpoint = bed_setting("SANDBOXRUN_TEST_AZURE_ENDPOINT");
    let container = bed_setting("SANDBOXRUN_TEST_AZURE_CONTAINER");
    TenantStore {
        url: format!("az://{container}/tb{:04x}", rand_u32() & 0xffff),
        options_line: format!("endpoint={endpoint},allow_http=true"),
        secret: [
            ("AZURE_STORAGE_ACCOUNT_NAME".to_string(), account.clone()),
            ("AZURE_STORAGE_ACCOUNT_KEY".to_string(), key.clone()),
        ]
        .into(),
        reader_options: [
            ("account_name", account.as_str()),
            ("access_key", key.as_str()),
            ("endpoint", endpoint.as_str()),
            ("allow_http", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    }
}

/// A private key of a service account of the test's own (RSA, PEM), made now.
fn rsa_private_key_pem() -> String {
    let out = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
        ])
        .output()
        .expect("openssl (the test makes its service account's key with it)");
    assert!(
        out.status.success(),
        "openssl genpkey: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("PEM")
}

/// The bed's fake-gcs-server under a fresh prefix, with a service account's key whose
/// `gcs_base_url` is the server and whose `token_uri` is `token_uri` (default: the server's
/// `/token`). The bed's own key file is unsigned (`disable_oauth`) and keyless, which a tenant's
/// may not be: the test's key is a service account's, signed with a key of its own
/// (fake-gcs-server checks no signature).
fn gcs_tenant(token_uri: Option<String>) -> TenantStore {
    let endpoint = bed_setting("SANDBOXRUN_TEST_GCS_ENDPOINT");
    let bed_file = bed_setting("SANDBOXRUN_TEST_GCS_SERVICE_ACCOUNT");
    let text = std::fs::read_to_string(&bed_file).expect("the bed's GCS service account");
    let mut key: serde_json::Value = serde_json::from_str(&text).expect("service account");
    key.as_object_mut().expect("object").remove("disable_oauth");
    key["type"] = serde_json::json!("service_account");
    key["private_key"] = serde_json::json!(rsa_private_key_pem());
    key["private_key_id"] = serde_json::json!("tenant-stores-gcs");
    key["client_email"] = serde_json::json!("runs@tenant-stores.iam.gserviceaccount.com");
    key["gcs_base_url"] = serde_json::json!(endpoint);
    key["token_uri"] = serde_json::json!(token_uri.unwrap_or(format!("{endpoint}/token")));
    let key = key.to_string();
    TenantStore {
        url: format!("gs://{}", bed_setting("SANDBOXRUN_TEST_GCS_BUCKET")),
        options_line: "allow_http=true".into(),
        secret: [("GOOGLE_SERVICE_ACCOUNT_KEY".to_string(), key.clone())].into(),
        reader_options: vec![
            ("service_account_key".into(), key),
            ("allow_http".into(), "true".into()),
        ],
    }
}

/// The base64 lines of a PEM key (what must never reach a log).
fn key_material(tenant: &TenantStore) -> Vec<String> {
    let key: serde_json::Value =
        serde_json::from_str(&tenant.secret["GOOGLE_SERVICE_ACCOUNT_KEY"]).expect("json");
    key["private_key"]
        .as_str()
        .expect("private_key")
        .lines()
        .filter(|l| !l.starts_with("-----") && l.len() > 40)
        .map(str::to_string)
        .collect()
}

/// The endpoints the platform allows in these tests: the bed's S3 server and Azurite only.
fn allowed_endpoints() -> String {
    let azure = url::Url::parse(&bed_setting("SANDBOXRUN_TEST_AZURE_ENDPOINT")).expect("url");
    format!(
        "{},http://{}:{}",
        bed_setting("SANDBOXRUN_TEST_S3_ENDPOINT"),
        azure.host_str().expect("host"),
        azure.port().expect("port")
    )
}

/// Creates the store ConfigMap `name` and its Secret `<name>-creds` in `ns`.
async fn publish_store(client: &Client, ns: &str, name: &str, store: &TenantStore) {
    let secret_name = format!("{name}-creds");
    let configmap = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        data: Some(
            [
                ("url".to_string(), store.url.clone()),
                ("options".to_string(), store.options_line.clone()),
                ("secretName".to_string(), secret_name.clone()),
            ]
            .into(),
        ),
        ..Default::default()
    };
    let secret = store_secret(&secret_name, store);
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &configmap)
        .await
        .expect("create the store ConfigMap");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("create the store Secret");
}

/// The Secret `name` holding `store`'s credentials, labelled as store credentials (a Secret
/// without the label is never used: docs/contract.md "A store per namespace").
fn store_secret(name: &str, store: &TenantStore) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                [(
                    "sandbox.iterion.io/store-credentials".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        string_data: Some(store.secret.clone()),
        ..Default::default()
    }
}

/// Every file under `dir` (the operator's own file:// store).
fn files_in(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

/// `sandboxrun-operator files get <run> -n <ns>` with no --store-url and no store credentials
/// in its environment: the run's status names the store, its namespace's ConfigMap and Secret
/// give the credentials.
fn files_get_from_namespace(ns: &str, run: &str) -> std::path::PathBuf {
    let dest = host_dir(&format!("{run}-get"));
    files_from_namespace(&["get", run, "-n", ns, "-o", &dest.display().to_string()]);
    dest
}

/// `sandboxrun-operator files ARGS` with no store settings or credentials in its environment;
/// its standard output.
fn files_from_namespace(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sandboxrun-operator"))
        .arg("files")
        .args(args)
        .env("KUBECONFIG", kubeconfig_path())
        .env_remove("SANDBOXRUN_STORE_URL")
        .env_remove("SANDBOXRUN_STORE_OPTIONS")
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AZURE_STORAGE_ACCOUNT_KEY")
        .env_remove("GOOGLE_SERVICE_ACCOUNT")
        .env_remove("GOOGLE_SERVICE_ACCOUNT_KEY")
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .output()
        .expect("run files");
    assert!(
        out.status.success(),
        "files {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The first file under `dir`.
fn first_file(dir: &Path) -> std::path::PathBuf {
    files_in(dir)
        .into_iter()
        .next()
        .map(std::path::PathBuf::from)
        .unwrap_or_default()
}

/// Waits until the apiserver serves `spec.readBack.storeRef` (an updated CRD reaches the handler
/// a moment after it is Established; until then the field is pruned).
async fn wait_store_ref_served(api: &Api<SandboxRun>, out: &Path) {
    let mut probe = spec(&[out]).build();
    if let Some(r) = probe.read_back.as_mut() {
        r.store_ref = Some("probe".into());
    }
    let params = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        "the CRD to serve readBack.storeRef",
        Duration::from_secs(30),
        || {
            let (api, params) = (api.clone(), params.clone());
            let run = SandboxRun::new("probe", probe.clone());
            async move {
                let served = api.create(&params, &run).await.ok()?;
                (served.spec.store_ref() == Some("probe")).then_some(())
            }
        },
    )
    .await;
}

/// An operator watching `namespaces` with `flags` (tenant stores on), its own store a fresh
/// file:// directory named after `tag` (returned: nothing may fall back to it), and the host
/// path its runs read back, holding one file.
fn tenant_bed(namespaces: &str, tag: &str, flags: &[&str]) -> (Operator, PathBuf, PathBuf) {
    let own = host_dir(&format!("{tag}-operator"));
    let op = Operator::builder(namespaces, &format!("file://{}", own.display()))
        .flags(flags)
        .start();
    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"tenant data\n").unwrap();
    (op, own, out)
}

/// Waits until the run `name` is held before its pod: Ready=False, reason StoreUnusable.
async fn wait_held(runs: &Api<SandboxRun>, name: &str, op: &Operator) -> SandboxRun {
    wait_for(
        runs,
        name,
        op,
        PHASE_TIMEOUT,
        "Ready=False StoreUnusable",
        |r| {
            r.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Ready" && c.status == "False" && c.reason == "StoreUnusable"
                })
            })
        },
    )
    .await
}

#[tokio::test]
async fn two_namespaces_drain_side_by_side_each_into_its_own_store_and_delete_only_their_own() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns_a = TestNamespace::new(&client, "tenant-stores-a").await;
    let ns_b = TestNamespace::new(&client, "tenant-stores-b").await;
    let (a, b) = (s3_tenant(), azure_tenant());
    publish_store(&client, &ns_a.name, "sandboxrun-store", &a).await;
    publish_store(&client, &ns_b.name, "sandboxrun-store", &b).await;
    let (op, own, out) = tenant_bed(
        &format!("{},{}", ns_a.name, ns_b.name),
        "tenant-stores",
        &["--tenant-store-endpoints", &allowed_endpoints()],
    );
    let runs_a: Api<SandboxRun> = Api::namespaced(client.clone(), &ns_a.name);
    let runs_b: Api<SandboxRun> = Api::namespaced(client.clone(), &ns_b.name);
    let pods_a: Api<Pod> = Api::namespaced(client.clone(), &ns_a.name);
    let pods_b: Api<Pod> = Api::namespaced(client.clone(), &ns_b.name);

    // Side by side: both created, then both ended. The same run name in both namespaces.
    create(
        &runs_a,
        "job",
        spec(&[&out]).retention(Some(Retention::Delete)),
    )
    .await;
    create(
        &runs_b,
        "job",
        spec(&[&out]).retention(Some(Retention::Retain)),
    )
    .await;
    run_then_finish(&runs_a, &pods_a, "job", &op).await;
    run_then_finish(&runs_b, &pods_b, "job", &op).await;
    let run_a = wait_phase(&runs_a, "job", Phase::Succeeded, &op).await;
    let run_b = wait_phase(&runs_b, "job", Phase::Succeeded, &op).await;

    // Each status names its own tenant's store.
    let object_a = read_back(&run_a, 0).object.expect("object");
    let object_b = read_back(&run_b, 0).object.expect("object");
    assert!(
        object_a.starts_with(&format!("{}/", a.url)),
        "{object_a} not in {}",
        a.url
    );
    assert!(
        object_b.starts_with(&format!("{}/", b.url)),
        "{object_b} not in {}",
        b.url
    );

    // Each archive is in its own store, under its own namespace, and nowhere else.
    crypto();
    let (store_a, prefix_a) = store_from_url(&a.url, &a.reader_options).unwrap();
    let (store_b, prefix_b) = store_from_url(&b.url, &b.reader_options).unwrap();
    let dir_a = run_dir(&prefix_a, &run_ref(&ns_a.name, &run_a));
    let dir_b = run_dir(&prefix_b, &run_ref(&ns_b.name, &run_b));
    assert_eq!(
        keys_under(&store_a, &dir_a).await.len(),
        2,
        "archive + manifest"
    );
    let kept_b = keys_under(&store_b, &dir_b).await;
    assert_eq!(kept_b.len(), 2, "archive + manifest");
    assert_eq!(
        keys_under(&store_a, &prefix_a.clone().join(ns_b.name.as_str())).await,
        Vec::<String>::new(),
        "namespace B stored nothing in A's store"
    );
    assert_eq!(
        keys_under(&store_b, &prefix_b.clone().join(ns_a.name.as_str())).await,
        Vec::<String>::new(),
        "namespace A stored nothing in B's store"
    );
    assert_eq!(
        files_in(&own),
        Vec::<String>::new(),
        "nothing in the operator's store"
    );

    // `files get` without --store-url reads each run back from its namespace's store, with the
    // caller's right to read the ConfigMap and the Secret (no store credentials in its
    // environment).
    for ns in [&ns_a.name, &ns_b.name] {
        let dest = files_get_from_namespace(ns, "job");
        let got = std::fs::read_to_string(dest.join("00-out/result.txt"))
            .or_else(|_| std::fs::read_to_string(first_file(&dest)))
            .unwrap_or_default();
        assert_eq!(
            got, "tenant data\n",
            "files get -n {ns} read its namespace's store"
        );
    }

    // retention: Delete deletes A's run from A's store, with A's credentials; B's run (Retain)
    // keeps its objects in B's store.
    runs_a
        .delete("job", &DeleteParams::default())
        .await
        .unwrap();
    runs_b
        .delete("job", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&runs_a, "job", &op, PHASE_TIMEOUT).await;
    wait_gone(&runs_b, "job", &op, PHASE_TIMEOUT).await;
    let deleted = wait_event(
        &client,
        &ns_a.name,
        Some("job"),
        "ArchivesDeleted",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert!(
        deleted
            .note
            .as_deref()
            .is_some_and(|n| n.contains("deleted 2 stored objects")),
        "{deleted:?}"
    );
    assert_eq!(keys_under(&store_a, &dir_a).await, Vec::<String>::new());
    assert_eq!(
        keys_under(&store_b, &dir_b).await,
        kept_b,
        "B's run is Retain"
    );
    // No secret reached the operator's log (key ids and account names are not secrets).
    let log = op.log_text();
    let secrets = [&a.secret, &b.secret]
        .into_iter()
        .flat_map(|s| s.iter())
        .filter(|(k, _)| k.contains("SECRET") || k.ends_with("ACCOUNT_KEY"))
        .map(|(_, v)| v.as_str())
        .collect::<Vec<_>>();
    assert_eq!(secrets.len(), 2);
    for secret in secrets {
        assert!(
            !log.contains(secret),
            "a tenant secret is in the operator's log"
        );
    }
    for key in kept_b {
        let _ = store_b.delete(&key.as_str().into()).await;
    }
}

#[tokio::test]
async fn an_unusable_store_fails_the_drain_loudly_naming_it_and_never_falls_back() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "tenant-stores-fail").await;
    let tenant = s3_tenant();
    publish_store(&client, &ns.name, "sandboxrun-store", &tenant).await;
    // A store the run names whose endpoint the platform did not allow (the bed's other S3
    // server): its credentials must never be sent there.
    let rogue = TenantStore {
        options_line: format!(
            "endpoint={},allow_http=true,region=us-east-1",
            bed_setting("SANDBOXRUN_TEST_GOFAKES3_URL")
        ),
        ..s3_tenant()
    };
    publish_store(&client, &ns.name, "rogue", &rogue).await;
    let (op, own, out) = tenant_bed(
        &ns.name,
        "tenant-stores-fail",
        &["--tenant-store-endpoints", &allowed_endpoints()],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    wait_store_ref_served(&runs, &out).await;
    let named = |store: &str| {
        let mut s = spec(&[&out]).build();
        if let Some(r) = s.read_back.as_mut() {
            r.store_ref = Some(store.to_string());
        }
        s
    };

    // A run whose store's Secret does not exist yet gets no pod: Ready=False StoreUnusable,
    // naming the store; once the Secret exists it starts and drains into that store.
    publish_store(&client, &ns.name, "later", &tenant).await;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    secrets
        .delete("later-creds", &DeleteParams::default())
        .await
        .expect("delete the Secret");
    create(&runs, "held", named("later")).await;
    let held = wait_held(&runs, "held", &op).await;
    let message = held.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&format!("{}/later", ns.name))
            && message.contains("later-creds does not exist"),
        "{message}"
    );
    assert!(
        pods.get_opt("held-sbr").await.expect("get pod").is_none(),
        "no pod while the store cannot be used"
    );
    secrets
        .create(
            &PostParams::default(),
            &store_secret("later-creds", &tenant),
        )
        .await
        .expect("create the Secret");
    run_then_finish(&runs, &pods, "held", &op).await;
    let started = wait_phase(&runs, "held", Phase::Succeeded, &op).await;
    let object = read_back(&started, 0).object.expect("object");
    assert!(object.starts_with(&format!("{}/", tenant.url)), "{object}");

    // The namespace's Secret is deleted while the run runs: its drain fails, naming the store.
    create(&runs, "no-secret", spec(&[&out])).await;
    let running = wait_phase(&runs, "no-secret", Phase::Running, &op).await;
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .delete("sandboxrun-store-creds", &DeleteParams::default())
        .await
        .expect("delete the Secret");
    finish_workload(&pods, &pod_of(&running), 0).await;
    let ended = wait_final(&runs, "no-secret", &op, PHASE_TIMEOUT).await;
    let path = read_back(&ended, 0);
    assert_eq!(path.phase, ReadBackPhase::Failed, "{path:?}");
    let message = path.message.unwrap_or_default();
    let store = format!("{}/sandboxrun-store", ns.name);
    assert!(
        message.contains(&store) && message.contains("sandboxrun-store-creds does not exist"),
        "{message}"
    );
    assert_eq!(path.object, None, "nothing stored anywhere");
    let event = wait_event(
        &client,
        &ns.name,
        Some("no-secret"),
        "sandbox_runfiles_drain_failed",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert!(
        event.note.as_deref().is_some_and(|n| n.contains(&store)),
        "{event:?}"
    );

    // A store the run names that does not exist, and one whose endpoint is not allowed: the run
    // is held before its pod, naming the store and the reason.
    for (name, store, words) in [
        (
            "missing",
            "nope",
            format!("ConfigMap {}/nope does not exist", ns.name),
        ),
        (
            "rogue",
            "rogue",
            "not in the platform's --tenant-store-endpoints".to_string(),
        ),
    ] {
        create(&runs, name, named(store)).await;
        let held = wait_held(&runs, name, &op).await;
        let message = held.status.and_then(|s| s.message).unwrap_or_default();
        assert!(
            message.contains(&format!("{}/{store}", ns.name)) && message.contains(&words),
            "{name}: {message}"
        );
        assert!(pods
            .get_opt(&format!("{name}-sbr"))
            .await
            .expect("get pod")
            .is_none());
    }

    // Never a fallback: the operator's own store got nothing, the rogue endpoint nothing.
    assert_eq!(
        files_in(&own),
        Vec::<String>::new(),
        "nothing in the operator's store"
    );
    crypto();
    let gofakes3 = s3_options(
        &bed_setting("SANDBOXRUN_TEST_GOFAKES3_URL"),
        &bed_setting("SANDBOXRUN_TEST_GOFAKES3_ACCESS_KEY"),
        &bed_setting("SANDBOXRUN_TEST_GOFAKES3_SECRET_KEY"),
    );
    let rogue_url = rogue.url.replace(
        &s3().bucket,
        &bed_setting("SANDBOXRUN_TEST_GOFAKES3_BUCKET"),
    );
    let (rogue_store, rogue_prefix) = store_from_url(&rogue_url, &gofakes3).unwrap();
    assert_eq!(
        keys_under(&rogue_store, &rogue_prefix).await,
        Vec::<String>::new(),
        "nothing sent to the endpoint the platform did not allow"
    );
}

/// A namespace's store that refuses the namespace's own credentials (a wrong secret key in its
/// Secret, checked by the bed's S3 server) fails the path at once, and the message is the
/// tenant's to act on: it names the namespace's store ConfigMap and the Secret key to fix, not
/// the operator's credentials or settings (which the tenant can neither see nor change, and
/// which were not used). Fails on the code before this test: the path said "S3 refused the
/// operator's credentials … fix options access_key_id/… or the IRSA role".
#[tokio::test]
async fn a_tenant_store_refusing_its_namespace_s_key_fails_at_once_naming_that_store_s_secret() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "tenant-stores-key").await;
    let mut tenant = s3_tenant();
    tenant
        .secret
        .insert("AWS_SECRET_ACCESS_KEY".into(), "not-the-secret".into());
    publish_store(&client, &ns.name, "sandboxrun-store", &tenant).await;
    let (op, own, out) = tenant_bed(
        &ns.name,
        "tenant-stores-key",
        &["--tenant-store-endpoints", &allowed_endpoints()],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    // A drain timeout far longer than the test waits: a retried failure would still be Pending.
    create(
        &runs,
        "wrong-key",
        spec(&[&out]).drain_timeout("10m").build(),
    )
    .await;
    run_then_finish(&runs, &pods, "wrong-key", &op).await;
    let ended = wait_final(&runs, "wrong-key", &op, PHASE_TIMEOUT).await;
    let path = read_back(&ended, 0);
    assert_eq!(path.phase, ReadBackPhase::Failed, "{path:?}");
    assert!(path.attempts <= 1, "final, not retried: {path:?}");
    let message = path.message.unwrap_or_default();
    let config_map = format!("ConfigMap {}/sandboxrun-store", ns.name);
    for words in [
        "S3 refused the credentials of the namespace's store",
        config_map.as_str(),
        "AWS_SECRET_ACCESS_KEY",
    ] {
        assert!(message.contains(words), "{words:?} missing from: {message}");
    }
    assert!(
        !message.contains("operator") && !message.contains("IRSA"),
        "{message}"
    );
    assert_eq!(files_in(&own), Vec::<String>::new(), "never a fallback");
}

/// Issue #29 item 1 (the chart's narrowed Secrets): with `--tenant-store-secret-names`, a
/// namespace whose default store names another Secret holds its run before any pod, naming the
/// Secret and the names the platform allows; nothing is stored anywhere (without the flag the
/// same store drains, `two_namespaces_drain_side_by_side_each_into_its_own_store_and_delete_only_their_own`).
#[tokio::test]
async fn a_store_naming_a_secret_the_platform_did_not_name_is_refused_and_held() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "tenant-stores-names").await;
    let tenant = s3_tenant();
    publish_store(&client, &ns.name, "sandboxrun-store", &tenant).await;
    let (op, own, out) = tenant_bed(
        &ns.name,
        "tenant-stores-names",
        &[
            "--tenant-store-endpoints",
            &allowed_endpoints(),
            "--tenant-store-secret-names",
            "team-store-creds,other-creds",
        ],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "narrowed", spec(&[&out])).await;
    let held = wait_held(&runs, "narrowed", &op).await;
    let message = held.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&format!("{}/sandboxrun-store", ns.name))
            && message.contains("\"sandboxrun-store-creds\"")
            && message.contains("team-store-creds, other-creds"),
        "{message}"
    );
    assert!(
        pods.get_opt("narrowed-sbr")
            .await
            .expect("get pod")
            .is_none(),
        "no pod while the store names a Secret the platform did not name"
    );
    assert_eq!(files_in(&own), Vec::<String>::new(), "nothing stored");
}

/// Issue #38 item 4: a Secret is a store's credentials only when it says so. The namespace's
/// default store names a Secret without the label `sandbox.iterion.io/store-credentials: "true"`:
/// the run is held before any pod (`StoreUnusable`), the message naming the store, the Secret and
/// the label to add; nothing is stored anywhere. Labelled, the same Secret serves the run
/// (`two_namespaces_drain_side_by_side_each_into_its_own_store_and_delete_only_their_own`).
#[tokio::test]
async fn an_unlabelled_store_secret_holds_the_run_naming_the_label_to_add() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "tenant-stores-consent").await;
    let tenant = s3_tenant();
    publish_store(&client, &ns.name, "sandboxrun-store", &tenant).await;
    // The same credentials, without the label (any Secret of the namespace a ConfigMap editor
    // could name).
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns.name);
    let mut unlabelled = store_secret("sandboxrun-store-creds", &tenant);
    unlabelled.metadata.labels = None;
    secrets
        .replace(
            "sandboxrun-store-creds",
            &PostParams::default(),
            &unlabelled,
        )
        .await
        .expect("replace the Secret without its label");
    let (op, own, out) = tenant_bed(
        &ns.name,
        "tenant-stores-consent",
        &["--tenant-store-endpoints", &allowed_endpoints()],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "unconsented", spec(&[&out])).await;
    let held = wait_held(&runs, "unconsented", &op).await;
    let message = held.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&format!("{}/sandboxrun-store", ns.name))
            && message.contains(&format!("{}/sandboxrun-store-creds", ns.name))
            && message.contains("sandbox.iterion.io/store-credentials=true"),
        "{message}"
    );
    assert!(
        pods.get_opt("unconsented-sbr")
            .await
            .expect("get pod")
            .is_none(),
        "no pod while the store's Secret has not consented"
    );
    assert_eq!(files_in(&own), Vec::<String>::new(), "nothing stored");
}

/// Issue #29 item 1, gs://: a namespace's GCS store, its Secret a service account's key naming
/// the bed's fake-gcs-server (`gcs_base_url`, `token_uri`), which the platform allows. A run
/// draining into it fails loudly (fake-gcs-server takes no XML write: the module doc), naming the
/// store, and nothing falls back to the operator's store; a run drained earlier (into the
/// operator's store, before the namespace had one) whose objects are copied into the GCS store is
/// read back by `files ls|get -n` with the namespace's key only (no store setting or credential
/// in its environment: without the key the client would go to storage.googleapis.com).
#[tokio::test]
async fn a_namespace_s_gcs_store_is_read_back_with_its_own_key_and_a_drain_into_it_fails_loudly() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "tenant-stores-gcs").await;
    // The GCS store has no prefix (its runs' keys start with the test's own namespace), so the
    // first run's keys in the operator's file:// store, which its manifest records, are the keys
    // it would have had in the GCS store.
    let tenant = gcs_tenant(None);
    let own = host_dir("tenant-stores-gcs-operator");
    let own_url = format!("file://{}", own.display());
    let mut op = Operator::builder(&ns.name, &own_url)
        .flags(&[
            "--tenant-store-endpoints",
            &bed_setting("SANDBOXRUN_TEST_GCS_ENDPOINT"),
        ])
        .start();
    let out = host_dir("out");
    std::fs::write(out.join("result.txt"), b"tenant data\n").unwrap();
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);

    // Before the namespace has a store: the operator's.
    create(&runs, "job", spec(&[&out])).await;
    run_then_finish(&runs, &pods, "job", &op).await;
    let job = wait_phase(&runs, "job", Phase::Succeeded, &op).await;

    // The namespace's GCS store; a run now drains into it, and fails loudly.
    publish_store(&client, &ns.name, "sandboxrun-store", &tenant).await;
    create(&runs, "to-gcs", spec(&[&out]).drain_timeout("30s")).await;
    run_then_finish(&runs, &pods, "to-gcs", &op).await;
    let ended = wait_final(&runs, "to-gcs", &op, PHASE_TIMEOUT).await;
    let path = read_back(&ended, 0);
    assert_eq!(path.phase, ReadBackPhase::Failed, "{path:?}");
    assert_eq!(path.object, None, "{path:?}");
    let event = wait_event(
        &client,
        &ns.name,
        Some("to-gcs"),
        "sandbox_runfiles_drain_failed",
        Duration::from_secs(60),
        &op,
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    let note = event.note.clone().unwrap_or_default();
    assert!(note.contains(&tenant.url), "{note}");
    assert_eq!(
        files_in(&own)
            .iter()
            .filter(|f| f.contains("/to-gcs/"))
            .count(),
        0,
        "nothing of the GCS store's run in the operator's store"
    );
    let log = op.log_text();
    for line in key_material(&tenant) {
        assert!(
            !log.contains(&line),
            "the tenant's key is in the operator's log"
        );
    }
    op.kill();

    // The first run's objects into the GCS store, and its status naming them there (what a
    // drain into GCS would have written; the bed's server cannot take one).
    let (file_store, _) = store_from_url(&format!("file://{}", own.display()), &[]).unwrap();
    let dir = run_dir(
        &object_store::path::Path::default(),
        &run_ref(&ns.name, &job),
    );
    copy_into_gcs(&file_store, &dir).await;
    let moved: Vec<serde_json::Value> = job
        .status
        .as_ref()
        .expect("status")
        .read_back
        .iter()
        .map(|entry| {
            let mut entry = serde_json::to_value(entry).expect("entry");
            for field in ["object", "manifest"] {
                if let Some(text) = entry[field].as_str() {
                    entry[field] = serde_json::json!(text.replace(&own_url, &tenant.url));
                }
            }
            entry
        })
        .collect();
    assert!(
        moved[0]["object"]
            .as_str()
            .is_some_and(|o| o.starts_with(&format!("{}/", tenant.url))),
        "{moved:?}"
    );
    runs.patch_status(
        "job",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"readBack": moved}})),
    )
    .await
    .expect("patch the status");

    // `files ls|get -n` read it from the namespace's GCS store, with its key.
    let listing = files_from_namespace(&["ls", "job", "-n", &ns.name]);
    assert!(
        listing.contains("[Drained]") && listing.contains("result.txt"),
        "{listing}"
    );
    let dest = files_get_from_namespace(&ns.name, "job");
    let got = std::fs::read_to_string(dest.join("00-out/result.txt"))
        .or_else(|_| std::fs::read_to_string(first_file(&dest)))
        .unwrap_or_default();
    assert_eq!(
        got, "tenant data\n",
        "files get read the namespace's GCS store"
    );
    crypto();
    let (gcs, gcs_prefix) = store_from_url(&tenant.url, &tenant.reader_options).unwrap();
    assert_eq!(
        keys_under(
            &gcs,
            &gcs_prefix.clone().join(ns.name.as_str()).join("to-gcs")
        )
        .await,
        Vec::<String>::new(),
        "the failed drain left nothing in the GCS store"
    );
    for key in keys_under(&gcs, &gcs_prefix.clone().join(ns.name.as_str())).await {
        let _ = gcs.delete(&key.as_str().into()).await;
    }
}

/// Issue #29 item 1, gs://: a service-account key whose `token_uri` is not an endpoint the
/// platform allows holds the run before its pod, naming the store and the URL (the key's
/// `gcs_base_url`, the bed's fake-gcs-server, is allowed: every URL of the key is judged).
#[tokio::test]
async fn a_gcs_key_naming_a_token_uri_the_platform_did_not_allow_holds_the_run() {
    let client = client().await;
    ensure_crd(&client).await;
    let ns = TestNamespace::new(&client, "tenant-stores-gcs-held").await;
    let rogue_token = format!("{}/token", bed_setting("SANDBOXRUN_TEST_S3_ENDPOINT"));
    let tenant = gcs_tenant(Some(rogue_token.clone()));
    publish_store(&client, &ns.name, "sandboxrun-store", &tenant).await;
    let (op, own, out) = tenant_bed(
        &ns.name,
        "tenant-stores-gcs-held",
        &[
            "--tenant-store-endpoints",
            &bed_setting("SANDBOXRUN_TEST_GCS_ENDPOINT"),
        ],
    );
    let runs: Api<SandboxRun> = Api::namespaced(client.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    create(&runs, "held", spec(&[&out])).await;
    let held = wait_held(&runs, "held", &op).await;
    let message = held.status.and_then(|s| s.message).unwrap_or_default();
    assert!(
        message.contains(&format!("{}/sandboxrun-store", ns.name))
            && message.contains(&rogue_token)
            && message.contains("not in the platform's --tenant-store-endpoints"),
        "{message}"
    );
    for line in key_material(&tenant) {
        assert!(!message.contains(&line), "the key is in the message");
    }
    assert!(
        pods.get_opt("held-sbr").await.expect("get pod").is_none(),
        "no pod while the store's key names a URL the platform did not allow"
    );
    assert_eq!(files_in(&own), Vec::<String>::new(), "nothing stored");
}

/// Issue #38 item 2, on the bed with a tenant store on the S3 server: the tenant holds its
/// bucket's credentials, so it PUTs 300 MiB at its long-lived run's manifest key and 100,000 junk
/// keys under the run's directory, then stops the run and deletes it (`retention: Delete`). On
/// the old code the drain read the object whole before each attempt (peak RSS 1,239 MiB with
/// 1.2 GiB) until the drain timeout, and the finalizer deleted the junk one request at a time
/// (~300/s, unfinished after 300 s). Now: the path fails at once naming the object, the purge
/// deletes in batches within its budget, the operator's peak RSS stays far below the object's
/// size, and the neighbouring namespace's run finishes meanwhile.
#[tokio::test]
async fn a_tenants_own_objects_cannot_make_the_operator_read_or_delete_without_bound() {
    use futures::StreamExt;
    use sandboxrun_operator::store::object_keys;
    const OVERSIZED: usize = 300 * 1024 * 1024;
    const JUNK: usize = 100_000;
    let client = client().await;
    ensure_crd(&client).await;
    let hostile = TestNamespace::new(&client, "tenant-hostile").await;
    let neighbour = TestNamespace::new(&client, "tenant-neighbour").await;
    let (h, n) = (s3_tenant(), s3_tenant());
    publish_store(&client, &hostile.name, "sandboxrun-store", &h).await;
    publish_store(&client, &neighbour.name, "sandboxrun-store", &n).await;
    let (op, _own, out) = tenant_bed(
        &format!("{},{}", hostile.name, neighbour.name),
        "tenant-hostile",
        &["--tenant-store-endpoints", &allowed_endpoints()],
    );
    let runs_h: Api<SandboxRun> = Api::namespaced(client.clone(), &hostile.name);
    let runs_n: Api<SandboxRun> = Api::namespaced(client.clone(), &neighbour.name);
    let pods_n: Api<Pod> = Api::namespaced(client.clone(), &neighbour.name);
    create(
        &runs_h,
        "long",
        spec(&[&out]).retention(Some(Retention::Delete)),
    )
    .await;
    let long = wait_phase(&runs_h, "long", Phase::Running, &op).await;

    // The tenant's writes, with the tenant's own credentials.
    crypto();
    let (store, prefix) = store_from_url(&h.url, &h.reader_options).unwrap();
    let reference = run_ref(&hostile.name, &long);
    let keys = object_keys(
        &prefix,
        &reference,
        0,
        &out.display().to_string(),
        Default::default(),
    );
    store
        .put(&keys.manifest, vec![0u8; OVERSIZED].into())
        .await
        .expect("the tenant's oversized object at the manifest key");
    let dir = run_dir(&prefix, &reference);
    let junk = futures::stream::iter(0..JUNK)
        .map(|i| {
            let (store, key) = (
                store.clone(),
                dir.clone().join(format!("junk-{i:06}").as_str()),
            );
            async move { store.put(&key, b"j".to_vec().into()).await }
        })
        .buffer_unordered(64)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    assert_eq!(junk, 0, "every junk key written");

    // The neighbour's run starts and finishes while the hostile run is torn down.
    create(&runs_n, "job", spec(&[&out])).await;
    runs_h
        .patch(
            "long",
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"stop": true}})),
        )
        .await
        .expect("stop");
    let stopped = std::time::Instant::now();
    run_then_finish(&runs_n, &pods_n, "job", &op).await;
    wait_phase(&runs_n, "job", Phase::Succeeded, &op).await;
    let ended = wait_final(&runs_h, "long", &op, PHASE_TIMEOUT).await;
    let path = read_back(&ended, 0);
    assert_eq!(path.phase, ReadBackPhase::Failed, "{path:?}");
    let message = path.message.clone().unwrap_or_default();
    assert!(
        message.contains(keys.manifest.as_ref()) && message.contains(&OVERSIZED.to_string()),
        "the Failed path names the object and its size: {message}"
    );
    // At once, not after the drain timeout (60 s) of retried reads.
    assert!(
        stopped.elapsed() < Duration::from_secs(50),
        "failed after {:?}",
        stopped.elapsed()
    );

    // retention: Delete: the litter is deleted in batches; the finalizer lets go.
    runs_h
        .delete("long", &DeleteParams::default())
        .await
        .unwrap();
    let deleted = std::time::Instant::now();
    wait_gone(&runs_h, "long", &op, Duration::from_secs(180)).await;
    // The finalizer is held at most the drain timeout (60 s) and one purge budget; the object
    // at the manifest key goes first, by its known key.
    let held = deleted.elapsed();
    assert!(
        held < Duration::from_secs(100),
        "the finalizer held the run {held:?}"
    );
    let left = keys_under(&store, &dir).await;
    assert!(
        !left.iter().any(|k| k == keys.manifest.as_ref()),
        "the object at the manifest key was deleted"
    );
    println!(
        "retention: Delete of {JUNK} junk keys: the run released after {held:?}, {} keys left (s3s-fs lists slowly)",
        left.len()
    );
    let left: Vec<object_store::Result<object_store::path::Path>> =
        left.iter().map(|k| Ok(k.as_str().into())).collect();
    let _ = store
        .delete_stream(futures::stream::iter(left).boxed())
        .count()
        .await;
    let peak = peak_rss_kib(op.pid());
    assert!(
        peak < 200 * 1024,
        "the operator's peak RSS was {peak} KiB with a {OVERSIZED}-byte object at the manifest key"
    );
}

/// The peak resident set (`VmHWM`, KiB) of process `pid`.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM")
}
