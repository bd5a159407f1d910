//! SandboxRunTemplates as the tests make them, and runs made from one.

use kube::api::PostParams;
use kube::Api;
use sandboxrun_operator::api::{
    OpenField, SandboxRunSpec, SandboxRunTemplate, SandboxRunTemplateSpec, TemplateRef,
};

/// A template of `spec` whose `open` fields a run may set.
pub fn template_of(spec: SandboxRunSpec, open: &[OpenField]) -> SandboxRunTemplateSpec {
    SandboxRunTemplateSpec {
        template: spec,
        open_fields: open.to_vec(),
    }
}

/// Creates the template `name` (panics when the apiserver refuses it).
pub async fn put_template(api: &Api<SandboxRunTemplate>, name: &str, spec: SandboxRunTemplateSpec) {
    api.create(&PostParams::default(), &SandboxRunTemplate::new(name, spec))
        .await
        .unwrap_or_else(|e| panic!("create SandboxRunTemplate {name}: {e}"));
}

/// A run made from the namespaced template `name` that sets `extra` besides the reference.
pub fn from_template(name: &str, extra: SandboxRunSpec) -> SandboxRunSpec {
    SandboxRunSpec {
        template_ref: Some(TemplateRef::namespaced(name)),
        ..extra
    }
}
