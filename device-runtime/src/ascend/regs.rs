//! Access to the memory an AICore shares with the AICPU: its 32-bit
//! registers and its handshake record's fields.
//!
//! Each access is one 32-bit (or, for the handshake's `task`, 64-bit) load
//! or store with the ordering of a message-passing protocol: a store
//! publishes everything written before it (the payload buffer, the
//! handshake's `task`), a load makes everything the other side wrote
//! before its store visible to what follows.
//!
//! - On the device (`target_os = "none"`, and the AICPU program built for
//!   it) the locations are MMIO registers and memory the AICore writes
//!   without taking part in Rust's memory model: each access is a volatile
//!   load or store (the compiler neither elides, merges nor reorders it
//!   with other volatile accesses) with `dmb ish` before and after it, as
//!   CANN's own AICPU code does. Atomic instructions are not an option on
//!   Device memory (exclusives are UNPREDICTABLE there).
//! - On a hosted target (the host tests, a launcher that emulates AICores
//!   with threads) the same memory is shared with other threads of the
//!   process: each access is an atomic load (Acquire) or store (Release)
//!   through `AtomicU32::from_ptr`, so the program is data-race free as
//!   long as the other side also accesses these words atomically (the
//!   emulators do: Rust atomics, C11 `__atomic` builtins). The ordering is
//!   the mailbox's (`crate::mailbox`), whose loom model checks the same
//!   publication pattern, so no new pattern is introduced here. These are
//!   `core` atomics, not `crate::sync`'s: loom's atomics cannot stand for
//!   memory they do not own.

/// A 32-bit word shared with an AICore.
#[derive(Clone, Copy, Debug)]
pub struct Shared32(*mut u32);

/// A 64-bit word shared with an AICore.
#[derive(Clone, Copy, Debug)]
pub struct Shared64(*mut u64);

impl Shared32 {
    /// The word at `ptr`.
    ///
    /// # Safety
    /// `ptr` is aligned to 4 and valid for reads and writes for as long as
    /// the value (and its copies) is used, and everything else accesses the
    /// word only through 32-bit accesses of the kind described in the
    /// module docs (volatile on the device, atomic on a hosted target).
    pub const unsafe fn new(ptr: *mut u32) -> Self {
        Shared32(ptr)
    }

    /// Reads the word; later reads see what the writer wrote before it.
    pub fn load(self) -> u32 {
        #[cfg(target_os = "none")]
        {
            barrier();
            // SAFETY: `new`'s contract: aligned and valid for reads; the
            // other side uses single 32-bit accesses, so this read is not
            // torn.
            let v = unsafe { core::ptr::read_volatile(self.0) };
            barrier();
            v
        }
        #[cfg(not(target_os = "none"))]
        {
            // SAFETY: `new`'s contract: aligned, valid, and accessed by
            // everyone else only atomically, as `from_ptr` requires.
            unsafe { core::sync::atomic::AtomicU32::from_ptr(self.0) }
                .load(core::sync::atomic::Ordering::Acquire)
        }
    }

    /// Writes the word; a reader that sees it sees what was written before.
    pub fn store(self, value: u32) {
        #[cfg(target_os = "none")]
        {
            barrier();
            // SAFETY: `new`'s contract: aligned and valid for writes.
            unsafe { core::ptr::write_volatile(self.0, value) };
            barrier();
        }
        #[cfg(not(target_os = "none"))]
        {
            // SAFETY: as in `load`.
            unsafe { core::sync::atomic::AtomicU32::from_ptr(self.0) }
                .store(value, core::sync::atomic::Ordering::Release)
        }
    }
}

impl Shared64 {
    /// The word at `ptr`.
    ///
    /// # Safety
    /// As [`Shared32::new`], with 8 for 4.
    pub const unsafe fn new(ptr: *mut u64) -> Self {
        Shared64(ptr)
    }

    /// Writes the word, as [`Shared32::store`].
    pub fn store(self, value: u64) {
        #[cfg(target_os = "none")]
        {
            barrier();
            // SAFETY: `new`'s contract: aligned and valid for writes.
            unsafe { core::ptr::write_volatile(self.0, value) };
            barrier();
        }
        #[cfg(not(target_os = "none"))]
        {
            // SAFETY: `new`'s contract: aligned, valid, and accessed by
            // everyone else only atomically, as `from_ptr` requires.
            unsafe { core::sync::atomic::AtomicU64::from_ptr(self.0) }
                .store(value, core::sync::atomic::Ordering::Release)
        }
    }
}

/// `dmb ish` on aarch64 (a compiler fence elsewhere, where bare-metal
/// builds are only compiled, never run).
#[cfg(target_os = "none")]
fn barrier() {
    #[cfg(target_arch = "aarch64")]
    // SAFETY: `dmb ish` orders memory accesses; it touches no memory,
    // stack or flags of its own. (No `nomem`: it must not be moved across
    // the accesses it orders.)
    unsafe {
        core::arch::asm!("dmb ish", options(nostack, preserves_flags))
    };
    #[cfg(not(target_arch = "aarch64"))]
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
}

/// One core's 32-bit registers, at its register base.
#[derive(Clone, Copy, Debug)]
pub struct Regs {
    base: usize,
}

impl Regs {
    /// The registers at `base`.
    ///
    /// # Safety
    /// `base` is aligned to 4 and `[base, base + reg::SPAN)` is the core's
    /// register file (or memory standing for it), valid for as long as the
    /// value is used, accessed as [`Shared32::new`] says.
    pub const unsafe fn new(base: usize) -> Regs {
        Regs { base }
    }

    /// The register at byte offset `offset` (one of [`super::layout::reg`]).
    pub fn at(self, offset: usize) -> Shared32 {
        debug_assert!(offset + 4 <= super::layout::reg::SPAN && offset.is_multiple_of(4));
        // SAFETY: `new`'s contract covers every aligned word of the span,
        // and the offsets are the layout's (inside it, 4-aligned).
        unsafe { Shared32::new((self.base + offset) as *mut u32) }
    }
}

/// Data cache line size assumed for cache maintenance (the AICPU's Arm
/// cores have 64-byte lines).
pub const CACHE_LINE: usize = 64;

/// Cleans and invalidates the data cache lines of `[ptr, ptr + len)` to
/// the point of coherency (`dc civac` per line, then `dsb sy`; `isb`), so
/// that what this core wrote reaches memory an AICore reads and what an
/// AICore wrote there is read afresh. CANN's AICPU code does this before
/// reading host-written data. Nothing on a hosted target, whose memory is
/// coherent between threads. It only moves data between cache and memory:
/// no value changes as seen by any observer.
pub fn clean_invalidate(ptr: *const u8, len: usize) {
    #[cfg(all(target_os = "none", target_arch = "aarch64"))]
    {
        let end = (ptr as usize).saturating_add(len);
        let mut line = ptr as usize & !(CACHE_LINE - 1);
        while line < end {
            // SAFETY: `dc civac` on an address of memory the caller is about
            // to read or has just written (mapped) moves its line between
            // cache and memory; it changes no data and touches no stack.
            unsafe {
                core::arch::asm!("dc civac, {}", in(reg) line, options(nostack, preserves_flags))
            };
            line += CACHE_LINE;
        }
        // SAFETY: barriers only; they touch no memory of their own.
        unsafe { core::arch::asm!("dsb sy", "isb", options(nostack, preserves_flags)) };
    }
    #[cfg(not(all(target_os = "none", target_arch = "aarch64")))]
    {
        let _ = (ptr, len);
    }
}
