//! The pto-wsp firmware for QEMU `virt` (aarch64, 4 cores, 512 MiB).
//!
//! Core 0 plays the AICPU: it starts the other cores, validates the
//! descriptor table the host loaded at [`TABLE_ADDR`], reads the launch
//! block at [`LAUNCH_ADDR`] (the program's symbols; see
//! [`device_runtime::abi::launch`]; all zeroes, as when the host loads none,
//! bind nothing), runs the table with the device runtime against the data
//! arena at [`ARENA_ADDR`] and reports over semihosting. Cores 1-3 play AICores: each serves its mailbox, running the
//! kernels core 0 issues to it, until core 0 shuts it down. Their kinds are
//! fixed by [`KINDS`].
//!
//! Output (semihosting stdout): on success the run's statistics
//! (`tasks=.. wall_us=.. cycles=.. per_core=..`, tasks per core) and
//! `RESULT OK`, on failure `RESULT ERROR <reason>`. On success the arena is
//! written to the semihosting file `arena.out` (QEMU's working directory).
//!
//! Exit status: 0 success, 1 runtime error (cores, platform, run, writing
//! `arena.out`), 2 invalid table, 3 CPU exception ([`boot::EXIT_EXCEPTION`]),
//! 4 invalid launch block, 101 panic.
#![no_std]
#![no_main]
#![forbid(unsafe_op_in_unsafe_fn)]

mod boot;
mod clock;
mod psci;

use core::fmt::Display;
use core::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use device_runtime::abi::launch::{Launch, LaunchError, LAUNCH_MAX};
use device_runtime::abi::{table_len, Table, TableError, HEADER_SIZE};
use device_runtime::exec::{run, RunOptions, TableOrchestrator};
use device_runtime::mailbox::{serve, CoreMailbox};
use device_runtime::platform::{Clock, MailboxPlatform};
use device_runtime::sched::PolicyKind;
use semihosting::println;
use wsp_ffi::CoreKind;

use crate::clock::CounterClock;

/// Where the host loads the descriptor table, and its largest size.
const TABLE_ADDR: usize = 0x4800_0000;
const TABLE_MAX: usize = 16 << 20;
/// Where the host loads the launch block (the 4 KiB below the table).
const LAUNCH_ADDR: usize = 0x47ff_f000;
/// Where the host loads the data arena; it may reach the end of RAM.
const ARENA_ADDR: usize = 0x4900_0000;
const ARENA_MAX: usize = 0x6000_0000 - ARENA_ADDR;

const EXIT_OK: i32 = 0;
const EXIT_RUN: i32 = 1;
const EXIT_TABLE: i32 = 2;
const EXIT_LAUNCH: i32 = 4;
const EXIT_PANIC: i32 = 101;

/// Cores that run kernels: 1..CORES. Runtime core `i` is CPU `i + 1`.
const WORKERS: usize = boot::CORES - 1;
/// The kind of each worker: CPUs 1 and 2 are cube cores, CPU 3 a vector core.
static KINDS: [CoreKind; WORKERS] = [CoreKind::Cube, CoreKind::Cube, CoreKind::Vector];
/// One mailbox per worker, indexed like [`KINDS`].
static MAILBOXES: [CoreMailbox; WORKERS] = [const { CoreMailbox::new() }; WORKERS];
/// The orchestrator of core 0 (about 120 KiB: too large for its stack).
static ORCHESTRATOR: OrchestratorCell = OrchestratorCell {
    cell: core::cell::UnsafeCell::new(TableOrchestrator::for_tables()),
    taken: AtomicBool::new(false),
};

/// The orchestrator's static home, handed out once by [`take_orchestrator`].
struct OrchestratorCell {
    cell: core::cell::UnsafeCell<TableOrchestrator>,
    taken: AtomicBool,
}

// SAFETY: the cell is only reached through `take_orchestrator`, which hands
// out its one `&mut` at most once (guarded by the atomic flag).
unsafe impl Sync for OrchestratorCell {}

/// The orchestrator, the first time; `None` after that.
fn take_orchestrator() -> Option<&'static mut TableOrchestrator> {
    if ORCHESTRATOR.taken.swap(true, Ordering::AcqRel) {
        return None;
    }
    // SAFETY: the flag above makes this the only reference ever created.
    Some(unsafe { &mut *ORCHESTRATOR.cell.get() })
}

/// Bit `cpu` is set once that CPU is up and about to serve its mailbox.
static ONLINE: AtomicU32 = AtomicU32::new(0);
/// How long core 0 waits for the workers to come up.
const ONLINE_TIMEOUT_MS: u64 = 1000;

/// Core 0, called by the boot code with a stack, FP on and `.bss` zeroed.
extern "C" fn primary_main() -> ! {
    let clock = CounterClock::new();
    if let Err(e) = start_workers(&clock) {
        fail(EXIT_RUN, e);
    }
    let table = match load_table() {
        Ok(table) => table,
        Err(e) => fail(EXIT_TABLE, e),
    };
    let options = match load_launch() {
        Ok(options) => options,
        Err(e) => fail(EXIT_LAUNCH, e),
    };
    let arena_len = usize::try_from(table.arena_size())
        .unwrap_or(usize::MAX)
        .min(ARENA_MAX);
    // SAFETY: [ARENA_ADDR, +ARENA_MAX) is RAM that the memory map reserves for
    // the arena (linker/qemu-virt.ld); nothing else in the image refers to it,
    // so this is its only reference. The workers touch it only through the
    // tensor views `run` issues to them, under `IssuePort::issue`'s contract.
    let arena = unsafe { core::slice::from_raw_parts_mut(ARENA_ADDR as *mut u8, arena_len) };
    let mut platform = match MailboxPlatform::new(&MAILBOXES, &KINDS, clock) {
        Ok(platform) => platform,
        Err(e) => fail(EXIT_RUN, e),
    };
    let Some(orch) = take_orchestrator() else {
        fail(EXIT_RUN, "the orchestrator is already in use");
    };
    let result = run(&table, arena, &mut platform, orch, &options);
    platform.shutdown();
    match result {
        Ok(stats) => {
            println!("{stats}");
            if let Err(e) = semihosting::fs::write(c"arena.out", &*arena) {
                fail(EXIT_RUN, format_args!("writing arena.out: {e}"));
            }
            println!("RESULT OK");
            semihosting::process::exit(EXIT_OK)
        }
        Err(e) => fail(EXIT_RUN, e),
    }
}

/// CPUs 1..CORES, called by the boot code with their CPU number.
extern "C" fn secondary_main(cpu: usize) -> ! {
    ONLINE.fetch_or(1 << cpu, Ordering::Release);
    if serve(&MAILBOXES[cpu - 1], core::hint::spin_loop).is_err() {
        semihosting::eprintln!("cpu {cpu}: its mailbox is already served");
    }
    loop {
        // SAFETY: `wfe` only waits for an event; it touches no memory.
        unsafe { core::arch::asm!("wfe", options(nomem, nostack, preserves_flags)) };
    }
}

/// Starts the workers and waits until each has come up.
fn start_workers(clock: &CounterClock) -> Result<(), StartError> {
    let entry = boot::_start_secondary as *const () as usize as u64;
    for cpu in 1..boot::CORES as u64 {
        // MPIDR affinity of CPU n on `virt` (up to 8 CPUs): Aff0 = n.
        psci::cpu_on(cpu, entry, cpu).map_err(|e| StartError::CpuOn { cpu, error: e })?;
    }
    let all = ((1u32 << boot::CORES) - 1) & !1;
    let start = clock.now();
    let limit = ONLINE_TIMEOUT_MS * clock.ticks_per_second() / 1000;
    loop {
        let online = ONLINE.load(Ordering::Acquire);
        if online == all {
            return Ok(());
        }
        if clock.now().wrapping_sub(start) > limit {
            return Err(StartError::Offline {
                missing: all & !online,
            });
        }
        core::hint::spin_loop();
    }
}

/// Why the workers did not all come up.
enum StartError {
    CpuOn { cpu: u64, error: psci::PsciError },
    Offline { missing: u32 },
}

impl Display for StartError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
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
    // SAFETY: [TABLE_ADDR, +TABLE_MAX) is RAM that the memory map reserves for
    // the table (linker/qemu-virt.ld); QEMU's loader fills it before any core
    // starts (zeroes if no table was given) and nothing writes it afterwards.
    let header = unsafe { core::slice::from_raw_parts(TABLE_ADDR as *const u8, HEADER_SIZE) };
    let len = table_len(header)?.min(TABLE_MAX);
    // SAFETY: as above; `len` stays within the reserved window (a longer table
    // is reported as truncated by `Table::parse`).
    let bytes = unsafe { core::slice::from_raw_parts(TABLE_ADDR as *const u8, len) };
    Table::parse(bytes)
}

/// The run's options from the launch block at [`LAUNCH_ADDR`]: its symbols;
/// this firmware runs one scheduler thread, round-robin.
fn load_launch() -> Result<RunOptions, LaunchFailure> {
    // SAFETY: [LAUNCH_ADDR, +4 KiB) is RAM that the memory map reserves for
    // the launch block (linker/qemu-virt.ld); QEMU's loader fills it before
    // any core starts (zeroes if no block was given) and nothing writes it
    // afterwards. LAUNCH_MAX is well below 4 KiB.
    let bytes = unsafe { core::slice::from_raw_parts(LAUNCH_ADDR as *const u8, LAUNCH_MAX) };
    let Some(launch) = Launch::parse(bytes).map_err(LaunchFailure::Invalid)? else {
        return Ok(RunOptions::default());
    };
    if let Some(threads) = launch.threads.filter(|&t| t != 1) {
        return Err(LaunchFailure::Threads(threads));
    }
    if let Some(policy) = launch.policy.filter(|&p| p != PolicyKind::RoundRobin) {
        return Err(LaunchFailure::Policy(policy));
    }
    Ok(RunOptions {
        symbols: launch.symbols,
        ..RunOptions::default()
    })
}

/// Why the launch block cannot be honoured.
enum LaunchFailure {
    Invalid(LaunchError),
    Threads(usize),
    Policy(PolicyKind),
}

impl Display for LaunchFailure {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            LaunchFailure::Invalid(e) => write!(f, "{e}"),
            LaunchFailure::Threads(n) => write!(
                f,
                "launch block: {n} scheduler threads; this firmware runs 1"
            ),
            LaunchFailure::Policy(p) => write!(
                f,
                "launch block: dispatch policy {}; this firmware runs round-robin",
                p.name()
            ),
        }
    }
}

/// Reports `error` as the run's result and exits with `status`.
fn fail(status: i32, error: impl Display) -> ! {
    println!("RESULT ERROR {error}");
    semihosting::process::exit(status)
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    semihosting::eprintln!("firmware {info}");
    semihosting::process::exit(EXIT_PANIC)
}
