//! Prometheus metrics of the operator, served on `/metrics` of the metrics address.

use prometheus::core::Collector;
use prometheus::{
    exponential_buckets, histogram_opts, opts, Encoder, Gauge, Histogram, HistogramVec,
    IntCounterVec, IntGauge, IntGaugeVec, Registry, TextEncoder,
};

/// Every metric the controller and the drain record. Cheap to clone (the collectors are shared).
#[derive(Clone)]
pub struct Metrics {
    /// The registry the collectors live in (the webhook registers its own into it too).
    pub registry: Registry,
    /// The full names (`sandboxrun_…`) of the metrics registered here, as exported.
    pub names: Vec<String>,
    /// Reconciles by outcome step.
    pub reconciles: IntCounterVec,
    /// Reconcile duration.
    pub reconcile_duration: HistogramVec,
    /// Reconcile errors by kind.
    pub reconcile_errors: IntCounterVec,
    /// Runs by phase, as last seen by this replica.
    pub runs_by_phase: IntGaugeVec,
    /// How runs made from a pooled template got each attempt's pod: `warm` or `cold`.
    pub pool_starts: IntCounterVec,
    /// How a warm start reached its pod's launcher: `held` (on an attach held open to the
    /// ready pod) or `opened` (on one the claim opened).
    pub start_attaches: IntCounterVec,
    /// The attaches this replica holds open to ready pool pods' launchers.
    pub attaches_held: IntGauge,
    /// Bytes stored by drains.
    pub drained_bytes: IntCounterVec,
    /// Bytes that crossed the exec stream from the packer, by encoding (`tar`, `zstd`): with
    /// `drain_bytes_total`, what `pack --wire zstd` saves on the wire.
    pub drain_wire_bytes: IntCounterVec,
    /// Duration of one path's drain (all attempts).
    pub drain_duration: HistogramVec,
    /// Drain outcomes by phase (Drained, Empty, Capped, Failed).
    pub drains: IntCounterVec,
    /// Drain failures by reason.
    pub drain_failures: IntCounterVec,
    /// Members dropped (cap) or rejected (sanitizer), by reason.
    pub members_refused: IntCounterVec,
    /// 1 while this replica runs the controller (always without leader election, the lease
    /// holder with it), 0 otherwise: the chart's SandboxRunNoLeader alert.
    pub leader: IntGauge,
    /// The shards this replica owns (`run --sharding`; 0 without): their Leases held, the
    /// ones being handed back included.
    pub shards_owned: IntGauge,
    /// The queue of teardowns waiting for a drain slot (docs/contract.md "Fair drain slots").
    pub drain_queue: DrainQueueMetrics,
}

/// The queue of teardowns waiting for a drain slot, made visible.
#[derive(Clone)]
pub struct DrainQueueMetrics {
    /// Teardowns waiting for a slot, by the runs' namespace (label `run_namespace`, apart from
    /// the `namespace` Prometheus gives the operator's own pod; a namespace that waits no more is
    /// removed).
    pub waiting: IntGaugeVec,
    /// How long each teardown waited for its slot.
    pub slot_wait: Histogram,
    /// Age of the oldest waiting teardown (0: none waits).
    pub oldest_age: Gauge,
}

impl DrainQueueMetrics {
    fn new() -> Result<DrainQueueMetrics, prometheus::Error> {
        Ok(DrainQueueMetrics {
            waiting: IntGaugeVec::new(
                opts!(
                    "drain_queue_waiting",
                    "Teardowns waiting for a drain slot, by namespace"
                ),
                &["run_namespace"],
            )?,
            slot_wait: Histogram::with_opts(histogram_opts!(
                "drain_slot_wait_seconds",
                "How long a teardown waited for its drain slot",
                exponential_buckets(0.01, 2.0, 20)?
            ))?,
            oldest_age: Gauge::with_opts(opts!(
                "drain_queue_oldest_age_seconds",
                "Age of the oldest teardown waiting for a drain slot (0: none waits)"
            ))?,
        })
    }
}

/// A metric could not be registered (a programming error: duplicate names).
#[derive(Debug, thiserror::Error)]
#[error("metrics registration failed: {0}")]
pub struct MetricsError(#[from] prometheus::Error);

/// `sandboxrun_pool_starts_total{start}` (docs/user-guide.md "Sandboxes for agents: warm pools"),
/// `sandboxrun_warm_start_attaches_total{attach}` and `sandboxrun_pool_attaches_held`
/// (docs/contract.md "A claim writes its start on an attach held open").
fn pool_metrics() -> Result<(IntCounterVec, IntCounterVec, IntGauge), prometheus::Error> {
    let starts = counter(
        "pool_starts_total",
        "Attempts of runs made from a pooled template whose pod was taken warm or made cold",
        &["start"],
    )?;
    let attaches = counter(
        "warm_start_attaches_total",
        "Warm starts written to a pool pod's launcher, by the attach that carried them",
        &["attach"],
    )?;
    let held = IntGauge::with_opts(opts!(
        "pool_attaches_held",
        "Attaches this replica holds open to ready pool pods' launchers, for claims to write on"
    ))?;
    Ok((starts, attaches, held))
}

/// `sandboxrun_drain_bytes_total{compression}` and `sandboxrun_drain_wire_bytes_total{wire}`.
fn drain_byte_counters() -> Result<(IntCounterVec, IntCounterVec), prometheus::Error> {
    Ok((
        counter(
            "drain_bytes_total",
            "Member bytes stored by drains",
            &["compression"],
        )?,
        counter(
            "drain_wire_bytes_total",
            "Bytes read from the packer's exec stream, by wire encoding, every attempt included",
            &["wire"],
        )?,
    ))
}

impl Metrics {
    /// Creates and registers every metric into a fresh registry.
    pub fn new() -> Result<Metrics, MetricsError> {
        let registry = Registry::new_custom(Some(PREFIX.to_string()), None)?;
        let reconciles = counter("reconciles_total", "Reconciles by step", &["step"])?;
        let reconcile_duration = histograms(
            "reconcile_duration_seconds",
            "Reconcile duration",
            exponential_buckets(0.005, 2.0, 16)?,
            &["step"],
        )?;
        let reconcile_errors = counter(
            "reconcile_errors_total",
            "Reconcile errors by kind",
            &["kind"],
        )?;
        let (pool_starts, start_attaches, attaches_held) = pool_metrics()?;
        let (drained_bytes, drain_wire_bytes) = drain_byte_counters()?;
        let drain_duration = histograms(
            "drain_duration_seconds",
            "Duration of one path's drain, every attempt included",
            exponential_buckets(0.05, 2.0, 16)?,
            &["phase"],
        )?;
        let drains = counter("drains_total", "Drain outcomes by phase", &["phase"])?;
        let drain_failures = counter(
            "drain_failures_total",
            "Drain failures by reason",
            &["reason"],
        )?;
        let members_refused = counter(
            "drain_members_refused_total",
            "Members dropped by the cap or rejected by the sanitizer",
            &["outcome", "reason"],
        )?;
        let (runs_by_phase, leader, shards_owned) = replica_gauges()?;
        let drain_queue = DrainQueueMetrics::new()?;
        let collectors: [Box<dyn Collector>; 18] = [
            Box::new(pool_starts.clone()),
            Box::new(start_attaches.clone()),
            Box::new(attaches_held.clone()),
            Box::new(reconciles.clone()),
            Box::new(reconcile_duration.clone()),
            Box::new(reconcile_errors.clone()),
            Box::new(runs_by_phase.clone()),
            Box::new(drained_bytes.clone()),
            Box::new(drain_wire_bytes.clone()),
            Box::new(drain_duration.clone()),
            Box::new(drains.clone()),
            Box::new(drain_failures.clone()),
            Box::new(members_refused.clone()),
            Box::new(leader.clone()),
            Box::new(shards_owned.clone()),
            Box::new(drain_queue.waiting.clone()),
            Box::new(drain_queue.slot_wait.clone()),
            Box::new(drain_queue.oldest_age.clone()),
        ];
        let names = register_all(&registry, collectors)?;
        Ok(Metrics {
            registry,
            names,
            reconciles,
            reconcile_duration,
            reconcile_errors,
            runs_by_phase,
            pool_starts,
            start_attaches,
            attaches_held,
            drained_bytes,
            drain_wire_bytes,
            drain_duration,
            drains,
            drain_failures,
            members_refused,
            leader,
            shards_owned,
            drain_queue,
        })
    }

    /// The text exposition of every registered metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        let families = self.registry.gather();
        if TextEncoder::new().encode(&families, &mut buf).is_err() {
            return String::new();
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}

/// Registers `collectors` into `registry` (one made with [`PREFIX`] as its namespace) and returns
/// their exported names, prefixed: the list docs/operations.md's metrics table is checked against.
pub fn register_all<const N: usize>(
    registry: &Registry,
    collectors: [Box<dyn Collector>; N],
) -> Result<Vec<String>, prometheus::Error> {
    let mut names = Vec::new();
    for collector in collectors {
        names.extend(
            collector
                .desc()
                .iter()
                .map(|d| format!("{PREFIX}_{}", d.fq_name)),
        );
        registry.register(collector)?;
    }
    Ok(names)
}

/// What this replica works on: runs by phase, whether it runs the controller, the shards it owns.
fn replica_gauges() -> Result<(IntGaugeVec, IntGauge, IntGauge), prometheus::Error> {
    let runs_by_phase = IntGaugeVec::new(opts!("runs", "Runs by phase"), &["phase"])?;
    let leader = IntGauge::with_opts(opts!(
        "leader",
        "1 while this replica runs the controller (holds the lease), else 0"
    ))?;
    let shards_owned = IntGauge::with_opts(opts!(
        "shards_owned",
        "Shards whose Lease this replica holds (--sharding), the ones being handed back included"
    ))?;
    Ok((runs_by_phase, leader, shards_owned))
}

/// A histogram vector named `name` (the registry adds the prefix) with `buckets` and `labels`.
fn histograms(
    name: &str,
    help: &str,
    buckets: Vec<f64>,
    labels: &[&str],
) -> Result<HistogramVec, prometheus::Error> {
    HistogramVec::new(histogram_opts!(name, help, buckets), labels)
}

/// A counter vector named `name` (the registry adds the prefix) with `labels`.
fn counter(name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec, prometheus::Error> {
    IntCounterVec::new(opts!(name, help), labels)
}

/// The prefix of every metric name (the registries' namespace).
pub const PREFIX: &str = "sandboxrun";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_render_with_the_operator_prefix() {
        let m = Metrics::new().unwrap();
        m.drains.with_label_values(&["Drained"]).inc();
        m.drain_failures.with_label_values(&["exec"]).inc();
        let text = m.render();
        assert!(
            text.contains("sandboxrun_drains_total{phase=\"Drained\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("sandboxrun_drain_failures_total{reason=\"exec\"} 1"),
            "{text}"
        );
    }

    /// docs/operations.md's metrics tables list exactly what the operator, its webhook and the
    /// egress proxy register (issue #27: `drain_wire_bytes_total` was missing).
    #[test]
    fn the_operations_guide_lists_every_metric_and_only_those() {
        let m = Metrics::new().unwrap();
        let mut exported: std::collections::BTreeSet<String> = m.names.iter().cloned().collect();
        let webhook = crate::admission::webhook::WebhookMetrics::register(&m.registry).unwrap();
        exported.extend(webhook.names);
        let runs = std::sync::Arc::new(crate::egress::runs::RunTable::default());
        let state = crate::egress::state::ProxyState::new(
            runs,
            std::sync::Arc::from(b"secret".as_slice()),
            crate::egress::state::Timeouts::default(),
        )
        .unwrap();
        exported.extend(state.register(&prometheus::Registry::new()).unwrap());
        exported.insert(format!(
            "{PREFIX}_{}",
            crate::store::open_uploads::OPEN_UPLOADS_METRIC
        ));
        exported.insert(format!(
            "{PREFIX}_{}",
            crate::pool::gauges::POOL_PODS_METRIC
        ));
        let doc = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/operations.md"),
        )
        .unwrap();
        let documented: std::collections::BTreeSet<String> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `sandboxrun_"))
            .filter_map(|l| l.split_once('`'))
            .map(|(name, _)| format!("sandboxrun_{name}"))
            .collect();
        assert_eq!(documented, exported);
    }
}
