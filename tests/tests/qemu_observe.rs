//! Observability of QEMU runs: the firmware's log is defmt frames that
//! decode to the lines it logged, with their levels; `trace` runs record
//! one task event per task, the same tasks as the shim's run of the same
//! table (by their kernels and arguments), on the cores its threaded run
//! with the same schedule uses, in a Chrome trace-event file whose lanes nest; a full
//! trace queue drops and counts events without stopping the run.

use std::collections::BTreeMap;

use device_runtime::sched::{PolicyKind, RunOptions, SchedConfig};
use host_tools::dag::random_dag;
use host_tools::semantic::run_semantic_with;
use host_tools::shim::Shim;
use host_tools::table::seal;
use host_tools::workloads::{Params, Workload};
use serde_json::Value;
use wsp_ffi::WspKernelArgs;
use wsp_tests::{
    chrome_trace, decode_log, firmware, launch_block, run_in_qemu, run_in_qemu_configured,
    EventKind, QemuOutcome, Trace, TraceEvent, AICORE_PID, SCHEDULER_PID,
};

fn gemm() -> Workload {
    let w = Workload::build("gemm", Params::of("gemm").unwrap()).unwrap();
    assert_eq!(w.tasks, 512);
    w
}

fn messages(outcome: &QemuOutcome) -> Vec<(Option<&str>, &str)> {
    outcome
        .log
        .iter()
        .map(|l| (l.level, l.message.as_str()))
        .collect()
}

/// A successful run logs that the MMU is on, its figures and its result
/// at level info, and nothing reaches QEMU's stdout but through defmt.
#[test]
fn a_run_logs_defmt_frames_that_decode_to_its_lines() {
    let w = gemm();
    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    assert_eq!(outcome.status, 0, "{}\n{}", outcome.stdout, outcome.stderr);
    let all = messages(&outcome);
    assert_eq!(all.len(), 4, "{all:?}");
    assert!(
        all.iter().all(|(level, _)| *level == Some("info")),
        "{all:?}"
    );
    assert!(all[0].1.starts_with("mmu on cpus="), "{all:?}");
    let lines = &all[1..];
    assert!(lines[0].1.starts_with("tasks=512 wall_us="), "{lines:?}");
    assert!(lines[0].1.contains(" per_core="), "{lines:?}");
    let default = SchedConfig::default();
    let threads = format!(
        "threads={} policy={} per_thread=",
        default.threads,
        default.policy.name()
    );
    let per_thread = lines[1].1.strip_prefix(&threads).unwrap_or_else(|| {
        panic!("expected {threads}.. in {lines:?}");
    });
    let issued: Vec<u64> = per_thread.split(',').map(|n| n.parse().unwrap()).collect();
    assert_eq!(issued.len(), default.threads);
    assert_eq!(issued.iter().sum::<u64>(), 512);
    assert_eq!(lines[2].1, "RESULT OK");
    // Every decoded line carries the firmware's timestamp.
    assert!(outcome.log.iter().all(|l| l.timestamp.is_some()));
    // stdout is the log's messages and nothing else: QEMU printed nothing.
    let joined: String = all.iter().map(|(_, m)| format!("{m}\n")).collect();
    assert_eq!(outcome.stdout, joined);
    assert_eq!(outcome.stderr, "");
}

/// A failed run logs its error at level error (after the line that says
/// the MMU is on, at level info).
#[test]
fn a_failure_is_logged_at_level_error() {
    let w = gemm();
    let mut table = w.table.clone();
    // Tensor 0's dtype, right after the header and its 16-byte name.
    table[device_runtime::abi::HEADER_SIZE + 16] = 9;
    seal(&mut table);
    let outcome = run_in_qemu(&table, &w.arena.bytes);
    assert_eq!(outcome.status, 2, "{}", outcome.stdout);
    let all = messages(&outcome);
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].0, Some("info"));
    assert!(all[0].1.starts_with("mmu on cpus="), "{all:?}");
    let lines = &all[1..];
    assert_eq!(lines[0].0, Some("error"));
    assert!(
        lines[0]
            .1
            .starts_with("RESULT ERROR invalid descriptor table: section `tensors`"),
        "{lines:?}"
    );
}

/// The decoder refuses frames that are not the firmware's (garbage) and
/// an ELF without a defmt table, naming the cause.
#[test]
fn bad_log_input_is_a_clear_error() {
    let elf = std::fs::read(firmware()).unwrap();
    assert_eq!(decode_log(&elf, &[]).unwrap(), vec![]);
    // A whole frame (it ends with a zero) that is no frame of the firmware.
    let err = decode_log(&elf, &[0x13, 0x37, 0x42, 0x00]).unwrap_err();
    assert!(err.contains("malformed"), "{err}");
    let own = std::fs::read(std::env::current_exe().unwrap()).unwrap();
    let err = decode_log(&own, &[]).unwrap_err();
    assert!(err.contains("defmt table"), "{err}");
}

/// The run `w` with `sched` and a trace; it must succeed.
fn traced(w: &Workload, threads: u32, policy: PolicyKind) -> Trace {
    let block = launch_block(&[], threads, policy.name()).unwrap();
    let outcome = run_in_qemu_configured(&w.table, &w.arena.bytes, |run| {
        run.launch = Some(block);
        run.trace = true;
    });
    assert_eq!(outcome.status, 0, "{}\n{}", outcome.stdout, outcome.stderr);
    outcome.trace.expect("a traced run writes trace.out")
}

fn count(trace: &Trace, kind: EventKind) -> usize {
    trace.events.iter().filter(|e| e.kind == kind).count()
}

/// One task event per task, on the same cores as the shim's run of the
/// same table with the same schedule (affinity on two threads: 128 tasks
/// on each cube core, so that a thread's events fit its trace queue), each
/// issued once, within its thread's run; the Chrome file has a named lane
/// per scheduler thread and per AICore, and the events of a lane nest, as
/// recorded (in ticks) and in the file (in whole nanoseconds, exactly).
#[test]
fn a_traced_run_has_one_event_per_task_on_the_shims_cores() {
    let w = Workload::build(
        "gemm",
        Params {
            m: 128,
            ..Params::of("gemm").unwrap()
        },
    )
    .unwrap();
    assert_eq!(w.tasks, 256);
    let sched = SchedConfig {
        threads: 2,
        policy: PolicyKind::Affinity,
        ..SchedConfig::default()
    };
    let mut arena = w.arena.clone();
    let stats = Shim {
        sched,
        ..Shim::default()
    }
    .run(&w.table, &mut arena.bytes)
    .unwrap();
    let shim_cores: Vec<u64> = stats.cores().iter().map(|c| c.tasks).collect();

    let trace = traced(&w, 2, PolicyKind::Affinity);
    assert_eq!(trace.dropped, vec![0, 0]);
    assert_eq!(count(&trace, EventKind::Task), w.tasks);
    assert_eq!(count(&trace, EventKind::Issue), w.tasks);
    assert_eq!(count(&trace, EventKind::Thread), 2);
    // A thread waits now and then (for its cores, or for work).
    assert!(count(&trace, EventKind::Idle) > 0);
    let mut per_core = vec![0u64; shim_cores.len()];
    for e in trace.events.iter().filter(|e| e.kind == EventKind::Task) {
        per_core[usize::from(e.core)] += 1;
        let kernel = wsp_ffi::lookup(e.kernel).expect("a registered kernel");
        assert_eq!(kernel.name, "gemm_tile");
    }
    assert_eq!(per_core, shim_cores);

    // The same tasks as the shim's (semantic) run of the table: the same
    // multiset of task keys, from the kernels and their arguments.
    let mut arena = w.arena.clone();
    let base = arena.bytes.as_ptr() as u64;
    let kinds = Shim::default().core_kinds();
    let run = run_semantic_with(
        &w.table,
        &mut arena.bytes,
        &kinds,
        &sched,
        &RunOptions::default(),
    )
    .unwrap();
    let mut shim_keys: Vec<u32> = run
        .launches
        .iter()
        .map(|l| key(l.kernel_id, &l.args, base))
        .collect();
    let mut qemu_keys: Vec<u32> = trace
        .events
        .iter()
        .filter(|e| e.kind == EventKind::Task)
        .map(|e| e.key)
        .collect();
    shim_keys.sort_unstable();
    qemu_keys.sort_unstable();
    assert_eq!(shim_keys.len(), w.tasks);
    assert_eq!(qemu_keys, shim_keys);
    let mut distinct = qemu_keys.clone();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        w.tasks,
        "a GEMM's tiles are all different tasks"
    );
    let on_threads = |e: &&TraceEvent| matches!(e.kind, EventKind::Issue | EventKind::Idle);
    for e in trace.events.iter().filter(on_threads) {
        let run = trace
            .events
            .iter()
            .find(|r| r.kind == EventKind::Thread && r.thread == e.thread)
            .unwrap();
        assert!(run.start <= e.start && e.end <= run.end);
    }

    let doc = chrome_trace(&trace, |k| wsp_ffi::lookup(k).unwrap().name.into());
    let text = serde_json::to_string(&doc).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let events = doc["traceEvents"].as_array().unwrap();
    let lane_names: Vec<(u64, u64, String)> = events
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            let (pid, tid) = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
            (pid, tid, e["args"]["name"].as_str().unwrap().to_string())
        })
        .collect();
    for t in 0..2 {
        assert!(lane_names.contains(&(SCHEDULER_PID, t, format!("scheduler thread {t}"))));
    }
    for c in [0, 1] {
        assert!(lane_names.contains(&(AICORE_PID, c, format!("AICore {c}"))));
    }
    // As recorded, in ticks, a lane's events nest: a fault here is the
    // firmware's (its clocks or its recording), not the conversion's.
    let mut recorded: BTreeMap<(u64, u64), Vec<Span>> = BTreeMap::new();
    for e in &trace.events {
        let lane = match e.kind {
            EventKind::Task => (AICORE_PID, u64::from(e.core)),
            _ => (SCHEDULER_PID, u64::from(e.thread)),
        };
        let what = format!("{:?}", e.kind);
        recorded
            .entry(lane)
            .or_default()
            .push((e.start, e.end, what));
    }
    for (lane, spans) in &mut recorded {
        if let Err(overlap) = check_nesting(spans) {
            panic!("lane {lane:?} as recorded, in ticks: {overlap}");
        }
    }
    // In the Chrome file, times are whole nanoseconds (as microseconds
    // with three decimal places at most, which round to them exactly), so
    // a lane's events nest there too, compared exactly in integers.
    let mut lanes: BTreeMap<(u64, u64), Vec<Span>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "X") {
        let key = (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap());
        let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
        let (ts_ns, dur_ns) = ((ts * 1e3).round(), (dur * 1e3).round());
        assert!(ts_ns >= 0.0 && dur_ns >= 0.0, "{e}");
        assert_eq!(
            (ts_ns / 1e3, dur_ns / 1e3),
            (ts, dur),
            "ts and dur in whole nanoseconds: {e}"
        );
        let (start, end) = (ts_ns as u64, (ts_ns + dur_ns) as u64);
        let what = e["cat"].as_str().unwrap().to_string();
        lanes.entry(key).or_default().push((start, end, what));
    }
    let tasks_in_file: usize = lanes
        .iter()
        .filter(|((pid, _), _)| *pid == AICORE_PID)
        .map(|(_, v)| v.len())
        .sum();
    assert_eq!(tasks_in_file, w.tasks);
    for (lane, spans) in &mut lanes {
        if let Err(overlap) = check_nesting(spans) {
            panic!("lane {lane:?} in the Chrome file, in ns (its ticks nest): {overlap}");
        }
    }
}

/// An event of a lane: start, end (in whole units) and what it is.
type Span = (u64, u64, String);

/// Whether the events of one lane nest: sorted by start (the longer first
/// of two that start together), each ends no later than the innermost
/// event it starts inside (an event that ends when another starts is not
/// inside it). If not, names the first event that overlaps its outer
/// event, with the lane's events around it.
fn check_nesting(spans: &mut [Span]) -> Result<(), String> {
    spans.sort_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    // Indices of the events open at the current start, innermost last.
    let mut open: Vec<usize> = Vec::new();
    for i in 0..spans.len() {
        let (start, end, _) = &spans[i];
        while open.last().is_some_and(|&o| spans[o].1 <= *start) {
            open.pop();
        }
        if let Some(&o) = open.last() {
            if *end > spans[o].1 {
                let show = |(s, e, what): &Span| format!("{what} [{s}, {e}]");
                let around = spans[i.saturating_sub(4)..(i + 3).min(spans.len())]
                    .iter()
                    .map(|span| format!("  {}", show(span)))
                    .collect::<Vec<_>>()
                    .join("\n");
                return Err(format!(
                    "{} overlaps its outer event {}; the lane's events around it, by start:\n{around}",
                    show(&spans[i]),
                    show(&spans[o]),
                ));
            }
        }
        open.push(i);
    }
    Ok(())
}

/// The nesting check takes nested, touching and zero-length events
/// (one at the start of the next, one at the end of its outer event) and
/// names the first event that overlaps its outer one.
#[test]
fn the_nesting_check_finds_events_that_overlap_without_nesting() {
    let span = |s, e| (s, e, format!("e{s}"));
    let mut good = vec![
        span(0, 100),
        span(10, 20),
        span(20, 20),
        span(20, 30),
        span(30, 100),
        span(100, 100),
    ];
    assert_eq!(check_nesting(&mut good), Ok(()));
    // [15, 25] starts inside [10, 20] and ends after it.
    let mut bad = vec![span(0, 100), span(15, 25), span(10, 20)];
    let err = check_nesting(&mut bad).unwrap_err();
    assert!(
        err.starts_with("e15 [15, 25] overlaps its outer event e10 [10, 20];"),
        "{err}"
    );
}

/// A task's key as the trace documents it: FNV-1a (32 bits) over the
/// kernel id, each tensor view used (its address as an offset into the
/// arena at `base`, rows, columns, row stride, dtype) and each scalar used.
fn key(kernel: u32, args: &WspKernelArgs, base: u64) -> u32 {
    let mut bytes = kernel.to_le_bytes().to_vec();
    for v in &args.tensors[..args.num_tensors as usize] {
        bytes.extend((v.addr - base).to_le_bytes());
        for x in [v.rows, v.cols, v.row_stride, v.dtype] {
            bytes.extend(x.to_le_bytes());
        }
    }
    for s in &args.scalars[..args.num_scalars as usize] {
        bytes.extend(s.to_le_bytes());
    }
    bytes.iter().fold(0x811c_9dc5u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    })
}

/// A run without `trace` writes none.
#[test]
fn an_untraced_run_writes_no_trace() {
    let w = gemm();
    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    assert_eq!(outcome.status, 0);
    assert!(outcome.trace.is_none());
}

/// More events than a thread's queue holds: the run still completes, and
/// every event is either in the trace or counted as dropped.
#[test]
fn a_full_trace_queue_drops_and_counts_without_stopping_the_run() {
    const TASKS: usize = 1000;
    let (table, data) = random_dag(5, TASKS);
    let block = launch_block(&[], 1, "").unwrap();
    let outcome = run_in_qemu_configured(&table, &data.bytes, |run| {
        run.launch = Some(block);
        run.trace = true;
    });
    assert_eq!(outcome.status, 0, "{}", outcome.stdout);
    assert!(outcome.stdout.contains(&format!("tasks={TASKS} ")));
    let trace = outcome.trace.unwrap();
    assert_eq!(trace.dropped.len(), 1);
    let dropped = trace.dropped[0] as usize;
    assert!(
        dropped > 0,
        "1000 tasks and their issues overflow one queue"
    );
    // The queue holds what it can, and nothing is recorded twice: each task
    // has an issue and a task event, the thread its run, and the rest are
    // idle spells; whatever did not fit was counted.
    assert_eq!(trace.events.len(), QUEUE_RECORDS);
    let tasks = count(&trace, EventKind::Task);
    let issues = count(&trace, EventKind::Issue);
    assert!(tasks < TASKS && issues < TASKS, "{tasks} {issues}");
    assert!(issues >= tasks);
    assert!(
        trace.events.len() + dropped > 2 * TASKS,
        "and the run: 2 * TASKS + 1 at least"
    );
}

/// Records one scheduler thread's queue holds (the firmware's
/// `trace::QUEUE_RECORDS`: all the events of 128 tasks).
const QUEUE_RECORDS: usize = 4 * 128 + 2;
