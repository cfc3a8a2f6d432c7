//! Runs on recycled run state: runs take the dispatch queues and the
//! orchestrator that earlier runs left, reset ([`host_tools::heap::run_state`]),
//! and a run on them must be the run on new ones, event for event.
//!
//! The oracle is the same run on new state (the kept pairs freed before
//! it): semantic time is deterministic, so the two agree on every launch
//! (core, kernel, issue, start and end cycle), the makespan, the
//! statistics and the outputs, or recycling changed something. Runs that
//! failed part way (an injected fault, which leaves tasks in flight and
//! queued) are in the sequence too: the run after one takes its state. One test in this file: the kept pairs are the
//! process's.

use device_runtime::fault::{Fault, FaultKind, Trigger};
use device_runtime::sched::{RunOptions, SchedConfig};
use host_tools::heap::{free_spares, spares};
use host_tools::semantic::{run_semantic_with, run_semantic_with_fault};
use host_tools::workloads::{Params, Workload};
use wsp_ffi::CoreKind::{self, Cube, Vector};

/// Small workloads of every kind of run: tiles, scratch tensors on the
/// heap ring, streams, data-dependent routing, CSP channels, a planned
/// decode.
const NAMES: [&str; 7] = [
    "mlp",
    "mlp-scratch",
    "streams",
    "moe-var",
    "pipeline",
    "wsp9-csp-pipeline",
    "decode-uniform",
];

const KINDS: [CoreKind; 4] = [Cube, Cube, Vector, Vector];

fn sched() -> SchedConfig {
    SchedConfig {
        threads: 2,
        ..SchedConfig::default()
    }
}

/// Everything a run shows: its launches (their tensors' addresses as
/// offsets into the arena, whose address differs by run), makespan and
/// statistics as text, and the arena.
fn run(w: &Workload) -> (String, Vec<u8>) {
    let mut arena = w.arena.clone();
    let options = RunOptions::default();
    let r = run_semantic_with(&w.table, &mut arena.bytes, &KINDS, &sched(), &options)
        .unwrap_or_else(|e| panic!("{}: {e}", w.name));
    assert!(w.verify(&arena).passed(), "{}", w.name);
    let base = arena.bytes.as_ptr() as u64;
    let launches: Vec<String> = r
        .launches
        .iter()
        .map(|l| {
            let mut args = l.args;
            for t in &mut args.tensors[..args.num_tensors as usize] {
                t.addr = t.addr.wrapping_sub(base);
            }
            format!(
                "{} {} {} {} {} {args:?}",
                l.core, l.kernel_id, l.issued, l.start, l.end
            )
        })
        .collect();
    let shown = format!("{launches:?}\n{}\n{:?}", r.makespan, r.stats);
    (shown, arena.bytes)
}

/// A run of `w` that a core ends part way: it never finishes its second task.
fn failed_run(w: &Workload) {
    let fault = Fault {
        kind: FaultKind::NoFin,
        core: 3,
        trigger: Trigger::Nth(2),
    };
    let mut arena = w.arena.clone();
    let options = RunOptions::default();
    let got = run_semantic_with_fault(
        &w.table,
        &mut arena.bytes,
        &KINDS,
        &sched(),
        &options,
        fault,
    );
    assert!(got.is_err(), "{}: the fault ends the run", w.name);
}

fn workload(name: &str) -> Workload {
    let params = match name {
        // 8 requests of 256 tokens, D 64, pages of 64: quick in debug builds.
        "decode-uniform" => Params {
            m: 8,
            n: 256,
            k: 64,
            tile: 64,
            seed: 1,
        },
        _ => Params::of(name).unwrap(),
    };
    Workload::build(name, params).unwrap()
}

#[test]
fn a_run_on_recycled_state_is_the_run_on_new_state() {
    let ws: Vec<Workload> = NAMES.map(workload).into();
    // Each workload's run on new state.
    let expected: Vec<_> = ws
        .iter()
        .map(|w| {
            free_spares();
            run(w)
        })
        .collect();
    assert_eq!(spares(), 1, "a finished run gives its pair back");
    // Each run takes the pair of the one before, in two orders, with
    // failed runs between (whose pairs are reset and kept too).
    for round in 0..2 {
        for i in 0..ws.len() {
            let i = if round == 0 { i } else { ws.len() - 1 - i };
            if i % 3 == round {
                free_spares();
                failed_run(&ws[(i + 1) % ws.len()]);
                assert_eq!(spares(), 1, "a failed run's pair is reset and kept");
                // The next run takes what the failed run left, reset.
                let got = run(&ws[i]);
                assert!(
                    got == expected[i],
                    "{} after a failed run (round {round})",
                    ws[i].name
                );
            }
            assert_eq!(spares(), 1);
            let got = run(&ws[i]);
            assert!(got == expected[i], "{} (round {round})", ws[i].name);
        }
    }
}
