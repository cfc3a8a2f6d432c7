//! The host shim: host threads emulate the AICPU and the AICores, running the
//! device runtime's own code. The shim provides only threads, a clock and
//! memory; scheduling, dependency tracking and the issue protocol are the
//! runtime's.

use std::fmt;
use std::time::Instant;

use device_runtime::abi::{Table, TableError};
use device_runtime::exec::{self, RunError, RunOptions, RunStats, TableOrchestrator};
use device_runtime::mailbox::{serve, CoreMailbox};
use device_runtime::platform::{Clock, MailboxPlatform, PlatformError};
use wsp_ffi::CoreKind;

/// The emulated machine.
#[derive(Clone, Copy, Debug)]
pub struct Shim {
    pub cube_cores: usize,
    pub vector_cores: usize,
    pub options: RunOptions,
}

impl Default for Shim {
    fn default() -> Self {
        Shim {
            cube_cores: 2,
            vector_cores: 2,
            options: RunOptions::default(),
        }
    }
}

/// Why a shim run failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShimError {
    Table(TableError),
    Platform(PlatformError),
    /// Boxed: a run error can carry a deadlock report of several hundred bytes.
    Run(Box<RunError>),
}

impl fmt::Display for ShimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ShimError::Table(e) => write!(f, "{e}"),
            ShimError::Platform(e) => write!(f, "platform: {e}"),
            ShimError::Run(e) => write!(f, "run failed: {e}"),
        }
    }
}

impl std::error::Error for ShimError {}

/// Nanoseconds since the shim started; idles by yielding the host thread.
struct HostClock(Instant);

impl Clock for HostClock {
    fn now(&self) -> u64 {
        self.0.elapsed().as_nanos() as u64
    }
    fn ticks_per_second(&self) -> u64 {
        1_000_000_000
    }
    fn relax(&self) {
        std::thread::yield_now();
    }
}

impl Shim {
    /// The kinds of the emulated cores: cube cores first, then vector cores.
    pub fn core_kinds(&self) -> Vec<CoreKind> {
        let cube = std::iter::repeat_n(CoreKind::Cube, self.cube_cores);
        cube.chain(std::iter::repeat_n(CoreKind::Vector, self.vector_cores))
            .collect()
    }

    /// Validates `table` and runs it with `arena` as the data arena. One host
    /// thread per AICore serves its mailbox; the calling thread is the AICPU.
    pub fn run(&self, table: &[u8], arena: &mut [u8]) -> Result<RunStats, ShimError> {
        let table = Table::parse(table).map_err(ShimError::Table)?;
        let kinds = self.core_kinds();
        let mailboxes: Vec<CoreMailbox> = kinds.iter().map(|_| CoreMailbox::new()).collect();
        let mut orch = Box::new(TableOrchestrator::for_tables());
        std::thread::scope(|s| {
            for mailbox in &mailboxes {
                s.spawn(move || serve(mailbox, std::thread::yield_now));
            }
            let result = MailboxPlatform::new(&mailboxes, &kinds, HostClock(Instant::now()))
                .map_err(ShimError::Platform)
                .and_then(|mut platform| {
                    exec::run(&table, arena, &mut platform, &mut orch, &self.options)
                        .map_err(|e| ShimError::Run(Box::new(e)))
                });
            // Also when the platform could not be built: the threads must end.
            mailboxes.iter().for_each(CoreMailbox::request_exit);
            result
        })
    }
}
