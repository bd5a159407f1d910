//! The platform's pull Secrets serve the holder image only (docs/contract.md "The platform's
//! pull Secrets pull the holder, not the workload"; issue #38 item 3). `run
//! --pod-image-pull-secret` puts Secrets on every run pod so a holder image from a private
//! registry is pulled; imagePullSecrets are pod-wide, so the kubelet would pull the workload image
//! with them too whenever it is in a registry they serve: a tenant would read the platform's
//! private images with the platform's credentials. The operator cannot see which registries a
//! Secret's key serves without reading it; it takes them to serve **the holder image's registry**
//! (its `host[:port]`, Docker Hub's aliases as one) and:
//!
//! - the webhook refuses a run whose workload image is in that registry ([`PlatformPull::refusal`]);
//! - the pod builder leaves the platform's Secrets off such a run's pod, should it get past an
//!   absent or bypassed webhook ([`PlatformPull::secrets_for`]): the workload is never pulled
//!   with them (a private holder image then fails to pull, loudly, on the pod);
//!
//! unless the platform says its Secrets may serve workloads too (`run
//! --pod-image-pull-secret-serves-workloads`). No Secrets, nothing is refused. Pure.

use super::rules::Finding;

/// The rule id of the refusal.
pub(crate) const PLATFORM_PULL_RULE: &str = "platform-pull-secret";

/// Docker Hub, however it is written.
const DOCKER_HUB: &str = "docker.io";

/// The platform's pull Secrets and whom they may serve.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlatformPull {
    /// The Secrets (`run --pod-image-pull-secret`).
    pub secrets: Vec<String>,
    /// The registry they are taken to serve: the holder image's, normalized (None: the holder
    /// image is empty, and every workload image is taken to be in it).
    pub registry: Option<String>,
    /// `run --pod-image-pull-secret-serves-workloads`: workload images of that registry may be
    /// pulled with them.
    pub serves_workloads: bool,
}

impl PlatformPull {
    /// The platform's `secrets` for the holder image `holder_image`.
    pub fn new(secrets: &[String], holder_image: &str, serves_workloads: bool) -> PlatformPull {
        PlatformPull {
            secrets: secrets.to_vec(),
            registry: registry_of(holder_image),
            serves_workloads,
        }
    }

    /// Whether a pod whose workload image is `image` may carry the Secrets.
    fn serves(&self, image: &str) -> bool {
        if self.secrets.is_empty() || self.serves_workloads {
            return true;
        }
        match (&self.registry, registry_of(image)) {
            (Some(holder), Some(workload)) => *holder != workload,
            // Cannot tell: the Secrets stay off.
            _ => false,
        }
    }

    /// Why a run whose workload image is `image` is refused (None: it is not). An empty image is
    /// the image rules' to refuse.
    pub(crate) fn refusal(&self, image: &str) -> Option<Finding> {
        let workload = registry_of(image)?;
        if self.serves(image) {
            return None;
        }
        Some(Finding::fail(
            PLATFORM_PULL_RULE,
            "spec.image",
            format!(
                "{image:?} is in the registry {workload}, which the platform's pull Secrets \
                 ({}) serve for the holder image: its pod would pull it with the platform's \
                 credentials",
                self.secrets.join(", ")
            ),
            "use an image from another registry, or pull it with a Secret of your own in \
             spec.imagePullSecrets and ask the platform to move the holder image (or to run with \
             --pod-image-pull-secret-serves-workloads)",
        ))
    }

    /// [`PlatformPull::refusal`] of the spec `new` (JSON), judged only when its image is not the
    /// stored spec `old`'s: a run admitted once can always be let go of.
    pub(crate) fn review_refusal(
        &self,
        new: &serde_json::Value,
        old: Option<&serde_json::Value>,
    ) -> Option<Finding> {
        let image = new.get("image")?.as_str()?;
        let unchanged = old
            .and_then(|o| o.get("image"))
            .and_then(|i| i.as_str())
            .is_some_and(|o| o == image);
        if unchanged {
            return None;
        }
        self.refusal(image)
    }

    /// The platform's Secrets a pod whose workload image is `image` carries: none when they
    /// would pull it.
    pub fn secrets_for(&self, image: &str) -> &[String] {
        if self.serves(image) {
            &self.secrets
        } else {
            &[]
        }
    }
}

/// The registry of `image` as the runtime reads it (Docker's normalization: the first path
/// component when it holds `.` or `:` or is `localhost`, else Docker Hub), lowercased, Docker
/// Hub's aliases as `docker.io`; the rest of the reference is not judged here (None: empty).
fn registry_of(image: &str) -> Option<String> {
    let name = image.trim().split('@').next().unwrap_or_default();
    if name.is_empty() {
        return None;
    }
    let registry = match name.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => {
            first.to_ascii_lowercase()
        }
        _ => DOCKER_HUB.to_string(),
    };
    Some(match registry.as_str() {
        "index.docker.io" | "registry-1.docker.io" | "registry.hub.docker.com" => {
            DOCKER_HUB.to_string()
        }
        _ => registry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLDER: &str = "registry.corp.example/platform/sandboxrun-operator:1.4";

    fn platform(serves_workloads: bool) -> PlatformPull {
        PlatformPull::new(&["platform-pull".to_string()], HOLDER, serves_workloads)
    }

    #[test]
    fn a_workload_image_in_the_registry_the_platform_secrets_serve_is_refused_and_pulled_without_them(
    ) {
        let pull = platform(false);
        for image in [
            "registry.corp.example/platform/internal-tool:2",
            "REGISTRY.corp.example/other-team/app@sha256:abc",
            "registry.corp.example/UPPER:not-a-valid-ref",
        ] {
            let refused = pull.refusal(image).expect("refused").message;
            assert!(
                refused.contains("registry.corp.example") && refused.contains("platform-pull"),
                "{refused}"
            );
            assert!(pull.secrets_for(image).is_empty(), "{image}");
        }
        for image in [
            "busybox:1.37",
            "ghcr.io/team/app:1",
            "registry.corp.example:5000/a",
        ] {
            assert!(pull.refusal(image).is_none(), "{image}");
            assert_eq!(pull.secrets_for(image), ["platform-pull".to_string()]);
        }
    }

    #[test]
    fn a_review_is_judged_only_when_its_image_is_new() {
        let pull = platform(false);
        let same = serde_json::json!({"image": "registry.corp.example/platform/tool:1"});
        let other = serde_json::json!({"image": "busybox:1.37"});
        assert!(pull.review_refusal(&same, None).is_some(), "a create");
        assert!(
            pull.review_refusal(&same, Some(&other)).is_some(),
            "an image changed"
        );
        assert!(
            pull.review_refusal(&same, Some(&same)).is_none(),
            "let go of"
        );
        assert!(pull.review_refusal(&serde_json::json!({}), None).is_none());
    }

    #[test]
    fn docker_hub_is_one_registry_however_it_is_written() {
        let pull = PlatformPull::new(&["hub".to_string()], "iterion/holder:1", false);
        for image in [
            "busybox",
            "docker.io/library/busybox",
            "index.docker.io/team/app",
        ] {
            assert!(pull.refusal(image).is_some(), "{image}");
            assert!(pull.secrets_for(image).is_empty(), "{image}");
        }
    }

    #[test]
    fn no_secrets_or_the_platforms_consent_refuse_nothing() {
        let none = PlatformPull::new(&[], HOLDER, false);
        let same = "registry.corp.example/platform/tool:1";
        assert!(none.refusal(same).is_none());
        assert!(none.secrets_for(same).is_empty());
        let consented = platform(true);
        assert!(consented.refusal(same).is_none());
        assert_eq!(consented.secrets_for(same), ["platform-pull".to_string()]);
        // No holder image: no workload gets the Secrets.
        let unknown = PlatformPull::new(&["p".to_string()], "", false);
        assert!(unknown.secrets_for("ghcr.io/team/app:1").is_empty());
        assert!(unknown.refusal("ghcr.io/team/app:1").is_some());
    }
}
