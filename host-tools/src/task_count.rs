//! How many tasks a table expands to, found on the host in bounded work.
//!
//! A program's loops may run up to `u32::MAX` iterations each, nested up to
//! [`MAX_LOOP_DEPTH`] deep, so expanding every task on the host is not
//! always possible. [`count_tasks`] expands the program with the device's
//! own expander only when the loops' stated maxima bound the work by
//! [`MAX_WALK_INSTRUCTIONS`]; otherwise it counts from the loop counts
//! without expanding: nested loops multiply, a loop whose count is not known
//! on the host (a symbol not bound here, data read at run time) counts from
//! 0 to its maximum, and a `when` whose condition is not known counts either
//! branch. Every figure is a `u128`, saturating.
//!
//! Host walks that must list every task (the reference expansion,
//! [`crate::program::Workload::expand`]) stop at [`MAX_HOST_TASKS`] tasks
//! and [`MAX_HOST_ITERATIONS`] loop iterations with an error saying so.

use std::fmt;

use device_runtime::abi::program::*;
use device_runtime::abi::{Instr, Table};
use device_runtime::expand::{ExpandError, Expander, Step};

use crate::inspect::HostExpansion;

/// Instructions the host runs at most to expand a program task by task
/// (about a second's work): a program whose loops' stated maxima allow more
/// is counted from its loop counts instead.
pub const MAX_WALK_INSTRUCTIONS: u128 = 1 << 26;

/// Tasks a host walk that lists every task (the reference expansion) lists
/// at most (about 100 MiB of task records).
pub const MAX_HOST_TASKS: usize = 1 << 20;

/// Loop iterations a host walk that lists every task runs at most.
pub const MAX_HOST_ITERATIONS: u64 = 1 << 26;

/// Tasks one run may have: the runtime numbers tasks with `u32`.
pub const MAX_RUN_TASKS: u128 = 1 << 32;

/// How many tasks a table expands to (the tasks section's included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskCount {
    /// Exactly this many tasks.
    Exact(u128),
    /// The count depends on what the host does not know or follow:
    /// symbols, data, or (neither) a `when` on loop indices.
    Between {
        /// The fewest tasks it may be.
        lo: u128,
        /// The most tasks it may be.
        hi: u128,
        /// A symbol the host was not given takes part.
        symbols: bool,
        /// Data read at run time takes part.
        data: bool,
    },
}

impl TaskCount {
    /// The most tasks it may be.
    pub fn most(&self) -> u128 {
        match *self {
            TaskCount::Exact(n) => n,
            TaskCount::Between { hi, .. } => hi,
        }
    }
}

/// `n`, or "more than 2^128 - 2" where the count saturated.
fn number(n: u128) -> String {
    if n == u128::MAX {
        format!("more than {}", u128::MAX - 1)
    } else {
        n.to_string()
    }
}

impl fmt::Display for TaskCount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TaskCount::Exact(n) => write!(f, "{} tasks", number(n))?,
            TaskCount::Between {
                lo,
                hi,
                symbols,
                data,
            } => {
                let why = match (symbols, data) {
                    (true, true) => "symbols not bound here and data read at run time",
                    (true, false) => "symbols not bound here",
                    (false, true) => "data read at run time",
                    (false, false) => "conditions on loop indices the count does not follow",
                };
                write!(
                    f,
                    "between {} and {} tasks (depending on {why})",
                    number(lo),
                    number(hi)
                )?;
            }
        }
        Ok(())
    }
}

impl TaskCount {
    /// What a run of more tasks than [`MAX_RUN_TASKS`] does, if this count
    /// may exceed it.
    pub fn run_limit(&self) -> Option<String> {
        (self.most() > MAX_RUN_TASKS)
            .then(|| format!("a run stops after {MAX_RUN_TASKS} tasks (task numbers are u32)"))
    }
}

/// Counts the tasks `table` expands to, with data from `arena` (if given)
/// and `symbols` bound by position, in bounded work (see the module
/// documentation). An error names the instruction at which the expansion
/// fails, as it would on the device.
pub fn count_tasks(
    table: &Table<'_>,
    arena: Option<&[u8]>,
    symbols: &[i64],
) -> Result<TaskCount, String> {
    let section = table.tasks().len() as u128;
    if walk_work(table.program()) <= MAX_WALK_INSTRUCTIONS {
        match walk(table, arena, symbols) {
            Ok(n) => return Ok(TaskCount::Exact(n as u128)),
            // Count what can be counted without them.
            Err(Unknown::Symbol | Unknown::Data) => {}
            Err(Unknown::Fails(why)) => return Err(why),
        }
    }
    let mut count = Count {
        program: table.program(),
        symbols,
        unknown_symbol: false,
        data: false,
    };
    // Registers start at 0.
    let mut regs = [Val::Known(0); MAX_REGS];
    let span = count.block(0, table.program().len(), &mut regs)?;
    let (lo, hi) = (
        span.lo.saturating_add(section),
        span.hi.saturating_add(section),
    );
    Ok(if lo == hi {
        TaskCount::Exact(lo)
    } else {
        TaskCount::Between {
            lo,
            hi,
            symbols: count.unknown_symbol,
            data: count.data,
        }
    })
}

/// The most instructions expansion may run: each instruction once per
/// iteration of the loops around it, at their stated maxima.
pub fn walk_work(program: &[Instr]) -> u128 {
    let mut outer = vec![1u128];
    let mut work = 0u128;
    for ins in program {
        let times = *outer.last().unwrap_or(&1);
        match ins.op {
            OP_LOOP => {
                work = work.saturating_add(times);
                outer.push(times.saturating_mul(ins.imm2.get() as u128));
            }
            OP_END => {
                work = work.saturating_add(times);
                outer.pop();
            }
            _ => work = work.saturating_add(times),
        }
    }
    work
}

/// Why the host could not expand a program.
enum Unknown {
    Symbol,
    Data,
    Fails(String),
}

/// Expands the program with the device's expander; the caller has checked
/// that [`walk_work`] bounds the work.
fn walk(table: &Table<'_>, arena: Option<&[u8]>, symbols: &[i64]) -> Result<u64, Unknown> {
    let mut cx = HostExpansion {
        arena,
        symbols,
        next: table.tasks().len() as u64,
        needs_data: false,
    };
    let mut expander = Expander::new(table);
    loop {
        let pc = expander.pc();
        match expander.step(table, &mut cx) {
            Ok(Step::Task(_)) => cx.next += 1,
            Ok(Step::Done) => break,
            Ok(_) => {}
            Err(ExpandError::UnboundSymbol { .. }) => return Err(Unknown::Symbol),
            // It failed on data the host does not have (read as 0).
            Err(_) if cx.needs_data => return Err(Unknown::Data),
            Err(e) => return Err(Unknown::Fails(format!("instruction {pc}: {e}"))),
        }
    }
    if cx.needs_data {
        return Err(Unknown::Data);
    }
    Ok(cx.next)
}

/// A register's value, where the host knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Val {
    Known(i64),
    Unknown,
}

type Regs = [Val; MAX_REGS];

fn join(a: &Regs, b: &Regs) -> Regs {
    let mut out = *a;
    for (o, v) in out.iter_mut().zip(b) {
        if *o != *v {
            *o = Val::Unknown;
        }
    }
    out
}

/// Tasks of one pass through a block: at least `lo`, at most `hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    lo: u128,
    hi: u128,
}

impl Span {
    const ZERO: Span = Span { lo: 0, hi: 0 };

    fn plus(self, other: Span) -> Span {
        Span {
            lo: self.lo.saturating_add(other.lo),
            hi: self.hi.saturating_add(other.hi),
        }
    }

    fn times(self, other: Span) -> Span {
        Span {
            lo: self.lo.saturating_mul(other.lo),
            hi: self.hi.saturating_mul(other.hi),
        }
    }

    fn either(self, other: Span) -> Span {
        Span {
            lo: self.lo.min(other.lo),
            hi: self.hi.max(other.hi),
        }
    }
}

/// One path through a block so far: its registers and tasks.
#[derive(Clone, Copy)]
struct Path {
    regs: Regs,
    tasks: Span,
}

fn merge(a: Option<Path>, b: Path) -> Path {
    match a {
        None => b,
        Some(a) => Path {
            regs: join(&a.regs, &b.regs),
            tasks: a.tasks.either(b.tasks),
        },
    }
}

/// The counter: walks each loop body once, whatever its iterations.
struct Count<'a> {
    program: &'a [Instr],
    symbols: &'a [i64],
    unknown_symbol: bool,
    data: bool,
}

impl Count<'_> {
    /// The instructions `pc` takes up: a whole loop, or a call with its
    /// operands.
    fn extent(&self, pc: usize) -> usize {
        let ins = &self.program[pc];
        match ins.op {
            OP_LOOP => ins.imm.get() as usize + 1 - pc,
            OP_CALL => wsp_ffi::lookup(ins.imm.get())
                .map_or(1, |k| 1 + k.num_tensors as usize + k.num_scalars as usize),
            _ => 1,
        }
    }

    /// Counts the tasks of one pass through `start .. end` (a loop body, or
    /// the whole program), entered with `regs`, which it leaves as they are
    /// at `end`. Jumps stay inside the block (validation checks it), so
    /// each instruction is visited once.
    fn block(&mut self, start: usize, end: usize, regs: &mut Regs) -> Result<Span, String> {
        let mut live = Some(Path {
            regs: *regs,
            tasks: Span::ZERO,
        });
        // Paths that jump forward, by target.
        let mut jumps: Vec<(usize, Path)> = Vec::new();
        let mut pc = start;
        while pc < end {
            live = self.arrive(pc, live, &mut jumps);
            let Some(path) = live.as_mut() else {
                pc += self.extent(pc);
                continue;
            };
            let ins = &self.program[pc];
            let read = |r: u8| path.regs.get(r as usize).copied().unwrap_or(Val::Known(0));
            let (a, b) = (read(ins.x[0]), read(ins.x[1]));
            let r = ins.r as usize;
            match ins.op {
                OP_CONST => {
                    path.regs[r] =
                        Val::Known((ins.imm.get() as u64 | (ins.imm2.get() as u64) << 32) as i64)
                }
                OP_SYMBOL => {
                    path.regs[r] = match self.symbols.get(ins.imm.get() as usize) {
                        Some(&v) => Val::Known(v),
                        None => {
                            self.unknown_symbol = true;
                            Val::Unknown
                        }
                    }
                }
                OP_LOAD => {
                    self.data = true;
                    path.regs[r] = Val::Unknown;
                }
                OP_ADD..=OP_EQ => {
                    path.regs[r] = match (a, b) {
                        (Val::Known(a), Val::Known(b)) => arith(ins.op, a, b),
                        _ => Val::Unknown,
                    }
                }
                OP_LOOP => {
                    let max = ins.imm2.get();
                    let iterations = match a {
                        Val::Known(c) if c < 0 || c > max as i64 => {
                            return Err(format!(
                                "instruction {pc}: loop count {c} outside [0, {max}]"
                            ))
                        }
                        Val::Known(c) => Span {
                            lo: c as u128,
                            hi: c as u128,
                        },
                        Val::Unknown => Span {
                            lo: 0,
                            hi: max as u128,
                        },
                    };
                    let body_end = ins.imm.get() as usize;
                    if iterations.hi > 0 {
                        // Registers the body writes differ from iteration
                        // to iteration, as far as the host knows.
                        let mut inner = path.regs;
                        inner[r] = Val::Unknown;
                        for i in &self.program[pc + 1..body_end] {
                            if writes(i.op) {
                                inner[i.r as usize] = Val::Unknown;
                            }
                        }
                        let body = self.block(pc + 1, body_end, &mut inner)?;
                        path.tasks = path.tasks.plus(iterations.times(body));
                        path.regs = if iterations.lo > 0 {
                            inner
                        } else {
                            join(&path.regs, &inner)
                        };
                    }
                    pc = body_end + 1;
                    continue;
                }
                OP_WHEN | OP_JUMP => {
                    let target = ins.imm.get() as usize;
                    let taken = ins.op == OP_JUMP || a == Val::Known(0);
                    let falls = ins.op == OP_WHEN && a != Val::Known(0);
                    if taken || a == Val::Unknown {
                        jumps.push((target, *path));
                    }
                    if !falls {
                        live = None;
                    }
                }
                OP_CALL => path.tasks = path.tasks.plus(Span { lo: 1, hi: 1 }),
                _ => {}
            }
            pc += self.extent(pc);
        }
        live = self.arrive(end, live, &mut jumps);
        Ok(match live {
            Some(path) => {
                *regs = path.regs;
                path.tasks
            }
            None => Span::ZERO,
        })
    }

    /// The paths at `pc`: the one falling through and those jumping here.
    fn arrive(
        &self,
        pc: usize,
        mut live: Option<Path>,
        jumps: &mut Vec<(usize, Path)>,
    ) -> Option<Path> {
        jumps.retain(|(target, path)| {
            if *target == pc {
                live = Some(merge(live, *path));
                false
            } else {
                true
            }
        });
        live
    }
}

/// Whether instruction `op` writes its register `r`.
fn writes(op: u8) -> bool {
    matches!(
        op,
        OP_CONST | OP_SYMBOL | OP_LOAD | OP_ADD..=OP_EQ | OP_LOOP
    )
}

/// `a op b` as the expander computes it; unknown where it would fail.
fn arith(op: u8, a: i64, b: i64) -> Val {
    crate::program::arith(op, a, b).map_or(Val::Unknown, Val::Known)
}
