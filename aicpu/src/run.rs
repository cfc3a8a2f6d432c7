//! Init and the server: validating the host's arguments, bringing the
//! cores up, running the table on the launch's threads, shutting down.
//!
//! Init (one thread) validates [`WspAicpuArgs`] and keeps what the run
//! needs in `PREPARED`. Then CANN calls the server on `n` threads; each
//! enters the launch through `GATE` and takes a number from `ARRIVED` (no
//! thread-local storage). Thread 0
//! brings every core up, builds one [`Scheduler`] per scheduler thread
//! over an [`AscendPlatform`] of the cores [`core_owner`] gives it, hands
//! them to threads 1.. through `HANDOFFS`, and runs the dispatcher and
//! scheduler 0 ([`drive_leader`]), as the QEMU firmware does. Once every
//! thread has finished, thread 0 shuts the cores down and writes the
//! result. Threads beyond the scheduler threads return at once.
//!
//! CANN loads the program once per process and makes every launch through
//! the same two entry points, so each Init starts a clean launch: once
//! every server thread of the last launch has left the gate (`device_runtime::ascend::gate`), it
//! puts the per-launch statics back in their first state (the handoffs,
//! the thread numbers and, after a launch that used them, the orchestrator
//! and the queues, see `restore`), whether the last launch succeeded or
//! failed. While a thread of the last launch is still inside, Init answers
//! `WSP_AICPU_BUSY` and changes nothing.

use core::cell::UnsafeCell;
use core::fmt::{self, Display};
use core::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};

use device_runtime::abi::launch::Launch;
use device_runtime::abi::Table;
use device_runtime::ascend::gate::{Busy, Gate};
use device_runtime::ascend::{
    bring_up, shut_down, AscendPlatform, CoreError, CoreLink, Handshake, Payload, PayloadPair,
};
use device_runtime::platform::Clock;
use device_runtime::sched::{
    core_owner, drive_leader, Arena, ConfigError, Dispatcher, Queues, RunError, RunOptions,
    RunStats, SchedConfig, Scheduler, TableOrchestrator, MAX_THREADS,
};
use wsp_ffi::CoreKind;

use crate::args::*;
use crate::clock::AicpuClock;
use crate::text::report;

/// Most AICores one run drives (a 910B has 24 cube and 48 vector cores).
pub const MAX_AICORES: usize = 128;

/// The payload buffers, two per core (128 KiB); the handshake records
/// point the AICores at them.
struct Payloads(core::cell::UnsafeCell<[PayloadPair; MAX_AICORES]>);
// SAFETY: each core's pair is written by the one platform driving that
// core (and its result words by the AICore), under the handshake's
// protocol; nothing else touches them.
unsafe impl Sync for Payloads {}
static PAYLOADS: Payloads = Payloads(core::cell::UnsafeCell::new(
    [[const { Payload::zeroed() }; 2]; MAX_AICORES],
));

/// What Init validated, for the server.
struct Prepared {
    args: *mut WspAicpuArgs,
    table: Table<'static>,
    arena: *mut u8,
    arena_len: usize,
    options: RunOptions,
    sched: SchedConfig,
    kernels: &'static [u64],
    /// Per scheduler thread, the kinds of its cores (in `core_owner`'s
    /// order); a platform borrows them for the launch.
    kinds: [heapless::Vec<CoreKind, MAX_AICORES>; MAX_THREADS],
    cores: usize,
    handshakes: *mut Handshake,
    regs: &'static [u64],
    timeout_us: u32,
}
// SAFETY: the pointers are the host's device memory, valid for the whole
// launch (the entry points' contract); the server threads read `Prepared`
// and only thread 0 writes through `args` (the result).
unsafe impl Send for Prepared {}
// SAFETY: as above.
unsafe impl Sync for Prepared {}

/// Which launch the server threads may enter and how many are inside.
static GATE: Gate = Gate::new();
/// The launch Init prepared.
static PREPARED: PreparedCell = PreparedCell(UnsafeCell::new(None));
/// Server threads of this launch arrived so far: each one's number.
static ARRIVED: AtomicU32 = AtomicU32::new(0);
/// Whether a launch has used the orchestrator and the queues since Init
/// last put them back in their first state.
static USED: AtomicBool = AtomicBool::new(false);
/// The arguments of the current launch, for the panic handler.
pub static ARGS: AtomicPtr<WspAicpuArgs> = AtomicPtr::new(core::ptr::null_mut());

static QUEUES: QueuesCell = QueuesCell(UnsafeCell::new(Queues::new()));
static ORCHESTRATOR: spin::Mutex<TableOrchestrator> =
    spin::Mutex::new(TableOrchestrator::for_tables());

/// [`PREPARED`]: written by Init only while it holds the gate (no server
/// thread inside), read by the server threads only while they are inside.
struct PreparedCell(UnsafeCell<Option<Prepared>>);
// SAFETY: the gate orders Init's write before every server thread's reads
// (its Release when it opens, their Acquire when they enter) and keeps
// Init from writing while a server thread is inside.
unsafe impl Sync for PreparedCell {}

/// [`QUEUES`]: shared by the threads of a launch (the queues synchronize
/// their own fields), replaced by Init between launches.
struct QueuesCell(UnsafeCell<Queues>);
// SAFETY: as for `PreparedCell`: shared references are made only by
// server threads inside the gate; Init writes only while it holds it.
unsafe impl Sync for QueuesCell {}

/// The launch's queues, for a server thread inside the gate.
fn queues() -> &'static Queues {
    // SAFETY: a shared reference, used by the launch's threads (through
    // its schedulers and dispatcher, all dropped before thread 0 leaves the
    // gate); `restore` writes the queues only while no thread is inside.
    unsafe { &*QUEUES.0.get() }
}

/// Puts the orchestrator and the queues back in their first state, in
/// place, whatever the last launch left in them (`Orchestrator::reset`,
/// `Queues::reset`): after a launch that finished, only their small
/// fields and the TensorMap's bucket heads and cell shapes (about 56 KiB)
/// are rewritten, since every task slot, TensorMap entry, release-graph
/// slot, queue slot and task record is written for a task before anything
/// reads it; after one that failed part way, also the slots of the tasks
/// it left in flight. Assigning `Queues::new()` (or
/// `TableOrchestrator::for_tables()`) would build a temporary of several
/// hundred KiB on the calling thread's stack, which an AICPU thread may
/// not have.
///
/// # Safety
/// The caller holds the gate for Init: no server thread is inside, so
/// nothing uses the queues or the orchestrator (every scheduler and
/// dispatcher of the last launch was dropped before its thread left).
unsafe fn restore() -> Result<(), InitError> {
    let mut orch = ORCHESTRATOR.try_lock().ok_or(InitError::Internal(
        "the orchestrator is locked between launches",
    ))?;
    // SAFETY: the caller's contract: no thread inside the gate, so no
    // other reference to the queues exists while this one lives.
    let queues = unsafe { &mut *QUEUES.0.get() };
    queues.reset();
    orch.reset();
    Ok(())
}

type Sched = Scheduler<'static, AscendPlatform<'static, AicpuClock>>;

/// Scheduler `t`, handed from thread 0 to thread `t` and back (the
/// firmware's handoff); emptied by Init for each launch.
struct Handoff {
    slot: spin::Mutex<Slot>,
}

enum Slot {
    Empty,
    Given(Sched),
    /// Thread `t` is serving.
    Taken,
    /// Thread `t` has served: its scheduler and its error, for thread 0.
    Served(Sched, Option<RunError>),
    /// Thread 0 took the scheduler back.
    Collected,
    /// Thread 0 failed before the run: nothing will be given.
    Cancelled,
}

static HANDOFFS: [Handoff; MAX_THREADS] = [const {
    Handoff {
        slot: spin::Mutex::new(Slot::Empty),
    }
}; MAX_THREADS];

/// Why Init refused the arguments.
enum InitError {
    Args(&'static str),
    Table(device_runtime::abi::TableError),
    Launch(device_runtime::abi::launch::LaunchError),
    Threads { threads: usize, launched: u32 },
    Kind { core: usize, value: u32 },
    Busy(Busy),
    Internal(&'static str),
}

impl InitError {
    fn status(&self) -> i32 {
        match self {
            InitError::Args(_) | InitError::Kind { .. } => WSP_AICPU_BAD_ARGS,
            InitError::Table(_) => WSP_AICPU_BAD_TABLE,
            InitError::Launch(_) | InitError::Threads { .. } => WSP_AICPU_BAD_LAUNCH,
            InitError::Busy(_) => WSP_AICPU_BUSY,
            InitError::Internal(_) => WSP_AICPU_INTERNAL,
        }
    }
}

impl Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InitError::Args(e) => write!(f, "WspAicpuArgs: {e}"),
            InitError::Table(e) => write!(f, "descriptor table: {e}"),
            InitError::Launch(e) => write!(f, "launch block: {e}"),
            InitError::Threads { threads, launched } => write!(
                f,
                "launch block: {threads} scheduler threads, but the server runs on {launched} \
                 (and at most {MAX_THREADS})"
            ),
            InitError::Kind { core, value } => {
                write!(
                    f,
                    "WspAicpuArgs: core {core} has kind {value} (0 cube, 1 vector)"
                )
            }
            InitError::Busy(Busy::Inside(n)) => write!(
                f,
                "{n} server thread(s) of the previous launch are still running; \
                 Init must wait until every server call of that launch has returned"
            ),
            InitError::Busy(Busy::Preparing) => f.write_str(
                "another Init is running; Init must not be called on two threads at once",
            ),
            InitError::Internal(e) => f.write_str(e),
        }
    }
}

/// A slice of `len` `T`s at `ptr`, or an error naming `what`.
///
/// # Safety
/// A non-null `ptr` points to `len` initialized `T`s that stay valid and
/// unwritten for the rest of the launch.
unsafe fn host_slice<T>(
    ptr: *const T,
    len: u64,
    what: &'static str,
) -> Result<&'static [T], InitError> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(InitError::Args(what));
    }
    if !(ptr as usize).is_multiple_of(core::mem::align_of::<T>()) {
        return Err(InitError::Args(what));
    }
    let len = usize::try_from(len).map_err(|_| InitError::Args(what))?;
    if len
        .checked_mul(core::mem::size_of::<T>())
        .is_none_or(|b| b > isize::MAX as usize)
    {
        return Err(InitError::Args(what));
    }
    crate::cache::invalidate(ptr as *const u8, len * core::mem::size_of::<T>());
    // SAFETY: the caller's contract; non-null, aligned and not too long,
    // checked above.
    Ok(unsafe { core::slice::from_raw_parts(ptr, len) })
}

/// Init's work. Returns the status it also writes into the arguments.
///
/// # Safety
/// The entry points' contract ([`crate::DynTileFwkBackendKernelServerInit`]).
pub unsafe fn init(kernel_args: *mut core::ffi::c_void) -> i32 {
    if kernel_args.is_null() {
        return WSP_AICPU_BAD_ARGS;
    }
    let kernel_args = kernel_args as *const WspCannKernelArgs;
    // SAFETY: the contract: CANN's 144-byte KernelArgs (its alignment is
    // CANN's, 8).
    let kernel_args = unsafe { kernel_args.read_unaligned() };
    let args = kernel_args.runtime_args;
    if args.is_null() || !(args as usize).is_multiple_of(core::mem::align_of::<WspAicpuArgs>()) {
        return WSP_AICPU_BAD_ARGS;
    }
    crate::cache::invalidate(args as *const u8, core::mem::size_of::<WspAicpuArgs>());
    // SAFETY: the contract: `runtime_args` points to the host's
    // WspAicpuArgs (aligned, checked), which nothing else writes during
    // the launch; only `result` is written, by this thread now.
    let (fields, result) = unsafe { (args.read(), &mut (*args).result) };
    if let Err(busy) = GATE.begin_init() {
        // The launch in progress keeps its statics, `ARGS` and, when the
        // host passed the same arguments again, the result it is writing.
        if args != ARGS.load(Ordering::Acquire) {
            let e = InitError::Busy(busy);
            report(result, e.status(), e);
        }
        return WSP_AICPU_BUSY;
    }
    result.tasks = 0;
    result.wall_ticks = 0;
    result.ticks_per_second = AicpuClock::new().ticks_per_second();
    ARGS.store(args, Ordering::Release);
    // SAFETY: as above for every host pointer in `fields` and `regs`.
    let prepared = unsafe { prepare(args, &fields, kernel_args.regs) };
    // SAFETY: this thread holds the gate (no server thread inside).
    let started = prepared.and_then(|prepared| unsafe { start(prepared) });
    GATE.end_init(started.is_ok());
    match started {
        Ok(()) => {
            report(result, WSP_AICPU_OK, "");
            WSP_AICPU_OK
        }
        Err(e) => {
            let status = e.status();
            report(result, status, e);
            status
        }
    }
}

/// Makes `prepared` the launch: the per-launch statics in their first
/// state, whatever the last launch left (a failed launch leaves its queues
/// aborted and its handoffs cancelled).
///
/// # Safety
/// The caller holds the gate for Init ([`Gate::begin_init`]).
unsafe fn start(prepared: Prepared) -> Result<(), InitError> {
    if USED.load(Ordering::Acquire) {
        // SAFETY: the caller holds the gate.
        unsafe { restore() }?;
        USED.store(false, Ordering::Release);
    }
    for handoff in &HANDOFFS {
        handoff.reset();
    }
    ARRIVED.store(0, Ordering::Release);
    // SAFETY: the caller holds the gate: no server thread is inside, so
    // none holds a reference into `PREPARED` (thread 0 dropped every
    // scheduler that borrowed from it before it left).
    unsafe { *PREPARED.0.get() = Some(prepared) };
    Ok(())
}

/// # Safety
/// Every pointer in `a` (and `regs`) is null or as its field documents.
unsafe fn prepare(
    args: *mut WspAicpuArgs,
    a: &WspAicpuArgs,
    regs: *const u64,
) -> Result<Prepared, InitError> {
    if a.magic != WSP_AICPU_MAGIC {
        return Err(InitError::Args("bad magic (not WSP_AICPU_MAGIC)"));
    }
    if a.version != WSP_AICPU_VERSION {
        return Err(InitError::Args(
            "unsupported version (this program reads WSP_AICPU_VERSION 1)",
        ));
    }
    if a.size as usize != core::mem::size_of::<WspAicpuArgs>() {
        return Err(InitError::Args(
            "size is not sizeof(WspAicpuArgs) of this program",
        ));
    }
    if a.aicpu_threads == 0 {
        return Err(InitError::Args("aicpu_threads is 0"));
    }
    if a.table.is_null() || a.table_len == 0 {
        return Err(InitError::Args(
            "no descriptor table (table is null or table_len 0)",
        ));
    }
    // SAFETY: the caller's contract, per field.
    let table = unsafe { host_slice(a.table, a.table_len, "table is unusable") }?;
    let table = Table::parse(table).map_err(InitError::Table)?;
    let arena_len =
        usize::try_from(a.arena_len).map_err(|_| InitError::Args("arena_len too large"))?;
    if a.arena.is_null() && arena_len > 0 {
        return Err(InitError::Args("arena is null with a nonzero arena_len"));
    }
    // SAFETY: as above.
    let launch = unsafe {
        host_slice(
            a.launch,
            a.launch_len,
            "launch is null with a nonzero launch_len",
        )
    }?;
    // No block (a zero length, null or not) means the defaults.
    let parsed = if launch.is_empty() {
        None
    } else {
        Launch::parse(launch).map_err(InitError::Launch)?
    };
    // Threads the launch does not choose: the runners' default, but no
    // more than the server runs on.
    let default_threads = SchedConfig::default()
        .threads
        .min(a.aicpu_threads as usize)
        .max(1);
    let (options, sched) = match parsed {
        None => (
            RunOptions::default(),
            SchedConfig {
                threads: default_threads,
                ..SchedConfig::default()
            },
        ),
        Some(l) => {
            let sched = SchedConfig {
                threads: l.threads.unwrap_or(default_threads),
                policy: l.policy.unwrap_or(SchedConfig::default().policy),
                ..SchedConfig::default()
            };
            (
                RunOptions {
                    symbols: l.symbols,
                    ..RunOptions::default()
                },
                sched,
            )
        }
    };
    if sched.threads == 0 || sched.threads > a.aicpu_threads as usize || sched.threads > MAX_THREADS
    {
        return Err(InitError::Threads {
            threads: sched.threads,
            launched: a.aicpu_threads,
        });
    }
    // SAFETY: as above.
    let kernels = unsafe {
        host_slice(
            a.kernel_addrs,
            u64::from(a.num_kernels),
            "kernel_addrs is null with nonzero num_kernels",
        )
    }?;
    let cores = a.num_cores as usize;
    if cores == 0 || cores > MAX_AICORES {
        return Err(InitError::Args("num_cores is 0 or above the program's 128"));
    }
    // SAFETY: as above.
    let kind_values =
        unsafe { host_slice(a.core_kinds, u64::from(a.num_cores), "core_kinds is null") }?;
    let mut kinds = [const { heapless::Vec::<CoreKind, MAX_AICORES>::new() }; MAX_THREADS];
    for (core, &value) in kind_values.iter().enumerate() {
        let kind = CoreKind::from_u32(value).ok_or(InitError::Kind { core, value })?;
        // Cannot fail: at most MAX_AICORES cores in all.
        let _ = kinds[core_owner(core, sched.threads)].push(kind);
    }
    if a.handshakes.is_null() || !(a.handshakes as usize).is_multiple_of(64) {
        return Err(InitError::Args("handshakes is null or not 64-byte aligned"));
    }
    // SAFETY: as above (KernelArgs.regs, `num_regs` entries).
    let regs = unsafe { host_slice(regs, u64::from(a.num_regs), "KernelArgs.regs is null") }?;
    if regs.is_empty() {
        return Err(InitError::Args("num_regs is 0: no register table"));
    }
    Ok(Prepared {
        args,
        table,
        arena: a.arena,
        arena_len,
        options,
        sched,
        kernels,
        kinds,
        cores,
        handshakes: a.handshakes,
        regs,
        timeout_us: if a.timeout_us == 0 {
            WSP_AICPU_DEFAULT_TIMEOUT_US
        } else {
            a.timeout_us
        },
    })
}

/// Why the server's run failed.
enum Failure {
    Core(CoreError),
    Platform(device_runtime::ascend::AscendError),
    Run(RunError),
    Internal(&'static str),
}

impl Failure {
    fn status(&self) -> i32 {
        match self {
            Failure::Core(_) | Failure::Platform(_) => WSP_AICPU_CORE,
            Failure::Run(_) => WSP_AICPU_RUN,
            Failure::Internal(_) => WSP_AICPU_INTERNAL,
        }
    }
}

impl Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Core(e) => write!(f, "{e}"),
            Failure::Platform(e) => write!(f, "platform: {e}"),
            Failure::Run(e) => write!(f, "{e}"),
            Failure::Internal(e) => f.write_str(e),
        }
    }
}

/// The server's work on one thread; its status.
pub fn server() -> i32 {
    if !GATE.enter() {
        return WSP_AICPU_NOT_INITIALIZED;
    }
    let status = serve_launch();
    // After this thread's last use of the launch's statics (thread 0's
    // schedulers are dropped by now).
    GATE.leave();
    status
}

/// [`server`] inside the gate.
fn serve_launch() -> i32 {
    // SAFETY: this thread is inside the gate: Init wrote `PREPARED` (Some,
    // as the gate is open only after a successful Init) before it opened
    // the gate and writes it again only when every thread has left.
    let Some(prepared) = (unsafe { (*PREPARED.0.get()).as_ref() }) else {
        return WSP_AICPU_NOT_INITIALIZED;
    };
    let me = ARRIVED.fetch_add(1, Ordering::AcqRel) as usize;
    let threads = prepared.sched.threads;
    if me >= threads {
        return WSP_AICPU_OK;
    }
    if me > 0 {
        return HANDOFFS[me].serve();
    }
    USED.store(true, Ordering::Release);
    let clock = AicpuClock::new();
    let limit = u64::from(prepared.timeout_us) * clock.ticks_per_second() / 1_000_000;
    let mut links = [const { None::<CoreLink> }; MAX_AICORES];
    let outcome = lead(prepared, clock, limit, &mut links);
    // Cancel the handoffs that were never given (a failure before the run).
    for handoff in &HANDOFFS[1..threads] {
        handoff.cancel();
    }
    let up: heapless::Vec<CoreLink, MAX_AICORES> = links.iter().flatten().copied().collect();
    let down = shut_down(&up, &clock, limit);
    // SAFETY: Init checked `args`; during the server only thread 0 (this
    // one) writes its result.
    let result = unsafe { &mut (*prepared.args).result };
    result.ticks_per_second = clock.ticks_per_second();
    let failure = match (outcome, down) {
        (Ok(stats), Ok(())) => {
            result.tasks = stats.tasks;
            result.wall_ticks = stats.wall_ticks;
            report(result, WSP_AICPU_OK, "");
            return WSP_AICPU_OK;
        }
        (Err(e), _) => e,
        (Ok(_), Err(e)) => Failure::Core(e),
    };
    let status = failure.status();
    report(result, status, failure);
    status
}

/// Thread 0: brings the cores up (recording them in `links` for the
/// shut-down), runs the table, collects every thread's figures.
fn lead(
    p: &'static Prepared,
    clock: AicpuClock,
    limit: u64,
    links: &mut [Option<CoreLink>; MAX_AICORES],
) -> Result<RunStats, Failure> {
    let threads = p.sched.threads;
    let payloads = PAYLOADS.0.get() as *mut PayloadPair;
    let mut all = [const { None::<CoreLink> }; MAX_AICORES];
    let mut up: heapless::Vec<CoreLink, MAX_AICORES> = heapless::Vec::new();
    for core in 0..p.cores {
        // SAFETY: Init checked `handshakes` (non-null, 64-aligned, one record
        // per core, the host's device memory for the launch); the payload
        // pairs are this program's statics, one per core, driven by one
        // platform each.
        let link = unsafe { CoreLink::new(p.handshakes.add(core), payloads.add(core)) };
        up.push(link)
            .map_err(|_| Failure::Internal("more cores than MAX_AICORES"))?;
    }
    // SAFETY: the register table is CANN's (`KernelArgs.regs`): entry `i`
    // is physical core `i`'s register base.
    let brought = unsafe { bring_up(&mut up, p.regs, &clock, limit) };
    for (core, link) in up.iter().enumerate() {
        if link.regs().is_some() {
            links[core] = Some(*link);
        }
        all[core] = Some(*link);
    }
    brought.map_err(Failure::Core)?;
    let arena: &'static mut [u8] = if p.arena_len == 0 {
        &mut []
    } else {
        crate::cache::invalidate(p.arena, p.arena_len);
        // SAFETY: Init checked the arena (non-null when non-empty; its
        // length fits a usize); the host leaves it to the run until the
        // server returns, and this is the only slice made of it: tensor
        // views for the kernels come from it under `launch`'s contract.
        unsafe { core::slice::from_raw_parts_mut(p.arena, p.arena_len) }
    };
    let arena = Arena::new(arena);
    let mut schedulers: [Option<Sched>; MAX_THREADS] = [const { None }; MAX_THREADS];
    let mut kinds = [[false; 2]; MAX_THREADS];
    for (t, slot) in schedulers.iter_mut().enumerate().take(threads) {
        let mut mine: heapless::Vec<CoreLink, MAX_AICORES> = heapless::Vec::new();
        let mut global: heapless::Vec<u16, MAX_AICORES> = heapless::Vec::new();
        for core in (0..p.cores).filter(|&c| core_owner(c, threads) == t) {
            let link = all[core].ok_or(Failure::Internal("a core has no link"))?;
            let _ = mine.push(link);
            let _ = global.push(core as u16);
        }
        // SAFETY: each core is in exactly one thread's set (`core_owner`),
        // so one platform drives it.
        let platform = unsafe { AscendPlatform::new(&mine, &p.kinds[t], p.kernels, clock) }
            .map_err(Failure::Platform)?;
        let scheduler = Scheduler::new(
            t,
            threads,
            platform,
            &global,
            &p.table,
            arena,
            queues(),
            &p.options,
        )
        .map_err(|e| Failure::Run(RunError::Config(e)))?;
        kinds[t] = scheduler.kinds();
        *slot = Some(scheduler);
    }
    let mut policy = p
        .sched
        .policy
        .build()
        .map_err(|e| Failure::Run(RunError::Config(ConfigError::Policy(e))))?;
    let mut orch = ORCHESTRATOR
        .try_lock()
        .ok_or(Failure::Internal("the orchestrator is in use"))?;
    let mut dispatcher = Dispatcher::new(
        &p.table,
        arena,
        &p.options,
        &mut orch,
        queues(),
        &mut policy,
        &p.sched,
        &kinds[..threads],
    )
    .map_err(Failure::Run)?;
    let mut leader = schedulers[0]
        .take()
        .ok_or(Failure::Internal("no scheduler thread 0"))?;
    for (t, scheduler) in schedulers.iter_mut().enumerate().skip(1) {
        if let Some(scheduler) = scheduler.take() {
            if !HANDOFFS[t].give(scheduler) {
                return Err(Failure::Internal("a scheduler thread was given twice"));
            }
        }
    }
    let tps = clock.ticks_per_second();
    let start = clock.now();
    let led = drive_leader(&mut dispatcher, &mut leader);
    let wall = clock.now().wrapping_sub(start);
    let mut stats = RunStats::collect(&dispatcher, core::slice::from_ref(&leader), tps, wall);
    let mut failure = None;
    for handoff in &HANDOFFS[1..threads] {
        let (scheduler, error) = handoff.wait();
        stats.add_thread(&scheduler);
        if let Some(e) = error {
            failure.get_or_insert(e);
        }
    }
    match (led, failure) {
        (Err(RunError::ThreadFailed), Some(e)) | (Ok(()), Some(e)) | (Err(e), _) => {
            Err(Failure::Run(e))
        }
        (Ok(()), None) => Ok(stats),
    }
}

impl Handoff {
    /// Init: empty for the next launch. A scheduler left here (none is
    /// once the last launch's thread 0 has returned) is forgotten, not
    /// dropped: its queue ends belong to queues that are being reset.
    fn reset(&self) {
        let old = core::mem::replace(&mut *self.slot.lock(), Slot::Empty);
        core::mem::forget(old);
    }

    fn give(&self, sched: Sched) -> bool {
        let mut slot = self.slot.lock();
        if !matches!(*slot, Slot::Empty) {
            return false;
        }
        *slot = Slot::Given(sched);
        true
    }

    /// Thread 0, after its run or its failure: a thread still waiting
    /// for a scheduler gets none and returns.
    fn cancel(&self) {
        let mut slot = self.slot.lock();
        if matches!(*slot, Slot::Empty) {
            *slot = Slot::Cancelled;
        }
    }

    /// Thread `t`: waits for its scheduler, serves the run, hands it back.
    fn serve(&self) -> i32 {
        let clock = AicpuClock::new();
        let mut sched = loop {
            let mut slot = self.slot.lock();
            match core::mem::replace(&mut *slot, Slot::Taken) {
                Slot::Given(sched) => break sched,
                Slot::Cancelled => {
                    *slot = Slot::Cancelled;
                    return WSP_AICPU_OK;
                }
                other => *slot = other,
            }
            drop(slot);
            clock.relax();
        };
        let result = sched.serve().err();
        let status = if result.is_some() {
            WSP_AICPU_RUN
        } else {
            WSP_AICPU_OK
        };
        *self.slot.lock() = Slot::Served(sched, result);
        status
    }

    /// Thread 0: waits for thread `t` to have served, takes its scheduler
    /// back (to be dropped before thread 0 leaves the gate).
    fn wait(&self) -> (Sched, Option<RunError>) {
        let clock = AicpuClock::new();
        loop {
            let mut slot = self.slot.lock();
            match core::mem::replace(&mut *slot, Slot::Collected) {
                Slot::Served(sched, error) => return (sched, error),
                other => *slot = other,
            }
            drop(slot);
            clock.relax();
        }
    }
}
