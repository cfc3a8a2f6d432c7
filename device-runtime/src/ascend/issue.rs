//! [`AscendPlatform`]: the scheduler's [`Platform`] over the per-core
//! registers, with two payload buffers per core.
//!
//! Per core (one scheduler drives it; the protocol is the mailbox's,
//! [`crate::mailbox`], on registers):
//! 1. The scheduler issues task `n` (ids from [`next_id`]) when the core
//!    holds no unreported task and has finished the last one, or holds one
//!    it has acknowledged: it writes payload buffer `n & 1` (the kernel's
//!    `function_bin_addr`, the arguments, the kernel id), then
//!    DATA_MAIN_BASE = `n`.
//! 2. The AICore writes COND = `n` (ACK), runs the kernel, writes the
//!    buffer's `result` word, then COND = `n | FIN`.
//! 3. The scheduler reports task `n` once COND shows FIN `n`, or the next
//!    task (ACK or FIN `n + 1`), and reads `result` after that.
//!
//! A kernel that is not built in (no entry, or address 0, in the kernel
//! address table) is reported by [`Platform::has_kernel`], so a run that
//! needs one ends before anything runs; should one be launched anyway, it
//! is not sent to the core: it takes a slot in the core's queue and is
//! reported as [`Completion::Rejected`] in its turn. The result word is
//! decoded by [`Completion::from_result`], as on every platform.

use wsp_ffi::{CoreKind, WspKernelArgs};

use super::handshake::{CoreError, CoreLink};
use super::layout::{ids, reg, Payload};
use super::regs::Regs;
use crate::mailbox::{next_id, DEPTH, FIN};
use crate::platform::{Clock, Completion, Platform, MAX_CORES};

/// A queued task's id; [`LOCAL_REJECT`] for one never sent to the core.
const LOCAL_REJECT: u32 = 0;

#[derive(Clone, Copy)]
struct CoreState {
    regs: Option<Regs>,
    payloads: usize,
    /// The newest id sent to the core (0: none yet).
    last: u32,
    /// Unreported tasks, oldest first: ids, or [`LOCAL_REJECT`].
    queue: [u32; DEPTH],
    pending: usize,
}

/// Why an [`AscendPlatform`] could not be put together.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AscendError {
    /// Links and kinds differ in number, or there are more than [`MAX_CORES`].
    BadCoreCount { links: usize, kinds: usize },
    /// A core was not brought up ([`super::bring_up`]).
    Core(CoreError),
}

impl core::fmt::Display for AscendError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match *self {
            AscendError::BadCoreCount { links, kinds } => write!(
                f,
                "{links} cores for {kinds} core kinds (they must match and be at most {MAX_CORES})"
            ),
            AscendError::Core(e) => write!(f, "{e}"),
        }
    }
}

/// The Ascend platform: cores reached through their registers and payload
/// buffers, kernels through their addresses on the AICores, and a clock.
pub struct AscendPlatform<'a, C: Clock> {
    cores: [CoreState; MAX_CORES],
    kinds: &'a [CoreKind],
    kernels: &'a [u64],
    clock: C,
}

impl<'a, C: Clock> AscendPlatform<'a, C> {
    /// A platform over `links` (cores brought up by [`super::bring_up`]),
    /// of the given kinds; `kernels[id]` is kernel `id`'s
    /// `function_bin_addr` (0: not built in).
    ///
    /// # Safety
    /// No other platform drives these cores while this one lives (each
    /// core's payload buffers and DATA_MAIN_BASE have one writer).
    pub unsafe fn new(
        links: &[CoreLink],
        kinds: &'a [CoreKind],
        kernels: &'a [u64],
        clock: C,
    ) -> Result<Self, AscendError> {
        if links.len() != kinds.len() || links.len() > MAX_CORES {
            return Err(AscendError::BadCoreCount {
                links: links.len(),
                kinds: kinds.len(),
            });
        }
        let mut cores = [CoreState {
            regs: None,
            payloads: 0,
            last: 0,
            queue: [0; DEPTH],
            pending: 0,
        }; MAX_CORES];
        for (core, link) in links.iter().enumerate() {
            let regs = link
                .regs()
                .ok_or(AscendError::Core(CoreError::NotUp { core }))?;
            cores[core] = CoreState {
                regs: Some(regs),
                payloads: link.payloads() as usize,
                last: 0,
                queue: [0; DEPTH],
                pending: 0,
            };
        }
        Ok(AscendPlatform {
            cores,
            kinds,
            kernels,
            clock,
        })
    }

    /// Makes `last` the newest id sent to `core` (tests of the id wrap).
    #[cfg(all(test, not(loom)))]
    pub(super) fn set_last_id(&mut self, core: usize, last: u32) {
        self.cores[core].last = last;
    }

    /// The clock.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The function address of `kernel_id`, if it is built in.
    fn kernel_addr(&self, kernel_id: u32) -> Option<u64> {
        self.kernels
            .get(kernel_id as usize)
            .copied()
            .filter(|&a| a != 0)
    }

    fn can_issue(&self, core: usize) -> bool {
        let Some(state) = self.cores.get(core).filter(|_| core < self.kinds.len()) else {
            return false;
        };
        let Some(regs) = state.regs else { return false };
        let real = state.queue[..state.pending]
            .iter()
            .rev()
            .find(|&&id| id != LOCAL_REJECT);
        match (state.pending, real) {
            (0, _) | (1, None) => {
                // Every task sent has been reported: the last one finished.
                state.last == 0 || regs.at(reg::COND).load() == state.last | FIN
            }
            (1, Some(&id)) => regs.at(reg::COND).load() & !FIN == id,
            _ => false,
        }
    }

    /// Writes task `id`'s payload buffer and hands it to the core.
    fn send(&mut self, core: usize, kernel_id: u32, addr: u64, args: &WspKernelArgs) -> u32 {
        let state = &mut self.cores[core];
        let id = next_id(state.last);
        let buffer = (state.payloads as *mut Payload).wrapping_add((id & 1) as usize);
        // SAFETY: `CoreLink::new`'s contract: the buffers are valid, aligned
        // and written only by this platform; buffer `id & 1` was last used
        // by task `id - 2`, which has been reported (at most one sent task
        // is unreported, and it is `id - 1`), so the AICore no longer reads
        // or writes it.
        unsafe {
            (*buffer).function_bin_addr = addr;
            (*buffer).args = *args;
            (*buffer).kernel_id = kernel_id;
            (*buffer).result = 0;
        }
        // The part of the buffer the AICore reads, out to memory.
        super::regs::clean_invalidate(
            buffer as *const u8,
            super::layout::PAYLOAD_RESULT_OFFSET + 8,
        );
        if let Some(regs) = state.regs {
            // Publishes the buffer (a Release store / `dmb ish` before it).
            regs.at(reg::DATA_MAIN_BASE).store(id);
        }
        state.last = id;
        id
    }
}

impl<C: Clock> Clock for AscendPlatform<'_, C> {
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

impl<C: Clock> Platform for AscendPlatform<'_, C> {
    fn num_cores(&self) -> usize {
        self.kinds.len()
    }
    fn core_kind(&self, core: usize) -> CoreKind {
        self.kinds[core]
    }
    fn depth(&self) -> usize {
        DEPTH
    }
    fn can_queue(&self, core: usize) -> bool {
        core < self.kinds.len() && self.cores[core].pending > 0 && self.can_issue(core)
    }
    unsafe fn launch(&mut self, core: usize, kernel_id: u32, args: &WspKernelArgs) -> bool {
        if !self.can_issue(core) {
            return false;
        }
        let id = match self.kernel_addr(kernel_id) {
            Some(addr) => self.send(core, kernel_id, addr, args),
            None => LOCAL_REJECT,
        };
        let state = &mut self.cores[core];
        state.queue[state.pending] = id;
        state.pending += 1;
        true
    }
    fn acknowledged(&self, core: usize) -> bool {
        let Some(state) = self.cores.get(core).filter(|_| core < self.kinds.len()) else {
            return true;
        };
        let oldest = state.queue[0];
        if state.pending == 0 || oldest == LOCAL_REJECT {
            return true;
        }
        let Some(regs) = state.regs else { return true };
        // COND holds the newest id the core took (ACK) or finished (FIN):
        // the oldest task, or the one queued behind it (taken in order).
        let taken = regs.at(reg::COND).load() & !FIN;
        taken == oldest
            || (state.pending == 2 && state.queue[1] != LOCAL_REJECT && taken == state.queue[1])
    }
    fn has_kernel(&self, _core: usize, kernel_id: u32) -> bool {
        self.kernel_addr(kernel_id).is_some()
    }
    fn poll(&mut self, core: usize) -> Option<Completion> {
        let state = self.cores.get(core).filter(|_| core < self.kinds.len())?;
        if state.pending == 0 {
            return None;
        }
        let oldest = state.queue[0];
        let completion = if oldest == LOCAL_REJECT {
            Completion::Rejected
        } else {
            let cond = state.regs?.at(reg::COND).load();
            let next = (state.pending == 2)
                .then_some(state.queue[1])
                .filter(|&n| n != LOCAL_REJECT);
            let finished = cond == oldest | FIN || next.is_some_and(|n| cond & !FIN == n);
            if !finished {
                return None;
            }
            let buffer = (state.payloads as *const Payload).wrapping_add((oldest & 1) as usize);
            let result = buffer
                .cast::<u8>()
                .wrapping_add(super::layout::PAYLOAD_RESULT_OFFSET)
                .cast::<u64>();
            // The AICore wrote the result word to memory: drop any stale line.
            super::regs::clean_invalidate(result.cast(), 8);
            // SAFETY: the buffer is valid (`CoreLink::new`) and `result` is its
            // result word (8-aligned); the AICore wrote it before FIN `oldest`
            // (or anything about the next task), which the load above observed
            // with Acquire / `dmb ish`, and it does not write the buffer again
            // until a task that uses it is sent. A volatile read: the AICore's
            // write is outside Rust's view on the device.
            let result = unsafe { result.read_volatile() };
            Completion::from_result(result)
        };
        let state = &mut self.cores[core];
        state.queue[0] = state.queue[1];
        state.pending -= 1;
        Some(completion)
    }
}

// The reserved ids stay out of the id sequence.
const _: () = assert!(next_id(ids::EXIT - 1) < ids::EXIT && ids::AICPU_IDLE > ids::EXIT);
