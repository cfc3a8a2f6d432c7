//! Chrome trace-event JSON of a traced run ([`Recording`]), for Perfetto's
//! UI and `chrome://tracing`: one process for the run; a named lane per
//! scheduler thread ([`thread_lane`]) with the dispatcher's stall
//! intervals on thread 0's lane (it runs the dispatcher), each named by
//! its reason; a named lane per AICore (`core N (Cube, thread T)`, lane
//! number N) with a complete event per task, named by its kernel and the
//! indices of the program loops around its call (`attn_merge[3,1]`,
//! outermost first; the kernel alone for a task of the tasks section),
//! with its task number, kernel, core, thread, issue time, cycles, loop
//! indices and argument tiles in `args`; counters of the tasks on cores, the ready tasks in the dispatch
//! queues and the tasks in the window; and, if asked ([`TraceOptions`]),
//! flow arrows from each task to the tasks its completion released.
//!
//! Times are the run's clock as microseconds: semantic cycles at 1 GHz
//! (1,000 cycles per microsecond), or the shim's wall nanoseconds.
//!
//! Programs do not name their loops: the indices are positional.

use serde_json::{json, Value};

use crate::record::Recording;

/// The process id of the run.
const PID: u32 = 1;

/// The lane (trace `tid`) of scheduler thread `t`: after every core's
/// (a core's lane is its number).
pub fn thread_lane(t: usize) -> usize {
    1000 + t
}

/// What to put in a trace beyond the tasks, lanes and counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct TraceOptions {
    /// Flow arrows from each task to those it released (two events per
    /// release: big runs make big files).
    pub flows: bool,
}

/// Microseconds of `ticks` at `tps` ticks per second.
fn micros(ticks: u64, tps: u64) -> f64 {
    ticks as f64 * 1e6 / tps.max(1) as f64
}

fn lane_name(events: &mut Vec<Value>, tid: usize, name: String, sort: usize) {
    events.push(json!({
        "ph": "M", "pid": PID, "tid": tid, "name": "thread_name",
        "args": { "name": name },
    }));
    events.push(json!({
        "ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index",
        "args": { "sort_index": sort },
    }));
}

/// The trace of `rec`.
pub fn chrome_trace(rec: &Recording, options: &TraceOptions) -> Value {
    let tps = rec.ticks_per_second;
    let us = |t: u64| micros(t, tps);
    let clock = if rec.semantic {
        "semantic time, cycles at 1 GHz"
    } else {
        "host shim, wall time"
    };
    let mut events = vec![json!({
        "ph": "M", "pid": PID, "name": "process_name",
        "args": { "name": format!("pto-wsp run ({clock})") },
    })];
    for t in 0..rec.threads {
        let what = if t == 0 { " (dispatcher)" } else { "" };
        lane_name(
            &mut events,
            thread_lane(t),
            format!("scheduler thread {t}{what}"),
            t,
        );
    }
    for (core, kind) in rec.kinds.iter().enumerate() {
        let thread = rec.core_threads.get(core).copied().unwrap_or(0);
        let name = format!("core {core} ({kind:?}, thread {thread})");
        lane_name(&mut events, core, name, 100 + core);
    }
    for t in &rec.tasks {
        let kernel = wsp_ffi::lookup(t.kernel_id).map_or("unknown", |k| k.name);
        let tiles: Vec<String> = t.args.tensors[..t.args.num_tensors as usize]
            .iter()
            .map(|v| format!("{}x{}", v.rows, v.cols))
            .collect();
        let name = match t.loops.as_slice() {
            [] => kernel.to_string(),
            loops => {
                let indices: Vec<String> = loops.iter().map(u32::to_string).collect();
                format!("{kernel}[{}]", indices.join(","))
            }
        };
        events.push(json!({
            "ph": "X", "pid": PID, "tid": t.core, "name": name, "cat": "task",
            "ts": us(t.start), "dur": us(t.end) - us(t.start),
            "args": {
                "task": t.task,
                "kernel": kernel,
                "core": t.core,
                "thread": t.thread,
                "issued": t.issued,
                "cycles": t.cycles,
                "loops": t.loops,
                "tiles": tiles,
            },
        }));
    }
    // Stall intervals: from a sample naming a reason to the next sample
    // with another (or none), else to the last sample (the run's end: the
    // dispatcher may wait for the window when nothing is left to submit).
    let samples = &rec.dispatcher;
    let last = samples.last().map_or(0, |s| s.at);
    for (i, s) in samples.iter().enumerate() {
        let Some(reason) = s.stall else { continue };
        if i > 0 && samples[i - 1].stall == Some(reason) {
            continue;
        }
        let end = samples[i + 1..]
            .iter()
            .find(|n| n.stall != Some(reason))
            .map_or(last, |n| n.at);
        events.push(json!({
            "ph": "X", "pid": PID, "tid": thread_lane(0), "cat": "stall",
            "name": format!("stall: {reason}"),
            "ts": us(s.at), "dur": us(end) - us(s.at),
            "args": { "reason": reason },
        }));
    }
    for s in samples {
        events.push(json!({
            "ph": "C", "pid": PID, "name": "ready queue", "ts": us(s.at),
            "args": { "tasks": s.queued },
        }));
        events.push(json!({
            "ph": "C", "pid": PID, "name": "window", "ts": us(s.at),
            "args": { "tasks": s.in_flight },
        }));
    }
    // Tasks on cores: +1 at issue, -1 at end, in time order (an end
    // before an issue at the same time).
    let mut steps: Vec<(u64, i64)> = rec
        .tasks
        .iter()
        .flat_map(|t| [(t.issued, 1), (t.end, -1)])
        .collect();
    steps.sort_by_key(|&(t, d)| (t, d));
    let mut on_cores = 0i64;
    for (t, d) in steps {
        on_cores += d;
        events.push(json!({
            "ph": "C", "pid": PID, "name": "tasks on cores",
            "ts": us(t), "args": { "tasks": on_cores },
        }));
    }
    if options.flows {
        flows(rec, &mut events);
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ns" })
}

/// A flow arrow per release: from the end of the releasing task to the
/// start of the released one (each bound to its task's slice).
fn flows(rec: &Recording, events: &mut Vec<Value>) {
    let tps = rec.ticks_per_second;
    let by_number = |n: u32| {
        rec.tasks
            .binary_search_by_key(&n, |t| t.task)
            .ok()
            .map(|i| &rec.tasks[i])
    };
    for (id, &(by, task)) in rec.releases.iter().enumerate() {
        let (Some(from), Some(to)) = (by_number(by), by_number(task)) else {
            continue;
        };
        // Inside the releasing slice, so that the arrow binds to it.
        let from_ts = micros(from.start, tps).max(micros(from.end, tps) - 1e-3);
        events.push(json!({
            "ph": "s", "pid": PID, "tid": from.core, "id": id, "cat": "release",
            "name": "release", "ts": from_ts,
        }));
        events.push(json!({
            "ph": "f", "bp": "e", "pid": PID, "tid": to.core, "id": id, "cat": "release",
            "name": "release", "ts": micros(to.start, tps),
        }));
    }
}
