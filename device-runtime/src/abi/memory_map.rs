//! The memory map of the QEMU firmware (`device-runtime/firmware`) on QEMU
//! `virt`: where the host loads the launch block, the descriptor table and
//! the data arena, and what machine the firmware needs. The one source of
//! these numbers: the firmware reads the windows from here, xtask passes
//! them to QEMU's loader, and the firmware's `build.rs` generates the
//! linker script's `MEMORY` block from them (it includes this file by path,
//! so it uses nothing but `core`).
//!
//! Physical addresses (the firmware maps them one to one, so they are its
//! virtual addresses too), in order:
//!
//! | address | what |
//! |---|---|
//! | [`UART_ADDR`] | the PL011 UART, among QEMU `virt`'s devices below RAM |
//! | [`RAM_START`] | start of RAM; QEMU puts the device tree here |
//! | [`IMAGE_ADDR`] | the firmware image; it must end below the stacks |
//! | [`STACKS_ADDR`] | the CPUs' stacks, [`CPUS`] x [`STACK_SIZE`], each with a guard page at its bottom |
//! | [`LAUNCH_ADDR`] | the launch block, [`LAUNCH_WINDOW`] bytes |
//! | [`TABLE_ADDR`] | the descriptor table, at most [`TABLE_MAX`] bytes |
//! | [`ARENA_ADDR`] | the data arena, up to [`RAM_END`] ([`ARENA_MAX`] bytes) |

/// CPUs the firmware needs (QEMU `-smp`): 4 scheduler threads (CPUs 0-3)
/// and 4 AICores (CPUs 4-7).
pub const CPUS: usize = 8;
/// The PL011 UART of QEMU `virt`. Its devices (flash, the GIC at
/// `0x0800_0000`, the UART, ...) all lie below [`RAM_START`]; the firmware
/// maps that range as Device memory and talks over semihosting instead.
pub const UART_ADDR: usize = 0x0900_0000;
/// Start of RAM on QEMU `virt`; QEMU places the device tree here.
pub const RAM_START: usize = 0x4000_0000;
/// RAM size in MiB (QEMU `-m`).
pub const RAM_MIB: usize = 512;
/// End of RAM (exclusive).
pub const RAM_END: usize = RAM_START + (RAM_MIB << 20);
/// Where the firmware image is linked: RAM plus 512 KiB, where QEMU loads
/// an AArch64 kernel.
pub const IMAGE_ADDR: usize = 0x4008_0000;
/// Where the CPUs' stacks start (the linker puts the firmware's `.stacks`
/// here and checks it): 2 MiB-aligned, so that the MMU can map their 2 MiB
/// blocks with pages and leave each stack's lowest page unmapped.
pub const STACKS_ADDR: usize = 0x4040_0000;
/// Bytes of each CPU's stack, its guard page included: CPU `n`'s is
/// `STACKS_ADDR + n * STACK_SIZE ..` the next one.
pub const STACK_SIZE: usize = 512 << 10;
/// Bytes at the bottom of each stack that are not mapped (one 4 KiB page):
/// a stack that grows into them takes a translation fault instead of
/// overwriting what lies below.
pub const STACK_GUARD: usize = 4 << 10;
/// Bytes of all the stacks.
pub const STACKS_SIZE: usize = CPUS * STACK_SIZE;
/// Where the host loads the launch block (the 4 KiB below the table).
pub const LAUNCH_ADDR: usize = 0x47ff_f000;
/// Bytes reserved for the launch block.
pub const LAUNCH_WINDOW: usize = 0x1000;
/// Where the host loads the descriptor table.
pub const TABLE_ADDR: usize = 0x4800_0000;
/// The largest descriptor table.
pub const TABLE_MAX: usize = 16 << 20;
/// Where the host loads the data arena; it may reach the end of RAM.
pub const ARENA_ADDR: usize = 0x4900_0000;
/// The largest data arena.
pub const ARENA_MAX: usize = RAM_END - ARENA_ADDR;

// The windows are in order and do not overlap.
const _: () = assert!(UART_ADDR < RAM_START);
const _: () = assert!(RAM_START < IMAGE_ADDR && IMAGE_ADDR < STACKS_ADDR);
const _: () = assert!(STACKS_ADDR + STACKS_SIZE <= LAUNCH_ADDR);
// The stacks fill whole 2 MiB blocks and each guard is whole pages.
const _: () = assert!(STACKS_ADDR.is_multiple_of(2 << 20) && STACKS_SIZE.is_multiple_of(2 << 20));
const _: () = assert!(STACK_SIZE.is_multiple_of(4 << 10) && STACK_GUARD.is_multiple_of(4 << 10));
const _: () = assert!(STACK_GUARD < STACK_SIZE);
const _: () = assert!(LAUNCH_ADDR + LAUNCH_WINDOW <= TABLE_ADDR);
const _: () = assert!(TABLE_ADDR + TABLE_MAX <= ARENA_ADDR && ARENA_ADDR < RAM_END);
