//! The pto-wsp device runtime.
//!
//! `no_std` and without `alloc`: every capacity is a const, documented where
//! it is defined ([`abi::TASK_WINDOW`], [`platform::MAX_CORES`], the
//! const generics of [`orch::Orchestrator`]). The same code
//! runs in the host shim, in the QEMU firmware and on the AICPU; what differs
//! per machine is behind [`platform::Platform`].
//!
//! - [`abi`]: the descriptor table (host -> device), parsed and validated
//!   in place, the launch block, the schedule encodings and the capacities
//!   the table format is bounded by.
//! - [`orch`]: the bounded orchestrator: task ring, TensorMap, DepList pool,
//!   heap ring, scopes, stall statistics and deadlock reports.
//! - [`expand`]: expands the table's workload program into tasks on the
//!   device, including from data computed by earlier tasks.
//! - [`sched`]: the dispatcher, scheduler threads, dispatch policies,
//!   dispatch queues and work stealing; a run's options, statistics and errors.
//! - [`exec`]: the one-thread table interpreter ([`exec::run`]).
//! - [`platform`]: the `Platform` trait and the shared-memory mailbox platform.
//! - [`mailbox`]: the per-core issue protocol and the core's serve loop.
//! - [`ascend`]: the Ascend platform: the AICPU side of CANN's per-core
//!   handshake with the AICores (registers, handshake records, payloads).
//! - [`steal_deque`]: a fixed-capacity Chase-Lev deque: a scheduler thread's
//!   ready queue that idle threads steal single tasks from.
//!
//! The modules form layers; each names only the ones below it (the test
//! `tests/layering.rs` enforces this):
//!
//! ```text
//! exec
//!  └ sched
//!     ├ expand
//!     │  └ orch
//!     │     └ abi
//!     ├ platform
//!     │  └ mailbox
//!     └ steal_deque
//! ```
//!
//! `ascend` implements `platform` (for the AICPU program) and names only
//! `platform`, `mailbox` and `sync`.
#![cfg_attr(not(test), no_std)]
#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]
#![deny(clippy::undocumented_unsafe_blocks)]
// Without `alloc` a deadlock report cannot be boxed: errors that carry one
// are large values. They end a run, so their size never costs a hot path.
#![allow(clippy::large_enum_variant, clippy::result_large_err)]

pub mod abi;
pub mod ascend;
pub mod channel;
pub mod exec;
pub mod expand;
pub mod mailbox;
pub mod orch;
pub mod platform;
pub mod sched;
pub mod steal_deque;
mod sync;

pub use wsp_ffi::CoreKind;
