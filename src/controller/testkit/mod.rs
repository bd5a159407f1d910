//! The controller's test scaffolding (test only): the fixtures the pure stages' tests share
//! ([`fixtures`]: a clock, settings, pods in each state), the GitOps scenarios the docs' tables are
//! checked against ([`gitops_fixtures`]), and the routing mock apiserver the scenario tests carry
//! plans out against ([`mock_apiserver`]). The run builder shared with the integration tests is
//! `crate::testkit`.

pub(crate) mod fixtures;
pub(crate) mod gitops_fixtures;
pub(crate) mod mock_apiserver;
