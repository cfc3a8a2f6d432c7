//! How many tasks a table expands to, found on the host in bounded work.
//!
//! A program's loops may run up to `u32::MAX` iterations each, nested up to
//! [`MAX_LOOP_DEPTH`] deep, so expanding every task on the host is not
//! always possible. [`count_tasks`] expands the program with the device's
//! own expander when that takes at most [`MAX_WALK_INSTRUCTIONS`] of work
//! (all of it when the loops' stated maxima bound it so; else as far as
//! that work goes, enough for loops whose bound symbols are small), and
//! checks each task's arguments as the orchestrator does
//! ([`count_and_check`]); otherwise it counts from the loop counts
//! without expanding: nested loops multiply, a loop whose count is not known
//! on the host (a symbol not bound here, data read at run time) counts from
//! 0 to its maximum, and a `when` whose condition is not known counts either
//! branch. Every figure is a `u128`, saturating.
//!
//! A program with processes and channels (CSP) is always counted, never
//! walked: how many times a `CONSUME` body runs is the number of tokens
//! sent on its channel, which the host bounds by counting the `SEND`s
//! (a process's body counts once per replica). When a channel has one
//! consume loop that runs once (not in a loop, a branch or a replicated
//! process), it runs its body once per token sent; otherwise each of its
//! consume loops runs between 0 and that many times, so the count is a
//! range saying that it depends on which consumer takes which token.
//! Chained channels (a consumer that sends on) settle one per counting
//! round, at most `MAX_CHANNELS + 1` rounds; every round's figures are
//! bounds, so a cycle of channels gives a wide range (its `hi` saturates),
//! never a wrong number.
//!
//! Host walks that must list every task (the reference expansion,
//! [`crate::program::Workload::expand`]) stop at [`MAX_HOST_TASKS`] tasks
//! and [`MAX_HOST_ITERATIONS`] loop iterations with an error saying so.

use std::collections::BTreeMap;
use std::fmt;

use device_runtime::abi::program::*;
use device_runtime::abi::{Instr, Table};
use device_runtime::expand::{ExpandError, Expander, Step, STEP_BUDGET};
use device_runtime::orch::{overlapping_args, TaskArg};

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

/// Tasks one run may have: the runtime numbers tasks with `u32`
/// ([`device_runtime::sched::MAX_RUN_TASKS`]).
pub const MAX_RUN_TASKS: u128 = device_runtime::sched::MAX_RUN_TASKS as u128;

/// Tasks `wsp run TABLE.bin` runs a table with at most (seconds to a
/// minute on the host shim): a symbol bound at launch may ask for up to
/// 2^32 - 1 iterations of a loop. A count known to be larger is refused
/// before the run ([`TaskCount::check_shim_limit`]); a run whose count
/// the host cannot tell ends with an error at this many
/// ([`device_runtime::sched::RunOptions::max_tasks`]).
pub const MAX_SHIM_TASKS: u128 = 1 << 22;

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
        /// Which of several consumers (or replicas) takes which token
        /// takes part.
        tokens: bool,
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
                tokens,
            } => {
                let mut why = match (symbols, data) {
                    (true, true) => "symbols not bound here and data read at run time",
                    (true, false) => "symbols not bound here",
                    (false, true) => "data read at run time",
                    (false, false) if tokens => "",
                    (false, false) => "conditions on loop indices the count does not follow",
                }
                .to_string();
                if tokens {
                    if !why.is_empty() {
                        why.push_str(", and ");
                    }
                    why.push_str("which consume loop takes which token");
                }
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
    /// Refuses a count of more than [`MAX_SHIM_TASKS`] tasks, or of at
    /// least that many where the count is a range (what the host does not
    /// know may still make a run of a range longer); the message names the
    /// count and the bound.
    pub fn check_shim_limit(&self) -> Result<(), String> {
        let (least, how) = match *self {
            TaskCount::Exact(n) => (n, ""),
            TaskCount::Between { lo, .. } => (lo, "at least "),
        };
        if least > MAX_SHIM_TASKS {
            return Err(format!(
                "it expands to {how}{} tasks; a run on the host shim takes at most \
                 {MAX_SHIM_TASKS} (2^22)",
                number(least)
            ));
        }
        Ok(())
    }

    /// What a run on the host shim of more tasks than [`MAX_SHIM_TASKS`]
    /// does, if this count may exceed it (a range whose upper end does:
    /// [`TaskCount::check_shim_limit`] refuses the rest).
    pub fn shim_limit(&self) -> Option<String> {
        (self.most() > MAX_SHIM_TASKS).then(|| {
            format!(
                "a run on the host shim stops with an error after {MAX_SHIM_TASKS} tasks (2^22)"
            )
        })
    }

    /// What a run of more tasks than [`MAX_RUN_TASKS`] does, if this count
    /// may exceed it.
    pub fn run_limit(&self) -> Option<String> {
        (self.most() > MAX_RUN_TASKS)
            .then(|| format!("a run stops after {MAX_RUN_TASKS} tasks (task numbers are u32)"))
    }
}

/// Counts the tasks `table` expands to, with data from `arena` (if given:
/// the arena at launch, whose tensors the program declares `INPUT` it
/// reads; data a run writes is not known before the run) and `symbols`
/// bound by position, in bounded work (see the module
/// documentation). An error names the instruction at which the expansion
/// fails, as it would on the device.
pub fn count_tasks(
    table: &Table<'_>,
    arena: Option<&[u8]>,
    symbols: &[i64],
) -> Result<TaskCount, String> {
    count_and_check(table, arena, symbols).map(|(count, _)| count)
}

/// As [`count_tasks`], and whether the host expanded every task of the
/// program: `None` when it did, and checked each task's arguments as the
/// orchestrator does (a written region overlapping another argument's of
/// the same task makes the expansion fail, naming both); else why not
/// (the count then comes from the loop counts, and a run's expansion
/// checks the arguments).
pub fn count_and_check(
    table: &Table<'_>,
    arena: Option<&[u8]>,
    symbols: &[i64],
) -> Result<(TaskCount, Option<&'static str>), String> {
    let section = table.tasks().len() as u128;
    let csp = table.program().iter().any(|i| is_csp(i.op));
    let not_walked = if csp {
        "a program with processes and channels is counted, not expanded"
    } else {
        // Loops whose stated maxima allow more work may still be short
        // with the symbols given: walked as far as the work allows.
        let steps = if walk_work(table.program()) <= MAX_WALK_INSTRUCTIONS {
            u64::MAX
        } else {
            (MAX_WALK_INSTRUCTIONS / STEP_BUDGET as u128) as u64
        };
        match walk(table, arena, symbols, steps) {
            Ok(n) => return Ok((TaskCount::Exact(n as u128), None)),
            // Count what can be counted without them.
            Err(Unknown::Symbol) => "symbols not bound here decide its loops",
            Err(Unknown::Data) => "data a run writes decides its loops",
            Err(Unknown::TooLong) => "it has more tasks than the host expands",
            Err(Unknown::Fails(why)) => return Err(why),
        }
    };
    let program = table.program();
    let once = consumed_once(program);
    let mut count = Count {
        program,
        symbols,
        unknown_symbol: false,
        data: false,
        // Until the sends are counted, a consume loop may run any number
        // of times.
        consumed: [Span {
            lo: 0,
            hi: u128::MAX,
        }; MAX_CHANNELS],
        tokens: false,
    };
    // Each round counts with the consume loops' iterations the previous
    // round's sends imply (every round's figures are bounds); chained
    // channels settle one per round.
    let mut span = Span::ZERO;
    for _ in 0..=MAX_CHANNELS {
        count.tokens = false;
        // Registers start at 0.
        let mut regs = [Val::Known(0); MAX_REGS];
        let tally = count.block(0, program.len(), &mut regs)?;
        span = tally.tasks;
        let mut consumed = count.consumed;
        for (c, sent) in tally.sends.iter().enumerate() {
            consumed[c] = if once & (1 << c) != 0 {
                *sent
            } else {
                Span { lo: 0, hi: sent.hi }
            };
        }
        if consumed == count.consumed {
            break;
        }
        count.consumed = consumed;
    }
    let (lo, hi) = (
        span.lo.saturating_add(section),
        span.hi.saturating_add(section),
    );
    let count = if lo == hi {
        TaskCount::Exact(lo)
    } else {
        TaskCount::Between {
            lo,
            hi,
            symbols: count.unknown_symbol,
            data: count.data,
            tokens: count.tokens,
        }
    };
    Ok((count, Some(not_walked)))
}

/// Whether `op` is one of the CSP ops (channels and processes).
fn is_csp(op: u8) -> bool {
    (OP_CHANNEL..=OP_CLOSE).contains(&op)
}

/// Bit `c`: channel `c` has one `CONSUME`, which runs once (at the top
/// level of the program or of a process of one replica, outside any loop,
/// with no branch or jump at that level that could skip it).
fn consumed_once(program: &[Instr]) -> u16 {
    let mut sites = [0u32; MAX_CHANNELS];
    let mut once: u16 = 0;
    // Per context (the program's, then each process's by its pc): whether
    // a branch at its top level may skip its consume loops.
    let branches = |from: usize, to: usize| {
        let mut depth = 0usize;
        program[from..to].iter().any(|i| {
            match i.op {
                OP_LOOP | OP_CONSUME | OP_PROCESS => depth += 1,
                OP_END | OP_PROCESS_END => depth = depth.saturating_sub(1),
                OP_WHEN | OP_JUMP => return depth == 0,
                _ => {}
            }
            false
        })
    };
    let mut depth = 0usize;
    // (first pc of the process's body, its END, one replica, whether a
    // branch may skip its consume loops once known). Known once per
    // context, not walked again for each of its consume loops (quadratic).
    let mut process: Option<(usize, usize, bool, Option<bool>)> = None;
    let mut top_branches: Option<bool> = None;
    for (pc, i) in program.iter().enumerate() {
        match i.op {
            OP_PROCESS => process = Some((pc + 1, i.imm.get() as usize, i.x[0] == NO_REG, None)),
            OP_PROCESS_END => process = None,
            OP_CONSUME => {
                let c = i.imm.get() as usize % MAX_CHANNELS;
                sites[c] += 1;
                let runs_once = depth == 0
                    && match &mut process {
                        Some((start, end, single, skips)) => {
                            *single
                                && !*skips.get_or_insert_with(|| {
                                    branches(*start, (*end).min(program.len()))
                                })
                        }
                        None => !*top_branches.get_or_insert_with(|| branches(0, program.len())),
                    };
                if runs_once {
                    once |= 1 << c;
                }
                depth += 1;
            }
            OP_LOOP => depth += 1,
            OP_END => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    for (c, n) in sites.iter().enumerate() {
        if *n != 1 {
            once &= !(1 << c);
        }
    }
    once
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
            // A consume loop runs once per token: not bounded by the loop.
            OP_CONSUME => {
                work = work.saturating_add(times);
                outer.push(u128::MAX);
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
    /// More steps than it was given.
    TooLong,
    Fails(String),
}

/// Expands the program with the device's expander, in at most `steps`
/// steps (each a task, or at most [`STEP_BUDGET`] instructions), checking
/// each task's arguments ([`overlap`]).
fn walk(
    table: &Table<'_>,
    arena: Option<&[u8]>,
    symbols: &[i64],
    steps: u64,
) -> Result<u64, Unknown> {
    // `arena` is the arena at launch: it holds the data of the tensors the
    // program declares INPUT, not yet of those a run writes.
    let info = table.program_info();
    let run_writes: Vec<u64> = (info.data().iter().enumerate())
        .filter(|&(i, _)| info.inputs & (1u64 << i) == 0)
        .filter_map(|(_, &t)| table.tensors().get(t as usize))
        .map(|t| t.arena_offset.get())
        .collect();
    let mut cx = HostExpansion {
        arena,
        run_writes: &run_writes,
        symbols,
        next: table.tasks().len() as u64,
        needs_data: false,
    };
    let mut expander = Expander::new(table);
    for _ in 0..steps {
        let pc = expander.pc();
        match expander.step(table, &mut cx) {
            Ok(Step::Task(spec)) => {
                if let Some(why) = overlap(table, &spec.args) {
                    let call = spec.pc.map_or(String::new(), |pc| {
                        format!(" (the call at instruction {pc})")
                    });
                    return Err(Unknown::Fails(format!("task {}{call}: {why}", cx.next)));
                }
                cx.next += 1;
            }
            Ok(Step::Done) if cx.needs_data => return Err(Unknown::Data),
            Ok(Step::Done) => return Ok(cx.next),
            Ok(_) => {}
            Err(ExpandError::UnboundSymbol { .. }) => return Err(Unknown::Symbol),
            // It failed on data the host does not have (read as 0).
            Err(_) if cx.needs_data => return Err(Unknown::Data),
            Err(e) => return Err(Unknown::Fails(format!("instruction {pc}: {e}"))),
        }
    }
    Err(Unknown::TooLong)
}

/// What the orchestrator refuses a task for: an argument that writes a
/// region overlapping another argument's of the task (by their places in
/// the task, the writer first), if any.
fn overlap(table: &Table<'_>, args: &[TaskArg]) -> Option<String> {
    let (writer, other) = overlapping_args(args)?;
    let name = table
        .tensors()
        .get(args[writer].tensor as usize)
        .map_or(String::new(), |t| {
            let end = t.name.iter().position(|&c| c == 0).unwrap_or(t.name.len());
            format!(" of `{}`", String::from_utf8_lossy(&t.name[..end]))
        });
    Some(format!(
        "argument {writer} writes a region{name} overlapping argument {other}"
    ))
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

/// What one pass through a block issues: tasks, and tokens per channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Tally {
    tasks: Span,
    sends: [Span; MAX_CHANNELS],
}

impl Tally {
    const ZERO: Tally = Tally {
        tasks: Span::ZERO,
        sends: [Span::ZERO; MAX_CHANNELS],
    };

    fn plus(mut self, other: Tally) -> Tally {
        self.tasks = self.tasks.plus(other.tasks);
        for (s, o) in self.sends.iter_mut().zip(other.sends) {
            *s = s.plus(o);
        }
        self
    }

    /// `times` passes.
    fn times(mut self, times: Span) -> Tally {
        self.tasks = times.times(self.tasks);
        for s in self.sends.iter_mut() {
            *s = times.times(*s);
        }
        self
    }

    fn either(mut self, other: Tally) -> Tally {
        self.tasks = self.tasks.either(other.tasks);
        for (s, o) in self.sends.iter_mut().zip(other.sends) {
            *s = s.either(o);
        }
        self
    }
}

/// One path through a block so far: its registers, tasks and tokens.
#[derive(Clone, Copy)]
struct Path {
    regs: Regs,
    tally: Tally,
}

fn merge(a: Option<Path>, b: Path) -> Path {
    match a {
        None => b,
        Some(a) => Path {
            regs: join(&a.regs, &b.regs),
            tally: a.tally.either(b.tally),
        },
    }
}

/// The counter: walks each loop body once, whatever its iterations.
struct Count<'a> {
    program: &'a [Instr],
    symbols: &'a [i64],
    unknown_symbol: bool,
    data: bool,
    /// How many times each channel's consume loops run, as far as known.
    consumed: [Span; MAX_CHANNELS],
    /// A consume loop ran an inexact number of times.
    tokens: bool,
}

impl Count<'_> {
    /// The instructions `pc` takes up: a whole loop, or a call with its
    /// operands.
    fn extent(&self, pc: usize) -> usize {
        let ins = &self.program[pc];
        match ins.op {
            OP_LOOP | OP_PROCESS => ins.imm.get() as usize + 1 - pc,
            OP_CONSUME => ins.imm2.get() as usize + 1 - pc,
            OP_CALL => wsp_ffi::lookup(ins.imm.get())
                .map_or(1, |k| 1 + k.num_tensors as usize + k.num_scalars as usize),
            _ => 1,
        }
    }

    /// Counts the tasks of one pass through `start .. end` (a loop body, or
    /// the whole program), entered with `regs`, which it leaves as they are
    /// at `end`. Jumps stay inside the block (validation checks it), so
    /// each instruction is visited once.
    fn block(&mut self, start: usize, end: usize, regs: &mut Regs) -> Result<Tally, String> {
        let mut live = Some(Path {
            regs: *regs,
            tally: Tally::ZERO,
        });
        // Paths that jump forward, by target, merged as they jump: looking
        // the target up costs a lookup per pc, not a scan of every pending
        // jump (quadratic with many `WHEN`s to one end). Merging in another
        // order gives the same path: `join` and `either` are associative
        // and commutative.
        let mut jumps: BTreeMap<usize, Path> = BTreeMap::new();
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
                    self.repeat(path, pc, body_end, iterations)?;
                    pc = body_end + 1;
                    continue;
                }
                OP_CONSUME => {
                    let c = ins.imm.get() as usize % MAX_CHANNELS;
                    let iterations = self.consumed[c];
                    if iterations.lo != iterations.hi {
                        self.tokens = true;
                    }
                    let body_end = ins.imm2.get() as usize;
                    self.repeat(path, pc, body_end, iterations)?;
                    pc = body_end + 1;
                    continue;
                }
                OP_PROCESS => {
                    let max = ins.imm2.get();
                    let replicas = match a {
                        _ if ins.x[0] == NO_REG => Span { lo: 1, hi: 1 },
                        Val::Known(c) if c < 0 || c > max as i64 => {
                            return Err(format!(
                                "instruction {pc}: {c} replicas, outside [0, {max}]"
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
                    // Each replica starts with a copy of the program's
                    // registers and its index; the program goes on with
                    // its own.
                    let body_end = ins.imm.get() as usize;
                    let mut inner = path.regs;
                    if r < MAX_REGS {
                        inner[r] = Val::Unknown;
                    }
                    let body = self.block(pc + 1, body_end, &mut inner)?;
                    path.tally = path.tally.plus(body.times(replicas));
                    pc = body_end + 1;
                    continue;
                }
                OP_SEND => {
                    let c = ins.imm.get() as usize % MAX_CHANNELS;
                    path.tally.sends[c] = path.tally.sends[c].plus(Span { lo: 1, hi: 1 });
                }
                OP_WHEN | OP_JUMP => {
                    let target = ins.imm.get() as usize;
                    let taken = ins.op == OP_JUMP || a == Val::Known(0);
                    let falls = ins.op == OP_WHEN && a != Val::Known(0);
                    if taken || a == Val::Unknown {
                        let path = *path;
                        jumps
                            .entry(target)
                            .and_modify(|p| *p = merge(Some(*p), path))
                            .or_insert(path);
                    }
                    if !falls {
                        live = None;
                    }
                }
                OP_CALL => path.tally.tasks = path.tally.tasks.plus(Span { lo: 1, hi: 1 }),
                _ => {}
            }
            pc += self.extent(pc);
        }
        live = self.arrive(end, live, &mut jumps);
        Ok(match live {
            Some(path) => {
                *regs = path.regs;
                path.tally
            }
            None => Tally::ZERO,
        })
    }

    /// Adds `iterations` passes through the loop body `pc + 1 .. end` (of
    /// the `LOOP` or `CONSUME` at `pc`) to `path`.
    fn repeat(
        &mut self,
        path: &mut Path,
        pc: usize,
        end: usize,
        iterations: Span,
    ) -> Result<(), String> {
        if iterations.hi == 0 {
            return Ok(());
        }
        // Registers the body writes differ from iteration to iteration, as
        // far as the host knows.
        let mut inner = path.regs;
        for i in &self.program[pc..end] {
            if writes(i.op) && (i.r as usize) < MAX_REGS {
                inner[i.r as usize] = Val::Unknown;
            }
        }
        let body = self.block(pc + 1, end, &mut inner)?;
        path.tally = path.tally.plus(body.times(iterations));
        path.regs = if iterations.lo > 0 {
            inner
        } else {
            join(&path.regs, &inner)
        };
        Ok(())
    }

    /// The paths at `pc`: the one falling through and those jumping here.
    fn arrive(
        &self,
        pc: usize,
        mut live: Option<Path>,
        jumps: &mut BTreeMap<usize, Path>,
    ) -> Option<Path> {
        if let Some(path) = jumps.remove(&pc) {
            live = Some(merge(live, path));
        }
        live
    }
}

/// Whether instruction `op` writes its register `r`.
fn writes(op: u8) -> bool {
    matches!(
        op,
        OP_CONST | OP_SYMBOL | OP_LOAD | OP_ADD..=OP_EQ | OP_LOOP | OP_CONSUME | OP_PROCESS
    )
}

/// `a op b` as the expander computes it; unknown where it would fail.
fn arith(op: u8, a: i64, b: i64) -> Val {
    crate::program::arith(op, a, b).map_or(Val::Unknown, Val::Known)
}
