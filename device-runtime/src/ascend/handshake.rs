//! Bringing cores up and shutting them down, with bounded waits.
//!
//! Bring-up, per core (CANN's order; every core goes through each step
//! before any core goes through the next, so the waits overlap; the host
//! zeroes the records before the launch):
//! 1. AICPU: `task = &payloads[0]`, then `aicpu_ready = 1`.
//! 2. AICore: `physical_core_id`, then `aicore_regs_ready = 1`. AICPU (once
//!    it sees that): takes the register base `regs[physical_core_id]`,
//!    writes FAST_PATH_ENABLE = 0xE and DATA_MAIN_BASE = 0x7FFFFFFD
//!    (AICPU idle), then `aicpu_regs_ready = 1`.
//! 3. AICore: COND = 0xFFFFFFFF (idle), `core_type`, `aicore_done = idx + 1`.
//!    AICPU waits for `aicore_done != 0`.
//!
//! Shut-down, per core: DATA_MAIN_BASE = 0x7FFFFFF0 (exit), wait for COND =
//! 0xFFFFFFFE (exited), then DATA_MAIN_BASE = 0x7FFFFFFD and
//! FAST_PATH_ENABLE = 0xF.

use core::fmt;

use super::layout::{ids, reg, Handshake, PayloadPair};
use super::regs::{Regs, Shared32, Shared64};
use crate::platform::Clock;

/// Where one core's shared memory is: its handshake record and its payload
/// buffers (given), and its registers (found at bring-up).
#[derive(Clone, Copy, Debug)]
pub struct CoreLink {
    handshake: usize,
    payloads: usize,
    regs: Option<Regs>,
}

impl CoreLink {
    /// A core whose handshake record is at `handshake` and whose payload
    /// buffers are at `payloads`; its registers are unknown until
    /// [`bring_up`].
    ///
    /// # Safety
    /// 1. Both pointers are valid for reads and writes, and aligned, for as
    ///    long as the link (or a copy, or a platform made from it) is used.
    /// 2. The record's words are accessed by everyone else only as
    ///    [`Shared32::new`] says (the AICore, one 32- or 64-bit access each).
    /// 3. The payload buffers are written only by the one platform driving
    ///    this core (and the result word by the AICore, under the protocol).
    pub unsafe fn new(handshake: *mut Handshake, payloads: *mut PayloadPair) -> CoreLink {
        CoreLink {
            handshake: handshake as usize,
            payloads: payloads as usize,
            regs: None,
        }
    }

    /// The core's registers, once [`bring_up`] has found them.
    pub fn regs(&self) -> Option<Regs> {
        self.regs
    }

    #[cfg(all(test, not(loom)))]
    pub(super) fn set_regs_for_test(&mut self, regs: Regs) {
        self.regs = Some(regs);
    }

    /// The payload buffers' address.
    pub(super) fn payloads(&self) -> *mut PayloadPair {
        self.payloads as *mut PayloadPair
    }

    fn field32(&self, offset: usize) -> Shared32 {
        // SAFETY: `new`'s contract: the record is valid and aligned (64),
        // the offsets are its u32 fields' (4-aligned, inside it), and the
        // AICore accesses them one word at a time.
        unsafe { Shared32::new((self.handshake + offset) as *mut u32) }
    }

    fn task_field(&self) -> Shared64 {
        // SAFETY: as in `field32`; `task` is at 8, 8-aligned.
        unsafe {
            Shared64::new((self.handshake + core::mem::offset_of!(Handshake, task)) as *mut u64)
        }
    }
}

macro_rules! field {
    ($link:expr, $name:ident) => {
        $link.field32(core::mem::offset_of!(Handshake, $name))
    };
}

/// The step of bring-up or shut-down a core did not finish in time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// It never wrote `aicore_regs_ready` (step 2).
    RegsReady,
    /// It never wrote `aicore_done` (step 3).
    Done,
    /// It never answered the exit signal with COND = 0xFFFFFFFE.
    Exit,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::RegsReady => "bring-up: no aicore_regs_ready",
            Stage::Done => "bring-up: no aicore_done",
            Stage::Exit => "shut-down: COND never showed exited (0xFFFFFFFE)",
        })
    }
}

/// Why a core could not be brought up or shut down.
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoreError {
    /// `core` did not finish `stage` within the bound.
    Timeout {
        core: usize,
        stage: Stage,
        waited_ticks: u64,
    },
    /// `core` reported a physical id with no entry in the register table.
    BadPhysicalId { core: usize, id: u32, regs: usize },
    /// `core`'s entry in the register table is 0 or not 4-aligned.
    BadRegisterBase { core: usize, id: u32, base: u64 },
    /// `core` has no registers: it was never brought up.
    NotUp { core: usize },
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            CoreError::Timeout {
                core,
                stage,
                waited_ticks,
            } => {
                write!(f, "core {core}: {stage} within {waited_ticks} ticks")
            }
            CoreError::BadPhysicalId { core, id, regs } => write!(
                f,
                "core {core}: physical core id {id} is outside the register table ({regs} entries)"
            ),
            CoreError::BadRegisterBase { core, id, base } => write!(
                f,
                "core {core}: register base {base:#x} of physical core {id} is null or unaligned"
            ),
            CoreError::NotUp { core } => write!(f, "core {core}: not brought up"),
        }
    }
}

/// Waits until `done()` or until `limit` ticks of `clock` have passed
/// since `start`; whether `done()` became true.
fn wait_until(clock: &impl Clock, start: u64, limit: u64, mut done: impl FnMut() -> bool) -> bool {
    loop {
        if done() {
            return true;
        }
        if clock.now().wrapping_sub(start) > limit {
            return done();
        }
        clock.relax();
    }
}

/// Brings every core in `cores` up (the module docs' steps), each wait
/// bounded by `limit` ticks of `clock` (all cores' waits of a step run
/// together: the whole bring-up takes at most about twice `limit`).
/// `regs[i]` is the register base of physical core `i`. Each link that
/// got through step 2 knows its registers (pass them all to
/// [`shut_down`], even after an error); the first core that failed is
/// the error.
///
/// # Safety
/// Every nonzero, 4-aligned entry of `regs` that an AICore's
/// `physical_core_id` selects is that core's register file, as
/// [`Regs::new`] requires.
pub unsafe fn bring_up(
    cores: &mut [CoreLink],
    regs: &[u64],
    clock: &impl Clock,
    limit: u64,
) -> Result<(), CoreError> {
    // The AICore's fields are its own (the host zeroes the records before
    // the launch): clearing them here would race with an AICore that is
    // already answering.
    for link in cores.iter() {
        field!(link, aicpu_regs_ready).store(0);
        link.task_field().store(link.payloads as u64);
        field!(link, aicpu_ready).store(1);
    }
    // A core that fails a step is reported (the first one) but does not
    // stop the others: every core that answers finishes its bring-up, so
    // that `shut_down` can release it rather than leave it waiting.
    let mut first: Option<CoreError> = None;
    let start = clock.now();
    for (core, link) in cores.iter_mut().enumerate() {
        let answered = wait_until(clock, start, limit, || {
            field!(link, aicore_regs_ready).load() != 0
        });
        let found = if answered {
            // SAFETY: this fn's contract, passed on.
            unsafe { register_base(core, link, regs) }
        } else {
            Err(CoreError::Timeout {
                core,
                stage: Stage::RegsReady,
                waited_ticks: limit,
            })
        };
        let r = match found {
            Ok(r) => r,
            Err(e) => {
                first.get_or_insert(e);
                continue;
            }
        };
        r.at(reg::FAST_PATH_ENABLE).store(reg::FAST_PATH_OPEN);
        r.at(reg::DATA_MAIN_BASE).store(ids::AICPU_IDLE);
        link.regs = Some(r);
        field!(link, aicpu_regs_ready).store(1);
    }
    let start = clock.now();
    for (core, link) in cores.iter().enumerate() {
        if link.regs.is_none() {
            continue;
        }
        if !wait_until(clock, start, limit, || {
            field!(link, aicore_done).load() != 0
        }) {
            first.get_or_insert(CoreError::Timeout {
                core,
                stage: Stage::Done,
                waited_ticks: limit,
            });
        }
    }
    first.map_or(Ok(()), Err)
}

/// The register base of `core` from the physical id it reported.
///
/// # Safety
/// As [`bring_up`]'s: a nonzero aligned entry of `regs` selected by the
/// core's physical id is its register file.
unsafe fn register_base(core: usize, link: &CoreLink, regs: &[u64]) -> Result<Regs, CoreError> {
    let id = field!(link, physical_core_id).load();
    let base = *regs.get(id as usize).ok_or(CoreError::BadPhysicalId {
        core,
        id,
        regs: regs.len(),
    })?;
    if base == 0 || !base.is_multiple_of(4) || usize::try_from(base).is_err() {
        return Err(CoreError::BadRegisterBase { core, id, base });
    }
    // SAFETY: this fn's contract: a nonzero aligned entry selected by the
    // core's physical id is its register file.
    Ok(unsafe { Regs::new(base as usize) })
}

/// Shuts every core in `cores` down (the module docs' steps), each wait
/// bounded by `limit` ticks; a core that does not answer is closed anyway
/// and the first such core is reported. Call it when no core holds a task.
pub fn shut_down(cores: &[CoreLink], clock: &impl Clock, limit: u64) -> Result<(), CoreError> {
    let mut first = None;
    for (core, link) in cores.iter().enumerate() {
        match link.regs {
            Some(r) => r.at(reg::DATA_MAIN_BASE).store(ids::EXIT),
            None => {
                first.get_or_insert(CoreError::NotUp { core });
            }
        }
    }
    let start = clock.now();
    for (core, link) in cores.iter().enumerate() {
        let Some(r) = link.regs else { continue };
        let exited = wait_until(clock, start, limit, || {
            r.at(reg::COND).load() == ids::COND_EXITED
        });
        if !exited {
            first.get_or_insert(CoreError::Timeout {
                core,
                stage: Stage::Exit,
                waited_ticks: limit,
            });
        }
        r.at(reg::DATA_MAIN_BASE).store(ids::AICPU_IDLE);
        r.at(reg::FAST_PATH_ENABLE).store(reg::FAST_PATH_CLOSE);
    }
    first.map_or(Ok(()), Err)
}
