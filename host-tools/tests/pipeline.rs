//! The `pipeline` workload (loader -> compute -> storer processes over
//! token channels, written in the workload language) at every channel
//! depth: on the threaded shim and in semantic time, checked against its
//! f64 reference (each tile's matrix square), bit-identical between the
//! two, with the task count the host predicts.

use device_runtime::abi::Table;
use device_runtime::sched::RunOptions;
use host_tools::pipeline::{pipeline, slots};
use host_tools::semantic::run_semantic;
use host_tools::shim::Shim;
use host_tools::task_count::{count_tasks, TaskCount};
use host_tools::workloads::{Params, Workload};
use wsp_ffi::CoreKind;

/// 8 tiles of 32 x 32.
const P: Params = Params {
    m: 256,
    n: 32,
    k: 32,
    tile: 32,
    seed: 3,
};

fn build(depth: u32) -> Workload {
    pipeline(P, depth).unwrap().0
}

#[test]
fn the_pipeline_matches_its_reference_on_the_shim_and_in_semantic_time() {
    let kinds = [
        CoreKind::Cube,
        CoreKind::Cube,
        CoreKind::Vector,
        CoreKind::Vector,
    ];
    for depth in [0, 1, 2, 4] {
        let w = build(depth);
        // 8 loads, 8 squares and 8 stores.
        let table = Table::parse(&w.table).unwrap();
        assert_eq!(
            count_tasks(&table, None, &[]).unwrap(),
            TaskCount::Exact(24)
        );
        let mut semantic = w.arena.clone();
        let run = run_semantic(
            &w.table,
            &mut semantic.bytes,
            &kinds,
            &RunOptions::default(),
        )
        .unwrap_or_else(|e| panic!("depth {depth}: {e}"));
        assert_eq!(run.stats.tasks, 24, "depth {depth}");
        let v = w.verify(&semantic);
        assert!(v.passed(), "depth {depth}, semantic time: {v}");
        let mut threads = w.arena.clone();
        let shim = Shim {
            cube_cores: 2,
            vector_cores: 2,
            ..Shim::default()
        };
        let stats = shim
            .run(&w.table, &mut threads.bytes)
            .unwrap_or_else(|e| panic!("depth {depth}: {e}"));
        assert_eq!(stats.tasks, 24, "depth {depth}");
        let v = w.verify(&threads);
        assert!(v.passed(), "depth {depth}, shim: {v}");
        assert!(
            semantic.bytes == threads.bytes,
            "depth {depth}: the shim and semantic time differ"
        );
    }
}

#[test]
fn a_wrong_result_fails_the_check() {
    // The oracle is not vacuous: an output tile left at zero fails it.
    let w = build(2);
    let mut arena = w.arena.clone();
    let shim = Shim::default();
    shim.run(&w.table, &mut arena.bytes).unwrap();
    assert!(w.verify(&arena).passed());
    let out = &w.tensors[4];
    assert_eq!(out.name, "out");
    let at = out.arena_offset as usize + 4 * 32 * 32 * 5;
    arena.bytes[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
    assert!(!w.verify(&arena).passed());
}

#[test]
fn the_staging_slots_cover_the_depth() {
    assert_eq!([0, 1, 2, 4, 16].map(slots), [2, 2, 2, 4, 16]);
    let e = pipeline(P, 17).err().unwrap();
    assert!(e.to_string().contains("depth 17"), "{e}");
    let e = pipeline(Params { n: 64, ..P }, 2).err().unwrap();
    assert!(e.to_string().contains("must equal the tile"), "{e}");
}
