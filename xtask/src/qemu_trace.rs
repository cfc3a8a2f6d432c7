//! A QEMU run's trace ([`Trace`], from the firmware's `trace.out`) as a
//! Chrome trace-event file, which Perfetto and `chrome://tracing` open:
//! `{"traceEvents": [...]}` with one `ph:"X"` complete event per task,
//! issue, idle spell and scheduler-thread run (`ts`/`dur` in microseconds
//! of the firmware's timer, from the first event, in whole nanoseconds), in
//! lanes named by `ph:"M"` metadata events: process 1 holds one lane per
//! scheduler thread (its run, with its issues and idle spells inside it),
//! process 2 one lane per AICore (its tasks, one after another).
//!
//! Both `ts` and `dur` come from whole nanoseconds counted in integers
//! (the start's and the end's, rounded once each), so that in the file's
//! decimals an event's `ts + dur` is its end exactly: an event that ends
//! where the next one starts, or with its lane's outer event, reads so to
//! the last digit, and events nest in the file as their ticks do. (A
//! reader that adds `ts` and `dur` in floating point can still land a unit
//! in the last place off; one that rounds each to nanoseconds, as
//! Perfetto's importer does, cannot.)
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
    // Whole nanoseconds from the first event.
    let ns = |ticks: u64| trace.nanos(ticks.saturating_sub(origin));
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
        // The duration from the two times in integers, not as the
        // difference of the two in floating point, which is no whole
        // number of nanoseconds (0.16 - 0.016 = 0.14400000000000002): the
        // file would say the event ends a little past or before its end.
        let (start, end) = (ns(e.start), ns(e.end));
        events.push(json!({
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": micros(start),
            "dur": micros(end.saturating_sub(start)),
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

/// Whole nanoseconds as microseconds: the double nearest `ns / 1000`,
/// which serde_json writes as that decimal, three places at most (below
/// 10^15 ns, 11.5 days: 15 significant digits, which a double keeps).
fn micros(ns: u128) -> f64 {
    ns as f64 / 1e3
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

    /// A JSON number written with three decimal places at most, as whole
    /// nanoseconds of its microseconds, read from its text (no float
    /// arithmetic); `None` for any other number.
    fn whole_ns(n: &Value) -> Option<u64> {
        let text = n.to_string();
        let (int, frac) = text.split_once('.').unwrap_or((&text, ""));
        if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let frac: u64 = format!("{frac:0<3}").parse().ok()?;
        Some(int.parse::<u64>().ok()? * 1000 + frac)
    }

    /// Events that touch (an issue and the idle spell after it, a core's
    /// two tasks) or end together (the idle spell that ends the thread's
    /// run) do so exactly in the file: every `ts` and `dur` is a whole
    /// number of nanoseconds. The difference of the two times as floats
    /// made the issue's `dur` 0.16 - 0.016 = 0.14400000000000002, an end
    /// written 2e-17 us past the idle spell's start, and so on: a lane
    /// that did not nest by a hair, and a 17-digit number that serde_json's
    /// default float parser can read a unit in the last place off (the
    /// traced QEMU test's flake).
    #[test]
    fn touching_events_share_their_boundary_exactly() {
        // 62.5 MHz, QEMU's timer: a tick is 16 ns.
        let trace = Trace {
            ticks_per_second: 62_500_000,
            dropped: vec![0],
            events: vec![
                event(EventKind::Thread, 0, 0, 0, 30),
                event(EventKind::Issue, 0, 0, 1, 10),
                event(EventKind::Idle, 0, 0, 10, 30),
                event(EventKind::Task, 0, 0, 10, 26),
                event(EventKind::Task, 0, 0, 26, 30),
            ],
        };
        let doc = chrome_trace(&trace, |k| format!("k{k}"));
        let doc: Value = serde_json::from_str(&doc.to_string()).unwrap();
        let got: Vec<(Option<u64>, Option<u64>)> = doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "X")
            .map(|e| (whole_ns(&e["ts"]), whole_ns(&e["dur"])))
            .collect();
        // (ts, dur) in ns, 16 per tick from tick 0: the run 0 + 30 ticks,
        // the issue 1 + 9, the idle spell 10 + 20 (it ends at 160 + 320 =
        // 480 ns, with the run), the tasks 10 + 16 and 26 + 4 (the first
        // ends at 160 + 256 = 416 ns, where the second starts).
        let want = [(0, 480), (16, 144), (160, 320), (160, 256), (416, 64)];
        let want: Vec<_> = want.iter().map(|&(t, d)| (Some(t), Some(d))).collect();
        assert_eq!(got, want);
    }

    /// Ticks become nanoseconds rounded to the nearest, in integers: at
    /// 19.2 MHz (a tick is 52.083.. ns) tick 1 is 52 ns, tick 2 104.17 ->
    /// 104 ns and tick 7 364.58 -> 365 ns; a zero-frequency trace (which `Trace::parse`
    /// refuses) counts 1 tick a second rather than dividing by zero; the
    /// largest tick does not overflow (2^64 - 1 s in ns).
    #[test]
    fn ticks_become_nanoseconds_to_the_nearest() {
        let at = |ticks_per_second| Trace {
            ticks_per_second,
            dropped: vec![],
            events: vec![],
        };
        assert_eq!(at(19_200_000).nanos(1), 52);
        assert_eq!(at(19_200_000).nanos(2), 104);
        assert_eq!(at(19_200_000).nanos(7), 365);
        assert_eq!(at(0).nanos(3), 3_000_000_000);
        assert_eq!(at(1).nanos(u64::MAX), u128::from(u64::MAX) * 1_000_000_000);
    }

    /// A `trace.out` as the firmware writes it (version 2, 24-byte records:
    /// kind and thread in one byte, run core, u16 kernel id, key, cycles,
    /// u48 start and end after the header's base) reads back field for
    /// field; another version, record size or kind is refused.
    #[test]
    fn a_trace_file_reads_back() {
        let base = 1u64 << 40;
        let mut bytes = b"WSPT".to_vec();
        bytes.extend(2u32.to_le_bytes());
        bytes.extend(62_500_000u64.to_le_bytes());
        bytes.extend(base.to_le_bytes());
        bytes.extend(2u32.to_le_bytes()); // threads
        bytes.extend(24u32.to_le_bytes());
        bytes.extend([0u32.to_le_bytes(), 5u32.to_le_bytes()].concat());
        let record = |kind: u8, thread: u8, core: u8, start: u64, end: u64| {
            let mut r = vec![kind | thread << 4, core];
            r.extend(19u16.to_le_bytes());
            r.extend(0xdead_beefu32.to_le_bytes());
            r.extend(u32::MAX.to_le_bytes());
            r.extend(&start.to_le_bytes()[..6]);
            r.extend(&end.to_le_bytes()[..6]);
            r
        };
        bytes.extend(record(0, 1, 3, 7, (1 << 48) - 1));
        bytes.extend(record(3, 0, 0, 0, 0));
        let trace = Trace::parse(&bytes).unwrap();
        assert_eq!(trace.ticks_per_second, 62_500_000);
        assert_eq!(trace.dropped, vec![0, 5]);
        assert_eq!(
            trace.events,
            vec![
                TraceEvent {
                    kind: EventKind::Task,
                    thread: 1,
                    core: 3,
                    key: 0xdead_beef,
                    kernel: 19,
                    cycles: u32::MAX,
                    start: base + 7,
                    end: base + (1 << 48) - 1,
                },
                TraceEvent {
                    kind: EventKind::Idle,
                    thread: 0,
                    core: 0,
                    key: 0xdead_beef,
                    kernel: 19,
                    cycles: u32::MAX,
                    start: base,
                    end: base,
                },
            ]
        );
        let mut v1 = bytes.clone();
        v1[4] = 1;
        assert!(Trace::parse(&v1).unwrap_err().contains("version 1"));
        let mut wide = bytes.clone();
        wide[28] = 32;
        assert!(Trace::parse(&wide).unwrap_err().contains("32 bytes"));
        let mut odd = bytes.clone();
        let first = 40;
        odd[first] = 5;
        assert!(Trace::parse(&odd).unwrap_err().contains("kind 5"));
        let mut backwards = bytes;
        // The second record starts at 9 and ends at 0.
        backwards[first + 24 + 12] = 9;
        assert!(Trace::parse(&backwards)
            .unwrap_err()
            .contains("before it starts"));
    }
}
