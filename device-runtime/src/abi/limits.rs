//! Capacities of table runs that the table format itself is bounded by.

/// The task window of table runs: at most this many tasks submitted and
/// not yet retired. A program's `WINDOW` ([`OP_WINDOW`](super::program::OP_WINDOW))
/// may ask for fewer, never more; the scheduler sizes its per-task arrays by it.
///
/// The runtime's statics grow by 352 bytes per task of the window:
/// orchestrator slot 64 and two TensorMap entries of 48, launch record
/// 112, completion-ring entries 32 (one per task on each of four threads),
/// release-graph slot 32 (with the dispatch key) and four edges of 4. At
/// 4,096 the firmware's static footprint is 1.88 MiB (1,972,888 bytes),
/// under the 2 MiB budget `cargo xtask fw` checks.
pub const TASK_WINDOW: usize = 4096;

/// Tensors a table may declare: 65,536, so that a launch record keeps a
/// task's tensor indices in one word (16 bits each). A larger tensors
/// section is refused.
pub const MAX_TENSORS: usize = 1 << 16;

/// Scratch tensors a table may declare (tensors whose `arena_offset` is
/// [`SCRATCH_OFFSET`](super::SCRATCH_OFFSET)). The dispatcher keeps one
/// small record per scratch tensor and one per heap block, so a run's
/// scratch bookkeeping is a fixed ~8 KiB; a table with more is refused.
/// 128: a tensor written again after its `FREE` takes new storage, so a
/// program reuses its scratch tensors scope after scope (the host's decode
/// step declares two layers' worth, 22 tensors, for any depth).
pub const MAX_SCRATCH: usize = 128;
