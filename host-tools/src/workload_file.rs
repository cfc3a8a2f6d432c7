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
//! i32 outputs are equal, and nothing else changed.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use device_runtime::abi::program::{
    MAX_SYMBOLS, OP_ADD, OP_DIV, OP_EQ, OP_LE, OP_LT, OP_MAX, OP_MIN, OP_MUL, OP_REM, OP_SUB,
};
use device_runtime::abi::MAX_RANK;
use device_runtime::sched::{DispatchKey, PolicyKind, Schedule};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;
use wsp_ffi::{KernelInfo, TileShape, DTYPE_F32, DTYPE_I32};

use crate::program::{Axis, Expanded, Expr, Region, Workload as Program};
use crate::rng::SplitMix64;
use crate::table::{Arena, TensorId, TensorLayout};
use crate::workloads::Verification;

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
    /// do not belong to it.
    Structure,
    /// A tensor declaration or its data.
    Tensor,
    /// A symbol declaration or its value.
    Symbol,
    /// A name that is no loop variable, `let` or symbol in scope.
    UnknownName,
    UnknownTensor,
    UnknownKernel,
    /// An expression that does not parse or evaluate.
    Expression,
    /// A call with the wrong number of arguments or scalars.
    Call,
    /// A region of the wrong dtype, rank or size for its tensor or kernel.
    Shape,
    /// The program could not be lowered (registers, nesting, length).
    Lower,
    /// The reference expansion failed: a loop count out of range, a
    /// region past its tensor, a division by zero, for some loop indices.
    Expand,
}

/// A mistake in a workload file, with its line and column when it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    pub kind: ErrorKind,
    /// 1-based line and column in the file.
    pub line: Option<usize>,
    pub column: Option<usize>,
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
// The file as serde reads it

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    name: Option<String>,
    summary: Option<String>,
    #[serde(default)]
    symbols: BTreeMap<String, Spanned<RawSymbol>>,
    #[serde(default)]
    tensors: BTreeMap<String, Spanned<RawTensor>>,
    #[serde(default)]
    body: Vec<Spanned<RawNode>>,
    schedule: Option<Spanned<RawSchedule>>,
}

/// `[schedule]`: settings of the whole workload (per-body dispatch is a
/// `dispatch` entry).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    window: Option<Spanned<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSymbol {
    max: u32,
    default: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTensor {
    dtype: Option<String>,
    shape: Vec<u32>,
    init: Option<String>,
    seed: Option<u64>,
    skip: Option<u64>,
    scale: Option<f64>,
    range: Option<[i64; 2]>,
    values: Option<Vec<f64>>,
    input: Option<bool>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawNode {
    parallel: Option<Spanned<String>>,
    sequential: Option<Spanned<String>>,
    select: Option<Spanned<String>>,
    when: Option<Spanned<ExprSrc>>,
    #[serde(rename = "let")]
    let_: Option<Spanned<String>>,
    call: Option<Spanned<String>>,
    dispatch: Option<Spanned<String>>,
    key: Option<Spanned<String>>,
    record: Option<Spanned<u32>>,
    wait: Option<Spanned<u32>>,
    stream: Option<Spanned<u32>>,
    dense: Option<Spanned<u32>>,
    dense_dyn: Option<Spanned<String>>,
    ragged: Option<Spanned<RawRagged>>,
    max: Option<Spanned<u32>>,
    slot: Option<Spanned<String>>,
    indptr: Option<Spanned<String>>,
    indices: Option<Spanned<String>>,
    row: Option<Spanned<ExprSrc>>,
    value: Option<Spanned<ExprSrc>>,
    then: Option<Vec<Spanned<RawNode>>>,
    otherwise: Option<Vec<Spanned<RawNode>>>,
    args: Option<Vec<Spanned<ArgSrc>>>,
    scalars: Option<Vec<Spanned<ExprSrc>>>,
    body: Option<Vec<Spanned<RawNode>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRagged {
    lengths: Spanned<String>,
    at: Vec<Spanned<ExprSrc>>,
    max: u32,
}

/// An expression as written: an integer, a float (kernel scalars only:
/// passed as f32 bits) or an expression string.
#[derive(Clone, Debug)]
enum ExprSrc {
    Int(i64),
    Float(f64),
    Text(String),
}

impl<'de> Deserialize<'de> for ExprSrc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = ExprSrc;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer, a float (kernel scalars) or an expression string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ExprSrc, E> {
                Ok(ExprSrc::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ExprSrc, E> {
                i64::try_from(v)
                    .map(ExprSrc::Int)
                    .map_err(|_| E::custom("integer too large"))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<ExprSrc, E> {
                Ok(ExprSrc::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ExprSrc, E> {
                Ok(ExprSrc::Text(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A kernel argument as written: `"t[row, col; rows x cols]"`, `"t"` (the
/// whole tensor) or `{ tensor = "t", at = [..], rows = .., cols = .. }`.
enum ArgSrc {
    Text(String),
    Table(RawRegion),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegion {
    tensor: String,
    at: Vec<Spanned<ExprSrc>>,
    rows: Option<Spanned<ExprSrc>>,
    cols: Spanned<ExprSrc>,
}

impl<'de> Deserialize<'de> for ArgSrc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ArgSrc;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(
                    "a region string \"t[row, col; rows x cols]\" or a table { tensor, at, rows, cols }",
                )
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<ArgSrc, E> {
                Ok(ArgSrc::Text(v.to_string()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ArgSrc, A::Error> {
                RawRegion::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(ArgSrc::Table)
            }
        }
        d.deserialize_any(V)
    }
}

// ---------------------------------------------------------------------------
// Expressions

/// A parsed expression; `usize`s are 0-based byte columns in its text.
#[derive(Clone, Debug)]
enum Ast {
    Int(i64),
    Name(String, usize),
    Load(String, usize, Vec<Ast>),
    Bin(u8, Box<Ast>, Box<Ast>, usize),
    /// `a != b`, `a > b`, `a >= b` are rewritten; `-a` is `0 - a`.
    Ne(Box<Ast>, Box<Ast>, usize),
}

/// A resolved expression: names are slots of the enclosing scopes.
#[derive(Clone, Debug, PartialEq, Eq)]
enum RExpr {
    Const(i64),
    Slot(usize),
    Symbol(u32),
    Load(TensorId, Vec<RExpr>),
    Bin(u8, Box<RExpr>, Box<RExpr>),
}

/// An expression error at a byte column of the expression text.
struct ExprError {
    column: usize,
    kind: ErrorKind,
    message: String,
}

fn expr_err(column: usize, message: impl Into<String>) -> ExprError {
    ExprError {
        column,
        kind: ErrorKind::Expression,
        message: message.into(),
    }
}

struct Parser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        Parser {
            s: text.as_bytes(),
            pos: 0,
        }
    }

    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.pos).copied()
    }

    fn eat(&mut self, token: &str) -> bool {
        self.ws();
        if self.s[self.pos..].starts_with(token.as_bytes()) {
            self.pos += token.len();
            true
        } else {
            false
        }
    }

    fn expect(&mut self, token: &str, what: &str) -> Result<(), ExprError> {
        if self.eat(token) {
            Ok(())
        } else {
            Err(expr_err(
                self.pos,
                format!("expected `{token}` {what}, found {}", self.found()),
            ))
        }
    }

    fn found(&mut self) -> String {
        match self.peek() {
            None => "the end".to_string(),
            Some(_) => {
                let rest = String::from_utf8_lossy(&self.s[self.pos..]);
                let word: String = rest.chars().take(8).collect();
                format!("`{}`", word.trim_end())
            }
        }
    }

    fn ident(&mut self) -> Option<(String, usize)> {
        self.ws();
        let start = self.pos;
        match self.s.get(self.pos) {
            Some(c) if c.is_ascii_alphabetic() || *c == b'_' => {}
            _ => return None,
        }
        while self
            .s
            .get(self.pos)
            .is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_')
        {
            self.pos += 1;
        }
        let name = String::from_utf8_lossy(&self.s[start..self.pos]).into_owned();
        Some((name, start))
    }

    /// `sum (cmp sum)?`
    fn expr(&mut self) -> Result<Ast, ExprError> {
        let a = self.sum()?;
        self.ws();
        let at = self.pos;
        let ops: [(&str, u8, bool); 4] = [
            ("<=", OP_LE, false),
            (">=", OP_LE, true),
            ("==", OP_EQ, false),
            ("!=", OP_EQ, false),
        ];
        for (token, op, swap) in ops {
            if self.eat(token) {
                let b = self.sum()?;
                return Ok(match (token, swap) {
                    ("!=", _) => Ast::Ne(Box::new(a), Box::new(b), at),
                    (_, true) => Ast::Bin(op, Box::new(b), Box::new(a), at),
                    _ => Ast::Bin(op, Box::new(a), Box::new(b), at),
                });
            }
        }
        if self.eat("<") {
            let b = self.sum()?;
            return Ok(Ast::Bin(OP_LT, Box::new(a), Box::new(b), at));
        }
        if self.eat(">") {
            let b = self.sum()?;
            return Ok(Ast::Bin(OP_LT, Box::new(b), Box::new(a), at));
        }
        Ok(a)
    }

    fn sum(&mut self) -> Result<Ast, ExprError> {
        let mut a = self.term()?;
        loop {
            self.ws();
            let at = self.pos;
            let op = if self.eat("+") {
                OP_ADD
            } else if self.eat("-") {
                OP_SUB
            } else {
                return Ok(a);
            };
            let b = self.term()?;
            a = Ast::Bin(op, Box::new(a), Box::new(b), at);
        }
    }

    fn term(&mut self) -> Result<Ast, ExprError> {
        let mut a = self.unary()?;
        loop {
            self.ws();
            let at = self.pos;
            let op = if self.eat("*") {
                OP_MUL
            } else if self.eat("/") {
                OP_DIV
            } else if self.eat("%") {
                OP_REM
            } else {
                return Ok(a);
            };
            let b = self.unary()?;
            a = Ast::Bin(op, Box::new(a), Box::new(b), at);
        }
    }

    fn unary(&mut self) -> Result<Ast, ExprError> {
        self.ws();
        let at = self.pos;
        if self.eat("-") {
            let a = self.unary()?;
            return Ok(Ast::Bin(OP_SUB, Box::new(Ast::Int(0)), Box::new(a), at));
        }
        self.atom()
    }

    fn atom(&mut self) -> Result<Ast, ExprError> {
        let start = {
            self.ws();
            self.pos
        };
        match self.peek() {
            Some(c) if c.is_ascii_digit() => {
                while self.s.get(self.pos).is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.pos]).unwrap_or("");
                digits
                    .parse::<i64>()
                    .map(Ast::Int)
                    .map_err(|_| expr_err(start, format!("integer {digits} is too large")))
            }
            Some(b'(') => {
                self.pos += 1;
                let e = self.expr()?;
                self.expect(")", "to close `(`")?;
                Ok(e)
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let (name, at) = self.ident().unwrap_or_default();
                if !self.eat("(") {
                    return Ok(Ast::Name(name, at));
                }
                match name.as_str() {
                    "min" | "max" => {
                        let a = self.expr()?;
                        self.expect(",", &format!("between the two arguments of {name}"))?;
                        let b = self.expr()?;
                        self.expect(")", &format!("after the two arguments of {name}"))?;
                        let op = if name == "min" { OP_MIN } else { OP_MAX };
                        Ok(Ast::Bin(op, Box::new(a), Box::new(b), at))
                    }
                    "load" => {
                        let Some((tensor, tat)) = self.ident() else {
                            return Err(expr_err(
                                self.pos,
                                "load needs a tensor name first: load(t, i, j)",
                            ));
                        };
                        let mut index = Vec::new();
                        while self.eat(",") {
                            index.push(self.expr()?);
                        }
                        self.expect(")", "after the indices of load")?;
                        Ok(Ast::Load(tensor, tat, index))
                    }
                    _ => Err(expr_err(
                        at,
                        format!("unknown function `{name}` (functions: min, max, load)"),
                    )),
                }
            }
            _ => Err(expr_err(
                start,
                format!("expected a number, a name or `(`, found {}", self.found()),
            )),
        }
    }
}

/// Integer arithmetic as the device's program machine does it.
fn arith(op: u8, a: i64, b: i64) -> Result<i64, &'static str> {
    let value = match op {
        OP_ADD => a.checked_add(b),
        OP_SUB => a.checked_sub(b),
        OP_MUL => a.checked_mul(b),
        OP_DIV | OP_REM if b == 0 => return Err("division by zero"),
        OP_DIV => a.checked_div_euclid(b),
        OP_REM => a.checked_rem_euclid(b),
        OP_MIN => Some(a.min(b)),
        OP_MAX => Some(a.max(b)),
        OP_LT => Some((a < b) as i64),
        OP_LE => Some((a <= b) as i64),
        _ => Some((a == b) as i64),
    };
    value.ok_or("arithmetic overflow")
}

// ---------------------------------------------------------------------------
// The resolved program

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Parallel,
    Sequential,
}

enum RAxis {
    Dense(u32),
    DenseDyn {
        symbol: u32,
        max: u32,
    },
    Ragged {
        lengths: TensorId,
        at: Vec<RExpr>,
        max: u32,
    },
}

/// A body entry with names resolved; `at` is its byte offset in the file.
enum Step {
    Loop {
        kind: Kind,
        var: String,
        axis: RAxis,
        body: Vec<Step>,
        at: usize,
    },
    Select {
        indptr: TensorId,
        indices: TensorId,
        row: RExpr,
        max: u32,
        slot: String,
        value: String,
        body: Vec<Step>,
        at: usize,
    },
    When {
        cond: RExpr,
        then: Vec<Step>,
        otherwise: Vec<Step>,
        at: usize,
    },
    Let {
        name: String,
        value: RExpr,
        at: usize,
    },
    Call {
        kernel: &'static KernelInfo,
        stream: u8,
        args: Vec<RRegion>,
        scalars: Vec<RExpr>,
        at: usize,
    },
    Stream {
        stream: u8,
        body: Vec<Step>,
    },
    /// Calls in `body` belong to taskset `set`, dispatched by `schedule`.
    Dispatch {
        set: u8,
        schedule: Schedule,
        body: Vec<Step>,
    },
    Event {
        record: bool,
        stream: u8,
        event: u8,
    },
}

struct RRegion {
    tensor: TensorId,
    offset: Vec<RExpr>,
    rows: RExpr,
    cols: RExpr,
}

/// A name in scope: loop variables, `let`s and a select's slot and value
/// each hold one slot.
struct ScopeEntry {
    name: String,
    what: &'static str,
    /// A select's value: `indices[0, slot before it]`, read where used.
    lazy: Option<TensorId>,
}

struct TensorDef {
    name: String,
    dtype: u32,
    shape: Vec<u32>,
    input: bool,
    at: usize,
    data: Data,
}

/// A tensor's initial data.
enum Data {
    Zeros,
    F32(Vec<f32>),
    I32(Vec<i32>),
}

struct SymbolDef {
    name: String,
    max: u32,
    default: Option<i64>,
}

/// Resolution state: the file's tensors and symbols, and the names in scope.
struct Resolver<'a> {
    src: Src<'a>,
    tensors: Vec<TensorDef>,
    symbols: Vec<SymbolDef>,
    scope: Vec<ScopeEntry>,
    /// Tensors some call writes, and the loads (tensor, offset) seen.
    written: Vec<bool>,
    loads: Vec<(TensorId, usize)>,
    /// The byte offset of the expression string being resolved.
    expr_base: usize,
    /// The dispatch schedules of tasksets 1 .., numbered as
    /// `Workload::dispatch` numbers them (in file order).
    tasksets: Vec<Schedule>,
}

const KIND_KEYS: [&str; 9] = [
    "dispatch",
    "parallel",
    "sequential",
    "select",
    "when",
    "let",
    "call",
    "record",
    "wait",
];

impl RawNode {
    /// The keys present, by name.
    fn keys(&self) -> Vec<&'static str> {
        let present = [
            ("parallel", self.parallel.is_some()),
            ("sequential", self.sequential.is_some()),
            ("select", self.select.is_some()),
            ("when", self.when.is_some()),
            ("let", self.let_.is_some()),
            ("call", self.call.is_some()),
            ("dispatch", self.dispatch.is_some()),
            ("key", self.key.is_some()),
            ("record", self.record.is_some()),
            ("wait", self.wait.is_some()),
            ("stream", self.stream.is_some()),
            ("dense", self.dense.is_some()),
            ("dense_dyn", self.dense_dyn.is_some()),
            ("ragged", self.ragged.is_some()),
            ("max", self.max.is_some()),
            ("slot", self.slot.is_some()),
            ("indptr", self.indptr.is_some()),
            ("indices", self.indices.is_some()),
            ("row", self.row.is_some()),
            ("value", self.value.is_some()),
            ("then", self.then.is_some()),
            ("otherwise", self.otherwise.is_some()),
            ("args", self.args.is_some()),
            ("scalars", self.scalars.is_some()),
            ("body", self.body.is_some()),
        ];
        present
            .iter()
            .filter(|(_, p)| *p)
            .map(|(k, _)| *k)
            .collect()
    }
}

fn is_ident(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

const RESERVED: [&str; 4] = ["min", "max", "load", "x"];

fn dtype_text(dtype: u32) -> &'static str {
    if dtype == DTYPE_I32 {
        "i32"
    } else {
        "f32"
    }
}

impl Resolver<'_> {
    fn err(&self, kind: ErrorKind, at: usize, message: String) -> FileError {
        self.src.at(kind, Some(at), message)
    }

    fn tensor(&self, name: &str, at: usize) -> Result<TensorId, FileError> {
        match self.tensors.iter().position(|t| t.name == name) {
            Some(i) => Ok(TensorId(i as u32)),
            None => {
                let known: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
                Err(self.err(
                    ErrorKind::UnknownTensor,
                    at,
                    format!("unknown tensor `{name}` (tensors: {})", known.join(", ")),
                ))
            }
        }
    }

    /// A new name for the scope: an identifier, not a function, not a name
    /// already in scope or a symbol.
    fn bind(&mut self, name: &str, what: &'static str, at: usize) -> Result<(), FileError> {
        if !is_ident(name) || RESERVED.contains(&name) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!("`{name}` cannot name a {what}: use letters, digits and _, not min, max, load or x"),
            ));
        }
        if let Some(e) = self.scope.iter().find(|e| e.name == name) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!("`{name}` is already a {} here", e.what),
            ));
        }
        if self.symbols.iter().any(|s| s.name == name) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!("`{name}` is already a symbol"),
            ));
        }
        self.scope.push(ScopeEntry {
            name: name.to_string(),
            what,
            lazy: None,
        });
        Ok(())
    }

    /// Resolves an expression written at byte `at` of the file.
    fn expr(&mut self, src: &Spanned<ExprSrc>, what: &str) -> Result<RExpr, FileError> {
        let at = src.span().start;
        match src.get_ref() {
            ExprSrc::Int(v) => Ok(RExpr::Const(*v)),
            ExprSrc::Float(_) => Err(self.err(
                ErrorKind::Expression,
                at,
                format!("{what}: a float is only allowed as a kernel scalar"),
            )),
            ExprSrc::Text(text) => self.text_expr(text, at, what),
        }
    }

    fn text_expr(&mut self, text: &str, at: usize, what: &str) -> Result<RExpr, FileError> {
        self.expr_base = at;
        let mut p = Parser::new(text);
        let parsed = p.expr().and_then(|ast| {
            if p.peek().is_some() {
                Err(expr_err(
                    p.pos,
                    format!("unexpected {} after the expression", p.found()),
                ))
            } else {
                Ok(ast)
            }
        });
        let resolved = parsed.and_then(|ast| self.resolve(&ast));
        resolved.map_err(|e| self.expr_error(text, at, what, e))
    }

    /// An [`ExprError`] of `text` (a string at byte `at`: its quote).
    fn expr_error(&self, text: &str, at: usize, what: &str, e: ExprError) -> FileError {
        self.err(
            e.kind,
            at + 1 + e.column,
            format!(
                "{what} \"{text}\", column {} of the expression: {}",
                e.column + 1,
                e.message
            ),
        )
    }

    fn resolve(&mut self, ast: &Ast) -> Result<RExpr, ExprError> {
        Ok(match ast {
            Ast::Int(v) => RExpr::Const(*v),
            Ast::Name(name, col) => {
                if let Some(slot) = self.scope.iter().rposition(|e| e.name == *name) {
                    RExpr::Slot(slot)
                } else if let Some(s) = self.symbols.iter().position(|s| s.name == *name) {
                    RExpr::Symbol(s as u32)
                } else {
                    let in_scope: Vec<&str> = self
                        .scope
                        .iter()
                        .map(|e| e.name.as_str())
                        .chain(self.symbols.iter().map(|s| s.name.as_str()))
                        .filter(|n| !n.is_empty())
                        .collect();
                    let hint = if self.tensors.iter().any(|t| t.name == *name) {
                        format!("; `{name}` is a tensor: read an element with load({name}, ...)")
                    } else {
                        String::new()
                    };
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::UnknownName,
                        message: format!(
                            "unknown name `{name}` (in scope: {}){hint}",
                            if in_scope.is_empty() {
                                "nothing".to_string()
                            } else {
                                in_scope.join(", ")
                            }
                        ),
                    });
                }
            }
            Ast::Load(tensor, col, index) => {
                let Some(t) = self.tensors.iter().position(|t| t.name == *tensor) else {
                    let known: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::UnknownTensor,
                        message: format!(
                            "unknown tensor `{tensor}` (tensors: {})",
                            known.join(", ")
                        ),
                    });
                };
                let def = &self.tensors[t];
                if def.dtype != DTYPE_I32 {
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::Shape,
                        message: format!("load from `{tensor}`: only i32 tensors can be loaded"),
                    });
                }
                if index.len() != def.shape.len() {
                    return Err(ExprError {
                        column: *col,
                        kind: ErrorKind::Shape,
                        message: format!(
                            "load from `{tensor}`: {} indices for a rank-{} tensor",
                            index.len(),
                            def.shape.len()
                        ),
                    });
                }
                let index = index
                    .iter()
                    .map(|i| self.resolve(i))
                    .collect::<Result<_, _>>()?;
                self.loads
                    .push((TensorId(t as u32), self.expr_base + 1 + *col));
                RExpr::Load(TensorId(t as u32), index)
            }
            Ast::Bin(op, a, b, col) => {
                let (a, b) = (self.resolve(a)?, self.resolve(b)?);
                match (&a, &b) {
                    // Constant arithmetic is folded, as the device would compute it.
                    (RExpr::Const(x), RExpr::Const(y)) => {
                        RExpr::Const(arith(*op, *x, *y).map_err(|m| expr_err(*col, m))?)
                    }
                    _ => RExpr::Bin(*op, Box::new(a), Box::new(b)),
                }
            }
            Ast::Ne(a, b, col) => {
                let eq = Ast::Bin(OP_EQ, a.clone(), b.clone(), *col);
                let ne = Ast::Bin(OP_SUB, Box::new(Ast::Int(1)), Box::new(eq), *col);
                self.resolve(&ne)?
            }
        })
    }

    fn body(&mut self, nodes: &[Spanned<RawNode>], stream: u8) -> Result<Vec<Step>, FileError> {
        let depth = self.scope.len();
        let mut steps = Vec::new();
        for node in nodes {
            steps.push(self.node(node, stream)?);
        }
        self.scope.truncate(depth);
        Ok(steps)
    }

    fn node(&mut self, node: &Spanned<RawNode>, stream: u8) -> Result<Step, FileError> {
        let at = node.span().start;
        let n = node.get_ref();
        let keys = n.keys();
        let kinds: Vec<&str> = keys
            .iter()
            .copied()
            .filter(|k| KIND_KEYS.contains(k))
            .collect();
        let kind =
            match kinds.as_slice() {
                [k] => *k,
                [] if keys.contains(&"stream") && keys.contains(&"body") => "stream",
                [] => return Err(self.err(
                    ErrorKind::Structure,
                    at,
                    "a body entry needs one of: parallel, sequential, select, when, let, call, \
                     record, wait, or stream with a body"
                        .to_string(),
                )),
                many => {
                    return Err(self.err(
                        ErrorKind::Structure,
                        at,
                        format!(
                            "a body entry is one thing, this one has {}: split it",
                            many.join(" and ")
                        ),
                    ))
                }
            };
        let allowed: &[&str] = match kind {
            "parallel" | "sequential" => &["dense", "dense_dyn", "ragged", "max", "body"],
            "select" => &["slot", "indptr", "indices", "row", "max", "body"],
            "when" => &["then", "otherwise"],
            "let" => &["value"],
            "call" => &["args", "scalars", "stream"],
            "record" | "wait" => &["stream"],
            "dispatch" => &["key", "body"],
            _ => &["body"],
        };
        if let Some(extra) = keys.iter().find(|k| **k != kind && !allowed.contains(k)) {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!(
                    "`{extra}` does not belong in a {kind} entry (it takes: {})",
                    allowed.join(", ")
                ),
            ));
        }
        match kind {
            "parallel" | "sequential" => {
                let name = n
                    .parallel
                    .as_ref()
                    .or(n.sequential.as_ref())
                    .expect("the kind's key");
                let axis = self.axis(n, at, kind)?;
                let body = n.body.as_ref().ok_or_else(|| self.need(at, kind, "body"))?;
                let depth = self.scope.len();
                self.bind(name.get_ref(), "loop variable", name.span().start)?;
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Loop {
                    var: name.get_ref().clone(),
                    kind: if kind == "parallel" {
                        Kind::Parallel
                    } else {
                        Kind::Sequential
                    },
                    axis,
                    body,
                    at,
                })
            }
            "select" => {
                let value = n.select.as_ref().expect("the kind's key");
                let csr = |r: &Self, t: &Option<Spanned<String>>, what: &str| {
                    let t = t.as_ref().ok_or_else(|| r.need(at, "select", what))?;
                    let id = r.tensor(t.get_ref(), t.span().start)?;
                    let def = &r.tensors[id.0 as usize];
                    if def.dtype != DTYPE_I32 || def.shape.len() != 2 || def.shape[0] != 1 {
                        return Err(r.err(
                            ErrorKind::Shape,
                            t.span().start,
                            format!(
                                "select's {what} `{}` must be an i32 tensor of shape [1, n], not {} {:?}",
                                def.name,
                                dtype_text(def.dtype),
                                def.shape
                            ),
                        ));
                    }
                    Ok((id, t.span().start))
                };
                let (indptr, indptr_at) = csr(self, &n.indptr, "indptr")?;
                let (indices, indices_at) = csr(self, &n.indices, "indices")?;
                self.loads.push((indptr, indptr_at));
                self.loads.push((indices, indices_at));
                let row = n.row.as_ref().ok_or_else(|| self.need(at, kind, "row"))?;
                let row = self.expr(row, "select row")?;
                let max = n.max.as_ref().ok_or_else(|| self.need(at, kind, "max"))?;
                let body = n.body.as_ref().ok_or_else(|| self.need(at, kind, "body"))?;
                let depth = self.scope.len();
                match &n.slot {
                    Some(slot) => self.bind(slot.get_ref(), "select slot", slot.span().start)?,
                    None => self.scope.push(ScopeEntry {
                        name: String::new(),
                        what: "select slot",
                        lazy: None,
                    }),
                }
                self.bind(value.get_ref(), "select value", value.span().start)?;
                self.scope.last_mut().expect("bound above").lazy = Some(indices);
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Select {
                    indptr,
                    indices,
                    row,
                    max: *max.get_ref(),
                    slot: n
                        .slot
                        .as_ref()
                        .map_or(String::new(), |s| s.get_ref().clone()),
                    value: value.get_ref().clone(),
                    body,
                    at,
                })
            }
            "when" => {
                let cond = self.expr(n.when.as_ref().expect("the kind's key"), "condition")?;
                let then = match &n.then {
                    Some(b) => self.body(b, stream)?,
                    None => return Err(self.need(at, kind, "then")),
                };
                let otherwise = match &n.otherwise {
                    Some(b) => self.body(b, stream)?,
                    None => Vec::new(),
                };
                Ok(Step::When {
                    cond,
                    then,
                    otherwise,
                    at,
                })
            }
            "let" => {
                let name = n.let_.as_ref().expect("the kind's key");
                let value = n
                    .value
                    .as_ref()
                    .ok_or_else(|| self.need(at, kind, "value"))?;
                let value = self.expr(value, &format!("let {}", name.get_ref()))?;
                self.bind(name.get_ref(), "let", name.span().start)?;
                Ok(Step::Let {
                    name: name.get_ref().clone(),
                    value,
                    at,
                })
            }
            "call" => self.call(n, at, stream),
            "record" | "wait" => {
                let event = n
                    .record
                    .as_ref()
                    .or(n.wait.as_ref())
                    .expect("the kind's key");
                let s = n
                    .stream
                    .as_ref()
                    .ok_or_else(|| self.need(at, kind, "stream"))?;
                let stream = self.stream_number(s)?;
                if *event.get_ref() as usize >= device_runtime::abi::MAX_EVENTS {
                    return Err(self.err(
                        ErrorKind::Structure,
                        event.span().start,
                        format!(
                            "event {}; events are 0 to {}",
                            event.get_ref(),
                            device_runtime::abi::MAX_EVENTS - 1
                        ),
                    ));
                }
                Ok(Step::Event {
                    record: kind == "record",
                    stream,
                    event: *event.get_ref() as u8,
                })
            }
            "dispatch" => {
                let policy = n.dispatch.as_ref().expect("the kind's key");
                let kind = PolicyKind::ALL
                    .into_iter()
                    .find(|k| k.name() == policy.get_ref())
                    .ok_or_else(|| {
                        let names: Vec<&str> = PolicyKind::ALL.iter().map(|k| k.name()).collect();
                        self.err(
                            ErrorKind::Structure,
                            policy.span().start,
                            format!(
                                "dispatch policy `{}`; policies are {}",
                                policy.get_ref(),
                                names.join(", ")
                            ),
                        )
                    })?;
                let key = match &n.key {
                    Some(k) => k.get_ref().parse::<DispatchKey>().map_err(|e| {
                        self.err(
                            ErrorKind::Structure,
                            k.span().start,
                            format!("dispatch key `{}`: {e}", k.get_ref()),
                        )
                    })?,
                    None => DispatchKey::TaskIndex,
                };
                let schedule = Schedule { policy: kind, key };
                let set = match self.tasksets.iter().position(|s| *s == schedule) {
                    Some(i) => i + 1,
                    None => {
                        self.tasksets.push(schedule);
                        self.tasksets.len()
                    }
                };
                if set >= device_runtime::abi::program::MAX_TASKSETS {
                    return Err(self.err(
                        ErrorKind::Structure,
                        at,
                        format!(
                            "{set} different dispatch schedules; a workload has at most {}",
                            device_runtime::abi::program::MAX_TASKSETS - 1
                        ),
                    ));
                }
                let body = n
                    .body
                    .as_ref()
                    .ok_or_else(|| self.need(at, "dispatch", "body"))?;
                let depth = self.scope.len();
                let body = self.body(body, stream)?;
                self.scope.truncate(depth);
                Ok(Step::Dispatch {
                    set: set as u8,
                    schedule,
                    body,
                })
            }
            _ => {
                let s = n.stream.as_ref().expect("checked above");
                let stream = self.stream_number(s)?;
                let body = self.body(n.body.as_ref().expect("checked above"), stream)?;
                Ok(Step::Stream { stream, body })
            }
        }
    }

    fn need(&self, at: usize, kind: &str, what: &str) -> FileError {
        self.err(
            ErrorKind::Structure,
            at,
            format!("a {kind} entry needs `{what}`"),
        )
    }

    fn stream_number(&self, s: &Spanned<u32>) -> Result<u8, FileError> {
        let max = device_runtime::abi::MAX_STREAMS;
        if *s.get_ref() == 0 || *s.get_ref() as usize > max {
            return Err(self.err(
                ErrorKind::Structure,
                s.span().start,
                format!("stream {}; streams are 1 to {max}", s.get_ref()),
            ));
        }
        Ok(*s.get_ref() as u8)
    }

    fn axis(&mut self, n: &RawNode, at: usize, kind: &str) -> Result<RAxis, FileError> {
        let given = [n.dense.is_some(), n.dense_dyn.is_some(), n.ragged.is_some()];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                format!(
                    "a {kind} loop needs exactly one axis: dense = N, dense_dyn = \"symbol\" \
                     or ragged = {{ lengths = \"t\", at = [..], max = N }}"
                ),
            ));
        }
        if n.max.is_some() && n.dense_dyn.is_none() {
            return Err(self.err(
                ErrorKind::Structure,
                at,
                "`max` of a loop goes with dense_dyn (a ragged axis has its own max)".to_string(),
            ));
        }
        if let Some(d) = &n.dense {
            return Ok(RAxis::Dense(*d.get_ref()));
        }
        if let Some(s) = &n.dense_dyn {
            let Some(symbol) = self.symbols.iter().position(|x| x.name == *s.get_ref()) else {
                let known: Vec<&str> = self.symbols.iter().map(|s| s.name.as_str()).collect();
                return Err(self.err(
                    ErrorKind::Symbol,
                    s.span().start,
                    format!(
                        "unknown symbol `{}` (symbols: {})",
                        s.get_ref(),
                        if known.is_empty() {
                            "none; declare them in [symbols]".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            };
            let max = n
                .max
                .as_ref()
                .map_or(self.symbols[symbol].max, |m| *m.get_ref());
            return Ok(RAxis::DenseDyn {
                symbol: symbol as u32,
                max,
            });
        }
        let r = n.ragged.as_ref().expect("one axis is given").get_ref();
        let lengths = self.tensor(r.lengths.get_ref(), r.lengths.span().start)?;
        let def = &self.tensors[lengths.0 as usize];
        if def.dtype != DTYPE_I32 || r.at.len() != def.shape.len() {
            return Err(self.err(
                ErrorKind::Shape,
                r.lengths.span().start,
                format!(
                    "ragged lengths `{}` must be an i32 tensor indexed by `at` (one index per dimension): it is {} {:?}, at has {}",
                    def.name,
                    dtype_text(def.dtype),
                    def.shape,
                    r.at.len()
                ),
            ));
        }
        self.loads.push((lengths, r.lengths.span().start));
        let at_exprs =
            r.at.iter()
                .map(|e| self.expr(e, "ragged index"))
                .collect::<Result<_, _>>()?;
        Ok(RAxis::Ragged {
            lengths,
            at: at_exprs,
            max: r.max,
        })
    }

    fn call(&mut self, n: &RawNode, at: usize, stream: u8) -> Result<Step, FileError> {
        let name = n.call.as_ref().expect("the kind's key");
        let Some(kernel) = wsp_ffi::all().iter().find(|k| k.name == name.get_ref()) else {
            let known: Vec<&str> = wsp_ffi::all().iter().map(|k| k.name).collect();
            return Err(self.err(
                ErrorKind::UnknownKernel,
                name.span().start,
                format!(
                    "unknown kernel `{}` (kernels: {})",
                    name.get_ref(),
                    known.join(", ")
                ),
            ));
        };
        let stream = match &n.stream {
            Some(s) => self.stream_number(s)?,
            None => stream,
        };
        let signature: Vec<&str> = kernel.tensor_args.iter().map(|a| a.name).collect();
        let args = n.args.as_deref().unwrap_or(&[]);
        if args.len() != kernel.num_tensors as usize {
            return Err(self.err(
                ErrorKind::Call,
                at,
                format!(
                    "call {}: {} tensor arguments, the kernel takes {} ({})",
                    kernel.name,
                    args.len(),
                    kernel.num_tensors,
                    signature.join(", ")
                ),
            ));
        }
        let scalars = n.scalars.as_deref().unwrap_or(&[]);
        if scalars.len() != kernel.num_scalars as usize {
            return Err(self.err(
                ErrorKind::Call,
                at,
                format!(
                    "call {}: {} scalars, the kernel takes {}",
                    kernel.name,
                    scalars.len(),
                    kernel.num_scalars
                ),
            ));
        }
        let mut regions = Vec::new();
        for (k, (arg, spec)) in args.iter().zip(kernel.tensor_args).enumerate() {
            let what = format!("call {} argument {k} ({})", kernel.name, spec.name);
            let region = self.region(arg, &what)?;
            let def = &self.tensors[region.tensor.0 as usize];
            if def.dtype != spec.dtype {
                return Err(self.err(
                    ErrorKind::Shape,
                    arg.span().start,
                    format!(
                        "{what}: the kernel takes {}, tensor `{}` is {}",
                        dtype_text(spec.dtype),
                        def.name,
                        dtype_text(def.dtype)
                    ),
                ));
            }
            if spec.access.writes() {
                self.written[region.tensor.0 as usize] = true;
            }
            regions.push(region);
        }
        let mut scalar_exprs = Vec::new();
        for s in scalars {
            scalar_exprs.push(match s.get_ref() {
                // A float scalar is passed as its f32 bits.
                ExprSrc::Float(v) => RExpr::Const((*v as f32).to_bits() as i64),
                _ => self.expr(s, &format!("call {} scalar", kernel.name))?,
            });
        }
        // Sizes known now are checked now; the rest at expansion.
        let consts: Option<Vec<TileShape>> = regions
            .iter()
            .map(|r| match (&r.rows, &r.cols) {
                (RExpr::Const(rows), RExpr::Const(cols)) => Some(TileShape {
                    rows: u32::try_from(*rows).ok()?,
                    cols: u32::try_from(*cols).ok()?,
                    dtype: self.tensors[r.tensor.0 as usize].dtype,
                }),
                _ => None,
            })
            .collect();
        let const_scalars: Option<Vec<u64>> = scalar_exprs
            .iter()
            .map(|s| match s {
                RExpr::Const(v) => Some(*v as u64),
                _ => None,
            })
            .collect();
        if let (Some(shapes), Some(scalars)) = (consts, const_scalars) {
            if let Err(e) = kernel.check(&shapes, &scalars) {
                return Err(self.err(
                    ErrorKind::Shape,
                    at,
                    format!(
                        "call {} ({}): {e}",
                        kernel.name,
                        describe_shapes(kernel, &shapes)
                    ),
                ));
            }
        }
        Ok(Step::Call {
            kernel,
            stream,
            args: regions,
            scalars: scalar_exprs,
            at,
        })
    }

    fn region(&mut self, arg: &Spanned<ArgSrc>, what: &str) -> Result<RRegion, FileError> {
        let at = arg.span().start;
        match arg.get_ref() {
            ArgSrc::Text(text) => {
                self.expr_base = at;
                self.region_text(text)
                    .map_err(|e| self.expr_error(text, at, what, e))
            }
            ArgSrc::Table(r) => {
                let tensor = self.tensor(&r.tensor, at)?;
                let offset =
                    r.at.iter()
                        .map(|e| self.expr(e, what))
                        .collect::<Result<Vec<_>, _>>()?;
                let rows = match &r.rows {
                    Some(e) => Some(self.expr(e, what)?),
                    None => None,
                };
                let cols = self.expr(&r.cols, what)?;
                self.check_region(tensor, offset, rows, cols)
                    .map_err(|e| self.err(e.kind, at, format!("{what}: {}", e.message)))
            }
        }
    }

    fn region_text(&mut self, text: &str) -> Result<RRegion, ExprError> {
        let mut p = Parser::new(text);
        let Some((name, col)) = p.ident() else {
            return Err(expr_err(
                p.pos,
                "expected a tensor name: t[row, col; rows x cols]",
            ));
        };
        let Some(id) = self.tensors.iter().position(|t| t.name == name) else {
            let known: Vec<&str> = self.tensors.iter().map(|t| t.name.as_str()).collect();
            return Err(ExprError {
                column: col,
                kind: ErrorKind::UnknownTensor,
                message: format!("unknown tensor `{name}` (tensors: {})", known.join(", ")),
            });
        };
        let tensor = TensorId(id as u32);
        if p.peek().is_none() {
            // The whole tensor.
            let shape = self.tensors[id].shape.clone();
            let rank = shape.len();
            if shape[..rank.saturating_sub(2)].iter().any(|&d| d != 1) {
                return Err(expr_err(
                    col,
                    format!(
                        "`{name}` has shape {shape:?}: name the region, {name}[i, j, ..; rows x cols]"
                    ),
                ));
            }
            let rows = if rank >= 2 { shape[rank - 2] } else { 1 };
            return Ok(RRegion {
                tensor,
                offset: vec![RExpr::Const(0); rank],
                rows: RExpr::Const(rows as i64),
                cols: RExpr::Const(shape[rank - 1] as i64),
            });
        }
        p.expect("[", "after the tensor name")?;
        let mut offset = vec![self.resolve(&p.expr()?)?];
        while p.eat(",") {
            offset.push(self.resolve(&p.expr()?)?);
        }
        p.expect(";", "before the region's size (t[row, col; rows x cols])")?;
        let first = self.resolve(&p.expr()?)?;
        // `rows x cols`: the `x` follows a complete expression, so it is
        // never a name.
        let (rows, cols) = if p.peek() == Some(b'x') {
            p.pos += 1;
            (Some(first), self.resolve(&p.expr()?)?)
        } else {
            (None, first)
        };
        p.expect("]", "to close the region")?;
        if p.peek().is_some() {
            return Err(expr_err(
                p.pos,
                format!("unexpected {} after the region", p.found()),
            ));
        }
        self.check_region(tensor, offset, rows, cols)
            .map_err(|mut e| {
                e.column = col;
                e
            })
    }

    /// Offsets per dimension, `rows x cols` for the last two (a rank-1
    /// region has only cols); constant parts are checked against the shape.
    fn check_region(
        &self,
        tensor: TensorId,
        offset: Vec<RExpr>,
        rows: Option<RExpr>,
        cols: RExpr,
    ) -> Result<RRegion, ExprError> {
        let def = &self.tensors[tensor.0 as usize];
        let rank = def.shape.len();
        let shape_err = |m: String| ExprError {
            column: 0,
            kind: ErrorKind::Shape,
            message: m,
        };
        if offset.len() != rank {
            return Err(shape_err(format!(
                "{} offsets for `{}`, a rank-{rank} tensor of shape {:?}",
                offset.len(),
                def.name,
                def.shape
            )));
        }
        let rows = match (rank, rows) {
            (1, Some(_)) => {
                return Err(shape_err(format!(
                    "`{}` has rank 1: its region has one size, t[i; cols]",
                    def.name
                )))
            }
            (1, None) => RExpr::Const(1),
            (_, Some(r)) => r,
            (_, None) => {
                return Err(shape_err(format!(
                    "`{}` has rank {rank}: its region's size is rows x cols",
                    def.name
                )))
            }
        };
        let mut extent = vec![RExpr::Const(1); rank];
        extent[rank - 1] = cols.clone();
        if rank >= 2 {
            extent[rank - 2] = rows.clone();
        }
        for d in 0..rank {
            let o = match &offset[d] {
                RExpr::Const(v) => Some(*v),
                _ => None,
            };
            let e = match &extent[d] {
                RExpr::Const(v) => Some(*v),
                _ => None,
            };
            let dim = def.shape[d] as i64;
            if let Some(e) = e {
                if e < 1 || e > dim {
                    return Err(shape_err(format!(
                        "size {e} in dimension {d} of `{}` (shape {:?})",
                        def.name, def.shape
                    )));
                }
            }
            if let Some(o) = o {
                let end = o + e.unwrap_or(1);
                if o < 0 || end > dim {
                    return Err(shape_err(format!(
                        "offset {o}{} in dimension {d} is outside `{}` (shape {:?})",
                        e.map_or(String::new(), |e| format!(" + size {e}")),
                        def.name,
                        def.shape
                    )));
                }
            }
        }
        Ok(RRegion {
            tensor,
            offset,
            rows,
            cols,
        })
    }
}

fn describe_shapes(kernel: &KernelInfo, shapes: &[TileShape]) -> String {
    kernel
        .tensor_args
        .iter()
        .zip(shapes)
        .map(|(a, s)| format!("{} {}x{}", a.name, s.rows, s.cols))
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------
// Lowering onto the workload language

fn to_expr(e: &RExpr, env: &[Expr]) -> Expr {
    match e {
        RExpr::Const(v) => Expr::Const(*v),
        RExpr::Slot(s) => env[*s].clone(),
        RExpr::Symbol(s) => Expr::Symbol(*s),
        RExpr::Load(t, index) => Expr::load(*t, index.iter().map(|i| to_expr(i, env)).collect()),
        RExpr::Bin(op, a, b) => {
            let (a, b) = (to_expr(a, env), to_expr(b, env));
            match *op {
                OP_ADD => a + b,
                OP_SUB => a - b,
                OP_MUL => a * b,
                OP_DIV => a / b,
                OP_REM => a % b,
                OP_MIN => a.min(b),
                OP_MAX => a.max(b),
                OP_LT => a.lt(b),
                OP_LE => a.le(b),
                _ => a.equals(b),
            }
        }
    }
}

/// Lowers `steps` with `env` holding the workload language's value of
/// each slot in scope.
fn lower(w: &mut Program, steps: &[Step], env: &mut Vec<Expr>) {
    let depth = env.len();
    for step in steps {
        match step {
            Step::Loop {
                kind, axis, body, ..
            } => {
                let axis = match axis {
                    RAxis::Dense(n) => Axis::Dense(*n),
                    RAxis::DenseDyn { symbol, max } => Axis::DenseDyn {
                        symbol: *symbol,
                        max: *max,
                    },
                    RAxis::Ragged { lengths, at, max } => Axis::Ragged {
                        lengths: *lengths,
                        at: at.iter().map(|e| to_expr(e, env)).collect(),
                        max: *max,
                    },
                };
                let inner = |w: &mut Program, i: Expr| {
                    env.push(i);
                    lower(w, body, env);
                    env.pop();
                };
                match kind {
                    Kind::Parallel => w.parallel(axis, inner),
                    Kind::Sequential => w.sequential(axis, inner),
                }
            }
            Step::Select {
                indptr,
                indices,
                row,
                max,
                body,
                ..
            } => {
                let row = to_expr(row, env);
                w.select(*indptr, *indices, row, *max, |w, j, value| {
                    env.push(j);
                    env.push(value);
                    lower(w, body, env);
                    env.truncate(env.len() - 2);
                });
            }
            Step::When {
                cond,
                then,
                otherwise,
                ..
            } => {
                let cond = to_expr(cond, env);
                let (mut e1, mut e2) = (env.clone(), env.clone());
                w.when(
                    cond,
                    |w| lower(w, then, &mut e1),
                    |w| lower(w, otherwise, &mut e2),
                );
            }
            Step::Let { value, .. } => {
                let v = w.let_(to_expr(value, env));
                env.push(v);
            }
            Step::Call {
                kernel,
                stream,
                args,
                scalars,
                ..
            } => {
                let regions: Vec<Region> = args
                    .iter()
                    .map(|r| Region {
                        tensor: r.tensor,
                        offset: r.offset.iter().map(|o| to_expr(o, env)).collect(),
                        rows: to_expr(&r.rows, env),
                        cols: to_expr(&r.cols, env),
                    })
                    .collect();
                let scalars: Vec<Expr> = scalars.iter().map(|s| to_expr(s, env)).collect();
                w.on_stream(*stream, |w| w.call(kernel.id, &regions, &scalars));
            }
            Step::Stream { stream, body } => {
                w.on_stream(*stream, |w| {
                    let depth = env.len();
                    lower(w, body, env);
                    env.truncate(depth);
                });
            }
            Step::Dispatch { schedule, body, .. } => {
                w.dispatch(schedule.policy, schedule.key, |w| {
                    let depth = env.len();
                    lower(w, body, env);
                    env.truncate(depth);
                });
            }
            Step::Event {
                record,
                stream,
                event,
            } => {
                if *record {
                    w.record_event(*stream, *event);
                } else {
                    w.wait_event(*stream, *event);
                }
            }
        }
    }
    env.truncate(depth);
}

// ---------------------------------------------------------------------------
// The parsed file

/// A parsed and resolved workload file: build it with [`WorkloadFile::build`]
/// for given symbol values.
pub struct WorkloadFile {
    pub name: String,
    pub summary: String,
    text: String,
    tensors: Vec<TensorDef>,
    symbols: Vec<SymbolDef>,
    steps: Vec<Step>,
    /// `[schedule] window`.
    window: Option<u32>,
}

/// Elements one tensor may have, and bytes the arena may take.
const MAX_ELEMENTS: u64 = 1 << 26;
const MAX_ARENA: u64 = 1 << 28;

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

    fn parse_named(text: &str, default_name: &str) -> Result<WorkloadFile, FileError> {
        nesting(text)?;
        let raw: RawFile = toml::from_str(text).map_err(|e| {
            let src = Src { text };
            let mut err = src.at(
                ErrorKind::Syntax,
                e.span().map(|s| s.start),
                e.message().to_string(),
            );
            if err.line.is_none() {
                err.message = e.to_string();
            }
            err
        })?;
        let src = Src { text };
        let mut tensors: Vec<(usize, String, RawTensor)> = raw
            .tensors
            .into_iter()
            .map(|(name, t)| (t.span().start, name, t.into_inner()))
            .collect();
        // Declaration order is the file's (and so the arena's).
        tensors.sort_by_key(|t| t.0);
        let mut defs = Vec::new();
        let mut arena = 0u64;
        for (at, name, t) in &tensors {
            let def = tensor_def(&src, *at, name, t)?;
            arena = arena.next_multiple_of(64)
                + def.shape.iter().map(|&d| d as u64).product::<u64>() * 4;
            if arena > MAX_ARENA {
                return Err(src.at(
                    ErrorKind::Tensor,
                    Some(*at),
                    format!("tensor `{name}`: the tensors take more than {MAX_ARENA} bytes"),
                ));
            }
            defs.push(def);
        }
        let mut symbols: Vec<(usize, String, RawSymbol)> = raw
            .symbols
            .into_iter()
            .map(|(name, s)| (s.span().start, name, s.into_inner()))
            .collect();
        symbols.sort_by_key(|s| s.0);
        if symbols.len() > MAX_SYMBOLS {
            return Err(src.at(
                ErrorKind::Symbol,
                Some(symbols[MAX_SYMBOLS].0),
                format!("more than {MAX_SYMBOLS} symbols"),
            ));
        }
        let mut symbol_defs = Vec::new();
        for (at, name, s) in &symbols {
            if !is_ident(name) || RESERVED.contains(&name.as_str()) {
                return Err(src.at(
                    ErrorKind::Symbol,
                    Some(*at),
                    format!("`{name}` cannot name a symbol: use letters, digits and _, not min, max, load or x"),
                ));
            }
            if let Some(d) = s.default {
                if d < 0 || d > s.max as i64 {
                    return Err(src.at(
                        ErrorKind::Symbol,
                        Some(*at),
                        format!("symbol `{name}`: default {d} outside [0, {}]", s.max),
                    ));
                }
            }
            symbol_defs.push(SymbolDef {
                name: name.clone(),
                max: s.max,
                default: s.default,
            });
        }
        let mut r = Resolver {
            src,
            written: vec![false; defs.len()],
            tensors: defs,
            symbols: symbol_defs,
            scope: Vec::new(),
            loads: Vec::new(),
            expr_base: 0,
            tasksets: Vec::new(),
        };
        let steps = r.body(&raw.body, 0)?;
        // A load of data nobody writes must be of an input.
        for &(t, at) in &r.loads {
            let def = &r.tensors[t.0 as usize];
            if !def.input && !r.written[t.0 as usize] {
                return Err(r.err(
                    ErrorKind::Tensor,
                    at,
                    format!(
                        "the program reads `{}`, which no call writes: if the host provides it, \
                         mark it `input = true` (line {})",
                        def.name,
                        r.src
                            .at(ErrorKind::Tensor, Some(def.at), String::new())
                            .line
                            .unwrap_or(0)
                    ),
                ));
            }
        }
        let name = raw.name.unwrap_or_else(|| default_name.to_string());
        let summary = raw.summary.unwrap_or_default();
        let mut window = None;
        if let Some(w) = raw
            .schedule
            .as_ref()
            .and_then(|s| s.get_ref().window.as_ref())
        {
            let max = device_runtime::exec::TASK_WINDOW;
            if *w.get_ref() == 0 || *w.get_ref() as usize > max {
                return Err(r.err(
                    ErrorKind::Structure,
                    w.span().start,
                    format!("task window {}; 1 to {max} tasks", w.get_ref()),
                ));
            }
            window = Some(*w.get_ref());
        }
        let Resolver {
            tensors, symbols, ..
        } = r;
        Ok(WorkloadFile {
            name,
            summary,
            text: text.to_string(),
            tensors,
            symbols,
            steps,
            window,
        })
    }
}

/// Refuses text whose arrays and tables nest deeper than [`MAX_NESTING`]
/// (outside strings and comments), before a parser recurses into it.
fn nesting(text: &str) -> Result<(), FileError> {
    let (mut depth, mut quote, mut comment, mut escaped) = (0usize, None::<char>, false, false);
    for (at, c) in text.char_indices() {
        if comment {
            comment = c != '\n';
        } else if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' && q == '"' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
        } else {
            match c {
                '#' => comment = true,
                '"' | '\'' => quote = Some(c),
                '[' | '{' => {
                    depth += 1;
                    if depth > MAX_NESTING {
                        return Err(Src { text }.at(
                            ErrorKind::Syntax,
                            Some(at),
                            format!("arrays and tables nested deeper than {MAX_NESTING}"),
                        ));
                    }
                }
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    Ok(())
}

/// A tensor's declaration and initial data, checked.
fn tensor_def(src: &Src, at: usize, name: &str, t: &RawTensor) -> Result<TensorDef, FileError> {
    let bad = |m: String| src.at(ErrorKind::Tensor, Some(at), format!("tensor `{name}`: {m}"));
    if !is_ident(name) || name.len() > 16 {
        return Err(bad(
            "a tensor name is up to 16 letters, digits and _, not starting with a digit".into(),
        ));
    }
    let dtype = match t.dtype.as_deref() {
        None | Some("f32") => DTYPE_F32,
        Some("i32") => DTYPE_I32,
        Some(other) => return Err(bad(format!("dtype \"{other}\"; dtypes are f32 and i32"))),
    };
    if t.shape.is_empty() || t.shape.len() > MAX_RANK || t.shape.contains(&0) {
        return Err(bad(format!(
            "shape {:?}: 1 to {MAX_RANK} dimensions, none 0",
            t.shape
        )));
    }
    let elements = t
        .shape
        .iter()
        .try_fold(1u64, |n, &d| n.checked_mul(d as u64))
        .filter(|&n| n <= MAX_ELEMENTS)
        .ok_or_else(|| {
            bad(format!(
                "shape {:?}: more than {MAX_ELEMENTS} elements",
                t.shape
            ))
        })? as usize;
    let init = match (t.init.as_deref(), &t.values) {
        (None, Some(_)) | (Some("values"), Some(_)) => "values",
        (Some("values"), None) => return Err(bad("init = \"values\" needs `values`".into())),
        (None, None) => "zeros",
        (Some(i @ ("zeros" | "random")), None) => i,
        (Some(_), Some(_)) => {
            return Err(bad(
                "`values` gives the data: leave out init (or write init = \"values\")".into(),
            ))
        }
        (Some(other), None) => {
            return Err(bad(format!(
                "init \"{other}\"; inits are \"zeros\", \"random\" (with a seed) and \"values\""
            )))
        }
    };
    let present = [
        ("seed", t.seed.is_some()),
        ("skip", t.skip.is_some()),
        ("scale", t.scale.is_some()),
        ("range", t.range.is_some()),
    ];
    let allowed: &[&str] = match (init, dtype) {
        ("random", DTYPE_F32) => &["seed", "skip", "scale"],
        ("random", _) => &["seed", "skip", "range"],
        _ => &[],
    };
    if let Some((key, _)) = present.iter().find(|(k, p)| *p && !allowed.contains(k)) {
        return Err(bad(format!(
            "`{key}` does not go with init = \"{init}\" for {}",
            dtype_text(dtype)
        )));
    }
    let data = match init {
        "zeros" => Data::Zeros,
        "values" => {
            let values = t.values.as_deref().unwrap_or(&[]);
            if values.len() != elements {
                return Err(bad(format!(
                    "{} values for {elements} elements (shape {:?})",
                    values.len(),
                    t.shape
                )));
            }
            if dtype == DTYPE_I32 {
                let mut out = Vec::with_capacity(elements);
                for &v in values {
                    if v.fract() != 0.0 || v < i32::MIN as f64 || v > i32::MAX as f64 {
                        return Err(bad(format!("{v} is not an i32")));
                    }
                    out.push(v as i32);
                }
                Data::I32(out)
            } else {
                if let Some(v) = values.iter().find(|&&v| !(v as f32).is_finite()) {
                    return Err(bad(format!("{v} is not a finite f32")));
                }
                Data::F32(values.iter().map(|&v| v as f32).collect())
            }
        }
        _ => {
            let seed = t
                .seed
                .ok_or_else(|| bad("init = \"random\" needs a seed".into()))?;
            let skip = t.skip.unwrap_or(0);
            if skip > 1 << 32 {
                return Err(bad(format!("skip {skip} is more than 2^32")));
            }
            let mut rng = SplitMix64::new(seed);
            for _ in 0..skip {
                rng.next_u64();
            }
            if dtype == DTYPE_F32 {
                let scale = t.scale.unwrap_or(1.0);
                if !(scale as f32).is_finite() {
                    return Err(bad(format!("scale {scale} is not a finite f32")));
                }
                let scale = scale as f32;
                Data::F32(rng.fill(elements).iter().map(|v| v * scale).collect())
            } else {
                let [lo, hi] = t
                    .range
                    .ok_or_else(|| bad("random i32 data needs range = [lo, hi]".into()))?;
                if lo > hi || lo < i32::MIN as i64 || hi > i32::MAX as i64 {
                    return Err(bad(format!("range [{lo}, {hi}] is not an i32 range")));
                }
                let span = (hi - lo) as u64 + 1;
                Data::I32(
                    (0..elements)
                        .map(|_| (lo + rng.below(span) as i64) as i32)
                        .collect(),
                )
            }
        }
    };
    Ok(TensorDef {
        name: name.to_string(),
        dtype,
        shape: t.shape.clone(),
        input: t.input.unwrap_or(false),
        at,
        data,
    })
}

impl WorkloadFile {
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
            let id = if t.dtype == DTYPE_I32 {
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
        lower(&mut w, &self.steps, &mut Vec::new());
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
        shadow.steps(&self.steps)?;
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

/// A workload file built for given symbols: its table and initial arena,
/// and the f64 reference of the run.
pub struct FileWorkload {
    pub name: String,
    pub summary: String,
    pub table: Vec<u8>,
    /// The initial arena.
    pub arena: Arena,
    pub tensors: Vec<TensorLayout>,
    /// The symbols' values, in index order (bind them at launch:
    /// `RunOptions::symbols`).
    pub symbols: Vec<i64>,
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

const U: f64 = 1.0 / (1u64 << 24) as f64;
/// The relative error the exp of `kernels/include/wsp_tile.hpp` documents.
const EXP_REL: f64 = 1e-6;
const TINY: f64 = f32::MIN_POSITIVE as f64;
/// Tasks the reference expands at most, and loop iterations.
const MAX_TASKS: usize = 1 << 22;
const MAX_ITERATIONS: u64 = 1 << 26;
/// Brackets and braces nested at most (deeper files are refused before
/// parsing; the device keeps 8 loops).
const MAX_NESTING: usize = 64;

/// How the f32 bounds are made, for the report.
pub const F32_BOUND: &str = "|run - f64| <= the f32 rounding bound of each task's kernel \
     (gamma_(K+1) of a GEMM's sums, gamma_(H+2) for expert_rows, u for add, gamma_(n+6) for \
     rmsnorm, 1e-6 + u|x - max| per exp for softmax and route_topk), the inputs' bounds carried \
     through to first order";
const F32_TOLERANCE: &str = "|run - f64| <= propagated f32 rounding bound";
const I32_TOLERANCE: &str = "i32 outputs equal the reference exactly";
const UNCHANGED: &str = "tensors no task writes are unchanged, bit for bit";

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

impl FileWorkload {
    /// The workload-language program the file lowered to (e.g. for
    /// [`Program::expand`]).
    pub fn program(&self) -> &Program {
        &self.program
    }

    /// Checks a run's arena against the f64 reference: one line per tensor
    /// the tasks write, and one for the others (unchanged).
    pub fn check(&self, arena: &Arena) -> Vec<Verification> {
        if arena.bytes.len() != self.arena.bytes.len() {
            return vec![Verification {
                output: format!(
                    "arena of {} bytes (expected {})",
                    arena.bytes.len(),
                    self.arena.bytes.len()
                ),
                elements: 0,
                max_abs_err: f64::INFINITY,
                max_rel_err: f64::INFINITY,
                worst_error_over_bound: f64::INFINITY,
                tolerance: "arena size must match",
            }];
        }
        let mut out = Vec::new();
        let mut unchanged = Vec::new();
        let mut changed = Vec::new();
        for (t, layout) in self.tensors.iter().enumerate() {
            if !self.written[t] {
                let range = layout.arena_offset as usize
                    ..layout.arena_offset as usize + layout.elements() * 4;
                if arena.bytes[range.clone()] == self.arena.bytes[range] {
                    unchanged.push(layout.name.as_str());
                } else {
                    changed.push(layout.name.as_str());
                }
                continue;
            }
            let (want, bound) = (&self.expected[t], &self.bounds[t]);
            if layout.dtype == DTYPE_I32 {
                let got = arena.read_i32(layout);
                let diff: Vec<usize> = (0..got.len())
                    .filter(|&i| got[i] as f64 != want[i])
                    .collect();
                let max_abs_err = diff
                    .iter()
                    .map(|&i| (got[i] as f64 - want[i]).abs())
                    .fold(0.0, f64::max);
                out.push(Verification {
                    output: match diff.first() {
                        None => format!("{} (i32)", layout.name),
                        Some(&i) => format!(
                            "{} (i32): {} of {} elements differ, the first at {i}: run {}, reference {}",
                            layout.name,
                            diff.len(),
                            got.len(),
                            got[i],
                            want[i]
                        ),
                    },
                    elements: got.len(),
                    max_abs_err,
                    max_rel_err: if diff.is_empty() { 0.0 } else { f64::INFINITY },
                    worst_error_over_bound: if diff.is_empty() { 0.0 } else { f64::INFINITY },
                    tolerance: I32_TOLERANCE,
                });
                continue;
            }
            let got = arena.read_f32(layout);
            let mut v = Verification {
                output: layout.name.clone(),
                elements: got.len(),
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                worst_error_over_bound: 0.0,
                tolerance: F32_TOLERANCE,
            };
            for i in 0..got.len() {
                let (g, w) = (got[i] as f64, want[i]);
                let err = if g == w || (g.is_nan() && w.is_nan()) {
                    0.0
                } else {
                    (g - w).abs()
                };
                let ratio = if err == 0.0 {
                    0.0
                } else {
                    err / (bound[i] + TINY)
                };
                if !err.is_nan() {
                    v.max_abs_err = v.max_abs_err.max(err);
                }
                if w != 0.0 && w.is_finite() {
                    v.max_rel_err = v.max_rel_err.max(err / w.abs());
                }
                // NaN compares false: make it fail loudly.
                v.worst_error_over_bound = if ratio.is_nan() {
                    f64::INFINITY
                } else {
                    v.worst_error_over_bound.max(ratio)
                };
            }
            out.push(v);
        }
        if !unchanged.is_empty() || !changed.is_empty() {
            out.push(Verification {
                output: if changed.is_empty() {
                    format!("unwritten tensors {}", unchanged.join(", "))
                } else {
                    format!(
                        "unwritten tensors: {} changed (no task writes them)",
                        changed.join(", ")
                    )
                },
                elements: unchanged.len() + changed.len(),
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                worst_error_over_bound: if changed.is_empty() {
                    0.0
                } else {
                    f64::INFINITY
                },
                tolerance: UNCHANGED,
            });
        }
        out
    }

    /// Whether a run of `ran` tasks ran the reference expansion's number.
    pub fn check_task_count(&self, ran: usize) -> Verification {
        let ok = ran == self.tasks.len();
        Verification {
            output: format!(
                "tasks: the run ran {ran}, the reference expansion has {}",
                self.tasks.len()
            ),
            elements: ran,
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            worst_error_over_bound: if ok { 0.0 } else { f64::INFINITY },
            tolerance: "the same number of tasks",
        }
    }
}

// ---------------------------------------------------------------------------
// The f64 reference: the expansion, executed task by task on a shadow

/// A region's 2-D view: `rows` x `cols` elements from `first`, rows
/// `stride` apart.
struct View {
    tensor: usize,
    first: usize,
    rows: usize,
    cols: usize,
    stride: usize,
}

/// Values and their error bounds, row-major.
struct Tile {
    rows: usize,
    cols: usize,
    v: Vec<f64>,
    e: Vec<f64>,
}

impl Tile {
    fn new(rows: usize, cols: usize) -> Tile {
        Tile {
            rows,
            cols,
            v: vec![0.0; rows * cols],
            e: vec![0.0; rows * cols],
        }
    }
}

struct Shadow<'a> {
    src: &'a Src<'a>,
    layouts: &'a [TensorLayout],
    symbols: &'a [i64],
    val: Vec<Vec<f64>>,
    err: Vec<Vec<f64>>,
    /// Per slot in scope: its value, whether it is a select's value (read
    /// from `indices` at the slot's value), and its name.
    env: Vec<(i64, Option<TensorId>, String)>,
    tasks: Vec<Expanded>,
    written: Vec<bool>,
    notes: Vec<String>,
    iterations: u64,
    /// The taskset of the calls being expanded.
    taskset: u8,
}

impl<'a> Shadow<'a> {
    fn new(
        src: &'a Src<'a>,
        layouts: &'a [TensorLayout],
        arena: &Arena,
        symbols: &'a [i64],
    ) -> Self {
        let val = layouts
            .iter()
            .map(|l| {
                if l.dtype == DTYPE_I32 {
                    arena.read_i32(l).iter().map(|&v| v as f64).collect()
                } else {
                    arena.read_f32(l).iter().map(|&v| v as f64).collect()
                }
            })
            .collect();
        let err = layouts.iter().map(|l| vec![0.0; l.elements()]).collect();
        Shadow {
            src,
            layouts,
            symbols,
            val,
            err,
            env: Vec::new(),
            tasks: Vec::new(),
            written: vec![false; layouts.len()],
            notes: Vec::new(),
            iterations: 0,
            taskset: 0,
        }
    }

    /// An expansion error at `at`, with the loop indices in scope.
    fn fail(&self, at: usize, message: String) -> FileError {
        let scope: Vec<String> = self
            .env
            .iter()
            .filter(|(_, lazy, name)| lazy.is_none() && !name.is_empty())
            .map(|(v, _, name)| format!("{name} = {v}"))
            .collect();
        let with = if scope.is_empty() {
            String::new()
        } else {
            format!(" (with {})", scope.join(", "))
        };
        self.src
            .at(ErrorKind::Expand, Some(at), format!("{message}{with}"))
    }

    fn load(&self, t: TensorId, index: &[i64]) -> Result<i64, String> {
        let l = &self.layouts[t.0 as usize];
        let mut flat = 0usize;
        for (d, &i) in index.iter().enumerate() {
            if i < 0 || i >= l.shape[d] as i64 {
                return Err(format!(
                    "load({}, {}): index {i} outside dimension {d} of shape {:?}",
                    l.name,
                    index
                        .iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    l.shape
                ));
            }
            flat = flat * l.shape[d] as usize + i as usize;
        }
        Ok(self.val[t.0 as usize][flat] as i64)
    }

    fn eval(&self, e: &RExpr) -> Result<i64, String> {
        match e {
            RExpr::Const(v) => Ok(*v),
            RExpr::Slot(s) => match &self.env[*s] {
                (v, None, _) => Ok(*v),
                (j, Some(indices), _) => self.load(*indices, &[0, *j]),
            },
            RExpr::Symbol(s) => Ok(self.symbols[*s as usize]),
            RExpr::Load(t, index) => {
                let index = index
                    .iter()
                    .map(|i| self.eval(i))
                    .collect::<Result<Vec<_>, _>>()?;
                self.load(*t, &index)
            }
            RExpr::Bin(op, a, b) => {
                arith(*op, self.eval(a)?, self.eval(b)?).map_err(|m| m.to_string())
            }
        }
    }

    fn count(&mut self, n: i64, max: u32, at: usize) -> Result<i64, FileError> {
        if n < 0 || n > max as i64 {
            return Err(self.fail(at, format!("loop count {n} outside [0, {max}]")));
        }
        self.iterations += n as u64;
        if self.iterations > MAX_ITERATIONS {
            return Err(self.fail(
                at,
                format!("the loops run more than {MAX_ITERATIONS} iterations"),
            ));
        }
        Ok(n)
    }

    fn steps(&mut self, steps: &[Step]) -> Result<(), FileError> {
        let depth = self.env.len();
        for step in steps {
            match step {
                Step::Loop {
                    var,
                    axis,
                    body,
                    at,
                    ..
                } => {
                    let (n, max) = match axis {
                        RAxis::Dense(n) => (*n as i64, *n),
                        RAxis::DenseDyn { symbol, max } => (self.symbols[*symbol as usize], *max),
                        RAxis::Ragged {
                            lengths,
                            at: index,
                            max,
                        } => {
                            let index = index
                                .iter()
                                .map(|i| self.eval(i))
                                .collect::<Result<Vec<_>, _>>()
                                .and_then(|i| self.load(*lengths, &i))
                                .map_err(|m| self.fail(*at, m))?;
                            (index, *max)
                        }
                    };
                    for i in 0..self.count(n, max, *at)? {
                        self.env.push((i, None, var.clone()));
                        self.steps(body)?;
                        self.env.pop();
                    }
                }
                Step::Select {
                    indptr,
                    indices,
                    row,
                    max,
                    slot,
                    value,
                    body,
                    at,
                } => {
                    let (start, end) = self
                        .eval(row)
                        .and_then(|r| {
                            let next = r.checked_add(1).ok_or("arithmetic overflow")?;
                            Ok((
                                self.load(*indptr, &[0, r])?,
                                self.load(*indptr, &[0, next])?,
                            ))
                        })
                        .map_err(|m| self.fail(*at, m))?;
                    for v in 0..self.count(end - start, *max, *at)? {
                        let j = start + v;
                        self.env.push((j, None, slot.clone()));
                        self.env.push((j, Some(*indices), value.clone()));
                        self.steps(body)?;
                        self.env.truncate(self.env.len() - 2);
                    }
                }
                Step::When {
                    cond,
                    then,
                    otherwise,
                    at,
                } => {
                    let c = self.eval(cond).map_err(|m| self.fail(*at, m))?;
                    self.steps(if c != 0 { then } else { otherwise })?;
                }
                Step::Let { name, value, at } => {
                    let v = self.eval(value).map_err(|m| self.fail(*at, m))?;
                    self.env.push((v, None, name.clone()));
                }
                Step::Call {
                    kernel,
                    stream,
                    args,
                    scalars,
                    at,
                } => self.call(kernel, *stream, args, scalars, *at)?,
                Step::Stream { body, .. } => {
                    let depth = self.env.len();
                    self.steps(body)?;
                    self.env.truncate(depth);
                }
                Step::Dispatch { set, body, .. } => {
                    let (depth, outer) = (self.env.len(), self.taskset);
                    self.taskset = *set;
                    self.steps(body)?;
                    self.taskset = outer;
                    self.env.truncate(depth);
                }
                Step::Event { .. } => {}
            }
        }
        self.env.truncate(depth);
        Ok(())
    }

    fn call(
        &mut self,
        kernel: &KernelInfo,
        stream: u8,
        args: &[RRegion],
        scalars: &[RExpr],
        at: usize,
    ) -> Result<(), FileError> {
        if self.tasks.len() == MAX_TASKS {
            return Err(self.fail(at, format!("more than {MAX_TASKS} tasks")));
        }
        let mut expanded = Vec::new();
        let mut views = Vec::new();
        let mut shapes = Vec::new();
        for (k, r) in args.iter().enumerate() {
            let l = &self.layouts[r.tensor.0 as usize];
            let rank = l.shape.len();
            let what = format!("call {} argument {k} ({})", kernel.name, l.name);
            let mut offset = [0u32; MAX_RANK];
            let mut extent = [1u32; MAX_RANK];
            let mut ext = vec![1i64; rank];
            ext[rank - 1] = self.eval(&r.cols).map_err(|m| self.fail(at, m))?;
            if rank >= 2 {
                ext[rank - 2] = self.eval(&r.rows).map_err(|m| self.fail(at, m))?;
            }
            let mut first = 0usize;
            for d in 0..rank {
                let o = self.eval(&r.offset[d]).map_err(|m| self.fail(at, m))?;
                let dim = l.shape[d] as i64;
                if o < 0 || ext[d] < 1 || o.saturating_add(ext[d]) > dim {
                    return Err(self.fail(
                        at,
                        format!(
                            "{what}: [{o}, {}) in dimension {d} is outside shape {:?}",
                            o.saturating_add(ext[d]),
                            l.shape
                        ),
                    ));
                }
                offset[d] = o as u32;
                extent[d] = ext[d] as u32;
                let stride: usize = l.shape[d + 1..].iter().map(|&s| s as usize).product();
                first += o as usize * stride;
            }
            let cols = extent[rank - 1] as usize;
            let (rows, stride) = if rank >= 2 {
                (extent[rank - 2] as usize, l.shape[rank - 1] as usize)
            } else {
                (1, cols)
            };
            shapes.push(TileShape {
                rows: rows as u32,
                cols: cols as u32,
                dtype: l.dtype,
            });
            views.push(View {
                tensor: r.tensor.0 as usize,
                first,
                rows,
                cols,
                stride,
            });
            expanded.push((r.tensor.0, offset, extent));
        }
        let scalars = scalars
            .iter()
            .map(|s| self.eval(s).map(|v| v as u64))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|m| self.fail(at, m))?;
        if let Err(e) = kernel.check(&shapes, &scalars) {
            return Err(self.fail(
                at,
                format!(
                    "call {} ({}): {e}",
                    kernel.name,
                    describe_shapes(kernel, &shapes)
                ),
            ));
        }
        let task = self.tasks.len();
        self.tasks.push(Expanded {
            kernel: kernel.id,
            stream,
            args: expanded,
            scalars: scalars.clone(),
            taskset: self.taskset,
        });
        let inputs: Vec<Tile> = views.iter().map(|v| self.gather(v)).collect();
        let outputs = run_kernel(kernel.name, &inputs, &scalars, &mut |note| {
            self.notes
                .push(format!("task {task} ({}): {note}", kernel.name))
        });
        for ((view, spec), tile) in views.iter().zip(kernel.tensor_args).zip(outputs) {
            if let (true, Some(tile)) = (spec.access.writes(), tile) {
                self.scatter(view, &tile);
                self.written[view.tensor] = true;
            }
        }
        Ok(())
    }

    fn gather(&self, v: &View) -> Tile {
        let mut t = Tile::new(v.rows, v.cols);
        for r in 0..v.rows {
            let from = v.first + r * v.stride;
            t.v[r * v.cols..(r + 1) * v.cols]
                .copy_from_slice(&self.val[v.tensor][from..from + v.cols]);
            t.e[r * v.cols..(r + 1) * v.cols]
                .copy_from_slice(&self.err[v.tensor][from..from + v.cols]);
        }
        t
    }

    fn scatter(&mut self, v: &View, t: &Tile) {
        for r in 0..v.rows {
            let to = v.first + r * v.stride;
            self.val[v.tensor][to..to + v.cols].copy_from_slice(&t.v[r * v.cols..(r + 1) * v.cols]);
            self.err[v.tensor][to..to + v.cols].copy_from_slice(&t.e[r * v.cols..(r + 1) * v.cols]);
        }
    }
}

/// Runs kernel `name` in f64 on its (contract-checked) arguments and
/// returns the new value of each argument it writes, in argument order
/// (`None` for the ones it only reads). Each value comes with a bound on
/// the distance of the kernel's f32 result from it, given the inputs'
/// bounds; the operation order is that of `kernels/src/*.cpp`.
fn run_kernel(
    name: &str,
    a: &[Tile],
    scalars: &[u64],
    note: &mut dyn FnMut(String),
) -> Vec<Option<Tile>> {
    let f32_scalar = |s: u64| f32::from_bits(s as u32) as f64;
    match name {
        "add" => vec![None, None, Some(add(&a[0], &a[1]))],
        "gemm_tile" => vec![None, None, Some(gemm(&a[0], &a[1], &a[2]))],
        "rmsnorm" => vec![
            None,
            None,
            Some(rmsnorm(&a[0], &a[1], f32_scalar(scalars[0]))),
        ],
        "softmax" => vec![None, Some(softmax(&a[0]))],
        "expert_rows" => vec![
            None,
            None,
            None,
            Some(expert_rows(&a[0], &a[1], &a[2], &a[3])),
        ],
        "route_topk" => {
            let (indptr, tokens, weights) = route_topk(
                &a[0],
                a[1].cols,
                a[2].cols,
                scalars[0] as usize,
                f32_scalar(scalars[1]),
                note,
            );
            vec![None, Some(indptr), Some(tokens), Some(weights)]
        }
        // The registry and this match list the same kernels.
        other => unreachable!("kernel {other} has no f64 reference"),
    }
}

/// c = a + b: one rounding.
fn add(a: &Tile, b: &Tile) -> Tile {
    let mut c = Tile::new(a.rows, a.cols);
    for i in 0..a.v.len() {
        c.v[i] = a.v[i] + b.v[i];
        let mag = a.v[i].abs() + a.e[i] + b.v[i].abs() + b.e[i];
        c.e[i] = a.e[i] + b.e[i] + U * mag;
    }
    c
}

/// c += a x b, each c(i, j) accumulating its K products in increasing k:
/// gamma_(K+1) (|c| + sum |a b|).
fn gemm(a: &Tile, b: &Tile, c: &Tile) -> Tile {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut out = Tile::new(m, n);
    let g = gamma(k + 1);
    for i in 0..m {
        for j in 0..n {
            let at = i * n + j;
            let (mut v, mut prop, mut mag) = (c.v[at], c.e[at], c.v[at].abs() + c.e[at]);
            for p in 0..k {
                let (x, ex) = (a.v[i * k + p], a.e[i * k + p]);
                let (y, ey) = (b.v[p * n + j], b.e[p * n + j]);
                v += x * y;
                prop += x.abs() * ey + y.abs() * ex + ex * ey;
                mag += (x.abs() + ex) * (y.abs() + ey);
            }
            out.v[at] = v;
            out.e[at] = prop + g * mag;
        }
    }
    out
}

/// out += gate * (x @ w) per row: gamma_(H+2) (|out| + |gate| sum |x w|).
fn expert_rows(x: &Tile, w: &Tile, gate: &Tile, out: &Tile) -> Tile {
    let (r, h, f) = (x.rows, x.cols, w.cols);
    let mut o = Tile::new(r, f);
    let g = gamma(h + 2);
    for i in 0..r {
        let (gv, ge) = (gate.v[i], gate.e[i]);
        for j in 0..f {
            let at = i * f + j;
            let (mut y, mut prop, mut mag) = (0.0, 0.0, 0.0);
            for p in 0..h {
                let (xv, xe) = (x.v[i * h + p], x.e[i * h + p]);
                let (wv, we) = (w.v[p * f + j], w.e[p * f + j]);
                y += xv * wv;
                prop += xv.abs() * we + wv.abs() * xe + xe * we;
                mag += (xv.abs() + xe) * (wv.abs() + we);
            }
            o.v[at] = out.v[at] + gv * y;
            o.e[at] = out.e[at]
                + gv.abs() * prop
                + ge * mag
                + g * (out.v[at].abs() + out.e[at] + (gv.abs() + ge) * mag);
        }
    }
    o
}

/// y = x / sqrt(mean(x^2) + eps) * g per row: the sum of squares, the
/// mean, + eps, sqrt, divide and scale round to gamma_(n+6) |y| at most.
fn rmsnorm(x: &Tile, gamma_row: &Tile, eps: f64) -> Tile {
    let (rows, n) = (x.rows, x.cols);
    let mut y = Tile::new(rows, n);
    let g = gamma(n + 6);
    for r in 0..rows {
        let row = &x.v[r * n..(r + 1) * n];
        let errs = &x.e[r * n..(r + 1) * n];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let rms = (ms + eps).sqrt();
        // d y_i / d x_j = g_i / rms (delta_ij - x_i x_j / (n rms^2)).
        let q =
            row.iter().zip(errs).map(|(v, e)| v.abs() * e).sum::<f64>() / (n as f64 * rms * rms);
        for i in 0..n {
            let (xv, xe) = (row[i], errs[i]);
            let (gv, ge) = (gamma_row.v[i], gamma_row.e[i]);
            let v = xv / rms * gv;
            y.v[r * n + i] = v;
            y.e[r * n + i] =
                gv.abs() / rms * (xe + xv.abs() * q) + xv.abs() / rms * ge + g * v.abs();
        }
    }
    y
}

/// A softmax row and its bounds: per element, the exp's error (1e-6 plus
/// the rounding of x - max, u |x - max|), the sum's and the divide's, and
/// the inputs' bounds carried through (d y_i = y_i (dx_i - sum_j y_j dx_j)).
fn softmax_row(x: &[f64], ex: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = x.len();
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let y: Vec<f64> = e.iter().map(|v| v / s).collect();
    let delta: Vec<f64> = x.iter().map(|v| EXP_REL + U * (v - m).abs()).collect();
    let max_delta = delta.iter().copied().fold(0.0, f64::max);
    let carried: f64 = y.iter().zip(ex).map(|(y, e)| y * e).sum();
    let bounds = (0..n)
        .map(|i| y[i] * (delta[i] + max_delta + gamma(n + 1) + ex[i] + carried) + TINY)
        .collect();
    (y, bounds)
}

fn softmax(x: &Tile) -> Tile {
    let n = x.cols;
    let mut y = Tile::new(x.rows, n);
    for r in 0..x.rows {
        let (v, e) = softmax_row(&x.v[r * n..(r + 1) * n], &x.e[r * n..(r + 1) * n]);
        y.v[r * n..(r + 1) * n].copy_from_slice(&v);
        y.e[r * n..(r + 1) * n].copy_from_slice(&e);
    }
    y
}

/// route_topk (see `kernels/src/route_topk.cpp`): per token the softmax,
/// k picks of the largest p (lowest index on ties), later picks dropped
/// under the threshold, weights p / (sum of the kept p); CSR by expert,
/// zeros after the last entry. A decision whose margin is within the f32
/// router's error (p's bounds) is noted: the f32 router may decide it the
/// other way, and then the check fails on the CSR outputs.
fn route_topk(
    logits: &Tile,
    indptr_cols: usize,
    slots: usize,
    k: usize,
    threshold: f64,
    note: &mut dyn FnMut(String),
) -> (Tile, Tile, Tile) {
    let (tokens, experts) = (logits.rows, logits.cols);
    // Per token, the kept experts with their weight and its bound.
    let mut kept: Vec<Vec<(usize, f64, f64)>> = Vec::new();
    let mut unclear = Vec::new();
    for t in 0..tokens {
        let row = t * experts..(t + 1) * experts;
        let (p, pb) = softmax_row(&logits.v[row.clone()], &logits.e[row]);
        let mut free = vec![true; experts];
        let mut picks = Vec::new();
        for i in 0..k {
            let mut best = None::<usize>;
            for e in 0..experts {
                if free[e] && best.is_none_or(|b| p[e] > p[b]) {
                    best = Some(e);
                }
            }
            let best = best.expect("k <= experts, checked by the contract");
            free[best] = false;
            if let Some(other) = (0..experts)
                .filter(|&e| free[e])
                .max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)))
            {
                if p[best] - p[other] <= pb[best] + pb[other] {
                    unclear.push(format!(
                        "token {t}: pick {i} expert {best} (p {:.6}) vs expert {other} (p {:.6})",
                        p[best], p[other]
                    ));
                }
            }
            let keep = i == 0 || p[best] >= threshold;
            if i > 0 && threshold > 0.0 && (p[best] - threshold).abs() <= pb[best] {
                unclear.push(format!(
                    "token {t}: expert {best} p {:.6} vs threshold {threshold}",
                    p[best]
                ));
            }
            if keep {
                picks.push(best);
            }
        }
        let s: f64 = picks.iter().map(|&e| p[e]).sum();
        let s_rel: f64 = picks.iter().map(|&e| pb[e]).sum::<f64>() / s;
        kept.push(
            picks
                .iter()
                .map(|&e| {
                    let w = p[e] / s;
                    let bound = w * (pb[e] / p[e] + s_rel + gamma(picks.len() + 1)) + TINY;
                    (e, w, bound)
                })
                .collect(),
        );
    }
    if !unclear.is_empty() {
        note(format!(
            "{} routing decisions are within the f32 router's error of a tie or the \
             threshold, so the device may decide them otherwise: {}",
            unclear.len(),
            unclear.join("; ")
        ));
    }
    let mut indptr = Tile::new(1, indptr_cols);
    let mut toks = Tile::new(1, slots);
    let mut weights = Tile::new(1, slots);
    let mut pos = 0;
    for e in 0..experts {
        for (t, picks) in kept.iter().enumerate() {
            if let Some(&(_, w, b)) = picks.iter().find(|p| p.0 == e) {
                toks.v[pos] = t as f64;
                weights.v[pos] = w;
                weights.e[pos] = b;
                pos += 1;
            }
        }
        indptr.v[e + 1] = pos as f64;
    }
    (indptr, toks, weights)
}
