//! PSCI calls over HVC (QEMU `virt` implements PSCI itself when it runs no
//! EL2/EL3 firmware, with HVC as the conduit).

use core::arch::asm;
use core::fmt;

/// CPU_ON, SMC64 calling convention.
const CPU_ON64: u64 = 0xC400_0003;

/// A PSCI error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PsciError(pub i64);

impl fmt::Display for PsciError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            -1 => "NOT_SUPPORTED",
            -2 => "INVALID_PARAMETERS",
            -3 => "DENIED",
            -4 => "ALREADY_ON",
            -5 => "ON_PENDING",
            -6 => "INTERNAL_FAILURE",
            -9 => "INVALID_ADDRESS",
            _ => "unknown error",
        };
        write!(f, "PSCI {name} ({})", self.0)
    }
}

/// Powers on the core with affinity `mpidr`; it starts at `entry` (a physical
/// address, EL1, MMU off) with `context` in x0.
pub fn cpu_on(mpidr: u64, entry: u64, context: u64) -> Result<(), PsciError> {
    let ret: i64;
    // SAFETY: CPU_ON only starts another core at `entry`; it does not touch
    // this core's memory or stack. The SMC calling convention lets the call
    // clobber x0-x17, which `clobber_abi("C")` declares.
    unsafe {
        asm!(
            "hvc #0",
            inout("x0") CPU_ON64 => ret,
            inout("x1") mpidr => _,
            inout("x2") entry => _,
            inout("x3") context => _,
            clobber_abi("C"),
            options(nostack),
        );
    }
    if ret == 0 {
        Ok(())
    } else {
        Err(PsciError(ret))
    }
}
