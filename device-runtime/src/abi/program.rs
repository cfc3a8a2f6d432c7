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
//! has completed. A parallel loop's iterations are independent except for
//! the dependencies their tasks' regions imply.
//!
//! A `LOAD` reads data the device computed (the CSR arrays of an MoE router,
//! sequence lengths): expansion waits until the tasks that write the element
//! have completed, and refuses to read a tensor that is neither an `INPUT`
//! nor written by an earlier task.

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
/// each, whether a task has written it yet).
pub const MAX_DATA_TENSORS: usize = 8;
/// Longest program in instructions (64 KiB): validation follows every jump,
/// which costs up to the jump's length.
pub const MAX_PROGRAM: usize = 4096;

/// Tasksets of a program, numbered `0 .. MAX_TASKSETS` (0: the run's
/// policy). The dispatcher keeps one policy per taskset.
pub const MAX_TASKSETS: usize = 8;

/// The i32 element type: the only one `LOAD` reads.
pub const DTYPE_I32: u32 = wsp_ffi::DTYPE_I32;

/// What validation learned about a program that the expander needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgramInfo {
    /// The tensors `LOAD` reads, `data[..data_count]` ([`ProgramInfo::data`]).
    /// A fixed array and a count, not a `heapless::Vec`, so that the info
    /// (and the `Table` that holds it) stays `Copy`; private, so that the
    /// two cannot disagree.
    data: [u32; MAX_DATA_TENSORS],
    data_count: usize,
    /// Bit `i`: `data[i]` is an `INPUT`.
    pub inputs: u8,
    /// One more than the highest symbol the program reads (0 if none).
    pub symbols: usize,
    /// The schedule of each taskset ([`Schedule::encode`](super::schedule::Schedule::encode)),
    /// where bit `t` of `tasksets_defined` is set (taskset 0: the run's).
    pub tasksets: [u32; MAX_TASKSETS],
    /// Bit `t`: the program defines taskset `t`.
    pub tasksets_defined: u8,
    /// The program's task window (`WINDOW`), or 0 for the runtime's.
    pub window: u32,
}

impl ProgramInfo {
    /// The tensors `LOAD` reads, in the order of their first `LOAD`.
    #[inline]
    pub fn data(&self) -> &[u32] {
        &self.data[..self.data_count]
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
            OP_LOOP => depth += 1,
            OP_END if depth == 0 => return Err(structure(pc, "jump leaves its loop")),
            OP_END => depth -= 1,
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
                        let problem =
                            range(MAX_DATA_TENSORS as u64 + 1, 0, MAX_DATA_TENSORS as u64);
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
            OP_LOOP => {
                reg(pc, "r", ins.r, false)?;
                reg(pc, "x[0]", ins.x[0], false)?;
                if ins.x[1] != LOOP_PARALLEL && ins.x[1] != LOOP_SEQUENTIAL {
                    return Err(err(pc, "x[1]", range(ins.x[1] as u64, 0, 1)));
                }
                unused(pc, ins, 2)?;
                if depth == MAX_LOOP_DEPTH {
                    return Err(structure(pc, "loops nested deeper than MAX_LOOP_DEPTH"));
                }
                let end = ins.imm.get() as usize;
                if end <= pc || program.get(end).is_none_or(|e| e.op != OP_END) {
                    return Err(structure(pc, "LOOP does not name its END"));
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
                if ins.imm.get() as usize != start || program[start].imm.get() as usize != pc {
                    return Err(structure(pc, "END does not match the innermost LOOP"));
                }
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
                let valid = if set == 0 {
                    bits == 0
                } else {
                    super::schedule::Schedule::decode(bits).is_some()
                };
                if !valid {
                    return Err(err(pc, "imm2", Problem::BadSchedule { bits }));
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
            op => return Err(err(pc, "op", Problem::BadOpcode { op })),
        }
        pc += 1;
    }
    if depth != 0 {
        return Err(structure(loops[depth - 1], "LOOP without an END"));
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
