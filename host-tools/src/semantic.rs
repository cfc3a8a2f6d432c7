//! Deterministic semantic time: the shim's single-threaded mode.
//!
//! The same executor and dispatch code run over a platform whose clock is
//! virtual: a kernel runs (on this thread) when it is issued, and its core
//! stays busy for the cycles the kernel reports under the cost model. Polls
//! see a completion only once the virtual clock has reached it, and when the
//! scheduler has nothing to do the clock jumps to the earliest completion,
//! so completions arrive in time order. Scheduling overhead costs zero
//! cycles. The same table and core counts give the same makespan on any
//! machine, however loaded. A kernel whose cycles run past the kernel
//! timeout (`RunOptions::kernel_timeout_ms`, at [`CYCLES_PER_SECOND`])
//! ends the run with `RunError::KernelTimeout`, as on the device: the
//! clock stops at the cycle the timeout expires. (A semantic core takes a
//! task the moment it is issued: the acknowledgement timeout never
//! expires, except for a task a fault withholds.)

use std::cell::{Cell, RefCell};

use device_runtime::abi::Table;
use device_runtime::fault::{Fault, FaultPlatform};
use device_runtime::platform::{Clock, Completion, Platform};
use device_runtime::sched::{
    drive_stepped, Arena, ConfigError, DispatchPolicy, Dispatcher, Queues, SchedConfig, Scheduler,
    TableOrchestrator,
};
use device_runtime::sched::{OnSubmit, RunOptions, RunStats};
use wsp_ffi::{CoreKind, WspKernelArgs};

use crate::record::{Observed, Sink};
use crate::shim::{check_threads, thread_cores, ShimError};

/// Cycles per semantic second (the clock the timeouts are measured in).
pub const CYCLES_PER_SECOND: u64 = 1_000_000_000;

/// A task on a core in semantic time: the completion it will report and
/// when, and when its kernel timeout started counting (as the scheduler
/// counts it: its issue to an idle core, or the poll of the task before
/// it on the core).
#[derive(Clone, Copy)]
struct Busy {
    until: u64,
    completion: Completion,
    since: u64,
}

/// Tasks one semantic core holds: the one it runs and one queued behind it
/// (as the mailbox's double buffer); the queued one starts when the running
/// one ends.
const DEPTH: usize = 2;

/// One kernel launch in semantic time, in issue order.
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    /// The run-wide core number.
    pub core: usize,
    /// The kernel launched.
    pub kernel_id: u32,
    /// When it was issued, in cycles.
    pub issued: u64,
    /// When it started, in cycles: at once on an idle core, or when the
    /// task before it on the core ends.
    pub start: u64,
    /// When it ended, in cycles: `start` plus the kernel's cycles (a
    /// rejected launch takes none).
    pub end: u64,
    /// Its arguments: the tensor views tell which task it was (see
    /// `device_runtime::sched::kernel_args`).
    pub args: WspKernelArgs,
}

/// The virtual machine every scheduler thread's platform shares: one
/// clock, every core's tasks in launch order.
struct Machine {
    busy: RefCell<Vec<Vec<Busy>>>,
    launches: RefCell<Vec<Launch>>,
    now: Cell<u64>,
    makespan: Cell<u64>,
    /// How far the clock moves when the scheduler waits with no task on
    /// any core: 0 (a healthy run never waits so), or a millisecond in a
    /// run with an injected fault, whose withheld task would otherwise
    /// never let the clock reach its timeout.
    idle_step: u64,
    /// The kernel timeout ([`RunOptions::kernel_timeout_ms`]) in cycles.
    timeout: u64,
}

impl Machine {
    /// When the next thing can happen, after now: the earliest completion
    /// on any core, or, if sooner, the first cycle at which a running task
    /// has overrun the kernel timeout (the scheduler's check then ends the
    /// run, as a kernel that runs too long on the device does). A
    /// completion already due is none: its scheduler polls it at now (one
    /// that drains after an error must not wait for another thread's).
    fn next_event(&self) -> Option<u64> {
        let now = self.now.get();
        let busy = self.busy.borrow();
        busy.iter()
            .filter_map(|q| q.first())
            .filter(|b| b.until > now)
            .map(|b| {
                let overrun = b.since.saturating_add(self.timeout).saturating_add(1);
                if overrun > now {
                    overrun.min(b.until)
                } else {
                    b.until
                }
            })
            .min()
    }
}

/// The cores of one scheduler thread, by run-wide number.
struct SemanticCores<'m> {
    machine: &'m Machine,
    cores: Vec<usize>,
    kinds: Vec<CoreKind>,
}

impl Clock for SemanticCores<'_> {
    fn now(&self) -> u64 {
        self.machine.now.get()
    }
    fn ticks_per_second(&self) -> u64 {
        CYCLES_PER_SECOND
    }
    /// Nothing else can happen before the machine's next event (a
    /// completion, or a kernel timeout's expiry): jump there.
    fn relax(&self) {
        let now = &self.machine.now;
        match self.machine.next_event() {
            Some(next) => now.set(now.get().max(next)),
            None => now.set(now.get() + self.machine.idle_step),
        }
    }
    /// Nothing happens before the earlier of `deadline` and the machine's
    /// next event: jump there.
    fn relax_until(&self, deadline: u64) {
        let to = self
            .machine
            .next_event()
            .map_or(deadline, |n| n.min(deadline));
        let now = &self.machine.now;
        now.set(now.get().max(to));
    }
}

impl Platform for SemanticCores<'_> {
    fn num_cores(&self) -> usize {
        self.cores.len()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.kinds[core]
    }
    fn depth(&self) -> usize {
        DEPTH
    }
    fn can_queue(&self, core: usize) -> bool {
        let held = self.machine.busy.borrow()[self.cores[core]].len();
        held > 0 && held < DEPTH
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        let core = self.cores[core];
        let start = match self.machine.busy.borrow()[core].as_slice() {
            [] => self.machine.now.get(),
            [running] => running.until,
            _ => return false,
        };
        let result = match wsp_ffi::lookup(kernel_id) {
            // SAFETY: this fn's contract (views valid and unshared until the
            // completion is polled) covers the kernel, which runs to its end
            // right here, inside that span.
            Some(info) => unsafe { info.invoke(args) }.unwrap_or(wsp_ffi::WSP_KERNEL_REJECTED),
            None => wsp_ffi::WSP_KERNEL_REJECTED,
        };
        let completion = Completion::from_result(result);
        let cycles = match completion {
            Completion::Done { cycles } => cycles,
            Completion::Rejected | Completion::Failed { .. } => 0,
        };
        let until = start + cycles;
        self.machine.launches.borrow_mut().push(Launch {
            core,
            kernel_id,
            issued: self.machine.now.get(),
            start,
            end: until,
            args: *args,
        });
        let makespan = &self.machine.makespan;
        makespan.set(makespan.get().max(until));
        // A queued task's timeout starts at the poll of the one before it.
        let since = start.max(self.machine.now.get());
        self.machine.busy.borrow_mut()[core].push(Busy {
            until,
            completion,
            since,
        });
        true
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let core = self.cores[core];
        let mut busy = self.machine.busy.borrow_mut();
        let b = *busy[core].first()?;
        if b.until > self.machine.now.get() {
            return None;
        }
        busy[core].remove(0);
        if let Some(next) = busy[core].first_mut() {
            next.since = self.machine.now.get();
        }
        Some(b.completion)
    }
}

/// A run in semantic time.
#[derive(Clone, Debug)]
pub struct SemanticRun {
    /// The executor's counters for the run, its ticks in semantic cycles.
    pub stats: RunStats,
    /// Cycles from the first issue to the last completion.
    pub makespan: u64,
    /// Every kernel launch, in issue order.
    pub launches: Vec<Launch>,
}

/// Runs `table` on `kinds` cores in semantic time, on the calling thread,
/// with one scheduler thread.
pub fn run_semantic(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    options: &RunOptions,
) -> Result<SemanticRun, ShimError> {
    run_semantic_with(table, arena, kinds, &SchedConfig::default(), options)
}

/// Runs `table` in semantic time with the scheduler threads and policy of
/// `sched`, all stepped in turn on the calling thread: the same dispatcher,
/// scheduler and policy code as a threaded run, with a deterministic order
/// of events. Core `c` of `kinds` belongs to thread `c % threads`.
pub fn run_semantic_with(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    sched: &SchedConfig,
    options: &RunOptions,
) -> Result<SemanticRun, ShimError> {
    let mut policy = sched.policy.build().map_err(ConfigError::Policy)?;
    run_semantic_custom(table, arena, kinds, sched, &mut policy, options)
}

/// As [`run_semantic_with`], with the caller's own dispatch policy
/// (`sched.policy` is not used).
pub fn run_semantic_custom(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    sched: &SchedConfig,
    policy: &mut dyn DispatchPolicy,
    options: &RunOptions,
) -> Result<SemanticRun, ShimError> {
    run_semantic_inner(table, arena, kinds, sched, policy, options, None, None)
}

/// As [`run_semantic_with`], with `fault` injected (its core a run-wide
/// core number; see [`device_runtime::fault`]). A task that never
/// finishes or is never acknowledged ends the run by its timeout in
/// semantic time: with no task left on any core, the clock moves a
/// millisecond each time the scheduler waits.
pub fn run_semantic_with_fault(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    sched: &SchedConfig,
    options: &RunOptions,
    fault: Fault,
) -> Result<SemanticRun, ShimError> {
    let mut policy = sched.policy.build().map_err(ConfigError::Policy)?;
    run_semantic_inner(
        table,
        arena,
        kinds,
        sched,
        &mut policy,
        options,
        None,
        Some(fault),
    )
}

/// As [`run_semantic_with`], with each scheduler thread's platform
/// [`Observed`] into `sink` (a trace, or a count of finished tasks; see
/// [`crate::record`]).
pub fn run_semantic_observed(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    sched: &SchedConfig,
    options: &RunOptions,
    sink: &Sink,
) -> Result<SemanticRun, ShimError> {
    let mut policy = sched.policy.build().map_err(ConfigError::Policy)?;
    run_semantic_inner(
        table,
        arena,
        kinds,
        sched,
        &mut policy,
        options,
        Some(sink),
        None,
    )
}

#[allow(clippy::too_many_arguments)]
fn run_semantic_inner(
    table: &[u8],
    arena: &mut [u8],
    kinds: &[CoreKind],
    sched: &SchedConfig,
    policy: &mut dyn DispatchPolicy,
    options: &RunOptions,
    sink: Option<&Sink>,
    fault: Option<Fault>,
) -> Result<SemanticRun, ShimError> {
    let table = Table::parse(table).map_err(ShimError::Table)?;
    let threads = sched.threads;
    check_threads(threads)?;
    let groups = thread_cores(kinds.len(), threads);
    let machine = Machine {
        busy: RefCell::new(vec![Vec::new(); kinds.len()]),
        launches: RefCell::new(Vec::new()),
        now: Cell::new(0),
        makespan: Cell::new(0),
        idle_step: if fault.is_some() {
            CYCLES_PER_SECOND / 1000
        } else {
            0
        },
        timeout: u64::try_from(
            options.kernel_timeout_ms as u128 * CYCLES_PER_SECOND as u128 / 1000,
        )
        .unwrap_or(u64::MAX),
    };
    let ids: Vec<Vec<u16>> = groups
        .iter()
        .map(|g| g.iter().map(|&c| c as u16).collect())
        .collect();
    let mut state = crate::heap::run_state();
    let (queues, orch) = state.split();
    let arena = Arena::new(arena);
    let platforms = groups.iter().map(|g| {
        let cores = SemanticCores {
            machine: &machine,
            cores: g.clone(),
            kinds: g.iter().map(|&c| kinds[c]).collect(),
        };
        FaultPlatform::new(cores, fault.and_then(|f| f.on_cores(g.iter().copied())))
    });
    let mut stats = match sink {
        None => drive(
            platforms, &ids, &table, arena, queues, orch, policy, sched, options, None,
        )?,
        Some(sink) => {
            let observed = platforms
                .enumerate()
                .map(|(t, p)| Observed::new(p, sink, t, &groups[t]));
            let mut loops: Vec<(u32, Vec<u32>)> = Vec::new();
            let mut on_submit = |task: u32, l: &[u32]| loops.push((task, l.to_vec()));
            let on_submit = sink.keeps().then_some(&mut on_submit as _);
            let stats = drive(
                observed, &ids, &table, arena, queues, orch, policy, sched, options, on_submit,
            );
            sink.add_loops(loops);
            stats?
        }
    };
    let makespan = machine.makespan.get();
    stats.wall_ticks = makespan;
    let launches = machine.launches.take();
    Ok(SemanticRun {
        stats,
        makespan,
        launches,
    })
}

/// Runs `table` with one scheduler per platform of `platforms` (whose
/// cores the run numbers `ids`), stepped in turn on this thread; the run's
/// figures with a wall time of 0 (the caller knows the makespan).
#[allow(clippy::too_many_arguments)]
fn drive<P: Platform>(
    platforms: impl Iterator<Item = P>,
    ids: &[Vec<u16>],
    table: &Table<'_>,
    arena: Arena<'_>,
    queues: &Queues,
    orch: &mut TableOrchestrator,
    policy: &mut dyn DispatchPolicy,
    sched: &SchedConfig,
    options: &RunOptions,
    on_submit: Option<OnSubmit<'_>>,
) -> Result<RunStats, ShimError> {
    let threads = ids.len();
    let mut schedulers: Vec<_> = platforms
        .enumerate()
        .map(|(t, platform)| {
            Scheduler::new(t, threads, platform, &ids[t], table, arena, queues, options)
        })
        .collect::<Result<_, ConfigError>>()?;
    let thread_kinds: Vec<[bool; 2]> = schedulers.iter().map(|s| s.kinds()).collect();
    let mut dispatcher = Dispatcher::new(
        table,
        arena,
        options,
        orch,
        queues,
        policy,
        sched,
        &thread_kinds,
    )?;
    if let Some(on_submit) = on_submit {
        dispatcher.observe_submissions(on_submit);
    }
    drive_stepped(&mut dispatcher, &mut schedulers)?;
    Ok(RunStats::collect(
        &dispatcher,
        &schedulers,
        CYCLES_PER_SECOND,
        0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workloads::{Params, Workload};

    /// The makespan on one scheduler thread under round-robin.
    fn makespan(w: &Workload, kinds: &[CoreKind]) -> u64 {
        let mut arena = w.arena.clone();
        let sched = SchedConfig {
            threads: 1,
            policy: device_runtime::sched::PolicyKind::RoundRobin,
            ..SchedConfig::default()
        };
        let options = RunOptions::default();
        let run = run_semantic_with(&w.table, &mut arena.bytes, kinds, &sched, &options).unwrap();
        assert!(w.verify(&arena).passed());
        run.makespan
    }

    /// A kernel whose cycles pass the kernel timeout ends the run with
    /// `KernelTimeout` when the timeout expires; a timeout at or above
    /// every kernel's cycles lets the run finish as it does with the
    /// default. Decode partials of 1,024 tokens take between 1 and 2 ms
    /// of semantic time: the kernels' own cycles (the launches of the run
    /// with the default timeout) set the timeouts either side.
    #[test]
    fn a_kernel_past_the_kernel_timeout_ends_the_run() {
        use device_runtime::sched::RunError;
        let p = Params {
            m: 1,
            n: 8192,
            k: 128,
            tile: 16,
            seed: 1,
        };
        let w = Workload::build("decode-uniform", p).unwrap();
        let kinds = [
            CoreKind::Cube,
            CoreKind::Cube,
            CoreKind::Vector,
            CoreKind::Vector,
        ];
        let run = |kernel_timeout_ms| {
            let mut arena = w.arena.clone();
            let options = RunOptions {
                kernel_timeout_ms,
                ..RunOptions::default()
            };
            let sched = SchedConfig::default();
            run_semantic_with(&w.table, &mut arena.bytes, &kinds, &sched, &options)
        };
        let free = run(RunOptions::default().kernel_timeout_ms).unwrap();
        let longest = free.launches.iter().map(|l| l.end - l.start).max().unwrap();
        let ms = CYCLES_PER_SECOND / 1000;
        assert!(longest > ms && longest < 10 * ms, "{longest} cycles");
        let under = (longest - 1) / ms;
        match run(under) {
            Err(ShimError::Run(e)) => match *e {
                RunError::KernelTimeout { waited_ms, .. } => assert_eq!(waited_ms, under),
                other => panic!("{under} ms: {other}"),
            },
            other => panic!("{under} ms: {:?}", other.map(|r| r.makespan)),
        }
        let ok = run(longest.div_ceil(ms)).unwrap();
        assert_eq!(ok.makespan, free.makespan);
        assert_eq!(ok.stats.tasks, free.stats.tasks);
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
