//! `wsp inspect`: a readable dump of a descriptor table. It reads the raw
//! structs tolerantly, so a corrupted table is shown as far as it can be,
//! and ends with the runtime's own verdict from `Table::parse`.

use std::fmt::Write;

use device_runtime::abi::program::*;
use device_runtime::abi::{
    table_checksum, Instr, KernelDesc, Region, SectionRef, StreamOp, Table, TableHeader, TaskDesc,
    TensorArg, TensorDesc, MAGIC, STREAM_OP_RECORD, STREAM_OP_WAIT,
};
use device_runtime::expand::{Context, Expander, Next, TaskSpec};

use crate::program::CspNames;
use crate::task_count::{count_and_check, count_tasks, TaskCount};
use zerocopy::{FromBytes, Immutable, KnownLayout};

/// How many tasks are shown unless all are asked for.
pub const TASKS_SHOWN: usize = 20;

/// The dump of `bytes`; never panics, whatever the bytes.
pub fn inspect(bytes: &[u8], all_tasks: bool) -> String {
    inspect_with(bytes, all_tasks, &[])
}

/// As [`inspect`], counting the program's tasks with `symbols` bound by
/// position.
pub fn inspect_with(bytes: &[u8], all_tasks: bool, symbols: &[i64]) -> String {
    inspect_named(bytes, all_tasks, symbols, &CspNames::default())
}

/// As [`inspect_with`], naming channels and processes as the workload did
/// (the table knows them only by number and by the pc of their `PROCESS`).
pub fn inspect_named(bytes: &[u8], all_tasks: bool, symbols: &[i64], names: &CspNames) -> String {
    inspect_checked(bytes, all_tasks, symbols, names).0
}

/// As [`inspect_named`], with what a run of the table would meet: `Err`
/// when the table is invalid (why, as `Table::parse` says), or valid but
/// its program's expansion with `symbols` fails (where and why: e.g. a
/// task whose written argument overlaps another of its arguments, which
/// the orchestrator refuses). Where the host does not expand every task
/// (unbound symbols, data, processes, too much work), the text says that
/// the run's expansion checks the tasks' arguments.
pub fn inspect_checked(
    bytes: &[u8],
    all_tasks: bool,
    symbols: &[i64],
    names: &CspNames,
) -> (String, Result<(), String>) {
    let mut out = String::new();
    dump(&mut out, bytes, all_tasks, names);
    let t = match Table::parse(bytes) {
        Ok(t) => t,
        Err(e) => {
            let _ = writeln!(out, "INVALID: {e}");
            return (out, Err(e.to_string()));
        }
    };
    let counted = count_and_check(&t, None, symbols);
    let _ = writeln!(
        out,
        "valid: {}",
        summary_of(&t, counted.as_ref().map(|(c, _)| *c).map_err(String::clone))
    );
    let verdict = match counted {
        Err(why) => {
            let _ = writeln!(out, "a run fails: the program's expansion fails ({why})");
            Err(format!("the program's expansion fails ({why})"))
        }
        Ok((_, Some(why))) if !t.program().is_empty() => {
            let _ = writeln!(
                out,
                "not expanded here ({why}): a run's expansion refuses a program task whose \
                 written argument overlaps another of its arguments"
            );
            Ok(())
        }
        Ok(_) => Ok(()),
    };
    (out, verdict)
}

/// Whether the table in `bytes` is valid (what `inspect` ends with).
pub fn is_valid(bytes: &[u8]) -> bool {
    Table::parse(bytes).is_ok()
}

fn entries<'a, T: FromBytes + KnownLayout + Immutable>(
    bytes: &'a [u8],
    s: &SectionRef,
) -> Option<&'a [T]> {
    let start = s.offset.get() as usize;
    let len = (s.count.get() as usize).checked_mul(size_of::<T>())?;
    let raw = bytes.get(start..start.checked_add(len)?)?;
    <[T]>::ref_from_bytes(raw).ok()
}

fn name(raw: &[u8; 16]) -> String {
    let end = raw.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

fn dump(out: &mut String, bytes: &[u8], all_tasks: bool, names: &CspNames) {
    let Ok((h, _)) = TableHeader::read_from_prefix(bytes) else {
        let _ = writeln!(out, "{} bytes: too short for a table header", bytes.len());
        return;
    };
    let magic = if h.magic == MAGIC {
        "PTOWSP".to_string()
    } else {
        format!("{:02x?} (wrong)", h.magic)
    };
    let _ = writeln!(
        out,
        "table: {} bytes read, magic {magic}, ABI version {}",
        bytes.len(),
        h.abi_version.get()
    );
    let computed = table_checksum(&bytes[..(h.total_len.get() as usize).min(bytes.len())]);
    let _ = writeln!(
        out,
        "header: total_len {}, checksum stored {:#010x} computed {:#010x}, arena {} bytes",
        h.total_len.get(),
        h.checksum.get(),
        computed,
        h.arena_size.get()
    );
    let tensors: &[TensorDesc] = section(out, bytes, "tensors", &h.tensors);
    for (i, t) in tensors.iter().enumerate() {
        let rank = (t.rank.get() as usize).min(4);
        let shape: Vec<u32> = t.shape[..rank].iter().map(|v| v.get()).collect();
        let strides: Vec<u32> = t.strides[..rank].iter().map(|v| v.get()).collect();
        let place = if t.is_scratch() {
            "scratch (on the heap ring)".to_string()
        } else {
            format!("at arena +{}", t.arena_offset.get())
        };
        let _ = writeln!(
            out,
            "  [{i}] {:<8} dtype {} shape {shape:?} strides {strides:?} {place}",
            name(&t.name),
            dtype_name(t.dtype.get()),
        );
    }
    let kernels: &[KernelDesc] = section(out, bytes, "kernels", &h.kernels);
    for (i, k) in kernels.iter().enumerate() {
        let id = k.kernel_id.get();
        let kind = match k.core_kind.get() {
            0 => "cube".to_string(),
            1 => "vector".to_string(),
            other => format!("kind {other}?"),
        };
        let _ = writeln!(out, "  [{i}] id {id} {} on {kind} cores", kernel_name(id));
    }
    let tasks: &[TaskDesc] = section(out, bytes, "tasks", &h.tasks);
    let args: &[TensorArg] = section(out, bytes, "args", &h.args);
    let ops: &[StreamOp] = section(out, bytes, "stream_ops", &h.stream_ops);
    let shown = if all_tasks {
        tasks.len()
    } else {
        tasks.len().min(TASKS_SHOWN)
    };
    let mut ops = ops.iter().peekable();
    let mut ops_before = |out: &mut String, task: usize| {
        while let Some(op) = ops.next_if(|op| op.before_task.get() as usize <= task) {
            let _ = writeln!(out, "  {}", op_text(op));
        }
    };
    for (i, task) in tasks[..shown].iter().enumerate() {
        ops_before(out, i);
        let first = task.first_arg.get() as usize;
        let n = task.num_args.get() as usize;
        let list = match first.checked_add(n).and_then(|end| args.get(first..end)) {
            Some(list) => list
                .iter()
                .map(|a| arg_text(a, tensors))
                .collect::<Vec<_>>()
                .join(", "),
            None => format!("args {first}..+{n} out of range"),
        };
        let stream = match task.stream.get() {
            0 => String::new(),
            s => format!(" on stream {s}"),
        };
        let _ = writeln!(
            out,
            "  task {i}: {}({list}){stream}",
            kernel_name(task.kernel_id.get())
        );
    }
    if shown == tasks.len() {
        ops_before(out, usize::MAX);
    }
    if shown < tasks.len() {
        let _ = writeln!(
            out,
            "  ... {} more tasks (--all shows them)",
            tasks.len() - shown
        );
    }
    let program: &[Instr] = section(out, bytes, "program", &h.program);
    program_text(out, program, tensors, names);
}

fn reg(r: u8) -> String {
    if r == NO_REG {
        "0".to_string()
    } else {
        format!("r{r}")
    }
}

/// The program as indented loops, one instruction per line with its pc.
fn program_text(out: &mut String, program: &[Instr], tensors: &[TensorDesc], names: &CspNames) {
    let tname = |t: u32| {
        tensors
            .get(t as usize)
            .map_or_else(|| format!("tensor{t}?"), |d| name(&d.name))
    };
    // "channel 2 (to_compute)", or "channel 2" where the name is unknown.
    let chname = |c: u32| match names.channels.get(c as usize) {
        Some(d) => format!("channel {c} ({})", d.name),
        None => format!("channel {c}"),
    };
    // Indexed once by pc: one look-up a `PROCESS` (and its end), not a
    // scan of every name.
    let processes: std::collections::HashMap<usize, &str> = names
        .processes
        .iter()
        .rev() // the first name of a pc wins, as in program order
        .map(|(at, n)| (*at, n.as_str()))
        .collect();
    let pname = |pc: usize| match processes.get(&pc) {
        Some(n) => format!(" {n}"),
        None => String::new(),
    };
    let mut depth = 1usize;
    for (pc, ins) in program.iter().enumerate() {
        let x = ins.x;
        let imm = ins.imm.get();
        let text = match ins.op {
            OP_CONST => format!(
                "r{} = {}",
                ins.r,
                (imm as u64 | (ins.imm2.get() as u64) << 32) as i64
            ),
            OP_SYMBOL => format!("r{} = symbol {imm}", ins.r),
            OP_LOAD => {
                let rank = tensors
                    .get(imm as usize)
                    .map_or(4, |d| (d.rank.get() as usize).clamp(1, 4));
                let index: Vec<String> = x[..rank].iter().map(|&r| reg(r)).collect();
                format!(
                    "r{} = {}[{}]  (waits for its writers)",
                    ins.r,
                    tname(imm),
                    index.join(", ")
                )
            }
            OP_ADD..=OP_EQ => {
                let sym = ["+", "-", "*", "/", "%", "min", "max", "<", "<=", "=="]
                    [(ins.op - OP_ADD) as usize];
                format!("r{} = {} {sym} {}", ins.r, reg(x[0]), reg(x[1]))
            }
            OP_LOOP => {
                let kind = if x[1] == LOOP_SEQUENTIAL {
                    "sequential"
                } else {
                    "parallel"
                };
                let line = format!(
                    "{kind} r{} in 0..{} (at most {}) {{",
                    ins.r,
                    reg(x[0]),
                    ins.imm2.get()
                );
                let _ = writeln!(out, "  {pc:>4}  {}{line}", "  ".repeat(depth));
                depth += 1;
                continue;
            }
            OP_END => {
                depth = depth.saturating_sub(1).max(1);
                match program.get(imm as usize) {
                    Some(c) if c.op == OP_CONSUME => {
                        format!("}}  (next token of {})", chname(c.imm.get()))
                    }
                    _ => "}".to_string(),
                }
            }
            OP_CHANNEL => {
                let bits = ins.imm2.get();
                let capacity = match bits & 0xFF {
                    0 => "capacity 0 (a rendezvous)".to_string(),
                    c => format!("capacity {c}"),
                };
                format!(
                    "declare {}: {capacity}, latency {} ticks",
                    chname(imm),
                    bits >> 8
                )
            }
            OP_PROCESS | OP_CONSUME => {
                let line = if ins.op == OP_PROCESS {
                    let replicas = if x[0] == NO_REG {
                        String::new()
                    } else {
                        let index = if ins.r == NO_REG {
                            String::new()
                        } else {
                            format!(" as r{}", ins.r)
                        };
                        format!(
                            " x {} replicas{index} (at most {})",
                            reg(x[0]),
                            ins.imm2.get()
                        )
                    };
                    format!("process{}{replicas} {{", pname(pc))
                } else {
                    let token = if ins.r == NO_REG {
                        String::new()
                    } else {
                        format!(" as r{}", ins.r)
                    };
                    format!(
                        "consume {}{token}, until closed and drained {{",
                        chname(imm)
                    )
                };
                let _ = writeln!(out, "  {pc:>4}  {}{line}", "  ".repeat(depth));
                depth += 1;
                continue;
            }
            OP_PROCESS_END => {
                depth = depth.saturating_sub(1).max(1);
                format!(
                    "}}  (end of process{}: closes the channels it sends on)",
                    pname(imm as usize)
                )
            }
            OP_SEND => format!(
                "send {} on {}: the process's last task completed",
                reg(x[0]),
                chname(imm)
            ),
            OP_CLOSE => format!("close {}", chname(imm)),
            OP_HEAP => format!("heap ring of {imm} bytes (the arena's last) for scratch tensors"),
            OP_FREE => format!(
                "free {}: its heap ring storage returns once the tasks before here retire",
                tname(imm)
            ),
            OP_WHEN => format!("when {} == 0: go to {imm}", reg(x[0])),
            OP_JUMP => format!("go to {imm}"),
            OP_CALL => {
                let stream = if x[1] != NO_REG {
                    format!(" on stream {}", reg(x[1]))
                } else if x[0] == 0 {
                    String::new()
                } else {
                    format!(" on stream {}", x[0])
                };
                format!("call {}{stream}", kernel_name(imm))
            }
            OP_ARG => {
                let access = match ins.r {
                    1 => "in",
                    2 => "out",
                    3 => "inout",
                    _ => "access?",
                };
                let rank = tensors
                    .get(imm as usize)
                    .map_or(4, |d| (d.rank.get() as usize).clamp(1, 4));
                let offsets: Vec<String> = x[..rank].iter().map(|&r| reg(r)).collect();
                let ext = |r: u8| {
                    if r == NO_REG {
                        "1".to_string()
                    } else {
                        format!("r{r}")
                    }
                };
                format!(
                    "  {access} {}[at {}; {} x {}]",
                    tname(imm),
                    offsets.join(", "),
                    ext(x[4]),
                    ext(x[5])
                )
            }
            OP_SCALAR => format!("  scalar {}", reg(x[0])),
            OP_RECORD => format!("record event {} on stream {}", x[1], x[0]),
            OP_WAIT => format!("stream {} waits for event {}", x[0], x[1]),
            OP_INPUT => format!("input {}", tname(imm)),
            OP_DISPATCH if imm == 0 => "dispatch taskset 0 (the run's policy)".to_string(),
            OP_DISPATCH => match device_runtime::sched::Schedule::decode(ins.imm2.get()) {
                Some(s) => format!(
                    "dispatch taskset {imm}: policy {}, key {}",
                    s.policy.name(),
                    s.key
                ),
                None => format!("dispatch taskset {imm}: schedule {:#x}?", ins.imm2.get()),
            },
            OP_WINDOW => format!("task window {imm}"),
            op => format!("opcode {op}?"),
        };
        let _ = writeln!(out, "  {pc:>4}  {}{text}", "  ".repeat(depth));
    }
}

/// What the device's expander sees when it runs on the host over a finished
/// arena: no task is running, every iteration has completed, data comes
/// from `arena` (without one, loads read 0 and set `needs_data`). Over an
/// arena at launch, list the tensors a run writes in `run_writes`: the
/// arena does not hold their data yet.
pub struct HostExpansion<'x> {
    /// The arena the program's loads read, if the host has one.
    pub arena: Option<&'x [u8]>,
    /// Arena offsets of the tensors whose data `arena` does not hold (a
    /// run writes it, and `arena` is the arena at launch): loads of them
    /// read 0 and set `needs_data`. Empty over a finished arena.
    pub run_writes: &'x [u64],
    /// The symbol values, by symbol number; a symbol past the end is unbound.
    pub symbols: &'x [i64],
    /// The number the next task gets: the caller counts tasks here.
    pub next: u64,
    /// Set when a load found no arena (or an offset past its end) and read 0:
    /// the expansion then depends on data the host lacks.
    pub needs_data: bool,
}

impl Context for HostExpansion<'_> {
    fn symbol(&self, index: usize) -> Option<i64> {
        self.symbols.get(index).copied()
    }
    fn next_task(&self) -> u64 {
        self.next
    }
    fn pending_writer(&mut self, _: u32, _: &Region) -> Option<u64> {
        None
    }
    fn completed_since(&self, _: u64) -> bool {
        true
    }
    fn read_i32(&mut self, tensor: &TensorDesc, element: u64) -> i32 {
        let at = (tensor.arena_offset.get() + element * 4) as usize;
        let arena = self
            .arena
            .filter(|_| !self.run_writes.contains(&tensor.arena_offset.get()));
        match arena.and_then(|a| a.get(at..at + 4)) {
            Some(b) => i32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            None => {
                self.needs_data = true;
                0
            }
        }
    }
}

/// Expands `table`'s program with the device's expander over `arena` (a
/// [`HostExpansion`]: every iteration complete, no writer pending) and
/// returns the tasks it gave, with no limit on the work: for benches that
/// time the expander on a program they built.
pub fn expand_program(table: &Table<'_>, arena: &[u8]) -> Result<u64, String> {
    let mut expander = Expander::new(table);
    let mut cx = HostExpansion {
        arena: Some(arena),
        run_writes: &[],
        symbols: &[],
        next: 0,
        needs_data: false,
    };
    let mut spec = TaskSpec::empty();
    loop {
        match expander
            .step_into(table, &mut cx, &mut spec)
            .map_err(|e| e.to_string())?
        {
            Next::Task => cx.next += 1,
            Next::Done => return Ok(cx.next),
            _ => {}
        }
    }
}

/// Counts the tasks `table` expands to (the tasks section's included),
/// reading data from `arena` (the arena at launch) and symbols from
/// `symbols`, in bounded work
/// ([`count_tasks`]). An error says why the count is not one number: the
/// expansion fails, or symbols or data the host lacks decide it.
pub fn expanded_tasks(
    table: &Table<'_>,
    arena: Option<&[u8]>,
    symbols: &[i64],
) -> Result<u64, String> {
    match count_tasks(table, arena, symbols)? {
        TaskCount::Exact(n) => u64::try_from(n).map_err(|_| format!("{n} tasks: more than u64")),
        count => Err(format!("{count}")),
    }
}

/// One line on a valid table: its tasks, what its program expands to, and
/// its size, with data from `arena` (the arena at launch) and symbols from
/// `symbols` where given.
pub fn summary(table: &Table<'_>, arena: Option<&[u8]>, symbols: &[i64]) -> String {
    summary_of(table, count_tasks(table, arena, symbols))
}

/// [`summary`] with the program's tasks counted already.
fn summary_of(table: &Table<'_>, counted: Result<TaskCount, String>) -> String {
    summary_with(table, counted, TaskCount::run_limit)
}

/// [`summary`] with the program's tasks counted already (e.g. with a
/// run's data, [`count_tasks`]), and `limit` saying where a run of that
/// count stops, if it does ([`TaskCount::run_limit`] for a device run).
pub fn summary_with(
    table: &Table<'_>,
    counted: Result<TaskCount, String>,
    limit: impl Fn(&TaskCount) -> Option<String>,
) -> String {
    let bytes = std::mem::size_of_val(table.program());
    let tasks = table.tasks().len();
    if table.program().is_empty() {
        return format!("{tasks} tasks, {} bytes of arena", table.arena_size());
    }
    let (count, limit) = match counted {
        Ok(count) => (count.to_string(), limit(&count)),
        Err(why) => (format!("tasks until the expansion fails ({why})"), None),
    };
    let limit = limit.map_or(String::new(), |l| format!("; {l}"));
    format!(
        "{tasks} tasks, then a program of {} instructions ({bytes} bytes) that expands to {count}; {} bytes of arena{limit}",
        table.program().len(),
        table.arena_size()
    )
}

fn section<'a, T: FromBytes + KnownLayout + Immutable>(
    out: &mut String,
    bytes: &'a [u8],
    what: &str,
    s: &SectionRef,
) -> &'a [T] {
    match entries::<T>(bytes, s) {
        Some(list) => {
            let _ = writeln!(out, "{what}: {} at offset {}", list.len(), s.offset.get());
            list
        }
        None => {
            let (offset, count) = (s.offset.get(), s.count.get());
            let _ = writeln!(
                out,
                "{what}: {count} entries at offset {offset} run past the bytes: not shown"
            );
            &[]
        }
    }
}

fn op_text(op: &StreamOp) -> String {
    let (stream, event) = (op.stream.get(), op.event.get());
    match op.op.get() {
        STREAM_OP_RECORD => format!("record event {event} on stream {stream}"),
        STREAM_OP_WAIT => format!("stream {stream} waits for event {event}"),
        other => format!("stream op {other}? (stream {stream}, event {event})"),
    }
}

fn dtype_name(dtype: u32) -> String {
    match dtype {
        wsp_ffi::DTYPE_F32 => "f32".to_string(),
        wsp_ffi::DTYPE_I32 => "i32".to_string(),
        other => format!("{other}?"),
    }
}

fn kernel_name(id: u32) -> String {
    wsp_ffi::lookup(id).map_or_else(|| format!("unknown_kernel_{id}"), |k| k.name.to_string())
}

fn arg_text(a: &TensorArg, tensors: &[TensorDesc]) -> String {
    let t = a.tensor.get() as usize;
    let (tname, rank) = match tensors.get(t) {
        Some(desc) => (name(&desc.name), (desc.rank.get() as usize).clamp(1, 4)),
        None => (format!("tensor{t}?"), 4),
    };
    let access = match a.access.get() {
        1 => "in",
        2 => "out",
        3 => "inout",
        _ => "access?",
    };
    let dims: Vec<String> = (0..rank)
        .map(|d| {
            let (o, e) = (a.offset[d].get() as u64, a.extent[d].get() as u64);
            format!("{o}:{}", o + e)
        })
        .collect();
    format!("{access} {tname}[{}]", dims.join(", "))
}
