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
//!
//! A `CALL` is the hot path: the expander decodes each call once (up to
//! [`CALL_SITES`] at a time), writes its task into a spec the caller keeps
//! ([`Expander::step_into`]), checks regions without building errors and
//! checks the kernel's contract again only when a call's shapes or scalars
//! change. Where a fast check fails, the call runs again through the
//! checked path, which names the problem: errors are the same either way.

use core::fmt;

use heapless::Vec;
use wsp_ffi::{ShapeError, TileShape, WspKernelArgs, WspTensorView};

use crate::abi::program::*;
use crate::abi::{
    check_region, dtype_size, Access, Instr, Problem, Region, Table, TensorDesc, TileView,
    MAX_RANK, MAX_SCALARS, MAX_TENSOR_ARGS,
};
use crate::channel::{Chan, ChannelReport, ChannelState, Park, ProcessState, Token};
use crate::orch::{KernelRef, ResourceStats, TaskArg, TaskId};

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
    /// The context of the program machine that issued it
    /// (`0 .. MAX_CONTEXTS`; 0 for the program's own and the tasks section).
    pub context: u8,
}

/// An unused entry of an argument block.
pub const NO_VIEW: WspTensorView = WspTensorView {
    addr: 0,
    rows: 0,
    cols: 0,
    row_stride: 0,
    dtype: 0,
};

/// An unused entry of an argument list.
pub(crate) const NO_ARG: TaskArg = TaskArg {
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
            context: 0,
        }
    }

    /// Task `index` of the table's tasks section.
    pub fn of_task(table: &Table<'_>, index: usize) -> TaskSpec {
        let mut spec = TaskSpec::empty();
        spec.set_task(table, index);
        spec
    }

    /// Makes this spec task `index` of the table's tasks section, in place
    /// (the dispatcher's per-task path: no spec is built and moved).
    pub fn set_task(&mut self, table: &Table<'_>, index: usize) {
        let desc = &table.tasks()[index];
        let id = desc.kernel_id.get();
        let kind = wsp_ffi::lookup(id).map_or(wsp_ffi::CoreKind::Vector, |k| k.kind);
        self.kernel = KernelRef { id, kind };
        self.stream = desc.stream.get();
        self.pc = None;
        self.taskset = 0;
        self.context = 0;
        self.loops.clear();
        // Validation bounds both counts by the capacities (`MAX_SCALARS`,
        // `MAX_TENSOR_ARGS`), so nothing is cut off.
        self.scalars.clear();
        let scalars = (desc.num_scalars.get() as usize).min(MAX_SCALARS);
        for s in &desc.scalars[..scalars] {
            if self.scalars.push(s.get()).is_err() {
                unreachable!("MAX_SCALARS scalars fit");
            }
        }
        self.args.clear();
        for t in table.task_args(desc) {
            let arg = TaskArg {
                tensor: t.tensor.get(),
                region: Region::of(t),
                access: Access::from_bits_truncate(t.access.get()),
            };
            if self.args.push(arg).is_err() {
                unreachable!("validation refuses tasks with more than MAX_TENSOR_ARGS");
            }
        }
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
        // Wrapping: a scratch tensor's offset is a marker, and the
        // dispatcher rebases its views (see `orch::scratch`).
        addr: arena_base
            .wrapping_add(tensor.arena_offset.get())
            .wrapping_add(tile.first_element * elem),
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
    /// A `SEND` on a channel that is closed.
    SendOnClosed { channel: u32 },
    /// A `PROCESS` would make more processes live than the machine holds.
    TooManyProcesses { live: u32, starting: i64, max: u32 },
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
            ExpandError::SendOnClosed { channel } => write!(
                f,
                "sends on channel {channel}, which is closed (a CLOSE, or its last sender ended)"
            ),
            ExpandError::TooManyProcesses {
                live,
                starting,
                max,
            } => write!(
                f,
                "starts {starting} processes with {live} live; at most {max} processes may be live at once"
            ),
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
    /// Whether every task numbered `first` or later that context `context`
    /// of the program machine issued has completed (a sequential loop of a
    /// process waits for its own tasks, not for the other processes'). The
    /// default waits for every task, which is never wrong, only late.
    fn completed_since_in(&self, first: u64, context: u8) -> bool {
        let _ = context;
        self.completed_since(first)
    }
    /// Whether the run's task `task` (submitted) has completed. The default
    /// asks [`completed_since`](Self::completed_since): true only when every
    /// later task has completed too, which is never wrong, only late.
    fn task_done(&self, task: u64) -> bool {
        self.completed_since(task)
    }
    /// The run's clock (ticks): for channel latencies and the time
    /// processes spend parked. The default is a clock that never moves.
    fn now(&self) -> u64 {
        0
    }
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
    /// A `SEND` on a full channel.
    ChannelFull {
        /// The channel.
        channel: u8,
    },
    /// A `CONSUME` of a channel with no token to take yet.
    ChannelEmpty {
        /// The channel.
        channel: u8,
        /// The task the oldest token stands for, while it runs.
        task: Option<u64>,
    },
    /// A token whose channel latency passes at this time (the clock of
    /// [`Context::now`]).
    Latency {
        /// When the token may be taken.
        until: u64,
    },
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
    /// The channel of a `CONSUME`'s frame, or [`NO_CHANNEL`] for a `LOOP`'s.
    channel: u8,
}

/// [`Frame::channel`] of a loop's frame.
const NO_CHANNEL: u8 = 0xFF;

impl Frame {
    const EMPTY: Frame = Frame {
        pc: 0,
        reg: 0,
        count: 0,
        index: 0,
        sequential: false,
        first: 0,
        channel: NO_CHANNEL,
    };
}

const NO_SHAPE: TileShape = TileShape {
    rows: 0,
    cols: 0,
    dtype: 0,
};

/// Register slots of the expander: the program's registers, then
/// [`ZERO`] and [`ONE`]. A power of two, so that a slot number taken
/// modulo it needs no bounds check.
const SLOTS: usize = 32;
/// The slot that always holds 0: a `NO_REG` offset or scalar.
const ZERO: u8 = MAX_REGS as u8;
/// The slot that always holds 1: a `NO_REG` extent.
const ONE: u8 = MAX_REGS as u8 + 1;
const _: () = assert!(SLOTS.is_power_of_two() && (ONE as usize) < SLOTS);

/// Calls the expander keeps decoded, by a hash of the pc of the `CALL`
/// (`site_of`): the calls of a loop body (or of a pipeline's processes,
/// which take turns) decode once while they fit. Adjacent calls of one
/// kernel are a fixed number of instructions apart; the hash folds the
/// pc's higher bits in, so that such a run of calls does not map to one
/// entry (with the pc modulo 4, two adjacent calls of three arguments did,
/// and each decoded again on every iteration).
pub const CALL_SITES: usize = 8;

/// The entry of [`CALL_SITES`] for the `CALL` at `pc`.
#[inline(always)]
fn site_of(pc: usize) -> usize {
    (pc ^ pc >> 3 ^ pc >> 6) % CALL_SITES
}

/// An operand that is a constant or a register slot.
#[derive(Clone, Copy, Debug)]
enum Operand {
    Const(u32),
    Reg(u8),
}

/// One `ARG` of a call, decoded: everything but the registers' values.
#[derive(Clone, Copy, Debug)]
struct SiteArg {
    tensor: u32,
    access: Access,
    /// The tensor's rank, 1 ..= `MAX_RANK` (0 in an unused entry).
    rank: u8,
    dtype: u32,
    /// The tensor's sizes.
    shape: [u32; MAX_RANK],
    /// The slot of each dimension's offset and extent.
    offset: [u8; MAX_RANK],
    extent: [u8; MAX_RANK],
}

/// The slot an operand reads: its register, or `none` for `NO_REG`.
fn slot(r: u8, none: u8) -> Option<u8> {
    match r {
        NO_REG => Some(none),
        r if (r as usize) < MAX_REGS => Some(r),
        _ => None,
    }
}

impl SiteArg {
    /// Decodes `arg`, an `ARG` of `tensor`, or `None` if it is not as
    /// validation leaves it.
    fn decode(arg: &Instr, tensor: &TensorDesc) -> Option<SiteArg> {
        let rank = tensor.rank.get() as usize;
        if !(1..=MAX_RANK).contains(&rank) {
            return None;
        }
        let mut a = SiteArg {
            tensor: arg.imm.get(),
            access: Access::from_bits_truncate(arg.r as u32),
            rank: rank as u8,
            dtype: tensor.dtype.get(),
            shape: tensor.shape.map(|s| s.get()),
            ..SiteArg::NONE
        };
        for d in 0..rank {
            a.offset[d] = slot(arg.x[d], ZERO)?;
        }
        a.extent[rank - 1] = slot(arg.x[5], ONE)?;
        if rank >= 2 {
            a.extent[rank - 2] = slot(arg.x[4], ONE)?;
        }
        Some(a)
    }

    const NONE: SiteArg = SiteArg {
        tensor: 0,
        access: Access::READ,
        rank: 0,
        dtype: 0,
        shape: [0; MAX_RANK],
        offset: [ZERO; MAX_RANK],
        extent: [ONE; MAX_RANK],
    };

    /// Fills the first `RANK` dimensions of `region` from `regs`. Returns
    /// whether the region is a tile inside the tensor, as [`check_region`]
    /// decides, with offsets and extents in `0 ..= u32::MAX` (as the checked
    /// path requires), and the tile's rows (high 32 bits) and cols (low).
    /// Each check uses `&` (not `&&`): no branch per check.
    #[inline(always)]
    fn region_of<const RANK: usize>(
        &self,
        regs: &[i64; SLOTS],
        region: &mut Region,
    ) -> (bool, u64) {
        let mut ok = true;
        for d in 0..RANK.min(MAX_RANK) {
            let off = regs[self.offset[d] as usize % SLOTS] as u64;
            let ext = regs[self.extent[d] as usize % SLOTS] as u64;
            let size = self.shape[d] as u64;
            // `off < size` first (negative offsets, as u64, are past any
            // size); then `1 <= ext <= size - off`: an extent of 0 wraps
            // to u64::MAX, past any `size - off`.
            ok &= (off < size) & (ext.wrapping_sub(1) < size.wrapping_sub(off));
            region.offset[d] = off as u32;
            region.extent[d] = ext as u32;
        }
        let cols = region.extent[RANK.clamp(1, MAX_RANK) - 1] as u64;
        let rows = if RANK >= 2 {
            region.extent[RANK.clamp(2, MAX_RANK) - 2] as u64
        } else {
            1
        };
        (ok, rows << 32 | cols)
    }
}

/// A `CALL` and its operands, decoded once: its kernel, where its
/// operands come from, the tensors and their sizes.
#[derive(Clone, Copy, Debug)]
struct Site {
    /// The pc of the `CALL`.
    pc: usize,
    /// The pc after its operands.
    end: usize,
    kernel: &'static wsp_ffi::KernelInfo,
    stream: Operand,
    /// The first `kernel.num_tensors` are its arguments.
    args: [SiteArg; MAX_TENSOR_ARGS],
    /// The rank of every argument, if all have the same; else 0.
    rank: u8,
    /// The slot of each scalar, the first `kernel.num_scalars`.
    scalars: [u8; MAX_SCALARS],
    /// The data tensors ([`ProgramInfo::data`]) it writes, as bits.
    writes: u64,
    /// Whether a call of the site has passed its kernel's contract: then
    /// `tiles` (rows in the high 32 bits, cols in the low) and
    /// `scalar_values` are that call's. A call with the same passes too,
    /// so the site checks the contract only when they change.
    passed: bool,
    tiles: [u64; MAX_TENSOR_ARGS],
    scalar_values: [u64; MAX_SCALARS],
}

impl Site {
    /// Fills `out` (one entry per argument) with the call's arguments and
    /// `tiles` with their tiles (rows in the high 32 bits, cols in the low);
    /// whether every region is a tile inside its tensor. `RANK` is the
    /// rank of every argument, or 0 for a choice per argument.
    #[inline(always)]
    fn args_of<const RANK: usize>(
        &self,
        regs: &[i64; SLOTS],
        out: &mut [TaskArg],
        tiles: &mut [u64; MAX_TENSOR_ARGS],
    ) -> bool {
        let mut ok = true;
        for ((arg, out), tile) in self.args.iter().zip(out).zip(tiles) {
            out.tensor = arg.tensor;
            out.access = arg.access;
            out.region = NO_ARG.region;
            let region = &mut out.region;
            let (fits, rows_cols) = match if RANK == 0 { arg.rank as usize } else { RANK } {
                1 => arg.region_of::<1>(regs, region),
                2 => arg.region_of::<2>(regs, region),
                3 => arg.region_of::<3>(regs, region),
                4 => arg.region_of::<4>(regs, region),
                _ => return false,
            };
            ok &= fits;
            *tile = rows_cols;
        }
        ok
    }

    /// Decodes the `CALL` at `pc` of the (validated) table's program, or
    /// `None` if it is not as validation leaves it.
    #[cold]
    #[inline(never)]
    fn decode(table: &Table<'_>, pc: usize) -> Option<Site> {
        let program = table.program();
        let ins = program.get(pc)?;
        let kernel = wsp_ffi::lookup(ins.imm.get())?;
        let (num_args, num_scalars) = (kernel.num_tensors as usize, kernel.num_scalars as usize);
        if num_args > MAX_TENSOR_ARGS || num_scalars > MAX_SCALARS {
            return None;
        }
        let end = pc + 1 + num_args + num_scalars;
        let (args, scalars) = program.get(pc + 1..end)?.split_at(num_args);
        let mut site = Site {
            pc,
            end,
            kernel,
            stream: match ins.x[1] {
                NO_REG => Operand::Const(ins.x[0] as u32),
                r => Operand::Reg(slot(r, ZERO)?),
            },
            args: [SiteArg::NONE; MAX_TENSOR_ARGS],
            rank: 0,
            scalars: [ZERO; MAX_SCALARS],
            writes: 0,
            passed: false,
            tiles: [0; MAX_TENSOR_ARGS],
            scalar_values: [0; MAX_SCALARS],
        };
        for (arg, decoded) in args.iter().zip(&mut site.args) {
            let tensor = table.tensors().get(arg.imm.get() as usize)?;
            *decoded = SiteArg::decode(arg, tensor)?;
            if decoded.access.contains(Access::WRITE) {
                if let Some(i) = table.program_info().data_index(decoded.tensor) {
                    site.writes |= 1 << i;
                }
            }
        }
        let ranks = site.args[..num_args].iter().map(|a| a.rank);
        site.rank = match ranks.clone().min() {
            Some(r) if ranks.max() == Some(r) => r,
            _ => 0,
        };
        for (s, decoded) in scalars.iter().zip(&mut site.scalars) {
            *decoded = slot(s.x[0], ZERO)?;
        }
        Some(site)
    }
}

/// One context of the program machine: the program's own, or a
/// process's (see the CSP section of [`crate::abi::program`]).
#[derive(Clone, Debug)]
struct Ctx {
    pc: usize,
    /// The program's registers (`0 .. MAX_REGS`), then slots that always
    /// hold 0 ([`ZERO`]) and 1 ([`ONE`]).
    regs: [i64; SLOTS],
    frames: [Frame; MAX_LOOP_DEPTH],
    depth: usize,
    /// The taskset of the next call (the last `DISPATCH`).
    taskset: u8,
    /// The run's number of the last task this context issued.
    last_task: Option<u64>,
    /// Bit `c`: the context's code sends on channel `c` (it closes those
    /// it is the last sender of when it ends).
    sends: u16,
    /// Bit `c`: the context reserved room on channel `c` for the `SEND`
    /// after its last call.
    reserved: u16,
    /// The pc of its `PROCESS`, or [`MAIN`] for the program's context.
    start: u32,
    /// Its replica index (0 for the program's context).
    replica: u32,
    /// Why it is parked, if it is.
    park: Option<Park>,
    /// When it parked (the context's clock), while parked on a channel.
    parked_since: u64,
}

impl Ctx {
    /// Copies what a context is into `to`: the registers (not the
    /// constant slots), the open loops' frames and the rest, not the
    /// frames past its depth (a switch copies what is live, not all).
    fn copy_to(&self, to: &mut Ctx) {
        to.pc = self.pc;
        to.regs[..MAX_REGS].copy_from_slice(&self.regs[..MAX_REGS]);
        let depth = self.depth.min(MAX_LOOP_DEPTH);
        to.frames[..depth].copy_from_slice(&self.frames[..depth]);
        to.depth = depth;
        to.taskset = self.taskset;
        to.last_task = self.last_task;
        to.sends = self.sends;
        to.reserved = self.reserved;
        to.start = self.start;
        to.replica = self.replica;
        to.park = self.park;
        to.parked_since = self.parked_since;
    }
}

/// [`Ctx::start`] of the program's own context.
const MAIN: u32 = u32::MAX;

/// Contexts of the program machine: the program's and its processes'.
pub const MAX_CONTEXTS: usize = MAX_PROCESSES + 1;
// The live contexts are the bits of a u32.
const _: () = assert!(MAX_CONTEXTS <= 32);

impl Ctx {
    const fn new() -> Ctx {
        let mut regs = [0; SLOTS];
        regs[ONE as usize] = 1;
        Ctx {
            pc: 0,
            regs,
            frames: [Frame::EMPTY; MAX_LOOP_DEPTH],
            depth: 0,
            taskset: 0,
            last_task: None,
            sends: 0,
            reserved: 0,
            start: MAIN,
            replica: 0,
            park: None,
            parked_since: 0,
        }
    }
}

/// The program machine of one run: the program's context and its
/// processes' ([`MAX_CONTEXTS`]), run in turn, and the channels between
/// them.
#[derive(Clone, Debug)]
pub struct Expander {
    /// The context running now. The others wait in `saved`; `saved[current]`
    /// is stale while this one runs.
    m: Ctx,
    current: usize,
    saved: [Ctx; MAX_CONTEXTS],
    /// Bit `i`: context `i` is alive.
    live: u32,
    /// Switch to the next context before running (one task per turn).
    rotate: bool,
    /// Bit `i`: data tensor `i` ([`ProgramInfo::data`]) has been written by
    /// a submitted task (the bit of an `INPUT` may stay clear: its data is
    /// there from the start).
    written: u64,
    /// Calls decoded, by [`site_of`] their pc.
    sites: [Option<Site>; CALL_SITES],
    channels: [Chan; MAX_CHANNELS],
    /// `CHANNEL_FULL` and `CHANNEL_EMPTY` figures.
    channel_stats: [ResourceStats; 2],
    /// Whether the program has started processes: from then on a task's
    /// context matters to a sequential loop ([`TaskSpec::context`]).
    started: bool,
    /// Changes of channel state (a send, a take, a body's end, a close)
    /// and of the live contexts: a context that waited may go on after one.
    events: u64,
    /// Scratch tensors whose `FREE` ran since the dispatcher last asked
    /// ([`Expander::take_free`]): their scopes end after the tasks
    /// submitted so far.
    frees: heapless::Vec<u32, { crate::abi::MAX_SCRATCH }>,
}

impl Expander {
    /// A machine at the start of `table`'s program; the data tensors that
    /// the tasks section writes count as written.
    pub fn new(table: &Table<'_>) -> Self {
        let info = table.program_info();
        let mut written = 0u64;
        // A walk over every task's arguments, before the run's first
        // submission: only for a program that loads data tensors (on a
        // million-task table without one, the walk took about 5 % of the
        // run's time on the dispatcher's thread, BENCHMARKS.md).
        let tasks = if info.data().is_empty() {
            &[][..]
        } else {
            table.tasks()
        };
        for task in tasks {
            for a in table.task_args(task) {
                if Access::from_bits_truncate(a.access.get()).contains(Access::WRITE) {
                    if let Some(i) = info.data_index(a.tensor.get()) {
                        written |= 1 << i;
                    }
                }
            }
        }
        let mut channels = [Chan::EMPTY; MAX_CHANNELS];
        for (c, chan) in channels.iter_mut().enumerate() {
            if let Some((capacity, latency)) = info.channel(c) {
                chan.capacity = capacity as u8;
                chan.latency = latency;
            }
        }
        // The program's own context sends on the channels its code outside
        // process bodies sends on.
        let mut main = Ctx::new();
        let program = table.program();
        let mut pc = 0;
        while let Some(ins) = program.get(pc) {
            match ins.op {
                OP_PROCESS => pc = ins.imm.get() as usize,
                OP_SEND => main.sends |= 1 << (ins.imm.get() as usize % MAX_CHANNELS),
                _ => {}
            }
            pc += 1;
        }
        for_each_bit(main.sends, |c| channels[c].senders += 1);
        let mut stats = [ResourceStats::default(); 2];
        stats[0].capacity = channels
            .iter()
            .map(|c| c.capacity as u64)
            .max()
            .unwrap_or(0);
        stats[1].capacity = MAX_PROCESSES as u64;
        Expander {
            m: main,
            current: 0,
            saved: [const { Ctx::new() }; MAX_CONTEXTS],
            live: 1,
            rotate: false,
            written,
            sites: [None; CALL_SITES],
            channels,
            channel_stats: stats,
            started: false,
            events: 0,
            frees: heapless::Vec::new(),
        }
    }

    /// The `CHANNEL_FULL` and `CHANNEL_EMPTY` figures so far: parks, ticks
    /// parked (the [`Context::now`] clock) and high-water marks (see
    /// [`StallReason::ChannelFull`](crate::orch::StallReason::ChannelFull)).
    pub fn channel_stats(&self) -> [ResourceStats; 2] {
        self.channel_stats
    }

    /// Every live context's state: the program's own first, then the
    /// processes in the order they started.
    pub fn processes(&self) -> impl Iterator<Item = ProcessState> + '_ {
        (0..MAX_CONTEXTS)
            .filter(|&i| self.live & (1 << i) != 0)
            .map(|i| {
                let ctx = if i == self.current {
                    &self.m
                } else {
                    &self.saved[i]
                };
                ProcessState {
                    process: (ctx.start != MAIN).then_some(ctx.start),
                    replica: ctx.replica,
                    pc: ctx.pc as u32,
                    park: ctx.park,
                }
            })
    }

    /// Every declared channel's state.
    pub fn channels<'t>(&'t self, table: &'t Table<'_>) -> impl Iterator<Item = ChannelState> + 't {
        let info = table.program_info();
        (0..MAX_CHANNELS)
            .filter(move |&c| info.channel(c).is_some())
            .map(|c| {
                let ch = &self.channels[c];
                let oldest = &ch.tokens[ch.head as usize % MAX_CHANNEL_CAPACITY];
                ChannelState {
                    channel: c as u8,
                    capacity: ch.capacity,
                    queued: ch.queued,
                    in_body: ch.in_body,
                    closed: ch.closed,
                    senders: ch.senders,
                    sent: ch.sent,
                    oldest_task: if ch.queued > 0 { oldest.task } else { None },
                }
            })
    }

    /// The report of a channel deadlock in the machine's current state.
    pub fn channel_report(&self, table: &Table<'_>) -> ChannelReport {
        let mut report = ChannelReport {
            processes: [None; MAX_CONTEXTS],
            channels: [None; MAX_CHANNELS],
        };
        for (out, p) in report.processes.iter_mut().zip(self.processes()) {
            *out = Some(p);
        }
        for (out, c) in report.channels.iter_mut().zip(self.channels(table)) {
            *out = Some(c);
        }
        report
    }

    /// Whether every live context is parked on a channel (not on data,
    /// an iteration or a latency): with no task in flight, nothing can
    /// wake any of them.
    pub fn parked_on_channels(&self) -> bool {
        self.live != 0
            && self
                .processes()
                .all(|p| matches!(p.park, Some(Park::Full { .. } | Park::Empty { .. })))
    }

    /// Makes context `to` the running one.
    fn switch(&mut self, to: usize) {
        if to != self.current {
            self.m.copy_to(&mut self.saved[self.current]);
            self.saved[to].copy_to(&mut self.m);
            self.current = to;
        }
    }

    /// The next live context after the current one (round robin) whose
    /// bit in `skip` is clear.
    fn next_live(&self, skip: u32) -> Option<usize> {
        const N: u32 = MAX_CONTEXTS as u32;
        const ALL: u32 = (1 << N) - 1;
        let mask = self.live & !skip & ALL;
        if mask == 0 {
            return None;
        }
        // Rotate so that the context after the current one is bit 0.
        let from = (self.current as u32 + 1) % N;
        let rotated = (mask >> from | mask << (N - from)) & ALL;
        Some(((from + rotated.trailing_zeros()) % N) as usize)
    }

    /// The running context ended: it closes the channels it was the last
    /// live sender of.
    fn end_context(&mut self) {
        let channels = &mut self.channels;
        for_each_bit(self.m.sends, |c| {
            let ch = &mut channels[c];
            ch.senders = ch.senders.saturating_sub(1);
            if ch.senders == 0 {
                ch.closed = true;
            }
        });
        self.m.park = None;
        self.live &= !(1 << self.current);
        self.events += 1;
    }

    /// Starts the replicas of the `PROCESS` at the pc (the program's
    /// context runs it) and returns the pc after its body.
    #[cold]
    #[inline(never)]
    fn start_processes(&mut self, table: &Table<'_>, ins: &Instr) -> Result<usize, ExpandError> {
        let count = if ins.x[0] == NO_REG {
            1
        } else {
            self.read(ins.x[0])
        };
        let most = ins.imm2.get();
        if count < 0 || count > most as i64 {
            return Err(ExpandError::BadCount { count, max: most });
        }
        let live = self.live.count_ones() - 1;
        if live as i64 + count > MAX_PROCESSES as i64 {
            return Err(ExpandError::TooManyProcesses {
                live,
                starting: count,
                max: MAX_PROCESSES as u32,
            });
        }
        let end = ins.imm.get() as usize;
        let mut sends = 0u16;
        for body in table.program().get(self.m.pc + 1..end).unwrap_or(&[]) {
            if body.op == OP_SEND {
                sends |= 1 << (body.imm.get() as usize % MAX_CHANNELS);
            }
        }
        for replica in 0..count {
            let Some(slot) = (1..MAX_CONTEXTS).find(|&i| self.live & (1 << i) == 0) else {
                unreachable!("MAX_PROCESSES processes fit beside the program's context");
            };
            let ctx = &mut self.saved[slot];
            *ctx = Ctx::new();
            ctx.pc = self.m.pc + 1;
            ctx.regs = self.m.regs;
            if let Some(r) = ctx.regs[..MAX_REGS].get_mut(ins.r as usize) {
                *r = replica;
            }
            ctx.taskset = self.m.taskset;
            ctx.sends = sends;
            ctx.start = self.m.pc as u32;
            ctx.replica = replica as u32;
            self.live |= 1 << slot;
            for_each_bit(sends, |c| self.channels[c].senders += 1);
        }
        self.events += 1;
        // The processes take their turns from the next step on.
        self.rotate = count > 0;
        self.started |= count > 0;
        Ok(end + 1)
    }

    /// Parks the running context for `park`, counting a new park on a
    /// channel in the figures.
    fn park(&mut self, park: Park, cx: &impl Context) {
        let Some(kind) = channel_kind(Some(park)) else {
            self.m.park = Some(park);
            return;
        };
        if channel_kind(self.m.park) != Some(kind) {
            self.unpark(cx);
            self.channel_stats[kind].stalls += 1;
            self.m.parked_since = cx.now();
        }
        self.m.park = Some(park);
        if kind == 1 {
            let parked = self
                .processes()
                .filter(|p| channel_kind(p.park) == Some(1))
                .count() as u64;
            let stats = &mut self.channel_stats[1];
            stats.high_water = stats.high_water.max(parked);
        }
    }

    /// The running context goes on: ends its park, adding the time it
    /// spent parked on a channel to the figures.
    fn unpark(&mut self, cx: &impl Context) {
        if let Some(kind) = channel_kind(self.m.park.take()) {
            self.channel_stats[kind].stall_ticks += cx.now().saturating_sub(self.m.parked_since);
        }
    }

    /// A `CALL` of a context that sends on channels: reserves room for the
    /// `SEND`s after it ([`reserve`](Self::reserve)), then writes the task
    /// to `spec`, which the tokens it sends next stand for.
    #[inline(never)]
    fn call_sending(
        &mut self,
        table: &Table<'_>,
        ins: &Instr,
        cx: &impl Context,
        spec: &mut TaskSpec,
    ) -> Result<Next, ExpandError> {
        if !self.reserve(table, ins, cx)? {
            let channel = match self.m.park {
                Some(Park::Full { channel }) => channel,
                _ => 0,
            };
            return Ok(Next::Wait(Wait::ChannelFull { channel }));
        }
        self.m.pc = match self.call_fast(table, spec) {
            Some(end) => end,
            None => self.call(table, ins, spec)?,
        };
        self.m.last_task = Some(cx.next_task());
        Ok(Next::Task)
    }

    /// The earliest time a context parked on a channel's latency may go on.
    pub fn wake_at(&self) -> Option<u64> {
        self.processes()
            .filter_map(|p| match p.park {
                Some(Park::Latency { until, .. }) => Some(until),
                _ => None,
            })
            .min()
    }

    /// Whether channel `c` has room for one more token from the running
    /// context (a rendezvous: and a consumer waits that no queued token
    /// will serve).
    fn room(&self, c: usize) -> bool {
        let ch = &self.channels[c];
        ch.held() < (ch.capacity as usize).max(1)
            && (ch.capacity != 0 || self.waiting_consumers(c) > ch.queued as usize)
    }

    /// Before the `CALL` at the pc is issued: reserves room for the token
    /// of each `SEND` right after the call's operands, so that the task
    /// that fills what the token stands for (e.g. a staging-buffer slot)
    /// is not issued before its token fits. `Ok(false)`: a channel is
    /// full and the context is parked.
    #[cold]
    #[inline(never)]
    fn reserve(
        &mut self,
        table: &Table<'_>,
        ins: &Instr,
        cx: &impl Context,
    ) -> Result<bool, ExpandError> {
        let Some(kernel) = wsp_ffi::lookup(ins.imm.get()) else {
            return Ok(true);
        };
        let end = self.m.pc + 1 + kernel.num_tensors as usize + kernel.num_scalars as usize;
        let sends = table.program().get(end..).unwrap_or(&[]);
        let sends = sends.iter().take_while(|s| s.op == OP_SEND);
        let mut wanted = 0u16;
        for send in sends.clone() {
            let c = send.imm.get() as usize % MAX_CHANNELS;
            if self.channels[c].closed {
                return Err(ExpandError::SendOnClosed { channel: c as u32 });
            }
            if wanted & (1 << c) == 0 && self.m.reserved & (1 << c) == 0 && !self.room(c) {
                self.park(Park::Full { channel: c as u8 }, cx);
                return Ok(false);
            }
            wanted |= 1 << c;
        }
        for_each_bit(wanted & !self.m.reserved, |c| {
            self.channels[c].reserved += 1
        });
        self.m.reserved |= wanted;
        self.events += 1;
        self.unpark(cx);
        Ok(true)
    }

    /// A `SEND` of the running context: `Ok(true)` if the token went in.
    #[inline(never)]
    fn send(&mut self, ins: &Instr, cx: &impl Context) -> Result<bool, ExpandError> {
        let c = ins.imm.get() as usize % MAX_CHANNELS;
        let value = self.read(ins.x[0]);
        if self.channels[c].closed {
            return Err(ExpandError::SendOnClosed { channel: c as u32 });
        }
        if self.m.reserved & (1 << c) != 0 {
            // Its call reserved the room.
            self.m.reserved &= !(1 << c);
            self.channels[c].reserved -= 1;
        } else if !self.room(c) {
            self.park(Park::Full { channel: c as u8 }, cx);
            return Ok(false);
        }
        let task = self.m.last_task;
        let ch = &mut self.channels[c];
        let at = (ch.head as usize + ch.queued as usize) % MAX_CHANNEL_CAPACITY;
        ch.tokens[at] = Token {
            value,
            task,
            ready_at: None,
        };
        ch.queued += 1;
        ch.sent += 1;
        self.events += 1;
        ch.high_water = ch.high_water.max(ch.held() as u8);
        let held = ch.high_water as u64;
        let stats = &mut self.channel_stats[0];
        stats.high_water = stats.high_water.max(held);
        self.unpark(cx);
        Ok(true)
    }

    /// Contexts other than the running one parked at a `CONSUME` of channel `c`.
    fn waiting_consumers(&self, c: usize) -> usize {
        (0..MAX_CONTEXTS)
            .filter(|&i| i != self.current && self.live & (1 << i) != 0)
            .filter(|&i| matches!(self.saved[i].park, Some(Park::Empty { channel, .. }) if channel as usize == c))
            .count()
    }

    /// A `CONSUME` of the running context takes a token: its value, or
    /// `Err(None)` when the channel is closed and drained, or
    /// `Err(Some(wait))` when it must wait (the context is parked).
    #[inline(never)]
    fn take(&mut self, c: usize, cx: &impl Context) -> Result<i64, Option<Wait>> {
        let ch = &mut self.channels[c % MAX_CHANNELS];
        let latency = ch.latency as u64;
        let closed = ch.closed;
        let channel = c as u8;
        let Some(token) = ch.front() else {
            if closed {
                return Err(None);
            }
            self.park(
                Park::Empty {
                    channel,
                    task: None,
                },
                cx,
            );
            return Err(Some(Wait::ChannelEmpty {
                channel,
                task: None,
            }));
        };
        if let Some(task) = token.task {
            if !cx.task_done(task) {
                let task = Some(task);
                self.park(Park::Empty { channel, task }, cx);
                return Err(Some(Wait::ChannelEmpty { channel, task }));
            }
        }
        if latency > 0 {
            let until = *token.ready_at.get_or_insert_with(|| cx.now() + latency);
            if cx.now() < until {
                self.park(Park::Latency { channel, until }, cx);
                return Err(Some(Wait::Latency { until }));
            }
        }
        let value = token.value;
        ch.head = ((ch.head as usize + 1) % MAX_CHANNEL_CAPACITY) as u8;
        ch.queued -= 1;
        ch.in_body += 1;
        self.events += 1;
        self.unpark(cx);
        Ok(value)
    }

    /// The pc of the next instruction.
    pub fn pc(&self) -> u32 {
        self.m.pc as u32
    }

    #[inline(always)]
    fn read(&self, r: u8) -> i64 {
        // Without a branch: `NO_REG` (and any other number past the
        // registers, which validation refuses) reads as 0.
        let value = self.m.regs[r as usize % SLOTS];
        if (r as usize) < MAX_REGS {
            value
        } else {
            0
        }
    }

    /// Runs instructions until a task, an event op, a wait, the end of the
    /// program, or [`STEP_BUDGET`] instructions. A step that waits changes
    /// nothing: stepping again retries the same instruction. `table` is
    /// the one the expander was made for ([`Expander::new`]).
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
    ///
    /// With processes, the step runs the live contexts in turn: a context
    /// that issued a task gives the next its turn on the next step; one
    /// that waits lets the others run; the step waits only when every
    /// live context waits and none has moved since the last looked.
    #[inline]
    pub fn step_into(
        &mut self,
        table: &Table<'_>,
        cx: &mut impl Context,
        spec: &mut TaskSpec,
    ) -> Result<Next, ExpandError> {
        if self.live == 1 {
            // One context (no process started, or all but one ended): no
            // turns to take, the hot path.
            match self.run(table, cx, spec)? {
                Next::Done => {
                    self.end_context();
                    if self.live == 0 {
                        return Ok(Next::Done);
                    }
                }
                // It started processes: they take their turns now (after
                // a task, `start_processes` set `rotate` for the next step).
                Next::Wait(_) if self.live > 1 => {}
                other => return Ok(other),
            }
        }
        if self.live == 0 {
            return Ok(Next::Done);
        }
        self.take_turns(table, cx, spec)
    }

    /// [`step_into`](Self::step_into) with several live contexts.
    #[inline(never)]
    fn take_turns(
        &mut self,
        table: &Table<'_>,
        cx: &mut impl Context,
        spec: &mut TaskSpec,
    ) -> Result<Next, ExpandError> {
        let mut tried = 0u32;
        let mut first = None;
        // Each turn runs at most STEP_BUDGET instructions; a step takes at
        // most this many turns (then yields), however the contexts wake
        // each other.
        for _ in 0..4 * MAX_CONTEXTS {
            if core::mem::take(&mut self.rotate) {
                if let Some(next) = self.next_live(0) {
                    self.switch(next);
                }
            }
            let (events, parked) = (self.events, self.m.park);
            let next = self.run_turn(table, cx, spec)?;
            if self.live == 1 && next != Next::Done {
                return Ok(next);
            }
            match next {
                Next::Task => {
                    self.rotate = self.live.count_ones() > 1;
                    return Ok(Next::Task);
                }
                Next::Done => {
                    self.end_context();
                    if self.live == 0 {
                        return Ok(Next::Done);
                    }
                    // Its end may close channels others wait on.
                    tried = 0;
                    first = None;
                }
                Next::Wait(wait) => {
                    // It changed a channel (sent, took, ended a body,
                    // closed, started processes), or it parked anew (a
                    // consumer now waiting lets a rendezvous sender go):
                    // the others may go on now.
                    if self.events != events || self.m.park != parked {
                        tried = 0;
                        first = None;
                    }
                    if self.m.park.is_none() {
                        self.m.park = Some(Park::Other);
                    }
                    tried |= 1 << self.current;
                    first.get_or_insert(wait);
                }
                other => return Ok(other),
            }
            match self.next_live(tried) {
                Some(next) => self.switch(next),
                // Every live context waits; `first` is set (the current
                // one waited, or the loop would have gone on).
                None => return Ok(Next::Wait(first.unwrap_or(Wait::Iteration))),
            }
        }
        Ok(Next::Yield)
    }

    /// [`run`](Self::run), not inlined: the turns of several contexts
    /// need not copy the interpreter.
    #[inline(never)]
    fn run_turn(
        &mut self,
        table: &Table<'_>,
        cx: &mut impl Context,
        spec: &mut TaskSpec,
    ) -> Result<Next, ExpandError> {
        self.run(table, cx, spec)
    }

    /// Runs the current context until a task, an event op, a wait, its
    /// end, or [`STEP_BUDGET`] instructions.
    #[inline(always)]
    fn run(
        &mut self,
        table: &Table<'_>,
        cx: &mut impl Context,
        spec: &mut TaskSpec,
    ) -> Result<Next, ExpandError> {
        let program = table.program();
        for _ in 0..STEP_BUDGET {
            let Some(ins) = program.get(self.m.pc) else {
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
                    Err(wait) => {
                        return Ok(Next::Wait(wait));
                    }
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
                        self.m.pc = ins.imm.get() as usize + 1;
                        continue;
                    }
                    // Validation nests loops at most `MAX_LOOP_DEPTH` deep.
                    let Some(frame) = self.m.frames.get_mut(self.m.depth) else {
                        unreachable!("loops nested deeper than MAX_LOOP_DEPTH");
                    };
                    *frame = Frame {
                        pc: self.m.pc as u32,
                        reg: ins.r,
                        count: a,
                        index: 0,
                        sequential: ins.x[1] == LOOP_SEQUENTIAL,
                        first: cx.next_task(),
                        channel: NO_CHANNEL,
                    };
                    self.m.depth += 1;
                    self.set(r, 0);
                }
                OP_END => {
                    // Validation matches every END with an open LOOP.
                    let Some(frame) = self
                        .m
                        .depth
                        .checked_sub(1)
                        .and_then(|d| self.m.frames.get(d))
                    else {
                        unreachable!("END without a LOOP");
                    };
                    if frame.index + 1 < frame.count {
                        // (A consume's frame counts as sequential, so
                        // that a parallel loop's END checks nothing more.)
                        if frame.sequential {
                            if frame.channel != NO_CHANNEL {
                                // A consume body ended: its token no longer
                                // counts against the channel; back to the
                                // CONSUME.
                                let c = frame.channel as usize % MAX_CHANNELS;
                                self.m.pc = frame.pc as usize;
                                let ch = &mut self.channels[c];
                                ch.in_body = ch.in_body.saturating_sub(1);
                                self.events += 1;
                                continue;
                            }
                            let done = if self.started {
                                cx.completed_since_in(frame.first, self.current as u8)
                            } else {
                                cx.completed_since(frame.first)
                            };
                            if !done {
                                return Ok(Next::Wait(Wait::Iteration));
                            }
                        }
                        let next = cx.next_task();
                        let frame = &mut self.m.frames[self.m.depth - 1];
                        frame.index += 1;
                        frame.first = next;
                        let (reg, index, pc) = (frame.reg as usize, frame.index, frame.pc);
                        self.set(reg, index);
                        self.m.pc = pc as usize + 1;
                        continue;
                    }
                    self.m.depth -= 1;
                }
                OP_WHEN if self.read(ins.x[0]) == 0 => {
                    self.m.pc = ins.imm.get() as usize;
                    continue;
                }
                OP_WHEN => {}
                OP_JUMP => {
                    self.m.pc = ins.imm.get() as usize;
                    continue;
                }
                OP_CALL => {
                    if self.m.sends != 0 {
                        return self.call_sending(table, ins, cx, spec);
                    }
                    self.m.pc = match self.call_fast(table, spec) {
                        Some(end) => end,
                        None => self.call(table, ins, spec)?,
                    };
                    return Ok(Next::Task);
                }
                OP_PROCESS => {
                    self.m.pc = self.start_processes(table, ins)?;
                    continue;
                }
                OP_PROCESS_END => return Ok(Next::Done),
                OP_SEND => {
                    // Not a guard: sending changes the channel.
                    let sent = self.send(ins, cx)?;
                    if !sent {
                        return Ok(Next::Wait(Wait::ChannelFull {
                            channel: ins.imm.get() as u8,
                        }));
                    }
                }
                OP_CONSUME => {
                    let c = ins.imm.get() as usize % MAX_CHANNELS;
                    let depth = self.m.depth;
                    // Back from its body: its frame is the innermost.
                    let again = depth
                        .checked_sub(1)
                        .and_then(|d| self.m.frames.get(d))
                        .is_some_and(|f| f.channel != NO_CHANNEL && f.pc as usize == self.m.pc);
                    match self.take(c, cx) {
                        Ok(value) => {
                            if again {
                                self.m.frames[depth - 1].index += 1;
                            } else {
                                // Validation nests loops and consumes at
                                // most `MAX_LOOP_DEPTH` deep.
                                let Some(frame) = self.m.frames.get_mut(depth) else {
                                    unreachable!("loops nested deeper than MAX_LOOP_DEPTH");
                                };
                                *frame = Frame {
                                    pc: self.m.pc as u32,
                                    reg: ins.r,
                                    count: i64::MAX,
                                    index: 0,
                                    sequential: true,
                                    first: cx.next_task(),
                                    channel: c as u8,
                                };
                                self.m.depth += 1;
                            }
                            self.set(r, value);
                        }
                        Err(None) => {
                            if again {
                                self.m.depth -= 1;
                            }
                            self.m.pc = ins.imm2.get() as usize + 1;
                            continue;
                        }
                        Err(Some(wait)) => {
                            return Ok(Next::Wait(wait));
                        }
                    }
                }
                OP_FREE => {
                    let t = ins.imm.get();
                    // Validation allows FREE of scratch tensors only, of
                    // which there are at most MAX_SCRATCH: a repeated FREE
                    // before the dispatcher takes it is one.
                    if !self.frees.contains(&t) {
                        let _ = self.frees.push(t);
                    }
                }
                OP_CLOSE => {
                    self.channels[ins.imm.get() as usize % MAX_CHANNELS].closed = true;
                    self.events += 1;
                }
                OP_RECORD | OP_WAIT => {
                    self.m.pc += 1;
                    return Ok(Next::Event {
                        record: ins.op == OP_RECORD,
                        stream: ins.x[0] as u32,
                        event: ins.x[1] as u32,
                    });
                }
                OP_DISPATCH => self.m.taskset = ins.imm.get() as u8,
                // OP_INPUT and OP_WINDOW: declarations, used by validation
                // and at launch.
                _ => {}
            }
            self.m.pc += 1;
        }
        Ok(Next::Yield)
    }

    /// A scratch tensor whose scope a `FREE` ended since the last call: it
    /// is dead after every task submitted before the step that returned.
    pub fn take_free(&mut self) -> Option<u32> {
        self.frees.pop()
    }

    /// Sets register `r` (validated to be one: `0 .. MAX_REGS`).
    #[inline(always)]
    fn set(&mut self, r: usize, value: i64) {
        if let Some(reg) = self.m.regs[..MAX_REGS].get_mut(r) {
            *reg = value;
        }
    }

    /// The element a `LOAD` reads, or what it must wait for. Not inlined:
    /// it runs once per loop, not per task, and inlined it would cost the
    /// per-task path registers.
    #[inline(never)]
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
    /// `None` where any check fails, leaving the program's state as it was
    /// (then `call` names the problem). It reads the call's operands from
    /// their decoded form ([`Site`]), writes the task in place and checks
    /// regions without building errors.
    #[inline(never)]
    fn call_fast(&mut self, table: &Table<'_>, spec: &mut TaskSpec) -> Option<usize> {
        let entry = &mut self.sites[site_of(self.m.pc)];
        if entry.is_none_or(|site| site.pc != self.m.pc) {
            *entry = Some(Site::decode(table, self.m.pc)?);
        }
        let site = entry.as_ref()?;
        let (kernel, end, writes) = (site.kernel, site.end, site.writes);
        let stream = match site.stream {
            Operand::Const(s) => s,
            Operand::Reg(r) => {
                let value = self.m.regs[r as usize % SLOTS];
                if !(0..=crate::abi::MAX_STREAMS as i64).contains(&value) {
                    return None;
                }
                value as u32
            }
        };
        let num_args = site.kernel.num_tensors as usize;
        if spec.args.len() != num_args {
            spec.args.clear();
            spec.args.resize(num_args, NO_ARG).ok()?;
        }
        // Whether the tiles and scalars differ from the last call of the
        // site that passed the contract (all bits 0: the same).
        let mut differ = !site.passed as u64;
        let mut tiles = [0u64; MAX_TENSOR_ARGS];
        // One straight run of code per rank when all arguments have the
        // same (the common case), else a choice per argument.
        let ok = match site.rank {
            1 => site.args_of::<1>(&self.m.regs, &mut spec.args, &mut tiles),
            2 => site.args_of::<2>(&self.m.regs, &mut spec.args, &mut tiles),
            3 => site.args_of::<3>(&self.m.regs, &mut spec.args, &mut tiles),
            4 => site.args_of::<4>(&self.m.regs, &mut spec.args, &mut tiles),
            _ => site.args_of::<0>(&self.m.regs, &mut spec.args, &mut tiles),
        };
        for (tile, passed) in tiles.iter().zip(&site.tiles) {
            differ |= tile ^ passed;
        }
        if !ok {
            return None;
        }
        let num_scalars = site.kernel.num_scalars as usize;
        if spec.scalars.len() != num_scalars {
            spec.scalars.clear();
            spec.scalars.resize(num_scalars, 0).ok()?;
        }
        for ((&r, scalar), passed) in site
            .scalars
            .iter()
            .zip(spec.scalars.iter_mut())
            .zip(&site.scalar_values)
        {
            *scalar = self.m.regs[r as usize % SLOTS] as u64;
            differ |= *scalar ^ passed;
        }
        if differ != 0 {
            // The contract depends on the kernel (the site's), the shapes
            // and the scalars only.
            let mut shapes = [NO_SHAPE; MAX_TENSOR_ARGS];
            for ((shape, &tile), arg) in shapes.iter_mut().zip(&tiles).zip(&site.args) {
                *shape = TileShape {
                    rows: (tile >> 32) as u32,
                    cols: tile as u32,
                    dtype: arg.dtype,
                };
            }
            site.kernel
                .check(&shapes[..num_args], spec.scalars())
                .ok()?;
            let site = self.sites[site_of(self.m.pc)].as_mut()?;
            site.tiles = tiles;
            for (passed, &value) in site.scalar_values.iter_mut().zip(spec.scalars.iter()) {
                *passed = value;
            }
            site.passed = true;
        }
        let frames = self.m.frames.get(..self.m.depth)?;
        if spec.loops.len() != frames.len() {
            spec.loops.clear();
            spec.loops.resize(frames.len(), 0).ok()?;
        }
        for (index, frame) in spec.loops.iter_mut().zip(frames) {
            *index = frame.index as u32;
        }
        spec.kernel = KernelRef {
            id: kernel.id,
            kind: kernel.kind,
        };
        spec.stream = stream;
        spec.pc = Some(self.m.pc as u32);
        spec.taskset = self.m.taskset;
        spec.context = self.current as u8;
        self.written |= writes;
        Some(end)
    }

    /// Writes the task of the `CALL` at the pc to `spec`; returns the pc
    /// after the call's operands. Checks each operand in turn and names the
    /// first that fails.
    #[cold]
    #[inline(never)]
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
        spec.pc = Some(self.m.pc as u32);
        spec.taskset = self.m.taskset;
        spec.context = self.current as u8;
        spec.loops.clear();
        for frame in &self.m.frames[..self.m.depth] {
            // At most `MAX_LOOP_DEPTH` frames are open (validation).
            let _ = spec.loops.push(frame.index as u32);
        }
        let (num_args, num_scalars) = (kernel.num_tensors as usize, kernel.num_scalars as usize);
        let first = self.m.pc + 1;
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
            *shape = check_region(tensor, &region).map_err(|(field, problem)| {
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
        for s in scalars {
            let _ = spec.scalars.push(self.read(s.x[0]) as u64);
        }
        kernel
            .check(&shapes[..num_args], spec.scalars())
            .map_err(ExpandError::Contract)?;
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

/// Which channel figures a park counts in: 0 for `CHANNEL_FULL`, 1 for
/// `CHANNEL_EMPTY`, none for other waits.
fn channel_kind(park: Option<Park>) -> Option<usize> {
    match park? {
        Park::Full { .. } => Some(0),
        Park::Empty { .. } | Park::Latency { .. } => Some(1),
        Park::Other => None,
    }
}

/// Calls `f` with the index of every set bit of `bits`.
fn for_each_bit(mut bits: u16, mut f: impl FnMut(usize)) {
    while bits != 0 {
        f(bits.trailing_zeros() as usize);
        bits &= bits - 1;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use zerocopy::little_endian::{U32, U64};

    /// A row-major tensor of `shape`.
    fn tensor(shape: &[u32]) -> TensorDesc {
        let (mut sizes, mut strides) = ([U32::new(0); MAX_RANK], [U32::new(0); MAX_RANK]);
        let mut stride = 1u32;
        for d in (0..shape.len()).rev() {
            sizes[d] = U32::new(shape[d]);
            strides[d] = U32::new(stride);
            stride = stride.wrapping_mul(shape[d]);
        }
        TensorDesc {
            name: [0; 16],
            dtype: U32::new(wsp_ffi::DTYPE_F32),
            rank: U32::new(shape.len() as u32),
            shape: sizes,
            strides,
            arena_offset: U64::new(0),
        }
    }

    /// Register values around the edges of small sizes and of u32.
    fn value() -> impl Strategy<Value = i64> {
        prop_oneof![
            8 => 0i64..10,
            1 => Just(-1),
            1 => Just(i64::MIN),
            1 => Just(i64::MAX),
            1 => Just(u32::MAX as i64),
            1 => Just(u32::MAX as i64 + 1),
            1 => any::<i64>(),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The fast path's region and tile checks accept exactly what the
        /// checked path does (each operand in `0 ..= u32::MAX`, then
        /// `check_region`), and build the same region and tile.
        #[test]
        fn decoded_arguments_agree_with_check_region(
            shape in prop::collection::vec(prop_oneof![1u32..8, Just(u32::MAX)], 1..=MAX_RANK),
            values in [value(), value(), value(), value(), value(), value()],
            none in [any::<bool>(); 6],
        ) {
            let rank = shape.len();
            let desc = tensor(&shape);
            // Operand `i` reads register `i`, or is `NO_REG`; validation
            // leaves `NO_REG` past the rank (and in x[4] below rank 2).
            let x = |i: usize| {
                let used = if i < MAX_RANK { i < rank } else { i == 5 || rank >= 2 };
                if none[i] || !used { NO_REG } else { i as u8 }
            };
            let ins = Instr {
                op: OP_ARG,
                r: Access::READ.bits() as u8,
                x: [x(0), x(1), x(2), x(3), x(4), x(5)],
                imm: U32::new(0),
                imm2: U32::new(0),
            };
            let mut regs = [0i64; SLOTS];
            regs[..6].copy_from_slice(&values);
            regs[ONE as usize] = 1;

            // The checked path's rules.
            let operand = |r: u8, none: i64| if r == NO_REG { none } else { values[r as usize] };
            let mut want = NO_ARG.region;
            let mut in_range = true;
            let mut set = |field: &mut u32, value: i64| {
                in_range &= u32::try_from(value).is_ok();
                *field = value as u32;
            };
            for d in 0..rank {
                set(&mut want.offset[d], operand(ins.x[d], 0));
            }
            set(&mut want.extent[rank - 1], operand(ins.x[5], 1));
            if rank >= 2 {
                set(&mut want.extent[rank - 2], operand(ins.x[4], 1));
            }
            let checked = check_region(&desc, &want);
            let accepts = in_range && checked.is_ok();

            let arg = SiteArg::decode(&ins, &desc).expect("a valid ARG decodes");
            let mut got = NO_ARG.region;
            let (ok, tile) = match rank {
                1 => arg.region_of::<1>(&regs, &mut got),
                2 => arg.region_of::<2>(&regs, &mut got),
                3 => arg.region_of::<3>(&regs, &mut got),
                _ => arg.region_of::<4>(&regs, &mut got),
            };
            prop_assert_eq!(ok, accepts, "region {:?} of shape {:?}", want, shape);
            if ok {
                prop_assert_eq!(got, want);
                let shape = checked.unwrap();
                prop_assert_eq!(((tile >> 32) as u32, tile as u32), (shape.rows, shape.cols));
            }
        }
    }
}
