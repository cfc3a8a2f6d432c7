//! What the host hands the AICPU program: CANN's `KernelArgs` (the entry
//! points' argument) and, through its `runtime_args`, this project's
//! [`WspAicpuArgs`]. Both are `#[repr(C)]` with asserted offsets; the C
//! header `aicpu/include/wsp_aicpu.h` is generated from them (`cargo xtask
//! header`).

use device_runtime::ascend::Handshake;

/// [`WspAicpuArgs::magic`]: the bytes `WSPA` read as a little-endian u32.
pub const WSP_AICPU_MAGIC: u32 = 0x4150_5357;
/// [`WspAicpuArgs::version`]: the layout this program reads.
pub const WSP_AICPU_VERSION: u32 = 1;
/// Bytes of [`WspAicpuResult::error`], the terminating NUL included.
pub const WSP_AICPU_ERROR_LEN: usize = 512;
/// Bring-up / shut-down bound when [`WspAicpuArgs::timeout_us`] is 0: 1 s.
pub const WSP_AICPU_DEFAULT_TIMEOUT_US: u32 = 1_000_000;

/// [`WspAicpuResult::status`]: the run completed.
pub const WSP_AICPU_OK: i32 = 0;
/// The arguments are unusable: null pointers, bad magic, version or size,
/// counts out of range.
pub const WSP_AICPU_BAD_ARGS: i32 = 1;
/// The descriptor table is invalid.
pub const WSP_AICPU_BAD_TABLE: i32 = 2;
/// The launch block is invalid or asks for more threads than launched.
pub const WSP_AICPU_BAD_LAUNCH: i32 = 3;
/// A core did not come up or shut down within the bound.
pub const WSP_AICPU_CORE: i32 = 4;
/// The run failed (a kernel fault, a deadlock, ...): see the error text.
pub const WSP_AICPU_RUN: i32 = 5;
/// The server entry was called without a successful init.
pub const WSP_AICPU_NOT_INITIALIZED: i32 = 6;
/// An internal invariant broke (a bug): see the error text.
pub const WSP_AICPU_INTERNAL: i32 = 7;
/// Init was refused because the previous launch's server threads are still
/// running (or another Init is): the launch in progress is left alone.
pub const WSP_AICPU_BUSY: i32 = 8;

/// CANN's `KernelArgs` (144 bytes), the one argument of both entry points.
/// CANN copies it into AICPU-private memory: writes to it reach no one.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WspCannKernelArgs {
    /// Fields this program does not read.
    pub unused0: [u64; 5],
    /// CANN's device arguments (the `.so` bytes); not read.
    pub device_args: u64,
    /// Points to the run's [`WspAicpuArgs`].
    pub runtime_args: *mut WspAicpuArgs,
    /// Points to the table of per-core register bases, indexed by a core's
    /// `physical_core_id`; [`WspAicpuArgs::num_regs`] entries.
    pub regs: *const u64,
    /// Not read.
    pub ffts_base_addr: u64,
    /// Profiling and dump pointers; not read.
    pub profiling: [u64; 6],
    /// Not read.
    pub log_level: u32,
    /// Not read.
    pub reserved0: u32,
    /// Not read.
    pub enable_profiling_flag: u32,
    /// Padding.
    pub reserved1: u32,
    /// Not read.
    pub device_wall_data_base: u64,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(size_of::<WspCannKernelArgs>() == 144);
    assert!(offset_of!(WspCannKernelArgs, device_args) == 40);
    assert!(offset_of!(WspCannKernelArgs, runtime_args) == 48);
    assert!(offset_of!(WspCannKernelArgs, regs) == 56);
    assert!(offset_of!(WspCannKernelArgs, ffts_base_addr) == 64);
    assert!(offset_of!(WspCannKernelArgs, log_level) == 120);
    assert!(offset_of!(WspCannKernelArgs, enable_profiling_flag) == 128);
    assert!(offset_of!(WspCannKernelArgs, device_wall_data_base) == 136);
};

/// What the program writes back for the host (inside [`WspAicpuArgs`],
/// in device memory the host reads after the launch).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WspAicpuResult {
    /// `WSP_AICPU_OK` or another `WSP_AICPU_*` status. Init writes it; the
    /// server's thread 0 overwrites it with the run's outcome.
    pub status: i32,
    /// Bytes of text in `error`, without the NUL.
    pub error_len: u32,
    /// Tasks the run completed.
    pub tasks: u64,
    /// The run's wall time in ticks of `ticks_per_second`.
    pub wall_ticks: u64,
    /// The clock's rate (`cntvct_el0`: 50 MHz on the device).
    pub ticks_per_second: u64,
    /// The error's text (the runtime's `Display` of it), NUL-terminated,
    /// truncated to fit; empty on success.
    pub error: [u8; WSP_AICPU_ERROR_LEN],
}

/// The run: set up by the host in device memory, pointed to by
/// `KernelArgs.runtime_args`. Pointers are device addresses; counts are
/// elements. The program reads everything but `result` and writes only
/// `result` (and the handshake records, as the handshake says).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WspAicpuArgs {
    /// [`WSP_AICPU_MAGIC`].
    pub magic: u32,
    /// [`WSP_AICPU_VERSION`].
    pub version: u32,
    /// `sizeof(WspAicpuArgs)` as the host compiled it.
    pub size: u32,
    /// Threads CANN runs the server entry on (the launch's `n`): the
    /// launch block's scheduler threads must not exceed it.
    pub aicpu_threads: u32,
    /// The descriptor table.
    pub table: *const u8,
    /// Its bytes.
    pub table_len: u64,
    /// The data arena (tensors).
    pub arena: *mut u8,
    /// Its bytes.
    pub arena_len: u64,
    /// The launch block (symbols, threads, policy); none (the defaults)
    /// when `launch_len` is 0.
    pub launch: *const u8,
    /// Its bytes; 0: no block (`launch` is then not read).
    pub launch_len: u64,
    /// Per kernel id, the kernel's `function_bin_addr` on the AICores; 0:
    /// the kernel is not built in.
    pub kernel_addrs: *const u64,
    /// Entries of `kernel_addrs`.
    pub num_kernels: u32,
    /// AICores the run drives.
    pub num_cores: u32,
    /// Per core, its kind: 0 cube, 1 vector (`WSP_CORE_*`).
    pub core_kinds: *const u32,
    /// Per core, its handshake record (64-aligned, `num_cores` of them),
    /// zeroed by the host before the launch.
    pub handshakes: *mut Handshake,
    /// Entries of the register-base table `KernelArgs.regs`.
    pub num_regs: u32,
    /// Bound of each bring-up and shut-down wait in microseconds; 0: 1 s.
    pub timeout_us: u32,
    /// Written by the program.
    pub result: WspAicpuResult,
}

const _: () = {
    use core::mem::{offset_of, size_of};
    assert!(offset_of!(WspAicpuArgs, magic) == 0);
    assert!(offset_of!(WspAicpuArgs, version) == 4);
    assert!(offset_of!(WspAicpuArgs, size) == 8);
    assert!(offset_of!(WspAicpuArgs, aicpu_threads) == 12);
    assert!(offset_of!(WspAicpuArgs, table) == 16);
    assert!(offset_of!(WspAicpuArgs, table_len) == 24);
    assert!(offset_of!(WspAicpuArgs, arena) == 32);
    assert!(offset_of!(WspAicpuArgs, arena_len) == 40);
    assert!(offset_of!(WspAicpuArgs, launch) == 48);
    assert!(offset_of!(WspAicpuArgs, launch_len) == 56);
    assert!(offset_of!(WspAicpuArgs, kernel_addrs) == 64);
    assert!(offset_of!(WspAicpuArgs, num_kernels) == 72);
    assert!(offset_of!(WspAicpuArgs, num_cores) == 76);
    assert!(offset_of!(WspAicpuArgs, core_kinds) == 80);
    assert!(offset_of!(WspAicpuArgs, handshakes) == 88);
    assert!(offset_of!(WspAicpuArgs, num_regs) == 96);
    assert!(offset_of!(WspAicpuArgs, timeout_us) == 100);
    assert!(offset_of!(WspAicpuArgs, result) == 104);
    assert!(offset_of!(WspAicpuResult, status) == 0);
    assert!(offset_of!(WspAicpuResult, error_len) == 4);
    assert!(offset_of!(WspAicpuResult, tasks) == 8);
    assert!(offset_of!(WspAicpuResult, wall_ticks) == 16);
    assert!(offset_of!(WspAicpuResult, ticks_per_second) == 24);
    assert!(offset_of!(WspAicpuResult, error) == 32);
    assert!(size_of::<WspAicpuResult>() == 32 + WSP_AICPU_ERROR_LEN);
    assert!(size_of::<WspAicpuArgs>() == 104 + 32 + WSP_AICPU_ERROR_LEN);
};

/// [`WspAicpuArgs::core_kinds`]: a cube core.
pub const WSP_CORE_CUBE: u32 = 0;
/// [`WspAicpuArgs::core_kinds`]: a vector core.
pub const WSP_CORE_VECTOR: u32 = 1;
const _: () = assert!(
    WSP_CORE_CUBE == wsp_ffi::CoreKind::Cube as u32
        && WSP_CORE_VECTOR == wsp_ffi::CoreKind::Vector as u32
);
