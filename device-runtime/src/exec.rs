//! The table executor: issues the tasks of a validated table to the cores of a
//! [`Platform`] in an order that respects every data dependency.
//!
//! Tasks enter a window of [`WINDOW`] consecutive tasks in table (program)
//! order and leave it in that order once finished. On entry a task records,
//! as a bit mask over the window, every earlier unfinished task it conflicts
//! with: same tensor, overlapping regions, at least one of the two writes
//! (read-after-write, write-after-write and write-after-read). A task whose
//! mask is empty is ready and goes to an idle core of its kernel's kind; a
//! finished task clears its bit in every mask. Tasks therefore run out of
//! order and in parallel wherever the data allows, never where it does not.
//!
//! Every wait is bounded: a kernel that does not finish within
//! [`RunOptions::kernel_timeout_ms`] ends the run with [`RunError::KernelTimeout`].

use core::fmt;

use wsp_ffi::{CoreKind, WspKernelArgs, WspTensorView};

use crate::abi::{dtype_size, Access, Region, Table, TensorArg, TileView, MAX_TENSOR_ARGS};
use crate::platform::{Completion, Platform, MAX_CORES};

/// Tasks the executor considers at once (one bit each in a `u64` mask).
pub const WINDOW: usize = 64;

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
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Waiting,
    Running,
    Done,
}

#[derive(Clone, Copy)]
struct Slot {
    task: u32,
    state: State,
    /// Window slots of earlier unfinished tasks this task conflicts with.
    waits_on: u64,
}

/// Whether two argument lists touch a common element with at least one write.
fn conflicts(a: &[TensorArg], b: &[TensorArg]) -> bool {
    let writes =
        |arg: &TensorArg| Access::from_bits_retain(arg.access.get()).contains(Access::WRITE);
    a.iter().any(|x| {
        b.iter().any(|y| {
            x.tensor == y.tensor
                && (writes(x) || writes(y))
                && Region::of(x).overlaps(&Region::of(y))
        })
    })
}

struct Executor<'t, 'p, P: Platform> {
    table: &'t Table<'t>,
    platform: &'p mut P,
    arena_base: u64,
    slots: [Slot; WINDOW],
    head: usize,
    tail: usize,
    idle: u64,
    kind_mask: [u64; 2],
    core_slot: [usize; MAX_CORES],
    core_started: [u64; MAX_CORES],
    next_core: u32,
    stats: RunStats,
    timeout_ticks: u64,
}

/// Runs every task of `table` on `platform`, with tensor data in `arena`.
pub fn run<P: Platform>(
    table: &Table<'_>,
    arena: &mut [u8],
    platform: &mut P,
    options: &RunOptions,
) -> Result<RunStats, RunError> {
    if (arena.len() as u64) < table.arena_size() {
        return Err(RunError::ArenaTooSmall {
            needed: table.arena_size(),
            available: arena.len() as u64,
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
        slots: [Slot {
            task: 0,
            state: State::Done,
            waits_on: 0,
        }; WINDOW],
        head: 0,
        tail: 0,
        idle: kind_mask[0] | kind_mask[1],
        kind_mask,
        core_slot: [0; MAX_CORES],
        core_started: [0; MAX_CORES],
        next_core: 0,
        stats: RunStats {
            tasks: 0,
            wall_ticks: 0,
            ticks_per_second: tps,
            num_cores,
            cores,
        },
        timeout_ticks: (options.kernel_timeout_ms as u128 * tps as u128 / 1000) as u64,
        platform,
    };
    let start = exec.platform.now();
    let result = exec.run_all();
    if result.is_err() {
        exec.drain();
    }
    result?;
    exec.stats.wall_ticks = exec.platform.now().wrapping_sub(start);
    Ok(exec.stats)
}

impl<P: Platform> Executor<'_, '_, P> {
    fn run_all(&mut self) -> Result<(), RunError> {
        let n = self.table.tasks().len();
        while self.head < n {
            let mut progress = self.admit();
            progress |= self.launch_ready()?;
            progress |= self.poll_cores()?;
            if !progress {
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

    /// Brings tasks into the window while it has room.
    fn admit(&mut self) -> bool {
        let n = self.table.tasks().len();
        let mut admitted = false;
        while self.tail < n && self.tail - self.head < WINDOW {
            let task = &self.table.tasks()[self.tail];
            let args = self.table.task_args(task);
            let mut waits_on = 0u64;
            for earlier in self.head..self.tail {
                let slot = &self.slots[earlier % WINDOW];
                if slot.state != State::Done {
                    let other = &self.table.tasks()[slot.task as usize];
                    if conflicts(self.table.task_args(other), args) {
                        waits_on |= 1 << (earlier % WINDOW);
                    }
                }
            }
            self.slots[self.tail % WINDOW] = Slot {
                task: self.tail as u32,
                state: State::Waiting,
                waits_on,
            };
            self.tail += 1;
            admitted = true;
        }
        admitted
    }

    /// Issues ready tasks, oldest first, to idle cores of their kind.
    fn launch_ready(&mut self) -> Result<bool, RunError> {
        let mut launched = false;
        for i in self.head..self.tail {
            if self.idle == 0 {
                break;
            }
            let slot = self.slots[i % WINDOW];
            if slot.state != State::Waiting || slot.waits_on != 0 {
                continue;
            }
            let (kernel_id, kind) = self.kind_of(slot.task);
            let candidates = self.idle & self.kind_mask[kind as usize];
            if candidates == 0 {
                if self.kind_mask[kind as usize] == 0 {
                    return Err(RunError::NoCoreForKind {
                        task: slot.task,
                        kernel_id,
                        kind,
                    });
                }
                continue;
            }
            // Rotate the starting core so that light loads spread over cores.
            let core = ((candidates.rotate_right(self.next_core).trailing_zeros() + self.next_core)
                % 64) as usize;
            self.next_core = (core as u32 + 1) % 64;
            let args = self.kernel_args(slot.task);
            // SAFETY: the table is validated, so every view lies inside the
            // arena, which `run` borrows mutably for the whole run and drains
            // before returning. The task's mask is empty: no unfinished earlier
            // task touches its regions with a write on either side, and a later
            // task conflicting with it waits on its bit until it completes.
            if !unsafe { self.platform.launch(core, kernel_id, &args) } {
                return Err(RunError::LaunchRefused {
                    task: slot.task,
                    core: core as u32,
                });
            }
            self.idle &= !(1 << core);
            self.core_slot[core] = i % WINDOW;
            self.core_started[core] = self.platform.now();
            self.slots[i % WINDOW].state = State::Running;
            launched = true;
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

    /// Collects finished tasks, releases their dependents, retires in order.
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
            let s = self.core_slot[core];
            let task = self.slots[s].task;
            let cycles = match completion {
                Completion::Done { cycles } => cycles,
                Completion::Rejected => {
                    let (kernel_id, _) = self.kind_of(task);
                    return Err(RunError::KernelRejected {
                        task,
                        kernel_id,
                        core: core as u32,
                    });
                }
            };
            let stats = &mut self.stats.cores[core];
            stats.tasks += 1;
            stats.cycles += cycles;
            self.stats.tasks += 1;
            self.slots[s].state = State::Done;
            for slot in self.slots.iter_mut() {
                slot.waits_on &= !(1 << s);
            }
            finished = true;
        }
        while self.head < self.tail && self.slots[self.head % WINDOW].state == State::Done {
            self.head += 1;
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
                let task = self.slots[self.core_slot[core]].task;
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
