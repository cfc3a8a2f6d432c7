//! Workload files: a workload written by hand in TOML (tensors and their
//! initial data, launch symbols, and a body of loops, branches and kernel
//! calls), lowered onto [`crate::program::Workload`] and checked by a
//! generic f64 reference that executes the expanded tasks one by one.
//!
//! ```toml
//! name = "gemm-dyn"
//!
//! [symbols]
//! mt = { max = 8, default = 4 }     # row tiles, bound at launch
//!
//! [tensors]
//! A = { shape = [256, 64], init = "random", seed = 1 }
//! B = { shape = [64, 64], init = "random", seed = 2 }
//! C = { shape = [256, 64] }         # zeros
//!
//! [[body]]
//! parallel = "i"
//! dense_dyn = "mt"
//! body = [
//!   { parallel = "k", dense = 2, body = [
//!     { call = "gemm_tile", args = ["A[i*32, k*32; 32 x 32]", "B[k*32, 0; 32 x 64]",
//!                                   "C[i*32, 0; 32 x 64]"] },
//!   ] },
//! ]
//! ```
//!
//! The format is described in `docs/workload-files.md`. Every mistake in a
//! file is a [`FileError`] naming its line and column where it has one;
//! nothing in a file can make this module panic.
//!
//! The check ([`FileWorkload::check`]) walks the program's tasks in program
//! order (the semantics of the host reference expansion,
//! [`crate::program::Workload::expand`]) and runs each kernel in f64 on a
//! shadow of the arena, so that a value a later loop reads (a ragged
//! length, a router's CSR output) is read from the shadow as the tasks
//! before it left it. Next to each f64 value the shadow carries a bound on
//! how far an f32 evaluation by the kernels may be from it: the rounding
//! of each kernel's own operations (in the order `kernels/src/*.cpp` do
//! them) plus the error of its inputs carried through to first order. A
//! run passes when every element the tasks wrote is within its bound, the
//! i32 outputs are equal, and nothing else changed. A file with channels
//! and processes has no single program order: its reference follows the
//! order in which the device's expander, run on the host with every task
//! complete at once, issues the tasks (`Shadow::table`).

// From text to a run's check: raw (serde) -> parse (declarations) ->
// resolve, expr, call (the body, with names resolved) -> lower (onto the
// workload language); shadow and kernels make the f64 reference, and
// check compares a run with it.
mod call;
mod check;
mod expr;
mod kernels;
mod lower;
mod parse;
mod raw;
mod resolve;
mod shadow;

use std::fmt;
use std::path::Path;

use wsp_ffi::DTYPE_I32;

use crate::program::{Expanded, Workload as Program};
use crate::table::{Arena, TensorLayout};

use lower::lower;
use parse::{Data, SymbolDef, TensorDef};
use resolve::Step;
use shadow::Shadow;

// ---------------------------------------------------------------------------
// Errors

/// What kind of mistake a [`FileError`] reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The file could not be read.
    Io,
    /// Not TOML, or a key or value of the wrong type or in the wrong place.
    Syntax,
    /// A body entry that is not one of the known forms, or has keys that
    /// do not belong to it; or a body with no kernel call.
    Structure,
    /// A tensor declaration or its data.
    Tensor,
    /// A symbol declaration or its value.
    Symbol,
    /// A name that is no loop variable, `let` or symbol in scope.
    UnknownName,
    /// A tensor name not declared under `[tensors]`.
    UnknownTensor,
    /// A kernel name that is not one a workload file can call: not in the
    /// kernel registry, or a registry kernel with no f64 reference for the
    /// check (the message lists the kernels a file can call).
    UnknownKernel,
    /// An expression that does not parse or evaluate.
    Expression,
    /// A call with the wrong number of arguments or scalars, or with an
    /// argument it writes overlapping another of its arguments (where the
    /// regions are constants; otherwise [`ErrorKind::Expand`]).
    Call,
    /// A region of the wrong dtype, rank or size for its tensor or kernel.
    Shape,
    /// The program could not be lowered (registers, nesting, length).
    Lower,
    /// The reference expansion failed: a loop count out of range, a
    /// region past its tensor, a call's written argument overlapping
    /// another, a division by zero, for some loop indices; or a read of a
    /// scratch tensor's element no task wrote since its scope began.
    Expand,
    /// A channel declaration out of range, an unknown channel, or a
    /// process, send or consume where it cannot be (a process inside a
    /// loop, a send whose `after` is not the last call before it).
    Channel,
}

/// A mistake in a workload file, with its line and column when it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// What kind of mistake it is.
    pub kind: ErrorKind,
    /// 1-based line in the file.
    pub line: Option<usize>,
    /// 1-based column in the file.
    pub column: Option<usize>,
    /// What is wrong, naming the key, tensor or value at fault.
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let (Some(line), Some(column)) = (self.line, self.column) {
            write!(f, "line {line}, column {column}: ")?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for FileError {}

/// Source text, for turning byte offsets into lines and columns.
struct Src<'a> {
    text: &'a str,
}

impl Src<'_> {
    fn at(&self, kind: ErrorKind, offset: Option<usize>, message: String) -> FileError {
        let (line, column) = match offset {
            Some(o) => {
                let o = o.min(self.text.len());
                let before = self.text.get(..o).unwrap_or("");
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        FileError {
            kind,
            line,
            column,
            message,
        }
    }
}

fn plain(kind: ErrorKind, message: String) -> FileError {
    FileError {
        kind,
        line: None,
        column: None,
        message,
    }
}

// ---------------------------------------------------------------------------
// The parsed file

/// A parsed and resolved workload file: build it with [`WorkloadFile::build`]
/// for given symbol values.
pub struct WorkloadFile {
    /// The file's `name`, or else its file name without extension
    /// (`workload` for parsed text).
    pub name: String,
    /// The file's `summary`, or empty.
    pub summary: String,
    text: String,
    tensors: Vec<TensorDef>,
    symbols: Vec<SymbolDef>,
    steps: Vec<Step>,
    /// `[schedule] window`.
    window: Option<u32>,
    /// `[schedule] heap`: bytes of the heap ring for scratch tensors.
    heap: Option<u64>,
    /// `[channels]`, by number.
    channels: Vec<parse::ChannelDef>,
}

impl WorkloadFile {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<WorkloadFile, FileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| plain(ErrorKind::Io, format!("cannot read it: {e}")))?;
        let default_name = path
            .file_stem()
            .map_or("workload".into(), |s| s.to_string_lossy().into_owned());
        WorkloadFile::parse_named(&text, &default_name)
    }

    /// Parses a workload file's text.
    pub fn parse(text: &str) -> Result<WorkloadFile, FileError> {
        WorkloadFile::parse_named(text, "workload")
    }

    /// The symbols' names, in index order (symbol `i` of the program).
    pub fn symbol_names(&self) -> Vec<String> {
        self.symbols.iter().map(|s| s.name.clone()).collect()
    }

    /// Lowers the workload, writes its initial arena and runs the f64
    /// reference, with each symbol at its default or the value `symbols`
    /// gives it by name.
    pub fn build(&self, symbols: &[(String, i64)]) -> Result<FileWorkload, FileError> {
        for (name, _) in symbols {
            if !self.symbols.iter().any(|s| s.name == *name) {
                let known = self.symbol_names();
                return Err(plain(
                    ErrorKind::Symbol,
                    format!(
                        "unknown symbol `{name}` (symbols: {})",
                        if known.is_empty() {
                            "none".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
        }
        let mut values = Vec::new();
        for s in &self.symbols {
            let v = match symbols.iter().rev().find(|(n, _)| *n == s.name) {
                Some((_, v)) => *v,
                None => s.default.ok_or_else(|| {
                    plain(
                        ErrorKind::Symbol,
                        format!(
                            "symbol `{}` has no default: give it a value (wsp: --symbol {}=N)",
                            s.name, s.name
                        ),
                    )
                })?,
            };
            if v < 0 || v > s.max as i64 {
                return Err(plain(
                    ErrorKind::Symbol,
                    format!("symbol `{}` = {v} is outside [0, {}]", s.name, s.max),
                ));
            }
            values.push(v);
        }
        let mut w = Program::new();
        let lowering = |e: crate::program::LowerError| {
            plain(ErrorKind::Lower, format!("lowering the program: {e}"))
        };
        for t in &self.tensors {
            let id = if t.scratch {
                w.scratch(&t.name, &t.shape)
            } else if t.dtype == DTYPE_I32 {
                w.tensor_i32(&t.name, &t.shape)
            } else {
                w.tensor(&t.name, &t.shape)
            }
            .map_err(lowering)?;
            if t.input {
                w.input(id);
            }
        }
        if let Some(n) = self.window {
            w.window(n);
        }
        if let Some(bytes) = self.heap {
            w.heap(bytes).map_err(lowering)?;
        }
        let mut channels = Vec::new();
        for c in &self.channels {
            channels.push(
                w.channel_with_latency(&c.name, c.depth, c.latency)
                    .map_err(lowering)?,
            );
        }
        lower(&mut w, &self.steps, &mut Vec::new(), &channels);
        let table = w.finish().map_err(lowering)?;
        let layouts = w.layouts().to_vec();
        let mut arena = Arena::zeroed(w.arena_size());
        for (t, l) in self.tensors.iter().zip(&layouts) {
            match &t.data {
                Data::Zeros => {}
                Data::F32(v) => arena.write_f32(l, v),
                Data::I32(v) => arena.write_i32(l, v),
            }
        }
        let src = Src { text: &self.text };
        let mut shadow = Shadow::new(&src, &layouts, &arena, &values);
        let csp = !self.channels.is_empty()
            || self
                .steps
                .iter()
                .any(|s| matches!(s, resolve::Step::Process { .. }));
        if csp {
            let parsed = device_runtime::abi::Table::parse(&table)
                .map_err(|e| plain(ErrorKind::Lower, format!("lowering the program: {e}")))?;
            shadow
                .table(&parsed, &w.csp_names())
                .map_err(|e| late_process_hint(e, &self.steps))?;
        } else {
            shadow.steps(&self.steps)?;
        }
        // A workload of no tasks would run nothing and pass. (Checked last:
        // a file with another mistake is told that one.)
        if !parse::has_call(&self.steps) {
            return Err(plain(
                ErrorKind::Structure,
                "the file has no kernel calls: a workload's body must call at least one kernel \
                 (a `call = \"KERNEL\"` entry under [[body]])"
                    .into(),
            ));
        }
        let Shadow {
            val,
            err,
            tasks,
            written,
            notes,
            ..
        } = shadow;
        Ok(FileWorkload {
            name: self.name.clone(),
            summary: self.summary.clone(),
            table,
            arena,
            tensors: layouts,
            symbols: values,
            symbol_names: self.symbol_names(),
            tasks,
            expected: val,
            bounds: err,
            written,
            notes,
            program: w,
        })
    }
}

/// `e`, the reference's report that the processes wait on each other,
/// with a hint when a process entry comes after a program entry that uses
/// a channel: that process starts only when the program reaches it.
fn late_process_hint(mut e: FileError, steps: &[Step]) -> FileError {
    let late = parse::late_processes(steps);
    if !late.is_empty() && e.message.contains("cannot finish") {
        let names: Vec<String> = late.iter().map(|n| format!("`{n}`")).collect();
        let (which, come, it) = match names.len() {
            1 => ("process", "comes", "it starts"),
            _ => ("processes", "come", "they start"),
        };
        e.message.push_str(&format!(
            "\nhint: a process starts when the program reaches its entry, and {which} {} {come} \
             after an entry of the program that sends on or consumes from a channel, so {it} \
             only once that entry is done: put the process entries first",
            names.join(", ")
        ));
    }
    e
}

/// A workload file built for given symbols: its table and initial arena,
/// and the f64 reference of the run.
pub struct FileWorkload {
    /// The workload file's name.
    pub name: String,
    /// The workload file's summary.
    pub summary: String,
    /// The descriptor table the workload lowers to.
    pub table: Vec<u8>,
    /// The initial arena.
    pub arena: Arena,
    /// The tensors' layouts, in declaration order.
    pub tensors: Vec<TensorLayout>,
    /// The symbols' values, in index order (bind them at launch:
    /// `RunOptions::symbols`).
    pub symbols: Vec<i64>,
    /// The symbols' names, in index order.
    pub symbol_names: Vec<String>,
    /// The tasks of the reference expansion, in program order.
    pub tasks: Vec<Expanded>,
    /// Per tensor: the f64 reference of every element after the run, and
    /// the bound on an f32 run's distance from it.
    expected: Vec<Vec<f64>>,
    bounds: Vec<Vec<f64>>,
    /// Per tensor: whether a task writes it.
    written: Vec<bool>,
    /// What the reference could not decide for certain (routing near ties).
    pub notes: Vec<String>,
    program: Program,
}

/// How the f32 bounds are made, for the report.
pub const F32_BOUND: &str = "|run - f64| <= the f32 rounding bound of each task's kernel \
     (gamma_(K+1) of a GEMM's sums, gamma_(H+2) for expert_rows, u for add, gamma_(n+6) for \
     rmsnorm, 1e-6 + u|x - max| per exp for softmax and route_topk), the inputs' bounds carried \
     through to first order";

impl FileWorkload {
    /// The workload-language program the file lowered to (e.g. for
    /// [`Program::expand`]).
    pub fn program(&self) -> &Program {
        &self.program
    }
}
