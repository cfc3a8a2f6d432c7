//! The MMU and the caches: every CPU runs with them on, as on real
//! hardware, through one identity map held in static translation tables.
//!
//! Why it matters beyond speed: the runtime's shared state (mailboxes,
//! queues, spin locks, the logger) is built on atomics, which compile to
//! exclusives (LDXR/STXR) or LSE atomics. The architecture only promises
//! that these work between CPUs on Normal, Inner Shareable, Write-Back
//! cacheable memory: with the MMU off every data access is Device-nGnRnE,
//! where exclusives need not work at all (the global monitor is optional
//! for it) and many cores fault on them or on an unaligned access. QEMU's
//! TCG accepts either, so only this map makes the QEMU runs mean what a
//! device run would.
//!
//! # The map
//!
//! 4 KiB granule, 32-bit virtual addresses (TCR_EL1.T0SZ = 32; the walk
//! starts at level 1), output address = input address (identity), TTBR0
//! only (TTBR1 walks disabled, EPD1):
//!
//! | virtual = physical | level | memory type |
//! |---|---|---|
//! | `0` .. [`RAM_START`] | one level 1 block of 1 GiB | Device-nGnRE, never executed: QEMU `virt`'s devices, e.g. the GIC at `0x0800_0000` and the PL011 UART at [`UART_ADDR`] |
//! | [`RAM_START`] .. [`RAM_END`] | level 2 blocks of 2 MiB | Normal, Inner/Outer Write-Back Read/Write-Allocate, Inner Shareable: the image, the launch block, the table, the arena (all of RAM but the stacks' blocks) |
//! | [`STACKS_ADDR`] .. + [`STACKS_SIZE`] | level 3 pages of 4 KiB | as the rest of RAM: the CPUs' stacks, but for the lowest [`STACK_GUARD`] bytes of each |
//! | each stack's guard page, the rest of the 1 GiB above RAM_START, and 2 .. 4 GiB | none | translation fault |
//!
//! All of RAM is readable, writable and executable at EL1 (no EL0 access),
//! but for the guard pages: a CPU whose stack overflows takes a data abort
//! in the guard page below it, which the exception handler reports as a
//! stack overflow ([`guarded_stack`]) and ends the run with, instead of
//! overwriting the statics or another CPU's stack below it. (Rust probes
//! every page of a frame larger than a page, so a frame cannot skip it.)
//! The tables are 4 KiB pages of static data in the image ([`TABLES_SIZE`]
//! bytes, in `.rodata`): a level 1, a level 2 and one level 3 table per
//! 2 MiB of stacks; the loader puts them in RAM with the rest of the
//! image, and no CPU ever writes them, so a table walk (cacheable, TCR_EL1's
//! IRGN0/ORGN0/SH0) can only find what the image holds.
//!
//! # Turning it on
//!
//! [`enable`] runs first on every CPU: on CPU 0 from `_start`, on the
//! others from `_start_secondary` (the PSCI CPU_ON entry), before the CPU
//! touches its stack or any shared data. It sets MAIR_EL1, TCR_EL1 and
//! TTBR0_EL1, invalidates this CPU's TLB and instruction cache, and sets
//! SCTLR_EL1.M, .C and .I. No data cache is invalidated by set/way: CPU 0
//! is entered as an arm64 Linux kernel is (QEMU's `-kernel`), whose boot
//! protocol has the loader clean the image to the point of coherency, so a
//! line it left cached for the image holds what memory does (and the
//! windows the host writes are invalidated below); a core that PSCI powers
//! up has its caches brought to a known state by the PSCI implementation.
//! The instruction cache is invalidated anyway (the protocol allows it on).
//!
//! # Data written behind the CPU
//!
//! The host writes the launch block, the table and the arena into RAM
//! before the CPUs start (QEMU's loader; on a device, a copy over the bus)
//! and reads the arena back after the run. Caches do not see such writes,
//! and a cache may still hold a line of these windows from before the
//! host wrote them (a loader that ran with its caches on; an earlier launch
//! on a device that is not reset between launches): so CPU 0
//! [`invalidate`]s each window before it reads it (a line fetched after
//! that, even speculatively, is fetched from memory that already holds the
//! host's bytes), and [`clean`]s the arena before the host gets it back. QEMU's TCG has no cache model (both are no-ops there), so they
//! are written for the hardware, not tested by the QEMU runs. The
//! semihosting calls need neither: a semihosting host (QEMU, or a debugger
//! that halts the core) reads and writes memory as the core sees it.

use core::arch::{asm, naked_asm};
use core::sync::atomic::{AtomicU64, Ordering};

use device_runtime::abi::memory_map::{
    CPUS, RAM_END, RAM_START, STACKS_ADDR, STACKS_SIZE, STACK_GUARD, STACK_SIZE, UART_ADDR,
};

/// Descriptors in one table: a 4 KiB page of 8-byte entries.
const ENTRIES: usize = 512;
/// Bytes one level 1 block maps.
const LEVEL1_BLOCK: usize = 1 << 30;
/// Bytes one level 2 block maps.
const LEVEL2_BLOCK: usize = 2 << 20;
/// Bytes one level 3 page maps.
const PAGE: usize = 4 << 10;
/// Level 3 tables: one per 2 MiB block of stacks.
const STACK_TABLES: usize = STACKS_SIZE / LEVEL2_BLOCK;
/// Bytes of translation tables in the image: the level 1, the level 2 and
/// the stacks' level 3 tables.
pub const TABLES_SIZE: usize = (2 + STACK_TABLES) * 4096;

// The map above: devices in the first GiB, RAM in 2 MiB blocks of the second.
const _: () = assert!(RAM_START == LEVEL1_BLOCK);
const _: () = assert!(RAM_END - RAM_START <= LEVEL1_BLOCK);
const _: () = assert!((RAM_END - RAM_START).is_multiple_of(LEVEL2_BLOCK));
const _: () = assert!(UART_ADDR < RAM_START);
// The stacks: whole 2 MiB blocks of RAM, each stack and its guard whole pages.
const _: () = assert!(RAM_START <= STACKS_ADDR && STACKS_ADDR + STACKS_SIZE <= RAM_END);
const _: () =
    assert!(STACKS_ADDR.is_multiple_of(LEVEL2_BLOCK) && STACKS_SIZE.is_multiple_of(LEVEL2_BLOCK));
const _: () = assert!(STACK_SIZE.is_multiple_of(PAGE) && STACK_GUARD.is_multiple_of(PAGE));
const _: () = assert!(0 < STACK_GUARD && STACK_GUARD < STACK_SIZE);

// Descriptor bits (Arm ARM, VMSAv8-64 stage 1, 4 KiB granule).
/// A block descriptor at level 1 or 2.
const BLOCK: u64 = 0b01;
/// A descriptor pointing at the next level's table (at level 1 or 2).
const TABLE: u64 = 0b11;
/// A page descriptor (at level 3).
const PAGE_DESCRIPTOR: u64 = 0b11;
/// AttrIndx = 0: MAIR_EL1.Attr0, Normal Write-Back.
const ATTR_NORMAL: u64 = 0 << 2;
/// AttrIndx = 1: MAIR_EL1.Attr1, Device-nGnRE.
const ATTR_DEVICE: u64 = 1 << 2;
/// SH = 0b11: Inner Shareable (Device memory is Outer Shareable whatever SH says).
const INNER_SHAREABLE: u64 = 0b11 << 8;
/// AF: accessed; without it the first access faults (no hardware AF update).
const ACCESSED: u64 = 1 << 10;
/// PXN: not executable at EL1.
const PXN: u64 = 1 << 53;
/// UXN: not executable at EL0.
const UXN: u64 = 1 << 54;
// AP[2:1] = 0b00 (bits 7:6): read/write at EL1, no access at EL0.

/// A RAM block: Normal, cacheable, Inner Shareable, executable at EL1.
const RAM_BLOCK: u64 = BLOCK | ATTR_NORMAL | INNER_SHAREABLE | ACCESSED | UXN;
/// A RAM page: as a [`RAM_BLOCK`], at level 3.
const RAM_PAGE: u64 = PAGE_DESCRIPTOR | ATTR_NORMAL | INNER_SHAREABLE | ACCESSED | UXN;
/// A device block: Device-nGnRE, never executed (no speculative fetch).
const DEVICE_BLOCK: u64 = BLOCK | ATTR_DEVICE | ACCESSED | PXN | UXN;

/// MAIR_EL1 attribute of Normal memory, Inner and Outer Write-Back
/// Non-transient, Read- and Write-Allocate.
pub const MAIR_NORMAL: u64 = 0xff;
/// MAIR_EL1 attribute of Device-nGnRE memory.
pub const MAIR_DEVICE: u64 = 0x04;
/// MAIR_EL1: Attr0 Normal, Attr1 Device.
const MAIR: u64 = MAIR_NORMAL | MAIR_DEVICE << 8;

/// TCR_EL1: T0SZ = 32 (4 GiB of virtual addresses); TTBR0 walks
/// Inner/Outer Write-Back Read/Write-Allocate (IRGN0, ORGN0 = 0b01), Inner
/// Shareable (SH0 = 0b11), 4 KiB granule (TG0 = 0b00); TTBR1 walks off
/// (EPD1), its granule 4 KiB (TG1 = 0b10, so that no reserved value is
/// set); IPS = 0b000 (32-bit physical addresses: RAM and the devices lie
/// below 4 GiB); 8-bit ASIDs, no top-byte ignore, no hardware AF/dirty.
const TCR: u64 = 32 | 0b01 << 8 | 0b01 << 10 | 0b11 << 12 | 1 << 23 | 0b10 << 30;
// `enable` loads it with two 16-bit moves.
const _: () = assert!(TCR >> 32 == 0);

/// SCTLR_EL1.M: the stage 1 MMU.
pub const SCTLR_M: u64 = 1 << 0;
/// SCTLR_EL1.C: data accesses may be cached.
pub const SCTLR_C: u64 = 1 << 2;
/// SCTLR_EL1.I: instruction fetches may be cached.
pub const SCTLR_I: u64 = 1 << 12;
/// What [`enable`] sets in SCTLR_EL1.
const SCTLR_ON: u64 = SCTLR_M | SCTLR_C | SCTLR_I;
/// What [`enable`] clears: A (alignment checks: Rust may make unaligned
/// accesses to Normal memory), WXN (RAM is writable and executable) and EE
/// (little-endian data at EL1).
const SCTLR_OFF: u64 = 1 << 1 | 1 << 19 | 1 << 25;
// `enable` loads each with two 16-bit moves.
const _: () = assert!(SCTLR_ON >> 32 == 0 && SCTLR_OFF >> 32 == 0);

/// One page of page descriptors (level 3).
#[repr(C, align(4096))]
struct Level3([u64; ENTRIES]);

/// One page of descriptors, some of them pointing at the next level's
/// table: the address of a table is only known at link time, so these
/// entries are pointers (the linker fills them in) with the descriptor bits
/// added (a table is page-aligned, so adding is or-ing); the others are
/// blocks (or invalid), plain numbers as pointers without provenance.
#[repr(C, align(4096))]
struct Table([*const u8; ENTRIES]);

// SAFETY: `Sync` lets the statics be shared; they are never written (they
// are immutable statics in `.rodata`) and only their addresses are used,
// by `enable` and by the table walks.
unsafe impl Sync for Table {}

const _: () = assert!(
    2 * core::mem::size_of::<Table>() + core::mem::size_of::<[Level3; STACK_TABLES]>()
        == TABLES_SIZE
);

/// The stacks: [`STACKS_ADDR`] .. + [`STACKS_SIZE`] in 4 KiB pages, each
/// stack's guard invalid.
static STACK_PAGES: [Level3; STACK_TABLES] = stack_pages();

/// RAM: [`RAM_START`] .. [`RAM_END`] in 2 MiB blocks, the stacks' blocks
/// through [`STACK_PAGES`], the rest invalid.
static RAM: Table = ram_blocks(&raw const STACK_PAGES);

/// The level 1 table TTBR0_EL1 points at.
static LEVEL1: Table = level1(&raw const RAM);

/// Whether `addr` (in the stacks) is in the guard of its stack.
const fn in_guard(addr: usize) -> bool {
    (addr - STACKS_ADDR) % STACK_SIZE < STACK_GUARD
}

const fn stack_pages() -> [Level3; STACK_TABLES] {
    let mut tables = [const { Level3([0; ENTRIES]) }; STACK_TABLES];
    let mut page = 0;
    while page < STACKS_SIZE / PAGE {
        let addr = STACKS_ADDR + page * PAGE;
        if !in_guard(addr) {
            tables[page / ENTRIES].0[page % ENTRIES] = addr as u64 | RAM_PAGE;
        }
        page += 1;
    }
    tables
}

const fn ram_blocks(stack_pages: *const [Level3; STACK_TABLES]) -> Table {
    let mut table = [core::ptr::null(); ENTRIES];
    let mut i = 0;
    while i < (RAM_END - RAM_START) / LEVEL2_BLOCK {
        let addr = RAM_START + i * LEVEL2_BLOCK;
        table[i] = if addr >= STACKS_ADDR && addr < STACKS_ADDR + STACKS_SIZE {
            let offset = (addr - STACKS_ADDR) / LEVEL2_BLOCK * core::mem::size_of::<Level3>();
            stack_pages
                .cast::<u8>()
                .wrapping_add(offset + TABLE as usize)
        } else {
            core::ptr::without_provenance(addr | RAM_BLOCK as usize)
        };
        i += 1;
    }
    Table(table)
}

const fn level1(ram: *const Table) -> Table {
    let mut table = [core::ptr::null(); ENTRIES];
    // 0 .. 1 GiB: the devices (output address 0).
    table[0] = core::ptr::without_provenance(DEVICE_BLOCK as usize);
    table[RAM_START / LEVEL1_BLOCK] = ram.cast::<u8>().wrapping_add(TABLE as usize);
    Table(table)
}

/// The CPU whose stack's guard holds `addr`, if it is in one: a fault
/// there is that stack's overflow.
pub fn guarded_stack(addr: u64) -> Option<usize> {
    let addr = usize::try_from(addr).ok()?;
    let offset = addr.checked_sub(STACKS_ADDR).filter(|&o| o < STACKS_SIZE)?;
    in_guard(addr).then_some(offset / STACK_SIZE)
}

/// Turns on the MMU and the caches of the calling CPU with the map above.
/// Uses no stack and no memory but the tables; clobbers x0 and x1.
///
/// # Safety
/// Called once per CPU, from the boot code, at EL1 with the MMU off,
/// before the CPU touches memory through a data access: the image is
/// identity-mapped, so the code runs on at the same addresses.
#[unsafe(naked)]
pub unsafe extern "C" fn enable() {
    naked_asm!(
        // The translation regime: attributes, its control, the tables.
        "mov    x0, #{mair}",
        "msr    mair_el1, x0",
        "mov    x0, #{tcr_lo}",
        "movk   x0, #{tcr_hi}, lsl #16",
        "msr    tcr_el1, x0",
        "adrp   x0, {level1}",
        "add    x0, x0, :lo12:{level1}",
        "msr    ttbr0_el1, x0",
        // The register writes take effect before the TLB is invalidated.
        "isb",
        // No stale translation or instruction of an earlier boot survives.
        // Only this CPU's: every CPU invalidates its own, and the tables
        // never change.
        "tlbi   vmalle1",
        "ic     iallu",
        "dsb    nsh",
        "isb",
        "mrs    x0, sctlr_el1",
        "mov    x1, #{on_lo}",
        "movk   x1, #{on_hi}, lsl #16",
        "orr    x0, x0, x1",
        "mov    x1, #{off_lo}",
        "movk   x1, #{off_hi}, lsl #16",
        "bic    x0, x0, x1",
        "msr    sctlr_el1, x0",
        // The next instruction is fetched through the MMU.
        "isb",
        "ret",
        mair = const MAIR,
        tcr_lo = const TCR & 0xffff,
        tcr_hi = const TCR >> 16,
        level1 = sym LEVEL1,
        on_lo = const SCTLR_ON & 0xffff,
        on_hi = const SCTLR_ON >> 16,
        off_lo = const SCTLR_OFF & 0xffff,
        off_hi = const SCTLR_OFF >> 16,
    )
}

/// SCTLR_EL1 of each CPU, recorded by [`record`] (0: not recorded).
static SCTLR: [AtomicU64; CPUS] = [const { AtomicU64::new(0) }; CPUS];

/// The calling CPU's SCTLR_EL1.
fn sctlr() -> u64 {
    let value: u64;
    // SAFETY: reading SCTLR_EL1 at EL1 has no side effects; it touches no
    // memory, stack or flags, as the options declare.
    unsafe { asm!("mrs {}, sctlr_el1", out(reg) value, options(nomem, nostack, preserves_flags)) };
    value
}

/// Records SCTLR_EL1 of CPU `cpu` (the calling CPU) for [`report`].
pub fn record(cpu: usize) {
    if let Some(slot) = SCTLR.get(cpu) {
        slot.store(sctlr(), Ordering::Release);
    }
}

/// The CPUs of `cpus` (a bit mask) that recorded SCTLR_EL1 with M, C and I set.
fn cpus_on(cpus: u32) -> u32 {
    (0..CPUS)
        .filter(|&cpu| cpus & 1 << cpu != 0)
        .filter(|&cpu| SCTLR[cpu].load(Ordering::Acquire) & SCTLR_ON == SCTLR_ON)
        .fold(0, |mask, cpu| mask | 1 << cpu)
}

/// What the MMU makes of a stage 1 EL1 read of `addr`: PAR_EL1 after `AT
/// S1E1R` (bit 0 set: the translation faulted).
fn translate(addr: usize) -> u64 {
    let par: u64;
    // SAFETY: `at` only translates the address (it accesses nothing at it)
    // and sets PAR_EL1, which only this function reads, right after the
    // `isb` that makes the result visible; no memory, stack or flags.
    unsafe {
        asm!(
            "at s1e1r, {addr}",
            "isb",
            "mrs {par}, par_el1",
            addr = in(reg) addr,
            par = lateout(reg) par,
            options(nostack, preserves_flags),
        )
    };
    par
}

/// The stacks whose guard page faults (every byte of it, read through
/// `AT`) while the page just above it, the stack's lowest usable one, maps.
fn guards_working() -> usize {
    (0..CPUS)
        .filter(|&cpu| {
            let guard = STACKS_ADDR + cpu * STACK_SIZE;
            let faults = (guard..guard + STACK_GUARD)
                .step_by(PAGE)
                .all(|page| translate(page) & 1 == 1 && translate(page + PAGE - 1) & 1 == 1);
            faults && translate(guard + STACK_GUARD) & 1 == 0
        })
        .count()
}

/// Logs that the MMU and caches are on, for the tests to check: the CPUs
/// of `cpus` (a bit mask of those started) that recorded SCTLR_EL1 with M,
/// C and I set, and the memory attributes (MAIR encoding, PAR_EL1.ATTR)
/// and shareability (PAR_EL1.SH) the MMU gives a RAM address (`ram`) and
/// the UART, and how many of the stacks' guard pages fault.
pub fn report(cpus: u32, ram: usize) {
    let ram = translate(ram);
    let uart = translate(UART_ADDR);
    let attr = |par: u64| if par & 1 == 0 { par >> 56 } else { u64::MAX };
    defmt::info!(
        "mmu on cpus={=u32:#x} of {=u32:#x}; ram attr={=u64:#x} sh={=u64}; uart attr={=u64:#x}; stack guards={=usize} of {=usize}",
        cpus_on(cpus),
        cpus,
        attr(ram),
        (ram >> 7) & 0b11,
        attr(uart),
        guards_working(),
        CPUS,
    );
}

/// The data cache line: CTR_EL0.DminLine, the smallest on this CPU.
fn line() -> usize {
    let ctr: u64;
    // SAFETY: reading CTR_EL0 has no side effects; it touches no memory,
    // stack or flags, as the options declare.
    unsafe { asm!("mrs {}, ctr_el0", out(reg) ctr, options(nomem, nostack, preserves_flags)) };
    4 << ((ctr >> 16) & 0xf)
}

/// Invalidates the data cache lines of `addr .. addr + len` to the point of
/// coherency, so that the next reads see what another agent (the host)
/// wrote to memory behind the caches.
///
/// # Safety
/// Nothing the CPUs wrote to the range may be still only in a cache (it
/// would be lost): the range is only read by the CPUs, as the launch block
/// and the table are, or not yet written, as the arena is before its run.
pub unsafe fn invalidate(addr: usize, len: usize) {
    let line = line();
    let mut at = addr & !(line - 1);
    while at < addr.saturating_add(len) {
        // SAFETY: `dc ivac` drops the line's cached copy (the caller
        // promises it holds nothing unwritten); it changes no memory the
        // program sees otherwise, and no stack or flags.
        unsafe { asm!("dc ivac, {}", in(reg) at, options(nostack, preserves_flags)) };
        at += line;
    }
    // SAFETY: `dsb sy` waits for the invalidations; nothing else.
    unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
}

/// Cleans the data cache lines of `addr .. addr + len` to the point of
/// coherency, so that another agent (the host) reading memory behind the
/// caches sees what the CPUs wrote.
pub fn clean(addr: usize, len: usize) {
    let line = line();
    let mut at = addr & !(line - 1);
    while at < addr.saturating_add(len) {
        // SAFETY: `dc cvac` writes a dirty line back to memory and keeps it;
        // what any CPU reads is unchanged, and it needs no mapping of its
        // own (a faulting address would fault as a read would); no stack or
        // flags.
        unsafe { asm!("dc cvac, {}", in(reg) at, options(nostack, preserves_flags)) };
        at += line;
    }
    // SAFETY: `dsb sy` waits for the write-backs; nothing else.
    unsafe { asm!("dsb sy", options(nostack, preserves_flags)) };
}
