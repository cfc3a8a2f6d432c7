//! Scheduling: how ready tasks reach cores.
//!
//! A run has one [`Dispatcher`] and 1 ..= [`MAX_THREADS`] scheduler threads
//! ([`Scheduler`]), each owning a set of cores (cube and vector) through its
//! own [`Platform`](crate::platform::Platform). The dispatcher owns the
//! orchestrator: it submits the table's tasks, which the orchestrator links
//! into the release graph ([`crate::orch::release`]: atomic fan-in counters
//! and fan-out lists), and places every task that is ready when submitted,
//! by the run's [`DispatchPolicy`], in the dispatch queue of one thread that
//! owns cores of the task's kind, or in the shared queue. Each of its
//! rounds submits at most [`SUBMIT_BATCH`] tasks before placing them.
//!
//! Completions do not travel back before their dependents can run: the
//! scheduler thread that sees a task finish releases its consumers in the
//! graph itself. A task it releases stays with that thread when the policy
//! keeps released tasks ([`DispatchPolicy::keeps_released`]: work
//! stealing), so a chain stays on one thread and its cores: the first one
//! of a round that an idle core of the thread can take in a slot no thief
//! reaches (issued in that same round), the others in its own queue;
//! otherwise
//! (and always on thread 0 of several, which dispatches too) the thread
//! hands it to the dispatcher, which places it by the policy.
//! The thread then reports the finished task through its completion ring,
//! and the dispatcher has the orchestrator retire it (reclaim its window
//! slot, TensorMap entries and edges) later, off the critical path.
//!
//! A scheduler thread takes the oldest task of its own queue, then of the
//! dispatcher's queue for it, then of the shared queue, and, when the
//! policy allows stealing and it still has idle cores, single tasks from
//! other threads' queues; it issues them to its idle cores and polls them.
//! A task on a stream releases the stream's next task when it is issued
//! (the graph's stream edge), so a stream issues in order across threads,
//! core kinds and steals, yet its tasks may overlap.
//!
//! A workload program may split its tasks into tasksets
//! ([`crate::abi::program::OP_DISPATCH`]), each placed by its own policy
//! and key; taskset 0 uses the run's. A queue entry carries its task's
//! taskset, and a thief takes the oldest task of another thread's queue
//! only if that taskset's policy steals now ([`StealDeque::steal_if`]): a
//! task of a non-stealing taskset at the front of a queue holds thieves
//! back until its owner takes it.
//!
//! ```text
//!  dispatcher (thread 0)                      scheduler thread t
//!  orchestrator ─ link ─► release graph ◄──────── complete ◄── poll ◄─┐
//!      │ ready now                           │ released (kept)        │
//!      ▼                                     ▼                        │
//!  policy ─► queue[t][kind] ──────────► own queue[t][kind] ─► idle core
//!      ▲   └► shared[kind] ───────────────────────────────────┘
//!      └── released (not kept), finished ◄── done[t] ◄────────────────┘
//! ```
//!
//! All queues and the graph live in one [`Queues`] (a `static` on the
//! device): dispatch queues are [`StealDeque`]s owned by the dispatcher, a
//! thread's own queues by the thread; their [`steal`](StealDeque::steal)
//! end serves the thread they are for and thieves alike. Completion rings
//! are single-producer single-consumer. A full dispatch queue stalls
//! dispatch (`READY_QUEUE_FULL`) until the thread takes from it; a thread
//! whose own queue is full hands released tasks to the dispatcher.
//!
//! The code is written as steps that never block, so the same dispatcher,
//! scheduler and policy code runs
//! - threaded: thread 0 runs [`drive_leader`] (dispatcher and scheduler 0),
//!   threads 1.. run [`Scheduler::serve`] (the shim's threads, the AICPU's);
//! - stepped on one thread: [`drive_stepped`] (the table interpreter
//!   [`exec::run`](crate::exec::run) with one thread, the deterministic
//!   semantic-time mode of the shim with several).
//!
//! A thread with nothing to do spins for [`SPIN_ROUNDS`] rounds, then
//! pauses on every further idle round ([`Clock::pause`](crate::platform::Clock::pause):
//! a host thread yields its processor). Nothing waits without bound: a
//! kernel that overruns its timeout ends the run with a report, a run that
//! cannot progress is proven stuck by the orchestrator (when no task in
//! flight has been released), and a failing thread aborts the others,
//! which drain their cores and stop.

mod dispatch;
pub mod policy;
pub mod record;
pub mod ring;
mod run;
mod thread;

use crate::abi::program::MAX_TASKSETS;
pub use crate::abi::schedule::{DispatchKey, PolicyError, PolicyKind, Schedule, UnknownPolicy};
use crate::abi::TASK_WINDOW;
use crate::steal_deque::StealDeque;
use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
pub use dispatch::DispatchStats;
pub use dispatch::{Dispatcher, OnSubmit};
pub use policy::{
    check_key, DispatchPolicy, Lacks, Load, Placement, Policy, TaskInfo, MAX_THREADS,
};
use ring::Ring;
pub use run::{
    CoreStats, RunError, RunOptions, RunStats, TableOrchestrator, TasksetStats, ThreadStats,
    DEPLIST_NODES, MAX_ISSUE_DEPTH, MAX_RUN_CORES, MAX_RUN_TASKS, TENSORMAP_ENTRIES,
};
pub use thread::{kernel_args, Arena, Scheduler, ViewCache, VIEW_CACHE};

/// Capacity of one dispatch queue (per thread and core kind, and of the
/// shared queue per kind). [`SchedConfig::queue_depth`] may set a lower limit.
pub const DISPATCH_QUEUE: usize = 256;

/// Most tasks the dispatcher submits in one round before it places the
/// ready ones and the leader's scheduler takes its turn. Without a bound a
/// round submitted until the window was full (thousands of tasks) and
/// placed them only then, so the threads ran dry while it submitted and
/// got the tasks in bursts; at 128, placing follows submission closely
/// (the scheduling bench's independent tasks: 68-70 -> 58-60 ns per task
/// on two threads, BENCHMARKS.md), and a round's fixed costs (collecting
/// reports, the clock, the leader's scheduler step) are shared by up to
/// 128 tasks.
pub const SUBMIT_BATCH: u64 = 128;

/// Capacity of a thread's completion ring: one entry per task of the
/// window. A task has at most one report pending at a time: "released"
/// (a thread released it and left it to the dispatcher to place) until
/// the dispatcher collects it, and only then can the task be placed, run
/// and reported "finished"; after the dispatcher collects that, the task
/// retires. Every pending report is so of a distinct task in the window,
/// and the window holds at most `TASK_WINDOW` tasks, across all threads'
/// rings together. 8 bytes an entry, one ring per thread.
const DONE_RING: usize = TASK_WINDOW;

/// Edge nodes of the release graph: four fan-in edges per task of the
/// window (4 bytes each: 64 KiB at the default window). Edges to producers
/// that a live writer of the whole argument already orders are not linked,
/// and arguments on read-only tensors link none, so tiled workloads need
/// one or two per task (the decode-layer workload's high water is about
/// 4,600 with 2,048 tasks in flight). A submission links in one pass while
/// the free edges are at least the tasks in flight (each producer is one
/// of them); below that it first counts its edges, and stalls on
/// `DEPLIST_POOL_FULL` if they do not fit. With two edges per window task
/// the scheduling bench's fan-out/fan-in graph (two edges a task) counted
/// before nine submissions in ten: 2,494 against 2,225 instructions a task
/// on one thread (BENCHMARKS.md).
pub const GRAPH_EDGES: usize = 4 * TASK_WINDOW;

/// The release graph of table runs.
pub type TableGraph = crate::orch::ReleaseGraph<TASK_WINDOW, GRAPH_EDGES>;

/// A queue entry (and a release-graph tag) packs a task's number in the
/// run (below 2^32), its taskset from [`TASKSET_SHIFT`], its core kind at
/// [`KIND_SHIFT`] and its release-graph slot from [`SLOT_SHIFT`]: a thief
/// can tell whether the taskset's policy lets it take the task, and the
/// thread that completes it finds its slot without asking the dispatcher.
const TASKSET_SHIFT: u32 = 32;
const KIND_SHIFT: u32 = 40;
const SLOT_SHIFT: u32 = 48;
const _: () = assert!(
    TASK_WINDOW <= 1 << 15,
    "slots fit in the entry below RELEASED"
);

/// An entry's fields (see [`TASKSET_SHIFT`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry(u64);

impl Entry {
    fn new(task: u32, taskset: u8, kind: wsp_ffi::CoreKind, slot: usize) -> Self {
        Entry(
            task as u64
                | (taskset as u64) << TASKSET_SHIFT
                | (kind as u64) << KIND_SHIFT
                | (slot as u64) << SLOT_SHIFT,
        )
    }
    fn task(self) -> u32 {
        self.0 as u32
    }
    fn taskset(self) -> usize {
        (self.0 >> TASKSET_SHIFT) as u8 as usize % MAX_TASKSETS
    }
    fn kind(self) -> usize {
        ((self.0 >> KIND_SHIFT) & 1) as usize
    }
    fn slot(self) -> usize {
        ((self.0 >> SLOT_SHIFT) & 0x7fff) as usize
    }
}

/// Marks a completion-ring entry as "this thread released the task and
/// leaves it to the dispatcher to place" rather than "finished".
const RELEASED: u64 = 1 << 63;

const RUNNING: u32 = 0;
const FINISHED: u32 = 1;
const ABORTED: u32 = 2;

/// The queues between the dispatcher and the scheduler threads, and the
/// tasks' launch records and their release graph (about 810 KiB at the default
/// window; on the device, a `static`, on the host on the heap).
pub struct Queues {
    /// Per thread and kind, the tasks the dispatcher placed there.
    ready: [[StealDeque<DISPATCH_QUEUE>; 2]; MAX_THREADS],
    /// Per thread and kind, the tasks the thread released itself (owned by
    /// the thread: it pushes and pops the newest; thieves take the oldest).
    local: [[StealDeque<DISPATCH_QUEUE>; 2]; MAX_THREADS],
    /// Fan-in and fan-out of the window's tasks, released by the threads.
    graph: TableGraph,
    shared: [StealDeque<DISPATCH_QUEUE>; 2],
    /// Per thread, the queue entries of finished tasks, and of tasks the
    /// thread released and left to the dispatcher (marked [`RELEASED`]).
    /// Never full: every entry is the one pending report of a distinct task
    /// of the window (see [`DONE_RING`]).
    done: [Ring<DONE_RING>; MAX_THREADS],
    state: AtomicU32,
    /// Whether some taskset's policy lets idle threads steal now (policies
    /// may change their mind).
    stealing: AtomicBool,
    /// Per taskset, whether its policy lets idle threads steal its tasks now.
    steals: [AtomicBool; MAX_TASKSETS],
    /// Per taskset, whether a thread that releases one of its tasks keeps
    /// it in its own queue (else the dispatcher places it by the policy).
    keeps: [AtomicBool; MAX_TASKSETS],
    /// [`Load::starved`].
    starved: AtomicU64,
    /// What each task of the window launches.
    records: record::Records,
}

impl Queues {
    /// Empty queues (`const`, so they can live in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        Queues {
            ready: [const { [const { StealDeque::new() }; 2] }; MAX_THREADS],
            local: [const { [const { StealDeque::new() }; 2] }; MAX_THREADS],
            graph: TableGraph::new(),
            shared: [const { StealDeque::new() }; 2],
            done: [const { Ring::new() }; MAX_THREADS],
            state: AtomicU32::new(RUNNING),
            stealing: AtomicBool::new(false),
            steals: [const { AtomicBool::new(false) }; MAX_TASKSETS],
            keeps: [const { AtomicBool::new(false) }; MAX_TASKSETS],
            starved: AtomicU64::new(0),
            records: record::Records::new(),
        }
    }

    /// Empty queues (loom's atomics cannot be built in const context).
    #[cfg(loom)]
    pub fn new() -> Self {
        Queues {
            ready: core::array::from_fn(|_| core::array::from_fn(|_| StealDeque::new())),
            local: core::array::from_fn(|_| core::array::from_fn(|_| StealDeque::new())),
            graph: TableGraph::new(),
            shared: core::array::from_fn(|_| StealDeque::new()),
            done: core::array::from_fn(|_| Ring::new()),
            state: AtomicU32::new(RUNNING),
            stealing: AtomicBool::new(false),
            steals: core::array::from_fn(|_| AtomicBool::new(false)),
            keeps: core::array::from_fn(|_| AtomicBool::new(false)),
            starved: AtomicU64::new(0),
            records: record::Records::new(),
        }
    }

    fn state(&self) -> u32 {
        self.state.load(Ordering::Acquire)
    }

    /// Tells every thread to stop: the run failed.
    pub fn abort(&self) {
        self.state.store(ABORTED, Ordering::Release);
    }

    fn finish(&self) {
        self.state.store(FINISHED, Ordering::Release);
    }

    /// Makes queues that a finished run left empty behave as
    /// [`Queues::new`] for the next run, without rewriting their slots,
    /// the release graph or the task records (over 800 KiB): each is
    /// written for a task before anything reads it (a queue's slot when
    /// pushed, the graph's words of a task by
    /// [`ReleaseGraph::open`](crate::orch::ReleaseGraph::open) and the
    /// dispatcher's key, a record when its task is submitted). `false`,
    /// changing nothing, if something is left (an aborted run): then
    /// [`Queues::reset`].
    pub fn recycle(&mut self) -> bool {
        let empty = self
            .ready
            .iter()
            .chain(self.local.iter())
            .flatten()
            .all(|d| d.is_empty())
            && self.shared.iter().all(|d| d.is_empty())
            && self.done.iter().all(|r| r.is_empty());
        if !empty {
            return false;
        }
        self.reset();
        true
    }

    /// Makes the queues behave as [`Queues::new`] for the next run,
    /// whatever a run left in them (an aborted run's queued tasks and
    /// unread reports are dropped), in place: as [`Queues::recycle`], so
    /// that nothing of their size is built on the caller's stack (an
    /// AICPU thread's is small). No thread may be using them (`&mut`).
    pub fn reset(&mut self) {
        // Every field, so that a new one cannot be forgotten here.
        let Queues {
            ready,
            local,
            graph: _,
            shared,
            done,
            state,
            stealing,
            steals,
            keeps,
            starved,
            records: _,
        } = self;
        let deques = ready.iter_mut().chain(local.iter_mut()).flatten();
        for d in deques.chain(shared.iter_mut()) {
            d.clear();
        }
        for r in done.iter_mut() {
            r.clear();
        }
        state.store(RUNNING, Ordering::Relaxed);
        stealing.store(false, Ordering::Relaxed);
        for flag in steals.iter().chain(keeps.iter()) {
            flag.store(false, Ordering::Relaxed);
        }
        starved.store(0, Ordering::Relaxed);
    }
}

impl Default for Queues {
    fn default() -> Self {
        Queues::new()
    }
}

/// How a run schedules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedConfig {
    /// Scheduler threads, 1 ..= [`MAX_THREADS`]; each needs at least one core.
    pub threads: usize,
    /// Taskset 0's dispatch policy.
    pub policy: PolicyKind,
    /// How key-based policies compute a task's key. A policy that places
    /// tasks without a key (round-robin, shared) takes only the task index
    /// (the default): another key would be ignored, and a run refuses it
    /// ([`ConfigError::KeyIgnored`]).
    pub key: DispatchKey,
    /// Tasks a dispatch queue may hold, 1 ..= [`DISPATCH_QUEUE`].
    pub queue_depth: usize,
}

/// The one default schedule of every runner (the shim, `wsp run`, the QEMU
/// firmware without a launch block, a launch block that leaves a field to
/// the runner): [`DEFAULT_THREADS`] threads, [`DEFAULT_POLICY`], the task
/// index as key (every task has one, so the default key fits any table),
/// the deepest dispatch queues.
impl Default for SchedConfig {
    fn default() -> Self {
        SchedConfig {
            threads: DEFAULT_THREADS,
            policy: DEFAULT_POLICY,
            key: DispatchKey::TaskIndex,
            queue_depth: DISPATCH_QUEUE,
        }
    }
}

/// Idle rounds in a row that a scheduler thread spins through
/// ([`Clock::relax`](crate::platform::Clock::relax)) before it pauses
/// ([`Clock::pause`](crate::platform::Clock::pause): a host thread yields)
/// on every further idle round: a task that arrives within a few
/// microseconds is taken at once, and a thread that waits longer does not
/// take a processor from the threads that have work when the host has
/// fewer processors than threads.
pub const SPIN_ROUNDS: u32 = 64;

/// Scheduler threads of the default schedule: two, so that a run overlaps
/// dispatch with issue and completions reach a second thread's cores
/// without the leader, on any machine with two AICPU threads.
pub const DEFAULT_THREADS: usize = 2;

/// The dispatch policy of the default schedule: work stealing where the
/// build has it (placement by key, then idle threads take single tasks, so
/// skewed loads balance), else round-robin, the one policy every build has.
#[cfg(feature = "policy-work-stealing")]
pub const DEFAULT_POLICY: PolicyKind = PolicyKind::WorkStealing;
/// The dispatch policy of the default schedule: round-robin, as this build
/// leaves work stealing out.
#[cfg(not(feature = "policy-work-stealing"))]
pub const DEFAULT_POLICY: PolicyKind = PolicyKind::RoundRobin;

/// The scheduler thread that owns `core` when a run has `threads` threads:
/// `core % threads`, in every runner. Runners number their cores cube cores
/// first, then vector cores, so every thread owns cores of both kinds when
/// there are at least as many of each as threads.
pub const fn core_owner(core: usize, threads: usize) -> usize {
    core % threads
}

/// A scheduling setting the runtime cannot honour.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Scheduler threads out of 1 ..= `max`.
    Threads { threads: usize, max: usize },
    /// Every scheduler thread needs a core to issue to.
    ThreadWithoutCores { thread: usize },
    /// A scheduler thread's platform has more cores than the thread can
    /// drive: `max` is [`MAX_CORES`](crate::platform::MAX_CORES), or fewer if the run numbered fewer of
    /// its cores.
    ThreadCores {
        thread: usize,
        cores: usize,
        max: usize,
    },
    /// A dispatch queue depth out of 1 ..= `max`.
    QueueDepth { depth: usize, max: usize },
    /// The queues hold tasks or are claimed by another run.
    QueuesInUse,
    /// An issue depth (tasks handed to one core at once) the platform does
    /// not support.
    IssueDepth { depth: usize, max: usize },
    /// The build does not have the policy (or no policy has the name).
    Policy(PolicyError),
    /// A task window out of 1 ..= `max` (the runtime's task window).
    Window { tasks: usize, max: usize },
    /// A run's task limit ([`RunOptions::max_tasks`](crate::sched::RunOptions::max_tasks))
    /// out of 1 ..= `max`.
    MaxTasks { tasks: u64, max: u64 },
    /// A kernel timeout ([`RunOptions::kernel_timeout_ms`](crate::sched::RunOptions::kernel_timeout_ms))
    /// of 0 ms: every task would overrun it at once.
    KernelTimeout { ms: u64 },
    /// An acknowledgement timeout ([`RunOptions::ack_timeout_ms`](crate::sched::RunOptions::ack_timeout_ms))
    /// of 0 ms: every core would be taken for one that does not answer.
    AckTimeout { ms: u64 },
    /// The build does not have the policy a program's taskset asks for.
    TasksetPolicy { taskset: u8, error: PolicyError },
    /// A dispatch key other than the task index given with a policy that
    /// places tasks without one ([`PolicyKind::uses_key`]): it would be
    /// ignored.
    KeyIgnored {
        policy: PolicyKind,
        key: DispatchKey,
    },
    /// A policy chose a thread that does not exist.
    BadPlacement {
        policy: &'static str,
        thread: usize,
        threads: usize,
    },
}

impl core::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            ConfigError::Threads { threads, max } => {
                write!(f, "{threads} scheduler threads; 1 to {max} are supported")
            }
            ConfigError::ThreadWithoutCores { thread } => {
                write!(f, "scheduler thread {thread} owns no core; use fewer threads or more cores")
            }
            ConfigError::ThreadCores { thread, cores, max } => write!(
                f,
                "scheduler thread {thread} has {cores} cores; a thread drives at most {max}: use more threads or fewer cores"
            ),
            ConfigError::QueueDepth { depth, max } => {
                write!(f, "dispatch queue depth {depth}; 1 to {max} are supported")
            }
            ConfigError::IssueDepth { depth, max } => {
                write!(f, "issue depth {depth}; this platform supports 1 to {max} tasks per core")
            }
            ConfigError::QueuesInUse => {
                f.write_str("the dispatch queues are in use by another run (or were not reset after an aborted one)")
            }
            ConfigError::Policy(e) => write!(f, "{e}"),
            ConfigError::Window { tasks, max } => {
                write!(f, "task window {tasks}; 1 to {max} tasks are supported")
            }
            ConfigError::MaxTasks { tasks, max } => {
                write!(f, "a limit of {tasks} tasks a run; 1 to {max} are supported")
            }
            ConfigError::KernelTimeout { ms } => write!(
                f,
                "a kernel timeout (kernel_timeout_ms) of {ms} ms; at least 1 ms is needed (at 0 every task would time out as it starts, blaming a healthy core)"
            ),
            ConfigError::AckTimeout { ms } => write!(
                f,
                "an acknowledgement timeout (ack_timeout_ms) of {ms} ms; at least 1 ms is needed (at 0 every core would be reported as not acknowledging its first task)"
            ),
            ConfigError::TasksetPolicy { taskset, error } => {
                write!(f, "the program's taskset {taskset}: {error}")
            }
            ConfigError::KeyIgnored { policy, key } => write!(
                f,
                "dispatch key {key} with the {} policy, which places tasks without a key: it would be ignored (use a key-based policy, or the task index key)",
                policy.name()
            ),
            ConfigError::BadPlacement { policy, thread, threads } => write!(
                f,
                "policy {policy} placed a task on thread {thread} of {threads}"
            ),
        }
    }
}

/// Runs the dispatcher and every scheduler in turn on the calling thread
/// until the table has run, or the first error (after draining every core).
/// With several schedulers this is the deterministic mode: the order of
/// events depends only on the platforms' clocks.
pub fn drive_stepped<P: crate::platform::Platform>(
    dispatcher: &mut Dispatcher<'_>,
    schedulers: &mut [Scheduler<'_, P>],
) -> Result<(), RunError> {
    let result = (|| {
        for s in schedulers.iter() {
            s.check_kernels()?;
        }
        while !dispatcher.finished() {
            let now = schedulers[0].now();
            let mut progress = dispatcher.step(now)?;
            schedulers[0].observe_dispatcher(dispatcher, now);
            for s in schedulers.iter_mut() {
                progress |= s.step()?;
            }
            if !progress {
                dispatcher.check_progress()?;
                for s in schedulers.iter() {
                    s.check_timeouts()?;
                }
                match dispatcher.wake_at() {
                    Some(deadline) => schedulers[0].relax_until(deadline),
                    None => schedulers[0].relax(),
                }
            }
        }
        Ok(())
    })();
    if result.is_err() {
        dispatcher.queues().abort();
        schedulers.iter_mut().for_each(Scheduler::drain);
    } else {
        dispatcher.queues().finish();
    }
    result
}

/// Thread 0 of a threaded run: the dispatcher and scheduler 0, until the
/// table has run or a thread fails. Threads 1.. run [`Scheduler::serve`]
/// on the same [`Queues`].
pub fn drive_leader<P: crate::platform::Platform>(
    dispatcher: &mut Dispatcher<'_>,
    scheduler: &mut Scheduler<'_, P>,
) -> Result<(), RunError> {
    let queues = dispatcher.queues();
    let result = (|| {
        scheduler.check_kernels()?;
        while !dispatcher.finished() {
            if queues.state() == ABORTED {
                return Err(RunError::ThreadFailed);
            }
            let now = scheduler.now();
            let dispatched = dispatcher.step(now)?;
            scheduler.observe_dispatcher(dispatcher, now);
            let progress = scheduler.step_at(now, !dispatched)? | dispatched;
            if !progress {
                dispatcher.check_progress()?;
                scheduler.check_timeouts_at(now)?;
                match dispatcher.wake_at() {
                    Some(deadline) => scheduler.relax_until(deadline),
                    None => scheduler.relax(),
                }
            }
        }
        Ok(())
    })();
    match result {
        Ok(()) => queues.finish(),
        Err(_) => {
            queues.abort();
            scheduler.drain();
        }
    }
    result
}
