//! The measuring modes (`cargo xtask qemu-bench`), chosen by words on the
//! semihosting command line (QEMU's `-semihosting-config arg=..`); a run
//! without them is a normal run.
//!
//! - `empty-kernels`: the AICores finish every task at once without calling
//!   its kernel (they report 0 cycles), so the run measures the runtime's
//!   overhead per task: submission, dependency tracking, dispatch, issue
//!   through the mailboxes and completion. The arena is left as it was.
//! - `baseline=N` (implies `empty-kernels`): no table runs. CPU 0 issues `N`
//!   ADD tasks to the run's cores of ADD's kind (the vector cores, those
//!   the tasks of the bench's graphs run on) through the same mailboxes and
//!   platform ([`MailboxPlatform`]: launch + poll only, up to the mailbox
//!   depth per core, no dependency tracking or orchestration), the cheapest
//!   way to get `N` tasks through the same cores.
//!
//! - `fault=F` (with `kernel-timeout-ms=N`, `ack-timeout-ms=N` to shorten
//!   the waits): the run injects fault `F` (see [`device_runtime::fault`]),
//!   reports how it ended (`FAULTY RUN ERROR ..`), then runs the table again
//!   in the same booted image without the fault, from the initial arena,
//!   and reports that run as a normal one.
//!
//! - `overflow-stack`: a test of the stack guard ([`crate::mmu`]): CPU 0
//!   recurses (1 KiB frames) until it has used more than its whole stack,
//!   which must end the run with a translation fault in its guard page
//!   (`STACK OVERFLOW`, exit status 3). Should it return instead, the run
//!   ends with `RESULT ERROR` (exit status 1): the overflow went unnoticed.
//!
//! Either mode ends its output with `bench tasks=.. ticks=.. freq=..`
//! before `RESULT OK`: ticks of the generic timer (CNTVCT_EL0, at `freq`
//! = CNTFRQ_EL0 per second) from the start of the run to its end.

use core::fmt::Display;

use device_runtime::fault::{BadFault, Fault};
use device_runtime::platform::{Clock, Completion, MailboxPlatform, Platform};
use wsp_ffi::{WspKernelArgs, WspKernelId_WSP_KERNEL_ADD as ADD, WspTensorView};

/// What this run does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Run the table with its kernels (no bench words).
    Run,
    /// Run the table; the cores skip the kernels.
    EmptyKernels,
    /// Issue `tasks` tasks with launch + poll only; the cores skip the kernels.
    Baseline { tasks: u64 },
}

impl Mode {
    /// Whether the cores skip the kernels.
    pub fn empty_kernels(self) -> bool {
        !matches!(self, Mode::Run)
    }
}

/// Bytes of the command line the firmware reads (its path and the words).
const CMDLINE_MAX: usize = 4096;

/// What the semihosting command line asks for.
#[derive(Clone, Copy, Debug)]
pub struct Words {
    /// The run's mode.
    pub mode: Mode,
    /// Record a trace (the word `trace`, see [`crate::trace`]).
    pub trace: bool,
    /// A fault to inject into the run (`fault=..`, in
    /// [`Fault::parse`]'s form); the table then runs again without it.
    pub fault: Option<Fault>,
    /// `kernel-timeout-ms=N`: [`RunOptions::kernel_timeout_ms`](device_runtime::sched::RunOptions::kernel_timeout_ms).
    pub kernel_timeout_ms: Option<u64>,
    /// `ack-timeout-ms=N`: [`RunOptions::ack_timeout_ms`](device_runtime::sched::RunOptions::ack_timeout_ms).
    pub ack_timeout_ms: Option<u64>,
    /// `overflow-stack`: overflow CPU 0's stack ([`overflow_stack`]) instead of a run.
    pub overflow_stack: bool,
}

/// What the semihosting command line asks for. Its first word is the
/// image's name (QEMU's default command line is the kernel's path); an
/// unknown word after it is an error.
pub fn mode() -> Result<Words, ArgError> {
    let args = semihosting::experimental::env::args::<CMDLINE_MAX>().map_err(ArgError::Read)?;
    let mut mode = Mode::Run;
    let mut trace = false;
    let mut fault = None;
    let mut overflow_stack = false;
    let (mut kernel_timeout_ms, mut ack_timeout_ms) = (None, None);
    // 0 ms is refused here, as `RunOptions::check` would refuse it once
    // the CPUs are up and the table is loaded.
    let ms = |n: &str| match n.parse::<u64>() {
        Ok(0) | Err(_) => Err(ArgError::Millis),
        Ok(ms) => Ok(ms),
    };
    for arg in (&args).skip(1) {
        let arg = arg.map_err(|_| ArgError::NotUtf8)?;
        if arg.is_empty() {
            continue;
        }
        if arg == "trace" {
            trace = true;
            continue;
        }
        if arg == "overflow-stack" {
            overflow_stack = true;
            continue;
        }
        if let Some(text) = arg.strip_prefix("fault=") {
            fault = Some(Fault::parse(text).map_err(ArgError::Fault)?);
            continue;
        }
        if let Some(n) = arg.strip_prefix("kernel-timeout-ms=") {
            kernel_timeout_ms = Some(ms(n)?);
            continue;
        }
        if let Some(n) = arg.strip_prefix("ack-timeout-ms=") {
            ack_timeout_ms = Some(ms(n)?);
            continue;
        }
        mode = match (arg, arg.strip_prefix("baseline=")) {
            ("empty-kernels", _) if mode == Mode::Run => Mode::EmptyKernels,
            ("empty-kernels", _) => mode,
            (_, Some(n)) => match n.parse::<u64>() {
                Ok(tasks) if tasks > 0 => Mode::Baseline { tasks },
                _ => return Err(ArgError::Tasks),
            },
            _ => return Err(ArgError::Unknown),
        };
    }
    if fault.is_some() && (trace || mode != Mode::Run) {
        return Err(ArgError::FaultAlone);
    }
    Ok(Words {
        mode,
        trace,
        fault,
        kernel_timeout_ms,
        ack_timeout_ms,
        overflow_stack,
    })
}

/// Why the command line names no mode.
#[derive(Debug)]
pub enum ArgError {
    Read(semihosting::io::Error),
    NotUtf8,
    Tasks,
    Unknown,
    Millis,
    Fault(BadFault),
    FaultAlone,
}

impl Display for ArgError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            ArgError::Read(e) => write!(f, "reading the semihosting command line: {e}"),
            ArgError::NotUtf8 => f.write_str("the semihosting command line is not UTF-8"),
            ArgError::Tasks => f.write_str("baseline=N: N must be a whole number above 0"),
            ArgError::Unknown => f.write_str(
                "unknown word on the semihosting command line (known: empty-kernels, baseline=N, trace, \
                 overflow-stack, fault=F, kernel-timeout-ms=N, ack-timeout-ms=N)",
            ),
            ArgError::Millis => f.write_str("kernel-timeout-ms=N, ack-timeout-ms=N: N must be a whole number above 0"),
            ArgError::Fault(e) => write!(f, "fault=: {e}"),
            ArgError::FaultAlone => f.write_str("fault= runs the table with its kernels, untraced"),
        }
    }
}

/// Bytes of stack each call of [`recurse`] takes, at least.
const FRAME: usize = 1024;

/// Recurses until it has taken `bytes` of stack below the caller's frame
/// (on a guarded stack, more than the stack has: it never returns), then
/// returns how deep it went.
pub fn overflow_stack(bytes: usize) -> usize {
    recurse(0, bytes / FRAME + 1)
}

/// Calls itself `calls` times, each call with a [`FRAME`]-byte local the
/// optimizer cannot drop (it is written before and read after the call).
#[inline(never)]
fn recurse(depth: usize, calls: usize) -> usize {
    let mut frame = [0u8; FRAME];
    frame[depth % FRAME] = 1;
    core::hint::black_box(&mut frame);
    if depth >= core::hint::black_box(calls) {
        return depth;
    }
    let deepest = recurse(depth + 1, calls);
    core::hint::black_box(&frame);
    deepest
}

/// Issues `tasks` empty ADD tasks to every core of `platform` of ADD's
/// kind in turn, each core up to its mailbox depth, and polls them until
/// all have completed: launch + poll only. Returns the ticks it took, or
/// why a task did not run.
pub fn baseline<C: Clock>(
    platform: &mut MailboxPlatform<'_, C>,
    tasks: u64,
) -> Result<u64, BaselineError> {
    const NO_VIEW: WspTensorView = WspTensorView {
        addr: 0,
        rows: 0,
        cols: 0,
        row_stride: 0,
        dtype: 0,
    };
    // No views: the cores in this mode do not read them.
    let args = WspKernelArgs {
        num_tensors: 0,
        num_scalars: 0,
        tensors: [NO_VIEW; wsp_ffi::WSP_MAX_TENSOR_ARGS as usize],
        scalars: [0; wsp_ffi::WSP_MAX_SCALARS as usize],
    };
    let kind = wsp_ffi::lookup(ADD).ok_or(BaselineError::NoCores)?.kind;
    let mut cores = [0usize; device_runtime::platform::MAX_CORES];
    let mut count = 0;
    for core in 0..platform.num_cores() {
        if platform.core_kind(core) == kind {
            cores[count] = core;
            count += 1;
        }
    }
    if count == 0 {
        return Err(BaselineError::NoCores);
    }
    let cores = &cores[..count];
    let (mut issued, mut done) = (0u64, 0u64);
    let start = platform.now();
    while done < tasks {
        let before = (issued, done);
        for &core in cores {
            while let Some(completion) = platform.poll(core) {
                if completion == Completion::Rejected {
                    return Err(BaselineError::Rejected { core });
                }
                done += 1;
            }
            // SAFETY: `args` names no memory, so no view can be invalid or shared.
            while issued < tasks && unsafe { platform.launch(core, ADD, &args) } {
                issued += 1;
            }
        }
        if (issued, done) == before {
            // Nothing moved: wait for the cores, as the scheduler does.
            platform.relax();
        }
    }
    Ok(platform.now().wrapping_sub(start))
}

/// Why the baseline did not run.
#[derive(Debug)]
pub enum BaselineError {
    /// The platform has no core that runs ADD.
    NoCores,
    /// A core rejected a task (its kernel ran: not in the measuring mode).
    Rejected { core: usize },
}

impl Display for BaselineError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            BaselineError::NoCores => f.write_str("baseline: no core runs ADD"),
            BaselineError::Rejected { core } => {
                write!(f, "baseline: core {core} rejected a task (its kernel ran)")
            }
        }
    }
}

/// Logs the bench line: `tasks` tasks in `ticks` ticks of a `freq` Hz counter.
pub fn report(tasks: u64, ticks: u64, freq: u64) {
    defmt::info!(
        "bench tasks={=u64} ticks={=u64} freq={=u64}",
        tasks,
        ticks,
        freq
    );
}
