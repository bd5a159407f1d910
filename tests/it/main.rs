//! The integration tests: ONE test binary (`cargo test --test it`), one module per area, with
//! [`support`] compiled once. (Each area used to be its own file in `tests/` and so its own
//! binary, each linking the whole crate and the support code: see docs/performance.md "Test
//! build cost".)
//!
//! **Process isolation, kept by the runner.** When every area was its own binary, `cargo test`
//! ran the areas one after the other, each in a process of its own, and the tests relied on it:
//! - process-global state: `support::ensure_crd` applies the CRD once per process (a `OnceLock`),
//!   `support::bed_setting` reads the bed's settings once, the rustls crypto provider is installed
//!   once, and tests start their own operator processes and servers on loopback ports;
//! - cluster-wide objects: `chart` and `real_node` `helm install` the chart (its CRD,
//!   ValidatingWebhookConfiguration, ClusterRoles), `rbac` creates ClusterRoles and bindings,
//!   `admission_live`, `doctor_live` and `smoke_cluster` register ValidatingWebhookConfigurations,
//!   and `real_node` changes the real node's host; each area was written against a bed on which
//!   no other area ran at the same time.
//!
//! So `hack/test.sh` runs this binary once per area, one area after the other, each filtered to
//! its module (`cargo test --test it -- <area>::`), with the same `--test-threads` as before:
//! exactly the old grouping and concurrency, at the cost of one process start per area (not
//! one link per area). A process-wide lock held by the cluster-wide tests would let the areas
//! overlap, but every test that creates a run or reads the CRD would have to take it too (a
//! webhook or a chart install changes what they see), which is the old serial order again with
//! more code and a new way to be wrong. Running the whole binary unfiltered
//! (`cargo test --test it`) runs the areas concurrently and is not supported against the shared
//! bed; one area (`cargo test --test it -- drain_e2e::`) or one test is.

mod support;

mod admission_corpus;
mod admission_live;
mod chart;
mod controller_lifecycle;
mod doctor_cli;
mod doctor_live;
mod drain_commit;
mod drain_e2e;
mod drain_fair;
mod drain_wire;
mod egress_policy;
mod egress_proxy;
mod gitops;
mod image_preflight;
mod image_resolve;
mod kubectl_ux;
mod operator_binary;
mod rbac;
mod readme_install;
mod real_node;
mod retention_ttl;
mod sharding;
mod smoke_cluster;
mod store_backends;
mod store_open_uploads;
mod templates;
mod tenant_stores;
mod warm_pools;
mod webhook;
mod webhook_certs;
