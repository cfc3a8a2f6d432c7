//! A per-core mailbox: how a scheduler issues one task at a time to a core
//! that shares memory with it (host threads in the shim, secondary cores
//! under QEMU), and how the core reports completion.
//!
//! Protocol (one scheduler, one core, single task in flight):
//! 1. The scheduler sees the core idle (`done == issued`), writes the payload,
//!    then publishes `issued = seq + 1` with Release.
//! 2. The core sees `issued != done` with Acquire, copies the payload, runs the
//!    kernel, writes the result, then publishes `done = issued` with Release.
//! 3. The scheduler sees `done == issued` with Acquire and reads the result.
//!
//! The payload and result cells are therefore never accessed by both sides at
//! once. Each side claims its end once ([`CoreMailbox::claim_issue`],
//! [`serve`]), so two schedulers or two cores cannot share a mailbox.

use wsp_ffi::{WspKernelArgs, WSP_KERNEL_REJECTED};

use crate::sync::{maybe_const_fn, AtomicBool, AtomicU32, Ordering, UnsafeCell};

#[derive(Clone, Copy)]
struct Payload {
    kernel_id: u32,
    args: WspKernelArgs,
}

/// One core's mailbox; place it in memory both sides can reach.
#[repr(C, align(64))]
pub struct CoreMailbox {
    issued: AtomicU32,
    done: AtomicU32,
    exit: AtomicBool,
    issuer_claimed: AtomicBool,
    core_claimed: AtomicBool,
    payload: UnsafeCell<Payload>,
    result: UnsafeCell<u64>,
}

// SAFETY: the cells are only touched under the protocol in the module docs:
// the payload by the scheduler while the core is idle and by the core between
// seeing `issued` advance and publishing `done`; the result by the core before
// publishing `done` and by the scheduler after observing it. The claim flags
// make sure there is one scheduler and one core per mailbox.
unsafe impl Sync for CoreMailbox {}

impl Default for CoreMailbox {
    fn default() -> Self {
        Self::new()
    }
}

impl CoreMailbox {
    maybe_const_fn! {
    pub fn new() -> Self {
        const EMPTY: wsp_ffi::WspTensorView = wsp_ffi::WspTensorView { addr: 0, rows: 0, cols: 0, row_stride: 0, dtype: 0 };
        CoreMailbox {
            issued: AtomicU32::new(0),
            done: AtomicU32::new(0),
            exit: AtomicBool::new(false),
            issuer_claimed: AtomicBool::new(false),
            core_claimed: AtomicBool::new(false),
            payload: UnsafeCell::new(Payload {
                kernel_id: 0,
                args: WspKernelArgs {
                    num_tensors: 0,
                    num_scalars: 0,
                    tensors: [EMPTY; wsp_ffi::WSP_MAX_TENSOR_ARGS as usize],
                    scalars: [0; wsp_ffi::WSP_MAX_SCALARS as usize],
                },
            }),
            result: UnsafeCell::new(0),
        }
    }
    }

    /// Claims the scheduler's end. `None` if another scheduler holds it.
    pub fn claim_issue(&self) -> Option<IssuePort<'_>> {
        if self.issuer_claimed.swap(true, Ordering::Acquire) {
            return None;
        }
        let seq = self.issued.load(Ordering::Acquire);
        let busy = self.done.load(Ordering::Acquire) != seq;
        Some(IssuePort {
            mailbox: self,
            seq,
            busy,
        })
    }

    /// Asks the core to leave [`serve`] once it has finished its current task.
    pub fn request_exit(&self) {
        self.exit.store(true, Ordering::Release);
    }
}

/// The scheduler's end of a mailbox.
pub struct IssuePort<'a> {
    mailbox: &'a CoreMailbox,
    seq: u32,
    busy: bool,
}

/// What a core reports for a finished task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Completion {
    /// The kernel ran; its cost in semantic cycles.
    Done { cycles: u64 },
    /// The kernel refused its arguments (or the id was unknown to the core).
    Rejected,
}

impl IssuePort<'_> {
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Hands a task to the core. Returns `false` (and does nothing) if the core
    /// still runs the previous task.
    ///
    /// # Safety
    /// 1. Every tensor view in `args` names memory that stays valid until
    ///    [`IssuePort::poll`] reports the completion of this task.
    /// 2. Until then nothing else writes any region the views name, and nothing
    ///    else reads a region the kernel writes.
    pub unsafe fn issue(&mut self, kernel_id: u32, args: &WspKernelArgs) -> bool {
        if self.busy {
            return false;
        }
        // SAFETY: the core is idle (`done == issued` was observed with Acquire
        // by `poll` or `claim_issue`), so it does not read the payload now.
        self.mailbox.payload.with_mut(|p| unsafe {
            *p = Payload {
                kernel_id,
                args: *args,
            }
        });
        self.seq = self.seq.wrapping_add(1);
        self.mailbox.issued.store(self.seq, Ordering::Release);
        self.busy = true;
        true
    }

    /// The completion of the task in flight, if the core has finished it.
    pub fn poll(&mut self) -> Option<Completion> {
        if !self.busy || self.mailbox.done.load(Ordering::Acquire) != self.seq {
            return None;
        }
        // SAFETY: the core published `done == seq` with Release after writing
        // the result and does not touch it again until the next issue.
        let result = self.mailbox.result.with(|r| unsafe { *r });
        self.busy = false;
        Some(if result == WSP_KERNEL_REJECTED {
            Completion::Rejected
        } else {
            Completion::Done { cycles: result }
        })
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
/// until [`CoreMailbox::request_exit`] is called and no task is pending.
/// `relax` is called while idle (a spin hint, a yield, or `wfe`).
pub fn serve(mailbox: &CoreMailbox, relax: impl Fn()) -> Result<u32, AlreadyServed> {
    if mailbox.core_claimed.swap(true, Ordering::Acquire) {
        return Err(AlreadyServed);
    }
    let mut seen = mailbox.done.load(Ordering::Acquire);
    let mut served = 0u32;
    loop {
        let issued = mailbox.issued.load(Ordering::Acquire);
        if issued != seen {
            // SAFETY: the scheduler published the payload before `issued`
            // (Release/Acquire) and does not write it until we publish `done`.
            let payload = mailbox.payload.with(|p| unsafe { *p });
            let result = match wsp_ffi::lookup(payload.kernel_id) {
                // SAFETY: the scheduler's `issue` contract makes the views
                // valid and unshared for this task.
                Some(info) => unsafe { info.invoke(&payload.args) }.unwrap_or(WSP_KERNEL_REJECTED),
                None => WSP_KERNEL_REJECTED,
            };
            // SAFETY: the scheduler reads the result only after `done` below.
            mailbox.result.with_mut(|r| unsafe { *r = result });
            mailbox.done.store(issued, Ordering::Release);
            seen = issued;
            served += 1;
        } else if mailbox.exit.load(Ordering::Acquire) {
            mailbox.core_claimed.store(false, Ordering::Release);
            return Ok(served);
        } else {
            relax();
        }
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

    #[test]
    fn issues_runs_and_completes_on_another_thread() {
        let mailbox = CoreMailbox::new();
        let (mut a, mut b, mut c) = (vec![1.5f32; 16], vec![2.0f32; 16], vec![0f32; 16]);
        std::thread::scope(|s| {
            let core = s.spawn(|| serve(&mailbox, std::thread::yield_now));
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
            for round in 0..3 {
                // SAFETY: a, b, c outlive the task and are untouched until poll reports it.
                assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
                // SAFETY: as above.
                assert!(
                    !unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) },
                    "busy core refuses"
                );
                let completion = loop {
                    if let Some(c) = port.poll() {
                        break c;
                    }
                    std::thread::yield_now();
                };
                assert_eq!(
                    completion,
                    Completion::Done { cycles: 4 * 16 },
                    "round {round}"
                );
            }
            // An unknown kernel id is reported, not run.
            // SAFETY: as above.
            assert!(unsafe { port.issue(999, &args) });
            let completion = loop {
                if let Some(c) = port.poll() {
                    break c;
                }
                std::thread::yield_now();
            };
            assert_eq!(completion, Completion::Rejected);
            mailbox.request_exit();
            assert_eq!(core.join().unwrap(), Ok(4));
        });
        assert!(c.iter().all(|&x| x == 3.5));
    }

    #[test]
    fn a_second_core_is_refused() {
        let mailbox = CoreMailbox::new();
        mailbox.request_exit();
        mailbox.core_claimed.store(true, Ordering::Relaxed);
        assert_eq!(serve(&mailbox, || {}), Err(AlreadyServed));
    }
}

/// Model check of the protocol: every interleaving of one scheduler and one
/// core over two tasks and the exit request.
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
    fn issue_poll_and_exit_in_every_interleaving() {
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
            for _ in 0..2 {
                // SAFETY: `data` is leaked (lives forever) and untouched by this
                // thread until the completion is polled.
                assert!(unsafe { port.issue(wsp_ffi::WspKernelId_WSP_KERNEL_ADD, &args) });
                assert_eq!(wait(&mut port), Completion::Done { cycles: 4 });
            }
            mailbox.request_exit();
            assert_eq!(core.join().unwrap(), Ok(2));
            assert_eq!(data[2], 3.0);
        });
    }
}
