//! Smoke tests of the test bed itself: the channels the operator depends on, proven on the real
//! local control plane (kube-apiserver + etcd + kwok) and the real S3 server.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, PodSpec};
use kube::api::{AttachParams, DeleteParams, ObjectMeta, PostParams};
use kube::Api;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::AsyncReadExt;

use crate::support::*;

async fn running_pod(client: &kube::Client, ns: &str, name: &str) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "main".into(),
                image: Some("example.invalid/smoke:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    eventually("pod Running", Duration::from_secs(60), || {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
    pods
}

#[tokio::test]
async fn node_is_ready_and_a_pod_is_scheduled_and_runs() {
    let client = client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes
        .get("kwok-node-0")
        .await
        .expect("the kwok node exists");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    assert!(ready, "kwok-node-0 is not Ready");
    let ns = TestNamespace::new(&client, "smoke-pod").await;
    let pods = running_pod(&client, &ns.name, "p1").await;
    let p = pods.get("p1").await.unwrap();
    assert_eq!(
        p.spec.unwrap().node_name.as_deref(),
        Some("kwok-node-0"),
        "scheduled by the real scheduler"
    );
}

/// Streams `file` through `kubectl exec cat` semantics: bytes received, their sha256, the status.
async fn stream_file(
    pods: &Api<Pod>,
    file: &std::path::Path,
) -> (
    u64,
    String,
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Status,
) {
    let mut params = AttachParams::default()
        .container("main")
        .stdin(false)
        .stdout(true)
        .stderr(true);
    params.max_stdout_buf_size = Some(1024 * 1024);
    let mut proc = pods
        .exec(
            "p1",
            vec!["cat".to_string(), file.display().to_string()],
            &params,
        )
        .await
        .expect("exec cat");
    let mut stdout = proc.stdout().unwrap();
    let mut stderr = proc.stderr().unwrap();
    let status = proc.take_status().unwrap();
    let err_task = tokio::spawn(async move {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = stdout.read(&mut buf).await.expect("read exec stdout");
        if n == 0 {
            break;
        }
        total += n as u64;
        hasher.update(&buf[..n]);
    }
    let status = status.await.expect("exec status");
    let _ = err_task.await;
    (total, hex::encode(hasher.finalize()), status)
}

#[tokio::test]
async fn exec_streams_100_mib_intact_and_reports_a_nonzero_exit() {
    let client = client().await;
    let ns = TestNamespace::new(&client, "smoke-exec").await;
    let pods = running_pod(&client, &ns.name, "p1").await;

    // kwok runs the exec'd command as a local process, so the file is a host file.
    let dir = host_dir("exec");
    let file = dir.join("blob");
    write_pattern(&file, 100 * 1024 * 1024, 7);
    let expected = hex::encode(Sha256::digest(std::fs::read(&file).unwrap()));

    // Observed on this test bed under heavy load: the apiserver → kwok exec channel can report
    // Success while the tail of stdout is missing. The drain never trusts the status alone (a tar
    // stream must end with its end-of-archive marker, else the attempt is retried), and this test
    // asks for one intact 100 MiB transfer in at most three attempts, printing any short one.
    let mut intact = false;
    for attempt in 1..=3 {
        let (total, sha, status) = stream_file(&pods, &file).await;
        assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
        if total == 100 * 1024 * 1024 && sha == expected {
            intact = true;
            break;
        }
        eprintln!(
            "attempt {attempt}: exec reported Success but delivered {total} of {} bytes",
            100 * 1024 * 1024
        );
    }
    assert!(
        intact,
        "no intact 100 MiB transfer through exec in three attempts"
    );

    // A non-zero exit: the apiserver reports Failure with reason NonZeroExitCode and the code in
    // details.causes[ExitCode] (that is what the drain reads).
    let mut proc = pods
        .exec(
            "p1",
            vec!["sh", "-c", "echo oops >&2; exit 3"],
            &AttachParams::default()
                .container("main")
                .stdin(false)
                .stdout(true)
                .stderr(true),
        )
        .await
        .expect("exec sh");
    let status = proc.take_status().unwrap();
    let mut err = proc.stderr().unwrap();
    let mut text = String::new();
    let _ = err.read_to_string(&mut text).await;
    let status = status.await.expect("exec status");
    assert_eq!(status.status.as_deref(), Some("Failure"), "{status:?}");
    assert_eq!(
        sandboxrun_operator::drain::exec::exit_code(&status),
        Some(3),
        "{status:?}"
    );
    assert!(text.contains("oops"), "stderr was {text:?}");
}

#[tokio::test]
async fn the_apiserver_calls_a_webhook_registered_by_url_with_a_ca_bundle() {
    use axum::routing::post;
    use axum::Json;
    let client = client().await;
    let ns = TestNamespace::new(&client, "smoke-webhook").await;

    // A throwaway TLS webhook on loopback that denies ConfigMaps named deny-me.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf_params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    leaf_params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(
        leaf.pem().into_bytes(),
        leaf_key.serialize_pem().into_bytes(),
    )
    .await
    .unwrap();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let app = axum::Router::new().route(
        "/validate",
        post(move |Json(review): Json<serde_json::Value>| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let req = &review["request"];
                let deny = req["object"]["metadata"]["name"] == "deny-me";
                Json(serde_json::json!({
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {
                        "uid": req["uid"],
                        "allowed": !deny,
                        "status": {"code": 403, "message": "smoke webhook says no"}
                    }
                }))
            }
        }),
    );
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(
        axum_server::from_tcp_rustls(listener, tls)
            .unwrap()
            .serve(app.into_make_service()),
    );

    let name = format!("smoke-{}", ns.name);
    let vwc = loopback_webhook(
        &name,
        "smoke.sandbox.iterion.io",
        &ns.name,
        format!("https://127.0.0.1:{port}/validate"),
        Some(ca.pem().into_bytes()),
        RuleWithOperations {
            api_groups: Some(vec!["".into()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec!["CREATE".into()]),
            resources: Some(vec!["configmaps".into()]),
            scope: Some("Namespaced".into()),
        },
    );
    let vwcs: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    vwcs.create(&PostParams::default(), &vwc)
        .await
        .expect("register webhook");

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns.name);
    let cm = |n: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(n.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    // The configuration takes a moment to reach the apiserver's webhook cache.
    let denied = eventually("webhook denies deny-me", Duration::from_secs(30), || {
        let cms = cms.clone();
        let c = cm("deny-me");
        async move {
            match cms.create(&PostParams::default(), &c).await {
                Err(kube::Error::Api(ae)) if ae.message.contains("smoke webhook says no") => {
                    Some(ae.message)
                }
                Ok(_) => {
                    let _ = cms.delete("deny-me", &DeleteParams::default()).await;
                    None
                }
                Err(_) => None,
            }
        }
    })
    .await;
    assert!(denied.contains("smoke webhook says no"));
    cms.create(&PostParams::default(), &cm("allow-me"))
        .await
        .expect("allowed by the webhook");
    assert!(calls.load(std::sync::atomic::Ordering::SeqCst) >= 2);
    let _ = vwcs.delete(&name, &DeleteParams::default()).await;
    server.abort();
}

#[tokio::test]
async fn multipart_upload_into_the_s3_server_reads_back_identical() {
    crypto();
    let s3 = s3();
    let store = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&s3.endpoint)
        .with_bucket_name(&s3.bucket)
        .with_access_key_id(&s3.access_key)
        .with_secret_access_key(&s3.secret_key)
        .with_region("us-east-1")
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .build()
        .expect("S3 store");
    let store: Arc<dyn ObjectStore> = Arc::new(store);
    let key = object_store::path::Path::from(format!("smoke/{:08x}/blob", rand_u32()));
    let mut data = Vec::with_capacity(12 * 1024 * 1024);
    for i in 0..(12 * 1024 * 1024u32) {
        data.push((i.wrapping_mul(2654435761) >> 13) as u8);
    }
    let upload = store.put_multipart(&key).await.expect("start multipart");
    let mut writer = WriteMultipart::new_with_chunk_size(upload, 5 * 1024 * 1024);
    for chunk in data.chunks(1024 * 1024) {
        writer.wait_for_capacity(2).await.expect("capacity");
        writer.write(chunk);
    }
    writer.finish().await.expect("complete multipart");
    let back = store
        .get(&key)
        .await
        .expect("get")
        .bytes()
        .await
        .expect("bytes");
    assert_eq!(back.len(), data.len());
    assert!(back.as_ref() == data.as_slice(), "content differs");

    // Wrong credentials are refused (SigV4 is really checked).
    let bad = object_store::aws::AmazonS3Builder::new()
        .with_endpoint(&s3.endpoint)
        .with_bucket_name(&s3.bucket)
        .with_access_key_id(&s3.access_key)
        .with_secret_access_key("wrong-secret")
        .with_region("us-east-1")
        .with_allow_http(true)
        .build()
        .unwrap();
    assert!(bad.put(&key, PutPayload::from_static(b"x")).await.is_err());
}
