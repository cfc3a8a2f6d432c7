//! The pto-wsp firmware for QEMU `virt` (aarch64, 8 CPUs, 512 MiB; the
//! memory map is [`device_runtime::abi::memory_map`]).
//!
//! CPUs 0-3 play the AICPU, CPUs 4-7 the AICores. CPU 0 reads the launch
//! block the host loaded at [`LAUNCH_ADDR`] (the program's symbols, the
//! number of scheduler threads and the dispatch policy; see
//! [`device_runtime::abi::launch`]; all zeroes, as when the host loads none,
//! mean no symbols and the default schedule, [`SchedConfig::default`], as
//! in the host shim), starts the CPUs the run
//! needs, validates the descriptor table at [`TABLE_ADDR`] and runs it with
//! the device runtime against the data arena at [`ARENA_ADDR`]: CPU 0 is
//! the dispatcher and scheduler thread 0, CPUs 1 .. threads run scheduler
//! threads 1 .., and it reports over semihosting. Each AICore serves its
//! mailbox, running the kernels issued to it, until CPU 0 shuts it down.
//! The run has 2 cube cores (its cores 0 and 1) and 2 vector cores (2 and
//! 3), numbered as the shim numbers them, and scheduler thread `t` of `n`
//! owns the cores `c` with [`core_owner`]`(c, n) == t`, as in the shim;
//! [`Slots`] says which AICore CPU plays which core.
//!
//! Output (`defmt` log frames, [`log`], in the semihosting file
//! `defmt.out`, decoded by xtask): once the CPUs are up, that the MMU and
//! caches are on ([`mmu::report`]: `mmu on cpus=..`); on success the run's
//! statistics (`tasks=.. wall_us=.. cycles=.. per_core=..`, tasks per core, then
//! `threads=.. policy=.. per_thread=..`, tasks each scheduler thread
//! issued) and `RESULT OK`, on failure `RESULT ERROR <reason>`. On success
//! the arena is written to the semihosting file `arena.out` (QEMU's working
//! directory).
//!
//! Measuring modes ([`bench`]): words on the semihosting command line make
//! the AICores skip the kernels (`empty-kernels`) or replace the table with
//! a launch + poll loop (`baseline=N`), and add a `bench ..` line of timer
//! ticks to the output. The word `trace` records the run's events and
//! writes them to the semihosting file `trace.out` ([`trace`]).
//!
//! Faults ([`bench`]'s `fault=F`): the run injects fault `F` through
//! [`FaultPlatform`], logs `FAULTY RUN ERROR <error>`, puts the arena, the
//! orchestrator and the queues back as they were before it, and runs the
//! table again over the same AICores and mailboxes without the fault; that
//! run's result is reported as above.
//!
//! Exit status: 0 success, 1 runtime error (cores, platform, run, writing
//! `arena.out`), 2 invalid table, 3 CPU exception ([`boot::EXIT_EXCEPTION`]),
//! 4 invalid launch block or command line, 101 panic.
#![no_std]
#![no_main]
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Without `alloc` a run error (which may carry a deadlock report) cannot be
// boxed; it ends the run, so its size costs no hot path.
#![allow(clippy::large_enum_variant, clippy::result_large_err)]

mod bench;
mod boot;
mod clock;
mod log;
mod mmu;
mod psci;
mod trace;

use core::cell::UnsafeCell;
use core::fmt::Display;
use core::sync::atomic::{AtomicU32, Ordering};

use defmt::Display2Format;
use device_runtime::abi::launch::{Launch, LaunchError, LAUNCH_MAX};
use device_runtime::abi::memory_map::{
    ARENA_ADDR, ARENA_MAX, CPUS, LAUNCH_ADDR, LAUNCH_WINDOW, TABLE_ADDR, TABLE_MAX,
};
use device_runtime::abi::{table_len, Table, TableError, HEADER_SIZE};
use device_runtime::fault::{Fault, FaultPlatform};
use device_runtime::mailbox::{serve, serve_with, CoreMailbox};
use device_runtime::platform::{Clock, MailboxPlatform};
use device_runtime::sched::{
    core_owner, drive_leader, Arena, ConfigError, Dispatcher, Queues, SchedConfig, Scheduler,
};
use device_runtime::sched::{RunError, RunOptions, RunStats, TableOrchestrator};
use wsp_ffi::CoreKind;

use crate::bench::Mode;
use crate::clock::CounterClock;
use crate::trace::Traced;

// The largest launch block fits its window.
const _: () = assert!(LAUNCH_MAX <= LAUNCH_WINDOW);

const EXIT_OK: i32 = 0;
const EXIT_RUN: i32 = 1;
const EXIT_TABLE: i32 = 2;
const EXIT_LAUNCH: i32 = 4;
const EXIT_PANIC: i32 = 101;

/// CPUs that play the AICPU: 0 .. AICPUS, one scheduler thread each at most.
const AICPUS: usize = 4;
/// Cores that run kernels: CPUs AICPUS .. CPUS. Runtime core `c` is CPU `AICPUS + c`.
const WORKERS: usize = CPUS - AICPUS;
/// The kind of run core `c`: cube cores first, then vector cores, as the
/// host shim numbers its cores, so that the same table and flags mean the
/// same schedule in both.
const CORE_KINDS: [CoreKind; WORKERS] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
];

/// Which run core each worker plays when a run has `n` scheduler threads.
/// Thread `t` owns the run cores that [`core_owner`] gives it (as in every
/// runner), and its platform takes a contiguous slice of [`MAILBOXES`]; so
/// worker `w` (CPU `AICPUS + w`, `MAILBOXES[w]`) plays run core `core[w]`,
/// the workers of thread `t` being `first[t] .. first[t + 1]`.
struct Slots {
    core: [u16; WORKERS],
    kind: [CoreKind; WORKERS],
    first: [usize; AICPUS + 1],
}

impl Slots {
    const fn new(threads: usize) -> Slots {
        let mut slots = Slots {
            core: [0; WORKERS],
            kind: [CoreKind::Cube; WORKERS],
            first: [WORKERS; AICPUS + 1],
        };
        let mut w = 0;
        let mut t = 0;
        while t < threads {
            slots.first[t] = w;
            let mut c = 0;
            while c < WORKERS {
                if core_owner(c, threads) == t {
                    slots.core[w] = c as u16;
                    slots.kind[w] = CORE_KINDS[c];
                    w += 1;
                }
                c += 1;
            }
            t += 1;
        }
        slots
    }

    /// The workers of scheduler thread `t`.
    fn of(&self, t: usize) -> core::ops::Range<usize> {
        self.first[t]..self.first[t + 1]
    }
}

/// [`Slots`] for 1 ..= [`AICPUS`] scheduler threads (index `threads - 1`).
static SLOTS: [Slots; AICPUS] = [Slots::new(1), Slots::new(2), Slots::new(3), Slots::new(4)];
/// One mailbox per worker ([`Slots`] says which run core it plays).
static MAILBOXES: [CoreMailbox; WORKERS] = [const { CoreMailbox::new() }; WORKERS];
/// The queues between the dispatcher and the scheduler threads (see
/// [`queues`]; put back in their first state by `Queues::reset`).
static QUEUES: QueuesCell = QueuesCell(UnsafeCell::new(Queues::new()));
/// The orchestrator of CPU 0 (too large for its stack), locked by a run.
static ORCHESTRATOR: spin::Mutex<TableOrchestrator> =
    spin::Mutex::new(TableOrchestrator::for_tables());

/// The [`Queues`], reset in place between two runs of one booted image.
struct QueuesCell(UnsafeCell<Queues>);

// SAFETY: the queues are shared through `queues` (they synchronize their
// own fields); `faulty_run` resets them only while nothing uses them.
unsafe impl Sync for QueuesCell {}

/// The run's queues.
fn queues() -> &'static Queues {
    // SAFETY: a shared reference; the queues are only written otherwise by
    // `faulty_run`'s reset, while no reference from here is in use.
    unsafe { &*QUEUES.0.get() }
}

/// Most runs in one booted image: a faulty run and the clean one after it.
const RUNS: usize = 2;
/// Runs this image does ([`RUNS`] after a fault, else 1), set by CPU 0
/// before it starts the others.
static PLANNED_RUNS: AtomicU32 = AtomicU32::new(1);

/// Scheduler threads 1 .. of a run, thread `t` at `t - 1` ([`handoff`]):
/// thread 0 is CPU 0's own and needs none (a handoff holds a whole
/// scheduler, about 8 KiB). The runs of an image share them: a
/// run gives each its scheduler and takes every one back
/// ([`Handoff::wait`]) before it ends, so the next run finds them empty
/// (a faulty run ends only with the errors that come after that), and
/// CPU `t` serves its handoff once per planned run.
static HANDOFFS: [Handoff; AICPUS - 1] = [const {
    Handoff {
        slot: spin::Mutex::new(Slot::Empty),
    }
}; AICPUS - 1];

/// The handoff of scheduler thread `t` (1 .. AICPUS).
fn handoff(t: usize) -> &'static Handoff {
    &HANDOFFS[t - 1]
}
/// The validated table, shared by every scheduler thread for the whole run.
static TABLE: spin::Once<Table<'static>> = spin::Once::new();
/// The run's mode, set by CPU 0 before it starts the others.
static MODE: spin::Once<Mode> = spin::Once::new();

/// The orchestrator for a run; `None` while another run holds it.
fn take_orchestrator() -> Option<spin::MutexGuard<'static, TableOrchestrator>> {
    ORCHESTRATOR.try_lock()
}

/// Keeps `table` for the rest of the run; `None` if one is kept already.
fn keep_table(table: Table<'static>) -> Option<&'static Table<'static>> {
    let mut kept = false;
    let table = TABLE.call_once(|| {
        kept = true;
        table
    });
    kept.then_some(table)
}

/// A scheduler thread (1 .. AICPUS) of the run.
type Sched = Scheduler<'static, Traced<FaultPlatform<MailboxPlatform<'static, CounterClock>>>>;
// Schedulers live on the stacks of CPU 0 (all of them, while it builds
// them) and of the CPU serving each: they must stay small beside a stack.
const _: () = assert!(AICPUS * core::mem::size_of::<Sched>() <= boot::STACK_SIZE / 8);

/// Scheduler thread `t`, handed from CPU 0 to CPU `t` and back: CPU 0
/// [`give`](Handoff::give)s it, CPU `t` [`serve`](Handoff::serve)s the run
/// with it, and CPU 0 [`wait`](Handoff::wait)s for it to collect its figures.
struct Handoff {
    slot: spin::Mutex<Slot>,
}

/// Where a [`Handoff`]'s scheduler is. (`repr(u8)`: `Empty` is a zero tag,
/// so [`HANDOFFS`] stays in `.bss`.)
#[repr(u8)]
enum Slot {
    Empty,
    Given(Sched),
    Taken,
    /// After the run, with its error if it failed, until CPU 0 takes it
    /// back (dropping the scheduler frees its cores' mailboxes for the
    /// next run).
    Served(Sched, Option<RunError>),
}

impl Handoff {
    /// CPU 0: hands `sched` to the CPU that serves this handoff. `false`
    /// if one was given already.
    fn give(&self, sched: Sched) -> bool {
        let mut slot = self.slot.lock();
        if !matches!(*slot, Slot::Empty) {
            return false;
        }
        *slot = Slot::Given(sched);
        true
    }

    /// CPU `t`: waits for its scheduler, serves the run with it, hands it back.
    fn serve(&self) {
        let mut sched = loop {
            let mut slot = self.slot.lock();
            match core::mem::replace(&mut *slot, Slot::Taken) {
                Slot::Given(sched) => break sched,
                other => *slot = other,
            }
            drop(slot);
            clock::relax();
        };
        let start = sched.platform().now();
        let result = sched.serve().err();
        let end = sched.platform().now();
        sched.platform().record_run(start, end);
        *self.slot.lock() = Slot::Served(sched, result);
    }

    /// CPU 0: waits until the run was served; the scheduler (for its
    /// figures) and its error, if it failed.
    fn wait(&self) -> (Sched, Option<RunError>) {
        loop {
            let mut slot = self.slot.lock();
            match core::mem::replace(&mut *slot, Slot::Empty) {
                Slot::Served(sched, error) => return (sched, error),
                other => *slot = other,
            }
            drop(slot);
            clock::relax();
        }
    }
}

/// Bit `cpu` is set once that CPU is up. (A set of flags CPU 0 polls with
/// a time limit, not a one-time value: spin has nothing for it.)
static ONLINE: AtomicU32 = AtomicU32::new(0);
/// How long CPU 0 waits for the other CPUs to come up.
const ONLINE_TIMEOUT_MS: u64 = 1000;

/// CPU 0, called by the boot code with a stack, FP on and `.bss` zeroed.
extern "C" fn primary_main() -> ! {
    mmu::record(0);
    let clock = CounterClock::new();
    let words = match bench::mode() {
        Ok(words) => words,
        Err(e) => fail(EXIT_LAUNCH, e),
    };
    if words.overflow_stack {
        // The guard page must stop this; 64 KiB past the stack's end
        // reaches well into `.bss` on an unguarded stack.
        let depth = bench::overflow_stack(boot::STACK_SIZE + (64 << 10));
        fail(
            EXIT_RUN,
            format_args!(
                "overflow-stack: {depth} calls of 1 KiB ran past CPU 0's stack without a fault"
            ),
        );
    }
    let (mode, traced) = (*MODE.call_once(|| words.mode), words.trace);
    if traced {
        trace::enable(clock.now());
    }
    if let Mode::Baseline { tasks } = mode {
        run_baseline(clock, tasks);
    }
    let (mut options, sched) = match load_launch() {
        Ok(launch) => launch,
        Err(e) => fail(EXIT_LAUNCH, e),
    };
    options.kernel_timeout_ms = words.kernel_timeout_ms.unwrap_or(options.kernel_timeout_ms);
    options.ack_timeout_ms = words.ack_timeout_ms.unwrap_or(options.ack_timeout_ms);
    if words.fault.is_some() {
        PLANNED_RUNS.store(RUNS as u32, Ordering::Release);
    }
    if let Err(e) = start_cpus(&clock, sched.threads) {
        fail(EXIT_RUN, e);
    }
    mmu::report(ONLINE.load(Ordering::Acquire) | 1, ARENA_ADDR);
    let table = match load_table() {
        Ok(table) => table,
        Err(e) => fail(EXIT_TABLE, e),
    };
    let Some(table) = keep_table(table) else {
        fail(EXIT_RUN, "the table is already kept");
    };
    let arena_len = usize::try_from(table.arena_size())
        .unwrap_or(usize::MAX)
        .min(ARENA_MAX);
    // SAFETY: no CPU has written the arena yet (the run has not started).
    unsafe { mmu::invalidate(ARENA_ADDR, arena_len) };
    // SAFETY: `from_raw_parts_mut` needs the bytes valid, initialized and
    // unaliased for as long as the slice is used:
    // 1. Valid: [ARENA_ADDR, +ARENA_MAX) is RAM that the memory map reserves
    //    for the arena, clear of the image (the linker keeps it below the
    //    launch block), the launch block and the table; `arena_len` is at most
    //    ARENA_MAX, far below isize::MAX, and u8 needs no alignment.
    // 2. Initialized: RAM reads as bytes QEMU zeroed or its loader wrote (the
    //    host's initial arena).
    // 3. Unaliased: nothing else in the image refers to this window, and this
    //    is the only slice made of it until the run ends. The scheduler
    //    threads turn it into tensor views only for the kernels they issue,
    //    under `IssuePort::issue`'s contract.
    let arena = unsafe { core::slice::from_raw_parts_mut(ARENA_ADDR as *mut u8, arena_len) };
    let arena = match words.fault {
        None => arena,
        Some(fault) => {
            faulty_run(table, arena, clock, &options, &sched, fault);
            // SAFETY: as above; the faulty run is over: its schedulers were
            // handed back and dropped and its cores drained, so nothing
            // uses the slice it was given any more.
            unsafe { core::slice::from_raw_parts_mut(ARENA_ADDR as *mut u8, arena_len) }
        }
    };
    let result = run_threads(table, Arena::new(arena), clock, &options, &sched, None);
    MAILBOXES.iter().for_each(CoreMailbox::request_exit);
    match result {
        Ok(stats) => {
            defmt::info!("{}", Display2Format(&stats));
            defmt::info!(
                "threads={=usize} policy={} per_thread={}",
                sched.threads,
                Display2Format(&stats.policy),
                Display2Format(&PerThread(&stats))
            );
            if mode.empty_kernels() {
                bench::report(stats.tasks, stats.wall_ticks, stats.ticks_per_second);
            }
            // SAFETY: `from_raw_parts` needs the bytes valid, initialized and
            // not written while the slice lives:
            // 1. Valid and initialized: the window and length of the arena
            //    slice above.
            // 2. Not written: the run is over. Every scheduler thread has
            //    handed its scheduler back (`Handoff::wait`) and no core holds
            //    a task, so neither the mutable arena slice nor any tensor view
            //    is used again; this shared slice is the only access from here
            //    until the process exits.
            let arena = unsafe { core::slice::from_raw_parts(ARENA_ADDR as *const u8, arena_len) };
            // The host reads the arena from memory, behind the caches.
            mmu::clean(ARENA_ADDR, arena_len);
            if let Err(e) = semihosting::fs::write(c"arena.out", arena) {
                fail(EXIT_RUN, format_args!("writing arena.out: {e}"));
            }
            if traced {
                if let Err(e) = trace::write(sched.threads, stats.ticks_per_second) {
                    fail(EXIT_RUN, format_args!("writing trace.out: {e}"));
                }
            }
            defmt::info!("RESULT OK");
            semihosting::process::exit(EXIT_OK)
        }
        Err(e) => fail(EXIT_RUN, e),
    }
}

/// The `fault=` run: keeps a copy of the initial arena in the upper half
/// of the arena window, runs the table with `fault`, reports how the run
/// ended (`FAULTY RUN ERROR ..`), and puts the initial arena back for the
/// clean run after it. The AICores keep serving: the next run uses the
/// same mailboxes. Exits if the fault did not end the run.
fn faulty_run(
    table: &'static Table<'static>,
    arena: &'static mut [u8],
    clock: CounterClock,
    options: &RunOptions,
    sched: &SchedConfig,
    fault: Fault,
) {
    const HALF: usize = ARENA_MAX / 2;
    let len = arena.len();
    if len > HALF {
        fail(
            EXIT_RUN,
            format_args!(
                "fault=: an arena of {len} bytes leaves no room for its copy ({HALF} at most)"
            ),
        );
    }
    // SAFETY: `from_raw_parts_mut` needs the bytes valid, initialized and
    // unaliased while the slice is used: [ARENA_ADDR + HALF, + len) lies in
    // the arena window (len <= HALF), past the table's arena (which ends at
    // ARENA_ADDR + len <= ARENA_ADDR + HALF); RAM reads as bytes, and
    // nothing else in the image refers to that part of the window.
    let copy = unsafe { core::slice::from_raw_parts_mut((ARENA_ADDR + HALF) as *mut u8, len) };
    copy.copy_from_slice(arena);
    let result = run_threads(table, Arena::new(arena), clock, options, sched, Some(fault));
    match result {
        // The errors a fault ends a run with, all after every scheduler
        // thread took its scheduler (so each hands it back before the next run).
        Err(RunFailure::Run(
            e @ (RunError::KernelFailed { .. }
            | RunError::CoreNoAck { .. }
            | RunError::KernelTimeout { .. }
            | RunError::KernelNotBuiltIn { .. }),
        )) => {
            defmt::info!("FAULTY RUN ERROR {}", Display2Format(&e));
        }
        Err(e) => fail(EXIT_RUN, format_args!("fault={fault}: {e}")),
        Ok(_) => fail(
            EXIT_RUN,
            format_args!("fault={fault}: the run finished; the fault never hit"),
        ),
    }
    // The orchestrator and the queues back in their first state, in place
    // (the run left tasks in flight and queued).
    ORCHESTRATOR.lock().reset();
    // SAFETY: the run is over: its dispatcher and schedulers are dropped
    // and every scheduler thread has handed its own back, so no other
    // reference to the queues exists while this one lives.
    unsafe { &mut *QUEUES.0.get() }.reset();
    // SAFETY: the run is over (its schedulers handed back and dropped, its
    // cores drained): nothing but this function uses the arena now.
    let arena = unsafe { core::slice::from_raw_parts_mut(ARENA_ADDR as *mut u8, len) };
    arena.copy_from_slice(copy);
}

/// The `baseline=N` mode: `tasks` tasks through every core with launch +
/// poll only ([`bench::baseline`]), then the bench line.
fn run_baseline(clock: CounterClock, tasks: u64) -> ! {
    if let Err(e) = start_cpus(&clock, 1) {
        fail(EXIT_RUN, e);
    }
    let slots = &SLOTS[0];
    let mut platform = match MailboxPlatform::new(&MAILBOXES, &slots.kind, clock) {
        Ok(platform) => platform,
        Err(e) => fail(EXIT_RUN, format_args!("platform: {e}")),
    };
    let ticks = bench::baseline(&mut platform, tasks);
    platform.shutdown();
    match ticks {
        Ok(ticks) => {
            bench::report(tasks, ticks, clock.ticks_per_second());
            defmt::info!("RESULT OK");
            semihosting::process::exit(EXIT_OK)
        }
        Err(e) => fail(EXIT_RUN, e),
    }
}

/// The tasks each scheduler thread issued, comma-separated.
struct PerThread<'a>(&'a RunStats);

impl Display for PerThread<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        for (i, t) in self.0.threads().iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}", t.issued)?;
        }
        Ok(())
    }
}

/// Why a run did not complete.
enum RunFailure {
    Run(RunError),
    Platform(device_runtime::platform::PlatformError),
    Internal(&'static str),
}

impl Display for RunFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RunFailure::Run(e) => write!(f, "{e}"),
            RunFailure::Platform(e) => write!(f, "platform: {e}"),
            RunFailure::Internal(e) => f.write_str(e),
        }
    }
}

/// Runs `table` with `sched.threads` scheduler threads: this CPU is the
/// dispatcher and thread 0, CPUs 1 .. threads serve the others.
fn run_threads(
    table: &'static Table<'static>,
    arena: Arena<'static>,
    clock: CounterClock,
    options: &RunOptions,
    sched: &SchedConfig,
    fault: Option<Fault>,
) -> Result<RunStats, RunFailure> {
    let threads = sched.threads;
    let slots = &SLOTS[threads - 1];
    let mut schedulers: [Option<Sched>; AICPUS] = [const { None }; AICPUS];
    let mut kinds = [[false; 2]; AICPUS];
    for t in 0..threads {
        let cores = slots.of(t);
        let platform =
            MailboxPlatform::new(&MAILBOXES[cores.clone()], &slots.kind[cores.clone()], clock)
                .map_err(RunFailure::Platform)?;
        let fault =
            fault.and_then(|f| f.on_cores(slots.core[cores.clone()].iter().map(|&c| c as usize)));
        let platform = FaultPlatform::new(platform, fault);
        let platform = Traced::new(platform, t, &slots.core[cores.clone()]);
        let scheduler = Scheduler::new(
            t,
            threads,
            platform,
            &slots.core[cores],
            table,
            arena,
            queues(),
            options,
        )
        .map_err(|e| RunFailure::Run(RunError::Config(e)))?;
        kinds[t] = scheduler.kinds();
        schedulers[t] = Some(scheduler);
    }
    let mut policy = sched
        .policy
        .build()
        .map_err(|e| RunFailure::Run(RunError::Config(ConfigError::Policy(e))))?;
    let mut orch =
        take_orchestrator().ok_or(RunFailure::Internal("the orchestrator is already in use"))?;
    let mut dispatcher = Dispatcher::new(
        table,
        arena,
        options,
        &mut orch,
        queues(),
        &mut policy,
        sched,
        &kinds[..threads],
    )
    .map_err(RunFailure::Run)?;
    let mut leader = schedulers[0]
        .take()
        .ok_or(RunFailure::Internal("no scheduler thread 0"))?;
    for (t, scheduler) in schedulers.iter_mut().enumerate().skip(1) {
        if let Some(scheduler) = scheduler.take() {
            if !handoff(t).give(scheduler) {
                return Err(RunFailure::Internal("a scheduler thread was given twice"));
            }
        }
    }
    let tps = clock.ticks_per_second();
    let start = leader.platform().now();
    let led = drive_leader(&mut dispatcher, &mut leader);
    let end = leader.platform().now();
    leader.platform().record_run(start, end);
    let wall = end.wrapping_sub(start);
    let mut stats = RunStats::collect(&dispatcher, core::slice::from_ref(&leader), tps, wall);
    let mut failure = None;
    for t in 1..threads {
        let (scheduler, error) = handoff(t).wait();
        stats.add_thread(&scheduler);
        if let Some(e) = error {
            failure.get_or_insert(e);
        }
    }
    match (led, failure) {
        (Err(RunError::ThreadFailed), Some(e)) | (Ok(()), Some(e)) | (Err(e), _) => {
            Err(RunFailure::Run(e))
        }
        (Ok(()), None) => Ok(stats),
    }
}

/// CPUs 1..CPUS, called by the boot code with their CPU number.
extern "C" fn secondary_main(cpu: usize) -> ! {
    mmu::record(cpu);
    ONLINE.fetch_or(1 << cpu, Ordering::Release);
    if cpu < AICPUS {
        let runs = PLANNED_RUNS.load(Ordering::Acquire) as usize;
        for _ in 0..runs.min(RUNS) {
            handoff(cpu).serve();
        }
    } else {
        let mailbox = &MAILBOXES[cpu - AICPUS];
        let served = if MODE.wait().empty_kernels() {
            // The measuring mode: every task finishes at once, in 0 cycles.
            serve_with(mailbox, clock::relax, |_, _| 0)
        } else {
            serve(mailbox, clock::relax)
        };
        if served.is_err() {
            defmt::error!("cpu {=usize}: its mailbox is already served", cpu);
        }
    }
    loop {
        // SAFETY: `wfe` only waits for an event: it touches no memory, stack
        // or flags, as the options declare.
        unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) };
    }
}

/// Starts the CPUs a run with `threads` scheduler threads needs (1 ..
/// threads and every worker) and waits until each has come up.
fn start_cpus(clock: &CounterClock, threads: usize) -> Result<(), StartError> {
    if let Some(found) = psci::count_cpus(CPUS) {
        if found < CPUS {
            return Err(StartError::TooFewCpus { found });
        }
    }
    let entry = boot::_start_secondary as *const () as usize as u64;
    let needed = (1..threads).chain(AICPUS..CPUS);
    let mut all = 0u32;
    for cpu in needed {
        // MPIDR affinity of CPU n on `virt` (up to 8 CPUs): Aff0 = n.
        let cpu = cpu as u64;
        // SAFETY: `entry` is `_start_secondary`, which gives the new core
        // its own stack (`.stacks`, indexed by the CPU number in x0) before
        // any Rust code runs; each CPU is started once, by this loop.
        unsafe { psci::cpu_on(cpu, entry, cpu) }
            .map_err(|e| StartError::CpuOn { cpu, error: e })?;
        all |= 1 << cpu;
    }
    let start = clock.now();
    let limit = ONLINE_TIMEOUT_MS * clock.ticks_per_second() / 1000;
    loop {
        let online = ONLINE.load(Ordering::Acquire);
        if online & all == all {
            return Ok(());
        }
        if clock.now().wrapping_sub(start) > limit {
            return Err(StartError::Offline {
                missing: all & !online,
            });
        }
        clock::relax();
    }
}

/// Why the workers did not all come up.
enum StartError {
    /// QEMU started the machine with `found` CPUs, fewer than [`CPUS`].
    TooFewCpus {
        found: usize,
    },
    CpuOn {
        cpu: u64,
        error: psci::PsciError,
    },
    Offline {
        missing: u32,
    },
}

impl Display for StartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            StartError::TooFewCpus { found } => write!(
                f,
                "this firmware needs {CPUS} CPUs ({AICPUS} scheduler threads + {WORKERS} AICores); \
                 QEMU started it with {found}: pass -smp {CPUS}"
            ),
            StartError::CpuOn { cpu, error } => write!(f, "starting cpu {cpu}: {error}"),
            StartError::Offline { missing } => {
                write!(
                    f,
                    "cpus (bit mask) {missing:#x} did not come up within {ONLINE_TIMEOUT_MS} ms"
                )
            }
        }
    }
}

/// Parses the table at [`TABLE_ADDR`]; its header says how long it is.
fn load_table() -> Result<Table<'static>, TableError> {
    // SAFETY: the CPUs only read the table window.
    unsafe { mmu::invalidate(TABLE_ADDR, HEADER_SIZE) };
    // SAFETY: `from_raw_parts` needs the bytes valid, initialized and never
    // written while the `'static` slice lives:
    // 1. Valid: [TABLE_ADDR, +TABLE_MAX) is RAM that the memory map reserves
    //    for the table, clear of the image (the linker keeps it below the
    //    launch block); HEADER_SIZE is far below TABLE_MAX, and u8 needs no
    //    alignment.
    // 2. Initialized: QEMU's loader fills the window before any core starts
    //    (RAM it does not load reads as zeroes).
    // 3. Never written: nothing in the image refers to the window but these
    //    two shared slices.
    let header = unsafe { core::slice::from_raw_parts(TABLE_ADDR as *const u8, HEADER_SIZE) };
    let len = table_len(header)?.min(TABLE_MAX);
    // SAFETY: as above.
    unsafe { mmu::invalidate(TABLE_ADDR, len) };
    // SAFETY: as for `header`: `len` is capped at TABLE_MAX, so the slice
    // stays inside the reserved window (a longer table is reported as
    // truncated by `Table::parse`).
    let bytes = unsafe { core::slice::from_raw_parts(TABLE_ADDR as *const u8, len) };
    Table::parse(bytes)
}

/// The run's options and scheduling from the launch block at
/// [`LAUNCH_ADDR`]: its symbols, 1 to [`AICPUS`] scheduler threads and its
/// dispatch policy; what it does not say (or all of it, without a block) is
/// [`SchedConfig::default`], the default of every runner.
fn load_launch() -> Result<(RunOptions, SchedConfig), LaunchFailure> {
    // SAFETY: the CPUs only read the launch window.
    unsafe { mmu::invalidate(LAUNCH_ADDR, LAUNCH_WINDOW) };
    // SAFETY: `from_raw_parts` needs the bytes valid, initialized and never
    // written while the slice lives:
    // 1. Valid: [LAUNCH_ADDR, +LAUNCH_WINDOW) is RAM that the memory map
    //    reserves for the launch block (the image ends below it), and
    //    LAUNCH_MAX fits the window (asserted above); u8 needs no alignment.
    // 2. Initialized: QEMU's loader fills the window before any core starts
    //    (zeroes if no block was given).
    // 3. Never written: nothing in the image refers to the window but this
    //    shared slice.
    let bytes = unsafe { core::slice::from_raw_parts(LAUNCH_ADDR as *const u8, LAUNCH_MAX) };
    let launch = Launch::parse(bytes).map_err(LaunchFailure::Invalid)?;
    let Some(launch) = launch else {
        return Ok((RunOptions::default(), SchedConfig::default()));
    };
    let threads = launch.threads.unwrap_or(SchedConfig::default().threads);
    if threads > AICPUS {
        return Err(LaunchFailure::Threads(threads));
    }
    let sched = SchedConfig {
        threads,
        policy: launch.policy.unwrap_or(SchedConfig::default().policy),
        ..SchedConfig::default()
    };
    let options = RunOptions {
        symbols: launch.symbols,
        ..RunOptions::default()
    };
    Ok((options, sched))
}

/// Why the launch block cannot be honoured.
enum LaunchFailure {
    Invalid(LaunchError),
    Threads(usize),
}

impl Display for LaunchFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LaunchFailure::Invalid(e) => write!(f, "{e}"),
            LaunchFailure::Threads(n) => write!(
                f,
                "launch block: {n} scheduler threads; this firmware runs 1 to {AICPUS}"
            ),
        }
    }
}

/// Reports `error` as the run's result and exits with `status`.
fn fail(status: i32, error: impl Display) -> ! {
    defmt::error!("RESULT ERROR {}", Display2Format(&error));
    semihosting::process::exit(status)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    if log::held_here() {
        // It panicked while logging: the logger is this CPU's, so say it
        // straight to the semihosting stderr.
        semihosting::eprintln!("firmware {info}");
    } else {
        defmt::error!("firmware {}", Display2Format(info));
    }
    semihosting::process::exit(EXIT_PANIC)
}
