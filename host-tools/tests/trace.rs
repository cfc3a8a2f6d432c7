//! The Chrome trace of a semantic-time run: valid JSON of the trace-event
//! format with one complete event per task at its launch's times, named
//! lanes per core whose events do not overlap (Perfetto requires events in
//! a lane to nest), and a tasks-in-flight counter that starts and ends at
//! 0; and `wsp run --trace` writes it (and refuses a threaded run); `wsp
//! run --json` prints the run's figures as JSON alone.

use std::process::Command;

use device_runtime::sched::RunOptions;
use host_tools::semantic::run_semantic;
use host_tools::trace::chrome_trace;
use host_tools::workloads::{Params, Workload};
use serde_json::Value;
use wsp_ffi::CoreKind;

const KINDS: [CoreKind; 4] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
];

#[test]
fn a_semantic_runs_trace_has_every_task_on_its_core_lane() {
    let p = Params {
        m: 128,
        n: 32,
        k: 32,
        tile: 32,
        seed: 2,
    };
    let w = Workload::build("pipeline", p).unwrap();
    let mut arena = w.arena.clone();
    let run = run_semantic(&w.table, &mut arena.bytes, &KINDS, &RunOptions::default()).unwrap();
    // Through text and back: what a file holds.
    let text = chrome_trace(&run, &KINDS, 1).to_string();
    let trace: Value = serde_json::from_str(&text).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let complete: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(complete.len(), run.launches.len());
    assert_eq!(complete.len() as u64, run.stats.tasks);
    // Each event at its launch's times (cycles as microseconds at 1 GHz)
    // and on its launch's core, named by the kernel.
    for (e, l) in complete.iter().zip(&run.launches) {
        assert_eq!(e["tid"].as_u64(), Some(l.core as u64));
        assert_eq!(e["ts"].as_f64(), Some(l.start as f64 / 1000.0));
        assert_eq!(e["dur"].as_f64(), Some((l.end - l.start) as f64 / 1000.0));
        let name = wsp_ffi::lookup(l.kernel_id).unwrap().name;
        assert_eq!(e["name"].as_str(), Some(name));
    }
    // A named lane per core, and no two events of a lane overlap.
    for core in 0..KINDS.len() {
        let named = events
            .iter()
            .any(|e| e["name"] == "thread_name" && e["tid"].as_u64() == Some(core as u64));
        assert!(named, "core {core} has no lane name");
        let mut spans: Vec<(f64, f64)> = complete
            .iter()
            .filter(|e| e["tid"].as_u64() == Some(core as u64))
            .map(|e| (e["ts"].as_f64().unwrap(), e["dur"].as_f64().unwrap()))
            .collect();
        spans.sort_by(|a, b| a.0.total_cmp(&b.0));
        for pair in spans.windows(2) {
            assert!(pair[0].0 + pair[0].1 <= pair[1].0, "core {core}: {pair:?}");
        }
    }
    // The counter: never negative, back to 0 at the end, and at least the
    // cores' worth of tasks at its peak on this pipeline.
    let counts: Vec<i64> = events
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| e["args"]["tasks"].as_i64().unwrap())
        .collect();
    assert_eq!(counts.len(), 2 * run.launches.len());
    assert!(counts.iter().all(|&c| c >= 0));
    assert_eq!(counts.last(), Some(&0));
    assert!(counts.iter().max().unwrap() >= &2);
}

#[test]
fn wsp_run_writes_the_trace_and_refuses_it_without_semantic_time() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trace");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("run.json");
    let _ = std::fs::remove_file(&path);
    let wsp = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_wsp"))
            .args(args)
            .output()
            .unwrap()
    };
    let file = path.to_str().unwrap();
    let out = wsp(&["run", "mlp", "--semantic", "--trace", file]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let trace: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let tasks = trace["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .count();
    assert_eq!(tasks, 48, "mlp runs 48 tasks");
    let out = wsp(&["run", "mlp", "--trace", file]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--trace records semantic-time runs only"),
        "{stderr}"
    );
}

#[test]
fn wsp_run_json_prints_the_figures_as_one_json_object() {
    let out = Command::new(env!("CARGO_BIN_EXE_wsp"))
        .args(["run", "mlp", "--json", "--cube", "3", "--vector", "2"])
        .output()
        .unwrap();
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
    for reason in device_runtime::orch::StallReason::ALL {
        assert!(
            v["run"]["stalls"][reason.name()].is_object(),
            "{}",
            reason.name()
        );
    }
    assert_eq!(v["checks"][0]["passed"], true);
}
