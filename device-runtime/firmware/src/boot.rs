//! Boot code: the entry points of core 0 (`_start`) and of the secondary
//! cores (`_start_secondary`, started through PSCI), the per-core stacks and
//! a vector table that reports any exception and ends the run.
//!
//! Every core, on entry: masks interrupts (DAIF), turns on the MMU and the
//! caches ([`crate::mmu::enable`], before any data access), enables FP/SIMD
//! at EL1 (CPACR_EL1.FPEN = 0b11; Rust and the C++ kernels use NEON
//! registers), points VBAR_EL1 at the vector table and sets its stack pointer to the top
//! of its own slice of [`STACKS`], chosen by MPIDR_EL1.Aff0. The lowest
//! page of each slice is unmapped (its guard, [`crate::mmu`]): a stack
//! overflow faults there, and the exception handler reports it as one
//! (`STACK OVERFLOW on core N`) and exits with [`EXIT_EXCEPTION`]. Core 0 then
//! zeroes `.bss` and calls `primary_main`; a secondary calls
//! `secondary_main(core)`. Both run at EL1 with the MMU and caches on.

use core::arch::global_asm;
use core::cell::UnsafeCell;

/// Cores the firmware runs on (QEMU `-smp 8`); a core with a higher
/// MPIDR_EL1.Aff0 parks at once.
pub const CORES: usize = device_runtime::abi::memory_map::CPUS;
/// Stack of each core, its guard page included (the memory map's).
pub const STACK_SIZE: usize = device_runtime::abi::memory_map::STACK_SIZE;
// `mov` in the boot code takes the size as one immediate.
const _: () = assert!(STACK_SIZE.is_power_of_two());

/// Exit status when a core takes an exception.
pub const EXIT_EXCEPTION: i32 = 3;

/// The stacks of all cores, placed by the linker script in `.stacks`
/// (neither loaded nor zeroed) at the memory map's `STACKS_ADDR`, where the
/// MMU's tables leave the lowest page of each unmapped (the link fails if
/// they are elsewhere or of another size).
#[repr(C, align(16))]
pub struct Stacks(UnsafeCell<[[u8; STACK_SIZE]; CORES]>);

// SAFETY: `Sync` lets every core see `STACKS`; that is sound because no two
// cores ever touch the same bytes:
// 1. No Rust code makes a reference to (or into) the cell: the only use of
//    the static is its address, taken by the boot code below (`sym STACKS`).
// 2. Each core sets its stack pointer to the top of its own slice, chosen by
//    MPIDR_EL1.Aff0 (< CORES, or the core parks without a stack), and uses
//    nothing else of the array; the exception handler reuses the same slice.
unsafe impl Sync for Stacks {}

const _: () =
    assert!(core::mem::size_of::<Stacks>() == device_runtime::abi::memory_map::STACKS_SIZE);

#[link_section = ".stacks"]
static STACKS: Stacks = Stacks(UnsafeCell::new([[0; STACK_SIZE]; CORES]));

global_asm!(
    r#"
// core_init core: CPACR, VBAR and the stack of core index `core` (a register
// that survives the macro). Clobbers x1-x3. A core without a stack parks.
.macro core_init core
    mov     x1, #(3 << 20)
    msr     cpacr_el1, x1
    isb
    adrp    x1, .Lvectors
    add     x1, x1, :lo12:.Lvectors
    msr     vbar_el1, x1
    cmp     \core, #{cores}
    b.hs    .Lpark
    adrp    x1, {stacks}
    add     x1, x1, :lo12:{stacks}
    add     x2, \core, #1
    mov     x3, #{stack_size}
    madd    x1, x2, x3, x1
    mov     sp, x1
.endm

.section .text.boot, "ax"
.global _start
_start:
    msr     daifset, #0xf
    // The MMU and caches before any data access (`mmu::enable`'s contract;
    // it uses no stack). A core does this once: here or in _start_secondary.
    bl      {mmu_enable}
    mrs     x19, mpidr_el1
    and     x19, x19, #0xff
    // Only core 0 boots through here (QEMU holds the others in PSCI OFF).
    cbnz    x19, .Lpark
    core_init x19
    adrp    x0, __bss_start
    add     x0, x0, :lo12:__bss_start
    adrp    x1, __bss_end
    add     x1, x1, :lo12:__bss_end
1:  cmp     x0, x1
    b.hs    2f
    stp     xzr, xzr, [x0], #16
    b       1b
2:  bl      {primary}
    b       .Lpark

.global _start_secondary
_start_secondary:
    msr     daifset, #0xf
    // As in _start: the same tables, before this core touches shared data.
    bl      {mmu_enable}
    mrs     x19, mpidr_el1
    and     x19, x19, #0xff
    core_init x19
    mov     x0, x19
    bl      {secondary}
.Lpark:
    wfe
    b       .Lpark

// 16 entries of 0x80 bytes: {{current EL with SP_EL0, current EL with SP_ELx,
// lower EL AArch64, lower EL AArch32}} x {{sync, IRQ, FIQ, SError}}.
.balign 0x800
.Lvectors:
.irp vector, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15
.balign 0x80
    mov     x0, #\vector
    b       .Lexception
.endr

// The handler gets a fresh stack, so even a stack overflow is reported.
.Lexception:
    mrs     x19, mpidr_el1
    and     x19, x19, #0xff
    core_init x19
    mrs     x1, esr_el1
    mrs     x2, elr_el1
    mrs     x3, far_el1
    mov     x4, x19
    bl      {exception}
    b       .Lpark
"#,
    cores = const CORES,
    stack_size = const STACK_SIZE,
    stacks = sym STACKS,
    primary = sym crate::primary_main,
    secondary = sym crate::secondary_main,
    exception = sym exception,
    mmu_enable = sym crate::mmu::enable,
);

extern "C" {
    /// Where a secondary core starts (its PSCI CPU_ON entry point).
    pub fn _start_secondary();
}

/// Logs an exception (vector index 0..15, the syndrome, the faulting
/// address) at level error and ends the run with [`EXIT_EXCEPTION`].
extern "C" fn exception(vector: u64, esr: u64, elr: u64, far: u64, core: u64) -> ! {
    const KIND: [&str; 4] = ["synchronous", "IRQ", "FIQ", "SError"];
    const FROM: [&str; 4] = [
        "current EL, SP_EL0",
        "current EL, SP_ELx",
        "lower EL, AArch64",
        "lower EL, AArch32",
    ];
    let class = (esr >> 26) & 0x3f;
    if let Some(stack) = crate::mmu::guarded_stack(far) {
        // Said first and on its own line, so that no decoding of the
        // syndrome is needed to see what went wrong.
        if crate::log::held_here() {
            semihosting::eprintln!(
                "STACK OVERFLOW on core {core}: FAR_EL1={far:#x} is in the guard page of core {stack}'s stack"
            );
        } else {
            defmt::error!(
                "STACK OVERFLOW on core {=u64}: FAR_EL1={=u64:#x} is in the guard page of core {=usize}'s stack",
                core,
                far,
                stack,
            );
        }
    }
    let kind = KIND[(vector % 4) as usize];
    let from = FROM[(vector / 4 % 4) as usize];
    if crate::log::held_here() {
        // It faulted while logging: the logger is this core's, so say it
        // straight to the semihosting stderr.
        semihosting::eprintln!(
            "EXCEPTION on core {core}: {kind} ({from}), class {class:#04x} {}, ESR_EL1={esr:#x} ELR_EL1={elr:#x} FAR_EL1={far:#x}",
            class_name(class),
        );
    } else {
        defmt::error!(
            "EXCEPTION on core {=u64}: {=str} ({=str}), class {=u64:#04x} {=str}, ESR_EL1={=u64:#x} ELR_EL1={=u64:#x} FAR_EL1={=u64:#x}",
            core,
            kind,
            from,
            class,
            class_name(class),
            esr,
            elr,
            far,
        );
    }
    semihosting::process::exit(EXIT_EXCEPTION)
}

/// The common exception classes (ESR_EL1.EC) by name.
fn class_name(class: u64) -> &'static str {
    match class {
        0x00 => "(unknown reason / undefined instruction)",
        0x07 => "(FP/SIMD access trapped)",
        0x15 => "(SVC)",
        0x16 => "(HVC)",
        0x20 | 0x21 => "(instruction abort)",
        0x22 => "(PC alignment fault)",
        0x24 | 0x25 => "(data abort)",
        0x26 => "(SP alignment fault)",
        0x2f => "(SError)",
        0x3c => "(BRK)",
        _ => "",
    }
}
