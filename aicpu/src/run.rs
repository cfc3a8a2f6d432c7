//! Init and the server: validating the host's arguments, bringing the
//! cores up, running the table on the launch's threads, shutting down.
//!
//! Init (one thread) validates [`WspAicpuArgs`] and keeps what the run
//! needs in [`PREPARED`]. Then CANN calls the server on `n` threads; each
//! takes a number from [`ARRIVED`] (no thread-local storage). Thread 0
//! brings every core up, builds one [`Scheduler`] per scheduler thread
//! over an [`AscendPlatform`] of the cores [`core_owner`] gives it, hands
//! them to threads 1.. through [`HANDOFFS`], and runs the dispatcher and
//! scheduler 0 ([`drive_leader`]), as the QEMU firmware does. Once every
//! thread has finished, thread 0 shuts the cores down and writes the
//! result. Threads beyond the scheduler threads return at once.
//!
//! The program runs one table per load: the orchestrator and the queues
//! are statics used once (a second Init reports an error).

use core::fmt::{self, Display};
use core::sync::atomic::{AtomicPtr, AtomicU32, Ordering};

use device_runtime::abi::launch::Launch;
use device_runtime::abi::Table;
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
#[derive(Clone, Copy)]
struct Prepared {
    args: *mut WspAicpuArgs,
    table: Table<'static>,
    arena: *mut u8,
    arena_len: usize,
    options: RunOptions,
    sched: SchedConfig,
    kernels: &'static [u64],
    kinds: [CoreKind; MAX_AICORES],
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

static PREPARED: spin::Once<Prepared> = spin::Once::new();
/// Server threads arrived so far: each one's number.
static ARRIVED: AtomicU32 = AtomicU32::new(0);
/// The arguments of the current launch, for the panic handler.
pub static ARGS: AtomicPtr<WspAicpuArgs> = AtomicPtr::new(core::ptr::null_mut());

static QUEUES: Queues = Queues::new();
static ORCHESTRATOR: spin::Mutex<TableOrchestrator> =
    spin::Mutex::new(TableOrchestrator::for_tables());

type Sched = Scheduler<'static, AscendPlatform<'static, AicpuClock>>;

/// Scheduler `t`, handed from thread 0 to thread `t` and back (the
/// firmware's handoff).
struct Handoff {
    slot: spin::Mutex<Slot>,
    served: spin::Once<(Sched, Option<RunError>)>,
}

enum Slot {
    Empty,
    Given(Sched),
    Taken,
    /// Thread 0 failed before the run: nothing will be given.
    Cancelled,
}

static HANDOFFS: [Handoff; MAX_THREADS] = [const {
    Handoff {
        slot: spin::Mutex::new(Slot::Empty),
        served: spin::Once::new(),
    }
}; MAX_THREADS];

/// Why Init refused the arguments.
enum InitError {
    Args(&'static str),
    Table(device_runtime::abi::TableError),
    Launch(device_runtime::abi::launch::LaunchError),
    Threads { threads: usize, launched: u32 },
    Kind { core: usize, value: u32 },
    Once,
}

impl InitError {
    fn status(&self) -> i32 {
        match self {
            InitError::Args(_) | InitError::Kind { .. } => WSP_AICPU_BAD_ARGS,
            InitError::Table(_) => WSP_AICPU_BAD_TABLE,
            InitError::Launch(_) | InitError::Threads { .. } => WSP_AICPU_BAD_LAUNCH,
            InitError::Once => WSP_AICPU_INTERNAL,
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
            InitError::Once => f.write_str(
                "this program runs one table per load (Init was already called in this process)",
            ),
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
    ARGS.store(args, Ordering::Release);
    // SAFETY: the contract: `runtime_args` points to the host's
    // WspAicpuArgs (aligned, checked), which nothing else writes during
    // the launch; only `result` is written, by this thread now.
    let (fields, result) = unsafe { (args.read(), &mut (*args).result) };
    result.tasks = 0;
    result.wall_ticks = 0;
    result.ticks_per_second = AicpuClock::new().ticks_per_second();
    // SAFETY: as above for every host pointer in `fields` and `regs`.
    match unsafe { prepare(args, &fields, kernel_args.regs) } {
        Ok(prepared) => {
            let mut fresh = false;
            PREPARED.call_once(|| {
                fresh = true;
                prepared
            });
            if !fresh {
                report(result, WSP_AICPU_INTERNAL, InitError::Once);
                return WSP_AICPU_INTERNAL;
            }
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
    let mut kinds = [CoreKind::Cube; MAX_AICORES];
    for (core, &value) in kind_values.iter().enumerate() {
        kinds[core] = CoreKind::from_u32(value).ok_or(InitError::Kind { core, value })?;
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
    let Some(prepared) = PREPARED.get() else {
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
        let mut my_kinds: heapless::Vec<CoreKind, MAX_AICORES> = heapless::Vec::new();
        for core in (0..p.cores).filter(|&c| core_owner(c, threads) == t) {
            let link = all[core].ok_or(Failure::Internal("a core has no link"))?;
            let _ = mine.push(link);
            let _ = global.push(core as u16);
            let _ = my_kinds.push(p.kinds[core]);
        }
        let kinds_ref: &'static [CoreKind] = leak_kinds(t, &my_kinds);
        // SAFETY: each core is in exactly one thread's set (`core_owner`),
        // so one platform drives it.
        let platform = unsafe { AscendPlatform::new(&mine, kinds_ref, p.kernels, clock) }
            .map_err(Failure::Platform)?;
        let scheduler = Scheduler::new(
            t, threads, platform, &global, &p.table, arena, &QUEUES, &p.options,
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
        &QUEUES,
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
        stats.add_thread(scheduler);
        if let Some(e) = error {
            failure.get_or_insert(*e);
        }
    }
    match (led, failure) {
        (Err(RunError::ThreadFailed), Some(e)) | (Ok(()), Some(e)) | (Err(e), _) => {
            Err(Failure::Run(e))
        }
        (Ok(()), None) => Ok(stats),
    }
}

/// Per scheduler thread, the kinds of its cores, kept for the run (a
/// platform borrows them for `'static`).
fn leak_kinds(t: usize, kinds: &[CoreKind]) -> &'static [CoreKind] {
    static KINDS: [spin::Once<heapless::Vec<CoreKind, MAX_AICORES>>; MAX_THREADS] =
        [const { spin::Once::new() }; MAX_THREADS];
    KINDS[t].call_once(|| kinds.iter().copied().collect())
}

impl Handoff {
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
        self.served.call_once(|| (sched, result));
        status
    }

    fn wait(&self) -> &(Sched, Option<RunError>) {
        let clock = AicpuClock::new();
        loop {
            if let Some(served) = self.served.get() {
                return served;
            }
            clock.relax();
        }
    }
}
