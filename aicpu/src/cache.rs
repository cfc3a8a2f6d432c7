//! Making host-written memory visible to the AICPU before it reads it.
//!
//! CANN's AICPU code cleans and invalidates the lines of host-written data
//! (`dc civac` per line, then `dsb sy` and `isb`) before reading it. On
//! the device build this does the same; elsewhere (hosted builds, where the
//! memory is ordinary coherent memory) it does nothing.

/// The smallest data cache line of the AICPU's cores (Arm's CTR_EL0
/// DminLine is 64 bytes on the Kunpeng/TaiShan cores of the AICPU).
const LINE: usize = 64;

/// Cleans and invalidates the data cache lines of `[ptr, ptr + len)`.
pub fn invalidate(ptr: *const u8, len: usize) {
    #[cfg(all(target_os = "none", target_arch = "aarch64"))]
    {
        let start = ptr as usize & !(LINE - 1);
        let end = (ptr as usize).saturating_add(len);
        let mut line = start;
        while line < end {
            // SAFETY: `dc civac` on an address of memory the host handed us
            // (mapped: the caller is about to read it) cleans and invalidates
            // its line; it changes no data, as seen by any observer.
            unsafe {
                core::arch::asm!("dc civac, {}", in(reg) line, options(nostack, preserves_flags))
            };
            line += LINE;
        }
        // SAFETY: barriers only; they touch no memory of their own.
        unsafe { core::arch::asm!("dsb sy", "isb", options(nostack, preserves_flags)) };
    }
    #[cfg(not(all(target_os = "none", target_arch = "aarch64")))]
    {
        let _ = (ptr, len, LINE);
    }
}
