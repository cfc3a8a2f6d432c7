//! The Ascend platform: the AICPU side of CANN's per-core AICPU-AICore
//! handshake (`docs/ASCEND.md` has the whole contract).
//!
//! - [`layout`]: the handshake record and the payload buffers as the
//!   AICore reads them, the register offsets and the reserved ids.
//! - [`regs`]: one access to a register or a handshake field (volatile with
//!   `dmb ish` on the device, atomic on a hosted target).
//! - [`handshake`]: bringing cores up and shutting them down, with bounded
//!   waits and errors naming the core.
//! - [`issue`]: [`AscendPlatform`], the scheduler's `Platform` over the
//!   registers and the double-buffered payloads.
//! - [`gate`]: the launch gate of the AICPU program, which CANN launches
//!   many times per load.

pub mod gate;
pub mod handshake;
pub mod issue;
pub mod layout;
pub mod regs;

pub use handshake::{bring_up, shut_down, CoreError, CoreLink, Stage};
pub use issue::{AscendError, AscendPlatform};
pub use layout::{Handshake, Payload, PayloadPair};

#[cfg(all(test, not(loom)))]
mod tests;
