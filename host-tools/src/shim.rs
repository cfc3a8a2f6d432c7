//! The host shim: host threads emulate the AICPU and the AICores, running the
//! device runtime's own code. The shim provides only threads, a clock and
//! memory; scheduling, dependency tracking and the issue protocol are the
//! runtime's.

use std::fmt;

use device_runtime::abi::{Table, TableError};
use device_runtime::fault::{Fault, FaultPlatform};
use device_runtime::mailbox::{serve, CoreMailbox};
use device_runtime::platform::{Clock, MailboxPlatform, Platform, PlatformError};
use device_runtime::sched::{
    core_owner, drive_leader, Arena, ConfigError, Dispatcher, SchedConfig, Scheduler, MAX_THREADS,
};
use device_runtime::sched::{OnSubmit, RunError, RunOptions, RunStats};
use wsp_ffi::CoreKind;

use crate::pinning::{PinError, Pins, Placement};
use crate::record::{Observed, Sink};

/// The emulated machine.
#[derive(Clone, Copy, Debug)]
pub struct Shim {
    /// Emulated cube cores (run-wide core numbers 0 .. `cube_cores`).
    pub cube_cores: usize,
    /// Emulated vector cores, numbered after the cube cores.
    pub vector_cores: usize,
    /// Settings of each run: kernel timeout, issue depth, symbols.
    pub options: RunOptions,
    /// Scheduler threads and dispatch policy. Core `c` (cube cores first,
    /// then vector cores) belongs to scheduler thread `c % threads`.
    pub sched: SchedConfig,
    /// Where the scheduler threads run on the host (the cores' threads
    /// are left to the OS).
    pub placement: Placement,
}

impl Default for Shim {
    fn default() -> Self {
        Shim {
            cube_cores: 2,
            vector_cores: 2,
            options: RunOptions::default(),
            sched: SchedConfig::default(),
            placement: Placement::Os,
        }
    }
}

/// The cores of each scheduler thread: core `c` of `cores` belongs to
/// thread [`core_owner`]`(c, threads)`, as in every runner, so that every
/// thread gets cores of both kinds when there are enough.
pub fn thread_cores(cores: usize, threads: usize) -> Vec<Vec<usize>> {
    let threads = threads.max(1);
    let mut groups = vec![Vec::new(); threads];
    for core in 0..cores {
        groups[core_owner(core, threads)].push(core);
    }
    groups
}

/// Why a shim run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShimError {
    /// The table failed validation.
    Table(TableError),
    /// The cores' mailboxes could not be put together into platforms.
    Platform(PlatformError),
    /// Boxed: a run error can carry a deadlock report of several hundred bytes.
    Run(Box<RunError>),
    /// A pinned run ([`Placement::Pinned`]) could not pin its threads.
    Pin(PinError),
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShimError::Table(e) => write!(f, "{e}"),
            ShimError::Platform(e) => write!(f, "platform: {e}"),
            ShimError::Run(e) => write!(f, "run failed: {e}"),
            ShimError::Pin(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ShimError {}

impl From<RunError> for ShimError {
    fn from(e: RunError) -> Self {
        ShimError::Run(Box::new(e))
    }
}

impl From<ConfigError> for ShimError {
    fn from(e: ConfigError) -> Self {
        RunError::Config(e).into()
    }
}

/// Counter ticks since the clock was made, at
/// [`Clock::ticks_per_second`]; idles by spinning a little, then yielding
/// the host thread (the shim's cores are host threads too, and the host may
/// have fewer processors than threads).
///
/// Read from the processor's time-stamp counter where it is invariant
/// (`quanta` checks, and calibrates it against the OS clock: the rate
/// comes from that calibration), else from the OS's monotonic clock in
/// nanoseconds. The runtime reads its clock once a round, so on a chain of
/// tasks once a task: `Instant::elapsed` costs 25 ns a read on the
/// development host and its ordered counter read stalls the work around
/// it, where a plain counter read costs 11 ns, nearer what the device's
/// system counter costs the AICPU (the scheduling bench's chain on one
/// thread: 180 -> 138 ns per task, BENCHMARKS.md). The reading stays in
/// counter ticks, as the device's does: scaling each one to nanoseconds
/// cost about 20 instructions a round, and only reports need the scale.
///
/// A scheduler thread's timeouts and busy times compare readings it took
/// itself; a trace puts every thread's readings on one time line, which
/// needs the processors' counters in step, as they are where the OS keeps
/// the counter as its own clock source (Linux checks that at boot).
#[derive(Clone)]
pub struct HostClock {
    clock: quanta::Clock,
    /// The counter's reading when the clock was made.
    start: u64,
    ticks_per_second: u64,
}

impl HostClock {
    /// A clock that starts at 0 now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        // The counter's rate, from quanta's calibration: the nanoseconds
        // a long span of ticks takes (exact to far below a part per
        // million at this span).
        const SPAN: u64 = 1 << 40;
        let nanos = clock.delta_as_nanos(0, SPAN).max(1);
        let ticks_per_second = (SPAN as u128 * 1_000_000_000 / nanos as u128) as u64;
        let start = clock.raw();
        HostClock {
            clock,
            start,
            ticks_per_second: ticks_per_second.max(1),
        }
    }
}

impl Default for HostClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for HostClock {
    fn now(&self) -> u64 {
        self.clock.raw().saturating_sub(self.start)
    }
    fn ticks_per_second(&self) -> u64 {
        self.ticks_per_second
    }
    fn relax(&self) {
        std::hint::spin_loop();
    }
    fn pause(&self) {
        std::thread::yield_now();
    }
}

impl Shim {
    /// Whether the scheduler threads can drive this many cores: core `c`
    /// belongs to thread `c % threads`, so thread 0 has the most, and a
    /// thread drives at most [`MAX_CORES`](device_runtime::platform::MAX_CORES).
    /// Checked before anything is built for the cores (a thread each, in
    /// the shim), so that a mistyped count is an error, not an exhausted
    /// host.
    pub fn check_cores(&self) -> Result<(), ShimError> {
        check_threads(self.sched.threads)?;
        let max = device_runtime::platform::MAX_CORES;
        let most = (self.cube_cores.checked_add(self.vector_cores))
            .map_or(usize::MAX, |cores| cores.div_ceil(self.sched.threads));
        if most > max {
            let cores = most;
            return Err(ConfigError::ThreadCores {
                thread: 0,
                cores,
                max,
            }
            .into());
        }
        Ok(())
    }

    /// The kinds of the emulated cores: cube cores first, then vector cores
    /// (check their number first: [`Shim::check_cores`]).
    pub fn core_kinds(&self) -> Vec<CoreKind> {
        let cube = std::iter::repeat_n(CoreKind::Cube, self.cube_cores);
        cube.chain(std::iter::repeat_n(CoreKind::Vector, self.vector_cores))
            .collect()
    }

    /// The cores of each scheduler thread, by run-wide core number.
    pub fn thread_cores(&self) -> Vec<Vec<usize>> {
        thread_cores(self.cube_cores + self.vector_cores, self.sched.threads)
    }

    /// Validates `table` and runs it with `arena` as the data arena. One host
    /// thread per AICore serves its mailbox; the calling thread is scheduler
    /// thread 0 and the dispatcher, and each further scheduler thread is a
    /// host thread.
    pub fn run(&self, table: &[u8], arena: &mut [u8]) -> Result<RunStats, ShimError> {
        self.run_with(table, arena, None, None)
    }

    /// As [`Shim::run`], with `fault` injected (its core a run-wide core
    /// number; see [`device_runtime::fault`]). The cores and mailboxes are
    /// the run's own: the next run starts clean.
    pub fn run_with_fault(
        &self,
        table: &[u8],
        arena: &mut [u8],
        fault: Fault,
    ) -> Result<RunStats, ShimError> {
        self.run_with(table, arena, None, Some(fault))
    }

    /// As [`Shim::run`], with each scheduler thread's platform
    /// [`Observed`] into `sink` (a trace, or a count of finished tasks for
    /// a progress bar; see [`crate::record`]).
    pub fn run_observed(
        &self,
        table: &[u8],
        arena: &mut [u8],
        sink: &Sink,
    ) -> Result<RunStats, ShimError> {
        self.run_with(table, arena, Some(sink), None)
    }

    /// As [`Shim::run_observed`], with `fault` injected (`None`: none).
    pub fn run_observed_with_fault(
        &self,
        table: &[u8],
        arena: &mut [u8],
        sink: &Sink,
        fault: Option<Fault>,
    ) -> Result<RunStats, ShimError> {
        self.run_with(table, arena, Some(sink), fault)
    }

    fn run_with(
        &self,
        table: &[u8],
        arena: &mut [u8],
        sink: Option<&Sink>,
        fault: Option<Fault>,
    ) -> Result<RunStats, ShimError> {
        let table = Table::parse(table).map_err(ShimError::Table)?;
        self.check_cores()?;
        let kinds = self.core_kinds();
        let groups = self.thread_cores();
        let mailboxes: Vec<Vec<CoreMailbox>> = groups
            .iter()
            .map(|g| g.iter().map(|_| CoreMailbox::new()).collect())
            .collect();
        let group_kinds: Vec<Vec<CoreKind>> = groups
            .iter()
            .map(|g| g.iter().map(|&c| kinds[c]).collect())
            .collect();
        let clock = HostClock::new();
        crate::workers::scope(|s| {
            let cores: Vec<_> = (mailboxes.iter().flatten().enumerate())
                .map(|(core, mailbox)| {
                    // Named, so that profilers and debuggers tell them apart.
                    let name = format!("wsp-core-{core}");
                    s.spawn(&name, move || serve(mailbox, std::thread::yield_now))
                })
                .collect();
            let result = (0..groups.len())
                .map(|t| {
                    let fault = fault.and_then(|f| f.on_cores(groups[t].iter().copied()));
                    MailboxPlatform::new(&mailboxes[t], &group_kinds[t], clock.clone())
                        .map(|p| FaultPlatform::new(p, fault))
                })
                .collect::<Result<Vec<_>, _>>()
                .map_err(ShimError::Platform)
                .and_then(|platforms| {
                    let (sched, options) = (&self.sched, &self.options);
                    match sink {
                        None => run_threads_inner(
                            &table,
                            arena,
                            platforms,
                            &groups,
                            sched,
                            options,
                            None,
                            self.placement,
                        ),
                        Some(sink) => {
                            let observed = platforms
                                .into_iter()
                                .enumerate()
                                .map(|(t, p)| Observed::new(p, sink, t, &groups[t]))
                                .collect();
                            run_threads_inner(
                                &table,
                                arena,
                                observed,
                                &groups,
                                sched,
                                options,
                                Some(sink),
                                self.placement,
                            )
                        }
                    }
                });
            // Also when the run failed early: the core threads must end.
            mailboxes
                .iter()
                .flatten()
                .for_each(CoreMailbox::request_exit);
            for core in cores {
                if let Err(panic) = core.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            result
        })
    }
}

/// 1 ..= `MAX_THREADS` scheduler threads, or the error saying so.
pub(crate) fn check_threads(threads: usize) -> Result<(), ShimError> {
    if threads == 0 || threads > MAX_THREADS {
        let max = MAX_THREADS;
        return Err(ConfigError::Threads { threads, max }.into());
    }
    Ok(())
}

/// Runs `table` with one scheduler thread per platform: the calling thread
/// is the dispatcher and scheduler 0, each further scheduler is a scoped
/// host thread. `cores[t]` numbers the cores of `platforms[t]` in the run.
pub fn run_threads<P: Platform + Send>(
    table: &Table<'_>,
    arena: &mut [u8],
    platforms: Vec<P>,
    cores: &[Vec<usize>],
    sched: &SchedConfig,
    options: &RunOptions,
) -> Result<RunStats, ShimError> {
    run_threads_inner(
        table,
        arena,
        platforms,
        cores,
        sched,
        options,
        None,
        Placement::Os,
    )
}

/// As [`run_threads`], with the scheduler threads placed on the host's
/// processors as `placement` says (see [`crate::pinning`]: pinned, a
/// run does not depend on where the OS puts a new thread).
#[allow(clippy::too_many_arguments)]
pub fn run_threads_placed<P: Platform + Send>(
    table: &Table<'_>,
    arena: &mut [u8],
    platforms: Vec<P>,
    cores: &[Vec<usize>],
    sched: &SchedConfig,
    options: &RunOptions,
    placement: Placement,
) -> Result<RunStats, ShimError> {
    run_threads_inner(
        table, arena, platforms, cores, sched, options, None, placement,
    )
}

/// As [`run_threads`], telling `sink` each task's loop indices (if it
/// keeps events; the platforms are the caller's to observe).
pub fn run_threads_with<P: Platform + Send>(
    table: &Table<'_>,
    arena: &mut [u8],
    platforms: Vec<P>,
    cores: &[Vec<usize>],
    sched: &SchedConfig,
    options: &RunOptions,
    sink: &Sink,
) -> Result<RunStats, ShimError> {
    let placement = Placement::Os;
    run_threads_inner(
        table,
        arena,
        platforms,
        cores,
        sched,
        options,
        Some(sink),
        placement,
    )
}

#[allow(clippy::too_many_arguments)]
fn run_threads_inner<P: Platform + Send>(
    table: &Table<'_>,
    arena: &mut [u8],
    platforms: Vec<P>,
    cores: &[Vec<usize>],
    sched: &SchedConfig,
    options: &RunOptions,
    sink: Option<&Sink>,
    placement: Placement,
) -> Result<RunStats, ShimError> {
    check_threads(platforms.len())?;
    let pins = match placement {
        Placement::Os => None,
        Placement::Pinned => Some(Pins::plan(platforms.len()).map_err(ShimError::Pin)?),
    };
    // Thread 0 (this thread) is pinned before it builds the run's state,
    // which then is in the caches of the processor that uses it.
    if let Some(pins) = &pins {
        pins.pin(0).map_err(ShimError::Pin)?;
    }
    let mut loops: Vec<(u32, Vec<u32>)> = Vec::new();
    let mut on_submit = |task: u32, l: &[u32]| loops.push((task, l.to_vec()));
    let result = run_threads_observing(
        table,
        arena,
        platforms,
        cores,
        sched,
        options,
        sink.filter(|s| s.keeps()).map(|_| &mut on_submit as _),
        pins.as_ref(),
    );
    if let Some(sink) = sink {
        sink.add_loops(loops);
    }
    match pins.as_ref().map_or(Ok(()), Pins::restore) {
        Ok(()) => result,
        // The run's own error first: it says more than the restore's.
        Err(e) => result.and(Err(ShimError::Pin(e))),
    }
}

/// Runs the table on one scheduler thread per platform, thread 0 (this
/// thread) already placed; threads 1.. pin themselves to their
/// processors in `pins` (if given) before they serve.
#[allow(clippy::too_many_arguments)]
fn run_threads_observing<'o, P: Platform + Send>(
    table: &'o Table<'_>,
    arena: &'o mut [u8],
    platforms: Vec<P>,
    cores: &[Vec<usize>],
    sched: &SchedConfig,
    options: &RunOptions,
    on_submit: Option<OnSubmit<'o>>,
    pins: Option<&Pins>,
) -> Result<RunStats, ShimError> {
    let threads = platforms.len();
    let ids: Vec<Vec<u16>> = cores
        .iter()
        .map(|g| g.iter().map(|&c| c as u16).collect())
        .collect();
    let mut state = crate::heap::run_state();
    let (queues, orch) = state.split();
    let arena = Arena::new(arena);
    let mut policy = sched.policy.build().map_err(ConfigError::Policy)?;
    let mut schedulers: Vec<_> = platforms
        .into_iter()
        .zip(&ids)
        .enumerate()
        .map(|(t, (platform, ids))| {
            Scheduler::new(t, threads, platform, ids, table, arena, queues, options)
        })
        .collect::<Result<_, ConfigError>>()?;
    // Every thread's cores have every kernel, before anything runs.
    for scheduler in &schedulers {
        scheduler.check_kernels()?;
    }
    let tps = schedulers[0].platform().ticks_per_second();
    let kinds: Vec<[bool; 2]> = schedulers.iter().map(|s| s.kinds()).collect();
    let mut dispatcher = Dispatcher::new(
        table,
        arena,
        options,
        orch,
        queues,
        &mut policy,
        sched,
        &kinds,
    )?;
    if let Some(on_submit) = on_submit {
        dispatcher.observe_submissions(on_submit);
    }
    let others = schedulers.split_off(1);
    let mut leader = schedulers.pop().expect("one scheduler per thread");
    crate::workers::scope(|s| {
        let start = leader.platform().now();
        let handles: Vec<_> = others
            .into_iter()
            .enumerate()
            .map(|(i, mut scheduler)| {
                // Named (thread 0 is the caller's, which also dispatches),
                // so that profilers tell the threads apart: `perf report
                // --sort comm,sym` gives each thread's own profile.
                let name = format!("wsp-sched-{}", i + 1);
                s.spawn(&name, move || {
                    // Pinned before the thread takes any work. A thread that
                    // cannot pin aborts the run, which stops the others.
                    let pinned = pins.map_or(Ok(()), |p| p.pin(i + 1));
                    let result = match pinned {
                        Ok(()) => scheduler.serve().map_err(ShimError::from),
                        Err(e) => {
                            scheduler.abort();
                            Err(ShimError::Pin(e))
                        }
                    };
                    // The worker serves later runs: it leaves with the
                    // processors the caller had before the run was pinned.
                    let restored = pins.map_or(Ok(()), Pins::restore);
                    let result = match (result, restored) {
                        (Ok(()), Err(e)) => Err(ShimError::Pin(e)),
                        (result, _) => result,
                    };
                    (scheduler, result)
                })
            })
            .collect();
        let led = drive_leader(&mut dispatcher, &mut leader);
        let wall = leader.platform().now().wrapping_sub(start);
        let mut all = Vec::with_capacity(threads);
        let mut failure = None;
        for handle in handles {
            let (scheduler, result) = handle
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            if let Err(e) = result {
                failure.get_or_insert(e);
            }
            all.push(scheduler);
        }
        all.insert(0, leader);
        match (led, failure) {
            (Err(RunError::ThreadFailed), Some(e)) | (Ok(()), Some(e)) => Err(e),
            (Err(e), _) => Err(e.into()),
            (Ok(()), None) => Ok(RunStats::collect(&dispatcher, &all, tps, wall)),
        }
    })
}
