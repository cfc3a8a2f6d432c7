//! The program's clock: the generic timer's virtual counter on the device
//! (`cntvct_el0`, 50 MHz on the AICPU; its rate read from `cntfrq_el0`),
//! `std`'s monotonic clock in nanoseconds on a hosted build (the tests).

use device_runtime::platform::Clock;

/// The run's clock.
#[derive(Clone, Copy, Debug)]
pub struct AicpuClock {
    #[cfg(target_os = "none")]
    frequency: u64,
    #[cfg(not(target_os = "none"))]
    start: std::time::Instant,
}

impl AicpuClock {
    /// The clock.
    pub fn new() -> Self {
        #[cfg(all(target_os = "none", target_arch = "aarch64"))]
        {
            let frequency: u64;
            // SAFETY: `mrs` of CNTFRQ_EL0 reads a register EL0 may read
            // (Linux enables user access to the virtual counter); it touches
            // no memory, stack or flags.
            unsafe {
                core::arch::asm!("mrs {}, cntfrq_el0", out(reg) frequency,
                    options(nomem, nostack, preserves_flags))
            };
            AicpuClock { frequency }
        }
        #[cfg(all(target_os = "none", not(target_arch = "aarch64")))]
        {
            AicpuClock { frequency: 1 }
        }
        #[cfg(not(target_os = "none"))]
        {
            AicpuClock {
                start: std::time::Instant::now(),
            }
        }
    }
}

impl Default for AicpuClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for AicpuClock {
    fn now(&self) -> u64 {
        #[cfg(all(target_os = "none", target_arch = "aarch64"))]
        {
            let ticks: u64;
            // SAFETY: `isb` and an `mrs` of CNTVCT_EL0 (readable from EL0 under
            // Linux) touch no memory, stack or flags.
            unsafe {
                core::arch::asm!("isb", "mrs {}, cntvct_el0", out(reg) ticks,
                    options(nomem, nostack, preserves_flags))
            };
            ticks
        }
        #[cfg(all(target_os = "none", not(target_arch = "aarch64")))]
        {
            0
        }
        #[cfg(not(target_os = "none"))]
        {
            self.start.elapsed().as_nanos() as u64
        }
    }
    fn ticks_per_second(&self) -> u64 {
        #[cfg(target_os = "none")]
        {
            self.frequency.max(1)
        }
        #[cfg(not(target_os = "none"))]
        {
            1_000_000_000
        }
    }
    fn pause(&self) {
        #[cfg(not(target_os = "none"))]
        std::thread::yield_now();
        #[cfg(target_os = "none")]
        self.relax();
    }
}
