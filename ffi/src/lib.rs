//! Bindings to the pto-wsp C++ tile kernels, the kernel registry and the
//! kernels' argument contracts.
//!
//! The kernels (`kernels/src/*.cpp`) are compiled by `build.rs` for the host
//! and for `aarch64-unknown-none`; [`bindings`] is generated from
//! `kernels/include/wsp_kernel_abi.h` by `cargo xtask bindgen` and checked in.
//! The registry ([`lookup`], [`all`]) describes each kernel: its core kind,
//! its tensor arguments with their access modes, dtypes and capacities, a
//! shape check ([`KernelInfo::check`]) that accepts exactly what the kernel
//! accepts, and [`KernelInfo::invoke`] to run it.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_op_in_unsafe_fn)]

#[allow(
    non_upper_case_globals,
    non_camel_case_types,
    non_snake_case,
    dead_code
)]
pub mod bindings;
mod contract;
mod registry;
#[cfg(test)]
mod tests;

pub use bindings::*;
pub use contract::{Dim, ShapeError, TileShape};
pub use registry::{all, lookup, ArgAccess, ArgSpec, CoreKind, KernelInfo, KernelRejected};

/// A kernel's return value when it rejects its arguments
/// (`WSP_KERNEL_REJECTED` in the header, a macro bindgen cannot translate).
pub const WSP_KERNEL_REJECTED: u64 = u64::MAX;

/// The f32 element type (`WSP_DTYPE_F32`).
pub const DTYPE_F32: u32 = WspDtype_WSP_DTYPE_F32;

/// The 4-byte signed integer element type (`WSP_DTYPE_I32`).
pub const DTYPE_I32: u32 = WspDtype_WSP_DTYPE_I32;
