//! Warm pools (issue 39): the pure decisions of a pool of pods made ready ahead of demand.
//!
//! - [`compat`]: whether a run made from a pooled template may take a pool pod (nothing it sets
//!   changes the pod), as a pure function.
//! - [`plan`]: what a pool does next (create, replace, delete) from what it observes, and the
//!   counts its status reports.
//! - [`gauges`]: each pool's pods by state, exported as a metric an autoscaler scales it on.
//! - [`judge`]: whether a pool may make pods of its template at all (the rules, no author's
//!   rights needed).
//! - [`egress`]: a pool pod's NetworkPolicy (templates whose runs restrict egress).
//! - [`env`]: the env values a claim reads from Secrets and ConfigMaps for the launcher.
//! - [`park`]: a pool pod is the built pod with its workload parked in the operator's launcher.
//! - [`pod`]: a pool's pods and a run's claim of one, as data.
//! - [`seal`]: what says the operator made a pod as a pool's (a look-alike's labels never do).
//! - [`hold`]: which pool pods a replica holds an attach open to, for a claim to write its start.
//! - [`attaches`]: the attaches held open, by pod, each taken once by a claim.
//!
//! The controller that acts on the plan is `crate::controller::pools`; the claim is
//! `crate::controller::run::warm`.

pub mod attaches;
pub mod compat;
pub mod egress;
pub mod env;
pub mod gauges;
pub mod hold;
pub mod judge;
pub mod park;
pub mod plan;
pub mod pod;
pub mod reservations;
pub mod seal;
pub mod watched;
