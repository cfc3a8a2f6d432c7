//! What a run is given and gives back, in every form (the one-thread
//! [`exec::run`](crate::exec::run), the host shim's threads, the QEMU
//! firmware): its options, the orchestrator it uses, its statistics and
//! its errors.

use core::fmt;

use wsp_ffi::CoreKind;

use super::{ConfigError, Dispatcher, Scheduler, MAX_THREADS};
use crate::abi::launch::Symbols;
use crate::abi::program::MAX_TASKSETS;
use crate::abi::schedule::DispatchKey;
use crate::abi::{MAX_TENSOR_ARGS, TASK_WINDOW};
use crate::expand::ExpandError;
use crate::orch::scratch::ScratchError;
use crate::orch::{DeadlockReport, Invalid, Orchestrator, StallStats, SubmitError, UsageError};
use crate::platform::{Platform, MAX_CORES};

/// Most cores in one run: [`MAX_THREADS`] scheduler threads of at most
/// [`MAX_CORES`] each (an Ascend 910B has 24 cube and 48 vector cores).
pub const MAX_RUN_CORES: usize = MAX_THREADS * MAX_CORES;

/// TensorMap entries of table runs: two per task of the window, 48 bytes
/// each. Only arguments on tensors some task writes take an entry (one on
/// a read-only tensor, a weight or an input, takes none), so a typical
/// task (activation in, weight in, output out) takes two. A task has at
/// most [`MAX_TENSOR_ARGS`] (four) tracked arguments: a window of tasks
/// with three stalls on `TENSORMAP_POOL_FULL` at two thirds of the window
/// (with four, at half) until older tasks retire, a sizing trade that
/// costs throughput only for such workloads. Two, not three, saves 48
/// bytes per task of the window.
pub const TENSORMAP_ENTRIES: usize = 2 * TASK_WINDOW;
const _: () = assert!(TENSORMAP_ENTRIES >= MAX_TENSOR_ARGS);
/// DepList nodes of table runs: none, as their edges live in the release
/// graph ([`GRAPH_EDGES`](super::GRAPH_EDGES)), which scheduler threads release.
pub const DEPLIST_NODES: usize = 0;

/// The orchestrator a table run uses (about 680 KiB at the default window:
/// on the device, place it in a `static`, on the host on the heap). Its own heap ring (per-task output
/// buffers) is empty: a table's scratch tensors live on the dispatcher's
/// heap ring ([`crate::orch::scratch`]), which their scopes outlive a task.
pub type TableOrchestrator = Orchestrator<TASK_WINDOW, TENSORMAP_ENTRIES, DEPLIST_NODES>;

impl TableOrchestrator {
    /// An orchestrator for [`exec::run`](crate::exec::run).
    pub const fn for_tables() -> Self {
        Orchestrator::new(0)
    }
}

/// Settings of one run.
#[derive(Clone, Copy, Debug)]
pub struct RunOptions {
    /// How long one task may take, from its start (its issue to an idle
    /// core, or the end of the task before it on its core) to its finish,
    /// before the run ends with [`RunError::KernelTimeout`]. Default 10 000
    /// ms (10 s); at least 1 ([`ConfigError::KernelTimeout`]).
    pub kernel_timeout_ms: u64,
    /// How long a core may leave a task unacknowledged (not taken) from its
    /// start before the run ends with [`RunError::CoreNoAck`]: a core that
    /// does not answer, told apart from a kernel that does not finish.
    /// Default 1 000 ms (1 s); a core acknowledges within microseconds, so
    /// it is well below the kernel timeout, and only platforms that report
    /// acknowledgements ([`Platform::acknowledged`]) apply it. At least 1
    /// ([`ConfigError::AckTimeout`]), whether the platform applies it or not.
    pub ack_timeout_ms: u64,
    /// Tasks a scheduler thread hands one core at most: 1 (issue to idle
    /// cores only) or 2 (also queue the next task behind a running one, in
    /// the issue protocol's second payload buffer, so that the core starts
    /// it without a round trip). `None` (the default): as many as the
    /// platform takes ([`Platform::depth`]). More than it takes is a
    /// [`ConfigError::IssueDepth`].
    pub issue_depth: Option<usize>,
    /// The values of the program's symbols (batch size, sequence lengths),
    /// bound at launch: the same table runs with other values.
    pub symbols: Symbols,
    /// The task window: at most this many tasks submitted and not retired,
    /// 1 ..= [`TASK_WINDOW`]. `None` (the default): the program's `WINDOW`
    /// if it has one, else [`TASK_WINDOW`].
    pub window: Option<usize>,
    /// Tasks the run may submit at most, 1 ..= [`MAX_RUN_TASKS`]; one more
    /// ends the run with [`RunError::TooManyTasks`] (after draining what
    /// runs). `None` (the default): [`MAX_RUN_TASKS`]. A runner whose host
    /// cannot tell a program's length before the run (symbols bound at
    /// launch or data a run writes decide its loops) bounds how long the
    /// run can take with it, rather than running billions of tasks.
    pub max_tasks: Option<u64>,
}

impl RunOptions {
    /// Checks the settings that need neither the table nor the platform:
    /// both timeouts at least 1 ms ([`ConfigError::KernelTimeout`],
    /// [`ConfigError::AckTimeout`]) and the task limit 1 ..=
    /// [`MAX_RUN_TASKS`] ([`ConfigError::MaxTasks`]). Every run checks
    /// them ([`Dispatcher::new`]); a front end may
    /// check them first to name its own flags.
    pub fn check(&self) -> Result<(), ConfigError> {
        if self.kernel_timeout_ms == 0 {
            return Err(ConfigError::KernelTimeout {
                ms: self.kernel_timeout_ms,
            });
        }
        if self.ack_timeout_ms == 0 {
            return Err(ConfigError::AckTimeout {
                ms: self.ack_timeout_ms,
            });
        }
        let tasks = self.max_tasks.unwrap_or(MAX_RUN_TASKS);
        if tasks == 0 || tasks > MAX_RUN_TASKS {
            return Err(ConfigError::MaxTasks {
                tasks,
                max: MAX_RUN_TASKS,
            });
        }
        Ok(())
    }
}

/// Tasks one run submits at most: the cores' side numbers tasks in 32 bits
/// (queue entries, launch records, reports).
pub const MAX_RUN_TASKS: u64 = 1 << 32;

/// Most tasks one core holds at once (the issue protocol's payload buffers).
pub const MAX_ISSUE_DEPTH: usize = crate::mailbox::DEPTH;

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            kernel_timeout_ms: 10_000,
            ack_timeout_ms: 1_000,
            issue_depth: None,
            symbols: Symbols::default(),
            window: None,
            max_tasks: None,
        }
    }
}

/// Per-core figures of a run. Ticks are the platform clock's (wall time in
/// the shim, cycles in semantic time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CoreStats {
    /// The core's number in the run.
    pub core: u16,
    /// Its kind (cube or vector).
    pub kind: CoreKind,
    /// The scheduler thread that owns it.
    pub thread: u8,
    /// Tasks it ran.
    pub tasks: u64,
    /// Semantic cycles the core's kernels reported.
    pub cycles: u64,
    /// Ticks from issue to observed completion, summed over its tasks.
    pub busy_ticks: u64,
}

impl CoreStats {
    /// A core that ran nothing (`const`, for [`RunStats::empty`]).
    pub const IDLE: CoreStats = CoreStats {
        core: 0,
        kind: CoreKind::Vector,
        thread: 0,
        tasks: 0,
        cycles: 0,
        busy_ticks: 0,
    };
}

impl Default for CoreStats {
    fn default() -> Self {
        Self::IDLE
    }
}

/// Per-scheduler-thread figures of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadStats {
    /// The thread's number in the run.
    pub thread: u8,
    /// Tasks it issued to its cores.
    pub issued: u64,
    /// Tasks the dispatcher placed in its queues.
    pub placed: u64,
    /// Tasks it released (their last producer finished on its cores) and
    /// kept in its own queue, without the dispatcher.
    pub released: u64,
    /// Of the issued tasks, those taken from the shared queue.
    pub from_shared: u64,
    /// Of the issued tasks, those queued behind a running task on a busy
    /// core (issue depth 2).
    pub queued: u64,
    /// Steals tried on a non-empty victim queue, and those that got a task.
    pub steal_attempts: u64,
    /// Steals that got a task.
    pub steals: u64,
    /// Most tasks its dispatch queues held at once.
    pub queue_high_water: u64,
    /// Busy ticks and reported cycles of its cores, summed.
    pub busy_ticks: u64,
    /// Semantic cycles its cores' kernels reported, summed.
    pub cycles: u64,
}

/// What a successful run did.
#[derive(Clone, Copy, Debug)]
pub struct RunStats {
    /// Tasks the run issued.
    pub tasks: u64,
    /// Platform clock ticks from the start of dispatch to the end.
    pub wall_ticks: u64,
    /// The platform clock's rate.
    pub ticks_per_second: u64,
    /// Backpressure: stalls and high-water marks per resource.
    pub stalls: StallStats,
    /// The dispatch policy's decision (its name, or what an adaptive one chose).
    pub policy: &'static str,
    /// The task window the run used.
    pub window: u64,
    /// Per taskset of the program (taskset 0: the run's policy), its
    /// policy's decision, key and tasks placed; `None` for tasksets the
    /// program does not define.
    pub tasksets: [Option<TasksetStats>; MAX_TASKSETS],
    /// Bytes the run's scratch scopes would take as arena tensors of their
    /// own (each rounded up to 64 bytes; a tensor once per scope: its first
    /// write, or the first after a `FREE`); 0 without scratch tensors.
    /// Their storage came from the heap ring instead: its capacity and
    /// high-water mark are `stalls.of(StallReason::HeapRingFull)`, and the
    /// arena bytes saved are this minus the capacity.
    pub scratch_bytes: u64,
    pub(crate) num_cores: usize,
    pub(crate) cores: [CoreStats; MAX_RUN_CORES],
    pub(crate) num_threads: usize,
    pub(crate) threads: [ThreadStats; MAX_THREADS],
}

/// What one taskset's policy did in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TasksetStats {
    /// The policy's decision: its name, or what an adaptive one chose.
    pub decision: &'static str,
    /// Its dispatch key; `None` if its policy places without one.
    pub key: Option<DispatchKey>,
    /// Tasks it placed.
    pub placed: u64,
}

impl RunStats {
    /// Statistics of a run that has not started.
    pub const fn empty(ticks_per_second: u64) -> Self {
        RunStats {
            tasks: 0,
            wall_ticks: 0,
            ticks_per_second,
            stalls: StallStats::new([0; crate::orch::stall::STALL_REASONS]),
            policy: "",
            window: 0,
            tasksets: [None; MAX_TASKSETS],
            scratch_bytes: 0,
            num_cores: 0,
            cores: [CoreStats::IDLE; MAX_RUN_CORES],
            num_threads: 0,
            threads: [ThreadStats {
                thread: 0,
                issued: 0,
                placed: 0,
                released: 0,
                from_shared: 0,
                steal_attempts: 0,
                queued: 0,
                steals: 0,
                queue_high_water: 0,
                busy_ticks: 0,
                cycles: 0,
            }; MAX_THREADS],
        }
    }

    /// Per core, in the run's core order.
    pub fn cores(&self) -> &[CoreStats] {
        &self.cores[..self.num_cores]
    }
    /// Per scheduler thread, in thread order.
    pub fn threads(&self) -> &[ThreadStats] {
        &self.threads[..self.num_threads]
    }
    /// The run's wall time in microseconds of the platform clock.
    pub fn wall_micros(&self) -> u64 {
        (self.wall_ticks as u128 * 1_000_000 / self.ticks_per_second.max(1) as u128) as u64
    }
    /// Semantic cycles of every core, summed.
    pub fn total_cycles(&self) -> u64 {
        self.cores().iter().map(|c| c.cycles).sum()
    }

    /// The statistics of a finished run.
    pub fn collect<P: Platform>(
        dispatcher: &Dispatcher<'_>,
        schedulers: &[Scheduler<'_, P>],
        ticks_per_second: u64,
        wall_ticks: u64,
    ) -> RunStats {
        let mut stats = RunStats::empty(ticks_per_second);
        stats.wall_ticks = wall_ticks;
        dispatcher.fill_stats(&mut stats);
        for s in schedulers {
            stats.add_thread(s);
        }
        stats
    }

    /// Adds the figures of one scheduler thread and its cores (in any order).
    pub fn add_thread<P: Platform>(&mut self, scheduler: &Scheduler<'_, P>) {
        let t = scheduler.stats();
        let slot = &mut self.threads[t.thread as usize];
        let (placed, high_water) = (slot.placed, slot.queue_high_water);
        *slot = ThreadStats {
            placed,
            queue_high_water: high_water,
            ..*t
        };
        self.num_threads = self.num_threads.max(t.thread as usize + 1);
        for c in scheduler.core_stats() {
            // Run-wide core numbers are below MAX_RUN_CORES: each thread
            // drives at most MAX_CORES (its platform refuses more).
            if let Some(slot) = self.cores.get_mut(c.core as usize) {
                *slot = *c;
                self.num_cores = self.num_cores.max(c.core as usize + 1);
            }
        }
        self.tasks += t.issued;
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
        if self.scratch_bytes > 0 {
            let heap = self.stalls.of(crate::orch::StallReason::HeapRingFull);
            write!(
                f,
                " heap_high_water={} heap_bytes={} arena_saved={}",
                heap.high_water,
                heap.capacity,
                self.scratch_bytes as i64 - heap.capacity as i64
            )?;
        }
        Ok(())
    }
}

/// Why a run ended early. Where a task is named, `task` is its number in the
/// run: its index in the tasks section, then the program's tasks in
/// expansion order.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunError {
    /// The arena handed to the run does not start at a multiple of
    /// `align` ([`ARENA_ALIGN`](crate::abi::ARENA_ALIGN)), so kernels would
    /// get misaligned elements.
    ArenaMisaligned { align: u64 },
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
    /// The kernel (or its core) failed with error `code`
    /// ([`Completion::Failed`](crate::platform::Completion::Failed)).
    KernelFailed {
        task: u32,
        kernel_id: u32,
        core: u32,
        code: u32,
    },
    /// The core did not acknowledge (take) the task within
    /// [`RunOptions::ack_timeout_ms`]: it does not answer.
    CoreNoAck {
        task: u32,
        kernel_id: u32,
        core: u32,
        waited_ms: u64,
    },
    /// Kernel `kernel_id`, which the table declares, is not built into
    /// `core` ([`Platform::has_kernel`]); found before anything runs. The
    /// first task calling it is named: `task` of the tasks section, or the
    /// program's call at instruction `pc` (neither: no task calls it).
    KernelNotBuiltIn {
        kernel_id: u32,
        core: u32,
        task: Option<u32>,
        pc: Option<u32>,
    },
    /// The core acknowledged the task but its kernel did not finish within
    /// [`RunOptions::kernel_timeout_ms`]; the core may still own its regions.
    KernelTimeout {
        task: u32,
        kernel_id: u32,
        core: u32,
        waited_ms: u64,
    },
    /// The platform refused a launch on a core the executor saw idle.
    LaunchRefused { task: u32, core: u32 },
    /// The orchestrator refused a task that table validation (or, for a
    /// program task, expansion) accepted.
    Refused { task: u32, why: Invalid },
    /// Taskset `taskset`'s policy places by a dispatch key that names a
    /// scalar, tensor argument, dimension or loop that one of its tasks
    /// does not have: task `task` of the tasks section or the task of the
    /// program's call at instruction `pc` has only `has` of `what`. Found
    /// before anything runs for every task and call whose taskset is known
    /// from the table, else when the task is submitted.
    KeyNotInTask {
        key: DispatchKey,
        taskset: u8,
        task: Option<u32>,
        pc: Option<u32>,
        has: u32,
        what: &'static str,
    },
    /// The orchestrator refused a scheduler thread's report about task
    /// `task`: that it was issued (`finished: false`) or that it finished,
    /// e.g. a task reported finished twice or never handed out.
    ReportRefused {
        task: u64,
        finished: bool,
        why: UsageError,
    },
    /// The orchestrator refused a stream op that table validation accepted.
    StreamOpRefused { op: u32, why: UsageError },
    /// The orchestrator handed to `run` still holds tasks of an earlier run.
    OrchestratorBusy { in_flight: u64 },
    /// No progress is possible; the report says why.
    Deadlock(DeadlockReport),
    /// Every process of the program is parked on a channel and no task is
    /// in flight: the report names the processes, the channels' states
    /// and what to change.
    ChannelDeadlock(crate::channel::ChannelReport),
    /// A scheduling setting the runtime cannot honour.
    Config(ConfigError),
    /// Another scheduler thread failed; its own error says why.
    ThreadFailed,
    /// A scheduler thread's completion ring had no room for a report (a
    /// finished or released task): the run ends rather than lose it. A
    /// task has at most one report pending, and each thread's ring has room
    /// for one of every task of the window, so this is a bug.
    CompletionRingFull { thread: u32 },
    /// The program reads symbols the launch did not bind.
    UnboundSymbols { needed: usize, bound: usize },
    /// The program's expansion failed at instruction `pc`.
    Expand { pc: u32, why: ExpandError },
    /// The orchestrator refused the program's event op at `pc` (e.g. a
    /// wait on an event not recorded before it ran).
    ProgramEventRefused { pc: u32, why: UsageError },
    /// The run would submit more tasks than its
    /// [`RunOptions::max_tasks`] (at most [`MAX_RUN_TASKS`]: a run numbers
    /// its tasks in 32 bits).
    TooManyTasks { max: u64 },
    /// A scratch tensor could not get heap ring storage: the report names
    /// the tensor and the sizes.
    Scratch(ScratchError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RunError::ArenaMisaligned { align } => {
                write!(f, "the data arena does not start at a multiple of {align} bytes")
            }
            RunError::ArenaTooSmall { needed, available } => {
                write!(f, "data arena of {available} bytes, the table needs {needed}")
            }
            RunError::NoCoreForKind { task, kernel_id, kind } => {
                let kernel = KernelName(kernel_id);
                write!(f, "task {task} calls kernel {kernel}, which needs a {kind:?} core; the platform has none")
            }
            RunError::KernelRejected { task, kernel_id, core } => {
                let kernel = KernelName(kernel_id);
                write!(f, "kernel {kernel} rejected the arguments of task {task} on core {core}")
            }
            RunError::KernelFailed { task, kernel_id, core, code } => {
                let kernel = KernelName(kernel_id);
                write!(f, "task {task} (kernel {kernel}) failed on core {core} with error code {code}")
            }
            RunError::CoreNoAck { task, kernel_id, core, waited_ms } => {
                let kernel = KernelName(kernel_id);
                write!(
                    f,
                    "core {core} did not acknowledge task {task} (kernel {kernel}) within {waited_ms} ms: the core does not answer"
                )
            }
            RunError::KernelNotBuiltIn { kernel_id, core, task, pc } => {
                let kernel = KernelName(kernel_id);
                write!(f, "kernel {kernel} is not built into core {core}; ")?;
                match (task, pc) {
                    (Some(task), _) => write!(f, "task {task} calls it"),
                    (None, Some(pc)) => write!(f, "the call at program instruction {pc} calls it"),
                    (None, None) => write!(f, "the table declares it"),
                }
            }
            RunError::KernelTimeout { task, kernel_id, core, waited_ms } => {
                let kernel = KernelName(kernel_id);
                write!(
                    f,
                    "task {task} (kernel {kernel}) on core {core} was acknowledged but did not finish within {waited_ms} ms"
                )
            }
            RunError::LaunchRefused { task, core } => write!(f, "core {core} refused task {task} while idle"),
            RunError::Refused { task, why } => {
                write!(f, "task {task} passed validation but the orchestrator refused it: {}", SubmitError::Invalid(why))
            }
            RunError::KeyNotInTask { key, taskset, task, pc, has, what } => {
                write!(f, "dispatch key {key} (taskset {taskset}) does not fit ")?;
                match (task, pc) {
                    (Some(task), _) => write!(f, "task {task}")?,
                    (None, pc) => write!(f, "the call at program instruction {}", pc.unwrap_or(0))?,
                }
                write!(
                    f,
                    ", which has {has} {what}; choose a key every task of the taskset has, \
                     or give the calls that have it their own taskset (a program's DISPATCH)"
                )
            }
            RunError::ReportRefused { task, finished, why } => {
                let report = if finished { "finished" } else { "was released" };
                write!(f, "the orchestrator refused the report that task {task} {report}: {why}")
            }
            RunError::StreamOpRefused { op, why } => {
                write!(f, "stream op {op} passed validation but the orchestrator refused it: {why}")
            }
            RunError::OrchestratorBusy { in_flight } => {
                write!(f, "the orchestrator still holds {in_flight} tasks of an earlier run")
            }
            RunError::Deadlock(report) => write!(f, "{report}"),
            RunError::ChannelDeadlock(report) => write!(f, "{report}"),
            RunError::Config(e) => write!(f, "scheduling: {e}"),
            RunError::ThreadFailed => f.write_str("another scheduler thread failed"),
            RunError::CompletionRingFull { thread } => write!(
                f,
                "scheduler thread {thread}'s completion ring was full; a report would have been lost (a runtime bug)"
            ),
            RunError::UnboundSymbols { needed, bound } => write!(
                f,
                "the program reads {needed} symbols; the launch binds {bound}"
            ),
            RunError::Expand { pc, why } => write!(f, "program instruction {pc}: {why}"),
            RunError::ProgramEventRefused { pc, why } => {
                write!(f, "program instruction {pc}: {why}")
            }
            RunError::TooManyTasks { max } if max == MAX_RUN_TASKS => write!(
                f,
                "the program expands to more than {max} tasks (2^32), the most one run numbers"
            ),
            RunError::TooManyTasks { max } => write!(
                f,
                "the program expands to more than {max} tasks, the most this run was allowed (RunOptions::max_tasks)"
            ),
            RunError::Scratch(e) => write!(f, "{e}"),
        }
    }
}

/// A kernel as errors name it: its id and its name in the registry.
struct KernelName(u32);

impl fmt::Display for KernelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match wsp_ffi::lookup(self.0) {
            Some(info) => write!(f, "{} ({})", self.0, info.name),
            None => write!(f, "{} (not in the registry)", self.0),
        }
    }
}
