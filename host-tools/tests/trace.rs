//! Traces and pictures of runs. The Chrome trace of a run (semantic or
//! threaded shim) is valid JSON of the trace-event format with exactly one
//! complete event per task of the run (the same task numbers; in semantic
//! time at the executor's own launch times), named lanes per scheduler
//! thread and per core, events that do not overlap within a lane (Perfetto
//! requires events in a lane to nest), stall intervals on the dispatcher's
//! lane when the dispatcher stalled, counters, and flow arrows that go
//! forward in time; the picture has the layout's size and coloured pixels
//! in each busy lane only. `wsp run --trace --plot`, `wsp plot` and `wsp
//! run --json` through the CLI.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use device_runtime::abi::launch::Symbols;
use device_runtime::orch::StallReason;
use device_runtime::sched::{RunOptions, SchedConfig};
use host_tools::plot::Swimlanes;
use host_tools::program_examples::{self as examples, T};
use host_tools::record::{Recording, Sink};
use host_tools::semantic::{run_semantic_observed, SemanticRun};
use host_tools::shim::Shim;
use host_tools::trace::{chrome_trace, thread_lane, TraceOptions};
use host_tools::workloads::{Params, Workload};
use serde_json::Value;
use wsp_ffi::CoreKind;

const KINDS: [CoreKind; 4] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
];

fn pipeline() -> Workload {
    let p = Params {
        m: 128,
        n: 32,
        k: 32,
        tile: 32,
        seed: 2,
    };
    Workload::build("pipeline", p).unwrap()
}

fn sched(threads: usize) -> SchedConfig {
    SchedConfig {
        threads,
        ..SchedConfig::default()
    }
}

/// A semantic run of `w` on [`KINDS`] with `threads` scheduler threads,
/// and what it recorded.
fn semantic(w: &Workload, threads: usize, options: &RunOptions) -> (SemanticRun, Recording) {
    let mut arena = w.arena.clone();
    let sink = Sink::new(true);
    let run = run_semantic_observed(
        &w.table,
        &mut arena.bytes,
        &KINDS,
        &sched(threads),
        options,
        &sink,
    )
    .unwrap();
    assert!(w.verify(&arena).passed());
    let owners: Vec<usize> = (0..KINDS.len())
        .map(|c| device_runtime::sched::core_owner(c, threads))
        .collect();
    let rec = sink.recording(&KINDS, &owners, run.stats.ticks_per_second, true);
    (run, rec)
}

/// Through text and back: what a file holds.
fn reparse(trace: &Value) -> Value {
    serde_json::from_str(&trace.to_string()).unwrap()
}

fn events(trace: &Value) -> &Vec<Value> {
    trace["traceEvents"].as_array().unwrap()
}

fn tasks(trace: &Value) -> Vec<&Value> {
    let all = events(trace).iter().filter(|e| e["ph"] == "X");
    all.filter(|e| e["cat"] == "task").collect()
}

/// Every lane's complete events are named by a `thread_name` event and do
/// not overlap.
fn check_lanes(trace: &Value) {
    let named: BTreeSet<u64> = events(trace)
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| e["tid"].as_u64().unwrap())
        .collect();
    // Times are whole nanoseconds (the file's microseconds have three
    // decimals at most), so lanes compare exactly in integers.
    let ns = |e: &Value, field: &str| {
        let us = e[field].as_f64().unwrap();
        let ns = (us * 1e3).round();
        assert!((us * 1e3 - ns).abs() < 1e-3, "{field} not whole ns: {e}");
        assert!(ns >= 0.0, "{e}");
        ns as u64
    };
    let mut lanes: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for e in events(trace).iter().filter(|e| e["ph"] == "X") {
        let tid = e["tid"].as_u64().unwrap();
        let (ts, dur) = (ns(e, "ts"), ns(e, "dur"));
        lanes.entry(tid).or_default().push((ts, ts + dur));
    }
    for (tid, mut spans) in lanes {
        assert!(named.contains(&tid), "lane {tid} has no name");
        // By start, then end: a task issued and seen finished in one
        // scheduling round (one clock read) is a zero-length slice, which
        // may share its start with the next task on its core.
        spans.sort_unstable();
        for pair in spans.windows(2) {
            assert!(pair[0].1 <= pair[1].0, "lane {tid}: {pair:?}");
        }
    }
}

#[test]
fn a_semantic_runs_trace_has_every_task_once_at_its_launch_times() {
    let w = pipeline();
    let (run, rec) = semantic(&w, 2, &RunOptions::default());
    let trace = reparse(&chrome_trace(&rec, &TraceOptions::default()));
    let complete = tasks(&trace);
    assert_eq!(complete.len() as u64, run.stats.tasks);
    // The same task set as the run: each task number once.
    let numbers: BTreeSet<u64> = complete
        .iter()
        .map(|e| e["args"]["task"].as_u64().unwrap())
        .collect();
    assert_eq!(numbers, (0..run.stats.tasks).collect());
    // At the semantic executor's own launch times, on its cores, named by
    // the kernel (as multisets: the executor lists launches in issue order).
    let mut want: Vec<(u64, String, u64, u64)> = run
        .launches
        .iter()
        .map(|l| {
            let name = wsp_ffi::lookup(l.kernel_id).unwrap().name.to_string();
            (l.core as u64, name, l.start, l.end)
        })
        .collect();
    let mut got: Vec<(u64, String, u64, u64)> = complete
        .iter()
        .map(|e| {
            let (ts, dur) = (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap());
            let start = (ts * 1000.0).round() as u64;
            let end = ((ts + dur) * 1000.0).round() as u64;
            // Named by the kernel, and the loop indices in brackets.
            let name = e["args"]["kernel"].as_str().unwrap().to_string();
            let loops = e["args"]["loops"].as_array().unwrap();
            let indices: Vec<String> = loops.iter().map(|l| l.to_string()).collect();
            let full = match indices.len() {
                0 => name.clone(),
                _ => format!("{name}[{}]", indices.join(",")),
            };
            assert_eq!(e["name"].as_str(), Some(full.as_str()));
            (e["tid"].as_u64().unwrap(), name, start, end)
        })
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    // Named lanes: every core and every scheduler thread.
    let names: BTreeMap<u64, String> = events(&trace)
        .iter()
        .filter(|e| e["name"] == "thread_name")
        .map(|e| (e["tid"].as_u64().unwrap(), e["args"]["name"].to_string()))
        .collect();
    for core in 0..KINDS.len() {
        assert!(names[&(core as u64)].contains(&format!("core {core}")));
    }
    for t in 0..2 {
        let lane = thread_lane(t) as u64;
        assert!(names[&lane].contains(&format!("scheduler thread {t}")));
    }
    check_lanes(&trace);
    // Counters: tasks on cores never negative, back to 0 at the end, at
    // least two at once on this pipeline; the ready queue is sampled.
    let counter = |name: &str| -> Vec<i64> {
        events(&trace)
            .iter()
            .filter(|e| e["ph"] == "C" && e["name"] == name)
            .map(|e| e["args"]["tasks"].as_i64().unwrap())
            .collect()
    };
    let on_cores = counter("tasks on cores");
    assert_eq!(on_cores.len() as u64, 2 * run.stats.tasks);
    assert!(on_cores.iter().all(|&c| c >= 0));
    assert_eq!(on_cores.last(), Some(&0));
    assert!(on_cores.iter().max().unwrap() >= &2);
    let ready = counter("ready queue");
    assert!(ready.iter().any(|&r| r > 0), "{ready:?}");
    assert_eq!(counter("window").last(), Some(&0));
}

#[test]
fn a_programs_tasks_are_named_by_their_loop_indices() {
    // Rows 0..4 (a symbol) by columns 0..3: task [i,j] adds tile (i, j+1)
    // of a 64-wide f32 matrix into y.
    let mut ex = examples::dense_dyn();
    let table = ex.w.finish().unwrap();
    let mut arena = ex.arena(None);
    let options = RunOptions {
        symbols: Symbols::new(&[4]).unwrap(),
        ..RunOptions::default()
    };
    let sink = Sink::new(true);
    let run = run_semantic_observed(&table, &mut arena.bytes, &KINDS, &sched(2), &options, &sink)
        .unwrap();
    assert_eq!(run.stats.tasks, 12);
    let owners: Vec<usize> = (0..4)
        .map(|c| device_runtime::sched::core_owner(c, 2))
        .collect();
    let rec = sink.recording(&KINDS, &owners, run.stats.ticks_per_second, true);
    let trace = reparse(&chrome_trace(&rec, &TraceOptions::default()));
    let complete = tasks(&trace);
    let mut seen = BTreeSet::new();
    let first = rec.tasks.iter().find(|t| t.loops == [0, 0]).unwrap();
    for e in &complete {
        let loops: Vec<u32> = e["args"]["loops"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let [i, j] = loops[..] else {
            panic!("{e}: two loops around each call")
        };
        assert_eq!(e["name"], format!("add[{i},{j}]"), "{e}");
        assert!(seen.insert((i, j)), "{i},{j} twice");
        // The task with those indices wrote the tile they select.
        let task = &rec.tasks[e["args"]["task"].as_u64().unwrap() as usize];
        let y = |t: &host_tools::record::TaskSpan| t.args.tensors[2].addr;
        let step = (T * 4) as u64;
        assert_eq!(y(task) - y(first), (i as u64 * 64 + j as u64) * step);
    }
    let all: BTreeSet<(u32, u32)> = (0..4).flat_map(|i| (0..3).map(move |j| (i, j))).collect();
    assert_eq!(seen, all);
}

#[test]
fn flows_go_from_a_task_to_those_it_released_forward_in_time() {
    let w = pipeline();
    let (run, rec) = semantic(&w, 1, &RunOptions::default());
    assert!(!rec.releases.is_empty());
    let trace = reparse(&chrome_trace(&rec, &TraceOptions { flows: true }));
    let starts: Vec<&Value> = events(&trace).iter().filter(|e| e["ph"] == "s").collect();
    let ends: Vec<&Value> = events(&trace).iter().filter(|e| e["ph"] == "f").collect();
    assert_eq!(starts.len(), rec.releases.len());
    assert_eq!(ends.len(), rec.releases.len());
    // A task is released once at most, by another task that ended no
    // later than it started.
    let mut released = BTreeSet::new();
    for &(by, task) in &rec.releases {
        assert!(released.insert(task), "task {task} released twice");
        assert_ne!(by, task);
        let (from, to) = (&rec.tasks[by as usize], &rec.tasks[task as usize]);
        assert!(from.end <= to.start, "{from:?} released {to:?}");
    }
    for (s, f) in starts.iter().zip(&ends) {
        assert_eq!(s["id"], f["id"]);
        assert!(s["ts"].as_f64() <= f["ts"].as_f64(), "{s} {f}");
    }
    assert!(released.len() as u64 <= run.stats.tasks);
    // Without the option, no arrows.
    let plain = chrome_trace(&rec, &TraceOptions::default());
    assert!(!events(&plain).iter().any(|e| e["ph"] == "s"));
}

#[test]
fn a_stalled_dispatcher_shows_its_stalls_on_its_lane() {
    let w = pipeline();
    let options = RunOptions {
        window: Some(2),
        ..RunOptions::default()
    };
    let (run, rec) = semantic(&w, 2, &options);
    let ring = run.stats.stalls.of(StallReason::TaskRingFull);
    assert!(ring.stalls > 0, "a window of 2 stalls the pipeline");
    let trace = reparse(&chrome_trace(&rec, &TraceOptions::default()));
    let stalls: Vec<&Value> = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "X" && e["cat"] == "stall")
        .collect();
    assert!(!stalls.is_empty());
    assert!(stalls.len() as u64 <= ring.stalls);
    for s in &stalls {
        assert_eq!(s["tid"].as_u64(), Some(thread_lane(0) as u64));
        assert_eq!(s["args"]["reason"], "TASK_RING_FULL");
        assert_eq!(s["name"], "stall: TASK_RING_FULL");
    }
    // As long as the run's own count of cycles stalled, at least (the
    // trace also shows a stall the run never ended: the window full when
    // nothing was left to submit), and within the run.
    let stalled: f64 = stalls.iter().map(|s| s["dur"].as_f64().unwrap()).sum();
    let stalled = (stalled * 1000.0).round() as u64;
    assert!(
        stalled >= ring.stall_ticks,
        "{stalled} < {}",
        ring.stall_ticks
    );
    assert!(stalled <= run.makespan, "{stalled} > {}", run.makespan);
    check_lanes(&trace);
    // The default window does not stall this pipeline: no stall events.
    let (_, rec) = semantic(&w, 2, &RunOptions::default());
    let trace = chrome_trace(&rec, &TraceOptions::default());
    assert!(!events(&trace).iter().any(|e| e["cat"] == "stall"));
}

#[test]
fn a_threaded_shim_runs_trace_has_every_task_once_in_wall_time() {
    let w = pipeline();
    let shim = Shim {
        sched: sched(2),
        ..Shim::default()
    };
    let mut arena = w.arena.clone();
    let sink = Sink::new(true);
    let stats = shim
        .run_observed(&w.table, &mut arena.bytes, &sink)
        .unwrap();
    assert!(w.verify(&arena).passed());
    assert_eq!(
        sink.finished.load(std::sync::atomic::Ordering::Relaxed),
        stats.tasks
    );
    let owners: Vec<usize> = (0..4)
        .map(|c| device_runtime::sched::core_owner(c, 2))
        .collect();
    let rec = sink.recording(&shim.core_kinds(), &owners, stats.ticks_per_second, false);
    let trace = reparse(&chrome_trace(&rec, &TraceOptions::default()));
    let complete = tasks(&trace);
    let numbers: BTreeSet<u64> = complete
        .iter()
        .map(|e| e["args"]["task"].as_u64().unwrap())
        .collect();
    assert_eq!(complete.len() as u64, stats.tasks);
    assert_eq!(numbers, (0..stats.tasks).collect());
    // Each task on a core of its thread, at a time of the run.
    for e in &complete {
        let core = e["tid"].as_u64().unwrap() as usize;
        assert_eq!(e["args"]["thread"].as_u64(), Some(owners[core] as u64));
        assert!(e["ts"].as_f64().unwrap() >= 0.0);
    }
    let last = complete
        .iter()
        .map(|e| e["ts"].as_f64().unwrap() + e["dur"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert!(last > 0.0);
    let process = &events(&trace)[0]["args"]["name"];
    assert!(process.as_str().unwrap().contains("wall time"), "{process}");
    check_lanes(&trace);
}

#[test]
fn the_picture_has_its_size_and_colour_in_each_busy_lane_only() {
    let w = pipeline();
    let (_, rec) = semantic(&w, 2, &RunOptions::default());
    let trace = reparse(&chrome_trace(&rec, &TraceOptions::default()));
    let lanes = Swimlanes::from_trace(&trace).unwrap();
    assert_eq!(lanes.lanes.len(), 2 + KINDS.len());
    let path = tmp("picture").join("run.png");
    lanes.draw(&path).unwrap();
    let image = image::open(&path).unwrap().to_rgb8();
    let g = lanes.geometry();
    assert_eq!(image.dimensions(), (g.width, g.height));
    for (i, lane) in lanes.lanes.iter().enumerate() {
        let (y0, y1) = g.lane(i);
        let background = *image.get_pixel(g.left, y0);
        let mut coloured = 0;
        for y in y0..=y1 {
            for x in g.left..=g.right {
                let p = image.get_pixel(x, y);
                // Grey bands and white are background; a task is colour.
                let grey = p[0] == p[1] && p[1] == p[2];
                if !grey {
                    coloured += 1;
                }
            }
        }
        let busy = !lane.spans.is_empty();
        assert_eq!(coloured > 0, busy, "lane {} ({:?})", lane.name, background);
    }
    // The cores are busy on this pipeline, the scheduler lanes show no stall.
    assert!(lanes
        .lanes
        .iter()
        .filter(|l| l.core)
        .all(|l| !l.spans.is_empty()));
    assert!(lanes
        .lanes
        .iter()
        .filter(|l| !l.core)
        .all(|l| l.spans.is_empty()));
}

#[test]
fn a_trace_that_is_not_one_is_refused_with_a_reason() {
    let e = Swimlanes::from_trace(&serde_json::json!({ "events": [] })).unwrap_err();
    assert!(e.to_string().contains("no `traceEvents` array"), "{e}");
    let unnamed = serde_json::json!({ "traceEvents": [
        { "ph": "X", "tid": 3, "ts": 0.0, "dur": 1.0, "name": "k" },
    ]});
    let e = Swimlanes::from_trace(&unnamed).unwrap_err();
    assert!(e.to_string().contains("lane 3, which has no name"), "{e}");

    // Past 1,024 lanes or 256 kernel names a picture is refused (with
    // about 56,000 lanes its pixels overflowed the drawing library: a
    // panic); at the limits it is drawn.
    let trace = |lanes: usize, kernels: usize| {
        let named = (0..lanes).map(|t| {
            serde_json::json!({ "ph": "M", "name": "thread_name", "tid": t, "args": { "name": format!("AICore {t}") } })
        });
        let tasks = (0..kernels).map(|k| {
            serde_json::json!({ "ph": "X", "tid": 0, "ts": k as f64, "dur": 1.0, "name": format!("k{k}") })
        });
        serde_json::json!({ "traceEvents": named.chain(tasks).collect::<Vec<_>>() })
    };
    let e = Swimlanes::from_trace(&trace(1025, 1)).unwrap_err();
    assert!(
        e.to_string()
            .contains("1025 named lanes; a plot draws at most 1024"),
        "{e}"
    );
    let e = Swimlanes::from_trace(&trace(1, 257)).unwrap_err();
    assert!(e.to_string().contains("more than 256 kernel names"), "{e}");
    let out = tmp("plot_limits").join("limits.png");
    let at_limits = Swimlanes::from_trace(&trace(1024, 256)).unwrap();
    at_limits.draw(&out).unwrap();
}

fn tmp(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn wsp(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wsp"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn wsp_run_writes_the_trace_and_the_picture_and_wsp_plot_redraws_it() {
    let dir = tmp("trace");
    let (json, png, again) = (
        dir.join("run.json"),
        dir.join("run.png"),
        dir.join("again.png"),
    );
    for f in [&json, &png, &again] {
        let _ = std::fs::remove_file(f);
    }
    let (json, png, again) = (
        json.to_str().unwrap(),
        png.to_str().unwrap(),
        again.to_str().unwrap(),
    );
    // A threaded run (no --semantic), with arrows.
    let out = wsp(&["run", "mlp", "--trace", json, "--flows", "--plot", png]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    assert_eq!(tasks(&trace).len(), 48, "mlp runs 48 tasks");
    assert!(events(&trace).iter().any(|e| e["ph"] == "s"));
    check_lanes(&trace);
    let first = image::open(png).unwrap();
    let out = wsp(&["plot", json, "--out", again]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = image::open(again).unwrap();
    assert_eq!(
        first.to_rgb8(),
        second.to_rgb8(),
        "the same trace, the same picture"
    );
    // Not a trace: a reason, no picture.
    let out = wsp(&["plot", png, "--out", again]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not JSON"), "{stderr}");
    // Arrows need a trace.
    let out = wsp(&["run", "mlp", "--flows"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--trace"), "{stderr}");
}

/// An output the run could not write is refused before the run (no
/// `ran` line), naming the flag and why; nothing is created.
#[test]
fn output_paths_that_cannot_be_written_are_refused_before_the_run() {
    let dir = tmp("bad_outputs");
    let missing = dir.join("no-such-dir").join("t.json");
    let txt = dir.join("picture.txt");
    let _ = std::fs::remove_file(&txt);
    let d = dir.to_str().unwrap();
    for (args, says) in [
        (vec!["--trace", missing.to_str().unwrap()], "does not exist"),
        (vec!["--trace", d], "is a directory"),
        (vec!["--plot", txt.to_str().unwrap()], "ending in .png"),
    ] {
        let mut all = vec!["run", "mlp", "--semantic"];
        all.extend(&args);
        let out = wsp(&all);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(args[0]) && stderr.contains(says),
            "{args:?}: {stderr}"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("\nran "), "{args:?}: ran first: {stdout}");
    }
    assert!(!missing.parent().unwrap().exists() && !txt.exists());
    let out = wsp(&["plot", "unread.json", "--out", d]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("is a directory"),
        "{stderr}"
    );
}

#[test]
fn wsp_run_prints_its_figures_as_tables() {
    let out = wsp(&["run", "mlp", "--cube", "3", "--vector", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The rows of the table whose header starts with `first`, as cells.
    let rows = |first: &str| -> Vec<Vec<String>> {
        let lines: Vec<&str> = stdout.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.starts_with(&format!("| {first} ")))
            .unwrap_or_else(|| panic!("no {first} table in {stdout}"));
        let cells = |l: &str| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        };
        let header: Vec<String> = cells(lines[at]);
        // Up to the next table's header (a line over a `|---` line).
        let mut all = vec![header];
        let mut i = at + 2;
        while i < lines.len()
            && lines[i].starts_with('|')
            && !lines.get(i + 1).is_some_and(|n| n.starts_with("|-"))
        {
            all.push(cells(lines[i]));
            i += 1;
        }
        all
    };
    let cores = rows("core");
    assert_eq!(cores.len(), 1 + 5, "a row per core");
    let tasks = cores[0].iter().position(|h| h == "tasks").unwrap();
    let sum: u64 = cores[1..]
        .iter()
        .map(|r| r[tasks].parse::<u64>().unwrap())
        .sum();
    assert_eq!(sum, 48);
    assert_eq!(rows("thread").len(), 1 + 2, "a row per scheduler thread");
    let reasons: Vec<String> = rows("stall reason")[1..]
        .iter()
        .map(|r| r[0].clone())
        .collect();
    assert!(
        reasons.contains(&"READY_QUEUE_FULL".to_string()),
        "{reasons:?}"
    );
    assert!(
        !reasons.contains(&"CHANNEL_FULL".to_string()),
        "no channels: {reasons:?}"
    );
}

#[test]
fn wsp_run_json_prints_the_figures_as_one_json_object() {
    let out = wsp(&["run", "mlp", "--json", "--cube", "3", "--vector", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Standard output is the JSON alone: no text lines around it.
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["workload"], "mlp");
    assert_eq!(v["passed"], true);
    assert_eq!(v["run"]["tasks"], 48);
    assert_eq!(v["run"]["cores"].as_array().unwrap().len(), 5);
    let per_core: u64 = v["run"]["cores"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tasks"].as_u64().unwrap())
        .sum();
    assert_eq!(per_core, 48);
    for reason in StallReason::ALL {
        assert!(
            v["run"]["stalls"][reason.name()].is_object(),
            "{}",
            reason.name()
        );
    }
    assert_eq!(v["checks"][0]["passed"], true);
    assert_eq!(v["run"]["clock"], "ticks");
    assert!(v["run"]["wall_micros"].as_u64().unwrap() > 0);
    // In semantic time the clock counts cycles: no rate, no wall time.
    let out = wsp(&["run", "mlp", "--json", "--semantic"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["run"]["clock"], "cycles");
    assert!(v["run"]["ticks"].as_u64().unwrap() > 0);
    assert!(v["run"]["wall_micros"].is_null(), "{}", v["run"]);
    assert!(v["run"]["ticks_per_second"].is_null(), "{}", v["run"]);
}
