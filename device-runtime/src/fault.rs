//! Fault injection: [`FaultPlatform`] wraps any [`Platform`] and makes one
//! chosen task on one core fail the way a broken device would, so that
//! every runner (the host shim, the QEMU firmware, the Ascend launcher) can
//! check that the run ends within its bound with the typed error, and that
//! the next run is clean.
//!
//! The faults, and what the scheduler sees:
//! - [`FaultKind::NoAck`]: the core never takes the task (it is not handed
//!   to the inner platform): [`Platform::acknowledged`] stays `false`, and
//!   the run ends with `RunError::CoreNoAck` after the ack timeout.
//! - [`FaultKind::NoFin`]: the core takes the task and never reports it
//!   finished (the inner core runs it; its completion is withheld, as from
//!   a core that hangs until the run's teardown resets it): the run ends
//!   with `RunError::KernelTimeout` after the kernel timeout.
//! - [`FaultKind::Error`]: the task's kernel reports an error code:
//!   `RunError::KernelFailed`.
//! - [`FaultKind::NotBuiltIn`]: [`Platform::has_kernel`] is `false` for
//!   the kernel on that core: `RunError::KernelNotBuiltIn` before anything
//!   runs.
//!
//! A fault hits once: the platform of the next run is built without it.
//! The inner platform stays consistent (every task it was handed is polled
//! from it), so its cores can serve the next run.
//!
//! Faults have a text form, for command lines: `no-ack:CORE:TASK`,
//! `no-fin:CORE:TASK`, `error:CORE:TASK:CODE`, `no-kernel:CORE:KERNEL`,
//! where `CORE` is the run-wide core number and `TASK` is `N` (the core's
//! `N`th task, from 1) or `kK` (the core's first task of kernel `K`).
//! `CODE` is any 32-bit code, 0 included: a kernel fails by returning
//! `WSP_KERNEL_FAILED_BASE | code` ([`wsp_ffi::kernel_failed`]), and
//! `kernel_failed(0)` is a failure like any other (a success is a cycle
//! count, below that range), which the run reports as error code 0.

use core::fmt;

use wsp_ffi::{CoreKind, WspKernelArgs};

use crate::platform::{Clock, Completion, Event, Platform};

/// What goes wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultKind {
    /// The core never acknowledges the task.
    NoAck,
    /// The core acknowledges the task and never finishes it.
    NoFin,
    /// The task's kernel reports error `code`.
    Error(u32),
    /// The kernel of [`Trigger::Kernel`] is not built into the core.
    NotBuiltIn,
}

/// Which task of the core a fault hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The core's `n`th task, counting from 1.
    Nth(u32),
    /// The core's first task of this kernel id.
    Kernel(u32),
}

/// One fault: what, on which core (run-wide number until
/// [`Fault::on_cores`] makes it a platform's own), on which task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// What goes wrong.
    pub kind: FaultKind,
    /// The core.
    pub core: usize,
    /// The task (for [`FaultKind::NotBuiltIn`]: a [`Trigger::Kernel`]).
    pub trigger: Trigger,
}

/// Why a fault's text form did not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadFault;

impl fmt::Display for BadFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "a fault is no-ack:CORE:TASK, no-fin:CORE:TASK, error:CORE:TASK:CODE or \
             no-kernel:CORE:KERNEL (TASK: N, the core's Nth task from 1, or kK, its first task of kernel K)",
        )
    }
}

impl Fault {
    /// Parses the text form (see the module docs).
    pub fn parse(text: &str) -> Result<Fault, BadFault> {
        let mut words = text.split(':');
        let kind = words.next().ok_or(BadFault)?;
        let number = |w: Option<&str>| w.and_then(|w| w.parse::<u32>().ok()).ok_or(BadFault);
        let core = number(words.next())? as usize;
        let what = words.next().ok_or(BadFault)?;
        let trigger = match what.strip_prefix('k') {
            Some(kernel) => Trigger::Kernel(number(Some(kernel))?),
            None => match number(Some(what))? {
                0 => return Err(BadFault),
                n => Trigger::Nth(n),
            },
        };
        let kind = match kind {
            "no-ack" => FaultKind::NoAck,
            "no-fin" => FaultKind::NoFin,
            "error" => FaultKind::Error(number(words.next())?),
            "no-kernel" => match trigger {
                Trigger::Nth(kernel) => {
                    return Ok(Fault {
                        kind: FaultKind::NotBuiltIn,
                        core,
                        trigger: Trigger::Kernel(kernel),
                    })
                }
                Trigger::Kernel(_) => FaultKind::NotBuiltIn,
            },
            _ => return Err(BadFault),
        };
        if words.next().is_some() {
            return Err(BadFault);
        }
        Ok(Fault {
            kind,
            core,
            trigger,
        })
    }

    /// The fault for a platform whose cores are, in order, the run-wide
    /// `cores`: its core renumbered as the platform's own, or `None` if
    /// the platform does not have it.
    pub fn on_cores(self, cores: impl IntoIterator<Item = usize>) -> Option<Fault> {
        let local = cores.into_iter().position(|c| c == self.core)?;
        Some(Fault {
            core: local,
            ..self
        })
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            FaultKind::NoAck => "no-ack",
            FaultKind::NoFin => "no-fin",
            FaultKind::Error(_) => "error",
            FaultKind::NotBuiltIn => "no-kernel",
        };
        write!(f, "{kind}:{}:", self.core)?;
        match (self.kind, self.trigger) {
            (FaultKind::NotBuiltIn, Trigger::Kernel(k) | Trigger::Nth(k)) => write!(f, "{k}")?,
            (_, Trigger::Nth(n)) => write!(f, "{n}")?,
            (_, Trigger::Kernel(k)) => write!(f, "k{k}")?,
        }
        if let FaultKind::Error(code) = self.kind {
            write!(f, ":{code}")?;
        }
        Ok(())
    }
}

/// Where the faulty task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Not launched yet.
    Armed,
    /// Launched behind `ahead` tasks the inner core still holds.
    Launched { ahead: u32 },
    /// Spent: an error reported (or nothing to do).
    Done,
}

/// A platform that injects one [`Fault`] (see the module docs) into `P`.
pub struct FaultPlatform<P> {
    inner: P,
    fault: Option<Fault>,
    /// Tasks launched on the fault's core so far.
    launched: u32,
    /// Tasks the inner platform holds on the fault's core (handed, not yet
    /// polled from it).
    inner_held: u32,
    state: State,
}

impl<P: Platform> FaultPlatform<P> {
    /// `inner` with `fault` (its core numbered as `inner`'s own; see
    /// [`Fault::on_cores`]); `None`: `inner` unchanged.
    pub fn new(inner: P, fault: Option<Fault>) -> Self {
        FaultPlatform {
            inner,
            fault,
            launched: 0,
            inner_held: 0,
            state: State::Armed,
        }
    }

    /// The wrapped platform.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// Gives back the wrapped platform (for its teardown).
    pub fn into_inner(self) -> P {
        self.inner
    }

    /// The fault on `core`, if it has one that hits a task.
    fn on(&self, core: usize) -> Option<Fault> {
        self.fault
            .filter(|f| f.core == core && f.kind != FaultKind::NotBuiltIn)
    }

    /// Whether the faulty task is on the core and the inner core has
    /// nothing before it: the scheduler's oldest task on the core is it.
    fn holding(&self, core: usize) -> bool {
        self.on(core).is_some() && self.state == State::Launched { ahead: 0 }
    }
}

impl<P: Platform> Clock for FaultPlatform<P> {
    fn now(&self) -> u64 {
        self.inner.now()
    }
    fn ticks_per_second(&self) -> u64 {
        self.inner.ticks_per_second()
    }
    fn relax(&self) {
        self.inner.relax()
    }
    fn pause(&self) {
        self.inner.pause()
    }
    fn relax_until(&self, deadline: u64) {
        self.inner.relax_until(deadline)
    }
}

impl<P: Platform> Platform for FaultPlatform<P> {
    fn num_cores(&self) -> usize {
        self.inner.num_cores()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.inner.core_kind(core)
    }
    fn depth(&self) -> usize {
        self.inner.depth()
    }
    fn can_queue(&self, core: usize) -> bool {
        // Nothing queues behind the faulty task.
        match self.on(core) {
            Some(_) if matches!(self.state, State::Launched { .. }) => false,
            _ => self.inner.can_queue(core),
        }
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        let Some(fault) = self.on(core) else {
            // SAFETY: the caller upholds the same contract.
            return unsafe { self.inner.launch(core, kernel_id, args) };
        };
        if matches!(self.state, State::Launched { .. }) {
            return false;
        }
        let hits = self.state == State::Armed
            && match fault.trigger {
                Trigger::Nth(n) => self.launched + 1 == n,
                Trigger::Kernel(k) => kernel_id == k,
            };
        if hits && fault.kind == FaultKind::NoAck {
            // The core never takes it: the inner platform never sees it.
            self.launched += 1;
            self.state = State::Launched {
                ahead: self.inner_held,
            };
            return true;
        }
        // SAFETY: the caller upholds the same contract.
        if !unsafe { self.inner.launch(core, kernel_id, args) } {
            return false;
        }
        self.launched += 1;
        if hits {
            self.state = State::Launched {
                ahead: self.inner_held,
            };
        }
        self.inner_held += 1;
        true
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let Some(fault) = self.on(core) else {
            return self.inner.poll(core);
        };
        if self.inner_held == 0 {
            return None;
        }
        let completion = self.inner.poll(core)?;
        self.inner_held -= 1;
        match self.state {
            State::Launched { ahead } if ahead > 0 => {
                self.state = State::Launched { ahead: ahead - 1 };
                Some(completion)
            }
            // The faulty task's own completion (no-ack tasks never reach
            // the inner core, so this is a no-fin or error task).
            State::Launched { .. } => match fault.kind {
                FaultKind::Error(code) => {
                    self.state = State::Done;
                    Some(Completion::Failed { code })
                }
                // Withheld: the scheduler never sees it finish.
                _ => None,
            },
            State::Armed | State::Done => Some(completion),
        }
    }
    fn acknowledged(&self, core: usize) -> bool {
        match self.on(core) {
            Some(f) if f.kind == FaultKind::NoAck && self.holding(core) => false,
            // Taken by the inner core, then withheld.
            Some(f) if f.kind == FaultKind::NoFin && self.holding(core) && self.inner_held == 0 => {
                true
            }
            _ => self.inner.acknowledged(core),
        }
    }
    fn has_kernel(&self, core: usize, kernel_id: u32) -> bool {
        match self.fault {
            Some(Fault {
                kind: FaultKind::NotBuiltIn,
                core: c,
                trigger: Trigger::Kernel(k),
            }) if c == core && k == kernel_id => false,
            _ => self.inner.has_kernel(core, kernel_id),
        }
    }
    fn observing(&self) -> bool {
        self.inner.observing()
    }
    fn observe(&mut self, event: Event) {
        self.inner.observe(event)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Two cores that finish each task at once, in order; task `n` (from
    /// 1, over both cores) reports `n` cycles.
    #[derive(Default)]
    struct Instant {
        held: [VecDeque<u64>; 2],
        launched: u64,
    }

    impl Clock for Instant {
        fn now(&self) -> u64 {
            0
        }
        fn ticks_per_second(&self) -> u64 {
            1000
        }
    }

    impl Platform for Instant {
        fn num_cores(&self) -> usize {
            2
        }
        fn core_kind(&self, _core: usize) -> CoreKind {
            CoreKind::Vector
        }
        fn depth(&self) -> usize {
            2
        }
        fn can_queue(&self, core: usize) -> bool {
            self.held[core].len() == 1
        }
        unsafe fn launch(&mut self, core: usize, _kernel_id: u32, _args: &WspKernelArgs) -> bool {
            self.launched += 1;
            self.held[core].push_back(self.launched);
            true
        }
        fn poll(&mut self, core: usize) -> Option<Completion> {
            let cycles = self.held[core].pop_front()?;
            Some(Completion::Done { cycles })
        }
    }

    fn launch(p: &mut FaultPlatform<Instant>, core: usize, kernel_id: u32) -> bool {
        let args = WspKernelArgs {
            num_tensors: 0,
            num_scalars: 0,
            tensors: [wsp_ffi::WspTensorView {
                addr: 0,
                rows: 0,
                cols: 0,
                row_stride: 0,
                dtype: 0,
            }; 4],
            scalars: [0; 4],
        };
        // SAFETY: the views name no memory and no kernel runs.
        unsafe { p.launch(core, kernel_id, &args) }
    }

    fn faulty(kind: FaultKind, trigger: Trigger) -> FaultPlatform<Instant> {
        let fault = Fault {
            kind,
            core: 1,
            trigger,
        };
        FaultPlatform::new(Instant::default(), Some(fault))
    }

    #[test]
    fn a_task_that_never_finishes_is_taken_and_withheld_behind_the_one_before() {
        let mut p = faulty(FaultKind::NoFin, Trigger::Nth(2));
        assert!(launch(&mut p, 1, 3));
        assert!(launch(&mut p, 1, 3), "the faulty one, queued behind");
        assert!(!p.can_queue(1), "nothing queues behind it");
        assert_eq!(p.poll(1), Some(Completion::Done { cycles: 1 }));
        assert_eq!(p.poll(1), None);
        assert!(p.acknowledged(1), "taken, never finished");
        assert_eq!(p.poll(1), None);
        assert!(
            p.inner().held[1].is_empty(),
            "the inner core was polled clean"
        );
        // Other cores are untouched.
        assert!(launch(&mut p, 0, 3));
        assert_eq!(p.poll(0), Some(Completion::Done { cycles: 3 }));
    }

    #[test]
    fn a_task_never_acknowledged_never_reaches_the_core() {
        let mut p = faulty(FaultKind::NoAck, Trigger::Nth(2));
        assert!(launch(&mut p, 1, 3));
        assert!(launch(&mut p, 1, 3));
        assert!(p.acknowledged(1), "the oldest task is the one before it");
        assert_eq!(p.poll(1), Some(Completion::Done { cycles: 1 }));
        assert!(!p.acknowledged(1));
        assert_eq!(p.poll(1), None);
        assert_eq!(p.inner().launched, 1, "the core never saw it");
    }

    #[test]
    fn an_error_code_replaces_the_completion_of_the_kernels_first_task() {
        let mut p = faulty(FaultKind::Error(42), Trigger::Kernel(7));
        assert!(launch(&mut p, 1, 3));
        assert!(launch(&mut p, 1, 7));
        assert_eq!(p.poll(1), Some(Completion::Done { cycles: 1 }));
        assert_eq!(p.poll(1), Some(Completion::Failed { code: 42 }));
        assert!(launch(&mut p, 1, 7), "the fault hits once");
        assert_eq!(p.poll(1), Some(Completion::Done { cycles: 3 }));
    }

    #[test]
    fn a_kernel_not_built_in_is_missing_on_its_core_only() {
        let p = faulty(FaultKind::NotBuiltIn, Trigger::Kernel(7));
        assert!(!p.has_kernel(1, 7));
        assert!(p.has_kernel(0, 7));
        assert!(p.has_kernel(1, 6));
    }

    #[test]
    fn a_fault_is_renumbered_for_a_platforms_cores() {
        let fault = Fault::parse("no-fin:5:1").unwrap();
        assert_eq!(fault.on_cores([1, 3, 5, 7]).map(|f| f.core), Some(2));
        assert_eq!(fault.on_cores([0, 2, 4, 6]), None);
    }
}
