//! Capacities of table runs that the table format itself is bounded by.

/// The task window of table runs: at most this many tasks submitted and
/// not yet retired. A program's `WINDOW` ([`OP_WINDOW`](super::program::OP_WINDOW))
/// may ask for fewer, never more; the scheduler sizes its per-task arrays by it.
pub const TASK_WINDOW: usize = 256;
