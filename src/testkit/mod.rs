//! What the tests of the whole crate share to describe the objects they start from (issue #57
//! item 4: one builder per type). [`run`] is the one way a test makes a `SandboxRun`; the
//! integration tests compile the very same file (`tests/it/support/kit.rs`), so a unit test and
//! an integration test that say "a run of namespace `ns` with uid `u1`" build the same object.
//! The controller's own scaffolding (pod views, statuses, settings) is in
//! `controller/fixtures.rs`.

use crate::api;

#[allow(dead_code)]
mod run;

pub(crate) use run::*;
