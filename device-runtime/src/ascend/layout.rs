//! The memory the AICPU shares with each AICore: the handshake record and
//! the two dispatch payload buffers, laid out as CANN's AICore side reads
//! them (offsets asserted below; `docs/ASCEND.md` shows the table).

use wsp_ffi::WspKernelArgs;

/// Bytes of one handshake record (and its alignment).
pub const HANDSHAKE_SIZE: usize = 64;
/// Bytes of one payload buffer (and its alignment).
pub const PAYLOAD_SIZE: usize = 512;
/// Payload buffers per core: task `id` uses buffer `id & 1`.
pub const PAYLOADS_PER_CORE: usize = 2;

/// One core's handshake record (CANN's `Handshake`), 64 bytes, 64-aligned,
/// in memory both the AICPU and the AICore reach. Fields are plain
/// integers (the C header's view); the runtime reads and writes them only
/// through [`super::regs::Shared32`] / [`super::regs::Shared64`], one
/// access per field.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Handshake {
    /// AICPU -> AICore: 1 once `task` holds the payload address.
    pub aicpu_ready: u32,
    /// AICore -> AICPU: the core's index + 1 once it is up.
    pub aicore_done: u32,
    /// AICPU -> AICore: address of the core's first payload buffer (the
    /// second follows it, [`PAYLOAD_SIZE`] bytes on).
    pub task: u64,
    /// AICore -> AICPU: the core's kind as CANN numbers it.
    pub core_type: i32,
    /// AICore -> AICPU: the core's physical id, its index in the table of
    /// register bases (`KernelArgs.regs`).
    pub physical_core_id: u32,
    /// AICPU -> AICore: 1 once FAST_PATH_ENABLE and DATA_MAIN_BASE are set.
    pub aicpu_regs_ready: u32,
    /// AICore -> AICPU: 1 once `physical_core_id` is written.
    pub aicore_regs_ready: u32,
    /// Zero; pads the record to 64 bytes.
    pub reserved: [u32; 8],
}

const _: () = {
    assert!(core::mem::size_of::<Handshake>() == HANDSHAKE_SIZE);
    assert!(core::mem::align_of::<Handshake>() == HANDSHAKE_SIZE);
    assert!(core::mem::offset_of!(Handshake, aicpu_ready) == 0);
    assert!(core::mem::offset_of!(Handshake, aicore_done) == 4);
    assert!(core::mem::offset_of!(Handshake, task) == 8);
    assert!(core::mem::offset_of!(Handshake, core_type) == 16);
    assert!(core::mem::offset_of!(Handshake, physical_core_id) == 20);
    assert!(core::mem::offset_of!(Handshake, aicpu_regs_ready) == 24);
    assert!(core::mem::offset_of!(Handshake, aicore_regs_ready) == 28);
};

/// One dispatch payload buffer, 512 bytes, 64-aligned. The AICore calls
/// `kernel(&args)` at `function_bin_addr` (CANN's contract: the address at
/// 0, the arguments after it). `kernel_id` and `result` are this project's
/// extension: the AICore writes the kernel's return value (its cycles, or
/// `WSP_KERNEL_REJECTED`) into `result` before it publishes FIN.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub struct Payload {
    /// The kernel's entry on the AICore.
    pub function_bin_addr: u64,
    /// The kernel's arguments.
    pub args: WspKernelArgs,
    /// The runtime's kernel id (for emulators and traces; the AICore needs
    /// only `function_bin_addr`).
    pub kernel_id: u32,
    /// Zero.
    pub reserved0: u32,
    /// AICore -> AICPU, written before FIN: the kernel's return value.
    pub result: u64,
    /// Zero; pads the buffer to 512 bytes.
    pub reserved: [u8; 352],
}

/// Offset of [`Payload::result`]: an emulated AICore writes there.
pub const PAYLOAD_RESULT_OFFSET: usize = 152;

const _: () = {
    assert!(core::mem::size_of::<Payload>() == PAYLOAD_SIZE);
    assert!(core::mem::align_of::<Payload>() == 64);
    assert!(core::mem::offset_of!(Payload, function_bin_addr) == 0);
    assert!(core::mem::offset_of!(Payload, args) == 8);
    assert!(core::mem::offset_of!(Payload, kernel_id) == 144);
    assert!(core::mem::offset_of!(Payload, result) == PAYLOAD_RESULT_OFFSET);
};

impl Payload {
    /// A zeroed buffer (`const`, so buffers can live in statics).
    pub const fn zeroed() -> Payload {
        const EMPTY: wsp_ffi::WspTensorView = wsp_ffi::WspTensorView {
            addr: 0,
            rows: 0,
            cols: 0,
            row_stride: 0,
            dtype: 0,
        };
        Payload {
            function_bin_addr: 0,
            args: WspKernelArgs {
                num_tensors: 0,
                num_scalars: 0,
                tensors: [EMPTY; wsp_ffi::WSP_MAX_TENSOR_ARGS as usize],
                scalars: [0; wsp_ffi::WSP_MAX_SCALARS as usize],
            },
            kernel_id: 0,
            reserved0: 0,
            result: 0,
            reserved: [0; 352],
        }
    }
}

/// One core's pair of payload buffers (`task` in its handshake record
/// points at the first).
pub type PayloadPair = [Payload; PAYLOADS_PER_CORE];

/// The 32-bit registers of one core, as offsets from its register base.
pub mod reg {
    /// AICPU -> AICore: the id of the newest task issued, or a reserved id.
    pub const DATA_MAIN_BASE: usize = 0xA0;
    /// AICore -> AICPU: ACK `id` / FIN `id | 0x8000_0000` / reserved.
    pub const COND: usize = 0x4C8;
    /// AICPU -> AICore: [`FAST_PATH_OPEN`] or [`FAST_PATH_CLOSE`].
    pub const FAST_PATH_ENABLE: usize = 0x18;
    /// FAST_PATH_ENABLE while the AICPU drives the core.
    pub const FAST_PATH_OPEN: u32 = 0xE;
    /// FAST_PATH_ENABLE after shut-down.
    pub const FAST_PATH_CLOSE: u32 = 0xF;
    /// Bytes of register file a core's base must reach (the highest
    /// register's end, rounded up): what an emulator allocates per core.
    pub const SPAN: usize = 0x500;
}

/// Reserved ids (DATA_MAIN_BASE / the low 31 bits of COND).
pub mod ids {
    pub use crate::mailbox::{COND_EXITED, EXIT, FIN};
    /// COND while the AICore is idle (bring-up done, no task yet).
    pub const AICORE_IDLE: u32 = 0x7FFF_FFFF;
    /// DATA_MAIN_BASE while the AICPU has no task for the core.
    pub const AICPU_IDLE: u32 = 0x7FFF_FFFD;
    /// COND once the AICore has left (`AICORE_EXITED | FIN` as read).
    pub const AICORE_EXITED: u32 = 0x7FFF_FFFE;
}
