//! Operator-wide settings shared by the admission rules, the pod builder and the drain.

/// One mebibyte.
pub const MIB: u64 = 1024 * 1024;
/// One gibibyte.
pub const GIB: u64 = 1024 * MIB;

/// Default of `run --image-pull-timeout`: how long a retryable image-pull error may last before
/// the run is failed (see `controller::decide::DecideSettings`).
pub const DEFAULT_IMAGE_PULL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5 * 60);

/// The read-back cap bounds (ADR-143 "Unbounded size"): a path's `sizeLimit`, else `default_bytes`,
/// never above `max_bytes`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapSettings {
    /// Cap of a path that declares no `sizeLimit`.
    pub default_bytes: u64,
    /// Highest cap any path may get, whatever it declares.
    pub max_bytes: u64,
}

impl Default for CapSettings {
    fn default() -> Self {
        CapSettings {
            default_bytes: GIB,
            max_bytes: 16 * GIB,
        }
    }
}

impl CapSettings {
    /// The effective cap of a path that asked for `requested` bytes (None: no sizeLimit).
    pub fn effective(&self, requested: Option<u64>) -> u64 {
        requested.unwrap_or(self.default_bytes).min(self.max_bytes)
    }
}
