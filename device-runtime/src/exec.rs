//! The table interpreter: submits the tasks of a validated table, in table
//! (program) order, to the [orchestrator](crate::orch), which infers their
//! dependencies (read-after-write, write-after-write, write-after-read) and
//! hands out ready tasks; this loop issues them to idle cores of their
//! kernel's kind on a [`Platform`], feeds completions back, and so runs tasks
//! out of order and in parallel wherever the data allows.
//!
//! When the task window or a pool is full, submission stalls (backpressure)
//! while completions free space. Every wait is bounded: a kernel that does
//! not finish within [`RunOptions::kernel_timeout_ms`] ends the run with
//! [`RunError::KernelTimeout`], and a run that cannot progress at all ends
//! with [`RunError::Deadlock`] and the orchestrator's report.

use core::fmt;

use wsp_ffi::{CoreKind, WspKernelArgs, WspTensorView};

use crate::abi::{dtype_size, Access, Region, Table, TileView, MAX_TENSOR_ARGS};
use crate::orch::{
    DeadlockReport, Invalid, KernelRef, Orchestrator, StallStats, SubmitError, TaskArg, TaskId,
};
use crate::platform::{Completion, Platform, MAX_CORES};

/// The task window of table runs: tasks submitted and not yet retired.
pub const TASK_WINDOW: usize = 256;
/// TensorMap entries of table runs: one per tensor argument (at most
/// [`MAX_TENSOR_ARGS`]) of every task in the window, so it never stalls.
pub const TENSORMAP_ENTRIES: usize = MAX_TENSOR_ARGS * TASK_WINDOW;
/// DepList nodes of table runs (fan-in edges of the tasks in the window).
pub const DEPLIST_NODES: usize = 8 * TASK_WINDOW;

/// The orchestrator a table run uses (about 120 KiB: on the device, place it
/// in a `static`). Tables carry no intermediate buffers, so its heap ring is empty.
pub type TableOrchestrator = Orchestrator<TASK_WINDOW, TENSORMAP_ENTRIES, DEPLIST_NODES>;

impl TableOrchestrator {
    /// An orchestrator for [`run`].
    pub const fn for_tables() -> Self {
        Orchestrator::new(0)
    }
}

/// Settings of one run.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// How long one kernel may run before the run ends with an error.
    pub kernel_timeout_ms: u64,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            kernel_timeout_ms: 10_000,
        }
    }
}

/// Per-core figures of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreStats {
    pub kind: CoreKind,
    pub tasks: u32,
    /// Semantic cycles the core's kernels reported.
    pub cycles: u64,
}

/// What a successful run did.
#[derive(Clone, Copy, Debug)]
pub struct RunStats {
    pub tasks: u32,
    pub wall_ticks: u64,
    pub ticks_per_second: u64,
    /// Backpressure: stalls and high-water marks per resource.
    pub stalls: StallStats,
    num_cores: usize,
    cores: [CoreStats; MAX_CORES],
}

impl RunStats {
    pub fn cores(&self) -> &[CoreStats] {
        &self.cores[..self.num_cores]
    }
    pub fn wall_micros(&self) -> u64 {
        (self.wall_ticks as u128 * 1_000_000 / self.ticks_per_second.max(1) as u128) as u64
    }
    pub fn total_cycles(&self) -> u64 {
        self.cores().iter().map(|c| c.cycles).sum()
    }
}

impl fmt::Display for RunStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tasks={} wall_us={} cycles={} per_core=",
            self.tasks,
            self.wall_micros(),
            self.total_cycles()
        )?;
        for (i, c) in self.cores().iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}", c.tasks)?;
        }
        Ok(())
    }
}

/// Why a run ended early. Where a task is named, `task` is its table index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunError {
    /// The arena handed to `run` is smaller than the table's `arena_size`.
    ArenaTooSmall { needed: u64, available: u64 },
    /// The platform has no core of the kind the task's kernel needs.
    NoCoreForKind {
        task: u32,
        kernel_id: u32,
        kind: CoreKind,
    },
    /// The kernel refused its arguments on the core.
    KernelRejected {
        task: u32,
        kernel_id: u32,
        core: u32,
    },
    /// The kernel did not finish in time; the core may still own its regions.
    KernelTimeout {
        task: u32,
        kernel_id: u32,
        core: u32,
        waited_ms: u64,
    },
    /// The platform refused a launch on a core the executor saw idle.
    LaunchRefused { task: u32, core: u32 },
    /// The orchestrator refused a task that table validation accepted.
    Refused { task: u32, why: Invalid },
    /// The orchestrator handed to `run` still holds tasks of an earlier run.
    OrchestratorBusy { in_flight: u64 },
    /// No progress is possible; the report says why.
    Deadlock(DeadlockReport),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RunError::ArenaTooSmall { needed, available } => {
                write!(f, "data arena of {available} bytes, the table needs {needed}")
            }
            RunError::NoCoreForKind { task, kernel_id, kind } => {
                write!(f, "task {task} calls kernel {kernel_id}, which needs a {kind:?} core; the platform has none")
            }
            RunError::KernelRejected { task, kernel_id, core } => {
                write!(f, "kernel {kernel_id} rejected the arguments of task {task} on core {core}")
            }
            RunError::KernelTimeout { task, kernel_id, core, waited_ms } => write!(
                f,
                "task {task} (kernel {kernel_id}) on core {core} did not finish within {waited_ms} ms"
            ),
            RunError::LaunchRefused { task, core } => write!(f, "core {core} refused task {task} while idle"),
            RunError::Refused { task, why } => {
                write!(f, "task {task} passed validation but the orchestrator refused it: {}", SubmitError::Invalid(why))
            }
            RunError::OrchestratorBusy { in_flight } => {
                write!(f, "the orchestrator still holds {in_flight} tasks of an earlier run")
            }
            RunError::Deadlock(report) => write!(f, "{report}"),
        }
    }
}

struct Executor<'t, 'p, 'o, P: Platform> {
    table: &'t Table<'t>,
    platform: &'p mut P,
    orch: &'o mut TableOrchestrator,
    arena_base: u64,
    /// Next table task to submit.
    next: usize,
    idle: u64,
    kind_mask: [u64; 2],
    core_task: [TaskId; MAX_CORES],
    core_table_index: [u32; MAX_CORES],
    core_started: [u64; MAX_CORES],
    next_core: u32,
    stats: RunStats,
    timeout_ticks: u64,
}

/// Runs every task of `table` on `platform`, with tensor data in `arena`,
/// using `orch` (which must hold no tasks) for dependency tracking.
pub fn run<P: Platform>(
    table: &Table<'_>,
    arena: &mut [u8],
    platform: &mut P,
    orch: &mut TableOrchestrator,
    options: &RunOptions,
) -> Result<RunStats, RunError> {
    if (arena.len() as u64) < table.arena_size() {
        return Err(RunError::ArenaTooSmall {
            needed: table.arena_size(),
            available: arena.len() as u64,
        });
    }
    if !orch.is_drained() {
        return Err(RunError::OrchestratorBusy {
            in_flight: orch.in_flight(),
        });
    }
    let num_cores = platform.num_cores().min(MAX_CORES);
    let mut kind_mask = [0u64; 2];
    let mut cores = [CoreStats {
        kind: CoreKind::Vector,
        tasks: 0,
        cycles: 0,
    }; MAX_CORES];
    for (core, stats) in cores.iter_mut().enumerate().take(num_cores) {
        stats.kind = platform.core_kind(core);
        kind_mask[stats.kind as usize] |= 1 << core;
    }
    let tps = platform.ticks_per_second();
    let mut exec = Executor {
        table,
        arena_base: arena.as_mut_ptr() as u64,
        next: 0,
        idle: kind_mask[0] | kind_mask[1],
        kind_mask,
        core_task: [0; MAX_CORES],
        core_table_index: [0; MAX_CORES],
        core_started: [0; MAX_CORES],
        next_core: 0,
        stats: RunStats {
            tasks: 0,
            wall_ticks: 0,
            ticks_per_second: tps,
            stalls: *orch.stats(),
            num_cores,
            cores,
        },
        timeout_ticks: (options.kernel_timeout_ms as u128 * tps as u128 / 1000) as u64,
        platform,
        orch,
    };
    let start = exec.platform.now();
    let result = exec.run_all();
    if result.is_err() {
        exec.drain();
    }
    result?;
    exec.stats.wall_ticks = exec.platform.now().wrapping_sub(start);
    exec.stats.stalls = *exec.orch.stats();
    Ok(exec.stats)
}

impl<P: Platform> Executor<'_, '_, '_, P> {
    fn run_all(&mut self) -> Result<(), RunError> {
        let n = self.table.tasks().len();
        while self.next < n || !self.orch.is_drained() {
            let mut progress = self.submit()?;
            progress |= self.launch_ready()?;
            progress |= self.poll_cores()?;
            if !progress {
                let running =
                    (!self.idle & (self.kind_mask[0] | self.kind_mask[1])).count_ones() as usize;
                let has_cores = [self.kind_mask[0] != 0, self.kind_mask[1] != 0];
                self.orch
                    .check_progress(running, has_cores)
                    .map_err(RunError::Deadlock)?;
                self.check_timeouts()?;
                self.platform.relax();
            }
        }
        Ok(())
    }

    fn kind_of(&self, task: u32) -> (u32, CoreKind) {
        let id = self.table.tasks()[task as usize].kernel_id.get();
        let kind = wsp_ffi::lookup(id).map_or(CoreKind::Vector, |k| k.kind);
        (id, kind)
    }

    /// Submits table tasks in order until one stalls.
    fn submit(&mut self) -> Result<bool, RunError> {
        let mut submitted = false;
        while self.next < self.table.tasks().len() {
            let index = self.next as u32;
            let (kernel_id, kind) = self.kind_of(index);
            if self.kind_mask[kind as usize] == 0 {
                return Err(RunError::NoCoreForKind {
                    task: index,
                    kernel_id,
                    kind,
                });
            }
            let desc = &self.table.tasks()[self.next];
            let mut args = [TaskArg {
                tensor: 0,
                region: Region {
                    offset: [0; 4],
                    extent: [0; 4],
                },
                access: Access::READ,
            }; MAX_TENSOR_ARGS];
            let table_args = self.table.task_args(desc);
            for (arg, t) in args.iter_mut().zip(table_args) {
                let access = Access::from_bits_truncate(t.access.get());
                *arg = TaskArg {
                    tensor: t.tensor.get(),
                    region: Region::of(t),
                    access,
                };
            }
            let kernel = KernelRef {
                id: kernel_id,
                kind,
            };
            let now = self.platform.now();
            match self
                .orch
                .submit(now, kernel, &args[..table_args.len()], 0, &[], index as u64)
            {
                Ok(_) => {
                    self.next += 1;
                    submitted = true;
                }
                Err(SubmitError::Stall(_)) => break,
                Err(SubmitError::Deadlock(cause)) => {
                    return Err(RunError::Deadlock(self.orch.report(cause)))
                }
                // Validation refuses every task the orchestrator would;
                // reaching this means the two disagree: say so, do not run.
                Err(SubmitError::Invalid(why)) => {
                    return Err(RunError::Refused { task: index, why });
                }
            }
        }
        Ok(submitted)
    }

    /// Issues ready tasks, oldest first, to idle cores of their kind.
    fn launch_ready(&mut self) -> Result<bool, RunError> {
        let mut launched = false;
        for kind in [CoreKind::Cube, CoreKind::Vector] {
            loop {
                let candidates = self.idle & self.kind_mask[kind as usize];
                if candidates == 0 {
                    break;
                }
                let Some(task) = self.orch.pop_ready(kind) else {
                    break;
                };
                let index = task.tag as u32;
                // Rotate the starting core so that light loads spread over cores.
                let core = ((candidates.rotate_right(self.next_core).trailing_zeros()
                    + self.next_core)
                    % 64) as usize;
                self.next_core = (core as u32 + 1) % 64;
                let args = self.kernel_args(index);
                // SAFETY: the table is validated, so every view lies inside the
                // arena, which `run` borrows mutably for the whole run and drains
                // before returning. The orchestrator hands out a task only when
                // every earlier task touching its regions with a write on either
                // side has completed, and holds back later such tasks until this
                // one completes.
                if !unsafe { self.platform.launch(core, task.kernel.id, &args) } {
                    return Err(RunError::LaunchRefused {
                        task: index,
                        core: core as u32,
                    });
                }
                self.idle &= !(1 << core);
                self.core_task[core] = task.id;
                self.core_table_index[core] = index;
                self.core_started[core] = self.platform.now();
                launched = true;
            }
        }
        Ok(launched)
    }
    fn kernel_args(&self, task: u32) -> WspKernelArgs {
        let desc = &self.table.tasks()[task as usize];
        let empty = WspTensorView {
            addr: 0,
            rows: 0,
            cols: 0,
            row_stride: 0,
            dtype: 0,
        };
        let mut args = WspKernelArgs {
            num_tensors: desc.num_args.get(),
            num_scalars: desc.num_scalars.get(),
            tensors: [empty; MAX_TENSOR_ARGS],
            scalars: desc.scalars.map(|s| s.get()),
        };
        for (view, arg) in args.tensors.iter_mut().zip(self.table.task_args(desc)) {
            let tensor = &self.table.tensors()[arg.tensor.get() as usize];
            let dtype = tensor.dtype.get();
            let tile = TileView::of(tensor, &Region::of(arg));
            let elem = dtype_size(dtype).unwrap_or(0);
            let addr = self.arena_base + tensor.arena_offset.get() + tile.first_element * elem;
            *view = WspTensorView {
                addr,
                rows: tile.rows,
                cols: tile.cols,
                row_stride: tile.row_stride,
                dtype,
            };
        }
        args
    }

    /// Collects finished tasks and reports them to the orchestrator.
    fn poll_cores(&mut self) -> Result<bool, RunError> {
        let mut finished = false;
        let mut busy = !self.idle & (self.kind_mask[0] | self.kind_mask[1]);
        while busy != 0 {
            let core = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let Some(completion) = self.platform.poll(core) else {
                continue;
            };
            self.idle |= 1 << core;
            let index = self.core_table_index[core];
            let cycles = match completion {
                Completion::Done { cycles } => cycles,
                Completion::Rejected => {
                    let (kernel_id, _) = self.kind_of(index);
                    return Err(RunError::KernelRejected {
                        task: index,
                        kernel_id,
                        core: core as u32,
                    });
                }
            };
            let stats = &mut self.stats.cores[core];
            stats.tasks += 1;
            stats.cycles += cycles;
            self.stats.tasks += 1;
            // The task was handed out by `pop_ready` and not completed yet.
            let _ = self.orch.complete(self.core_task[core]);
            finished = true;
        }
        Ok(finished)
    }

    fn check_timeouts(&self) -> Result<(), RunError> {
        let now = self.platform.now();
        let mut busy = !self.idle & (self.kind_mask[0] | self.kind_mask[1]);
        while busy != 0 {
            let core = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let waited = now.wrapping_sub(self.core_started[core]);
            if waited > self.timeout_ticks {
                let task = self.core_table_index[core];
                let (kernel_id, _) = self.kind_of(task);
                let waited_ms =
                    (waited as u128 * 1000 / self.stats.ticks_per_second.max(1) as u128) as u64;
                return Err(RunError::KernelTimeout {
                    task,
                    kernel_id,
                    core: core as u32,
                    waited_ms,
                });
            }
        }
        Ok(())
    }

    /// After an error: waits (bounded) for the tasks still on cores, so that
    /// no kernel writes the arena after `run` returns its borrow.
    fn drain(&mut self) {
        let all = self.kind_mask[0] | self.kind_mask[1];
        let deadline = self.platform.now().wrapping_add(self.timeout_ticks);
        while self.idle & all != all && self.platform.now() < deadline {
            let mut busy = !self.idle & all;
            while busy != 0 {
                let core = busy.trailing_zeros() as usize;
                busy &= busy - 1;
                if self.platform.poll(core).is_some() {
                    self.idle |= 1 << core;
                }
            }
            self.platform.relax();
        }
    }
}
