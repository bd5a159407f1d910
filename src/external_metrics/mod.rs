//! The external metrics API (`run --external-metrics`; docs/user-guide.md "Scaling a pool with a
//! HorizontalPodAutoscaler"; docs/contract.md "A pool's claims are served to an autoscaler of its
//! namespace only"): `external.metrics.k8s.io/v1beta1`, served on the webhook's listener
//! (`crate::admission::serve` merges the routes), with one metric, `sandboxrun_pool_claimed`.
//!
//! - [`value`]: the metric's value list for a request's namespace and label selector, and the
//!   discovery document (pure).
//! - [`front_proxy`]: whether a request is the apiserver's aggregation layer's (its front-proxy
//!   client certificate, an allowed name, a user), as a pure function.
//! - [`serve`]: the routes, the pools' watch they answer from, the requestheader settings read at
//!   start (I/O).

pub mod front_proxy;
pub mod serve;
pub mod value;
