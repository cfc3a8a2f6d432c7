//! A per-core mailbox: how a scheduler issues tasks to a core that shares
//! memory with it (host threads in the shim, secondary cores under QEMU), and
//! how the core reports them. It has the shape of the Ascend AICPU-AICore
//! handshake, so that the device implementation is a thin layer over
//! registers:
//!
//! - `task` (the device's DATA_MAIN_BASE register, scheduler to core): the id
//!   of the newest task issued, or [`EXIT`].
//! - `cond` (the device's COND register, core to scheduler): ACK = `id` once
//!   the core has taken task `id`, FIN = `id | FIN` once it has finished it;
//!   [`COND_IDLE`] before the first task, [`COND_EXITED`] after leaving.
//! - Two payload buffers; task `id` uses buffer `id & 1`.
//!
//! Ids are per core, start at 1, grow by one and skip the reserved values
//! from [`EXIT`] up, keeping their parity (so buffers keep alternating).
//!
//! Protocol (one scheduler, one core, at most two tasks in flight):
//! 1. The scheduler issues task `n` when the core holds no unreported task
//!    (and has finished the last one), or holds one that it has already
//!    acknowledged: it writes buffer `n & 1` (free: the task that used it,
//!    `n - 2`, has been reported), then publishes `task = n` with Release.
//! 2. The core sees `task` change with Acquire, publishes ACK `n`, copies
//!    buffer `n & 1`, runs the kernel, writes the result into the buffer and
//!    publishes FIN `n` with Release. The scheduler never rewrites `task`
//!    before its task is acknowledged, so the core sees every id.
//! 3. The scheduler reports task `n` once `cond` shows FIN `n`, or shows
//!    the next task (ACK or FIN `n + 1`: the core takes tasks in order), and
//!    reads its result after that Acquire.
//!
//! So while the core runs task `n`, task `n + 1` already waits in the other
//! buffer: the core starts it without a round trip to the scheduler. Each
//! side claims its end once ([`CoreMailbox::claim_issue`], [`serve`]), so two
//! schedulers or two cores cannot share a mailbox.

use wsp_ffi::{WspKernelArgs, WSP_KERNEL_REJECTED};

use crate::sync::{maybe_const_fn, AtomicBool, AtomicU32, Ordering, UnsafeCell};

/// `cond` bit: the task in the low bits has finished.
pub const FIN: u32 = 0x8000_0000;
/// `task` value that asks the core to leave [`serve`]; ids stay below it.
pub const EXIT: u32 = 0x7FFF_FFF0;
/// `cond` before the core has taken a task.
pub const COND_IDLE: u32 = 0x7FFF_FFFF;
/// `cond` after the core has left [`serve`].
pub const COND_EXITED: u32 = 0xFFFF_FFFE;

/// Tasks a mailbox holds at once: the one the core runs and the next.
pub const DEPTH: usize = 2;

/// The id after `id`: ids wrap before the reserved values, keeping parity.
pub const fn next_id(id: u32) -> u32 {
    let next = id + 1;
    if next >= EXIT {
        2 - (next & 1)
    } else {
        next
    }
}

#[derive(Clone, Copy)]
struct Payload {
    kernel_id: u32,
    args: WspKernelArgs,
    /// The core's answer: the kernel's return value ([`Completion::from_result`]).
    result: u64,
}

/// One core's mailbox; place it in memory both sides can reach.
#[repr(C, align(64))]
pub struct CoreMailbox {
    task: AtomicU32,
    cond: AtomicU32,
    issuer_claimed: AtomicBool,
    core_claimed: AtomicBool,
    payload: [UnsafeCell<Payload>; DEPTH],
}

// SAFETY: the payload buffers are only touched under the protocol in the
// module docs: buffer `n & 1` by the scheduler before it publishes task `n`
// and after it has seen task `n` finished, by the core between seeing task
// `n` and publishing FIN `n`. The claim flags make sure there is one
// scheduler and one core per mailbox.
unsafe impl Sync for CoreMailbox {}

impl Default for CoreMailbox {
    fn default() -> Self {
        Self::new()
    }
}

impl CoreMailbox {
    maybe_const_fn! {
    /// An idle mailbox (`const` outside loom, so it can live in a `static`).
    pub fn new() -> Self {
        const EMPTY: wsp_ffi::WspTensorView = wsp_ffi::WspTensorView { addr: 0, rows: 0, cols: 0, row_stride: 0, dtype: 0 };
        const PAYLOAD: Payload = Payload {
            kernel_id: 0,
            args: WspKernelArgs {
                num_tensors: 0,
                num_scalars: 0,
                tensors: [EMPTY; wsp_ffi::WSP_MAX_TENSOR_ARGS as usize],
                scalars: [0; wsp_ffi::WSP_MAX_SCALARS as usize],
            },
            result: 0,
        };
        CoreMailbox {
            task: AtomicU32::new(0),
            cond: AtomicU32::new(COND_IDLE),
            issuer_claimed: AtomicBool::new(false),
            core_claimed: AtomicBool::new(false),
            payload: [UnsafeCell::new(PAYLOAD), UnsafeCell::new(PAYLOAD)],
        }
    }
    }

    /// Claims the scheduler's end. `None` if another scheduler holds it.
    /// A task an earlier scheduler left unfinished keeps the core refusing
    /// new ones until it finishes.
    pub fn claim_issue(&self) -> Option<IssuePort<'_>> {
        if self.issuer_claimed.swap(true, Ordering::Acquire) {
            return None;
        }
        let task = self.task.load(Ordering::Acquire);
        Some(IssuePort {
            mailbox: self,
            last: if task < EXIT { task } else { 0 },
            oldest: 0,
            pending: 0,
        })
    }

    /// Asks the core to leave [`serve`] once it has finished its current
    /// task. Call it when the scheduler holds no unreported task on the core
    /// (a task issued but not yet taken would not run).
    pub fn request_exit(&self) {
        self.task.store(EXIT, Ordering::Release);
    }

    /// Whether the core has left [`serve`] after [`CoreMailbox::request_exit`].
    pub fn has_exited(&self) -> bool {
        self.cond.load(Ordering::Acquire) == COND_EXITED
    }
}

/// The scheduler's end of a mailbox.
pub struct IssuePort<'a> {
    mailbox: &'a CoreMailbox,
    /// Id of the newest task issued (0: none).
    last: u32,
    /// Id of the oldest task not yet reported (when `pending > 0`).
    oldest: u32,
    /// Tasks issued and not yet reported: 0, 1 or 2.
    pending: usize,
}

/// What a core reports for a finished task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The kernel ran.
    Done {
        /// Its cost in semantic cycles.
        cycles: u64,
    },
    /// The kernel refused its arguments (or the id was unknown to the core).
    Rejected,
    /// The kernel (or the core) failed with an error code.
    Failed {
        /// The code it reported (see [`wsp_ffi::kernel_failed`]).
        code: u32,
    },
}

impl Completion {
    /// Decodes a core's result word (the kernel's return value): its
    /// cycles, [`WSP_KERNEL_REJECTED`], or a failure with an error code
    /// ([`wsp_ffi::KERNEL_FAILED_BASE`] `| code`). Every platform decodes
    /// the word here.
    pub const fn from_result(result: u64) -> Completion {
        if result == WSP_KERNEL_REJECTED {
            Completion::Rejected
        } else if let Some(code) = wsp_ffi::failure_code(result) {
            Completion::Failed { code }
        } else {
            Completion::Done { cycles: result }
        }
    }
}

impl IssuePort<'_> {
    /// Tasks issued and not yet reported by [`IssuePort::poll`].
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// Whether [`IssuePort::issue`] would take a task now: the core holds no
    /// unreported task and has finished the last one, or holds one that it
    /// has acknowledged.
    pub fn can_issue(&self) -> bool {
        let cond = self.mailbox.cond.load(Ordering::Acquire);
        match self.pending {
            0 => self.last == 0 || cond == self.last | FIN,
            1 => cond & !FIN == self.last,
            _ => false,
        }
    }

    /// Hands a task to the core. Returns `false` (and does nothing) if the
    /// core cannot take it now (see [`IssuePort::can_issue`]).
    ///
    /// # Safety
    /// 1. Every tensor view in `args` names memory that stays valid until
    ///    [`IssuePort::poll`] reports the completion of this task.
    /// 2. Until then nothing else writes any region the views name, and nothing
    ///    else reads a region the kernel writes.
    pub unsafe fn issue(&mut self, kernel_id: u32, args: &WspKernelArgs) -> bool {
        if !self.can_issue() {
            return false;
        }
        let id = next_id(self.last);
        // SAFETY: buffer `id & 1` was last used by task `id - 2`, which has
        // been reported (at most one task, `last = id - 1`, is pending), and
        // the core, on `last` or idle, does not read it before seeing `id`.
        self.mailbox.payload[(id & 1) as usize].with_mut(|p| unsafe {
            *p = Payload {
                kernel_id,
                args: *args,
                result: 0,
            }
        });
        self.mailbox.task.store(id, Ordering::Release);
        if self.pending == 0 {
            self.oldest = id;
        }
        self.last = id;
        self.pending += 1;
        true
    }

    /// The completion of the oldest task issued and not yet reported, if the
    /// core has finished it. Completions come in issue order.
    pub fn poll(&mut self) -> Option<Completion> {
        if self.pending == 0 {
            return None;
        }
        let cond = self.mailbox.cond.load(Ordering::Acquire);
        let finished = cond == self.oldest | FIN || (self.pending == 2 && cond & !FIN == self.last);
        if !finished {
            return None;
        }
        // SAFETY: the core wrote the result before publishing FIN `oldest`
        // (or, later in its order, anything about the next task) with
        // Release, observed above with Acquire, and does not touch the
        // buffer again until the scheduler issues a task that uses it.
        let result =
            self.mailbox.payload[(self.oldest & 1) as usize].with(|p| unsafe { (*p).result });
        self.pending -= 1;
        self.oldest = self.last;
        Some(Completion::from_result(result))
    }

    /// Whether the core has acknowledged (taken) the oldest task issued and
    /// not yet reported; `true` when there is none. A task not acknowledged
    /// long after its issue means a core that does not answer.
    pub fn acknowledged(&self) -> bool {
        if self.pending == 0 {
            return true;
        }
        let taken = self.mailbox.cond.load(Ordering::Acquire) & !FIN;
        taken == self.oldest || (self.pending == 2 && taken == self.last)
    }
}

impl Drop for IssuePort<'_> {
    fn drop(&mut self) {
        self.mailbox.issuer_claimed.store(false, Ordering::Release);
    }
}

/// Why [`serve`] did not run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlreadyServed;

/// The core's loop: runs each issued task's kernel through the kernel registry
/// until [`CoreMailbox::request_exit`] is called. `relax` is called while idle
/// (a spin hint, a yield, or `wfe`). Returns the number of tasks it ran. A
/// mailbox serves one run: after the exit its `task` register stays [`EXIT`].
pub fn serve(mailbox: &CoreMailbox, relax: impl Fn()) -> Result<u32, AlreadyServed> {
    serve_with(mailbox, relax, |kernel_id, args| {
        match wsp_ffi::lookup(kernel_id) {
            // SAFETY: `serve_with` passes the arguments of a task the scheduler
            // issued, whose `issue` contract makes the views valid and unshared
            // until the task is reported.
            Some(info) => unsafe { info.invoke(args) }.unwrap_or(WSP_KERNEL_REJECTED),
            None => WSP_KERNEL_REJECTED,
        }
    })
}

/// As [`serve`], with `run` in place of the kernel registry: `run(kernel_id,
/// args)` runs each issued task and returns its cycles, or
/// [`WSP_KERNEL_REJECTED`]. The views in `args` are valid and unshared for
/// the call (the scheduler's [`IssuePort::issue`] contract). The firmware's
/// measuring mode passes a `run` that returns 0 at once (empty kernels).
pub fn serve_with(
    mailbox: &CoreMailbox,
    relax: impl Fn(),
    mut run: impl FnMut(u32, &WspKernelArgs) -> u64,
) -> Result<u32, AlreadyServed> {
    if mailbox.core_claimed.swap(true, Ordering::Acquire) {
        return Err(AlreadyServed);
    }
    // The last task this core took, from its own register (none at first).
    let own = mailbox.cond.load(Ordering::Acquire) & !FIN;
    let mut seen = if own < EXIT { own } else { 0 };
    let mut served = 0u32;
    loop {
        let task = mailbox.task.load(Ordering::Acquire);
        if task == EXIT {
            mailbox.cond.store(COND_EXITED, Ordering::Release);
            mailbox.core_claimed.store(false, Ordering::Release);
            return Ok(served);
        }
        if task == seen {
            relax();
            continue;
        }
        mailbox.cond.store(task, Ordering::Release);
        let buffer = &mailbox.payload[(task & 1) as usize];
        // SAFETY: the scheduler published the payload before `task`
        // (Release/Acquire) and does not write this buffer until it has seen
        // FIN `task`.
        let payload = buffer.with(|p| unsafe { *p });
        let result = run(payload.kernel_id, &payload.args);
        // SAFETY: as above; the scheduler reads the result only after FIN.
        buffer.with_mut(|p| unsafe { (*p).result = result });
        mailbox.cond.store(task | FIN, Ordering::Release);
        seen = task;
        served += 1;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use wsp_ffi::WspTensorView;

    fn view(data: &mut [f32], cols: u32) -> WspTensorView {
        let rows = data.len() as u32 / cols;
        WspTensorView {
            addr: data.as_mut_ptr() as u64,
            rows,
            cols,
            row_stride: cols,
            dtype: wsp_ffi::DTYPE_F32,
        }
    }

    fn wait(port: &mut IssuePort<'_>) -> Completion {
        loop {
            if let Some(c) = port.poll() {
                return c;
            }
            std::thread::yield_now();
        }
    }

    #[test]
    fn ids_skip_the_reserved_values_keeping_parity() {
        assert_eq!(next_id(0), 1);
        assert_eq!(next_id(41), 42);
        assert_eq!(next_id(EXIT - 1), 2, "EXIT - 1 is odd: the next even id");
        assert_eq!(next_id(EXIT - 2), EXIT - 1);
        assert_eq!(next_id(next_id(EXIT - 1)) & 1, 1);
    }

    #[test]
    fn issues_runs_and_completes_on_another_thread() {
        let mailbox = CoreMailbox::new();
        let (mut a, mut b, mut c) = (vec![1.5f32; 16], vec![2.0f32; 16], vec![0f32; 16]);
        std::thread::scope(|s| {
            let mut port = mailbox.claim_issue().expect("first claim");
            assert!(
                mailbox.claim_issue().is_none(),
                "a second scheduler is refused"
            );
            let args = WspKernelArgs {
                num_tensors: 3,
                num_scalars: 0,
                tensors: [
                    view(&mut a, 4),
                    view(&mut b, 4),
                    view(&mut c, 4),
                    view(&mut [], 1),
                ],
                scalars: [0; 4],
            };
            // Before the core runs: the first task goes into a buffer, the
            // second waits for the core to acknowledge the first.
            // SAFETY: a, b, c outlive the tasks and are untouched until poll reports them.
            assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
            assert!(
                // SAFETY: as above.
                !unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) },
                "an unacknowledged task is not overwritten"
            );
            assert_eq!(port.poll(), None);
            let core = s.spawn(|| serve(&mailbox, std::thread::yield_now));
            for round in 0..3 {
                // Keep two tasks in flight: issue the next once the core has
                // taken the previous.
                while !port.can_issue() {
                    std::thread::yield_now();
                }
                // SAFETY: as above.
                assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
                assert_eq!(port.pending(), 2);
                assert!(
                    // SAFETY: as above.
                    !unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) },
                    "a third task is refused (round {round})"
                );
                assert_eq!(wait(&mut port), Completion::Done { cycles: 4 * 16 });
            }
            assert_eq!(wait(&mut port), Completion::Done { cycles: 4 * 16 });
            assert_eq!(port.pending(), 0);
            // An unknown kernel id is reported, not run.
            while !port.can_issue() {
                std::thread::yield_now();
            }
            // SAFETY: as above.
            assert!(unsafe { port.issue(999, &args) });
            assert_eq!(wait(&mut port), Completion::Rejected);
            mailbox.request_exit();
            assert_eq!(core.join().unwrap(), Ok(5));
            assert!(mailbox.has_exited());
            assert!(!port.can_issue(), "an exited core takes nothing");
        });
        assert!(c.iter().all(|&x| x == 3.5));
    }

    #[test]
    fn serve_with_runs_its_own_function_instead_of_the_kernel() {
        let mailbox = CoreMailbox::new();
        // An ADD whose views name no memory: the registry would reject it.
        let args = WspKernelArgs {
            num_tensors: 0,
            num_scalars: 0,
            tensors: [view(&mut [], 1); 4],
            scalars: [0; 4],
        };
        std::thread::scope(|s| {
            let mut port = mailbox.claim_issue().expect("first claim");
            let core = s.spawn(|| {
                let mut seen = Vec::new();
                let served = serve_with(&mailbox, std::thread::yield_now, |id, args| {
                    seen.push((id, args.num_tensors));
                    7
                });
                (served, seen)
            });
            for _ in 0..3 {
                while !port.can_issue() {
                    std::thread::yield_now();
                }
                // SAFETY: the views name no memory and `run` reads none.
                assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
                assert_eq!(wait(&mut port), Completion::Done { cycles: 7 });
            }
            mailbox.request_exit();
            let (served, seen) = core.join().unwrap();
            assert_eq!(served, Ok(3));
            assert_eq!(seen, vec![(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, 0); 3]);
        });
    }

    #[test]
    fn the_result_word_decodes_in_one_place() {
        assert_eq!(Completion::from_result(0), Completion::Done { cycles: 0 });
        assert_eq!(
            Completion::from_result(1234),
            Completion::Done { cycles: 1234 }
        );
        assert_eq!(Completion::from_result(u64::MAX), Completion::Rejected);
        assert_eq!(
            Completion::from_result(wsp_ffi::kernel_failed(7)),
            Completion::Failed { code: 7 }
        );
        // Code 0 is a failure too, not a success (what `--fault
        // error:CORE:TASK:0` stands for).
        assert_eq!(
            Completion::from_result(wsp_ffi::kernel_failed(0)),
            Completion::Failed { code: 0 }
        );
        assert_eq!(
            Completion::from_result(wsp_ffi::kernel_failed(u32::MAX)),
            Completion::Failed { code: u32::MAX }
        );
        // Just below the failure range: still cycles.
        let below = wsp_ffi::KERNEL_FAILED_BASE - 1;
        assert_eq!(
            Completion::from_result(below),
            Completion::Done { cycles: below }
        );
    }

    #[test]
    fn acknowledged_follows_the_cores_cond_register() {
        let mailbox = CoreMailbox::new();
        let mut port = mailbox.claim_issue().unwrap();
        assert!(
            port.acknowledged(),
            "nothing issued: nothing to acknowledge"
        );
        let args = WspKernelArgs {
            num_tensors: 0,
            num_scalars: 0,
            tensors: [view(&mut [], 1); 4],
            scalars: [0; 4],
        };
        // SAFETY: the views name no memory and no core runs the task.
        assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
        assert!(!port.acknowledged(), "issued, not taken");
        mailbox.cond.store(1, Ordering::Release);
        assert!(port.acknowledged(), "ACK 1");
        // SAFETY: as above.
        assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
        assert!(
            port.acknowledged(),
            "the oldest (1) is taken; 2 waits behind it"
        );
        mailbox.cond.store(1 | FIN, Ordering::Release);
        assert_eq!(port.poll(), Some(Completion::Done { cycles: 0 }));
        assert!(!port.acknowledged(), "task 2 not taken yet");
        mailbox.cond.store(2, Ordering::Release);
        assert!(port.acknowledged());
    }

    #[test]
    fn a_second_core_is_refused() {
        let mailbox = CoreMailbox::new();
        mailbox.request_exit();
        mailbox.core_claimed.store(true, Ordering::Relaxed);
        assert_eq!(serve(&mailbox, || {}), Err(AlreadyServed));
    }

    #[test]
    fn a_new_scheduler_waits_for_an_unfinished_task() {
        let mailbox = CoreMailbox::new();
        // An earlier scheduler issued task 1 and left; the core has only
        // acknowledged it.
        mailbox.task.store(1, Ordering::Relaxed);
        mailbox.cond.store(1, Ordering::Relaxed);
        let port = mailbox.claim_issue().unwrap();
        assert!(!port.can_issue());
        mailbox.cond.store(1 | FIN, Ordering::Relaxed);
        assert!(port.can_issue());
    }
}

/// Model check of the protocol: every interleaving of one scheduler and one
/// core over two tasks in flight at once (one per buffer) and the exit.
#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use wsp_ffi::WspTensorView;

    fn wait(port: &mut IssuePort<'_>) -> Completion {
        loop {
            if let Some(c) = port.poll() {
                return c;
            }
            loom::thread::yield_now();
        }
    }

    #[test]
    fn double_buffered_issue_poll_and_exit_in_every_interleaving() {
        loom::model(|| {
            let mailbox = Arc::new(CoreMailbox::new());
            let core_side = mailbox.clone();
            // Kernels keep their tiles on the stack: give the core thread room.
            let core = loom::thread::Builder::new()
                .stack_size(1 << 20)
                .spawn(move || serve(&core_side, loom::thread::yield_now))
                .unwrap();
            let data: &'static mut [f32; 3] = Box::leak(Box::new([1.0, 2.0, 0.0]));
            let base = data.as_mut_ptr() as u64;
            let v = |i: u64| WspTensorView {
                addr: base + 4 * i,
                rows: 1,
                cols: 1,
                row_stride: 1,
                dtype: 1,
            };
            let args = WspKernelArgs {
                num_tensors: 3,
                num_scalars: 0,
                tensors: [
                    v(0),
                    v(1),
                    v(2),
                    WspTensorView {
                        addr: 0,
                        rows: 0,
                        cols: 0,
                        row_stride: 0,
                        dtype: 0,
                    },
                ],
                scalars: [0; 4],
            };
            let mut port = mailbox.claim_issue().unwrap();
            // Two tasks in flight: the second goes into the other buffer as
            // soon as the core has acknowledged the first.
            for _ in 0..2 {
                while !port.can_issue() {
                    loom::thread::yield_now();
                }
                // SAFETY: `data` is leaked (lives forever); the kernel (add)
                // writes only data[2], which this thread does not touch before
                // the last completion.
                assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
            }
            for _ in 0..2 {
                assert_eq!(wait(&mut port), Completion::Done { cycles: 4 });
            }
            assert_eq!(port.pending(), 0);
            mailbox.request_exit();
            assert_eq!(core.join().unwrap(), Ok(2));
            assert_eq!(data[2], 3.0);
        });
    }
}
