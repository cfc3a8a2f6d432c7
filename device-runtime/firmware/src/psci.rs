//! PSCI calls over HVC (QEMU `virt` implements PSCI itself when it runs no
//! EL2/EL3 firmware, with HVC as the conduit).

use core::arch::asm;
use core::fmt;

/// CPU_ON, SMC64 calling convention.
const CPU_ON64: u64 = 0xC400_0003;
/// AFFINITY_INFO, SMC64 calling convention.
const AFFINITY_INFO64: u64 = 0xC400_0004;
/// PSCI's INVALID_PARAMETERS: among others, "no such core".
const INVALID_PARAMETERS: i64 = -2;

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

/// How many of the cores with MPIDR affinity 0, 1, .. `limit - 1` exist
/// (QEMU `virt` numbers its first 8 CPUs so): the first one that PSCI
/// AFFINITY_INFO answers with INVALID_PARAMETERS is missing. `limit` if all
/// exist; `None` if PSCI cannot tell (e.g. a PSCI 0.1 implementation).
/// Asking changes no core's state.
pub fn count_cpus(limit: usize) -> Option<usize> {
    for cpu in 0..limit {
        match call(AFFINITY_INFO64, cpu as u64, 0, 0) {
            // ON, OFF or ON_PENDING: the core exists.
            0..=2 => {}
            INVALID_PARAMETERS => return Some(cpu),
            _ => return None,
        }
    }
    Some(limit)
}

/// Powers on the core with affinity `mpidr`; it starts at `entry` (a physical
/// address, EL1, MMU off) with `context` in x0.
///
/// # Safety
/// 1. `entry` is code that runs with no stack and no initialised registers
///    besides x0: it sets up its own stack before it touches memory (as
///    [`crate::boot::_start_secondary`] does).
/// 2. The core with affinity `mpidr` is not running, or the call fails
///    (PSCI answers ALREADY_ON) without effect.
pub unsafe fn cpu_on(mpidr: u64, entry: u64, context: u64) -> Result<(), PsciError> {
    match call(CPU_ON64, mpidr, entry, context) {
        0 => Ok(()),
        error => Err(PsciError(error)),
    }
}

/// PSCI function `function` with arguments x1-x3; its x0.
fn call(function: u64, x1: u64, x2: u64, x3: u64) -> i64 {
    let ret: i64;
    // SAFETY: the `hvc` traps to QEMU's PSCI implementation and returns:
    // 1. AFFINITY_INFO only reports a core's state.
    // 2. CPU_ON starts another core at `x2`; only `cpu_on` asks for it, and
    //    its callers promise (its `# Safety`) an entry that sets up its own
    //    stack before it touches memory; this core's memory and stack are
    //    not touched.
    // 3. The SMC calling convention lets the call clobber x0-x17, which
    //    `clobber_abi("C")` declares; it uses no stack (`nostack`).
    unsafe {
        asm!(
            "hvc #0",
            inout("x0") function => ret,
            inout("x1") x1 => _,
            inout("x2") x2 => _,
            inout("x3") x3 => _,
            clobber_abi("C"),
            options(nostack),
        );
    }
    ret
}
