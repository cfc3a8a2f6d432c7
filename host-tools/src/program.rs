//! The workload language: tensors, axes, loops and kernel calls, written as
//! Rust closures and lowered to the table's workload program, which the
//! device expands into tasks as it runs.
//!
//! ```no_run
//! # use host_tools::program::{Axis, Workload};
//! let mut w = Workload::new();
//! let x = w.tensor("x", &[64, 64]).unwrap();
//! let y = w.tensor("y", &[64, 64]).unwrap();
//! let add = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
//! w.parallel(Axis::Dense(4), |w, i| {
//!     let row = i * 16;
//!     w.call(add, &[x.tile(row.clone(), 0, 16, 64), x.tile(row.clone(), 0, 16, 64),
//!                   y.tile(row, 0, 16, 64)], &[]);
//! });
//! let table = w.finish().unwrap();
//! ```
//!
//! Axes: [`Axis::Dense`] (a size fixed now), [`Axis::DenseDyn`] (a symbol
//! bound at launch), [`Axis::Ragged`] (a length read from a tensor at run
//! time) and the sparse axis of [`Workload::select`] (CSR `indptr` and
//! `indices` tensors, e.g. the tokens an MoE router sent to an expert).
//! Loops: [`Workload::parallel`], [`Workload::sequential`] (iteration `i + 1`
//! after iteration `i` completed), [`Workload::select`] and
//! [`Workload::when`] / otherwise. Data-dependent values (a `Ragged` length,
//! a sparse row, a [`Expr::load`]) are read on the device only after the
//! tasks that write them have completed.
//!
//! Schedule: [`Workload::dispatch`] gives the calls in its body their own
//! dispatch policy and key (a taskset; the rest of the workload runs with
//! the run's policy), [`Workload::on_stream`] puts calls on a stream
//! ([`Workload::on_stream_of`]: one computed from the loop indices), and
//! [`Workload::window`] limits the tasks in flight. These travel in the
//! program, so the device honours them: none is dropped.
//!
//! ```no_run
//! # use host_tools::program::{Axis, Workload};
//! # use device_runtime::sched::{DispatchKey, PolicyKind};
//! # let mut w = Workload::new();
//! w.window(64);
//! w.dispatch(PolicyKind::WorkStealing, DispatchKey::Loop(0), |w| {
//!     w.parallel(Axis::Dense(8), |w, expert| { /* calls */ });
//! });
//! ```
//!
//! Pipelines (CSP): [`Workload::channel`] declares a bounded token
//! channel, [`Workload::process`] (or [`Workload::process_over`], one
//! replica per index of an axis) starts a body that runs concurrently
//! with the rest, [`Workload::send`] puts a token on a channel that stands
//! for the call it names (the last call of its process), and
//! [`Workload::consume`] runs a body once per token, after the token's
//! task ended. The device's rules are in `device_runtime::abi::program`.
//!
//! ```no_run
//! # use host_tools::program::{Axis, Workload};
//! # let mut w = Workload::new();
//! # let (x, stage) = (w.tensor("x", &[512, 64]).unwrap(), w.tensor("s", &[128, 64]).unwrap());
//! # let add = wsp_ffi::WspKernelId_WSP_KERNEL_ADD;
//! let tiles = w.channel("tiles", 2).unwrap();
//! w.process("loader", |w| {
//!     w.parallel(Axis::Dense(8), |w, i| {
//!         let slot = (i.clone() % 2) * 64;
//!         let load = w.call(add, &[x.tile(i.clone() * 64, 0, 64, 64), x.tile(i.clone() * 64, 0, 64, 64),
//!                                  stage.tile(slot, 0, 64, 64)], &[]);
//!         w.send(tiles, i, load);
//!     });
//! });
//! w.process("storer", |w| w.consume(tiles, |w, i| { /* calls reading stage[i % 2] */ }));
//! ```
//!
//! Every error is found when the workload is lowered ([`Workload::finish`])
//! and says why: a loop nested too deep, more live values than the
//! program machine's registers, a call with the wrong arguments, or
//! anything table validation refuses.

use std::ops::{Add, Div, Mul, Rem, Sub};

use device_runtime::abi::program::*;
use device_runtime::abi::TASK_WINDOW;
use device_runtime::abi::{Instr, Table, MAX_RANK};
use device_runtime::sched::{DispatchKey, PolicyKind, Schedule};
use wsp_ffi::DTYPE_I32;
use zerocopy::little_endian::U32;

use crate::table::{Arena, BuildError, TableBuilder, TensorId, TensorLayout};
use crate::task_count::{MAX_HOST_ITERATIONS, MAX_HOST_TASKS};

/// A value computed on the device: constants, loop indices, symbols,
/// elements of i32 tensors, and arithmetic on them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expr {
    /// A number fixed when the table is built.
    Const(i64),
    /// The index of the loop with this id.
    Var(u32),
    /// Launch-bound symbol `n`.
    Symbol(u32),
    /// An element of an i32 tensor.
    Load(TensorId, Vec<Expr>),
    /// A binary operation, by its program opcode (`OP_ADD` ..= `OP_EQ` of
    /// `device_runtime::abi::program`), on two values.
    Bin(u8, Box<Expr>, Box<Expr>),
}

impl Expr {
    /// The element of i32 tensor `tensor` at `index` (one per dimension).
    pub fn load(tensor: TensorId, index: Vec<Expr>) -> Expr {
        Expr::Load(tensor, index)
    }
    fn bin(op: u8, a: Expr, b: Expr) -> Expr {
        Expr::Bin(op, Box::new(a), Box::new(b))
    }
    /// The smaller of `self` and `other`.
    pub fn min(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(OP_MIN, self, other.into())
    }
    /// The larger of `self` and `other`.
    pub fn max(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(OP_MAX, self, other.into())
    }
    /// 1 if `self < other`, else 0.
    pub fn lt(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(OP_LT, self, other.into())
    }
    /// 1 if `self <= other`, else 0.
    pub fn le(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(OP_LE, self, other.into())
    }
    /// 1 if `self == other`, else 0.
    pub fn equals(self, other: impl Into<Expr>) -> Expr {
        Expr::bin(OP_EQ, self, other.into())
    }
}

impl From<i64> for Expr {
    fn from(v: i64) -> Expr {
        Expr::Const(v)
    }
}
impl From<u32> for Expr {
    fn from(v: u32) -> Expr {
        Expr::Const(v as i64)
    }
}
impl From<i32> for Expr {
    fn from(v: i32) -> Expr {
        Expr::Const(v as i64)
    }
}

macro_rules! binop {
    ($trait:ident, $method:ident, $op:expr) => {
        impl<T: Into<Expr>> $trait<T> for Expr {
            type Output = Expr;
            fn $method(self, rhs: T) -> Expr {
                Expr::bin($op, self, rhs.into())
            }
        }
    };
}
binop!(Add, add, OP_ADD);
binop!(Sub, sub, OP_SUB);
binop!(Mul, mul, OP_MUL);
binop!(Div, div, OP_DIV);
binop!(Rem, rem, OP_REM);

/// A region of a tensor a call passes: offsets per dimension and the extent
/// of the last two (the tile).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// The tensor the region lies in.
    pub tensor: TensorId,
    /// First index of the region per dimension, outermost first.
    pub offset: Vec<Expr>,
    /// Extent of the second-to-last dimension (tile height; 1 for a rank-1
    /// tensor).
    pub rows: Expr,
    /// Extent of the last dimension (tile width).
    pub cols: Expr,
}

impl TensorId {
    /// A `rows` x `cols` tile at (`row`, `col`) of a 2-D tensor.
    pub fn tile(
        self,
        row: impl Into<Expr>,
        col: impl Into<Expr>,
        rows: impl Into<Expr>,
        cols: impl Into<Expr>,
    ) -> Region {
        Region {
            tensor: self,
            offset: vec![row.into(), col.into()],
            rows: rows.into(),
            cols: cols.into(),
        }
    }
}

/// The iteration space of a loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Axis {
    /// `0 .. n`, fixed when the table is built.
    Dense(u32),
    /// `0 .. symbol`, the symbol bound at launch and at most `max`.
    DenseDyn {
        /// The symbol number that gives the count.
        symbol: u32,
        /// The most iterations any binding may ask for.
        max: u32,
    },
    /// `0 .. count`: a count computed on the device from the loop
    /// indices, symbols and data the program read (e.g. a request's KV
    /// chunks, `(len + chunk - 1) / chunk`), at most `max`.
    Count {
        /// The number of iterations.
        count: Expr,
        /// The most iterations any value of `count` may ask for.
        max: u32,
    },
    /// `0 .. lengths[at]`: a length read on the device (after the task
    /// that writes it completed), at most `max`.
    Ragged {
        /// The i32 tensor holding the lengths.
        lengths: TensorId,
        /// The element of `lengths` to read, one index per dimension.
        at: Vec<Expr>,
        /// The most iterations any length may ask for.
        max: u32,
    },
}

/// Loop kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopKind {
    /// Every iteration is expanded without waiting for the others' tasks.
    Parallel,
    /// Iteration `i + 1` is expanded after every task of iteration `i`
    /// completed.
    Sequential,
}

#[derive(Clone, Debug)]
enum Node {
    Loop {
        kind: LoopKind,
        var: u32,
        count: Expr,
        max: u32,
        body: Vec<Node>,
    },
    When {
        cond: Expr,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
    Call {
        kernel: u32,
        stream: u8,
        /// The stream as a value computed on the device (then `stream` is 0).
        stream_of: Option<Expr>,
        args: Vec<Region>,
        scalars: Vec<Expr>,
    },
    Event {
        record: bool,
        stream: u8,
        event: u8,
    },
    /// A value computed once here and held in a register until the end of
    /// the enclosing body.
    Let {
        var: u32,
        value: Expr,
    },
    /// Calls in `body` belong to taskset `set` (1 ..), whose schedule is
    /// `Workload::tasksets[set - 1]`.
    Dispatch {
        set: u8,
        body: Vec<Node>,
    },
    /// A process (`Workload::processes[index]`): `count` replicas (at
    /// most `max`) of `body`, the replica index in `var` (`None`: one,
    /// no index).
    Process {
        index: usize,
        var: Option<u32>,
        count: Expr,
        max: u32,
        body: Vec<Node>,
    },
    /// A token on `channel` with `value`.
    Send {
        channel: u32,
        value: Expr,
    },
    /// `body` once per token of `channel`, its value in `var`.
    Consume {
        channel: u32,
        var: u32,
        body: Vec<Node>,
    },
    /// Closes `channel`.
    Close {
        channel: u32,
    },
    /// Ends scratch tensor `tensor`'s scope.
    Free {
        tensor: u32,
    },
}

/// A token channel of a workload ([`Workload::channel`]): its number in
/// the program (`0 .. MAX_CHANNELS`, in declaration order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Channel(pub u32);

/// A call a workload made ([`Workload::call`]): what a
/// [`Workload::send`] names as the task its token stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Call(u64);

/// A declared channel: its name, capacity and latency.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChannelDecl {
    /// The name it was declared with.
    pub name: String,
    /// Tokens it holds at most (0: a rendezvous).
    pub depth: u32,
    /// Clock ticks between a token's task completing and its consumer
    /// going on.
    pub latency: u32,
}

/// The names of a workload's channels and processes, as the device
/// reports them: channels by number, processes by the pc of their
/// `PROCESS` instruction (plus a replica index).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CspNames {
    /// Channel `c` is `channels[c]`.
    pub channels: Vec<ChannelDecl>,
    /// (pc of the `PROCESS`, the process's name), in program order; empty
    /// until [`Workload::finish`] has lowered the program.
    pub processes: Vec<(usize, String)>,
}

impl CspNames {
    /// The name of channel `c`, or `channel c` if it has none.
    pub fn channel(&self, c: u32) -> String {
        self.channels
            .get(c as usize)
            .map_or_else(|| format!("channel {c}"), |d| d.name.clone())
    }

    /// What the numbers of a channel deadlock report stand for: the
    /// processes (by the pc of their `PROCESS`) and channels it names,
    /// one line; `None` if it names none this workload has names for.
    pub fn legend(&self, report: &device_runtime::channel::ChannelReport) -> Option<String> {
        let mut parts = Vec::new();
        let mut seen = Vec::new();
        for p in report.processes.iter().flatten() {
            if let Some(pc) = p.process {
                let pc = pc as usize;
                if let Some((_, name)) = self.processes.iter().find(|(at, _)| *at == pc) {
                    if !seen.contains(&pc) {
                        seen.push(pc);
                        parts.push(format!("process of pc {pc} is `{name}`"));
                    }
                }
            }
        }
        for c in report.channels.iter().flatten() {
            if let Some(d) = self.channels.get(c.channel as usize) {
                parts.push(format!("channel {} is `{}`", c.channel, d.name));
            }
        }
        (!parts.is_empty()).then(|| format!("where {}", parts.join(", ")))
    }

    /// The name of the process whose `PROCESS` is at `pc`, or `process at
    /// pc N` if none is.
    pub fn process(&self, pc: usize) -> String {
        self.processes
            .iter()
            .find(|(at, _)| *at == pc)
            .map_or_else(|| format!("process at pc {pc}"), |(_, n)| n.clone())
    }
}

/// Why a workload cannot be lowered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LowerError {
    /// The table builder refused a tensor, kernel or task.
    Build(BuildError),
    /// More values live at once than the program machine has registers.
    TooManyRegisters {
        /// The program machine's registers.
        max: usize,
    },
    /// Loops nested deeper than the device's expander keeps.
    TooDeep {
        /// The deepest nesting the expander keeps.
        max: usize,
    },
    /// A call with the wrong number of arguments or scalars.
    Call {
        /// The kernel's registry name.
        kernel: String,
        /// What is wrong with the call.
        why: String,
    },
    /// A load from a tensor that is not i32, or with the wrong index count.
    Load {
        /// The tensor's name.
        tensor: String,
        /// What is wrong with the load.
        why: String,
    },
    /// A symbol number past the device's `MAX_SYMBOLS`.
    Symbol {
        /// The symbol number used.
        symbol: u32,
        /// The device's `MAX_SYMBOLS`.
        max: usize,
    },
    /// A stream or event out of range.
    Stream(String),
    /// A loop variable used outside its loop.
    OutOfScope {
        /// The loop's id.
        var: u32,
    },
    /// The program is longer than the device accepts.
    TooLong {
        /// Instructions the program lowered to.
        instructions: usize,
        /// The most the device accepts.
        max: usize,
    },
    /// A load from one more distinct tensor than the device tracks
    /// (`MAX_DATA_TENSORS`): refused here, where the tensor has a name,
    /// rather than by the device's validation, which names a pc.
    TooManyDataTensors {
        /// The first tensor past the limit, in program order.
        tensor: String,
        /// The device's `MAX_DATA_TENSORS`.
        max: usize,
    },
    /// A schedule the device cannot honour (too many tasksets, a task
    /// window out of range).
    Schedule(String),
    /// A channel that cannot be declared or used as written.
    Channel {
        /// The channel's name.
        channel: String,
        /// What is wrong.
        why: String,
    },
    /// A process that cannot be started as written.
    Process {
        /// The process's name.
        process: String,
        /// What is wrong.
        why: String,
    },
    /// A send whose token would not stand for the call it names.
    Send {
        /// The channel's name.
        channel: String,
        /// What is wrong.
        why: String,
    },
    /// The table the workload lowers to does not validate.
    Invalid(String),
    /// [`Workload::finish`] called from inside a body being built (a
    /// loop's, branch's, taskset's or process's closure).
    FinishInBody,
    /// [`Workload::free`] of a tensor that is not a scratch tensor (its
    /// name): arena tensors hold their bytes for the whole run.
    FreeNotScratch(String),
}

impl std::fmt::Display for LowerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LowerError::Build(e) => write!(f, "{e}"),
            LowerError::TooManyRegisters { max } => write!(
                f,
                "a call or expression needs more than the program machine's {max} registers; split it"
            ),
            LowerError::TooDeep { max } => write!(f, "loops nested deeper than {max}"),
            LowerError::Call { kernel, why } => write!(f, "call of {kernel}: {why}"),
            LowerError::Load { tensor, why } => write!(f, "load from {tensor}: {why}"),
            LowerError::Symbol { symbol, max } => {
                write!(f, "symbol {symbol}; symbols are 0 to {}", max - 1)
            }
            LowerError::Stream(why) => f.write_str(why),
            LowerError::OutOfScope { var } => {
                write!(f, "loop variable {var} used outside its loop")
            }
            LowerError::TooLong { instructions, max } => write!(
                f,
                "the program has {instructions} instructions, at most {max}"
            ),
            LowerError::TooManyDataTensors { tensor, max } => write!(
                f,
                "load from {tensor}: a program LOADs from at most {max} distinct tensors \
                 (MAX_DATA_TENSORS) and this is one more"
            ),
            LowerError::Schedule(why) => write!(f, "schedule: {why}"),
            LowerError::Channel { channel, why } => write!(f, "channel {channel}: {why}"),
            LowerError::Process { process, why } => write!(f, "process {process}: {why}"),
            LowerError::Send { channel, why } => write!(f, "send on channel {channel}: {why}"),
            LowerError::Invalid(why) => write!(f, "the lowered table is invalid: {why}"),
            LowerError::FreeNotScratch(name) => write!(
                f,
                "free({name}): `{name}` is an arena tensor; only scratch tensors are freed"
            ),
            LowerError::FinishInBody => f.write_str(
                "finish called inside a loop, branch, dispatch or process body; \
                 call it once the body closures have returned",
            ),
        }
    }
}

impl std::error::Error for LowerError {}

impl From<BuildError> for LowerError {
    fn from(e: BuildError) -> Self {
        LowerError::Build(e)
    }
}

/// A workload under construction: tensors, optional plain tasks (through
/// [`Workload::builder`]) and the program.
pub struct Workload {
    builder: TableBuilder,
    /// Open bodies: the program's, then one per loop or branch being built.
    bodies: Vec<Vec<Node>>,
    next_var: u32,
    inputs: Vec<TensorId>,
    stream: u8,
    stream_of: Option<Expr>,
    /// The schedules of tasksets 1 .., in order of first use.
    tasksets: Vec<Schedule>,
    window: Option<u32>,
    /// Declared channels, by number.
    channels: Vec<ChannelDecl>,
    /// Process names, by `Node::Process::index`.
    processes: Vec<String>,
    /// (pc of each `PROCESS`, its name), set by `finish`.
    process_pcs: Vec<(usize, String)>,
    /// Whether a process body is being built.
    in_process: bool,
    /// The last call of each open context (the program's, then the
    /// process's being built), for `send`'s check.
    last_call: Vec<Option<Call>>,
    next_call: u64,
    /// The first error found while building (returned by `finish`).
    error: Option<LowerError>,
}

impl Default for Workload {
    fn default() -> Self {
        Self::new()
    }
}

impl Workload {
    /// An empty workload: no tensors, tasks or program.
    pub fn new() -> Self {
        Workload {
            builder: TableBuilder::new(),
            bodies: vec![Vec::new()],
            next_var: 0,
            inputs: Vec::new(),
            stream: 0,
            stream_of: None,
            tasksets: Vec::new(),
            window: None,
            channels: Vec::new(),
            processes: Vec::new(),
            process_pcs: Vec::new(),
            in_process: false,
            last_call: vec![None],
            next_call: 0,
            error: None,
        }
    }

    /// The table builder, for tensors' layouts and plain tasks (which run
    /// before the program).
    pub fn builder(&mut self) -> &mut TableBuilder {
        &mut self.builder
    }

    /// The layout of a tensor of this workload (panics on an id another
    /// workload returned).
    pub fn layout(&self, tensor: TensorId) -> &TensorLayout {
        self.builder.layout(tensor)
    }

    /// The layouts of all its tensors, in declaration order.
    pub fn layouts(&self) -> &[TensorLayout] {
        self.builder.layouts()
    }

    /// Bytes of data arena the tensors need.
    pub fn arena_size(&self) -> u64 {
        self.builder.arena_size()
    }

    /// Declares an f32 tensor.
    pub fn tensor(&mut self, name: &str, shape: &[u32]) -> Result<TensorId, LowerError> {
        Ok(self.builder.tensor(name, shape)?)
    }

    /// Declares an i32 tensor (lengths, indices).
    pub fn tensor_i32(&mut self, name: &str, shape: &[u32]) -> Result<TensorId, LowerError> {
        Ok(self.builder.tensor_i32(name, shape)?)
    }

    /// Declares an f32 *scratch* tensor: an intermediate with no arena
    /// bytes, usable in calls like any tensor. Its storage comes from the
    /// heap ring ([`Workload::heap`]) when the first call that writes it is
    /// submitted, and returns once every call submitted before its
    /// [`Workload::free`] has retired (without a `free`, at the end of the
    /// run). The host cannot read or write it; `load` cannot read it.
    pub fn scratch(&mut self, name: &str, shape: &[u32]) -> Result<TensorId, LowerError> {
        Ok(self.builder.scratch(name, shape)?)
    }

    /// Gives the workload a heap ring of `bytes` (a multiple of 64) for
    /// its scratch tensors: the arena's last `bytes` bytes. The scratch
    /// tensors live at once (between their first writer and their `free`)
    /// must fit in it, else the run ends with a report naming the tensor.
    /// A workload with a heap ring and no scratch tensor is refused by
    /// [`Workload::finish`]: nothing would use the ring.
    pub fn heap(&mut self, bytes: u64) -> Result<(), LowerError> {
        Ok(self.builder.heap(bytes)?)
    }

    /// Ends `tensor`'s scope here (a scratch tensor): its contents are
    /// dead after the calls before this point, its storage returns to the
    /// heap ring once they have retired, and the next call that writes it
    /// takes new storage. In a loop, free a layer's scratch tensors at the
    /// end of its body so that the next iteration reuses the ring.
    pub fn free(&mut self, tensor: TensorId) {
        if !self.declared(tensor) {
            return;
        }
        if !self.builder.layout(tensor).is_scratch() {
            let name = self.builder.layout(tensor).name.clone();
            return self.fail(LowerError::FreeNotScratch(name));
        }
        self.push(Node::Free { tensor: tensor.0 });
    }

    /// Declares that the host writes `tensor`'s data before launch, so the
    /// program may read it before any task writes it.
    pub fn input(&mut self, tensor: TensorId) {
        if self.declared(tensor) {
            self.inputs.push(tensor);
        }
    }

    /// Whether `tensor` was declared on this workload; if not, keeps the
    /// error for `finish`.
    fn declared(&mut self, tensor: TensorId) -> bool {
        let known = (tensor.0 as usize) < self.builder.layouts().len();
        if !known {
            self.fail(BuildError::UnknownTensor(tensor.0).into());
        }
        known
    }

    fn push(&mut self, node: Node) {
        self.bodies.last_mut().expect("the program body").push(node);
    }

    fn body(&mut self, build: impl FnOnce(&mut Self)) -> Vec<Node> {
        self.bodies.push(Vec::new());
        build(self);
        self.bodies.pop().expect("pushed above")
    }

    fn looped(&mut self, kind: LoopKind, axis: Axis, body: impl FnOnce(&mut Self, Expr)) {
        let var = self.next_var;
        self.next_var += 1;
        let (count, max) = match axis {
            Axis::Dense(n) => (Expr::Const(n as i64), n),
            Axis::DenseDyn { symbol, max } => (Expr::Symbol(symbol), max),
            Axis::Ragged { lengths, at, max } => (Expr::Load(lengths, at), max),
            Axis::Count { count, max } => (count, max),
        };
        let body = self.body(|w| body(w, Expr::Var(var)));
        self.push(Node::Loop {
            kind,
            var,
            count,
            max,
            body,
        });
    }

    /// A parallel loop over `axis`: `body` gets the index.
    pub fn parallel(&mut self, axis: Axis, body: impl FnOnce(&mut Self, Expr)) {
        self.looped(LoopKind::Parallel, axis, body)
    }

    /// A sequential loop over `axis`: iteration `i + 1` starts after every
    /// task of iteration `i` completed.
    pub fn sequential(&mut self, axis: Axis, body: impl FnOnce(&mut Self, Expr)) {
        self.looped(LoopKind::Sequential, axis, body)
    }

    /// A select over row `row` of a sparse (CSR) axis: for each `j` in
    /// `indptr[row] .. indptr[row + 1]` (at most `max`), `body` gets `j` and
    /// `indices[j]`. `indptr` is `[1, rows + 1]` and `indices` `[1, nnz]`,
    /// both i32.
    pub fn select(
        &mut self,
        indptr: TensorId,
        indices: TensorId,
        row: Expr,
        max: u32,
        body: impl FnOnce(&mut Self, Expr, Expr),
    ) {
        // The row's start, loaded once (its end only for the count).
        let start = self.let_(Expr::load(indptr, vec![Expr::Const(0), row.clone()]));
        let end = Expr::load(indptr, vec![Expr::Const(0), row + 1]);
        let var = self.next_var;
        self.next_var += 1;
        let j = start.clone() + Expr::Var(var);
        let value = Expr::load(indices, vec![Expr::Const(0), j.clone()]);
        let body = self.body(|w| body(w, j, value));
        self.push(Node::Loop {
            kind: LoopKind::Parallel,
            var,
            count: end - start,
            max,
            body,
        });
    }

    /// `then` if `cond` is not 0, else `otherwise` (e.g. a kernel tier
    /// chosen by sequence length).
    pub fn when(
        &mut self,
        cond: Expr,
        then: impl FnOnce(&mut Self),
        otherwise: impl FnOnce(&mut Self),
    ) {
        let then = self.body(then);
        let otherwise = self.body(otherwise);
        self.push(Node::When {
            cond,
            then,
            otherwise,
        });
    }

    /// Computes `value` once, here, and returns a name for it that the rest
    /// of the enclosing body (and the loops in it) can use: hoist a value
    /// that does not change in an inner loop out of it. Each `let` holds a
    /// register until the end of its body.
    pub fn let_(&mut self, value: Expr) -> Expr {
        let var = self.next_var;
        self.next_var += 1;
        self.push(Node::Let { var, value });
        Expr::Var(var)
    }

    /// Calls made in `body` go on `stream` (1 ..= 8): issued in order; 0
    /// puts them on no stream (as calls outside any `on_stream` are), also
    /// inside another `on_stream`'s body. A stream past 8 is an error from
    /// `finish`, whether or not `body` makes a call.
    pub fn on_stream(&mut self, stream: u8, body: impl FnOnce(&mut Self)) {
        if stream as usize > device_runtime::abi::MAX_STREAMS {
            self.fail(LowerError::Stream(format!(
                "on_stream({stream}): streams are 1 to {} (or 0 for none)",
                device_runtime::abi::MAX_STREAMS
            )));
        }
        let outer = std::mem::replace(&mut self.stream, stream);
        let outer_of = self.stream_of.take();
        body(self);
        self.stream = outer;
        self.stream_of = outer_of;
    }

    /// Calls made in `body` go on the stream `stream` evaluates to on the
    /// device (1 ..= 8, or 0 for none), e.g. `b % 4 + 1` for a stream per
    /// batch: the stream key. A value out of range ends the run with an
    /// error naming the call.
    pub fn on_stream_of(&mut self, stream: Expr, body: impl FnOnce(&mut Self)) {
        let outer = std::mem::replace(&mut self.stream, 0);
        let outer_of = self.stream_of.replace(stream);
        body(self);
        self.stream = outer;
        self.stream_of = outer_of;
    }

    /// Calls made in `body` are dispatched by `policy` with `key` (their
    /// own taskset, with its own policy state), instead of the run's policy:
    /// e.g. work stealing for a skewed MoE expert loop, affinity by batch
    /// for attention. Bodies with the same policy and key share a taskset;
    /// a workload has at most 7 (`MAX_TASKSETS - 1`). Whether the build
    /// has the policy is checked at launch: a policy it left out is an
    /// error then, never a silent fallback. Round-robin and the shared
    /// queue place tasks without a key: with them, a key other than
    /// [`DispatchKey::TaskIndex`] is an error from `finish` (it would be
    /// ignored), as is a key naming a scalar, argument, dimension or loop
    /// level no task can have.
    pub fn dispatch(&mut self, policy: PolicyKind, key: DispatchKey, body: impl FnOnce(&mut Self)) {
        let schedule = Schedule { policy, key };
        if !policy.uses_key() && key != DispatchKey::TaskIndex {
            self.fail(LowerError::Schedule(format!(
                "dispatch key {key}: {} places tasks without a key, so it would be ignored \
                 (use a key-based policy, or DispatchKey::TaskIndex)",
                policy.name()
            )));
        } else if Schedule::decode(schedule.encode()).is_none() {
            self.fail(LowerError::Schedule(format!(
                "dispatch key {key}: no task has it (a task has scalars 0 to {}, \
                 tensor arguments 0 to {}, dimensions 0 to {} and loop levels 0 to {})",
                device_runtime::abi::MAX_SCALARS - 1,
                device_runtime::abi::MAX_TENSOR_ARGS - 1,
                MAX_RANK - 1,
                MAX_LOOP_DEPTH - 1
            )));
        }
        let set = match self.tasksets.iter().position(|s| *s == schedule) {
            Some(i) => i + 1,
            None => {
                self.tasksets.push(schedule);
                self.tasksets.len()
            }
        };
        // Past MAX_TASKSETS, the error comes from `finish`.
        let set = set.min(u8::MAX as usize) as u8;
        let body = self.body(body);
        self.push(Node::Dispatch { set, body });
    }

    /// The workload's task window: at most `tasks` tasks submitted and not
    /// yet retired (1 ..= the runtime's `TASK_WINDOW`), e.g. to bound the
    /// memory a layer's intermediate tiles take, or to keep expansion close
    /// behind execution. A launch may override it
    /// (`RunOptions::window`, `wsp run --window`).
    pub fn window(&mut self, tasks: u32) {
        self.window = Some(tasks);
    }

    /// Records `event` on `stream` here.
    pub fn record_event(&mut self, stream: u8, event: u8) {
        self.push(Node::Event {
            record: true,
            stream,
            event,
        });
    }

    /// Makes `stream`'s next call wait for `event`.
    pub fn wait_event(&mut self, stream: u8, event: u8) {
        self.push(Node::Event {
            record: false,
            stream,
            event,
        });
    }

    /// A call of kernel `kernel` on `args` (in the kernel's signature
    /// order; access modes come from the registry) with `scalars`. The
    /// handle it returns is what a [`Workload::send`] right after it names
    /// (ignore it otherwise).
    pub fn call(&mut self, kernel: u32, args: &[Region], scalars: &[Expr]) -> Call {
        self.push(Node::Call {
            kernel,
            stream: self.stream,
            stream_of: self.stream_of.clone(),
            args: args.to_vec(),
            scalars: scalars.to_vec(),
        });
        let call = Call(self.next_call);
        self.next_call += 1;
        *self.last_call.last_mut().expect("the program's context") = Some(call);
        call
    }

    /// Keeps the first error found while building, for `finish`.
    pub(crate) fn fail(&mut self, e: LowerError) {
        self.error.get_or_insert(e);
    }

    /// Whether the program's top level is being built (not a loop,
    /// branch, taskset or process body).
    fn at_top_level(&self) -> bool {
        self.bodies.len() == 1 && !self.in_process
    }

    /// Declares a token channel holding at most `depth` tokens (0: a
    /// rendezvous, the sender waits for the consumer; at most
    /// `MAX_CHANNEL_CAPACITY`), with latency 0. Channels are declared at
    /// the top level, at most `MAX_CHANNELS` per workload, each with its
    /// own name.
    pub fn channel(&mut self, name: &str, depth: u32) -> Result<Channel, LowerError> {
        self.channel_with_latency(name, depth, 0)
    }

    /// As [`Workload::channel`], with a latency: a consumer goes on
    /// `latency_ticks` clock ticks (at most `MAX_CHANNEL_LATENCY`) after
    /// the task a token stands for completed.
    pub fn channel_with_latency(
        &mut self,
        name: &str,
        depth: u32,
        latency_ticks: u32,
    ) -> Result<Channel, LowerError> {
        let bad = |why: String| LowerError::Channel {
            channel: name.to_string(),
            why,
        };
        if !self.at_top_level() {
            return Err(bad(
                "declared inside a loop, branch, dispatch or process; channels are declared at the top level"
                    .into(),
            ));
        }
        if self.channels.iter().any(|c| c.name == name) {
            return Err(bad("declared twice".into()));
        }
        if self.channels.len() == MAX_CHANNELS {
            return Err(bad(format!(
                "one channel too many: a workload has at most {MAX_CHANNELS}"
            )));
        }
        if depth as usize > MAX_CHANNEL_CAPACITY {
            return Err(bad(format!(
                "depth {depth}; a channel holds 0 to {MAX_CHANNEL_CAPACITY} tokens"
            )));
        }
        if latency_ticks > MAX_CHANNEL_LATENCY {
            return Err(bad(format!(
                "latency {latency_ticks}; at most {MAX_CHANNEL_LATENCY} ticks"
            )));
        }
        self.channels.push(ChannelDecl {
            name: name.to_string(),
            depth,
            latency: latency_ticks,
        });
        Ok(Channel(self.channels.len() as u32 - 1))
    }

    /// A process called `name`: `body` runs as a context of its own,
    /// concurrently with the rest of the program (which goes on after it at
    /// once) and with the other processes. Processes start at the top
    /// level; one started elsewhere is an error from `finish`.
    pub fn process(&mut self, name: &str, body: impl FnOnce(&mut Self)) {
        self.start_process(name, None, |w, _| body(w));
    }

    /// `axis`'s size of replicas of a process called `name` (at most
    /// `MAX_PROCESSES`, e.g. one compute process per core pair): `body`
    /// gets the replica index.
    pub fn process_over(&mut self, name: &str, axis: Axis, body: impl FnOnce(&mut Self, Expr)) {
        self.start_process(name, Some(axis), body);
    }

    fn start_process(
        &mut self,
        name: &str,
        axis: Option<Axis>,
        body: impl FnOnce(&mut Self, Expr),
    ) {
        let top = self.at_top_level();
        let (var, count, max) = match axis {
            None => (None, Expr::Const(1), 1),
            Some(axis) => {
                let var = self.next_var;
                self.next_var += 1;
                let (count, max) = match axis {
                    Axis::Dense(n) => (Expr::Const(n as i64), n),
                    Axis::DenseDyn { symbol, max } => (Expr::Symbol(symbol), max),
                    Axis::Ragged { lengths, at, max } => (Expr::Load(lengths, at), max),
                    Axis::Count { count, max } => (count, max),
                };
                (Some(var), count, max)
            }
        };
        let bad = |why: String| LowerError::Process {
            process: name.to_string(),
            why,
        };
        if !top {
            self.fail(bad(
                "started inside a loop, branch, dispatch or another process; processes start at the top level"
                    .into(),
            ));
        } else if max == 0 || max as usize > MAX_PROCESSES {
            self.fail(bad(format!(
                "{max} replicas at most; a process has 1 to {MAX_PROCESSES}"
            )));
        }
        let outer = std::mem::replace(&mut self.in_process, true);
        self.last_call.push(None);
        let index_expr = var.map_or(Expr::Const(0), Expr::Var);
        let body = self.body(|w| body(w, index_expr));
        self.last_call.pop();
        self.in_process = outer;
        let index = self.processes.len();
        self.processes.push(name.to_string());
        self.push(Node::Process {
            index,
            var,
            count,
            max,
            body,
        });
    }

    /// The name of `ch`, or an error if this workload did not declare it.
    fn channel_name(&self, ch: Channel) -> Result<String, LowerError> {
        self.channels
            .get(ch.0 as usize)
            .map(|c| c.name.clone())
            .ok_or(LowerError::Channel {
                channel: format!("number {}", ch.0),
                why: "not declared by this workload".into(),
            })
    }

    /// Sends a token with `value` on `ch`: "the task of `after` has
    /// completed". `after` must be the last call this process (or the
    /// program's top level) made before the send, since the device's token
    /// stands for the last task the process issued; otherwise `finish`
    /// says so. The process closes `ch` when it ends.
    ///
    /// A send made right after its call (nothing between them) is lowered
    /// so that the device reserves the token's room before it issues the
    /// call's task: a loader that fills staging slot `i % slots` then
    /// cannot overwrite a slot whose token is still in the channel, as
    /// long as the channel's depth is at most the slots. `value` is then
    /// computed before the call.
    pub fn send(&mut self, ch: Channel, value: impl Into<Expr>, after: Call) {
        let name = match self.channel_name(ch) {
            Ok(name) => name,
            Err(e) => return self.fail(e),
        };
        let last = *self.last_call.last().expect("the program's context");
        if last != Some(after) {
            let why = match last {
                None => "`after` names a call, but this process made no call before the send",
                Some(_) => {
                    "`after` is not the last call this process made before the send \
                     (the token stands for the last task the process issued)"
                }
            };
            return self.fail(LowerError::Send {
                channel: name,
                why: why.into(),
            });
        }
        // The device reserves a token's room before it issues the call
        // only for a SEND right after the call's operands: anything in
        // between (a `let_`) would let the call overwrite what an earlier
        // token still stands for.
        let adjacent = matches!(
            self.bodies.last().and_then(|b| b.last()),
            Some(Node::Call { .. } | Node::Send { .. })
        );
        if !adjacent {
            return self.fail(LowerError::Send {
                channel: name,
                why: "a send must come right after the call it names (compute its value \
                      before the call, not with a `let_` after it)"
                    .into(),
            });
        }
        self.push(Node::Send {
            channel: ch.0,
            value: value.into(),
        });
    }

    /// As [`Workload::send`], naming the last call this process (or the
    /// top level) made; without one, `finish` says so.
    pub fn send_after_last_call(&mut self, ch: Channel, value: impl Into<Expr>) {
        match *self.last_call.last().expect("the program's context") {
            Some(call) => self.send(ch, value, call),
            None => {
                let channel = self.channel_name(ch).unwrap_or_else(|e| e.to_string());
                self.fail(LowerError::Send {
                    channel,
                    why: "no call before the send in this process: the token stands for one".into(),
                });
            }
        }
    }

    /// Runs `body` once per token of `ch`, with the token's value, until
    /// `ch` is closed and drained. Every task `body` issues starts after
    /// the token's task ended, as well as after what its regions imply.
    pub fn consume(&mut self, ch: Channel, body: impl FnOnce(&mut Self, Expr)) {
        if let Err(e) = self.channel_name(ch) {
            self.fail(e);
        }
        let var = self.next_var;
        self.next_var += 1;
        let body = self.body(|w| body(w, Expr::Var(var)));
        self.push(Node::Consume {
            channel: ch.0,
            var,
            body,
        });
    }

    /// Closes `ch`: no more sends; its consumers drain it and leave their
    /// loops. (A process closes the channels it sends on when it ends.)
    pub fn close(&mut self, ch: Channel) {
        if let Err(e) = self.channel_name(ch) {
            return self.fail(e);
        }
        self.push(Node::Close { channel: ch.0 });
    }

    /// The workload's channel and process names, to name what the device
    /// reports (channels by number, processes by the pc of their
    /// `PROCESS`; the pcs are known once `finish` has run).
    pub fn csp_names(&self) -> CspNames {
        CspNames {
            channels: self.channels.clone(),
            processes: self.process_pcs.clone(),
        }
    }

    /// Lowers the workload and writes the table (validated as the device
    /// will validate it).
    pub fn finish(&mut self) -> Result<Vec<u8>, LowerError> {
        if self.bodies.len() != 1 {
            return Err(LowerError::FinishInBody);
        }
        if let Some(e) = self.error.clone() {
            return Err(e);
        }
        if self.tasksets.len() >= MAX_TASKSETS {
            return Err(LowerError::Schedule(format!(
                "{} dispatch schedules; a workload has at most {} besides the run's",
                self.tasksets.len(),
                MAX_TASKSETS - 1
            )));
        }
        let mut lower = Lower {
            code: Vec::new(),
            vars: Vec::new(),
            used: 0,
            layouts: self.builder.layouts().to_vec(),
            tasksets: self.tasksets.clone(),
            taskset: 0,
            processes: self.processes.clone(),
            process_pcs: Vec::new(),
        };
        if let Some(tasks) = self.window {
            if tasks == 0 || tasks as usize > TASK_WINDOW {
                return Err(LowerError::Schedule(format!(
                    "task window {tasks}; 1 to {TASK_WINDOW} tasks"
                )));
            }
            lower.emit(OP_WINDOW, 0, [NO_REG; 6], tasks, 0);
        }
        for &t in &self.inputs {
            lower.emit(OP_INPUT, 0, [NO_REG; 6], t.0, 0);
        }
        for (c, decl) in self.channels.iter().enumerate() {
            let bits = decl.depth | decl.latency << 8;
            lower.emit(OP_CHANNEL, 0, [NO_REG; 6], c as u32, bits);
        }
        let program = self.bodies[0].clone();
        lower.nodes(&program, &mut self.builder)?;
        self.process_pcs = std::mem::take(&mut lower.process_pcs);
        // The table's program ends with the heap ring's `HEAP`, if any
        // (`TableBuilder::finish` appends it): it counts too.
        let instructions = lower.code.len() + usize::from(self.builder.heap_bytes() > 0);
        if instructions > MAX_PROGRAM {
            return Err(LowerError::TooLong {
                instructions,
                max: MAX_PROGRAM,
            });
        }
        lower.data_tensors()?;
        self.builder.set_program(lower.code);
        let bytes = self.builder.finish()?;
        Table::parse(&bytes).map_err(|e| LowerError::Invalid(e.to_string()))?;
        Ok(bytes)
    }

    /// The tasks the program expands to, computed on the host straight
    /// from the loops (the reference the device's expansion is checked
    /// against): data-dependent values are read from `arena` (e.g. after a
    /// run), symbols from `symbols`. It lists at most
    /// [`MAX_HOST_TASKS`] tasks and runs
    /// at most [`MAX_HOST_ITERATIONS`]
    /// loop iterations: past either it returns an error saying so (count a
    /// bigger program with [`crate::task_count::count_tasks`]). A program
    /// with processes and channels is refused with an error: which tasks
    /// its consume loops run depends on the tokens sent at run time. So is
    /// a call whose region the device would refuse (an offset or extent
    /// outside 32 bits, an empty region, one past its tensor), a load the
    /// device would refuse, and an `arena` too short for a loaded element:
    /// the error names the call, argument or tensor.
    pub fn expand(&self, arena: &Arena, symbols: &[i64]) -> Result<Vec<Expanded>, String> {
        let mut out = Vec::new();
        let mut vars = std::collections::HashMap::new();
        let mut cx = RefCx {
            arena,
            symbols,
            layouts: self.builder.layouts(),
            iterations: 0,
        };
        cx.nodes(&self.bodies[0], 0, &mut vars, &mut out)?;
        Ok(out)
    }
}

/// A task of the host's reference expansion.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Expanded {
    /// The kernel called.
    pub kernel: u32,
    /// The stream it is issued on (0: none).
    pub stream: u8,
    /// Per argument: tensor, offsets (per dimension) and extents.
    pub args: Vec<(u32, [u32; MAX_RANK], [u32; MAX_RANK])>,
    /// The scalar arguments, as the kernel receives them.
    pub scalars: Vec<u64>,
    /// Its taskset (0: the run's policy; see [`Workload::dispatch`]).
    pub taskset: u8,
}

struct RefCx<'a> {
    arena: &'a Arena,
    symbols: &'a [i64],
    layouts: &'a [TensorLayout],
    /// Loop iterations run so far.
    iterations: u64,
}

impl RefCx<'_> {
    fn layout(&self, tensor: TensorId) -> Result<&TensorLayout, String> {
        (self.layouts.get(tensor.0 as usize)).ok_or(format!("tensor {} was not declared", tensor.0))
    }

    /// Argument `k` of a call of `kernel`: its tensor, offsets and extents,
    /// refused as the device refuses it if a value does not fit in 32 bits
    /// or the region is empty or leaves the tensor.
    fn region(
        &self,
        kernel: u32,
        k: usize,
        r: &Region,
        vars: &std::collections::HashMap<u32, i64>,
    ) -> Result<(u32, [u32; MAX_RANK], [u32; MAX_RANK]), String> {
        let layout = self.layout(r.tensor)?;
        let name = wsp_ffi::lookup(kernel).map_or("?", |k| k.name);
        let bad = |why: String| format!("call of {name}: argument {k} ({}): {why}", layout.name);
        let rank = layout.shape.len();
        if r.offset.len() != rank {
            return Err(bad(format!(
                "{} offsets for a rank-{rank} tensor",
                r.offset.len()
            )));
        }
        let value = |e: &Expr| -> Result<u32, String> {
            let v = self.eval(e, vars)?;
            u32::try_from(v)
                .map_err(|_| bad(format!("offset or extent {v} outside [0, {}]", u32::MAX)))
        };
        let mut offset = [0u32; MAX_RANK];
        let mut extent = [1u32; MAX_RANK];
        for (d, o) in r.offset.iter().enumerate() {
            offset[d] = value(o)?;
        }
        extent[rank - 1] = value(&r.cols)?;
        if rank >= 2 {
            extent[rank - 2] = value(&r.rows)?;
        }
        for d in 0..rank {
            let (o, n, size) = (offset[d] as u64, extent[d] as u64, layout.shape[d] as u64);
            if n == 0 {
                return Err(bad(format!("dimension {d}: an empty region (extent 0)")));
            }
            if o + n > size {
                return Err(bad(format!(
                    "dimension {d}: {n} elements from {o} end past the tensor's size {size}"
                )));
            }
        }
        Ok((r.tensor.0, offset, extent))
    }

    fn eval(&self, e: &Expr, vars: &std::collections::HashMap<u32, i64>) -> Result<i64, String> {
        Ok(match e {
            Expr::Const(v) => *v,
            Expr::Var(v) => *vars.get(v).ok_or(format!("variable {v} out of scope"))?,
            Expr::Symbol(s) => *self
                .symbols
                .get(*s as usize)
                .ok_or(format!("symbol {s} unbound"))?,
            Expr::Load(t, index) => {
                let layout = self.layout(*t)?;
                let name = &layout.name;
                if layout.dtype != DTYPE_I32 || layout.is_scratch() {
                    return Err(format!(
                        "load from {name}: only i32 arena tensors can be loaded"
                    ));
                }
                if index.len() != layout.shape.len() {
                    return Err(format!(
                        "load from {name}: {} indices for a rank-{} tensor",
                        index.len(),
                        layout.shape.len()
                    ));
                }
                let mut flat = 0u64;
                for (i, &size) in index.iter().zip(&layout.shape) {
                    let i = self.eval(i, vars)?;
                    if i < 0 || i >= size as i64 {
                        return Err(format!("index {i} outside {name}"));
                    }
                    flat = flat * size as u64 + i as u64;
                }
                let word = (layout.arena_offset.checked_add(flat * 4))
                    .and_then(|at| usize::try_from(at).ok())
                    .and_then(|at| self.arena.bytes.get(at..at.checked_add(4)?));
                let Some(&[b0, b1, b2, b3]) = word else {
                    return Err(format!(
                        "load from {name}: the arena of {} bytes ends before the element",
                        self.arena.bytes.len()
                    ));
                };
                i32::from_le_bytes([b0, b1, b2, b3]) as i64
            }
            Expr::Bin(op, a, b) => {
                let (a, b) = (self.eval(a, vars)?, self.eval(b, vars)?);
                arith(*op, a, b).ok_or(format!("{a} and {b}: overflow or division by zero"))?
            }
        })
    }

    fn nodes(
        &mut self,
        nodes: &[Node],
        taskset: u8,
        vars: &mut std::collections::HashMap<u32, i64>,
        out: &mut Vec<Expanded>,
    ) -> Result<(), String> {
        for node in nodes {
            match node {
                Node::Loop {
                    var,
                    count,
                    max,
                    body,
                    ..
                } => {
                    let n = self.eval(count, vars)?;
                    if n < 0 || n > *max as i64 {
                        return Err(format!("loop count {n} outside [0, {max}]"));
                    }
                    self.iterations += n as u64;
                    if self.iterations > MAX_HOST_ITERATIONS {
                        return Err(format!(
                            "the loops run more than {MAX_HOST_ITERATIONS} iterations: \
                             more than the host expands"
                        ));
                    }
                    for i in 0..n {
                        vars.insert(*var, i);
                        self.nodes(body, taskset, vars, out)?;
                    }
                    vars.remove(var);
                }
                Node::When {
                    cond,
                    then,
                    otherwise,
                } => {
                    let branch = if self.eval(cond, vars)? != 0 {
                        then
                    } else {
                        otherwise
                    };
                    self.nodes(branch, taskset, vars, out)?;
                }
                Node::Dispatch { set, body } => self.nodes(body, *set, vars, out)?,
                Node::Call {
                    kernel,
                    stream,
                    stream_of,
                    args,
                    scalars,
                } => {
                    let stream = match stream_of {
                        Some(e) => {
                            let v = self.eval(e, vars)?;
                            u8::try_from(v)
                                .ok()
                                .filter(|&s| s as usize <= device_runtime::abi::MAX_STREAMS)
                                .ok_or(format!("stream {v} out of range"))?
                        }
                        None => *stream,
                    };
                    let mut a = Vec::new();
                    for (k, r) in args.iter().enumerate() {
                        a.push(self.region(*kernel, k, r, vars)?);
                    }
                    let s = scalars
                        .iter()
                        .map(|e| self.eval(e, vars).map(|v| v as u64))
                        .collect::<Result<_, _>>()?;
                    if out.len() == MAX_HOST_TASKS {
                        return Err(format!(
                            "the program expands to more than {MAX_HOST_TASKS} tasks: \
                             more than the host lists"
                        ));
                    }
                    out.push(Expanded {
                        kernel: *kernel,
                        stream,
                        args: a,
                        scalars: s,
                        taskset,
                    });
                }
                Node::Process { .. }
                | Node::Send { .. }
                | Node::Consume { .. }
                | Node::Close { .. } => {
                    return Err("the reference expansion does not follow processes and \
                                channels: which tasks a consume runs depends on the \
                                tokens sent at run time"
                        .to_string())
                }
                Node::Event { .. } | Node::Free { .. } => {}
                Node::Let { var, value } => {
                    let v = self.eval(value, vars)?;
                    vars.insert(*var, v);
                }
            }
        }
        Ok(())
    }
}

/// Lowering state: the code so far, the registers of open loops' variables
/// and the temporaries in use.
struct Lower {
    code: Vec<Instr>,
    /// (loop variable, its register), innermost last.
    vars: Vec<(u32, u8)>,
    /// Bit `r`: register `r` holds a live value.
    used: u16,
    layouts: Vec<TensorLayout>,
    /// The workload's taskset schedules, and the taskset of the code being
    /// lowered.
    tasksets: Vec<Schedule>,
    taskset: u8,
    /// Process names, by `Node::Process::index`, and (pc, name) of each
    /// `PROCESS` emitted.
    processes: Vec<String>,
    process_pcs: Vec<(usize, String)>,
}

impl Lower {
    /// Checks the lowered code LOADs from at most `MAX_DATA_TENSORS`
    /// distinct tensors, counted as the device's validation counts them
    /// (in program order), so that the error names the first one past it.
    fn data_tensors(&self) -> Result<(), LowerError> {
        let mut loaded: Vec<u32> = Vec::new();
        for ins in self.code.iter().filter(|i| i.op == OP_LOAD) {
            let t = ins.imm.get();
            if loaded.contains(&t) {
                continue;
            }
            if loaded.len() == MAX_DATA_TENSORS {
                let tensor = self
                    .layouts
                    .get(t as usize)
                    .map_or_else(|| format!("tensor {t}"), |l| l.name.clone());
                return Err(LowerError::TooManyDataTensors {
                    tensor,
                    max: MAX_DATA_TENSORS,
                });
            }
            loaded.push(t);
        }
        Ok(())
    }

    /// `DISPATCH` to taskset `set`.
    fn dispatch(&mut self, set: u8) {
        let bits = match set {
            0 => 0,
            s => self.tasksets[s as usize - 1].encode(),
        };
        self.emit(OP_DISPATCH, 0, [NO_REG; 6], set as u32, bits);
    }

    fn emit(&mut self, op: u8, r: u8, x: [u8; 6], imm: u32, imm2: u32) -> usize {
        self.code.push(Instr {
            op,
            r,
            x,
            imm: U32::new(imm),
            imm2: U32::new(imm2),
        });
        self.code.len() - 1
    }

    fn alloc(&mut self) -> Result<u8, LowerError> {
        let free = (!self.used).trailing_zeros() as usize;
        if free >= MAX_REGS {
            return Err(LowerError::TooManyRegisters { max: MAX_REGS });
        }
        self.used |= 1 << free;
        Ok(free as u8)
    }

    /// Frees `r` if it is a temporary (not a loop variable).
    fn free(&mut self, r: u8) {
        if r != NO_REG && !self.vars.iter().any(|&(_, v)| v == r) {
            self.used &= !(1 << r);
        }
    }

    /// Evaluates `e` into a register (a loop variable's own, or a new
    /// temporary the caller frees).
    fn expr(&mut self, e: &Expr) -> Result<u8, LowerError> {
        match e {
            Expr::Const(v) => {
                let r = self.alloc()?;
                let bits = *v as u64;
                self.emit(OP_CONST, r, [NO_REG; 6], bits as u32, (bits >> 32) as u32);
                Ok(r)
            }
            Expr::Var(var) => self
                .vars
                .iter()
                .rev()
                .find(|(v, _)| v == var)
                .map(|&(_, r)| r)
                .ok_or(LowerError::OutOfScope { var: *var }),
            Expr::Symbol(s) => {
                if *s as usize >= MAX_SYMBOLS {
                    return Err(LowerError::Symbol {
                        symbol: *s,
                        max: MAX_SYMBOLS,
                    });
                }
                let r = self.alloc()?;
                self.emit(OP_SYMBOL, r, [NO_REG; 6], *s, 0);
                Ok(r)
            }
            Expr::Load(t, index) => {
                let Some(layout) = self.layouts.get(t.0 as usize).cloned() else {
                    return Err(BuildError::UnknownTensor(t.0).into());
                };
                if layout.dtype != DTYPE_I32 {
                    return Err(LowerError::Load {
                        tensor: layout.name,
                        why: "only i32 tensors can be loaded".into(),
                    });
                }
                if index.len() != layout.shape.len() {
                    return Err(LowerError::Load {
                        tensor: layout.name.clone(),
                        why: format!(
                            "{} indices for a rank-{} tensor",
                            index.len(),
                            layout.shape.len()
                        ),
                    });
                }
                let mut x = [NO_REG; 6];
                for (d, i) in index.iter().enumerate() {
                    x[d] = match i {
                        Expr::Const(0) => NO_REG,
                        _ => self.expr(i)?,
                    };
                }
                x.iter().for_each(|&r| self.free(r));
                let r = self.alloc()?;
                self.emit(OP_LOAD, r, x, t.0, 0);
                Ok(r)
            }
            Expr::Bin(op, a, b) => {
                let ra = self.expr(a)?;
                let rb = self.expr(b)?;
                self.free(ra);
                self.free(rb);
                let r = self.alloc()?;
                self.emit(*op, r, [ra, rb, NO_REG, NO_REG, NO_REG, NO_REG], 0, 0);
                Ok(r)
            }
        }
    }

    /// An operand register: `NO_REG` when `e` is the constant `none` (if
    /// the operand has such a default); a value already in `cache`
    /// (computed for the same call) is reused.
    fn operand(
        &mut self,
        e: &Expr,
        none: Option<i64>,
        cache: &mut Vec<(Expr, u8)>,
    ) -> Result<u8, LowerError> {
        if let Expr::Const(v) = e {
            if Some(*v) == none {
                return Ok(NO_REG);
            }
        }
        if let Some(&(_, r)) = cache.iter().find(|(c, _)| c == e) {
            return Ok(r);
        }
        let r = self.expr(e)?;
        cache.push((e.clone(), r));
        Ok(r)
    }

    fn nodes(&mut self, nodes: &[Node], builder: &mut TableBuilder) -> Result<(), LowerError> {
        let scope = self.vars.len();
        let mut next = 0;
        while let Some(node) = nodes.get(next) {
            next += 1;
            match node {
                Node::Let { var, value } => {
                    let r = self.expr(value)?;
                    // A loop variable's register is shared, not owned: copy.
                    let r = if self.vars.iter().any(|&(_, v)| v == r) {
                        let copy = self.alloc()?;
                        let x = [r, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];
                        self.emit(OP_ADD, copy, x, 0, 0);
                        copy
                    } else {
                        r
                    };
                    self.vars.push((*var, r));
                }
                Node::Loop {
                    kind,
                    var,
                    count,
                    max,
                    body,
                } => {
                    if self.vars.len() == MAX_LOOP_DEPTH {
                        return Err(LowerError::TooDeep {
                            max: MAX_LOOP_DEPTH,
                        });
                    }
                    let c = self.expr(count)?;
                    self.free(c);
                    let r = self.alloc()?;
                    let k = match kind {
                        LoopKind::Parallel => LOOP_PARALLEL,
                        LoopKind::Sequential => LOOP_SEQUENTIAL,
                    };
                    let at = self.emit(OP_LOOP, r, [c, k, NO_REG, NO_REG, NO_REG, NO_REG], 0, *max);
                    self.vars.push((*var, r));
                    self.nodes(body, builder)?;
                    self.vars.pop();
                    self.free(r);
                    let end = self.emit(OP_END, 0, [NO_REG; 6], at as u32, 0);
                    self.code[at].imm = U32::new(end as u32);
                }
                Node::When {
                    cond,
                    then,
                    otherwise,
                } => {
                    let c = self.expr(cond)?;
                    self.free(c);
                    let when = self.emit(
                        OP_WHEN,
                        0,
                        [c, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG],
                        0,
                        0,
                    );
                    self.nodes(then, builder)?;
                    if otherwise.is_empty() {
                        let here = self.code.len() as u32;
                        self.code[when].imm = U32::new(here);
                    } else {
                        let jump = self.emit(OP_JUMP, 0, [NO_REG; 6], 0, 0);
                        let here = self.code.len() as u32;
                        self.code[when].imm = U32::new(here);
                        self.nodes(otherwise, builder)?;
                        let here = self.code.len() as u32;
                        self.code[jump].imm = U32::new(here);
                    }
                }
                Node::Call {
                    kernel,
                    stream,
                    stream_of,
                    args,
                    scalars,
                } => {
                    // The sends right after the call: their values are
                    // computed before it, so that each SEND directly
                    // follows the call's operands and the device reserves
                    // the token's room before it issues the task (which
                    // then cannot overwrite what an earlier token, still
                    // in the channel, stands for).
                    let mut sends = Vec::new();
                    while let Some(Node::Send { channel, value }) = nodes.get(next) {
                        sends.push((*channel, self.operand(value, Some(0), &mut Vec::new())?));
                        next += 1;
                    }
                    self.call(*kernel, *stream, stream_of.as_ref(), args, scalars, builder)?;
                    for &(channel, r) in &sends {
                        let x = [r, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];
                        self.emit(OP_SEND, 0, x, channel, 0);
                    }
                    sends.iter().for_each(|&(_, r)| self.free(r));
                }
                Node::Dispatch { set, body } => {
                    let outer = std::mem::replace(&mut self.taskset, *set);
                    self.dispatch(*set);
                    self.nodes(body, builder)?;
                    self.taskset = outer;
                    self.dispatch(outer);
                }
                Node::Process {
                    index,
                    var,
                    count,
                    max,
                    body,
                } => {
                    let c = match count {
                        Expr::Const(1) => NO_REG,
                        count => self.expr(count)?,
                    };
                    // The index gets a register of its own (not the
                    // count's), freed after the body.
                    let r = match var {
                        Some(v) => {
                            let r = self.alloc()?;
                            self.vars.push((*v, r));
                            r
                        }
                        None => NO_REG,
                    };
                    let x = [c, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];
                    let at = self.emit(OP_PROCESS, r, x, 0, *max);
                    self.free(c);
                    self.process_pcs.push((at, self.processes[*index].clone()));
                    self.nodes(body, builder)?;
                    if var.is_some() {
                        self.vars.pop();
                        self.free(r);
                    }
                    let end = self.emit(OP_PROCESS_END, 0, [NO_REG; 6], at as u32, 0);
                    self.code[at].imm = U32::new(end as u32);
                }
                Node::Send { channel, value } => {
                    let r = self.operand(value, Some(0), &mut Vec::new())?;
                    let x = [r, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG];
                    self.emit(OP_SEND, 0, x, *channel, 0);
                    self.free(r);
                }
                Node::Consume { channel, var, body } => {
                    if self.vars.len() == MAX_LOOP_DEPTH {
                        return Err(LowerError::TooDeep {
                            max: MAX_LOOP_DEPTH,
                        });
                    }
                    let r = self.alloc()?;
                    let at = self.emit(OP_CONSUME, r, [NO_REG; 6], *channel, 0);
                    self.vars.push((*var, r));
                    self.nodes(body, builder)?;
                    self.vars.pop();
                    self.free(r);
                    let end = self.emit(OP_END, 0, [NO_REG; 6], at as u32, 0);
                    self.code[at].imm2 = U32::new(end as u32);
                }
                Node::Close { channel } => {
                    self.emit(OP_CLOSE, 0, [NO_REG; 6], *channel, 0);
                }
                Node::Free { tensor } => {
                    self.emit(OP_FREE, 0, [NO_REG; 6], *tensor, 0);
                }
                Node::Event {
                    record,
                    stream,
                    event,
                } => {
                    if *stream == 0 || *stream as usize > device_runtime::abi::MAX_STREAMS {
                        return Err(LowerError::Stream(format!(
                            "stream {stream}; streams are 1 to 8"
                        )));
                    }
                    if *event as usize >= device_runtime::abi::MAX_EVENTS {
                        return Err(LowerError::Stream(format!(
                            "event {event}; events are 0 to 15"
                        )));
                    }
                    let op = if *record { OP_RECORD } else { OP_WAIT };
                    let x = [*stream, *event, NO_REG, NO_REG, NO_REG, NO_REG];
                    self.emit(op, 0, x, 0, 0);
                }
            }
        }
        // The body's `let`s end with it.
        for (_, r) in self.vars.split_off(scope) {
            self.used &= !(1 << r);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        kernel: u32,
        stream: u8,
        stream_of: Option<&Expr>,
        args: &[Region],
        scalars: &[Expr],
        builder: &mut TableBuilder,
    ) -> Result<(), LowerError> {
        let info = wsp_ffi::lookup(kernel).ok_or(BuildError::UnknownKernel(kernel))?;
        let bad = |why: String| LowerError::Call {
            kernel: info.name.to_string(),
            why,
        };
        if args.len() != info.num_tensors as usize {
            return Err(bad(format!(
                "{} tensor arguments, the kernel takes {}",
                args.len(),
                info.num_tensors
            )));
        }
        if scalars.len() != info.num_scalars as usize {
            return Err(bad(format!(
                "{} scalars, the kernel takes {}",
                scalars.len(),
                info.num_scalars
            )));
        }
        if stream as usize > device_runtime::abi::MAX_STREAMS {
            return Err(LowerError::Stream(format!(
                "stream {stream}; streams are 1 to 8"
            )));
        }
        builder.declare_kernel(kernel)?;
        // Each distinct value the call passes is computed once.
        let mut cache = Vec::new();
        let mut operands = Vec::new();
        for (k, region) in args.iter().enumerate() {
            let Some(layout) = self.layouts.get(region.tensor.0 as usize).cloned() else {
                return Err(BuildError::UnknownTensor(region.tensor.0).into());
            };
            let rank = layout.shape.len();
            if region.offset.len() != rank {
                return Err(bad(format!(
                    "argument {k} ({}): {} offsets for a rank-{rank} tensor",
                    layout.name,
                    region.offset.len()
                )));
            }
            let mut x = [NO_REG; 6];
            for (d, o) in region.offset.iter().enumerate() {
                x[d] = self.operand(o, Some(0), &mut cache)?;
            }
            if rank >= 2 {
                x[4] = self.operand(&region.rows, Some(1), &mut cache)?;
            } else if region.rows != Expr::Const(1) {
                return Err(bad(format!("argument {k}: a rank-1 tensor has 1 row")));
            }
            x[5] = self.operand(&region.cols, Some(1), &mut cache)?;
            operands.push(x);
        }
        let mut scalar_regs = Vec::new();
        for s in scalars {
            scalar_regs.push(self.operand(s, Some(0), &mut cache)?);
        }
        // A stream computed on the device; `NO_REG` for a fixed one.
        let stream_reg = match stream_of {
            Some(e) => {
                let r = self.operand(e, None, &mut cache)?;
                scalar_regs.push(r);
                r
            }
            None => NO_REG,
        };
        self.emit(
            OP_CALL,
            0,
            [stream, stream_reg, NO_REG, NO_REG, NO_REG, NO_REG],
            kernel,
            0,
        );
        for ((region, x), spec) in args.iter().zip(&operands).zip(info.tensor_args) {
            self.emit(OP_ARG, spec.access as u8, *x, region.tensor.0, 0);
        }
        let scalar_count = scalar_regs.len() - (stream_reg != NO_REG) as usize;
        for &r in &scalar_regs[..scalar_count] {
            self.emit(
                OP_SCALAR,
                0,
                [r, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG],
                0,
                0,
            );
        }
        for x in &operands {
            x.iter().for_each(|&r| self.free(r));
        }
        scalar_regs.iter().for_each(|&r| self.free(r));
        Ok(())
    }
}

/// `a op b` for a program's arithmetic op (`OP_ADD` .. `OP_EQ`), as the
/// host computes it (the reference expansion, task counts, workload files):
/// `None` on overflow or division by zero; `DIV` and `REM` are Euclidean,
/// `LT`, `LE` and `EQ` give 0 or 1.
pub(crate) fn arith(op: u8, a: i64, b: i64) -> Option<i64> {
    match op {
        OP_ADD => a.checked_add(b),
        OP_SUB => a.checked_sub(b),
        OP_MUL => a.checked_mul(b),
        OP_DIV => a.checked_div_euclid(b),
        OP_REM => a.checked_rem_euclid(b),
        OP_MIN => Some(a.min(b)),
        OP_MAX => Some(a.max(b)),
        OP_LT => Some((a < b) as i64),
        OP_LE => Some((a <= b) as i64),
        _ => Some((a == b) as i64),
    }
}
