//! The `Platform` trait: everything the scheduler needs from the machine it
//! runs on. The scheduler core (`exec`) is written once against it; the host
//! shim, the QEMU firmware and (later) the Ascend handshake implement it.

use wsp_ffi::{CoreKind, WspKernelArgs};

pub use crate::mailbox::Completion;
use crate::mailbox::{CoreMailbox, IssuePort};

/// Most cores one scheduler drives (one bit each in the scheduler's masks).
pub const MAX_CORES: usize = 64;

/// A monotonic clock and the idle hint of the platform.
pub trait Clock {
    /// The clock now, in ticks.
    fn now(&self) -> u64;
    /// The clock's rate.
    fn ticks_per_second(&self) -> u64;
    /// What the scheduler does while it waits, for its first
    /// [`SPIN_ROUNDS`](crate::sched::SPIN_ROUNDS) idle rounds in a row: a
    /// spin hint by default (in semantic time: jump to the next event).
    fn relax(&self) {
        core::hint::spin_loop();
    }
    /// What it does after that many idle rounds: give the processor away
    /// where the host has one to give (a host thread yields; the device's
    /// own AICPU cores keep the default, [`Clock::relax`]).
    fn pause(&self) {
        self.relax()
    }
    /// The scheduler has nothing to do before `deadline` (a channel's
    /// latency passes then) unless a task completes first. A clock that
    /// only moves when the scheduler waits (semantic time) moves to the
    /// earlier of the two; a real clock waits as in [`Clock::relax`].
    fn relax_until(&self, deadline: u64) {
        let _ = deadline;
        self.relax()
    }
}

/// The machine under the scheduler: a set of cores of two kinds, each running
/// one task at a time with up to [`Platform::depth`] tasks handed to it, and
/// a clock.
pub trait Platform: Clock {
    /// Cores it drives, numbered from 0.
    fn num_cores(&self) -> usize;
    /// The kind of `core`.
    fn core_kind(&self, core: usize) -> CoreKind;
    /// Tasks one core holds at most: the one it runs and those queued behind
    /// it, which it starts without waiting for the scheduler (the device's
    /// double-buffered payloads: 2). The scheduler queues behind a busy core
    /// only when [`Platform::can_queue`] says so.
    fn depth(&self) -> usize {
        1
    }
    /// Whether busy `core` takes one more task now (for the mailbox: it has
    /// acknowledged the task it holds and holds fewer than [`Platform::depth`]).
    fn can_queue(&self, _core: usize) -> bool {
        false
    }
    /// Hands `kernel_id` with `args` to `core`, which runs it after the
    /// tasks it already holds. Returns `false` if the core takes no task now
    /// (it is busy and [`Platform::can_queue`] is false).
    ///
    /// # Safety
    /// As [`IssuePort::issue`]: the views in `args` stay valid and unshared
    /// until [`Platform::poll`] reports this task's completion.
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool;
    /// The completion of the oldest unreported task of `core`, once it has
    /// finished. Completions come in launch order.
    fn poll(&mut self, core: usize) -> Option<Completion>;
    /// Whether `core` has acknowledged (taken) its oldest unreported task;
    /// `true` when it holds none. The scheduler ends a run with
    /// [`RunError::CoreNoAck`](crate::sched::RunError::CoreNoAck) when a
    /// task stays unacknowledged past
    /// [`RunOptions::ack_timeout_ms`](crate::sched::RunOptions::ack_timeout_ms).
    /// The default, `true`, is for a platform that cannot tell: all of a
    /// task's time then counts against the kernel timeout.
    fn acknowledged(&self, _core: usize) -> bool {
        true
    }
    /// Whether kernel `kernel_id` is built into `core` (its code is in the
    /// core's image). The scheduler checks every kernel a table declares on
    /// every core of the kernel's kind before anything runs, and ends with
    /// [`RunError::KernelNotBuiltIn`](crate::sched::RunError::KernelNotBuiltIn)
    /// if one lacks it. Default: every kernel of the registry is.
    fn has_kernel(&self, _core: usize, _kernel_id: u32) -> bool {
        true
    }
    /// Whether the platform records [`Event`]s (a traced host run). The
    /// scheduler builds an event only when this is true: with the default
    /// (`false`, a constant) the calls compile to nothing.
    fn observing(&self) -> bool {
        false
    }
    /// Records `event` (called only while [`Platform::observing`]).
    fn observe(&mut self, _event: Event) {}
}

/// What a scheduler tells an observing platform ([`Platform::observing`])
/// as the run goes: enough for a trace of tasks, releases and stalls.
/// Cores are the platform's numbers, times its clock's ticks.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Task `task` (its number in the run) was handed to `core`.
    Issued { core: usize, task: u32, now: u64 },
    /// The scheduler saw `core` finish task `task`.
    Finished { core: usize, task: u32, now: u64 },
    /// Task `by`'s completion (or, on a stream, its issue) released `task`.
    Released { by: u32, task: u32 },
    /// The dispatcher after one of its rounds (on the platform of the
    /// scheduler that runs it): what its submissions or placements wait
    /// for (the name of a [`StallReason`](crate::orch::StallReason); `None`:
    /// nothing), tasks submitted and not retired, and ready tasks in the
    /// dispatch queues.
    Dispatcher {
        now: u64,
        stall: Option<&'static str>,
        in_flight: u64,
        queued: u64,
    },
}

impl<C: Clock + ?Sized> Clock for &mut C {
    fn now(&self) -> u64 {
        (**self).now()
    }
    fn ticks_per_second(&self) -> u64 {
        (**self).ticks_per_second()
    }
    fn relax(&self) {
        (**self).relax()
    }
    fn pause(&self) {
        (**self).pause()
    }
    fn relax_until(&self, deadline: u64) {
        (**self).relax_until(deadline)
    }
}

/// A borrowed platform is a platform (a run borrows the caller's).
impl<P: Platform + ?Sized> Platform for &mut P {
    fn num_cores(&self) -> usize {
        (**self).num_cores()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        (**self).core_kind(core)
    }
    fn depth(&self) -> usize {
        (**self).depth()
    }
    fn can_queue(&self, core: usize) -> bool {
        (**self).can_queue(core)
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        // SAFETY: the caller upholds the same contract.
        unsafe { (**self).launch(core, kernel_id, args) }
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        (**self).poll(core)
    }
    fn acknowledged(&self, core: usize) -> bool {
        (**self).acknowledged(core)
    }
    fn has_kernel(&self, core: usize, kernel_id: u32) -> bool {
        (**self).has_kernel(core, kernel_id)
    }
    fn observing(&self) -> bool {
        (**self).observing()
    }
    fn observe(&mut self, event: Event) {
        (**self).observe(event)
    }
}

/// Why a platform could not be put together.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlatformError {
    /// Mailboxes and kinds differ in number, or there are more than [`MAX_CORES`].
    BadCoreCount { mailboxes: usize, kinds: usize },
    /// Another scheduler already drives this core's mailbox.
    MailboxClaimed { core: usize },
}

impl core::fmt::Display for PlatformError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            PlatformError::BadCoreCount { mailboxes, kinds } => write!(
                f,
                "{mailboxes} mailboxes for {kinds} core kinds (they must match and be at most {MAX_CORES})"
            ),
            PlatformError::MailboxClaimed { core } => write!(f, "core {core}'s mailbox is driven by another scheduler"),
        }
    }
}

/// A platform whose cores share memory with the scheduler and serve
/// [`CoreMailbox`]es: the host shim (threads) and the QEMU firmware
/// (secondary cores) both use it, differing only in their clock.
pub struct MailboxPlatform<'m, C: Clock> {
    mailboxes: &'m [CoreMailbox],
    ports: [Option<IssuePort<'m>>; MAX_CORES],
    kinds: &'m [CoreKind],
    clock: C,
}

impl<'m, C: Clock> MailboxPlatform<'m, C> {
    /// A platform over one mailbox per core, of the given kinds, with `clock`.
    pub fn new(
        mailboxes: &'m [CoreMailbox],
        kinds: &'m [CoreKind],
        clock: C,
    ) -> Result<Self, PlatformError> {
        if mailboxes.len() != kinds.len() || mailboxes.len() > MAX_CORES {
            return Err(PlatformError::BadCoreCount {
                mailboxes: mailboxes.len(),
                kinds: kinds.len(),
            });
        }
        let mut ports = [const { None }; MAX_CORES];
        for (core, mailbox) in mailboxes.iter().enumerate() {
            ports[core] = Some(
                mailbox
                    .claim_issue()
                    .ok_or(PlatformError::MailboxClaimed { core })?,
            );
        }
        Ok(MailboxPlatform {
            mailboxes,
            ports,
            kinds,
            clock,
        })
    }

    /// Tells every core to leave its serve loop once it has finished its
    /// task (call it when every completion has been polled).
    pub fn shutdown(&self) {
        self.mailboxes.iter().for_each(CoreMailbox::request_exit);
    }
}

impl<C: Clock> Clock for MailboxPlatform<'_, C> {
    fn now(&self) -> u64 {
        self.clock.now()
    }
    fn ticks_per_second(&self) -> u64 {
        self.clock.ticks_per_second()
    }
    fn relax(&self) {
        self.clock.relax()
    }
    fn pause(&self) {
        self.clock.pause()
    }
    fn relax_until(&self, deadline: u64) {
        self.clock.relax_until(deadline)
    }
}

impl<C: Clock> Platform for MailboxPlatform<'_, C> {
    fn num_cores(&self) -> usize {
        self.kinds.len()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.kinds[core]
    }
    fn depth(&self) -> usize {
        crate::mailbox::DEPTH
    }
    fn can_queue(&self, core: usize) -> bool {
        match self.ports.get(core) {
            Some(Some(port)) => port.pending() > 0 && port.can_issue(),
            _ => false,
        }
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        match self.ports.get_mut(core) {
            // SAFETY: the caller upholds `issue`'s contract (this fn's # Safety).
            Some(Some(port)) => unsafe { port.issue(kernel_id, args) },
            _ => false,
        }
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        self.ports.get_mut(core)?.as_mut()?.poll()
    }
    fn acknowledged(&self, core: usize) -> bool {
        match self.ports.get(core) {
            Some(Some(port)) => port.acknowledged(),
            _ => true,
        }
    }
}
