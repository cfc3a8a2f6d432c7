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

/// `ticks` at `tps` ticks per second in whole nanoseconds, rounded to
/// the nearest, in integers (no overflow: at most 2^64 x 10^9).
fn nanos(ticks: u64, tps: u64) -> u128 {
    let tps = u128::from(tps.max(1));
    (u128::from(ticks) * 1_000_000_000 + tps / 2) / tps
}

/// Whole nanoseconds as the microseconds the file holds: three decimals
/// at most, exact below 2^53 ns (104 days). Every time and duration of the
/// file goes through [`nanos`] and this, the duration from the difference
/// of two whole nanosecond counts, so that `ts + dur` is the event's end
/// to the last digit. (As the difference of two times in floating point a
/// duration is no whole number of nanoseconds, `0.16 - 0.016 =
/// 0.14400000000000002`, and an event that ends where the next one starts
/// would read as overlapping it.)
fn micros(ns: u128) -> f64 {
    ns as f64 / 1e3
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
    let ns = |t: u64| nanos(t, tps);
    let us = |t: u64| micros(ns(t));
    // From `start` to `end` (ticks), in microseconds of whole nanoseconds.
    let dur = |start: u64, end: u64| micros(ns(end).saturating_sub(ns(start)));
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
            "ts": us(t.start), "dur": dur(t.start, t.end),
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
            "ts": us(s.at), "dur": dur(s.at, end),
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
        // (A nanosecond before its end, or its start.)
        let from_ns = nanos(from.start, tps).max(nanos(from.end, tps).saturating_sub(1));
        events.push(json!({
            "ph": "s", "pid": PID, "tid": from.core, "id": id, "cat": "release",
            "name": "release", "ts": micros(from_ns),
        }));
        events.push(json!({
            "ph": "f", "bp": "e", "pid": PID, "tid": to.core, "id": id, "cat": "release",
            "name": "release", "ts": micros(nanos(to.start, tps)),
        }));
    }
}

#[cfg(test)]
mod tests {
    use wsp_ffi::CoreKind;

    use super::*;
    use crate::record::TaskSpan;

    fn task(task: u32, start: u64, end: u64) -> TaskSpan {
        TaskSpan {
            task,
            core: 0,
            thread: 0,
            kernel_id: 0,
            issued: start,
            start,
            end,
            cycles: 0,
            args: wsp_ffi::WspKernelArgs {
                num_tensors: 0,
                num_scalars: 0,
                tensors: [device_runtime::expand::NO_VIEW; 4],
                scalars: [0; 4],
            },
            loops: Vec::new(),
        }
    }

    /// A JSON number as whole nanoseconds of its microseconds, read from
    /// its text (no float arithmetic); `None` unless it has three decimals
    /// at most.
    fn whole_ns(n: &Value) -> Option<u64> {
        let text = n.to_string();
        let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
        if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let frac: u64 = format!("{frac:0<3}").parse().ok()?;
        Some(int.parse::<u64>().ok()? * 1000 + frac)
    }

    /// Two tasks of one core that touch do so to the last digit of the
    /// file: every `ts` and `dur` is whole nanoseconds. At 62.5 MHz a tick
    /// is 16 ns: the tasks 1..10 and 10..26 ticks are (16, 144) and
    /// (160, 256) ns, the first ending at 16 + 144 = 160, where the second
    /// starts. (As a difference of floats the first's `dur` was
    /// 0.16 - 0.016 = 0.14400000000000002 us, past the second's start.)
    /// A clock of 3 ticks a second rounds to the nearest nanosecond:
    /// tick 1 is 333,333,333.3 -> 333,333,333 ns, tick 2 666,666,667 ns.
    #[test]
    fn touching_tasks_share_their_boundary_exactly() {
        let mut rec = Recording {
            tasks: vec![task(0, 1, 10), task(1, 10, 26)],
            kinds: vec![CoreKind::Cube],
            core_threads: vec![0],
            threads: 1,
            ticks_per_second: 62_500_000,
            ..Recording::default()
        };
        let times = |rec: &Recording| -> Vec<(Option<u64>, Option<u64>)> {
            let doc = chrome_trace(rec, &TraceOptions::default());
            let doc: Value = serde_json::from_str(&doc.to_string()).unwrap();
            doc["traceEvents"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|e| e["ph"] == "X")
                .map(|e| (whole_ns(&e["ts"]), whole_ns(&e["dur"])))
                .collect()
        };
        assert_eq!(times(&rec), [(Some(16), Some(144)), (Some(160), Some(256))]);
        rec.ticks_per_second = 3;
        rec.tasks = vec![task(0, 1, 2)];
        assert_eq!(times(&rec), [(Some(333_333_333), Some(333_333_334))]);
    }
}
