//! A QEMU run's trace ([`Trace`], from the firmware's `trace.out`) as a
//! Chrome trace-event file, which Perfetto and `chrome://tracing` open:
//! `{"traceEvents": [...]}` with one `ph:"X"` complete event per task,
//! issue, idle spell and scheduler-thread run (`ts`/`dur` in microseconds
//! of the firmware's timer, from the first event, in whole nanoseconds), in
//! lanes named by `ph:"M"` metadata events: process 1 holds one lane per
//! scheduler thread (its run, with its issues and idle spells inside it),
//! process 2 one lane per AICore (its tasks, one after another).
//!
//! Written here for the QEMU runs (serde_json only, so that the tests can
//! include it by path beside `qemu.rs`); the host's `wsp run --trace`
//! writes its own.

use serde_json::{json, Value};

use crate::qemu::{EventKind, Trace};

/// The process of the scheduler-thread lanes.
pub const SCHEDULER_PID: u64 = 1;
/// The process of the AICore lanes.
pub const AICORE_PID: u64 = 2;

/// `trace` as a Chrome trace-event JSON document; kernels are named by
/// `kernel_name` (e.g. from the kernel registry).
pub fn chrome_trace(trace: &Trace, kernel_name: impl Fn(u32) -> String) -> Value {
    let origin = trace.events.iter().map(|e| e.start).min().unwrap_or(0);
    // Microseconds from the first event, in whole nanoseconds.
    let us = |ticks: u64| (trace.micros(ticks - origin) * 1e3).round() / 1e3;
    let mut events = vec![
        meta(
            "process_name",
            SCHEDULER_PID,
            None,
            "scheduler threads (AICPU)",
        ),
        meta("process_name", AICORE_PID, None, "AICores"),
    ];
    let mut threads: Vec<u16> = trace.events.iter().map(|e| e.thread).collect();
    threads.extend((0..trace.dropped.len()).map(|t| t as u16));
    threads.sort_unstable();
    threads.dedup();
    for &t in &threads {
        let name = format!("scheduler thread {t}");
        events.push(meta(
            "thread_name",
            SCHEDULER_PID,
            Some(u64::from(t)),
            &name,
        ));
    }
    let mut cores: Vec<u16> = trace
        .events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::Task | EventKind::Issue))
        .map(|e| e.core)
        .collect();
    cores.sort_unstable();
    cores.dedup();
    for &c in &cores {
        let name = format!("AICore {c}");
        events.push(meta("thread_name", AICORE_PID, Some(u64::from(c)), &name));
    }
    for e in &trace.events {
        let (name, cat, pid, tid, args) = match e.kind {
            EventKind::Task => (
                kernel_name(e.kernel),
                "task",
                AICORE_PID,
                e.core,
                json!({"core": e.core, "thread": e.thread, "kernel": e.kernel, "cycles": e.cycles, "task_key": e.key}),
            ),
            EventKind::Issue => (
                format!("issue {}", kernel_name(e.kernel)),
                "issue",
                SCHEDULER_PID,
                e.thread,
                json!({"core": e.core, "kernel": e.kernel, "task_key": e.key}),
            ),
            EventKind::Thread => (
                "schedule".to_string(),
                "thread",
                SCHEDULER_PID,
                e.thread,
                json!({}),
            ),
            EventKind::Idle => (
                "idle".to_string(),
                "idle",
                SCHEDULER_PID,
                e.thread,
                json!({}),
            ),
        };
        events.push(json!({
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": us(e.start),
            "dur": us(e.end) - us(e.start),
            "pid": pid,
            "tid": tid,
            "args": args,
        }));
    }
    json!({
        "traceEvents": events,
        "otherData": {
            "source": "pto-wsp firmware under QEMU",
            "ticks_per_second": trace.ticks_per_second,
            "dropped_per_thread": trace.dropped,
        },
    })
}

/// A `ph:"M"` event naming process `pid` (or its thread `tid`).
fn meta(what: &str, pid: u64, tid: Option<u64>, name: &str) -> Value {
    json!({
        "name": what,
        "ph": "M",
        "pid": pid,
        "tid": tid.unwrap_or(0),
        "args": {"name": name},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qemu::TraceEvent;

    fn event(kind: EventKind, thread: u16, core: u16, start: u64, end: u64) -> TraceEvent {
        TraceEvent {
            kind,
            thread,
            core,
            key: 9,
            kernel: 7,
            cycles: 3,
            start,
            end,
        }
    }

    #[test]
    fn events_become_complete_events_in_named_lanes() {
        let trace = Trace {
            ticks_per_second: 1_000_000,
            dropped: vec![0, 2],
            events: vec![
                event(EventKind::Thread, 1, 0, 100, 200),
                event(EventKind::Issue, 1, 3, 110, 112),
                event(EventKind::Task, 1, 3, 112, 150),
            ],
        };
        let doc = chrome_trace(&trace, |k| format!("k{k}"));
        let events = doc["traceEvents"].as_array().unwrap();
        let lanes: Vec<(u64, u64, &str)> = events
            .iter()
            .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
            .map(|e| {
                let name = e["args"]["name"].as_str().unwrap();
                (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap(), name)
            })
            .collect();
        assert!(lanes.contains(&(SCHEDULER_PID, 0, "scheduler thread 0")));
        assert!(lanes.contains(&(SCHEDULER_PID, 1, "scheduler thread 1")));
        assert!(lanes.contains(&(AICORE_PID, 3, "AICore 3")));
        let task = events.iter().find(|e| e["cat"] == "task").unwrap();
        assert_eq!(task["name"], "k7");
        assert_eq!(
            (task["pid"].as_u64(), task["tid"].as_u64()),
            (Some(2), Some(3))
        );
        // 1 tick = 1 us here; times from the earliest event.
        assert_eq!(task["ts"].as_f64(), Some(12.0));
        assert_eq!(task["dur"].as_f64(), Some(38.0));
        let issue = events.iter().find(|e| e["cat"] == "issue").unwrap();
        assert_eq!(
            (issue["pid"].as_u64(), issue["tid"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(doc["otherData"]["dropped_per_thread"], json!([0, 2]));
    }
}
