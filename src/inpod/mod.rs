//! The code that runs inside the run's pod, in the holder container (docs/contract.md §2, §3):
//!
//! - [`holder`]: the holder's modes (idle, the preStop wait, the drained marker) and
//!   [`holder::HolderCommand`], the argv the operator starts and execs them with.
//! - [`pack`]: `sandboxrun-operator pack`, the tar of a read-back directory the drain reads.
//! - [`sized`]: reading a file that may change under the packer, to exactly its listed size.
//! - [`walk`]: the packer's descriptor-relative walk of that directory (`openat`, never a path).
//! - [`unpack`]: `sandboxrun-operator restore-unpack`, a saved generation put back into a
//!   read-back directory before the workload starts (files and directories only, no link followed).
//! - [`gate`]: the egress gate, the init container that holds a filtered run's workload until its
//!   NetworkPolicy is in force.

pub(crate) mod gate;
pub(crate) mod holder;
pub(crate) mod launch;
pub(crate) mod pack;
pub(crate) mod sized;
pub(crate) mod unpack;
pub(crate) mod walk;
