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
    /// A task of no arguments, to fill with [`Expander::step_into`].
    pub const fn empty() -> TaskSpec {
        TaskSpec {
            kernel: KernelRef {
                id: 0,
                kind: wsp_ffi::CoreKind::Vector,
            },
            stream: 0,
            args: Vec::new(),
            scalars: Vec::new(),
            loops: Vec::new(),
            pc: None,
            taskset: 0,
        }
    }

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
            let tensor = &table.tensors()[arg.tensor as usize];
            let dtype = tensor.dtype.get();
            let tile = TileView::of(tensor, &arg.region);
            let elem = dtype_size(dtype).unwrap_or(0);
            *view = WspTensorView {
                addr: arena_base + tensor.arena_offset.get() + tile.first_element * elem,
                rows: tile.rows,
                cols: tile.cols,
                row_stride: tile.row_stride,
                dtype,
            };
        }
        args
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

/// The result of one [`Expander::step_into`]: a [`Step`] whose task, if
/// any, is in the caller's [`TaskSpec`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Submit the task written to the caller's spec (before stepping again).
    Task,
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
    /// The register of the loop's variable.
    reg: u8,
    count: i64,
    index: i64,
    sequential: bool,
    /// Number of the first task of the current iteration.
    first: u64,
}

/// The last call whose arguments passed their kernel's contract: a call
/// of the same kernel with the same shapes and scalars passes too, so the
/// expander checks each distinct combination once in a row, not once per
/// task (the contract depends on nothing else).
#[derive(Clone, Copy, Debug)]
struct Checked {
    /// The kernel's id, then rows, cols and dtype of each tensor argument.
    words: [u32; 1 + 3 * MAX_TENSOR_ARGS],
    scalars: [u64; MAX_SCALARS],
}

impl Checked {
    #[inline(always)]
    fn new(
        kernel: u32,
        shapes: &[TileShape; MAX_TENSOR_ARGS],
        scalars: [u64; MAX_SCALARS],
    ) -> Self {
        let mut words = [kernel; 1 + 3 * MAX_TENSOR_ARGS];
        for (k, shape) in shapes.iter().enumerate() {
            words[1 + 3 * k] = shape.rows;
            words[2 + 3 * k] = shape.cols;
            words[3 + 3 * k] = shape.dtype;
        }
        Checked { words, scalars }
    }

    /// Whether both are the same call: one comparison of all words, no
    /// branch per word.
    #[inline(always)]
    fn same(&self, other: &Checked) -> bool {
        let words = (self.words.iter().zip(&other.words)).fold(0, |d, (a, b)| d | (a ^ b));
        let scalars = (self.scalars.iter().zip(&other.scalars)).fold(0, |d, (a, b)| d | (a ^ b));
        words as u64 | scalars == 0
    }
}

const NO_SHAPE: TileShape = TileShape {
    rows: 0,
    cols: 0,
    dtype: 0,
};

/// The program machine of one run.
#[derive(Clone, Debug)]
pub struct Expander {
    pc: usize,
    regs: [i64; MAX_REGS],
    frames: [Frame; MAX_LOOP_DEPTH],
    depth: usize,
    /// Bit `i`: data tensor `i` ([`ProgramInfo::data`]) has been written by
    /// a submitted task (the bit of an `INPUT` may stay clear: its data is
    /// there from the start).
    written: u8,
    /// The taskset of the next call (the last `DISPATCH`).
    taskset: u8,
    /// The last call that passed its contract check, if any.
    checked: Option<Checked>,
    /// The kernel of the last call, if any.
    kernel: Option<&'static wsp_ffi::KernelInfo>,
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
            checked: None,
            kernel: None,
        }
    }

    /// The pc of the next instruction.
    pub fn pc(&self) -> u32 {
        self.pc as u32
    }

    #[inline(always)]
    fn read(&self, r: u8) -> i64 {
        // Without a branch: `NO_REG` (and any other number past the
        // registers, which validation refuses) reads as 0.
        let value = self.regs[r as usize % MAX_REGS];
        if (r as usize) < MAX_REGS {
            value
        } else {
            0
        }
    }

    /// Runs instructions until a task, an event op, a wait, the end of the
    /// program, or [`STEP_BUDGET`] instructions. A step that waits changes
    /// nothing: stepping again retries the same instruction.
    ///
    /// [`step_into`](Self::step_into) does the same without moving the
    /// task: the faster form for a caller that keeps one spec to fill.
    pub fn step(&mut self, table: &Table<'_>, cx: &mut impl Context) -> Result<Step, ExpandError> {
        let mut spec = TaskSpec::empty();
        Ok(match self.step_into(table, cx, &mut spec)? {
            Next::Task => Step::Task(spec),
            Next::Event {
                record,
                stream,
                event,
            } => Step::Event {
                record,
                stream,
                event,
            },
            Next::Wait(wait) => Step::Wait(wait),
            Next::Yield => Step::Yield,
            Next::Done => Step::Done,
        })
    }

    /// [`step`](Self::step), writing the task, when there is one
    /// ([`Next::Task`]), to `spec` (every field of it) instead of returning
    /// it. Any other result, and an error, may leave `spec` changed.
    pub fn step_into(
        &mut self,
        table: &Table<'_>,
        cx: &mut impl Context,
        spec: &mut TaskSpec,
    ) -> Result<Next, ExpandError> {
        let program = table.program();
        for _ in 0..STEP_BUDGET {
            let Some(ins) = program.get(self.pc) else {
                return Ok(Next::Done);
            };
            let r = ins.r as usize;
            match ins.op {
                OP_CONST => {
                    self.set(
                        r,
                        (ins.imm.get() as u64 | (ins.imm2.get() as u64) << 32) as i64,
                    );
                }
                OP_SYMBOL => {
                    let symbol = ins.imm.get();
                    let value = cx
                        .symbol(symbol as usize)
                        .ok_or(ExpandError::UnboundSymbol {
                            symbol,
                            bound: (0..MAX_SYMBOLS)
                                .take_while(|&i| cx.symbol(i).is_some())
                                .count(),
                        })?;
                    self.set(r, value);
                }
                OP_LOAD => match self.load(table, ins, cx)? {
                    Ok(value) => self.set(r, value as i64),
                    Err(wait) => return Ok(Next::Wait(wait)),
                },
                OP_ADD..=OP_EQ => {
                    let value = arith(ins.op, self.read(ins.x[0]), self.read(ins.x[1]))?;
                    self.set(r, value);
                }
                OP_LOOP => {
                    let (a, max) = (self.read(ins.x[0]), ins.imm2.get());
                    if a < 0 || a > max as i64 {
                        return Err(ExpandError::BadCount { count: a, max });
                    }
                    if a == 0 {
                        self.pc = ins.imm.get() as usize + 1;
                        continue;
                    }
                    // Validation nests loops at most `MAX_LOOP_DEPTH` deep.
                    let Some(frame) = self.frames.get_mut(self.depth) else {
                        unreachable!("loops nested deeper than MAX_LOOP_DEPTH");
                    };
                    *frame = Frame {
                        pc: self.pc as u32,
                        reg: ins.r,
                        count: a,
                        index: 0,
                        sequential: ins.x[1] == LOOP_SEQUENTIAL,
                        first: cx.next_task(),
                    };
                    self.depth += 1;
                    self.set(r, 0);
                }
                OP_END => {
                    // Validation matches every END with an open LOOP.
                    let Some(frame) = self.depth.checked_sub(1).and_then(|d| self.frames.get(d))
                    else {
                        unreachable!("END without a LOOP");
                    };
                    if frame.index + 1 < frame.count {
                        if frame.sequential && !cx.completed_since(frame.first) {
                            return Ok(Next::Wait(Wait::Iteration));
                        }
                        let next = cx.next_task();
                        let frame = &mut self.frames[self.depth - 1];
                        frame.index += 1;
                        frame.first = next;
                        let (reg, index, pc) = (frame.reg as usize, frame.index, frame.pc);
                        self.set(reg, index);
                        self.pc = pc as usize + 1;
                        continue;
                    }
                    self.depth -= 1;
                }
                OP_WHEN => {
                    if self.read(ins.x[0]) == 0 {
                        self.pc = ins.imm.get() as usize;
                        continue;
                    }
                }
                OP_JUMP => {
                    self.pc = ins.imm.get() as usize;
                    continue;
                }
                OP_CALL => {
                    self.pc = match self.call_fast(table, ins, spec) {
                        Some(end) => end,
                        None => self.call(table, ins, spec)?,
                    };
                    return Ok(Next::Task);
                }
                OP_RECORD | OP_WAIT => {
                    self.pc += 1;
                    return Ok(Next::Event {
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
        Ok(Next::Yield)
    }

    /// Sets register `r` (validated to be one: `0 .. MAX_REGS`).
    #[inline(always)]
    fn set(&mut self, r: usize, value: i64) {
        if let Some(reg) = self.regs.get_mut(r) {
            *reg = value;
        }
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

    /// The hot path of a `CALL`: writes its task to `spec` and returns the
    /// pc after its operands, as [`call`](Self::call) does, or returns
    /// `None` where any check fails, leaving the expander as it was (then
    /// `call` names the problem). It reads the operands once, writes the
    /// task in place and checks regions without building errors.
    #[inline(always)]
    fn call_fast(&mut self, table: &Table<'_>, ins: &Instr, spec: &mut TaskSpec) -> Option<usize> {
        let id = ins.imm.get();
        let kernel = match self.kernel {
            Some(k) if k.id == id => k,
            _ => wsp_ffi::lookup(id)?,
        };
        self.kernel = Some(kernel);
        let stream = match ins.x[1] {
            NO_REG => ins.x[0] as u32,
            r => {
                let value = self.read(r);
                if !(0..=crate::abi::MAX_STREAMS as i64).contains(&value) {
                    return None;
                }
                value as u32
            }
        };
        let (num_args, num_scalars) = (kernel.num_tensors as usize, kernel.num_scalars as usize);
        if num_args > MAX_TENSOR_ARGS || num_scalars > MAX_SCALARS {
            return None;
        }
        let first = self.pc + 1;
        let end = first + num_args + num_scalars;
        let (args, scalars) = table.program().get(first..end)?.split_at(num_args);
        if spec.args.len() != num_args {
            spec.args.clear();
            spec.args.resize(num_args, NO_ARG).ok()?;
        }
        let mut shapes = [NO_SHAPE; MAX_TENSOR_ARGS];
        let mut written = self.written;
        // One straight run of code per number of arguments.
        let ok = match num_args {
            0 => true,
            1 => self.args_of::<1>(table, args, &mut spec.args, &mut shapes, &mut written)?,
            2 => self.args_of::<2>(table, args, &mut spec.args, &mut shapes, &mut written)?,
            3 => self.args_of::<3>(table, args, &mut spec.args, &mut shapes, &mut written)?,
            4 => self.args_of::<4>(table, args, &mut spec.args, &mut shapes, &mut written)?,
            _ => return None,
        };
        if !ok {
            return None;
        }
        if spec.scalars.len() != num_scalars {
            spec.scalars.clear();
            spec.scalars.resize(num_scalars, 0).ok()?;
        }
        let mut values = [0u64; MAX_SCALARS];
        for ((ins, scalar), value) in scalars.iter().zip(spec.scalars.iter_mut()).zip(&mut values) {
            *scalar = self.read(ins.x[0]) as u64;
            *value = *scalar;
        }
        let checked = Checked::new(id, &shapes, values);
        if !self.checked.as_ref().is_some_and(|c| c.same(&checked)) {
            kernel.check(&shapes[..num_args], spec.scalars()).ok()?;
            self.checked = Some(checked);
        }
        let frames = self.frames.get(..self.depth)?;
        if spec.loops.len() != frames.len() {
            spec.loops.clear();
            spec.loops.resize(frames.len(), 0).ok()?;
        }
        for (index, frame) in spec.loops.iter_mut().zip(frames) {
            *index = frame.index as u32;
        }
        spec.kernel = KernelRef {
            id,
            kind: kernel.kind,
        };
        spec.stream = stream;
        spec.pc = Some(self.pc as u32);
        spec.taskset = self.taskset;
        self.written = written;
        Some(end)
    }

    /// Fills `out` with the `N` arguments of a call (its `ARG`s, `args`) and
    /// `shapes` with their tile shapes, and marks in `written` the data
    /// tensors they write; whether every region is a tile inside its
    /// tensor (`None` if an operand is not as validation leaves it).
    #[inline(always)]
    fn args_of<const N: usize>(
        &self,
        table: &Table<'_>,
        args: &[Instr],
        out: &mut [TaskArg],
        shapes: &mut [TileShape; MAX_TENSOR_ARGS],
        written: &mut u8,
    ) -> Option<bool> {
        let args: &[Instr; N] = args.try_into().ok()?;
        let out: &mut [TaskArg; N] = out.try_into().ok()?;
        let info = table.program_info();
        // Data tensors count as written once a task writes them; inputs
        // have data from the start. Once all have, there is nothing to mark.
        let all = (1u16 << info.data().len()) - 1;
        let marked = (*written | info.inputs) as u16 == all;
        let mut ok = true;
        for k in 0..N.min(MAX_TENSOR_ARGS) {
            let ins = &args[k];
            let t = ins.imm.get();
            let tensor = table.tensors().get(t as usize)?;
            let rank = tensor.rank.get() as usize;
            let access = Access::from_bits_truncate(ins.r as u32);
            if !marked && access.contains(Access::WRITE) {
                if let Some(i) = info.data_index(t) {
                    *written |= 1 << i;
                }
            }
            let arg = &mut out[k];
            arg.tensor = t;
            arg.access = access;
            arg.region = NO_ARG.region;
            let region = &mut arg.region;
            // One straight run of code per rank: no loop, no bounds checks.
            ok &= match rank {
                1 => self.region_of::<1>(ins, tensor, region),
                2 => self.region_of::<2>(ins, tensor, region),
                3 => self.region_of::<3>(ins, tensor, region),
                4 => self.region_of::<4>(ins, tensor, region),
                _ => return None,
            };
            shapes[k] = TileShape {
                rows: if rank >= 2 {
                    region.extent[rank - 2]
                } else {
                    1
                },
                cols: region.extent[rank - 1],
                dtype: tensor.dtype.get(),
            };
        }
        Some(ok)
    }

    /// Fills `region` from the operands of `ins`, an `ARG` of `tensor` of
    /// rank `RANK`; whether the region is a tile inside the tensor, as
    /// [`check_region`] decides, with offsets and extents in `0 ..=
    /// u32::MAX`. Each check uses `&` (not `&&`): no branch per check. An
    /// offset or extent outside `0 .. size` (negative ones included, as
    /// u64) fails the first two, so the sum cannot overflow where it counts.
    #[inline(always)]
    fn region_of<const RANK: usize>(
        &self,
        ins: &Instr,
        tensor: &TensorDesc,
        region: &mut Region,
    ) -> bool {
        let mut ok = true;
        for d in 0..RANK.min(MAX_RANK) {
            let extent = |r: u8| if r == NO_REG { 1 } else { self.read(r) };
            // Dimensions before the last two take a single index each.
            let ext = match RANK - d {
                1 => extent(ins.x[5]),
                2 => extent(ins.x[4]),
                _ => 1,
            } as u64;
            let off = self.read(ins.x[d]) as u64;
            let size = tensor.shape[d].get() as u64;
            ok &= (off < size) & (ext.wrapping_sub(1) < size) & (off.wrapping_add(ext) <= size);
            region.offset[d] = off as u32;
            region.extent[d] = ext as u32;
        }
        ok
    }

    /// Writes the task of the `CALL` at the pc to `spec`; returns the pc
    /// after the call's operands. Checks each operand in turn and names the
    /// first that fails.
    fn call(
        &mut self,
        table: &Table<'_>,
        ins: &Instr,
        spec: &mut TaskSpec,
    ) -> Result<usize, ExpandError> {
        let id = ins.imm.get();
        let kernel = wsp_ffi::lookup(id).expect("validation checks every call's kernel");
        spec.kernel = KernelRef {
            id,
            kind: kernel.kind,
        };
        spec.stream = match ins.x[1] {
            NO_REG => ins.x[0] as u32,
            r => {
                let value = self.read(r);
                match u32::try_from(value) {
                    Ok(s) if s as usize <= crate::abi::MAX_STREAMS => s,
                    _ => return Err(ExpandError::BadStream { value }),
                }
            }
        };
        spec.pc = Some(self.pc as u32);
        spec.taskset = self.taskset;
        spec.loops.clear();
        for frame in &self.frames[..self.depth] {
            // At most `MAX_LOOP_DEPTH` frames are open (validation).
            let _ = spec.loops.push(frame.index as u32);
        }
        let (num_args, num_scalars) = (kernel.num_tensors as usize, kernel.num_scalars as usize);
        let first = self.pc + 1;
        let scalars_at = first + num_args;
        let end = scalars_at + num_scalars;
        // Validation checks that the call's operands lie inside the program.
        let Some(operands) = table.program().get(first..end) else {
            unreachable!("a call's operands past the program's end");
        };
        let (args, scalars) = operands.split_at(num_args);
        let mut shapes = [NO_SHAPE; MAX_TENSOR_ARGS];
        let info = table.program_info();
        spec.args.clear();
        for ((k, arg), shape) in args.iter().enumerate().zip(shapes.iter_mut()) {
            let t = arg.imm.get();
            let tensor = &table.tensors()[t as usize];
            let region = self.region(k, arg, tensor)?;
            *shape = tile(tensor, &region).ok_or_else(|| {
                let (field, problem) = check_region(tensor, &region)
                    .expect_err("check_region refuses what tile refuses");
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
            // A kernel takes at most `MAX_TENSOR_ARGS` tensors and
            // `MAX_SCALARS` scalars (the kernel ABI's capacities): `zip`
            // with `shapes` stops there.
            let _ = spec.args.push(TaskArg {
                tensor: t,
                region,
                access,
            });
        }
        spec.scalars.clear();
        let mut values = [0u64; MAX_SCALARS];
        for (s, value) in scalars.iter().zip(values.iter_mut()) {
            *value = self.read(s.x[0]) as u64;
            let _ = spec.scalars.push(*value);
        }
        let checked = Checked::new(id, &shapes, values);
        if !self.checked.as_ref().is_some_and(|c| c.same(&checked)) {
            kernel
                .check(&shapes[..num_args], spec.scalars())
                .map_err(ExpandError::Contract)?;
            self.checked = Some(checked);
        }
        Ok(end)
    }

    /// The region of the call's argument `k` (`arg`, an `ARG` of `tensor`).
    #[inline(always)]
    fn region(&self, k: usize, arg: &Instr, tensor: &TensorDesc) -> Result<Region, ExpandError> {
        let rank = tensor.rank.get() as usize;
        let mut region = NO_ARG.region;
        let operand = |r: u8, none: i64| {
            let value = if r == NO_REG { none } else { self.read(r) };
            u32::try_from(value).map_err(|_| ExpandError::BadOperand {
                arg: k as u32,
                value,
            })
        };
        for d in 0..rank.min(MAX_RANK) {
            region.offset[d] = operand(arg.x[d], 0)?;
        }
        if let Some(last) = rank.checked_sub(1) {
            region.extent[last] = operand(arg.x[5], 1)?;
        }
        if let Some(row) = rank.checked_sub(2) {
            region.extent[row] = operand(arg.x[4], 1)?;
        }
        Ok(region)
    }
}

/// The tile shape of `region` in `tensor` (validated), if the region is a
/// tile inside the tensor: what [`check_region`] decides, for a region
/// whose dimensions past the tensor's rank are `0 .. 1` (as the expander
/// makes them). The hot path of a call; `check_region` names the problem.
#[inline(always)]
fn tile(tensor: &TensorDesc, region: &Region) -> Option<TileShape> {
    let rank = tensor.rank.get() as usize;
    let mut ok = (1..=MAX_RANK).contains(&rank);
    for d in 0..rank.min(MAX_RANK) {
        let (off, ext) = (region.offset[d] as u64, region.extent[d]);
        let size = tensor.shape[d].get() as u64;
        ok &= ext != 0 && off + ext as u64 <= size && (d + 2 >= rank || ext == 1);
    }
    if !ok {
        return None;
    }
    let cols = region.extent[rank - 1];
    let rows = if rank >= 2 {
        region.extent[rank - 2]
    } else {
        1
    };
    Some(TileShape {
        rows,
        cols,
        dtype: tensor.dtype.get(),
    })
}

#[inline(always)]
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
