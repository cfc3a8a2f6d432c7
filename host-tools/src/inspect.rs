//! `wsp inspect`: a readable dump of a descriptor table. It reads the raw
//! structs tolerantly, so a corrupted table is shown as far as it can be,
//! and ends with the runtime's own verdict from `Table::parse`.

use std::fmt::Write;

use device_runtime::abi::{
    table_checksum, KernelDesc, SectionRef, StreamOp, Table, TableHeader, TaskDesc, TensorArg,
    TensorDesc, MAGIC, STREAM_OP_RECORD, STREAM_OP_WAIT,
};
use zerocopy::{FromBytes, Immutable, KnownLayout};

/// How many tasks are shown unless all are asked for.
pub const TASKS_SHOWN: usize = 20;

/// The dump of `bytes`; never panics, whatever the bytes.
pub fn inspect(bytes: &[u8], all_tasks: bool) -> String {
    let mut out = String::new();
    dump(&mut out, bytes, all_tasks);
    match Table::parse(bytes) {
        Ok(t) => {
            let _ = writeln!(
                out,
                "valid: {} tasks, {} bytes of arena",
                t.tasks().len(),
                t.arena_size()
            );
        }
        Err(e) => {
            let _ = writeln!(out, "INVALID: {e}");
        }
    }
    out
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

fn dump(out: &mut String, bytes: &[u8], all_tasks: bool) {
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
        let _ = writeln!(
            out,
            "  [{i}] {:<8} dtype {} shape {shape:?} strides {strides:?} at arena +{}",
            name(&t.name),
            dtype_name(t.dtype.get()),
            t.arena_offset.get()
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
