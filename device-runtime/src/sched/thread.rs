//! A scheduler thread: takes tasks from its queues (then the shared queue,
//! then other threads'), issues them to its idle cores, polls its cores,
//! releases the dependents of the tasks it sees finish (keeping them in its
//! own queue or handing them to the dispatcher, as the policy says) and
//! reports the finished tasks to the dispatcher, which retires them.

use core::marker::PhantomData;

use wsp_ffi::{CoreKind, WspKernelArgs, WspTensorView};

use super::policy::MAX_THREADS;
use super::run::{CoreStats, RunError, RunOptions, ThreadStats, MAX_ISSUE_DEPTH};
use super::ConfigError;
use super::{Entry, Queues, DISPATCH_QUEUE, FINISHED, RELEASED, RUNNING};
use crate::abi::{dtype_size, Table, TaskDesc, TensorArg, TensorDesc};
use crate::abi::{MAX_RANK, MAX_SCALARS, MAX_TENSOR_ARGS};
use crate::expand::NO_VIEW;
use crate::platform::{Completion, Event, Platform, MAX_CORES};
use crate::steal_deque::{Owner, Steal, StealDeque};
use crate::sync::Ordering;

/// The data arena of a run, borrowed mutably for `'a` and shared by the
/// scheduler threads, which only turn it into tensor views for kernels.
#[derive(Clone, Copy, Debug)]
pub struct Arena<'a> {
    base: u64,
    len: u64,
    _borrow: PhantomData<&'a mut [u8]>,
}

// SAFETY: an `Arena` is an address range, never dereferenced by the
// runtime; kernels write through views of it only under the orchestrator's
// exclusivity (a task is issued only when no running task touches its
// regions with a write on either side), whatever thread issues them.
unsafe impl Send for Arena<'_> {}
// SAFETY: as for `Send`: sharing the address range shares no access.
unsafe impl Sync for Arena<'_> {}

impl<'a> Arena<'a> {
    /// The arena of `bytes`, borrowed for the run.
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Arena {
            base: bytes.as_mut_ptr() as u64,
            len: bytes.len() as u64,
            _borrow: PhantomData,
        }
    }

    /// Whether its first byte's address is a multiple of `align`.
    pub fn is_aligned(&self, align: u64) -> bool {
        self.base.is_multiple_of(align)
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The arena's address: kernel views are offsets from it.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Reads the little-endian i32 at byte `offset`.
    ///
    /// # Safety
    /// No thread or kernel writes those four bytes during the call, and
    /// the write that put the value there happened before it (e.g. its
    /// task's completion was collected through a completion ring).
    pub unsafe fn read_i32(&self, offset: u64) -> i32 {
        assert!(
            offset.checked_add(4).is_some_and(|end| end <= self.len),
            "read of arena bytes {offset}..+4 outside its {} bytes",
            self.len
        );
        // SAFETY: the bytes lie inside the arena, which this `Arena` borrows
        // for its whole life; the caller guarantees no concurrent write.
        // `read_unaligned`: the arena's base has no alignment guarantee.
        let value = unsafe { core::ptr::read_unaligned((self.base + offset) as *const [u8; 4]) };
        i32::from_le_bytes(value)
    }
}

/// The kernel arguments of task `task` of the table's tasks section with its
/// tensors in `arena`: the views a core gets. Building them is safe; running
/// a kernel on them is not (see [`Platform::launch`]). `None` if the task
/// names a scratch tensor: its storage is a heap-ring block that exists only
/// during a run (the dispatcher rebases such views when it submits the task).
pub fn kernel_args(table: &Table<'_>, arena: &Arena<'_>, task: u32) -> Option<WspKernelArgs> {
    let desc = &table.tasks()[task as usize];
    let tensors = table.tensors();
    if table
        .task_args(desc)
        .iter()
        .any(|a| tensors[a.tensor.get() as usize].is_scratch())
    {
        return None;
    }
    let mut args = WspKernelArgs {
        num_tensors: 0,
        num_scalars: 0,
        tensors: [NO_VIEW; MAX_TENSOR_ARGS],
        scalars: [0; MAX_SCALARS],
    };
    ViewCache::new().fill(table, arena, desc, &mut args);
    Some(args)
}

const _: () = assert!(MAX_RANK.is_power_of_two());

/// Slots of a [`ViewCache`]: a few more than the tensors a task names, so
/// that the tensors of a run's nearby tasks stay in it.
pub const VIEW_CACHE: usize = 16;

/// What a kernel view of any region of one tensor needs, worked out once
/// from its descriptor: a view is then an address sum and two extents.
#[derive(Clone, Copy, Debug)]
struct TensorPlan {
    /// The tensor's index plus one; 0 marks an empty slot.
    tag: u32,
    dtype: u32,
    /// The address of element 0: the arena's base plus the tensor's offset
    /// (wrapping, as in [`tensor_view`](crate::expand::tensor_view)).
    addr: u64,
    /// Bytes from one index to the next per dimension; 0 beyond the rank,
    /// where validation holds every region's offset at 0.
    byte_strides: [u64; MAX_RANK],
    /// The dimension of the tile's columns (rank - 1).
    col_dim: u8,
    /// Rank 1: one row, whose stride is its length.
    one_row: bool,
    /// Elements from one row to the next (rank 2 and up).
    row_stride: u32,
}

impl TensorPlan {
    const EMPTY: TensorPlan = TensorPlan {
        tag: 0,
        dtype: 0,
        addr: 0,
        byte_strides: [0; MAX_RANK],
        col_dim: 0,
        one_row: true,
        row_stride: 0,
    };

    /// Out of line and cold: a cache miss is rare, and the hit path then
    /// reads the plan's fields where they are, as memory operands.
    #[cold]
    #[inline(never)]
    fn of(index: u32, tensor: &TensorDesc, arena_base: u64) -> TensorPlan {
        let dtype = tensor.dtype.get();
        let elem = dtype_size(dtype).unwrap_or(0);
        let rank = (tensor.rank.get() as usize).clamp(1, MAX_RANK);
        let mut byte_strides = [0; MAX_RANK];
        for (d, out) in byte_strides.iter_mut().enumerate().take(rank) {
            *out = tensor.strides[d].get() as u64 * elem;
        }
        TensorPlan {
            tag: index.wrapping_add(1),
            dtype,
            addr: arena_base.wrapping_add(tensor.arena_offset.get()),
            byte_strides,
            col_dim: (rank - 1) as u8,
            one_row: rank == 1,
            row_stride: if rank >= 2 {
                tensor.strides[rank - 2].get()
            } else {
                0
            },
        }
    }

    /// The view of `arg`'s region (validated against this tensor): what
    /// [`tensor_view`](crate::expand::tensor_view) gives.
    #[inline(always)]
    fn view(&self, arg: &TensorArg) -> WspTensorView {
        let mut addr = self.addr;
        for d in 0..MAX_RANK {
            addr = addr.wrapping_add(arg.offset[d].get() as u64 * self.byte_strides[d]);
        }
        // `col_dim` is below `MAX_RANK` (a power of two): the masks only
        // spare the bounds checks.
        const DIMS: usize = MAX_RANK - 1;
        let col_dim = self.col_dim as usize;
        let cols = arg.extent[col_dim & DIMS].get();
        let (rows, row_stride) = if self.one_row {
            (1, cols)
        } else {
            (
                arg.extent[col_dim.wrapping_sub(1) & DIMS].get(),
                self.row_stride,
            )
        };
        WspTensorView {
            addr,
            rows,
            cols,
            row_stride,
            dtype: self.dtype,
        }
    }
}

/// A scheduler thread's plans of the tensors its recent tasks named
/// (direct-mapped by tensor index), so that issuing a table task does not
/// work out strides, element sizes and ranks from the descriptors again.
#[derive(Clone, Debug)]
pub struct ViewCache {
    plans: [TensorPlan; VIEW_CACHE],
}

impl Default for ViewCache {
    fn default() -> Self {
        ViewCache::new()
    }
}

impl ViewCache {
    /// An empty cache.
    pub const fn new() -> Self {
        ViewCache {
            plans: [TensorPlan::EMPTY; VIEW_CACHE],
        }
    }

    /// Fills `args` with the kernel arguments of table task `desc` (of the
    /// validated `table`), its tensors in `arena`: what
    /// `TaskSpec::of_task(..).kernel_args(..)` gives, straight from the
    /// descriptors (the issue path: a test checks the two agree).
    pub fn fill(
        &mut self,
        table: &Table<'_>,
        arena: &Arena<'_>,
        desc: &TaskDesc,
        args: &mut WspKernelArgs,
    ) {
        let targs = table.task_args(desc);
        // Validation bounds both counts by the capacities.
        let scalars = (desc.num_scalars.get() as usize).min(MAX_SCALARS);
        args.num_tensors = targs.len() as u32;
        args.num_scalars = scalars as u32;
        for (i, out) in args.scalars.iter_mut().enumerate() {
            *out = if i < scalars {
                desc.scalars[i].get()
            } else {
                0
            };
        }
        let tensors = table.tensors();
        for (i, view) in args.tensors.iter_mut().enumerate() {
            let Some(t) = targs.get(i) else {
                *view = NO_VIEW;
                continue;
            };
            let index = t.tensor.get();
            let plan = &mut self.plans[index as usize % VIEW_CACHE];
            if plan.tag != index.wrapping_add(1) {
                *plan = TensorPlan::of(index, &tensors[index as usize], arena.base);
            }
            *view = plan.view(t);
        }
    }
}

/// How many times a take retries a deque whose `top` it lost to another
/// taker before moving on (the deque is lock-free: a loss means someone
/// else took a task).
const RETRIES: usize = 8;

/// One scheduler thread and the cores it owns.
pub struct Scheduler<'a, P: Platform> {
    id: usize,
    threads: usize,
    platform: P,
    queues: &'a Queues,
    table: &'a Table<'a>,
    /// Tasks that launch straight from the table: the tasks section, or
    /// none when the table has scratch tensors (their views are rebased in
    /// the launch records the dispatcher writes).
    table_launches: usize,
    arena: Arena<'a>,
    num_cores: usize,
    /// Run-wide number of each of its cores.
    global: [u16; MAX_CORES],
    kind_mask: [u64; 2],
    /// Cores holding no task.
    idle: u64,
    /// Per kind, the owner end of its own queue: the tasks it released
    /// (it pushes there; it takes the oldest, as thieves do, which keeps
    /// program order first, as in the dispatcher's queues).
    local: [Owner<'a, DISPATCH_QUEUE>; 2],
    /// Per kind, the task it released last when it had an idle core for
    /// it: issued before anything else this round, and not stealable (a
    /// chain stays on the thread and its cores without a thief taking each
    /// hop from between the release and the issue).
    next: [Option<Entry>; 2],
    /// Per core, the tasks it holds in launch order (a ring of
    /// [`MAX_ISSUE_DEPTH`]): `core_task[core][(core_head[core] + i) % 2]`,
    /// as queue entries ([`Entry`]).
    core_task: [[Entry; MAX_ISSUE_DEPTH]; MAX_CORES],
    core_head: [u8; MAX_CORES],
    core_held: [u8; MAX_CORES],
    /// When the core's oldest task started (was launched to an idle core,
    /// or the task before it was seen finished).
    core_started: [u64; MAX_CORES],
    /// Tasks one core may hold: 1, or 2 to queue the next task behind a
    /// running one (see [`RunOptions::issue_depth`]).
    depth: usize,
    next_core: u32,
    /// Rounds in a row that found nothing to do (see [`Scheduler::relax`]).
    idle_rounds: u32,
    /// Whether this round may take tasks from other threads' queues.
    steal: bool,
    /// A report found the completion ring full (see [`Scheduler::check_ring`]).
    ring_full: bool,
    timeout_ticks: u64,
    /// [`RunOptions::ack_timeout_ms`] in clock ticks.
    ack_ticks: u64,
    stats: ThreadStats,
    cores: [CoreStats; MAX_CORES],
    /// Plans of the tensors of recent table tasks.
    views: ViewCache,
    /// The arguments of the task being issued, filled in place.
    args: WspKernelArgs,
}

impl<'a, P: Platform> Scheduler<'a, P> {
    /// Scheduler thread `id` of `threads`, driving `platform`'s cores, which
    /// the run numbers `global[i]` (for stats and errors). Fails if
    /// `options.issue_depth` is not one the platform supports, or if the
    /// platform has more cores than [`MAX_CORES`] or than `global` numbers.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        id: usize,
        threads: usize,
        platform: P,
        global: &[u16],
        table: &'a Table<'a>,
        arena: Arena<'a>,
        queues: &'a Queues,
        options: &RunOptions,
    ) -> Result<Self, ConfigError> {
        let max = platform.depth().clamp(1, MAX_ISSUE_DEPTH);
        let depth = options.issue_depth.unwrap_or(max);
        if depth == 0 || depth > max {
            return Err(ConfigError::IssueDepth { depth, max });
        }
        let num_cores = platform.num_cores();
        let most = MAX_CORES.min(global.len());
        if num_cores > most {
            return Err(ConfigError::ThreadCores {
                thread: id,
                cores: num_cores,
                max: most,
            });
        }
        let mut kind_mask = [0u64; 2];
        let mut ids = [0u16; MAX_CORES];
        let mut cores = [CoreStats::default(); MAX_CORES];
        for core in 0..num_cores {
            let kind = platform.core_kind(core);
            kind_mask[kind as usize] |= 1 << core;
            ids[core] = global[core];
            cores[core].kind = kind;
            cores[core].core = global[core];
            cores[core].thread = id as u8;
        }
        let tps = platform.ticks_per_second();
        let threads_err = ConfigError::Threads {
            threads: id + 1,
            max: MAX_THREADS,
        };
        let own = queues.local.get(id).ok_or(threads_err)?;
        let claim = |k: usize| own[k].claim_owner().map_err(|_| ConfigError::QueuesInUse);
        let local = [claim(0)?, claim(1)?];
        if local.iter().any(|q| !q.is_empty()) {
            return Err(ConfigError::QueuesInUse);
        }
        Ok(Scheduler {
            local,
            next: [None; 2],
            id,
            threads: threads.min(MAX_THREADS),
            queues,
            table,
            table_launches: if table.scratch_count() == 0 {
                table.tasks().len()
            } else {
                0
            },
            arena,
            num_cores,
            global: ids,
            idle: kind_mask[0] | kind_mask[1],
            kind_mask,
            core_task: [[Entry(0); MAX_ISSUE_DEPTH]; MAX_CORES],
            core_head: [0; MAX_CORES],
            core_held: [0; MAX_CORES],
            core_started: [0; MAX_CORES],
            depth,
            next_core: 0,
            idle_rounds: 0,
            steal: true,
            ring_full: false,
            timeout_ticks: ms_to_ticks(options.kernel_timeout_ms, tps),
            ack_ticks: ms_to_ticks(options.ack_timeout_ms, tps),
            stats: ThreadStats {
                thread: id as u8,
                ..ThreadStats::default()
            },
            cores,
            platform,
            views: ViewCache::new(),
            args: WspKernelArgs {
                num_tensors: 0,
                num_scalars: 0,
                tensors: [NO_VIEW; MAX_TENSOR_ARGS],
                scalars: [0; MAX_SCALARS],
            },
        })
    }

    /// `[has cube cores, has vector cores]`, for [`Dispatcher::new`](super::Dispatcher::new).
    pub fn kinds(&self) -> [bool; 2] {
        [self.kind_mask[0] != 0, self.kind_mask[1] != 0]
    }

    /// The thread's figures so far.
    pub fn stats(&self) -> &ThreadStats {
        &self.stats
    }

    /// Its cores' figures so far.
    pub fn core_stats(&self) -> &[CoreStats] {
        &self.cores[..self.num_cores]
    }

    /// The platform of its cores.
    pub fn platform(&self) -> &P {
        &self.platform
    }

    /// Tells an observing platform ([`Platform::observing`]) the
    /// dispatcher's state after its round at `now`.
    pub(super) fn observe_dispatcher(&mut self, dispatcher: &super::Dispatcher<'_>, now: u64) {
        if self.platform.observing() {
            let event = Event::Dispatcher {
                now,
                stall: dispatcher.stall().map(|r| r.name()),
                in_flight: dispatcher.in_flight(),
                queued: dispatcher.queued(),
            };
            self.platform.observe(event);
        }
    }

    pub(super) fn now(&self) -> u64 {
        self.platform.now()
    }

    /// Waits a moment after a round with nothing to do: spins for
    /// [`SPIN_ROUNDS`](super::SPIN_ROUNDS) such rounds in a row, then
    /// pauses (yields the host processor where there is a host).
    pub(super) fn relax(&mut self) {
        if self.idle_rounds < super::SPIN_ROUNDS {
            self.idle_rounds += 1;
            self.platform.relax()
        } else {
            self.platform.pause()
        }
    }

    /// Waits as [`relax`](Self::relax) does, but no later than `deadline`
    /// on a clock the scheduler moves ([`Clock::relax_until`]).
    pub(super) fn relax_until(&mut self, deadline: u64) {
        self.platform.relax_until(deadline)
    }

    fn busy(&self) -> u64 {
        !self.idle & (self.kind_mask[0] | self.kind_mask[1])
    }

    /// One round: poll cores, issue to idle ones. Returns whether anything
    /// happened.
    pub fn step(&mut self) -> Result<bool, RunError> {
        let now = self.platform.now();
        self.step_at(now, true)
    }

    /// [`Scheduler::step`] at time `now`, read from its clock by the
    /// caller: one reading per round times every completion and issue of
    /// the round (a clock read can cost as much as handling a task; in
    /// semantic time the clock only moves in `relax`, so this is exact).
    ///
    /// Without `steal` it takes no task from other threads' queues this
    /// round: the dispatching thread steals only in rounds its dispatcher
    /// had nothing to do, since every look into another thread's queue
    /// pulls that thread's cache lines away from it.
    pub(super) fn step_at(&mut self, now: u64, steal: bool) -> Result<bool, RunError> {
        self.steal = steal;
        let mut progress = self.poll_cores(now)?;
        progress |= self.issue(now)?;
        if progress {
            self.idle_rounds = 0;
        }
        Ok(progress)
    }

    /// Ends the run from this thread instead of serving it (its host could
    /// not set the thread up): tells the other threads, then leaves its
    /// cores idle.
    pub fn abort(&mut self) {
        self.queues.abort();
        self.drain();
    }

    /// Threads 1.. of a threaded run: steps until the dispatcher says the
    /// run finished or some thread failed; then returns with its cores idle.
    pub fn serve(&mut self) -> Result<(), RunError> {
        if let Err(e) = self.check_kernels() {
            self.queues.abort();
            return Err(e);
        }
        loop {
            match self.queues.state() {
                RUNNING => {}
                FINISHED => return Ok(()),
                _ => {
                    self.drain();
                    return Ok(());
                }
            }
            // One clock reading a round, for the round and its timeout check.
            let now = self.platform.now();
            let stepped = match self.step_at(now, true) {
                Ok(true) => Ok(()),
                Ok(false) => self.check_timeouts_at(now).map(|()| self.relax()),
                Err(e) => Err(e),
            };
            if let Err(e) = stepped {
                self.queues.abort();
                self.drain();
                return Err(e);
            }
        }
    }

    /// Takes the oldest task of `deque` if `take` allows it, retrying a
    /// few lost races. (A queue entry is the task's number, with its
    /// taskset in the bits above [`super::TASKSET_SHIFT`].)
    fn take_from(
        deque: &StealDeque<{ super::DISPATCH_QUEUE }>,
        take: impl Fn(u64) -> bool,
    ) -> Option<Entry> {
        // A look at the two positions first: a steal from an empty deque
        // would still pay its full fence.
        if deque.is_empty() {
            return None;
        }
        for _ in 0..RETRIES {
            match deque.steal_if(&take) {
                Steal::Task(task) => return Some(Entry(task)),
                Steal::Empty | Steal::Declined => return None,
                Steal::Retry => {}
            }
        }
        None
    }

    /// The next task for a `kind` core: the oldest it released itself, the
    /// oldest the dispatcher placed with it, the shared queue, then (if the policy
    /// allows) one task stolen from another thread. To queue behind a busy
    /// core (`behind`), only from the dispatcher's queue for it: a task that
    /// another thread could start now should not wait behind a running one.
    pub(super) fn take(&mut self, kind: CoreKind, behind: bool) -> Option<Entry> {
        let k = kind as usize;
        let queues = self.queues;
        let any = |_| true;
        // Not behind a busy core: another thread could start the task now.
        if !behind {
            if let Some(task) = self.next[k].take() {
                return Some(task);
            }
            if let Some(task) = Self::take_from(&queues.local[self.id][k], any) {
                return Some(task);
            }
        }
        if let Some(task) = Self::take_from(&queues.ready[self.id][k], any) {
            return Some(task);
        }
        if behind {
            return None;
        }
        if let Some(task) = Self::take_from(&queues.shared[k], any) {
            self.stats.from_shared += 1;
            return Some(task);
        }
        if !self.steal {
            return None;
        }
        // Only tasks of a taskset whose policy steals now may be stolen.
        let stealing = queues.stealing.load(Ordering::Acquire);
        let stealable = |entry: u64| queues.steals[Entry(entry).taskset()].load(Ordering::Acquire);
        let mut backlog = false;
        for step in 1..self.threads {
            let other = (self.id + step) % self.threads;
            for victim in [&queues.local[other][k], &queues.ready[other][k]] {
                if victim.is_empty() {
                    continue;
                }
                backlog = true;
                if !stealing {
                    break;
                }
                self.stats.steal_attempts += 1;
                if let Some(task) = Self::take_from(victim, stealable) {
                    self.stats.steals += 1;
                    return Some(task);
                }
            }
        }
        if backlog {
            // Idle cores, nothing to take, and another thread has a backlog.
            queues.starved.fetch_add(1, Ordering::Relaxed);
        }
        None
    }

    /// Issues queued tasks to idle cores of their kind, then (with an issue
    /// depth of 2) behind busy cores that can queue one.
    fn issue(&mut self, now: u64) -> Result<bool, RunError> {
        let mut issued = false;
        for kind in [CoreKind::Cube, CoreKind::Vector] {
            loop {
                let candidates = self.idle & self.kind_mask[kind as usize];
                let (core, behind) = if candidates != 0 {
                    // Rotate the starting core so that light loads spread over cores.
                    let core = (candidates.rotate_right(self.next_core).trailing_zeros()
                        + self.next_core)
                        % 64;
                    (core as usize, false)
                } else if let Some(core) = self.queueing_core(kind) {
                    (core, true)
                } else {
                    break;
                };
                let Some(entry) = self.take(kind, behind) else {
                    break;
                };
                let index = entry.task();
                self.next_core = (core as u32 + 1) % 64;
                let (kernel_id, stream) = self.launch_of(index);
                // SAFETY: the table is validated and the dispatcher checked
                // every expanded task's regions, so every view lies inside the
                // arena, which `Arena` borrows mutably for the whole run; every
                // run drains its cores before it ends. The orchestrator hands out
                // a task only when every earlier task touching its regions with a
                // write on either side has completed, and holds back later such
                // tasks until this one completes.
                if !unsafe { self.platform.launch(core, kernel_id, &self.args) } {
                    return Err(RunError::LaunchRefused {
                        task: index,
                        core: self.global[core] as u32,
                    });
                }
                if self.platform.observing() {
                    let event = Event::Issued {
                        core,
                        task: index,
                        now,
                    };
                    self.platform.observe(event);
                }
                if stream != 0 {
                    // The stream's next task waited for this issue.
                    let queues = self.queues;
                    queues
                        .graph
                        .issued(entry.slot(), |tag| self.release(index, tag));
                    self.check_ring()?;
                }
                let held = self.core_held[core] as usize;
                if held == 0 {
                    self.core_started[core] = now;
                }
                let at = (self.core_head[core] as usize + held) % MAX_ISSUE_DEPTH;
                self.core_task[core][at] = entry;
                self.core_held[core] += 1;
                self.idle &= !(1 << core);
                self.stats.issued += 1;
                self.stats.queued += behind as u64;
                issued = true;
            }
        }
        Ok(issued)
    }

    /// What task `index` launches: fills `self.args` with its argument
    /// block and returns its kernel and stream, from the table for a task
    /// of the tasks section, else from the launch record the dispatcher
    /// wrote.
    fn launch_of(&mut self, index: u32) -> (u32, u32) {
        match self.table.tasks()[..self.table_launches].get(index as usize) {
            Some(desc) => {
                (self.views).fill(self.table, &self.arena, desc, &mut self.args);
                (desc.kernel_id.get(), desc.stream.get())
            }
            None => {
                let launch =
                    (self.queues.records).read(index as u64, self.arena.base, self.table.tensors());
                self.args = launch.args;
                (launch.kernel_id, launch.stream)
            }
        }
    }

    /// The kernel of task `index` (for error reports).
    fn kernel_of(&self, index: u32) -> u32 {
        match self.table.tasks().get(index as usize) {
            Some(desc) => desc.kernel_id.get(),
            None => self.queues.records.kernel_id(index as u64),
        }
    }

    /// A busy `kind` core that can take a task behind its running one now
    /// (only worth asking when the thread's own queue has a task for it).
    fn queueing_core(&self, kind: CoreKind) -> Option<usize> {
        if self.depth < 2 || self.queues.ready[self.id][kind as usize].is_empty() {
            return None;
        }
        let mut busy = self.busy() & self.kind_mask[kind as usize];
        while busy != 0 {
            let core = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            if (self.core_held[core] as usize) < self.depth && self.platform.can_queue(core) {
                return Some(core);
            }
        }
        None
    }

    /// Task `by` released the task of queue entry `tag`: tells an
    /// observing platform, then keeps or hands it on.
    fn release(&mut self, by: u32, tag: u64) {
        if self.platform.observing() {
            let task = Entry(tag).task();
            self.platform.observe(Event::Released { by, task });
        }
        self.keep_or_hand_on(tag)
    }

    /// A task this thread released: into its own queue if the taskset's
    /// policy keeps released tasks, it has cores of the task's kind and the
    /// queue has room; else to the dispatcher, to place by the policy. The
    /// completion ring has room: a task has at most one report pending (it
    /// cannot run, and so finish, before the dispatcher has collected its
    /// release and placed it), every such task is in the window, and the
    /// window is at most `TASK_WINDOW` (`Orchestrator::set_window` refuses
    /// more), so at most [`DONE_RING`](super::DONE_RING) = `TASK_WINDOW` reports are pending.
    pub(super) fn keep_or_hand_on(&mut self, tag: u64) {
        let entry = Entry(tag);
        let kind = entry.kind();
        // Thread 0 of several also dispatches and orchestrates, the run's
        // busiest work: what it kept would wait for its next round, while
        // the dispatcher places it (in that same round) where a thread
        // with time takes it, and that thread keeps the chain from then on.
        let dispatches = self.id == 0 && self.threads > 1;
        if !dispatches
            && self.kind_mask[kind] != 0
            && self.queues.keeps[entry.taskset()].load(Ordering::Relaxed)
        {
            // An idle core takes it this round: keep it out of thieves'
            // reach (the first such task of the round; later ones queue).
            if self.idle & self.kind_mask[kind] != 0 && self.next[kind].is_none() {
                self.next[kind] = Some(entry);
                self.stats.released += 1;
                return;
            }
            if self.local[kind].push(tag).is_ok() {
                self.stats.released += 1;
                return;
            }
        }
        if !self.queues.done[self.id].push(tag | RELEASED) {
            self.ring_full = true;
        }
    }

    /// Ends the run if a report found the completion ring full.
    pub(super) fn check_ring(&self) -> Result<(), RunError> {
        if self.ring_full {
            return Err(RunError::CompletionRingFull {
                thread: self.id as u32,
            });
        }
        Ok(())
    }

    /// Takes the oldest task `core` holds off its ring, after its completion.
    fn retire_oldest(&mut self, core: usize, now: u64) -> Entry {
        let index = self.core_task[core][self.core_head[core] as usize];
        self.core_head[core] = ((self.core_head[core] as usize + 1) % MAX_ISSUE_DEPTH) as u8;
        self.core_held[core] -= 1;
        if self.core_held[core] == 0 {
            self.idle |= 1 << core;
        } else {
            // The queued task started when the core finished this one, at
            // the latest now.
            self.core_started[core] = now;
        }
        index
    }

    /// Collects finished tasks, releases their dependents and reports them
    /// to the dispatcher.
    fn poll_cores(&mut self, now: u64) -> Result<bool, RunError> {
        let mut finished = false;
        let mut busy = self.busy();
        let queues = self.queues;
        let done = &queues.done[self.id];
        // Never full (it holds at most one report per uncollected task of
        // the window, and has room for that); checked anyway, once a round
        // (the check reads the dispatcher's position only when the
        // thread's last reading of it leaves too little room), so that no
        // completion is taken from a core without room to hand it on.
        if busy != 0 && !done.has_room(2 * self.num_cores) {
            return Ok(false);
        }
        while busy != 0 {
            let core = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let Some(completion) = self.platform.poll(core) else {
                continue;
            };
            let started = self.core_started[core];
            let entry = self.retire_oldest(core, now);
            let index = entry.task();
            // The kernel and core, named only by an error (the kernel is
            // looked up then, off the completion path).
            let (task, core_id) = (index, self.global[core] as u32);
            let cycles = match completion {
                Completion::Done { cycles } => cycles,
                Completion::Rejected => {
                    return Err(RunError::KernelRejected {
                        task,
                        kernel_id: self.kernel_of(index),
                        core: core_id,
                    });
                }
                Completion::Failed { code } => {
                    return Err(RunError::KernelFailed {
                        task,
                        kernel_id: self.kernel_of(index),
                        core: core_id,
                        code,
                    });
                }
            };
            let stats = &mut self.cores[core];
            stats.tasks += 1;
            stats.cycles += cycles;
            let busy_ticks = now.wrapping_sub(started);
            stats.busy_ticks += busy_ticks;
            self.stats.busy_ticks += busy_ticks;
            self.stats.cycles += cycles;
            if self.platform.observing() {
                let event = Event::Finished {
                    core,
                    task: index,
                    now,
                };
                self.platform.observe(event);
            }
            queues
                .graph
                .complete(entry.slot(), |tag| self.release(index, tag));
            // Room: see `keep_or_hand_on`.
            if !done.push(entry.0) {
                self.ring_full = true;
            }
            self.check_ring()?;
            finished = true;
            // The task queued behind it may have finished too: poll again.
            if self.core_held[core] > 0 {
                busy |= 1 << core;
            }
        }
        Ok(finished)
    }

    /// Ends the run if a core has not acknowledged its oldest task within
    /// the ack timeout ([`RunError::CoreNoAck`]), or a kernel has overrun
    /// the kernel timeout ([`RunError::KernelTimeout`]), both counted from
    /// the task's start.
    pub fn check_timeouts(&self) -> Result<(), RunError> {
        self.check_timeouts_at(self.platform.now())
    }

    /// [`Scheduler::check_timeouts`] at time `now`, the reading its caller
    /// took for the round that found nothing to do (a task issued in that
    /// round started at `now` at the latest).
    pub(super) fn check_timeouts_at(&self, now: u64) -> Result<(), RunError> {
        let mut busy = self.busy();
        while busy != 0 {
            let core = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let waited = now.wrapping_sub(self.core_started[core]);
            let no_ack = waited > self.ack_ticks && !self.platform.acknowledged(core);
            if no_ack || waited > self.timeout_ticks {
                let task = self.core_task[core][self.core_head[core] as usize].task();
                let tps = self.platform.ticks_per_second().max(1);
                let (kernel_id, core) = (self.kernel_of(task), self.global[core] as u32);
                let waited_ms = (waited as u128 * 1000 / tps as u128) as u64;
                return Err(if no_ack {
                    RunError::CoreNoAck {
                        task,
                        kernel_id,
                        core,
                        waited_ms,
                    }
                } else {
                    RunError::KernelTimeout {
                        task,
                        kernel_id,
                        core,
                        waited_ms,
                    }
                });
            }
        }
        Ok(())
    }

    /// Checks, before anything runs, that every kernel the table declares
    /// is built into every core of its kind on this thread's platform
    /// ([`Platform::has_kernel`]), naming the first task (or program call)
    /// that calls a missing one.
    pub fn check_kernels(&self) -> Result<(), RunError> {
        for declared in self.table.kernels() {
            let kernel_id = declared.kernel_id.get();
            let Some(info) = wsp_ffi::lookup(kernel_id) else {
                continue; // validation refuses kernels the registry lacks
            };
            let mut cores = self.kind_mask[info.kind as usize];
            while cores != 0 {
                let core = cores.trailing_zeros() as usize;
                cores &= cores - 1;
                if self.platform.has_kernel(core, kernel_id) {
                    continue;
                }
                let task = (self.table.tasks().iter())
                    .position(|t| t.kernel_id.get() == kernel_id)
                    .map(|t| t as u32);
                let pc = (self.table.program().iter())
                    .position(|i| i.op == crate::abi::program::OP_CALL && i.imm.get() == kernel_id)
                    .map(|pc| pc as u32);
                return Err(RunError::KernelNotBuiltIn {
                    kernel_id,
                    core: self.global[core] as u32,
                    task,
                    pc: if task.is_some() { None } else { pc },
                });
            }
        }
        Ok(())
    }

    /// After an error: waits (bounded) for the tasks still on its cores, so
    /// that no kernel writes the arena after the run returns its borrow.
    pub fn drain(&mut self) {
        // Saturating: a timeout near `u64::MAX` ticks (a timeout meant as
        // "never") would wrap to a deadline already past and not wait.
        let deadline = self.platform.now().saturating_add(self.timeout_ticks);
        while self.busy() != 0 && self.platform.now() < deadline {
            let mut busy = self.busy();
            while busy != 0 {
                let core = busy.trailing_zeros() as usize;
                busy &= busy - 1;
                if self.platform.poll(core).is_some() {
                    let now = self.platform.now();
                    self.retire_oldest(core, now);
                }
            }
            self.platform.relax();
        }
    }
}

/// `ms` milliseconds in ticks of a clock of `tps` ticks a second, at most
/// `u64::MAX` (a larger value cut to 64 bits could be any timeout, 0
/// included: every task would time out as it starts).
fn ms_to_ticks(ms: u64, tps: u64) -> u64 {
    u64::try_from(ms as u128 * tps as u128 / 1000).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::ms_to_ticks;

    #[test]
    fn a_timeout_beyond_64_bits_of_ticks_saturates() {
        assert_eq!(ms_to_ticks(1_500, 1_000_000_000), 1_500_000_000);
        // 2^62 ms at 4,000 ticks a second is 2^64 ticks: one past u64::MAX,
        // 0 when cut to 64 bits.
        assert_eq!(ms_to_ticks(1 << 62, 4_000), u64::MAX);
        assert_eq!(ms_to_ticks(u64::MAX, u64::MAX), u64::MAX);
    }
}
