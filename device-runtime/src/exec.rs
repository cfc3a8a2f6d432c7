//! The table interpreter: runs a validated table. The
//! [dispatcher](crate::sched::Dispatcher) submits its tasks in table
//! (program) order to the [orchestrator](crate::orch), which infers their
//! dependencies (read-after-write, write-after-write, write-after-read) and
//! hands out ready tasks; the [scheduler threads](crate::sched::Scheduler)
//! issue them to idle cores of their kernel's kind on their [`Platform`]s and
//! feed completions back, so tasks run out of order and in parallel wherever
//! the data allows. [`run`] is the one-thread form; the host shim and the
//! QEMU firmware run several threads through [`crate::sched`].
//!
//! What every form shares (options, statistics, errors) is in
//! [`crate::sched`]'s run types ([`RunOptions`], [`RunStats`], [`RunError`]).
//!
//! When the task window or a pool is full, submission stalls (backpressure)
//! while completions free space. Every wait is bounded: a kernel that does
//! not finish within [`RunOptions::kernel_timeout_ms`] ends the run with
//! [`RunError::KernelTimeout`], and a run that cannot progress at all ends
//! with [`RunError::Deadlock`] and the orchestrator's report.

use crate::abi::Table;
use crate::platform::{Platform, MAX_CORES};
use crate::sched::policy::RoundRobin;
use crate::sched::{
    drive_stepped, Arena, Dispatcher, PolicyKind, Queues, RunError, RunOptions, RunStats,
    SchedConfig, Scheduler, TableOrchestrator,
};

/// Runs every task of `table` on `platform`, with tensor data in `arena`,
/// using `orch` (which must hold no tasks) for dependency tracking and
/// `queues` (empty: new, or after a finished run or a reset): one
/// scheduler thread (the caller) driving every core of the platform, in
/// ready order (round-robin over one thread). Both are large (their sizes
/// grow with [`TASK_WINDOW`](crate::abi::TASK_WINDOW)): keep them in a
/// `static` or on the heap, not on a small stack.
pub fn run<P: Platform>(
    table: &Table<'_>,
    arena: &mut [u8],
    platform: &mut P,
    orch: &mut TableOrchestrator,
    queues: &Queues,
    options: &RunOptions,
) -> Result<RunStats, RunError> {
    let mut policy = RoundRobin::default();
    let config = SchedConfig {
        threads: 1,
        policy: PolicyKind::RoundRobin,
        ..SchedConfig::default()
    };
    let num_cores = platform.num_cores().min(MAX_CORES);
    let global: [u16; MAX_CORES] = core::array::from_fn(|c| c as u16);
    let arena = Arena::new(arena);
    let tps = platform.ticks_per_second();
    let scheduler = Scheduler::new(
        0,
        1,
        platform,
        &global[..num_cores],
        table,
        arena,
        queues,
        options,
    )
    .map_err(RunError::Config)?;
    let kinds = [scheduler.kinds()];
    let mut dispatcher = Dispatcher::new(
        table,
        arena,
        options,
        orch,
        queues,
        &mut policy,
        &config,
        &kinds,
    )?;
    let mut schedulers = [scheduler];
    let start = schedulers[0].platform().now();
    drive_stepped(&mut dispatcher, &mut schedulers)?;
    let wall = schedulers[0].platform().now().wrapping_sub(start);
    Ok(RunStats::collect(&dispatcher, &schedulers, tps, wall))
}
