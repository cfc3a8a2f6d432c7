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

/// Longest program in instructions (64 KiB): validation follows every jump,
/// which costs up to the jump's length.
pub const MAX_PROGRAM: usize = 4096;

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

/// Checks that a forward jump from `pc` to `target` stays in its loop body:
/// it neither leaves the innermost loop around `pc` (it may land on that
/// loop's `END`) nor enters a nested loop's body, and lands on an
/// instruction that starts a step (not an `ARG` or `SCALAR`).
fn check_jump(program: &[Instr], pc: usize, target: usize) -> Result<(), TableError> {
    let bad = || {
        err(
            pc,
            "imm",
            range(target as u64, pc as u64 + 1, program.len() as u64),
        )
    };
    if target <= pc || target > program.len() {
        return Err(bad());
    }
    let mut depth = 0usize;
    for ins in &program[pc + 1..target] {
        match ins.op {
            OP_LOOP | OP_CONSUME | OP_PROCESS => depth += 1,
            OP_END | OP_PROCESS_END if depth == 0 => {
                return Err(structure(pc, "jump leaves its loop"))
            }
            OP_END | OP_PROCESS_END => depth -= 1,
            _ => {}
        }
    }
    if depth != 0 {
        return Err(structure(pc, "jump enters a loop body"));
    }
    if let Some(ins) = program.get(target) {
        if ins.op == OP_ARG || ins.op == OP_SCALAR {
            return Err(structure(pc, "jump lands inside a call"));
        }
    }
    Ok(())
}

/// Validates `program` against the table's tensors and declared kernels
/// (`declared(id)`), and the tensors the tasks section writes
/// (`task_writes(tensor)`).
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
                let end = if ins.op == OP_LOOP {
                    ins.imm.get()
                } else {
                    ins.imm2.get()
                } as usize;
                if end <= pc || program.get(end).is_none_or(|e| e.op != OP_END) {
                    let why = if ins.op == OP_LOOP {
                        "LOOP does not name its END"
                    } else {
                        "CONSUME does not name its END"
                    };
                    return Err(structure(pc, why));
                }
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
                let opened = &program[start];
                let names = if opened.op == OP_LOOP {
                    opened.imm.get()
                } else {
                    opened.imm2.get()
                };
                if ins.imm.get() as usize != start || names as usize != pc {
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
                process = Some(pc);
            }
            OP_PROCESS_END => {
                unused(pc, ins, 0)?;
                match process {
                    Some(start) if depth == 0 && ins.imm.get() as usize == start => {}
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
                check_jump(program, pc, ins.imm.get() as usize)?;
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
    for i in 0..info.data_count {
        let t = info.data[i];
        let input = program.iter().any(|p| p.op == OP_INPUT && p.imm.get() == t);
        let written = program.iter().any(|p| {
            p.op == OP_ARG
                && p.imm.get() == t
                && Access::from_bits_truncate(p.r as u32).contains(Access::WRITE)
        });
        if input {
            info.inputs |= 1 << i;
        } else if !written && !task_writes(t) {
            let pc = program
                .iter()
                .position(|p| p.op == OP_LOAD && p.imm.get() == t)
                .unwrap_or(0);
            return Err(err(pc, "imm", Problem::DataNeverWritten { tensor: t }));
        }
    }
    Ok(info)
}
