//! The run's room: one SandboxRun's reconcile, stage by stage (docs/architecture.md "The
//! pipeline"): [`pipeline`] runs them in order with one `now` — [`observe`] and [`prepare`] read,
//! [`decide`] chooses the step, the pure gates ([`kueue_gate`], [`warm`]'s choices) and [`plan`]
//! (with [`status`], [`refusals`], [`retention`], [`retry`]) make the plan, and [`act`] carries
//! it out through [`drive`] (with [`workspace`], [`launcher`] and [`env_sources`] for a restore
//! and a warm claim). The drains (`controller/drains/`) and the pools' controller
//! (`controller/pools/`) use its act, plan and reads; the wiring that starts it is
//! `controller/mod.rs`.

pub(crate) mod act;
pub(crate) mod decide;
pub(super) mod drive;
mod env_sources;
mod kueue_edits;
mod kueue_gate;
mod launcher;
pub(crate) use launcher::attach_params as launcher_attach_params;
pub(crate) mod observe;
pub(super) mod pipeline;
pub(crate) mod plan;
mod prepare;
pub(crate) mod refusals;
pub(crate) mod retention;
pub(crate) mod retry;
pub(crate) mod status;
mod warm;
mod workspace;

#[cfg(test)]
mod act_scenarios;
#[cfg(test)]
mod claim_scenarios;
#[cfg(test)]
pub(crate) mod pipeline_scenarios;
