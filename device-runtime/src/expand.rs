//! On-device expansion: turns a table's tasks section and workload program
//! ([`crate::abi::program`]) into tasks, one at a time, as the dispatcher
//! asks for them. Expansion is paced by submission: the dispatcher asks for
//! the next task only after the last one was submitted, so a full task
//! window holds expansion back (backpressure), and a `LOAD` of data that a
//! running task writes, or the next iteration of a sequential loop, makes
//! expansion wait ([`Step::Wait`]) while the tasks already submitted run.
//!
//! Every step does a bounded amount of work ([`STEP_BUDGET`] instructions),
//! so a program with long loops of no calls never holds the dispatcher.

use core::fmt;

use heapless::Vec;
use wsp_ffi::{ShapeError, TileShape, WspKernelArgs, WspTensorView};

use crate::abi::program::*;
use crate::abi::{
    check_region, dtype_size, Access, Instr, Problem, Region, Table, TensorDesc, TileView,
    MAX_RANK, MAX_SCALARS, MAX_TENSOR_ARGS,
};
use crate::orch::{KernelRef, TaskArg, TaskId};

/// Instructions one [`Expander::step`] runs at most before it yields.
pub const STEP_BUDGET: usize = 1024;

/// One task to submit: a kernel call on tensor regions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskSpec {
    /// The kernel it calls.
    pub kernel: KernelRef,
    /// 1 ..= [`MAX_STREAMS`](crate::abi::MAX_STREAMS), or 0 for none.
    pub stream: u32,
    /// Its tensor arguments, as many as its kernel takes.
    pub args: Vec<TaskArg, MAX_TENSOR_ARGS>,
    /// Its scalars, as many as its kernel takes.
    pub scalars: Vec<u64, MAX_SCALARS>,
    /// The indices of the loops around the call, outermost first (none
    /// for tasks of the tasks section).
    pub loops: Vec<u32, MAX_LOOP_DEPTH>,
    /// The pc of the program's call, or `None` for a task of the tasks section.
    pub pc: Option<u32>,
    /// Its taskset (`0 .. MAX_TASKSETS`; 0 for tasks of the tasks section
    /// and calls before the program's first `DISPATCH`).
    pub taskset: u8,
}

/// An unused entry of an argument block.
pub const NO_VIEW: WspTensorView = WspTensorView {
    addr: 0,
    rows: 0,
    cols: 0,
    row_stride: 0,
    dtype: 0,
};

const NO_ARG: TaskArg = TaskArg {
    tensor: 0,
    region: Region {
        offset: [0; MAX_RANK],
        extent: [1; MAX_RANK],
    },
    access: Access::READ,
};

impl TaskSpec {
    /// Task `index` of the table's tasks section.
    pub fn of_task(table: &Table<'_>, index: usize) -> TaskSpec {
        let desc = &table.tasks()[index];
        let id = desc.kernel_id.get();
        let kind = wsp_ffi::lookup(id).map_or(wsp_ffi::CoreKind::Vector, |k| k.kind);
        // Validation bounds both counts by the capacities (`MAX_SCALARS`,
        // `MAX_TENSOR_ARGS`), so nothing is cut off.
        let mut spec = TaskSpec {
            kernel: KernelRef { id, kind },
            stream: desc.stream.get(),
            args: Vec::new(),
            scalars: Vec::from_array(desc.scalars.map(|s| s.get())),
            loops: Vec::new(),
            pc: None,
            taskset: 0,
        };
        spec.scalars.truncate(desc.num_scalars.get() as usize);
        for t in table.task_args(desc) {
            let arg = TaskArg {
                tensor: t.tensor.get(),
                region: Region::of(t),
                access: Access::from_bits_truncate(t.access.get()),
            };
            if spec.args.push(arg).is_err() {
                unreachable!("validation refuses tasks with more than MAX_TENSOR_ARGS");
            }
        }
        spec
    }

    /// Its tensor arguments.
    pub fn args(&self) -> &[TaskArg] {
        &self.args
    }

    /// Its scalars.
    pub fn scalars(&self) -> &[u64] {
        &self.scalars
    }

    /// The argument block a core gets, with tensor addresses relative to
    /// `arena_base` (the data arena's address, or 0 for offsets).
    pub fn kernel_args(&self, table: &Table<'_>, arena_base: u64) -> WspKernelArgs {
        let mut args = WspKernelArgs {
            num_tensors: self.args.len() as u32,
            num_scalars: self.scalars.len() as u32,
            tensors: [NO_VIEW; MAX_TENSOR_ARGS],
            scalars: [0; MAX_SCALARS],
        };
        args.scalars[..self.scalars.len()].copy_from_slice(self.scalars());
        for (view, arg) in args.tensors.iter_mut().zip(self.args()) {
            *view = tensor_view(
                &table.tensors()[arg.tensor as usize],
                &arg.region,
                arena_base,
            );
        }
        args
    }
}

/// The view a core gets of `region` of `tensor`, with its address relative
/// to `arena_base` (the data arena's address, or 0 for offsets).
#[inline]
pub fn tensor_view(tensor: &TensorDesc, region: &Region, arena_base: u64) -> WspTensorView {
    let dtype = tensor.dtype.get();
    let tile = TileView::of(tensor, region);
    let elem = dtype_size(dtype).unwrap_or(0);
    WspTensorView {
        addr: arena_base + tensor.arena_offset.get() + tile.first_element * elem,
        rows: tile.rows,
        cols: tile.cols,
        row_stride: tile.row_stride,
        dtype,
    }
}

/// Why expansion stopped a run. Each names the program's pc in
/// [`RunError::Expand`](crate::sched::RunError::Expand).
#[allow(missing_docs)] // Variant fields: see each variant's doc; their names say the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpandError {
    /// The program reads a symbol the launch did not bind.
    UnboundSymbol { symbol: u32, bound: usize },
    /// An arithmetic result does not fit in 64 bits.
    Overflow,
    /// A `DIV` or `REM` by 0.
    DivideByZero,
    /// A loop count below 0 or above the loop's stated maximum.
    BadCount { count: i64, max: u32 },
    /// A `LOAD` index outside the tensor.
    IndexOutside { dim: u32, index: i64, size: u32 },
    /// A `LOAD` from a tensor that is not an input and that no task has
    /// written yet: its data does not exist.
    ReadBeforeWrite { tensor: u32 },
    /// An offset or extent register holds a value outside `0 ..= u32::MAX`.
    BadOperand { arg: u32, value: i64 },
    /// Argument `arg`'s region is not a tile inside its tensor.
    BadRegion {
        arg: u32,
        field: &'static str,
        problem: Problem,
    },
    /// The call's arguments break its kernel's contract.
    Contract(ShapeError),
    /// A call's stream register holds no stream (0 ..= 8).
    BadStream { value: i64 },
}

impl fmt::Display for ExpandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ExpandError::UnboundSymbol { symbol, bound } => write!(
                f,
                "symbol {symbol} is not bound (the launch binds {bound} symbols)"
            ),
            ExpandError::Overflow => f.write_str("arithmetic overflow"),
            ExpandError::DivideByZero => f.write_str("division by zero"),
            ExpandError::BadCount { count, max } => {
                write!(f, "loop count {count} outside [0, {max}]")
            }
            ExpandError::IndexOutside { dim, index, size } => write!(
                f,
                "load index {index} in dimension {dim} outside the tensor's size {size}"
            ),
            ExpandError::ReadBeforeWrite { tensor } => write!(
                f,
                "loads from tensor {tensor} before any task wrote it (and it is not an INPUT)"
            ),
            ExpandError::BadOperand { arg, value } => write!(
                f,
                "argument {arg}: offset or extent {value} outside [0, {}]",
                u32::MAX
            ),
            ExpandError::BadRegion {
                arg,
                field,
                problem,
            } => write!(f, "argument {arg}, {field}: {problem}"),
            ExpandError::Contract(e) => write!(f, "kernel contract: {e}"),
            ExpandError::BadStream { value } => write!(
                f,
                "stream {value}; streams are 1 to {} (0 for none)",
                crate::abi::MAX_STREAMS
            ),
        }
    }
}

/// What expansion needs from the run: symbols, the orchestrator's view of
/// running tasks, and the data arena.
pub trait Context {
    /// Symbol `index`, if the launch binds it.
    fn symbol(&self, index: usize) -> Option<i64>;
    /// The number the next submitted task gets (tasks of the tasks section
    /// and of the program, from 0).
    fn next_task(&self) -> u64;
    /// A task, submitted and not completed, that writes `region` of `tensor`.
    fn pending_writer(&mut self, tensor: u32, region: &Region) -> Option<TaskId>;
    /// Whether every task numbered `first` or later has completed.
    fn completed_since(&self, first: u64) -> bool;
    /// The i32 at element `element` of `tensor` (validated to lie inside it),
    /// which no task writes now.
    fn read_i32(&mut self, tensor: &TensorDesc, element: u64) -> i32;
}

/// What expansion is waiting for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// A `LOAD` of data that `task` writes.
    Data {
        /// The tensor read.
        tensor: u32,
        /// The task that writes the element.
        task: TaskId,
    },
    /// The end of a sequential loop's iteration.
    Iteration,
}

/// The result of one [`Expander::step`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Submit this task (before stepping again).
    Task(TaskSpec),
    /// Apply an event record (`record`) or wait on a stream.
    Event {
        /// A record (`true`) or a wait.
        record: bool,
        /// The stream.
        stream: u32,
        /// The event.
        event: u32,
    },
    /// Nothing to do until more tasks complete.
    Wait(Wait),
    /// The step budget ran out; step again.
    Yield,
    /// The program has ended.
    Done,
}

#[derive(Clone, Copy, Debug, Default)]
struct Frame {
    /// pc of the LOOP.
    pc: u32,
    count: i64,
    index: i64,
    sequential: bool,
    /// Number of the first task of the current iteration.
    first: u64,
}

/// The program machine of one run.
#[derive(Clone, Debug)]
pub struct Expander {
    pc: usize,
    regs: [i64; MAX_REGS],
    frames: [Frame; MAX_LOOP_DEPTH],
    depth: usize,
    /// Bit `i`: data tensor `i` ([`ProgramInfo::data`]) has been written by
    /// a submitted task.
    written: u8,
    /// The taskset of the next call (the last `DISPATCH`).
    taskset: u8,
}

impl Expander {
    /// A machine at the start of `table`'s program; the data tensors that
    /// the tasks section writes count as written.
    pub fn new(table: &Table<'_>) -> Self {
        let info = table.program_info();
        let mut written = 0u8;
        for task in table.tasks() {
            for a in table.task_args(task) {
                if Access::from_bits_truncate(a.access.get()).contains(Access::WRITE) {
                    if let Some(i) = info.data_index(a.tensor.get()) {
                        written |= 1 << i;
                    }
                }
            }
        }
        Expander {
            pc: 0,
            regs: [0; MAX_REGS],
            frames: [Frame::default(); MAX_LOOP_DEPTH],
            depth: 0,
            written,
            taskset: 0,
        }
    }

    /// The pc of the next instruction.
    pub fn pc(&self) -> u32 {
        self.pc as u32
    }

    fn read(&self, r: u8) -> i64 {
        self.regs.get(r as usize).copied().unwrap_or(0)
    }

    /// Runs instructions until a task, an event op, a wait, the end of the
    /// program, or [`STEP_BUDGET`] instructions. A step that waits changes
    /// nothing: stepping again retries the same instruction.
    pub fn step(&mut self, table: &Table<'_>, cx: &mut impl Context) -> Result<Step, ExpandError> {
        let program = table.program();
        for _ in 0..STEP_BUDGET {
            let Some(ins) = program.get(self.pc) else {
                return Ok(Step::Done);
            };
            let (a, b) = (self.read(ins.x[0]), self.read(ins.x[1]));
            let r = ins.r as usize;
            match ins.op {
                OP_CONST => {
                    self.regs[r] = (ins.imm.get() as u64 | (ins.imm2.get() as u64) << 32) as i64;
                }
                OP_SYMBOL => {
                    let symbol = ins.imm.get();
                    self.regs[r] =
                        cx.symbol(symbol as usize)
                            .ok_or(ExpandError::UnboundSymbol {
                                symbol,
                                bound: (0..MAX_SYMBOLS)
                                    .take_while(|&i| cx.symbol(i).is_some())
                                    .count(),
                            })?;
                }
                OP_LOAD => match self.load(table, ins, cx)? {
                    Ok(value) => self.regs[r] = value as i64,
                    Err(wait) => return Ok(Step::Wait(wait)),
                },
                OP_ADD..=OP_EQ => self.regs[r] = arith(ins.op, a, b)?,
                OP_LOOP => {
                    let max = ins.imm2.get();
                    if a < 0 || a > max as i64 {
                        return Err(ExpandError::BadCount { count: a, max });
                    }
                    if a == 0 {
                        self.pc = ins.imm.get() as usize + 1;
                        continue;
                    }
                    self.frames[self.depth] = Frame {
                        pc: self.pc as u32,
                        count: a,
                        index: 0,
                        sequential: ins.x[1] == LOOP_SEQUENTIAL,
                        first: cx.next_task(),
                    };
                    self.depth += 1;
                    self.regs[r] = 0;
                }
                OP_END => {
                    let frame = self.frames[self.depth - 1];
                    if frame.index + 1 < frame.count {
                        if frame.sequential && !cx.completed_since(frame.first) {
                            return Ok(Step::Wait(Wait::Iteration));
                        }
                        let frame = &mut self.frames[self.depth - 1];
                        frame.index += 1;
                        frame.first = cx.next_task();
                        self.regs[program[frame.pc as usize].r as usize] = frame.index;
                        self.pc = frame.pc as usize + 1;
                        continue;
                    }
                    self.depth -= 1;
                }
                OP_WHEN if a == 0 => {
                    self.pc = ins.imm.get() as usize;
                    continue;
                }
                OP_WHEN => {}
                OP_JUMP => {
                    self.pc = ins.imm.get() as usize;
                    continue;
                }
                OP_CALL => {
                    let (spec, end) = self.call(table, ins)?;
                    self.pc = end;
                    return Ok(Step::Task(spec));
                }
                OP_RECORD | OP_WAIT => {
                    self.pc += 1;
                    return Ok(Step::Event {
                        record: ins.op == OP_RECORD,
                        stream: ins.x[0] as u32,
                        event: ins.x[1] as u32,
                    });
                }
                OP_DISPATCH => self.taskset = ins.imm.get() as u8,
                // OP_INPUT and OP_WINDOW: declarations, used by validation
                // and at launch.
                _ => {}
            }
            self.pc += 1;
        }
        Ok(Step::Yield)
    }

    /// The element a `LOAD` reads, or what it must wait for.
    fn load(
        &self,
        table: &Table<'_>,
        ins: &Instr,
        cx: &mut impl Context,
    ) -> Result<Result<i32, Wait>, ExpandError> {
        let t = ins.imm.get();
        let tensor = &table.tensors()[t as usize];
        let info = table.program_info();
        let data = info
            .data_index(t)
            .expect("validation lists every loaded tensor");
        if (self.written | info.inputs) & (1 << data) == 0 {
            return Err(ExpandError::ReadBeforeWrite { tensor: t });
        }
        let rank = tensor.rank.get() as usize;
        let mut region = Region {
            offset: [0; MAX_RANK],
            extent: [1; MAX_RANK],
        };
        let mut element = 0u64;
        for d in 0..rank {
            let index = self.read(ins.x[d]);
            let size = tensor.shape[d].get();
            if index < 0 || index >= size as i64 {
                return Err(ExpandError::IndexOutside {
                    dim: d as u32,
                    index,
                    size,
                });
            }
            region.offset[d] = index as u32;
            element += index as u64 * tensor.strides[d].get() as u64;
        }
        if let Some(task) = cx.pending_writer(t, &region) {
            return Ok(Err(Wait::Data { tensor: t, task }));
        }
        Ok(Ok(cx.read_i32(tensor, element)))
    }

    /// The task of the `CALL` at the pc, and the pc after its operands.
    fn call(&mut self, table: &Table<'_>, ins: &Instr) -> Result<(TaskSpec, usize), ExpandError> {
        let id = ins.imm.get();
        let kernel = wsp_ffi::lookup(id).expect("validation checks every call's kernel");
        let mut spec = TaskSpec {
            kernel: KernelRef {
                id,
                kind: kernel.kind,
            },
            stream: match ins.x[1] {
                NO_REG => ins.x[0] as u32,
                r => {
                    let value = self.read(r);
                    match u32::try_from(value) {
                        Ok(s) if s as usize <= crate::abi::MAX_STREAMS => s,
                        _ => return Err(ExpandError::BadStream { value }),
                    }
                }
            },
            args: Vec::new(),
            scalars: Vec::new(),
            // At most `MAX_LOOP_DEPTH` frames are open (validation).
            loops: self.frames[..self.depth]
                .iter()
                .map(|f| f.index as u32)
                .collect(),
            pc: Some(self.pc as u32),
            taskset: self.taskset,
        };
        let (num_args, num_scalars) = (kernel.num_tensors as usize, kernel.num_scalars as usize);
        let program = table.program();
        let mut shapes = [TileShape {
            rows: 0,
            cols: 0,
            dtype: 0,
        }; MAX_TENSOR_ARGS];
        let first = self.pc + 1;
        let info = table.program_info();
        for k in 0..num_args {
            let arg = &program[first + k];
            let t = arg.imm.get();
            let tensor = &table.tensors()[t as usize];
            let rank = tensor.rank.get() as usize;
            let mut region = NO_ARG.region;
            let operand = |r: u8, none: i64| {
                let value = if r == NO_REG { none } else { self.read(r) };
                u32::try_from(value).map_err(|_| ExpandError::BadOperand {
                    arg: k as u32,
                    value,
                })
            };
            for d in 0..rank {
                region.offset[d] = operand(arg.x[d], 0)?;
            }
            region.extent[rank - 1] = operand(arg.x[5], 1)?;
            if rank >= 2 {
                region.extent[rank - 2] = operand(arg.x[4], 1)?;
            }
            shapes[k] = check_region(tensor, &region).map_err(|(field, problem)| {
                ExpandError::BadRegion {
                    arg: k as u32,
                    field,
                    problem,
                }
            })?;
            let access = Access::from_bits_truncate(arg.r as u32);
            if access.contains(Access::WRITE) {
                if let Some(i) = info.data_index(t) {
                    self.written |= 1 << i;
                }
            }
            let arg = TaskArg {
                tensor: t,
                region,
                access,
            };
            // A kernel takes at most `MAX_TENSOR_ARGS` tensors and
            // `MAX_SCALARS` scalars (the kernel ABI's capacities).
            if spec.args.push(arg).is_err() {
                unreachable!("a kernel with more than MAX_TENSOR_ARGS tensors");
            }
        }
        let scalars_at = first + num_args;
        for s in 0..num_scalars {
            let value = self.read(program[scalars_at + s].x[0]) as u64;
            if spec.scalars.push(value).is_err() {
                unreachable!("a kernel with more than MAX_SCALARS scalars");
            }
        }
        kernel
            .check(&shapes[..num_args], spec.scalars())
            .map_err(ExpandError::Contract)?;
        Ok((spec, scalars_at + num_scalars))
    }
}

fn arith(op: u8, a: i64, b: i64) -> Result<i64, ExpandError> {
    let divisor = |b: i64| {
        if b == 0 {
            Err(ExpandError::DivideByZero)
        } else {
            Ok(b)
        }
    };
    let value = match op {
        OP_ADD => a.checked_add(b),
        OP_SUB => a.checked_sub(b),
        OP_MUL => a.checked_mul(b),
        OP_DIV => a.checked_div_euclid(divisor(b)?),
        OP_REM => a.checked_rem_euclid(divisor(b)?),
        OP_MIN => Some(a.min(b)),
        OP_MAX => Some(a.max(b)),
        OP_LT => Some((a < b) as i64),
        OP_LE => Some((a <= b) as i64),
        _ => Some((a == b) as i64),
    };
    value.ok_or(ExpandError::Overflow)
}
