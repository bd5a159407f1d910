//! A pool pod is the pod the pod builder (`crate::pod::build_pod`) makes from the template, with
//! its workload parked in the operator's launcher (`crate::inpod::launch`): an init container of
//! the operator's image copies the operator's static binary into an emptyDir mounted read-only in
//! the workload container at [`LAUNCHER_DIR`], and the workload's command becomes that absolute
//! path + `launch`, so nothing the image ships (a file at that path, PATH, its ENTRYPOINT) is run.
//! The image's user and working directory apply to the launcher exactly as they would to a cold
//! run's command (the launcher `execve`s in place and changes neither). Pure: no I/O.

use k8s_openapi::api::core::v1::{
    Container, EmptyDirVolumeSource, Pod, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::inpod::launch::CONTROL_DIR;
use crate::pod::{PodSettings, WORKLOAD_CONTAINER};

/// Where the launcher's emptyDir is mounted (read-only) in the workload container.
pub const LAUNCHER_DIR: &str = "/.sandboxrun-launcher";
/// The launcher's file name in [`LAUNCHER_DIR`].
pub const LAUNCHER_FILE: &str = "sandboxrun-operator";
const LAUNCHER_VOLUME: &str = "sandboxrun-launcher";
const CONTROL_VOLUME: &str = "sandboxrun-control";
const INSTALL_CONTAINER: &str = "launcher-install";

/// The absolute path the parked workload is started by.
pub fn launcher_path() -> String {
    format!("{LAUNCHER_DIR}/{LAUNCHER_FILE}")
}

/// Parks the built pod's workload in the launcher. None when the pod has no workload container.
pub fn park_in_launcher(mut pod: Pod, settings: &PodSettings) -> Option<Pod> {
    let spec = pod.spec.as_mut()?;
    let workload = spec
        .containers
        .iter_mut()
        .find(|c| c.name == WORKLOAD_CONTAINER)?;
    workload.command = Some(vec![launcher_path(), "launch".to_string()]);
    workload.args = None;
    // The start message comes on stdin, through an attach: one the pools' controller held open
    // to the ready pod, or the claim's own. Not `stdinOnce`: an attach that ends unused (held
    // by a replica that restarted) must not close the launcher's stdin for good. The launcher
    // reads one line and gives the workload `/dev/null`, so nothing written after reaches it.
    workload.stdin = Some(true);
    workload.stdin_once = Some(false);
    let mounts = workload.volume_mounts.get_or_insert_with(Vec::new);
    mounts.push(mount(LAUNCHER_VOLUME, LAUNCHER_DIR, true));
    mounts.push(mount(CONTROL_VOLUME, CONTROL_DIR, false));
    let restricted = workload.security_context.clone();
    let volumes = spec.volumes.get_or_insert_with(Vec::new);
    volumes.push(empty_dir(LAUNCHER_VOLUME, "128Mi"));
    volumes.push(empty_dir(CONTROL_VOLUME, "1Mi"));
    // The copy runs as the workload's user, so the workload can read and run it; the volume is
    // read-only where the workload sees it.
    let install = Container {
        name: INSTALL_CONTAINER.to_string(),
        image: Some(settings.holder_image.clone()),
        command: Some(vec![settings.holder_binary.clone()]),
        args: Some(vec![
            "launch-install".to_string(),
            format!("--to={LAUNCHER_DIR}/{LAUNCHER_FILE}"),
        ]),
        volume_mounts: Some(vec![mount(LAUNCHER_VOLUME, LAUNCHER_DIR, false)]),
        resources: Some(settings.holder_resources.requirements()),
        security_context: restricted.or_else(|| Some(SecurityContext::default())),
        ..Container::default()
    };
    spec.init_containers
        .get_or_insert_with(Vec::new)
        .push(install);
    Some(holder_writes_the_paths(pod))
}

/// `pod` with its holder's read-back mounts writable: `restore-unpack` runs in the holder and
/// writes the restored files there (read-only, it fails at the first member). Every parked pod
/// gets them — one parked for a restore, and a pool pod, which may serve a run that restores
/// (issue #54; docs/contract.md "Pause, resume and fork"): nothing has run in a parked pod
/// before its start, the holder runs only the operator's binary, and whoever could write through
/// it (an exec) could write the same paths through the workload's own writable mount. Every
/// other holder mounts them read-only.
fn holder_writes_the_paths(mut pod: Pod) -> Pod {
    let holders = pod
        .spec
        .iter_mut()
        .flat_map(|s| s.containers.iter_mut())
        .filter(|c| c.name == crate::pod::HOLDER_CONTAINER);
    for mount in holders.flat_map(|c| c.volume_mounts.iter_mut().flatten()) {
        if crate::pod::slot_index(&mount.name).is_some() {
            mount.read_only = None;
        }
    }
    pod
}

/// Whether `pod`'s workload is parked in the launcher (a pool pod, or one parked for a restore).
pub fn is_parked(pod: &Pod) -> bool {
    let launcher = launcher_path();
    pod.spec.as_ref().is_some_and(|s| {
        s.containers.iter().any(|c| {
            c.name == WORKLOAD_CONTAINER
                && c.command.as_ref().and_then(|c| c.first()) == Some(&launcher)
        })
    })
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: Some(read_only),
        ..VolumeMount::default()
    }
}

fn empty_dir(name: &str, size: &str) -> Volume {
    Volume {
        name: name.to_string(),
        empty_dir: Some(EmptyDirVolumeSource {
            size_limit: Some(Quantity(size.to_string())),
            ..EmptyDirVolumeSource::default()
        }),
        ..Volume::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    fn built() -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: WORKLOAD_CONTAINER.to_string(),
                    image: Some("tenant/image".into()),
                    command: Some(vec!["sh".into()]),
                    args: Some(vec!["-c".into(), "echo".into()]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn the_workload_starts_by_the_launchers_absolute_path_from_a_read_only_operator_volume() {
        let pod = park_in_launcher(built(), &PodSettings::default()).unwrap();
        let spec = pod.spec.unwrap();
        let w = &spec.containers[0];
        assert_eq!(
            w.command.as_deref(),
            Some(
                &[
                    "/.sandboxrun-launcher/sandboxrun-operator".to_string(),
                    "launch".into()
                ][..]
            )
        );
        assert!(w.command.as_ref().unwrap()[0].starts_with('/'));
        assert_eq!(w.args, None);
        assert_eq!((w.stdin, w.stdin_once), (Some(true), Some(false)));
        let m = w.volume_mounts.as_ref().unwrap();
        let launcher = m.iter().find(|m| m.mount_path == LAUNCHER_DIR).unwrap();
        assert_eq!(launcher.read_only, Some(true));
        // The launcher comes from the operator's image, never the tenant's.
        let init = &spec.init_containers.unwrap()[0];
        assert_eq!(init.image, Some(PodSettings::default().holder_image));
        assert_eq!(init.volume_mounts.as_ref().unwrap()[0].name, launcher.name);
    }

    /// Issue #54: every parked pod (a pool pod too) has its holder's read-back mounts writable,
    /// so a run that restores can take a pool pod; its other mounts keep their modes.
    #[test]
    fn a_parked_pods_holder_may_write_its_read_back_paths() {
        let mut pod = built();
        let holder = Container {
            name: crate::pod::HOLDER_CONTAINER.to_string(),
            volume_mounts: Some(vec![
                mount(
                    &format!("{}0", crate::pod::READBACK_VOLUME_PREFIX),
                    "/r/0",
                    true,
                ),
                mount("other", "/other", true),
            ]),
            ..Container::default()
        };
        pod.spec.as_mut().unwrap().containers.push(holder);
        let parked = park_in_launcher(pod, &PodSettings::default()).unwrap();
        let spec = parked.spec.unwrap();
        let holder = spec
            .containers
            .iter()
            .find(|c| c.name == crate::pod::HOLDER_CONTAINER);
        let modes: Vec<_> = holder
            .unwrap()
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| m.read_only)
            .collect();
        assert_eq!(modes, [None, Some(true)]);
        assert!(is_parked(&Pod {
            spec: Some(spec),
            ..Pod::default()
        }));
        assert!(!is_parked(&built()));
    }

    #[test]
    fn a_pod_without_a_workload_is_not_parked() {
        let mut pod = built();
        pod.spec.as_mut().unwrap().containers[0].name = "other".into();
        assert!(park_in_launcher(pod, &PodSettings::default()).is_none());
    }
}
