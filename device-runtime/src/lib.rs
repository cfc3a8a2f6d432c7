//! The pto-wsp device runtime.
//!
//! `no_std` and without `alloc`: every capacity is a const, documented where
//! it is defined ([`exec::WINDOW`], [`platform::MAX_CORES`]). The same code
//! runs in the host shim, in the QEMU firmware and on the AICPU; what differs
//! per machine is behind [`platform::Platform`].
//!
//! - [`abi`]: the descriptor table (host -> device), parsed and validated in place.
//! - [`exec`]: runs a validated table in dependency order.
//! - [`platform`]: the `Platform` trait and the shared-memory mailbox platform.
//! - [`mailbox`]: the per-core issue protocol and the core's serve loop.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_op_in_unsafe_fn)]

pub mod abi;
pub mod exec;
pub mod mailbox;
pub mod platform;
mod sync;

pub use wsp_ffi::CoreKind;
