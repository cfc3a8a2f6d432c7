//! Chrome trace-event JSON of a run in semantic time, for Perfetto's UI
//! and `chrome://tracing`: one process for the run, one named lane per
//! AICore (`core N (Cube, thread T)`), a complete event per task named by
//! its kernel (with its core, issue time, cycles and argument tiles in
//! `args`), and a counter of the tasks in flight (issued and not ended).
//!
//! Times are semantic cycles written as microseconds at
//! [`CYCLES_PER_SECOND`] (1 GHz: 1,000 cycles per microsecond), so the
//! UI's time axis reads in the clock the makespan is given in.
//!
//! What this does not record yet (the observability issue asks for them):
//! scheduler-thread lanes with stall intervals, flow arrows from a task to
//! those it released, loop indices in task names, and traces of threaded
//! shim and QEMU runs.

use serde_json::{json, Value};
use wsp_ffi::CoreKind;

use crate::semantic::{SemanticRun, CYCLES_PER_SECOND};

/// Microseconds of `cycles` semantic cycles.
fn micros(cycles: u64) -> f64 {
    cycles as f64 * 1e6 / CYCLES_PER_SECOND as f64
}

/// The trace of `run`, made on `kinds` cores (core `c` on scheduler thread
/// `c % threads`).
pub fn chrome_trace(run: &SemanticRun, kinds: &[CoreKind], threads: usize) -> Value {
    const PID: u32 = 1;
    let mut events = vec![json!({
        "ph": "M", "pid": PID, "name": "process_name",
        "args": { "name": "pto-wsp run (semantic time)" },
    })];
    for (core, kind) in kinds.iter().enumerate() {
        let name = format!("core {core} ({kind:?}, thread {})", core % threads.max(1));
        events.push(json!({
            "ph": "M", "pid": PID, "tid": core, "name": "thread_name",
            "args": { "name": name },
        }));
        events.push(json!({
            "ph": "M", "pid": PID, "tid": core, "name": "thread_sort_index",
            "args": { "sort_index": core },
        }));
    }
    for (task, l) in run.launches.iter().enumerate() {
        let name = wsp_ffi::lookup(l.kernel_id).map_or("unknown", |k| k.name);
        let tiles: Vec<String> = l.args.tensors[..l.args.num_tensors as usize]
            .iter()
            .map(|v| format!("{}x{}", v.rows, v.cols))
            .collect();
        events.push(json!({
            "ph": "X", "pid": PID, "tid": l.core, "name": name,
            "ts": micros(l.start), "dur": micros(l.end - l.start),
            "args": {
                "launch": task,
                "core": l.core,
                "issued_cycle": l.issued,
                "cycles": l.end - l.start,
                "tiles": tiles,
            },
        }));
    }
    // Tasks in flight: +1 at issue, -1 at end, in time order (an end
    // before an issue at the same time).
    let mut steps: Vec<(u64, i64)> = run
        .launches
        .iter()
        .flat_map(|l| [(l.issued, 1), (l.end, -1)])
        .collect();
    steps.sort_by_key(|&(t, d)| (t, d));
    let mut in_flight = 0i64;
    for (t, d) in steps {
        in_flight += d;
        events.push(json!({
            "ph": "C", "pid": PID, "name": "tasks in flight",
            "ts": micros(t), "args": { "tasks": in_flight },
        }));
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ns" })
}
