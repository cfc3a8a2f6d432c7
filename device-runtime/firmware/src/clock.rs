//! The generic timer's virtual counter as the runtime's clock.

use core::arch::asm;

use device_runtime::platform::Clock;

/// Reads CNTVCT_EL0; its rate is CNTFRQ_EL0 (62.5 MHz under QEMU `virt`).
#[derive(Clone, Copy)]
pub struct CounterClock {
    frequency: u64,
}

impl CounterClock {
    pub fn new() -> Self {
        let frequency: u64;
        // SAFETY: `mrs` of CNTFRQ_EL0 only reads a register that EL1 may
        // always read; it touches no memory, stack or flags,
        // as the options declare.
        unsafe {
            asm!("mrs {}, cntfrq_el0", out(reg) frequency, options(nomem, nostack, preserves_flags))
        };
        CounterClock { frequency }
    }
}

impl Clock for CounterClock {
    fn now(&self) -> u64 {
        let ticks: u64;
        // SAFETY: `isb` and an `mrs` of CNTVCT_EL0 touch no memory, stack or
        // flags, as the options declare, and EL1 may always read the counter
        // (no EL2 runs to trap it). The `isb` only keeps the read from being taken
        // early.
        unsafe {
            asm!("isb", "mrs {}, cntvct_el0", out(reg) ticks, options(nomem, nostack, preserves_flags))
        };
        ticks
    }
    fn ticks_per_second(&self) -> u64 {
        self.frequency
    }
    fn relax(&self) {
        relax();
    }
}

/// The spin hint of every wait for another CPU: `yield`, which QEMU's
/// single-threaded TCG (`cargo xtask qemu-bench`) takes as the cue to run
/// the next CPU; elsewhere it is only a hint.
pub fn relax() {
    // SAFETY: `yield` is a hint: it touches no memory, stack or flags, as
    // the options declare.
    unsafe { asm!("yield", options(nomem, nostack, preserves_flags)) };
}

/// Microseconds since the counter started (the log's timestamps).
pub fn micros() -> u64 {
    let clock = CounterClock::new();
    let ticks = clock.now();
    match clock.ticks_per_second() {
        0 => ticks,
        f => (u128::from(ticks) * 1_000_000 / u128::from(f)) as u64,
    }
}
