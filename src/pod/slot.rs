//! A read-back slot (docs/contract.md "A read-back slot is made once"): how declared read-back
//! path N of a run is served in its pod — the path, the emptyDir volume `readback-N`, the
//! workload's mount of it at the path, the holder's (read-only) mount of the same volume below
//! the holder's own root. Made once from the spec ([`ReadBackSlot::of`]); the pod builder mounts
//! exactly these, and every reader (the teardown's and a checkpoint's drain, a restore, the
//! canary) reads a pod's slot back through [`ReadBackSlot::read`], which refuses a pod whose
//! mounts are not the slot's. Pure.

use k8s_openapi::api::core::v1::{Container, EmptyDirVolumeSource, Pod, Volume, VolumeMount};

use crate::names::{HOLDER_CONTAINER, WORKLOAD_CONTAINER};

/// Volume-name prefix of the emptyDir serving read-back path N.
pub const READBACK_VOLUME_PREFIX: &str = "readback-";

/// Declared read-back path `index` as its pod serves it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReadBackSlot {
    /// Its place in `spec.readBack.paths`.
    pub index: usize,
    /// The declared path: where the workload mounts the volume.
    pub path: String,
    /// The emptyDir volume serving it: `readback-<index>`.
    pub volume: String,
    /// Where the holder mounts the volume: below its own root
    /// ([`crate::inpod::holder::holder_path`]); the packer's and the unpacker's argument.
    pub holder_mount: String,
}

/// Why a pod does not serve a slot as the operator builds it: it is never drained or restored
/// there.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SlotMismatch {
    #[error("the pod has no emptyDir volume {volume} for read-back path {path}")]
    NoVolume { path: String, volume: String },
    #[error("the workload does not mount volume {volume} at read-back path {path}")]
    NotInWorkload { path: String, volume: String },
    #[error(
        "the holder mounts volume {volume} of read-back path {path} at {found:?}, not at {want}"
    )]
    Moved {
        path: String,
        volume: String,
        found: Option<String>,
        want: String,
    },
}

impl ReadBackSlot {
    /// The slot of declared path `path`, at `index`.
    pub(crate) fn new(index: usize, path: &str) -> ReadBackSlot {
        ReadBackSlot {
            index,
            path: path.to_string(),
            volume: volume_name(index),
            holder_mount: crate::inpod::holder::holder_path(path),
        }
    }

    /// The slots of the declared paths, in declaration order.
    pub(crate) fn of<'a>(paths: impl IntoIterator<Item = &'a str>) -> Vec<ReadBackSlot> {
        paths
            .into_iter()
            .enumerate()
            .map(|(index, path)| ReadBackSlot::new(index, path))
            .collect()
    }

    /// Its emptyDir. No sizeLimit, on purpose (ADR-143 "Unbounded size"): past it the kubelet
    /// evicts the whole pod and nothing would be drained; the cap is metered by the drain.
    pub(crate) fn pod_volume(&self) -> Volume {
        Volume {
            name: self.volume.clone(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }
    }

    /// The workload's mount of it, at the declared path.
    pub(crate) fn workload_mount(&self) -> VolumeMount {
        VolumeMount {
            name: self.volume.clone(),
            mount_path: self.path.clone(),
            ..VolumeMount::default()
        }
    }

    /// The holder's mount of it: read-only, below a root of its own (docs/contract.md "The
    /// holder runs only the operator's code"), never on its PATH, never over its binary.
    pub(crate) fn holder_volume_mount(&self) -> VolumeMount {
        VolumeMount {
            name: self.volume.clone(),
            mount_path: self.holder_mount.clone(),
            read_only: Some(true),
            ..VolumeMount::default()
        }
    }

    /// The slot of declared path `path` at `index`, as `pod` serves it: the emptyDir
    /// `readback-<index>`, mounted at `path` by the workload and by the holder below its own
    /// root — or, in a pod built by an older operator, at `path` itself (docs/contract.md "The
    /// holder runs only the operator's code"): then the slot's `holder_mount` is that. Any
    /// other pod (a mount moved, missing, another volume, a tenant's look-alike) is refused.
    pub(crate) fn read(pod: &Pod, index: usize, path: &str) -> Result<ReadBackSlot, SlotMismatch> {
        let made = ReadBackSlot::new(index, path);
        let spec = pod.spec.as_ref();
        let empty_dir = spec
            .into_iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| v.name == made.volume && v.empty_dir.is_some());
        if !empty_dir {
            return Err(made.mismatch(|path, volume| SlotMismatch::NoVolume { path, volume }));
        }
        let containers: &[Container] = spec.map_or(&[], |s| s.containers.as_slice());
        let at_path = mounts_of(containers, WORKLOAD_CONTAINER, &made.volume);
        if at_path != [made.path.as_str()] {
            return Err(made.mismatch(|path, volume| SlotMismatch::NotInWorkload { path, volume }));
        }
        match mounts_of(containers, HOLDER_CONTAINER, &made.volume).as_slice() {
            [found] if *found == made.holder_mount => Ok(made),
            [found] if *found == made.path => Ok(ReadBackSlot {
                holder_mount: made.path.clone(),
                ..made
            }),
            found => Err(SlotMismatch::Moved {
                found: found.first().map(|f| f.to_string()),
                want: made.holder_mount.clone(),
                path: made.path,
                volume: made.volume,
            }),
        }
    }

    /// The slot `pod` serves at `path` (whichever index its workload's volume names), if any.
    pub(crate) fn serving(pod: &Pod, path: &str) -> Option<ReadBackSlot> {
        let workload = pod
            .spec
            .as_ref()?
            .containers
            .iter()
            .find(|c| c.name == WORKLOAD_CONTAINER)?;
        let mount = workload
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == path)?;
        let index = slot_index(&mount.name)?;
        ReadBackSlot::read(pod, index, path).ok()
    }

    fn mismatch(self, why: impl FnOnce(String, String) -> SlotMismatch) -> SlotMismatch {
        why(self.path, self.volume)
    }
}

/// The volume name of slot `index`.
fn volume_name(index: usize) -> String {
    format!("{READBACK_VOLUME_PREFIX}{index}")
}

/// The slot index a volume named `name` serves, if it is a slot's volume.
pub(crate) fn slot_index(name: &str) -> Option<usize> {
    let index: usize = name.strip_prefix(READBACK_VOLUME_PREFIX)?.parse().ok()?;
    (volume_name(index) == name).then_some(index)
}

/// Where the container `container` mounts `volume` (every mount of it, in order).
fn mounts_of<'a>(containers: &'a [Container], container: &str, volume: &str) -> Vec<&'a str> {
    containers
        .iter()
        .filter(|c| c.name == container)
        .flat_map(|c| c.volume_mounts.iter().flatten())
        .filter(|m| m.name == volume)
        .map(|m| m.mount_path.as_str())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ReadBack, ReadBackPath, SandboxRun, SandboxRunSpec};
    use crate::pod::{build_pod, PodSettings};

    const PATHS: [&str; 3] = ["/out", "/logs", "/work/deep/dir"];

    fn built() -> Pod {
        let mut run = SandboxRun::new(
            "job",
            SandboxRunSpec {
                image: Some("busybox@sha256:abc".into()),
                user: Some("1000:3000".into()),
                read_back: Some(ReadBack {
                    paths: PATHS
                        .iter()
                        .map(|p| ReadBackPath {
                            path: p.to_string(),
                            ..ReadBackPath::default()
                        })
                        .collect(),
                    ..ReadBack::default()
                }),
                ..SandboxRunSpec::default()
            },
        );
        run.metadata.namespace = Some("team".into());
        run.metadata.uid = Some("uid-1".into());
        build_pod(&run, &PodSettings::default()).unwrap()
    }

    fn container<'a>(pod: &'a mut Pod, name: &str) -> &'a mut Container {
        let spec = pod.spec.as_mut().unwrap();
        spec.containers.iter_mut().find(|c| c.name == name).unwrap()
    }

    fn mount<'a>(pod: &'a mut Pod, name: &str, volume: &str) -> &'a mut VolumeMount {
        let mounts = container(pod, name).volume_mounts.as_mut().unwrap();
        mounts.iter_mut().find(|m| m.name == volume).unwrap()
    }

    #[test]
    fn the_slots_are_made_once_and_the_built_pod_reads_back_as_them() {
        let slots = ReadBackSlot::of(PATHS);
        assert_eq!(slots.len(), PATHS.len());
        for (pod, parked) in [
            (built(), false),
            (
                crate::pool::park::park_in_launcher(built(), &PodSettings::default()).unwrap(),
                true,
            ),
        ] {
            for (index, slot) in slots.iter().enumerate() {
                assert_eq!(slot.index, index);
                assert_eq!(slot.volume, format!("readback-{index}"));
                assert_eq!(
                    slot.holder_mount,
                    format!("/sandboxrun-readback{}", PATHS[index])
                );
                assert_eq!(slot_index(&slot.volume), Some(index));
                // Both directions agree: what the builder mounted is what a reader reads back.
                let read = ReadBackSlot::read(&pod, index, &slot.path);
                assert_eq!(read.as_ref(), Ok(slot), "parked {parked}");
                assert_eq!(ReadBackSlot::serving(&pod, &slot.path).as_ref(), Some(slot));
                let spec = pod.spec.as_ref().unwrap();
                assert!(spec
                    .volumes
                    .iter()
                    .flatten()
                    .any(|v| *v == slot.pod_volume()));
                let mut workload = pod.clone();
                let w = mount(&mut workload, WORKLOAD_CONTAINER, &slot.volume);
                assert_eq!(*w, slot.workload_mount());
                let mut holder = pod.clone();
                let h = mount(&mut holder, HOLDER_CONTAINER, &slot.volume);
                let read_only = (!parked).then_some(true);
                assert_eq!(
                    *h,
                    VolumeMount {
                        read_only,
                        ..slot.holder_volume_mount()
                    }
                );
            }
        }
    }

    #[test]
    fn a_pod_built_by_an_older_operator_is_read_where_its_holder_mounts_the_path() {
        let mut pod = built();
        mount(&mut pod, HOLDER_CONTAINER, "readback-1").mount_path = "/logs".into();
        let slot = ReadBackSlot::read(&pod, 1, "/logs").unwrap();
        assert_eq!(slot.holder_mount, "/logs");
        assert_eq!((slot.index, slot.volume.as_str()), (1, "readback-1"));
    }

    /// A pod whose mounts are not its slots — a mount moved, another volume at the path, a
    /// volume that is not an emptyDir, a tenant's look-alike — is never read as serving them.
    #[test]
    fn a_pod_whose_mounts_are_not_its_slots_is_refused() {
        type Change = fn(&mut Pod);
        let cases: [(&str, Change); 8] = [
            ("holder mount moved", |p| {
                mount(p, HOLDER_CONTAINER, "readback-0").mount_path = "/sandboxrun-readback".into()
            }),
            ("holder mount moved to /", |p| {
                mount(p, HOLDER_CONTAINER, "readback-0").mount_path = "/".into()
            }),
            ("workload mount moved", |p| {
                mount(p, WORKLOAD_CONTAINER, "readback-0").mount_path = "/elsewhere".into()
            }),
            ("slots swapped (a look-alike)", |p| {
                for c in [WORKLOAD_CONTAINER, HOLDER_CONTAINER] {
                    mount(p, c, "readback-0").name = "swap".into();
                    mount(p, c, "readback-1").name = "readback-0".into();
                    mount(p, c, "swap").name = "readback-1".into();
                }
            }),
            ("holder without the mount", |p| {
                let mounts = container(p, HOLDER_CONTAINER)
                    .volume_mounts
                    .as_mut()
                    .unwrap();
                mounts.retain(|m| m.name != "readback-0");
            }),
            ("volume not an emptyDir", |p| {
                let spec = p.spec.as_mut().unwrap();
                let volumes = spec.volumes.as_mut().unwrap();
                let v = volumes.iter_mut().find(|v| v.name == "readback-0").unwrap();
                v.empty_dir = None;
                v.host_path = Some(Default::default());
            }),
            ("no volume", |p| {
                let spec = p.spec.as_mut().unwrap();
                spec.volumes
                    .as_mut()
                    .unwrap()
                    .retain(|v| v.name != "readback-0");
            }),
            ("no spec", |p| p.spec = None),
        ];
        for (what, change) in cases {
            let mut pod = built();
            change(&mut pod);
            let read = ReadBackSlot::read(&pod, 0, "/out");
            assert!(read.is_err(), "{what}: {read:?}");
            let made = ReadBackSlot::new(0, "/out");
            assert_ne!(ReadBackSlot::serving(&pod, "/out"), Some(made), "{what}");
            let declared: Vec<String> = PATHS.iter().map(|p| p.to_string()).collect();
            let violations = crate::pod::promise_violations(&pod, &declared);
            assert!(!violations.is_empty(), "{what}");
        }
        let moved = {
            let mut pod = built();
            mount(&mut pod, HOLDER_CONTAINER, "readback-0").mount_path = "/etc".into();
            ReadBackSlot::read(&pod, 0, "/out")
        };
        assert_eq!(
            moved,
            Err(SlotMismatch::Moved {
                path: "/out".into(),
                volume: "readback-0".into(),
                found: Some("/etc".into()),
                want: "/sandboxrun-readback/out".into(),
            })
        );
    }

    #[test]
    fn only_a_slots_own_volume_name_is_a_slot() {
        assert_eq!(slot_index("readback-0"), Some(0));
        assert_eq!(slot_index("readback-12"), Some(12));
        for other in [
            "readback-",
            "readback-01",
            "readback-+1",
            "readback-x",
            "holder-state",
        ] {
            assert_eq!(slot_index(other), None, "{other}");
        }
    }
}
