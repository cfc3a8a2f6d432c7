//! The workload program: a compact description of tasks that the device
//! expands as it runs ([`crate::expand`]), instead of a list of task records.
//!
//! A program is a sequence of 16-byte [`Instr`]s over 16 signed 64-bit
//! registers (all 0 at the start; [`NO_REG`] reads as 0). Control flow is
//! structured, so every program ends: loops run a counted number of
//! iterations, bounded by a maximum stated in the loop, and jumps go forward
//! within one loop body.
//!
//! | op | operands | meaning |
//! |---|---|---|
//! | [`OP_CONST`] | `r`, `imm` (low), `imm2` (high) | `r = imm \| imm2 << 32` |
//! | [`OP_SYMBOL`] | `r`, `imm` = symbol | `r` = the symbol's value, bound at launch |
//! | [`OP_LOAD`] | `r`, `imm` = tensor, `x[0..rank]` = index registers | `r` = the i32 element; waits until no task that writes it is running or waiting |
//! | [`OP_ADD`] .. [`OP_EQ`] | `r`, `x[0]`, `x[1]` | `r = x[0] op x[1]` (overflow is an error; `LT`/`LE`/`EQ` give 0 or 1; `DIV`/`REM` are Euclidean, by 0 an error) |
//! | [`OP_LOOP`] | `r` = variable, `x[0]` = count register, `x[1]` = [`LOOP_PARALLEL`] or [`LOOP_SEQUENTIAL`], `imm` = pc of its `END`, `imm2` = most iterations | runs the body with `r = 0 .. count` |
//! | [`OP_END`] | `imm` = pc of its `LOOP` | next iteration |
//! | [`OP_WHEN`] | `x[0]` = condition register, `imm` = target | if the condition is 0, continue at `imm` |
//! | [`OP_JUMP`] | `imm` = target | continue at `imm` |
//! | [`OP_CALL`] | `imm` = kernel id, `x[0]` = stream (0 = none), or `x[1]` = a register holding it (e.g. a stream per batch; then `x[0]` is 0) | one task; followed by one `ARG` per tensor argument and one `SCALAR` per scalar of the kernel |
//! | [`OP_ARG`] | `imm` = tensor, `r` = access, `x[0..rank]` = offset registers per dimension, `x[4]`, `x[5]` = extents of the last two dimensions | one tensor argument; a `NO_REG` offset is 0, a `NO_REG` extent 1 |
//! | [`OP_SCALAR`] | `x[0]` = register | one scalar (the register's 64 bits) |
//! | [`OP_RECORD`], [`OP_WAIT`] | `x[0]` = stream, `x[1]` = event | an event record or wait, as in the stream-ops section |
//! | [`OP_INPUT`] | `imm` = tensor | the host provides the tensor's data at launch: `LOAD` may read it before any task writes it |
//! | [`OP_DISPATCH`] | `imm` = taskset, `imm2` = its schedule ([`Schedule::encode`](super::schedule::Schedule::encode); 0 for taskset 0) | the calls expanded after it, until the next `DISPATCH`, belong to the taskset |
//! | [`OP_WINDOW`] | `imm` = tasks | the program's task window: at most this many tasks submitted and not retired (at most one `WINDOW`; a launch may override it) |
//! | [`OP_CHANNEL`] | `imm` = channel, `imm2` = capacity (bits 0..8) \| latency in clock ticks (bits 8..32) | declares a token channel (at the top level, once per channel) |
//! | [`OP_PROCESS`] | `r` = replica register (or `NO_REG`), `x[0]` = replica count register (`NO_REG`: one), `imm` = pc of its `PROCESS_END`, `imm2` = most replicas | starts the body's processes and continues after its `PROCESS_END` |
//! | [`OP_PROCESS_END`] | `imm` = pc of its `PROCESS` | the process ends: it closes the channels it sends on |
//! | [`OP_SEND`] | `imm` = channel, `x[0]` = value register | sends a token: "the last task this process issued has completed", with the value |
//! | [`OP_CONSUME`] | `r` = value register, `imm` = channel, `imm2` = pc of its `END` | runs the body once per token, `r` = its value, until the channel is closed and drained |
//! | [`OP_CLOSE`] | `imm` = channel | closes the channel: no more sends; consumers drain it and leave their loops |
//! | [`OP_HEAP`] | `imm` = bytes (a multiple of 64) | the heap ring: the last `imm` bytes of the arena hold the storage of scratch tensors (at most one `HEAP`; no arena tensor may lie there) |
//! | [`OP_FREE`] | `imm` = scratch tensor | ends the tensor's scope: its storage returns to the heap ring once every task submitted before this point has retired; a later write takes new storage |
//!
//! ## Processes and channels (CSP)
//!
//! A `PROCESS` (at the top level of the program only) starts `count`
//! copies of its body (its *replicas*), each a context of its own: a
//! program counter, the registers (copied from the program's at the
//! start, with `r` set to the replica's index), loops and a taskset. The
//! program goes on after the body at once. The expander runs every live
//! context in turn, switching after each task; a context that cannot go
//! on *parks* and the others run.
//!
//! A channel holds at most `capacity` tokens ([`MAX_CHANNEL_CAPACITY`];
//! [`MAX_CHANNELS`] channels per program). A token is counted from its
//! `SEND` until the consumer's body for it has ended (its `END`), so that
//! every task the body issues (e.g. the reads of the staging-buffer slot
//! the token names) is submitted, and ordered by the TensorMap, before the
//! sender may reuse what the token stands for. The rules:
//!
//! - `SEND` on a channel holding `capacity` tokens parks the sender
//!   (`CHANNEL_FULL`). With capacity 0 (a rendezvous) a `SEND` waits until
//!   a consumer waits at a `CONSUME` of the channel, then hands the token
//!   over (one slot carries it). A `SEND` on a closed channel is an error.
//! - The token stands for the last task the sending context issued (none:
//!   ready at once). `CONSUME` takes the oldest token once that task has
//!   completed and the channel's latency has passed since the runtime saw
//!   it complete (in semantic time: since the task ended); until then, or
//!   while the channel is empty and open, the consumer parks
//!   (`CHANNEL_EMPTY`). Every task the body issues therefore starts after
//!   the token's task ended, in addition to what its regions imply.
//! - A channel is closed by `CLOSE`, or when the last process that sends on
//!   it ends (the program's own context counts as a process that ends with
//!   the program). `CONSUME` on a closed, drained channel ends its loop.
//! - If every context is parked on a channel and no task is in flight,
//!   nothing can change: the run ends with a channel deadlock report.
//!
//! Tasksets give parts of a workload their own dispatch policy and key
//! (per taskset; [`MAX_TASKSETS`]). Taskset 0 is the run's own policy
//! (the scheduler's `SchedConfig`), and the tasks section's
//! tasks and every call before the first `DISPATCH` belong to it. Every
//! `DISPATCH` of a taskset must give the same schedule: a taskset is one
//! policy, with one state, for the whole run.
//!
//! A sequential loop runs its iterations one after another: the tasks of
//! iteration `i + 1` are expanded only after every task of iteration `i`
//! has completed (in a process, every task the process issued in it: the
//! other processes' tasks meanwhile do not hold it back). A parallel loop's iterations are independent except for
//! the dependencies their tasks' regions imply.
//!
//! A `LOAD` reads data the device computed (the CSR arrays of an MoE router,
//! sequence lengths): expansion waits until the tasks that write the element
//! have completed, and refuses to read a tensor that is neither an `INPUT`
//! nor written by an earlier task. A program loads from at most
//! [`MAX_DATA_TENSORS`] distinct tensors ([`Problem::TooManyDataTensors`]).

use super::error::{Problem, Section, TableError};
use super::layout::{Access, Instr, TensorDesc, MAX_EVENTS, MAX_RANK, MAX_STREAMS};

/// Set a register to a 64-bit constant. See the table above.
pub const OP_CONST: u8 = 1;
/// Read a symbol bound at launch. See the table above.
pub const OP_SYMBOL: u8 = 2;
/// Read an i32 element of a tensor. See the table above.
pub const OP_LOAD: u8 = 3;
/// Add. See the table above.
pub const OP_ADD: u8 = 4;
/// Subtract. See the table above.
pub const OP_SUB: u8 = 5;
/// Multiply. See the table above.
pub const OP_MUL: u8 = 6;
/// Divide (Euclidean). See the table above.
pub const OP_DIV: u8 = 7;
/// Remainder (Euclidean). See the table above.
pub const OP_REM: u8 = 8;
/// Minimum. See the table above.
pub const OP_MIN: u8 = 9;
/// Maximum. See the table above.
pub const OP_MAX: u8 = 10;
/// Less than (0 or 1). See the table above.
pub const OP_LT: u8 = 11;
/// Less than or equal (0 or 1). See the table above.
pub const OP_LE: u8 = 12;
/// Equal (0 or 1). See the table above.
pub const OP_EQ: u8 = 13;
/// Start a counted loop. See the table above.
pub const OP_LOOP: u8 = 16;
/// End of a loop body. See the table above.
pub const OP_END: u8 = 17;
/// Skip forward unless a register is non-zero. See the table above.
pub const OP_WHEN: u8 = 18;
/// Jump forward. See the table above.
pub const OP_JUMP: u8 = 19;
/// One kernel call (a task). See the table above.
pub const OP_CALL: u8 = 20;
/// A tensor argument of the call before it. See the table above.
pub const OP_ARG: u8 = 21;
/// A scalar of the call before it. See the table above.
pub const OP_SCALAR: u8 = 22;
/// Record an event on a stream. See the table above.
pub const OP_RECORD: u8 = 23;
/// Make a stream wait for an event. See the table above.
pub const OP_WAIT: u8 = 24;
/// Declare a tensor the host fills at launch. See the table above.
pub const OP_INPUT: u8 = 25;
/// Start a taskset with its schedule. See the table above.
pub const OP_DISPATCH: u8 = 26;
/// The program's task window. See the table above.
pub const OP_WINDOW: u8 = 27;

/// Declare a token channel. See the table above.
pub const OP_CHANNEL: u8 = 28;
/// Start a process body's replicas. See the table above.
pub const OP_PROCESS: u8 = 29;
/// End of a process body. See the table above.
pub const OP_PROCESS_END: u8 = 30;
/// Send a token. See the table above.
pub const OP_SEND: u8 = 31;
/// Consume a channel's tokens in a loop. See the table above.
pub const OP_CONSUME: u8 = 32;
/// Close a channel. See the table above.
pub const OP_CLOSE: u8 = 33;
/// The heap ring's size. See the table above.
pub const OP_HEAP: u8 = 34;
/// End a scratch tensor's scope. See the table above.
pub const OP_FREE: u8 = 35;

/// Channels a program may declare, numbered `0 .. MAX_CHANNELS` (the
/// expander keeps each one's tokens in a fixed ring).
pub const MAX_CHANNELS: usize = 16;
/// Most tokens a channel holds (its capacity: 0 ..= this).
pub const MAX_CHANNEL_CAPACITY: usize = 16;
/// Most processes live at once (replicas count one each); the program's
/// own context comes on top.
pub const MAX_PROCESSES: usize = 16;
/// The largest channel latency, in clock ticks (24 bits of `imm2`).
pub const MAX_CHANNEL_LATENCY: u32 = (1 << 24) - 1;

/// [`OP_LOOP`] kind: iterations are independent.
pub const LOOP_PARALLEL: u8 = 0;
/// [`OP_LOOP`] kind: iteration `i + 1` starts after iteration `i` completed.
pub const LOOP_SEQUENTIAL: u8 = 1;

/// Registers of the program machine.
pub const MAX_REGS: usize = 16;
/// The "no register" operand: reads as 0 (as 1 for an `ARG` extent).
pub const NO_REG: u8 = 0xFF;
/// Deepest loop nesting (the expander keeps one frame per open loop).
pub const MAX_LOOP_DEPTH: usize = 8;
/// Symbols a program may use, numbered `0 .. MAX_SYMBOLS`.
pub const MAX_SYMBOLS: usize = 16;
/// Distinct tensors a program may `LOAD` from (the expander tracks, for
/// each, whether a task has written it yet, as one bit of a `u64`). An MoE
/// decode step loads one routing tensor per layer and three shared ones:
/// at 8, this stopped such a model at 5 layers.
pub const MAX_DATA_TENSORS: usize = 64;

// The masks over data tensors (`ProgramInfo::inputs`, the expander's
// `written` and per-call write masks) are `u64`: one bit per tensor.
const _: () = assert!(MAX_DATA_TENSORS <= u64::BITS as usize);

/// Longest program in instructions (1 MiB of 16-byte instructions, well
/// inside the table's [`TABLE_MAX`](super::memory_map::TABLE_MAX)): room for
/// the unrolled decode step of a model of many layers (a dense layer lowers
/// to about 360 instructions, an MoE layer to about 560). Validation is
/// linear in the program's length; the bound sizes the bitset of jump
/// targets it keeps on the stack (one bit per instruction: 8 KiB).
pub const MAX_PROGRAM: usize = 65_536;

/// Tasksets of a program, numbered `0 .. MAX_TASKSETS` (0: the run's
/// policy). The dispatcher keeps one policy per taskset.
pub const MAX_TASKSETS: usize = 8;

/// The i32 element type: the only one `LOAD` reads.
pub const DTYPE_I32: u32 = wsp_ffi::DTYPE_I32;

/// What validation learned about a program that the expander needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramInfo {
    /// The tensors `LOAD` reads, `data[..data_count]` ([`ProgramInfo::data`]).
    /// A fixed array and a count, not a `heapless::Vec`, so that the info
    /// (and the `Table` that holds it) stays `Copy`; private, so that the
    /// two cannot disagree.
    data: [u32; MAX_DATA_TENSORS],
    data_count: usize,
    /// Bit `i`: `data[i]` is an `INPUT`.
    pub inputs: u64,
    /// One more than the highest symbol the program reads (0 if none).
    pub symbols: usize,
    /// The schedule of each taskset ([`Schedule::encode`](super::schedule::Schedule::encode)),
    /// where bit `t` of `tasksets_defined` is set (taskset 0: the run's).
    pub tasksets: [u32; MAX_TASKSETS],
    /// Bit `t`: the program defines taskset `t`.
    pub tasksets_defined: u8,
    /// The program's task window (`WINDOW`), or 0 for the runtime's.
    pub window: u32,
    /// Each declared channel's `CHANNEL` operand (capacity in bits 0..8,
    /// latency in bits 8..32), where bit `c` of `channels_defined` is set.
    pub channels: [u32; MAX_CHANNELS],
    /// Bit `c`: the program declares channel `c`.
    pub channels_defined: u16,
    /// Bytes of the heap ring (`HEAP`): the arena's last bytes, where
    /// scratch tensors live; 0 if the program declares none.
    pub heap: u32,
}

// By hand: `Default` is not derived for arrays longer than 32 (`data`).
impl Default for ProgramInfo {
    fn default() -> Self {
        ProgramInfo {
            data: [0; MAX_DATA_TENSORS],
            data_count: 0,
            inputs: 0,
            symbols: 0,
            tasksets: [0; MAX_TASKSETS],
            tasksets_defined: 0,
            window: 0,
            channels: [0; MAX_CHANNELS],
            channels_defined: 0,
            heap: 0,
        }
    }
}

impl ProgramInfo {
    /// The tensors `LOAD` reads, in the order of their first `LOAD`.
    #[inline]
    pub fn data(&self) -> &[u32] {
        &self.data[..self.data_count]
    }

    /// Channel `c`'s capacity and latency, if the program declares it.
    #[inline]
    pub fn channel(&self, c: usize) -> Option<(usize, u32)> {
        let bits = *self.channels.get(c)?;
        (self.channels_defined & (1 << c) != 0).then_some(((bits & 0xFF) as usize, bits >> 8))
    }

    /// The index of `tensor` among the data tensors.
    #[inline]
    pub fn data_index(&self, tensor: u32) -> Option<usize> {
        self.data[..self.data_count]
            .iter()
            .position(|&t| t == tensor)
    }
}

fn err(pc: usize, field: &'static str, problem: Problem) -> TableError {
    TableError::new(Section::Program, pc as u32, field, problem)
}

fn structure(pc: usize, why: &'static str) -> TableError {
    err(pc, "op", Problem::Structure { why })
}

const X: [&str; 6] = ["x[0]", "x[1]", "x[2]", "x[3]", "x[4]", "x[5]"];

/// A register operand: `0 .. MAX_REGS`, or `NO_REG` where `optional`.
fn reg(pc: usize, field: &'static str, r: u8, optional: bool) -> Result<(), TableError> {
    if (r as usize) < MAX_REGS || (optional && r == NO_REG) {
        Ok(())
    } else {
        Err(err(pc, field, Problem::BadRegister { reg: r }))
    }
}

/// Operands a validated program never reads must be `NO_REG`, so that a
/// future version can give them meaning.
fn unused(pc: usize, ins: &Instr, from: usize) -> Result<(), TableError> {
    for (i, &x) in ins.x.iter().enumerate().skip(from) {
        if x != NO_REG {
            return Err(err(pc, X[i], Problem::BadRegister { reg: x }));
        }
    }
    Ok(())
}

fn range(value: u64, min: u64, max: u64) -> Problem {
    Problem::OutOfRange { value, min, max }
}

/// The pc a loop or process body ends at: the `END` (`PROCESS_END`) its
/// opener names (`LOOP.imm`, `CONSUME.imm2`, `PROCESS.imm`).
fn end_of(opener: &Instr) -> usize {
    let end = match opener.op {
        OP_CONSUME => opener.imm2.get(),
        _ => opener.imm.get(),
    };
    end as usize
}

/// The targets of the jumps validated so far, one bit per pc.
///
/// Why a bitset: a jump must not enter a loop or process body, and the
/// bodies after a jump are not validated yet when the jump is. Walking
/// each jump to its target (as validation once did) costs the jump's
/// length, quadratic in the program's in the worst case (every
/// instruction a jump to the end). Instead each jump marks its target,
/// and each body, as it opens at `L` with its `END` at `E`, refuses any
/// mark in `L + 1 ..= E`: every jump seen so far is before `L`, so a mark
/// there is a jump into the body. (A jump from inside an earlier sibling
/// body cannot mark past that body's end, which is before `L`: leaving a
/// body is refused at the jump.) Bodies nest at most `MAX_LOOP_DEPTH + 1`
/// deep, so the scans cost at most that many times the program's length
/// over 64. `MAX_PROGRAM` bits are 8 KiB, on `validate`'s stack (a device
/// CPU's stack is 512 KiB), with no allocation.
struct Targets([u64; MAX_PROGRAM / 64]);

impl Targets {
    const EMPTY: Targets = Targets([0; MAX_PROGRAM / 64]);

    fn mark(&mut self, target: usize) {
        if let Some(word) = self.0.get_mut(target / 64) {
            *word |= 1 << (target % 64);
        }
    }

    /// Whether a target in `lo ..= hi` is marked.
    fn any_in(&self, lo: usize, hi: usize) -> bool {
        if lo > hi {
            return false;
        }
        let (first, last) = (lo / 64, hi / 64);
        (first..=last).any(|w| {
            let mut bits = self.0.get(w).copied().unwrap_or(0);
            if w == first {
                bits &= !0 << (lo % 64);
            }
            if w == last {
                bits &= !0 >> (63 - hi % 64);
            }
            bits != 0
        })
    }
}

/// Checks what can be checked of a forward jump from `pc` to `target` when
/// it is reached, in O(1): the target is ahead and in the program, it does
/// not leave the innermost loop or process body around `pc`, which ends at
/// `body_end` (the program's length at the top level; landing on that
/// body's own `END` is fine), and it lands on an instruction that starts a
/// step (not an `ARG` or `SCALAR`). Whether it enters a nested body is
/// checked when that body opens ([`Targets`]).
fn check_jump(
    program: &[Instr],
    pc: usize,
    target: usize,
    body_end: usize,
) -> Result<(), TableError> {
    if target <= pc || target > program.len() {
        let problem = range(target as u64, pc as u64 + 1, program.len() as u64);
        return Err(err(pc, "imm", problem));
    }
    if target > body_end {
        return Err(structure(pc, "jump leaves its loop"));
    }
    if program
        .get(target)
        .is_some_and(|t| t.op == OP_ARG || t.op == OP_SCALAR)
    {
        // A jump into a call in a nested body was refused as entering it
        // before; keep saying so. An error path: walking it costs the
        // jump's length once.
        let mut depth = 0usize;
        for ins in &program[pc + 1..target] {
            match ins.op {
                OP_LOOP | OP_CONSUME | OP_PROCESS => depth += 1,
                OP_END | OP_PROCESS_END => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
        let why = if depth != 0 {
            "jump enters a loop body"
        } else {
            "jump lands inside a call"
        };
        return Err(structure(pc, why));
    }
    Ok(())
}

/// Refuses a jump into the body of the opener at `open`, which ends at
/// `end` (valid: the opener's own checks passed): every jump validated so
/// far comes before `open`, so any of their targets in `open + 1 ..= end`
/// is one.
fn check_entry(
    program: &[Instr],
    targets: &Targets,
    open: usize,
    end: usize,
) -> Result<(), TableError> {
    if !targets.any_in(open + 1, end) {
        return Ok(());
    }
    // An error path: name the first jump into this body. (Walking each
    // jump named the program's first bad jump: with several, one into a
    // later body may come before this one.)
    let body = open + 1..=end;
    let pc = program[..open]
        .iter()
        .position(|i| {
            (i.op == OP_WHEN || i.op == OP_JUMP) && body.contains(&(i.imm.get() as usize))
        })
        .unwrap_or(open);
    Err(structure(pc, "jump enters a loop body"))
}

/// Validates `program` against the table's tensors and declared kernels
/// (`declared(id)`), and the tensors the tasks section writes
/// (`task_writes(tensor)`). One pass, in time linear in the program's
/// length (jumps: [`Targets`]; naming a refused jump may take one more
/// pass), whatever the program's jumps.
pub(crate) fn validate(
    program: &[Instr],
    tensors: &[TensorDesc],
    declared: impl Fn(u32) -> bool,
    task_writes: impl Fn(u32) -> bool,
) -> Result<ProgramInfo, TableError> {
    if program.len() > MAX_PROGRAM {
        let problem = range(program.len() as u64, 0, MAX_PROGRAM as u64);
        return Err(TableError::new(Section::Header, 0, "program", problem));
    }
    let mut info = ProgramInfo::default();
    let mut loops = [0usize; MAX_LOOP_DEPTH];
    let mut depth = 0;
    let mut pc = 0;
    // The pc of the PROCESS whose body `pc` is in.
    let mut process: Option<usize> = None;
    // Bit `c`: some SEND sends on channel `c`.
    let mut sent: u16 = 0;
    let mut targets = Targets::EMPTY;
    let declared_channel = |pc: usize, info: &ProgramInfo, ins: &Instr| {
        let c = ins.imm.get();
        if info.channel(c as usize).is_some() {
            Ok(())
        } else {
            Err(err(pc, "imm", Problem::UndeclaredChannel { channel: c }))
        }
    };
    let tensor = |pc: usize, t: u32| {
        tensors.get(t as usize).ok_or(err(
            pc,
            "imm",
            range(t as u64, 0, (tensors.len() as u64).saturating_sub(1)),
        ))
    };
    while pc < program.len() {
        let ins = &program[pc];
        match ins.op {
            OP_CONST => {
                reg(pc, "r", ins.r, false)?;
                unused(pc, ins, 0)?;
            }
            OP_SYMBOL => {
                reg(pc, "r", ins.r, false)?;
                unused(pc, ins, 0)?;
                let symbol = ins.imm.get() as usize;
                if symbol >= MAX_SYMBOLS {
                    return Err(err(
                        pc,
                        "imm",
                        range(symbol as u64, 0, MAX_SYMBOLS as u64 - 1),
                    ));
                }
                info.symbols = info.symbols.max(symbol + 1);
            }
            OP_LOAD => {
                reg(pc, "r", ins.r, false)?;
                let t = ins.imm.get();
                let desc = tensor(pc, t)?;
                if desc.is_scratch() {
                    let problem = Problem::Scratch {
                        tensor: t,
                        scratch: true,
                    };
                    return Err(err(pc, "imm", problem));
                }
                if desc.dtype.get() != DTYPE_I32 {
                    let problem = Problem::RegistryMismatch {
                        found: desc.dtype.get(),
                        expected: DTYPE_I32,
                    };
                    return Err(err(pc, "imm", problem));
                }
                let rank = desc.rank.get() as usize;
                for (i, &x) in ins.x.iter().enumerate().take(rank) {
                    reg(pc, X[i], x, true)?;
                }
                unused(pc, ins, rank)?;
                if info.data_index(t).is_none() {
                    if info.data_count == MAX_DATA_TENSORS {
                        let problem = Problem::TooManyDataTensors {
                            max: MAX_DATA_TENSORS as u32,
                        };
                        return Err(err(pc, "imm", problem));
                    }
                    info.data[info.data_count] = t;
                    info.data_count += 1;
                }
            }
            OP_ADD..=OP_EQ => {
                reg(pc, "r", ins.r, false)?;
                reg(pc, "x[0]", ins.x[0], true)?;
                reg(pc, "x[1]", ins.x[1], true)?;
                unused(pc, ins, 2)?;
            }
            OP_LOOP | OP_CONSUME => {
                if ins.op == OP_LOOP {
                    reg(pc, "r", ins.r, false)?;
                    reg(pc, "x[0]", ins.x[0], false)?;
                    if ins.x[1] != LOOP_PARALLEL && ins.x[1] != LOOP_SEQUENTIAL {
                        return Err(err(pc, "x[1]", range(ins.x[1] as u64, 0, 1)));
                    }
                    unused(pc, ins, 2)?;
                } else {
                    reg(pc, "r", ins.r, true)?;
                    unused(pc, ins, 0)?;
                    declared_channel(pc, &info, ins)?;
                }
                if depth == MAX_LOOP_DEPTH {
                    return Err(structure(pc, "loops nested deeper than MAX_LOOP_DEPTH"));
                }
                let end = end_of(ins);
                if end <= pc || program.get(end).is_none_or(|e| e.op != OP_END) {
                    let why = if ins.op == OP_LOOP {
                        "LOOP does not name its END"
                    } else {
                        "CONSUME does not name its END"
                    };
                    return Err(structure(pc, why));
                }
                check_entry(program, &targets, pc, end)?;
                loops[depth] = pc;
                depth += 1;
            }
            OP_END => {
                unused(pc, ins, 0)?;
                if depth == 0 {
                    return Err(structure(pc, "END without a LOOP"));
                }
                depth -= 1;
                let start = loops[depth];
                if ins.imm.get() as usize != start || end_of(&program[start]) != pc {
                    return Err(structure(pc, "END does not match the innermost LOOP"));
                }
            }
            OP_CHANNEL => {
                unused(pc, ins, 0)?;
                if depth != 0 || process.is_some() {
                    return Err(structure(pc, "CHANNEL inside a loop or process"));
                }
                let c = ins.imm.get() as usize;
                if c >= MAX_CHANNELS {
                    let problem = range(c as u64, 0, MAX_CHANNELS as u64 - 1);
                    return Err(err(pc, "imm", problem));
                }
                if info.channel(c).is_some() {
                    return Err(structure(pc, "a channel declared twice"));
                }
                let capacity = (ins.imm2.get() & 0xFF) as u64;
                if capacity > MAX_CHANNEL_CAPACITY as u64 {
                    let problem = range(capacity, 0, MAX_CHANNEL_CAPACITY as u64);
                    return Err(err(pc, "imm2", problem));
                }
                info.channels[c] = ins.imm2.get();
                info.channels_defined |= 1 << c;
            }
            OP_PROCESS => {
                reg(pc, "r", ins.r, true)?;
                reg(pc, "x[0]", ins.x[0], true)?;
                unused(pc, ins, 1)?;
                if depth != 0 || process.is_some() {
                    return Err(structure(
                        pc,
                        "PROCESS inside a loop or another process (processes start at the top level)",
                    ));
                }
                let most = ins.imm2.get() as u64;
                if most == 0 || most > MAX_PROCESSES as u64 {
                    return Err(err(pc, "imm2", range(most, 1, MAX_PROCESSES as u64)));
                }
                let end = ins.imm.get() as usize;
                if end <= pc || program.get(end).is_none_or(|e| e.op != OP_PROCESS_END) {
                    return Err(structure(pc, "PROCESS does not name its PROCESS_END"));
                }
                check_entry(program, &targets, pc, end)?;
                process = Some(pc);
            }
            OP_PROCESS_END => {
                unused(pc, ins, 0)?;
                // The body ends where its PROCESS says (the program's
                // context goes on after that pc, and jumps in the body are
                // checked against it), not at another PROCESS_END naming it.
                match process {
                    Some(start)
                        if depth == 0
                            && ins.imm.get() as usize == start
                            && end_of(&program[start]) == pc => {}
                    Some(_) if depth != 0 => {
                        return Err(structure(loops[depth - 1], "LOOP without an END"))
                    }
                    _ => return Err(structure(pc, "PROCESS_END does not match its PROCESS")),
                }
                process = None;
            }
            OP_SEND => {
                reg(pc, "x[0]", ins.x[0], true)?;
                unused(pc, ins, 1)?;
                declared_channel(pc, &info, ins)?;
                sent |= 1 << ins.imm.get();
            }
            OP_CLOSE => {
                unused(pc, ins, 0)?;
                declared_channel(pc, &info, ins)?;
            }
            OP_WHEN | OP_JUMP => {
                if ins.op == OP_WHEN {
                    reg(pc, "x[0]", ins.x[0], false)?;
                    unused(pc, ins, 1)?;
                } else {
                    unused(pc, ins, 0)?;
                }
                let target = ins.imm.get() as usize;
                let body_end = match (depth.checked_sub(1), process) {
                    (Some(inner), _) => end_of(&program[loops[inner]]),
                    (None, Some(start)) => end_of(&program[start]),
                    (None, None) => program.len(),
                };
                check_jump(program, pc, target, body_end)?;
                targets.mark(target);
            }
            OP_CALL => {
                let id = ins.imm.get();
                if !declared(id) {
                    let known = wsp_ffi::lookup(id).is_some();
                    return Err(err(
                        pc,
                        "imm",
                        Problem::UnknownKernel {
                            id,
                            declared: known,
                        },
                    ));
                }
                let kernel = wsp_ffi::lookup(id).expect("declared kernels are registered");
                let stream = ins.x[0];
                if stream as usize > MAX_STREAMS {
                    return Err(err(pc, "x[0]", range(stream as u64, 0, MAX_STREAMS as u64)));
                }
                reg(pc, "x[1]", ins.x[1], true)?;
                if ins.x[1] != NO_REG && stream != 0 {
                    return Err(err(pc, "x[0]", range(stream as u64, 0, 0)));
                }
                unused(pc, ins, 2)?;
                let tensors_at = pc + 1;
                let scalars_at = tensors_at + kernel.num_tensors as usize;
                let end = scalars_at + kernel.num_scalars as usize;
                if end > program.len() {
                    return Err(structure(pc, "program ends inside a call"));
                }
                for (k, spec) in kernel.tensor_args.iter().enumerate() {
                    let at = tensors_at + k;
                    let arg = &program[at];
                    if arg.op != OP_ARG {
                        return Err(structure(
                            at,
                            "a call has fewer ARGs than its kernel's tensors",
                        ));
                    }
                    let desc = tensor(at, arg.imm.get())?;
                    if arg.r as u32 != spec.access as u32 {
                        let problem = Problem::RegistryMismatch {
                            found: arg.r as u32,
                            expected: spec.access as u32,
                        };
                        return Err(err(at, "r", problem));
                    }
                    let rank = desc.rank.get() as usize;
                    for (d, &x) in arg.x.iter().enumerate().take(MAX_RANK) {
                        reg(at, X[d], x, true)?;
                        if d >= rank && x != NO_REG {
                            return Err(err(at, X[d], Problem::BadRegister { reg: x }));
                        }
                    }
                    reg(at, "x[4]", arg.x[4], true)?;
                    reg(at, "x[5]", arg.x[5], true)?;
                    if rank < 2 && arg.x[4] != NO_REG {
                        return Err(err(at, "x[4]", Problem::BadRegister { reg: arg.x[4] }));
                    }
                }
                for (at, s) in program.iter().enumerate().take(end).skip(scalars_at) {
                    if s.op != OP_SCALAR {
                        return Err(structure(
                            at,
                            "a call has fewer SCALARs than its kernel's scalars",
                        ));
                    }
                    reg(at, "x[0]", s.x[0], true)?;
                    unused(at, s, 1)?;
                }
                pc = end;
                continue;
            }
            OP_ARG | OP_SCALAR => return Err(structure(pc, "ARG or SCALAR outside a call")),
            OP_RECORD | OP_WAIT => {
                let (stream, event) = (ins.x[0], ins.x[1]);
                if stream == 0 || stream as usize > MAX_STREAMS {
                    return Err(err(pc, "x[0]", range(stream as u64, 1, MAX_STREAMS as u64)));
                }
                if event as usize >= MAX_EVENTS {
                    return Err(err(
                        pc,
                        "x[1]",
                        range(event as u64, 0, MAX_EVENTS as u64 - 1),
                    ));
                }
                unused(pc, ins, 2)?;
            }
            OP_INPUT => {
                tensor(pc, ins.imm.get())?;
                unused(pc, ins, 0)?;
            }
            OP_DISPATCH => {
                unused(pc, ins, 0)?;
                let set = ins.imm.get() as usize;
                if set >= MAX_TASKSETS {
                    let problem = range(set as u64, 0, MAX_TASKSETS as u64 - 1);
                    return Err(err(pc, "imm", problem));
                }
                let bits = ins.imm2.get();
                let schedule = match set {
                    0 => (bits == 0).then_some(None),
                    _ => super::schedule::Schedule::decode(bits).map(Some),
                };
                let Some(schedule) = schedule else {
                    return Err(err(pc, "imm2", Problem::BadSchedule { bits }));
                };
                // A key with a policy that places without one would be
                // ignored (as the run's own key: `ConfigError::KeyIgnored`).
                if let Some(s) = schedule {
                    if !s.policy.uses_key() && s.key != super::schedule::DispatchKey::TaskIndex {
                        return Err(structure(
                            pc,
                            "DISPATCH gives a key to a policy that places tasks without one",
                        ));
                    }
                }
                if info.tasksets_defined & (1 << set) != 0 && info.tasksets[set] != bits {
                    return Err(structure(
                        pc,
                        "DISPATCH gives a taskset another schedule than before",
                    ));
                }
                info.tasksets[set] = bits;
                info.tasksets_defined |= 1 << set;
            }
            OP_WINDOW => {
                unused(pc, ins, 0)?;
                if info.window != 0 {
                    return Err(structure(pc, "a second WINDOW"));
                }
                let tasks = ins.imm.get();
                if tasks == 0 || tasks as usize > super::TASK_WINDOW {
                    let problem = range(tasks as u64, 1, super::TASK_WINDOW as u64);
                    return Err(err(pc, "imm", problem));
                }
                info.window = tasks;
            }
            OP_HEAP => {
                unused(pc, ins, 0)?;
                if info.heap != 0 {
                    return Err(structure(pc, "a second HEAP"));
                }
                let bytes = ins.imm.get();
                if bytes == 0 || !bytes.is_multiple_of(64) {
                    return Err(err(pc, "imm", range(bytes as u64, 64, u32::MAX as u64)));
                }
                info.heap = bytes;
            }
            OP_FREE => {
                unused(pc, ins, 0)?;
                let t = ins.imm.get();
                if !tensor(pc, t)?.is_scratch() {
                    let problem = Problem::Scratch {
                        tensor: t,
                        scratch: false,
                    };
                    return Err(err(pc, "imm", problem));
                }
            }
            op => return Err(err(pc, "op", Problem::BadOpcode { op })),
        }
        pc += 1;
    }
    if depth != 0 {
        return Err(structure(loops[depth - 1], "LOOP without an END"));
    }
    if let Some(start) = process {
        return Err(structure(start, "PROCESS without a PROCESS_END"));
    }
    // Every declared channel has a sender.
    let unsent = info.channels_defined & !sent;
    if unsent != 0 {
        let c = unsent.trailing_zeros();
        let pc = program
            .iter()
            .position(|p| p.op == OP_CHANNEL && p.imm.get() == c)
            .unwrap_or(0);
        return Err(err(pc, "imm", Problem::NoSender { channel: c }));
    }
    // Every data tensor has a writer: an INPUT, a task of the tasks
    // section, or a call of the program. (Whether that writer ran before
    // the read is known only at run time, and checked then.)
    // One pass over the program for all of them (a pass per data tensor
    // took up to 64 x 2 walks of a longest program).
    let (mut inputs, mut written) = (0u64, 0u64);
    for p in program {
        let bit = || info.data_index(p.imm.get()).map_or(0, |i| 1u64 << i);
        match p.op {
            OP_INPUT => inputs |= bit(),
            OP_ARG if Access::from_bits_truncate(p.r as u32).contains(Access::WRITE) => {
                written |= bit()
            }
            _ => {}
        }
    }
    for i in 0..info.data_count {
        let t = info.data[i];
        if inputs & 1 << i != 0 {
            info.inputs |= 1 << i;
        } else if written & 1 << i == 0 && !task_writes(t) {
            let pc = program
                .iter()
                .position(|p| p.op == OP_LOAD && p.imm.get() == t)
                .unwrap_or(0);
            return Err(err(pc, "imm", Problem::DataNeverWritten { tensor: t }));
        }
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    //! Jump validation against hand-built programs whose outcome is
    //! derived by hand (the pcs in the comments), and against the walk
    //! validation did before it became linear.

    use super::*;
    use wsp_ffi::WspKernelId_WSP_KERNEL_RMSNORM as RMSNORM;
    use zerocopy::little_endian::{U32, U64};

    fn ins(op: u8, r: u8, x: [u8; 6], imm: usize, imm2: usize) -> Instr {
        Instr {
            op,
            r,
            x,
            imm: U32::new(imm as u32),
            imm2: U32::new(imm2 as u32),
        }
    }

    const NONE: [u8; 6] = [NO_REG; 6];
    /// `x` with register 0 first (a condition, a count).
    const R0: [u8; 6] = [0, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];

    /// A step that does nothing to control flow.
    fn nop() -> Instr {
        ins(OP_CONST, 0, NONE, 0, 0)
    }
    fn jump(target: usize) -> Instr {
        ins(OP_JUMP, 0, NONE, target, 0)
    }
    fn when(target: usize) -> Instr {
        ins(OP_WHEN, 0, R0, target, 0)
    }
    /// A parallel loop (variable r1, count r0) whose END is at `end`.
    fn lp(end: usize) -> Instr {
        let x = [0, LOOP_PARALLEL, NO_REG, NO_REG, NO_REG, NO_REG];
        ins(OP_LOOP, 1, x, end, 4)
    }
    fn end(open: usize) -> Instr {
        ins(OP_END, 0, NONE, open, 0)
    }
    fn channel() -> Instr {
        ins(OP_CHANNEL, 0, NONE, 0, 1)
    }
    fn send() -> Instr {
        ins(OP_SEND, 0, NONE, 0, 0)
    }
    /// A consume loop of channel 0 whose END is at `end`.
    fn consume(end: usize) -> Instr {
        ins(OP_CONSUME, NO_REG, NONE, 0, end)
    }
    fn process(end: usize) -> Instr {
        ins(OP_PROCESS, NO_REG, NONE, end, 1)
    }
    fn process_end(open: usize) -> Instr {
        ins(OP_PROCESS_END, 0, NONE, open, 0)
    }
    /// An rmsnorm call: the CALL, 3 ARGs of tensor 0, 1 SCALAR.
    fn call() -> [Instr; 5] {
        let k = wsp_ffi::lookup(RMSNORM).unwrap();
        let arg = |i: usize| ins(OP_ARG, k.tensor_args[i].access as u8, NONE, 0, 0);
        [
            ins(
                OP_CALL,
                0,
                [0, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG],
                RMSNORM as usize,
                0,
            ),
            arg(0),
            arg(1),
            arg(2),
            ins(OP_SCALAR, 0, NONE, 0, 0),
        ]
    }

    fn check(program: &[Instr]) -> Result<(), TableError> {
        let tensor = TensorDesc {
            name: [0; 16],
            dtype: U32::new(wsp_ffi::DTYPE_F32),
            rank: U32::new(2),
            shape: [16, 1024, 0, 0].map(U32::new),
            strides: [1024, 1, 0, 0].map(U32::new),
            arena_offset: U64::new(0),
        };
        validate(program, &[tensor], |id| id == RMSNORM, |_| false).map(|_| ())
    }

    const LEAVES: &str = "jump leaves its loop";
    const ENTERS: &str = "jump enters a loop body";
    const IN_CALL: &str = "jump lands inside a call";

    /// `program` with instruction `pc` replaced by `with`.
    fn with(program: &[Instr], pc: usize, with: Instr) -> Vec<Instr> {
        let mut p = program.to_vec();
        p[pc] = with;
        p
    }

    #[track_caller]
    fn refused(program: &[Instr], pc: usize, why: &'static str) {
        assert_eq!(check(program), Err(structure(pc, why)), "{program:?}");
    }

    #[track_caller]
    fn out_of_range(program: &[Instr], pc: usize, target: usize) {
        let problem = range(target as u64, pc as u64 + 1, program.len() as u64);
        assert_eq!(check(program), Err(err(pc, "imm", problem)));
    }

    #[test]
    fn a_jump_may_land_on_its_loops_end_but_not_past_it() {
        // 0 LOOP -> 3, 1 JUMP, 2 nop, 3 END, 4 nop.
        let p = [lp(3), jump(3), nop(), end(0), nop()];
        assert_eq!(check(&p), Ok(()));
        assert_eq!(check(&with(&p, 1, when(2))), Ok(()));
        refused(&with(&p, 1, jump(4)), 1, LEAVES);
        refused(&with(&p, 1, when(5)), 1, LEAVES);
        // At the top level the body is the program: its end (5) is fine,
        // past it, onto itself or backwards is an operand out of range.
        let top = [jump(5), lp(3), nop(), end(1), nop()];
        assert_eq!(check(&top), Ok(()));
        out_of_range(&with(&top, 0, jump(6)), 0, 6);
        out_of_range(&with(&p, 1, jump(1)), 1, 1);
        out_of_range(&with(&p, 1, when(0)), 1, 0);
    }

    #[test]
    fn a_jump_may_land_on_a_nested_opener_or_past_its_end_but_not_in_its_body() {
        // 0 LOOP -> 7, 1 JUMP, 2 LOOP -> 5, 3 nop, 4 nop, 5 END(2), 6 nop,
        // 7 END(0).
        let p = [lp(7), jump(2), lp(5), nop(), nop(), end(2), nop(), end(0)];
        // Onto the nested opener, over the whole nested loop, onto the
        // outer END.
        for target in [2, 6, 7] {
            assert_eq!(check(&with(&p, 1, jump(target))), Ok(()), "{target}");
            assert_eq!(check(&with(&p, 1, when(target))), Ok(()), "{target}");
        }
        // The nested body's first instruction, its middle, its END.
        for target in [3, 4, 5] {
            refused(&with(&p, 1, jump(target)), 1, ENTERS);
            refused(&with(&p, 1, when(target)), 1, ENTERS);
        }
        refused(&with(&p, 1, jump(8)), 1, LEAVES);
        // From the top level, into a loop: 0 JUMP, 1 LOOP -> 3, 2 nop,
        // 3 END(1), 4 nop.
        let top = [jump(1), lp(3), nop(), end(1), nop()];
        for target in [1, 4, 5] {
            assert_eq!(check(&with(&top, 0, jump(target))), Ok(()), "{target}");
        }
        refused(&with(&top, 0, jump(2)), 0, ENTERS);
        refused(&with(&top, 0, jump(3)), 0, ENTERS);
    }

    #[test]
    fn a_jump_from_a_nested_body_may_not_leave_it() {
        // 0 LOOP -> 6, 1 LOOP -> 4, 2 JUMP, 3 nop, 4 END(1), 5 nop, 6 END(0).
        let p = [lp(6), lp(4), jump(4), nop(), end(1), nop(), end(0)];
        assert_eq!(check(&p), Ok(()));
        refused(&with(&p, 2, jump(5)), 2, LEAVES);
        refused(&with(&p, 2, when(6)), 2, LEAVES);
        refused(&with(&p, 2, jump(7)), 2, LEAVES);
    }

    #[test]
    fn a_jump_may_not_land_on_a_calls_operands() {
        // 0 JUMP, 1 CALL, 2..4 ARG, 5 SCALAR, 6 nop.
        let mut p = vec![jump(1)];
        p.extend(call());
        p.push(nop());
        assert_eq!(check(&p), Ok(()));
        assert_eq!(check(&with(&p, 0, jump(6))), Ok(()));
        for target in 2..=5 {
            refused(&with(&p, 0, jump(target)), 0, IN_CALL);
        }
        // Into a call in a nested loop: entering the loop is what is said
        // (as before). 0 JUMP, 1 LOOP -> 7, 2 CALL, 3..5 ARG, 6 SCALAR,
        // 7 END(1).
        let mut p = vec![jump(1), lp(7)];
        p.extend(call());
        p.push(end(1));
        assert_eq!(check(&p), Ok(()));
        refused(&with(&p, 0, jump(3)), 0, ENTERS);
        refused(&with(&p, 0, when(6)), 0, ENTERS);
    }

    /// 0 CHANNEL, 1 PROCESS -> 5, 2 SEND, 3 JUMP, 4 nop, 5 PROCESS_END(1),
    /// 6 CONSUME -> 9, 7 WHEN, 8 nop, 9 END(6), 10 nop.
    fn csp() -> Vec<Instr> {
        let p = [
            channel(),
            process(5),
            send(),
            jump(5),
            nop(),
            process_end(1),
            consume(9),
            when(9),
            nop(),
            end(6),
            nop(),
        ];
        p.to_vec()
    }

    #[test]
    fn jumps_stay_in_process_and_consume_bodies() {
        let p = csp();
        assert_eq!(check(&p), Ok(()));
        assert_eq!(check(&with(&p, 3, jump(4))), Ok(()));
        refused(&with(&p, 3, jump(6)), 3, LEAVES);
        refused(&with(&p, 3, jump(11)), 3, LEAVES);
        assert_eq!(check(&with(&p, 7, when(8))), Ok(()));
        refused(&with(&p, 7, when(10)), 7, LEAVES);
        // From the top level: onto the PROCESS or the CONSUME, over them,
        // not into either body (nor onto its end). 0 CHANNEL, 1 JUMP,
        // 2 PROCESS -> 4, 3 SEND, 4 PROCESS_END(2), 5 CONSUME -> 7, 6 nop,
        // 7 END(5), 8 nop.
        let top = [
            channel(),
            jump(2),
            process(4),
            send(),
            process_end(2),
            consume(7),
            nop(),
            end(5),
            nop(),
        ];
        for target in [2, 5, 8, 9] {
            assert_eq!(check(&with(&top, 1, jump(target))), Ok(()), "{target}");
        }
        for target in [3, 4, 6, 7] {
            refused(&with(&top, 1, jump(target)), 1, ENTERS);
        }
    }

    #[test]
    fn the_first_jump_into_a_body_is_named() {
        // 0 JUMP 2 (fine), 1 WHEN 4 and 2 JUMP 5 (both into the body),
        // 3 LOOP -> 6, 4 nop, 5 nop, 6 END(3).
        let p = [jump(2), when(4), jump(5), lp(6), nop(), nop(), end(3)];
        refused(&p, 1, ENTERS);
    }

    #[test]
    fn a_process_ends_where_its_process_says() {
        // 0 CHANNEL, 1 PROCESS -> 6, 2 SEND, 3 PROCESS_END(1), 4 PROCESS -> 6,
        // 5 SEND, 6 PROCESS_END(4): the PROCESS_END at 3 names the first
        // PROCESS, which says its body ends at 6. (Accepted once; the
        // program's context would have skipped the second PROCESS, and a
        // jump in the body checked against one end would have run to the
        // other.)
        let p = [
            channel(),
            process(6),
            send(),
            process_end(1),
            process(6),
            send(),
            process_end(4),
        ];
        refused(&p, 3, "PROCESS_END does not match its PROCESS");
        let fixed = with(&p, 1, process(3));
        assert_eq!(check(&fixed), Ok(()));
    }

    /// How jumps were checked before validation became linear: a walk from
    /// the jump to its target, counting loop and process openers and ends.
    fn walk(program: &[Instr], pc: usize, target: usize) -> Result<(), TableError> {
        if target <= pc || target > program.len() {
            let problem = range(target as u64, pc as u64 + 1, program.len() as u64);
            return Err(err(pc, "imm", problem));
        }
        let mut depth = 0usize;
        for ins in &program[pc + 1..target] {
            match ins.op {
                OP_LOOP | OP_CONSUME | OP_PROCESS => depth += 1,
                OP_END | OP_PROCESS_END if depth == 0 => {
                    return Err(structure(pc, LEAVES));
                }
                OP_END | OP_PROCESS_END => depth -= 1,
                _ => {}
            }
        }
        if depth != 0 {
            return Err(structure(pc, ENTERS));
        }
        if let Some(ins) = program.get(target) {
            if ins.op == OP_ARG || ins.op == OP_SCALAR {
                return Err(structure(pc, IN_CALL));
            }
        }
        Ok(())
    }

    #[test]
    fn every_single_jump_is_judged_as_the_walk_judged_it() {
        // A program of every kind of body, nested, with a call; each `nop`
        // in turn becomes a JUMP or WHEN to each target (and past the end).
        let mut p = vec![
            channel(),      // 0
            nop(),          // 1
            process(10),    // 2
            send(),         // 3
            nop(),          // 4
            lp(8),          // 5
            nop(),          // 6
            nop(),          // 7
            end(5),         // 8
            nop(),          // 9
            process_end(2), // 10
            nop(),          // 11
            lp(23),         // 12
            nop(),          // 13
            lp(21),         // 14
            nop(),          // 15
        ];
        p.extend(call()); // 16 .. 20
        p.extend([
            end(14),     // 21
            nop(),       // 22
            end(12),     // 23
            consume(27), // 24
            nop(),       // 25
            nop(),       // 26
            end(24),     // 27
            nop(),       // 28
        ]);
        assert_eq!(check(&p), Ok(()));
        let sites: Vec<usize> = (0..p.len()).filter(|&pc| p[pc].op == OP_CONST).collect();
        assert_eq!(sites.len(), 12);
        let mut seen = std::collections::BTreeMap::new();
        for &pc in &sites {
            for target in 0..=p.len() + 1 {
                for j in [jump(target), when(target)] {
                    let q = with(&p, pc, j);
                    let expected = walk(&q, pc, target);
                    assert_eq!(check(&q), expected, "pc {pc} -> {target}");
                    let outcome = match expected {
                        Ok(()) => "ok",
                        Err(e) => match e.problem {
                            Problem::Structure { why } => why,
                            _ => "out of range",
                        },
                    };
                    *seen.entry(outcome).or_insert(0) += 1;
                }
            }
        }
        // Every outcome occurs.
        let outcomes: Vec<_> = seen.keys().copied().collect();
        let mut all = ["ok", "out of range", LEAVES, ENTERS, IN_CALL];
        all.sort();
        assert_eq!(outcomes, all, "{seen:?}");
    }

    // The programs below took the walk above about MAX_PROGRAM^2 / 2 steps
    // (each jump walked to its target): over ten seconds for the first in
    // a debug build, measured. Validation is linear now; no time is
    // asserted, the suite's time shows it.

    #[test]
    fn a_longest_program_of_jumps_to_its_last_instruction_validates() {
        let last = MAX_PROGRAM - 1;
        let mut p = vec![jump(last); last];
        p.push(nop());
        assert_eq!(p.len(), MAX_PROGRAM);
        assert_eq!(check(&p), Ok(()));
        // One more instruction is too long.
        p.push(nop());
        let problem = range(MAX_PROGRAM as u64 + 1, 0, MAX_PROGRAM as u64);
        let too_long = TableError::new(Section::Header, 0, "program", problem);
        assert_eq!(check(&p), Err(too_long));
    }

    #[test]
    fn a_longest_program_of_jumps_over_deep_loop_nests_validates() {
        // Half the program: WHENs to its end, over everything after them.
        // Then nests of MAX_LOOP_DEPTH loops, each loop's first
        // instruction a WHEN to its own END, over the loops nested in it.
        let mut p = vec![when(MAX_PROGRAM); MAX_PROGRAM / 2];
        const NEST: usize = 3 * MAX_LOOP_DEPTH;
        while p.len() + NEST <= MAX_PROGRAM {
            let at = p.len();
            // Loop k opens at `at + 2k`; its END is at `at + NEST - 1 - k`.
            for k in 0..MAX_LOOP_DEPTH {
                p.push(lp(at + NEST - 1 - k));
                p.push(when(at + NEST - 1 - k));
            }
            for k in (0..MAX_LOOP_DEPTH).rev() {
                p.push(end(at + 2 * k));
            }
        }
        p.resize(MAX_PROGRAM, nop());
        assert_eq!(check(&p), Ok(()));
        // One jump into the last nest's innermost body, from the first
        // nest's outermost loop... leaves that loop first; from the top
        // level it enters: the first WHEN is the one named.
        let last_nest = MAX_PROGRAM / 2 + (MAX_PROGRAM / 2 / NEST - 1) * NEST;
        let inner = last_nest + 2 * MAX_LOOP_DEPTH - 1;
        refused(
            &with(&p, MAX_PROGRAM / 2 + 1, when(inner)),
            MAX_PROGRAM / 2 + 1,
            LEAVES,
        );
        let mut q = with(&p, 0, when(inner));
        q[5] = when(inner);
        refused(&q, 0, ENTERS);
    }
}
