//! Deterministic semantic time: the shim's single-threaded mode.
//!
//! The same executor and dispatch code run over a platform whose clock is
//! virtual: a kernel runs (on this thread) when it is issued, and its core
//! stays busy for the cycles the kernel reports under the cost model. Polls
//! see a completion only once the virtual clock has reached it, and when the
//! scheduler has nothing to do the clock jumps to the earliest completion,
//! so completions arrive in time order. Scheduling overhead costs zero
//! cycles. The same table and core counts give the same makespan on any
//! machine, however loaded.

use device_runtime::abi::Table;
use device_runtime::exec::{self, RunOptions, RunStats, TableOrchestrator};
use device_runtime::platform::{Clock, Completion, Platform};
use wsp_ffi::{CoreKind, WspKernelArgs};

use crate::shim::ShimError;

/// Cycles per semantic second (the clock the timeouts are measured in).
pub const CYCLES_PER_SECOND: u64 = 1_000_000_000;

/// One core in semantic time: the completion it will report and when.
#[derive(Clone, Copy)]
struct Busy {
    until: u64,
    completion: Completion,
}

struct SemanticPlatform {
    kinds: Vec<CoreKind>,
    busy: Vec<Option<Busy>>,
    now: std::cell::Cell<u64>,
    makespan: u64,
}

impl Clock for SemanticPlatform {
    fn now(&self) -> u64 {
        self.now.get()
    }
    fn ticks_per_second(&self) -> u64 {
        CYCLES_PER_SECOND
    }
    /// Nothing else can happen before the earliest completion: jump there.
    fn relax(&self) {
        if let Some(next) = self.busy.iter().flatten().map(|b| b.until).min() {
            self.now.set(self.now.get().max(next));
        }
    }
}

impl Platform for SemanticPlatform {
    fn num_cores(&self) -> usize {
        self.kinds.len()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.kinds[core]
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        if self.busy[core].is_some() {
            return false;
        }
        let completion = match wsp_ffi::lookup(kernel_id) {
            // SAFETY: this fn's contract (views valid and unshared until the
            // completion is polled) covers the kernel, which runs to its end
            // right here, inside that span.
            Some(info) => match unsafe { info.invoke(args) } {
                Ok(cycles) => Completion::Done { cycles },
                Err(_) => Completion::Rejected,
            },
            None => Completion::Rejected,
        };
        let cycles = match completion {
            Completion::Done { cycles } => cycles,
            Completion::Rejected => 0,
        };
        let until = self.now.get() + cycles;
        self.makespan = self.makespan.max(until);
        self.busy[core] = Some(Busy { until, completion });
        true
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let busy = self.busy[core]?;
        if busy.until > self.now.get() {
            return None;
        }
        self.busy[core] = None;
        Some(busy.completion)
    }
}

/// A run in semantic time.
#[derive(Clone, Copy, Debug)]
pub struct SemanticRun {
    pub stats: RunStats,
    /// Cycles from the first issue to the last completion.
    pub makespan: u64,
}

/// Runs `table` on `kinds` cores in semantic time, on the calling thread.
pub fn run_semantic(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    options: &RunOptions,
) -> Result<SemanticRun, ShimError> {
    let table = Table::parse(table).map_err(ShimError::Table)?;
    let mut platform = SemanticPlatform {
        kinds: kinds.to_vec(),
        busy: vec![None; kinds.len()],
        now: std::cell::Cell::new(0),
        makespan: 0,
    };
    let mut orch = Box::new(TableOrchestrator::for_tables());
    let stats = exec::run(&table, arena, &mut platform, &mut orch, options)
        .map_err(|e| ShimError::Run(Box::new(e)))?;
    Ok(SemanticRun {
        stats,
        makespan: platform.makespan,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::{Params, Workload};

    fn makespan(w: &Workload, kinds: &[CoreKind]) -> u64 {
        let mut arena = w.arena.clone();
        let run = run_semantic(&w.table, &mut arena.bytes, kinds, &RunOptions::default()).unwrap();
        assert!(w.verify(&arena).passed());
        run.makespan
    }

    #[test]
    fn bgemm_reaches_the_lower_bound_and_reproduces() {
        // 64^3 in 16^3 tiles: 16 chains of 4 tasks, each 16*16 * 4 loads and
        // stores + 16^3 matmul = 5120 cycles. Work 64 * 5120; critical path 4 * 5120.
        let w = Workload::build(
            "gemm",
            Params {
                m: 64,
                n: 64,
                k: 64,
                tile: 16,
                seed: 1,
            },
        )
        .unwrap();
        let task = 5120;
        for cores in [1usize, 2, 4, 16] {
            let kinds = vec![CoreKind::Cube; cores];
            let bound = (64 * task / cores as u64).max(4 * task);
            let first = makespan(&w, &kinds);
            assert_eq!(first, bound, "{cores} cores");
            assert_eq!(makespan(&w, &kinds), first, "same inputs, same makespan");
        }
    }
}
