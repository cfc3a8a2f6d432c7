//! Stitching: a decode step and a prefill chunk in one run. Both batches
//! pass against the f64 reference; in semantic time the stitched run ends
//! before the two runs one after the other and near the lower bound
//! (`host_tools::bound`: work per core kind, and the longest dependent
//! chain found from the launches' bytes).
//!
//! The default sizes' figures: `cargo test -p host-tools --release --test
//! stitched -- --nocapture` (a release build runs them; CI's release-size
//! step too).

use device_runtime::sched::RunOptions;
use host_tools::bound::{lower_bound, Bound};
use host_tools::model::layer::{decode_layer_workload, stitched_workload};
use host_tools::model::stitch::batches;
use host_tools::semantic::run_semantic;
use host_tools::workloads::{Params, Workload};
use wsp_ffi::CoreKind;

/// `cube` cube cores, then twice as many vector cores (an Ascend 910B has
/// 24 and 48).
fn kinds(cube: usize) -> Vec<CoreKind> {
    let mut k = vec![CoreKind::Cube; cube];
    k.extend(vec![CoreKind::Vector; 2 * cube]);
    k
}

/// The makespan and lower bound of `w` in semantic time; its check must pass.
fn measure(w: &Workload, kinds: &[CoreKind]) -> (u64, Bound) {
    let mut arena = w.arena.clone();
    let run = run_semantic(&w.table, &mut arena.bytes, kinds, &RunOptions::default()).unwrap();
    assert_eq!(run.stats.tasks as usize, w.tasks, "{}", w.name);
    let check = w.verify(&arena);
    assert!(check.passed(), "{}: {check}", w.name);
    (run.makespan, lower_bound(&run.launches, kinds))
}

/// Each batch alone, then both stitched: (makespan, bound) of each.
fn figures(p: Params, kinds: &[CoreKind]) -> [(u64, Bound); 3] {
    let [a, b] = batches(&p).unwrap();
    let wa = decode_layer_workload("decode", &a).unwrap();
    let wb = decode_layer_workload("prefill", &b).unwrap();
    let ws = stitched_workload("stitched", &[a, b], String::new()).unwrap();
    [
        measure(&wa, kinds),
        measure(&wb, kinds),
        measure(&ws, kinds),
    ]
}

fn report([a, b, s]: &[(u64, Bound); 3], cube: u64) {
    for (name, (m, bound)) in [("decode", a), ("prefill chunk", b), ("stitched", s)] {
        eprintln!(
            "{name:>14}: makespan {m:>11} cycles, bound {:>11} (cube work / {cube} {}, vector \
             work / {} {}, critical path {}), makespan/bound {:.3}",
            bound.bound,
            bound.cube_work.div_ceil(cube),
            2 * cube,
            bound.vector_work.div_ceil(2 * cube),
            bound.critical_path,
            *m as f64 / bound.bound as f64
        );
    }
    eprintln!(
        "stitched / (decode + prefill) = {:.3}",
        s.0 as f64 / (a.0 + b.0) as f64
    );
}

#[test]
fn stitched_ends_before_the_two_runs_in_turn_and_near_its_bound() {
    // 4 cube cores: the decode step alone is bound by its longest chain
    // (its attention), the chunk by its GEMM work.
    let f = figures(
        Params {
            m: 6,
            n: 64,
            k: 128,
            tile: 16,
            seed: 2,
        },
        &kinds(4),
    );
    report(&f, 4);
    let [(a, ba), (b, bb), (s, bs)] = f;
    assert!(s < a + b, "stitched {s} vs {a} + {b}");
    // Nothing the bound counts is lost or made up by stitching: the work
    // adds up and the longest chain is one batch's.
    assert_eq!(bs.cube_work, ba.cube_work + bb.cube_work);
    assert_eq!(bs.vector_work, ba.vector_work + bb.vector_work);
    assert_eq!(bs.critical_path, ba.critical_path.max(bb.critical_path));
    // The bound is max(work / cores, longest chain); it ignores that each
    // layer has phases narrower than the cores (a norm over the whole
    // batch, the output projection's few column chains), so no schedule
    // reaches it here: 1.13 stitched, 1.26 and 1.18 for the batches alone.
    assert!(
        s as f64 <= 1.2 * bs.bound as f64,
        "stitched {s} vs bound {}",
        bs.bound
    );
}

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "default sizes (24 requests, 128-token chunk): run with --release"
)]
fn stitched_default_sizes() {
    let f = figures(Params::of("stitched").unwrap(), &kinds(24));
    report(&f, 24);
    let [(a, _), (b, _), (s, bs)] = f;
    assert!(s < a + b);
    assert!(s as f64 <= 1.2 * bs.bound as f64);
}

#[test]
fn a_bad_size_is_named_alone() {
    // `stitched` reads n as the prefill chunk and gives its decode step
    // lengths up to 2048 of its own: an error about m or k names that
    // size, not an n the user never gave.
    let p = Params::of("stitched").unwrap();
    for (bad, why) in [
        (Params { m: 0, ..p }, "m (requests) = 0 must be at least 1"),
        (Params { k: 7, ..p }, "k (hidden) = 7 must be at least 64"),
    ] {
        let e = Workload::build("stitched", bad).err().unwrap().to_string();
        assert!(e.contains(why) && !e.contains("2048"), "{e}");
    }
}
