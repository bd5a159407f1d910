//! What the no-pull image check ([`crate::registry`]) means as a rule finding
//! (`image-resolvable`): a registry that says the image does not exist fails, one that cannot
//! tell warns.

use super::rules::{ids, Finding};
use crate::registry::Resolution;

/// The finding for `image` at `spec.image`, if any.
pub fn finding(resolution: &Resolution, image: &str) -> Option<Finding> {
    match resolution {
        Resolution::Resolvable => None,
        Resolution::NotFound(why) => Some(Finding::fail(
            ids::IMAGE_RESOLVABLE,
            "spec.image",
            format!("image `{image}` does not resolve: {why}"),
            "check the repository, tag or digest (e.g. `crane digest <image>`); push the image first",
        )),
        Resolution::Unknown(why) => Some(Finding::warn(
            ids::IMAGE_RESOLVABLE,
            "spec.image",
            format!("cannot prove image `{image}` resolvable: {why}"),
            "cannot prove resolvability; the kubelet may still pull with its own credentials \
             (pass a dockerconfigjson for private registries)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_map_to_fail_and_warn() {
        assert_eq!(finding(&Resolution::Resolvable, "a"), None);
        let f = finding(&Resolution::NotFound("404".into()), "a");
        assert!(f.as_ref().is_some_and(Finding::is_fail), "{f:?}");
        let w = finding(&Resolution::Unknown("timeout".into()), "a");
        assert!(
            w.as_ref()
                .is_some_and(|w| !w.is_fail() && w.hint.contains("kubelet may still pull")),
            "{w:?}"
        );
    }
}
