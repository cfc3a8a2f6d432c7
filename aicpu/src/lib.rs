//! The pto-wsp AICPU program (see `docs/ASCEND.md`).
#![cfg_attr(target_os = "none", no_std)]
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod args;

pub use args::*;

/// CANN's init entry, called once on one AICPU thread before the server.
///
/// # Safety
/// `kernel_args` is null or points to CANN's 144-byte `KernelArgs`.
#[no_mangle]
pub unsafe extern "C" fn DynTileFwkBackendKernelServerInit(
    kernel_args: *mut core::ffi::c_void,
) -> core::ffi::c_int {
    let _ = kernel_args;
    WSP_AICPU_INTERNAL as core::ffi::c_int
}

/// CANN's server entry, called on each of the launch's AICPU threads.
///
/// # Safety
/// As [`DynTileFwkBackendKernelServerInit`].
#[no_mangle]
pub unsafe extern "C" fn DynTileFwkBackendKernelServer(
    kernel_args: *mut core::ffi::c_void,
) -> core::ffi::c_int {
    let _ = kernel_args;
    WSP_AICPU_INTERNAL as core::ffi::c_int
}
