//! What every connection of the egress proxy shares ([`ProxyState`]): the run table, the token
//! secret, the time bounds, the connection slots, the resolver and the metrics with their labels.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use prometheus::{opts, IntCounter, IntCounterVec, IntGauge, Registry};

use crate::egress::limits::{Limits, Slots};
use crate::egress::runs::RunTable;

/// Time bounds of one connection.
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Reading the request head.
    pub head: Duration,
    /// Resolving the host.
    pub resolve: Duration,
    /// Connecting.
    pub connect: Duration,
    /// No byte in either direction of an allowed connection.
    pub idle: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            head: Duration::from_secs(10),
            resolve: Duration::from_secs(5),
            connect: Duration::from_secs(10),
            idle: Duration::from_secs(300),
        }
    }
}

/// Resolves a host name to addresses (the system resolver; tests give their own).
pub trait Resolve: Send + Sync {
    /// The addresses of `name` (fully qualified by the caller) with `port`.
    fn resolve(
        &self,
        name: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>;
}

/// The system resolver (`getaddrinfo`).
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve(
        &self,
        name: String,
        port: u16,
    ) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> {
        Box::pin(async move {
            tokio::net::lookup_host((name.as_str(), port))
                .await
                .map(|a| a.collect())
        })
    }
}

/// Everything a connection needs.
pub struct ProxyState {
    /// Runs by uid.
    pub runs: Arc<RunTable>,
    /// The token secret.
    pub secret: Arc<[u8]>,
    /// Bounds.
    pub timeouts: Timeouts,
    /// `sandboxrun_egress_requests_total{verdict}`.
    pub requests: IntCounterVec,
    /// `sandboxrun_egress_refused_total{reason}`.
    pub refused: IntCounterVec,
    /// `sandboxrun_egress_idle_closed_total`.
    pub idle_closed: IntCounter,
    /// `sandboxrun_egress_run_ended_closed_total`.
    pub run_ended_closed: IntCounter,
    /// `sandboxrun_egress_connections`.
    pub connections: IntGauge,
    pub(crate) slots: Arc<Slots>,
    pub(crate) resolver: Arc<dyn Resolve>,
}

/// Verdict labels of `sandboxrun_egress_requests_total`.
pub mod verdict {
    /// Allowed and connected.
    pub(crate) const ALLOWED: &str = "allowed";
    /// Refused by the rules (403).
    pub(crate) const DENIED: &str = "denied";
    /// No or a wrong token, an ended run, another pod (407).
    pub(crate) const UNAUTHENTICATED: &str = "unauthenticated";
    /// Malformed request (400), a slow head (408), a limit (429/503) or an upstream that could
    /// not be reached (502/504).
    pub(crate) const ERROR: &str = "error";
}

/// Reason labels of `sandboxrun_egress_refused_total`.
pub const REFUSAL_REASONS: [&str; 8] = [
    "global_limit",
    "source_limit",
    "run_limit",
    "namespace_limit",
    "head_timeout",
    "bad_credentials",
    "run_ended",
    "wrong_source",
];

/// `head_timeout`: no complete request head within the bound.
pub(crate) const HEAD_TIMEOUT: &str = "head_timeout";

impl ProxyState {
    /// A state with the default limits and the system resolver (register its metrics with
    /// [`ProxyState::register`]).
    pub fn new(
        runs: Arc<RunTable>,
        secret: Arc<[u8]>,
        timeouts: Timeouts,
    ) -> Result<ProxyState, prometheus::Error> {
        let requests = IntCounterVec::new(
            opts!(
                "sandboxrun_egress_requests_total",
                "Egress proxy decisions, by verdict (allowed, denied, unauthenticated, error)"
            ),
            &["verdict"],
        )?;
        let refused = IntCounterVec::new(
            opts!(
                "sandboxrun_egress_refused_total",
                "Egress proxy refusals other than by a run's rules, by reason"
            ),
            &["reason"],
        )?;
        for reason in REFUSAL_REASONS {
            refused.with_label_values(&[reason]);
        }
        let idle_closed = IntCounter::new(
            "sandboxrun_egress_idle_closed_total",
            "Allowed connections closed because no byte moved either way for the idle timeout",
        )?;
        let run_ended_closed = IntCounter::new(
            "sandboxrun_egress_run_ended_closed_total",
            "Allowed connections closed because their run ended, was deleted or is no longer known",
        )?;
        let connections = IntGauge::new(
            "sandboxrun_egress_connections",
            "Connections the egress proxy holds open",
        )?;
        Ok(ProxyState {
            runs,
            secret,
            timeouts,
            requests,
            refused,
            idle_closed,
            run_ended_closed,
            slots: Slots::new(Limits::default(), connections.clone()),
            connections,
            resolver: Arc::new(SystemResolver),
        })
    }

    /// The same state with other connection limits.
    pub fn with_limits(mut self, limits: Limits) -> ProxyState {
        self.slots = Slots::new(limits, self.connections.clone());
        self
    }

    /// The same state with another resolver.
    pub fn with_resolver(mut self, resolver: Arc<dyn Resolve>) -> ProxyState {
        self.resolver = resolver;
        self
    }

    /// Registers every metric of the proxy (their names carry the `sandboxrun_` prefix
    /// themselves) and returns their names.
    pub fn register(&self, registry: &Registry) -> Result<Vec<String>, prometheus::Error> {
        let collectors: [Box<dyn prometheus::core::Collector>; 5] = [
            Box::new(self.requests.clone()),
            Box::new(self.refused.clone()),
            Box::new(self.idle_closed.clone()),
            Box::new(self.run_ended_closed.clone()),
            Box::new(self.connections.clone()),
        ];
        let mut names = Vec::new();
        for collector in collectors {
            names.extend(collector.desc().iter().map(|d| d.fq_name.clone()));
            registry.register(collector)?;
        }
        Ok(names)
    }

    pub(crate) fn count(&self, verdict: &str) {
        self.requests.with_label_values(&[verdict]).inc();
    }

    pub(crate) fn refuse(&self, reason: &str) {
        self.refused.with_label_values(&[reason]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_register() {
        let state = ProxyState::new(
            Arc::new(RunTable::default()),
            Arc::from(b"0123456789abcdef".as_slice()),
            Timeouts::default(),
        )
        .unwrap();
        let registry = Registry::new();
        state.register(&registry).unwrap();
        state.count(verdict::DENIED);
        let mut names: Vec<String> = registry
            .gather()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "sandboxrun_egress_connections",
                "sandboxrun_egress_idle_closed_total",
                "sandboxrun_egress_refused_total",
                "sandboxrun_egress_requests_total",
                "sandboxrun_egress_run_ended_closed_total"
            ]
        );
    }
}
