//! The product on REAL containers: the real node of the test bed (kubelet + containerd + runc +
//! bridge CNI, `hack/real-node.sh`), images built without Docker (`hack/images.sh`) and pulled
//! from the local registry. What kwok cannot show is proven here: file permissions and uids across
//! the workload and the holder, `fsGroup`, Pod Security `restricted`, preStop and the grace
//! period, eviction, real exit codes and image pulls, exec through the kubelet.
//!
//! The operator runs on this host (the code under test, `target/debug`), except in the Helm test,
//! where the chart installs the operator image as pods with its own ServiceAccount. The holder of
//! every run pod is the operator image (`hack/images.sh operator`, built from this checkout).
//! Nothing here skips: without the real node or the image every test fails and says why.
//!
//! This file is the module list and the prelude the modules share. The tests live by feature in
//! `real_node/`: `basics`, `drains`, `egress`, `attempts` (retries, suspend, checkpoints), `pause`,
//! `warm`, `kueue`, `helm`, `samples`, `session`, `two_nodes`, `chaos` and `upgrade`. The kit
//! they share lives beside them by concern: `bed` (the images, the operator, `RealBed`),
//! `run_waits`, `archives` (`files get` and what it extracted), `containers` (crictl, runsc, the
//! packer), `chart_install` (the operator by Helm), `network`, `queues` (Kueue) and
//! `ready_pools`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, Pod, Toleration};
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use sandboxrun_operator::api::{
    OpenField, Phase, ReadBack, ReadBackPath, ReadBackPhase, SandboxRun, SandboxRunPool,
    SandboxRunSpec,
};
use serde_json::json;

use crate::support::*;

mod attempts;
mod basics;
mod chaos;
mod drains;
mod egress;
mod helm;
mod kueue;
mod pause;
mod samples;
mod session;
mod two_nodes;
mod upgrade;
mod warm;

mod archives;
mod bed;
mod chart_install;
mod containers;
mod network;
mod queues;
mod ready_pools;
mod run_waits;

use archives::*;
use bed::*;
use chart_install::*;
use containers::*;
use network::*;
use queues::*;
use ready_pools::*;
use run_waits::*;

/// The report a timed-out wait prints names the node's pressure conditions.
#[test]
fn a_timed_out_wait_reports_the_nodes_pressure_conditions() {
    let report = node_report();
    for condition in [
        "MemoryPressure=",
        "DiskPressure=",
        "PIDPressure=",
        "Ready=True",
    ] {
        assert!(report.contains(condition), "{report}");
    }
}
