//! CSP pipelines beyond the three-stage example: the attention-shaped
//! megakernel on the shim and in semantic time at every depth; the
//! three-stage pipeline's semantic makespan against its lower bound; and a
//! pipeline sharing the cores with an independent data-parallel task set
//! in one run.
//!
//! Print the depth table: `cargo test -p host-tools --test pipelines --
//! --nocapture makespan`.

use device_runtime::sched::RunOptions;
use host_tools::attention_pipeline::attention_pipeline;
use host_tools::pipeline::{pipeline, program, reference};
use host_tools::program::Axis;
use host_tools::semantic::{run_semantic, SemanticRun};
use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workloads::{gemm_bound, Params, Workload};
use wsp_ffi::{
    CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM,
};

/// Four cores: two cube, two vector.
const KINDS: [CoreKind; 4] = [
    CoreKind::Cube,
    CoreKind::Cube,
    CoreKind::Vector,
    CoreKind::Vector,
];

fn semantic(w: &Workload) -> (SemanticRun, Arena) {
    let mut arena = w.arena.clone();
    let run = run_semantic(&w.table, &mut arena.bytes, &KINDS, &RunOptions::default()).unwrap();
    (run, arena)
}

#[test]
fn the_attention_megakernel_matches_its_reference_at_every_depth() {
    let p = Params {
        m: 16,
        n: 6 * 64,
        k: 64,
        tile: 64,
        seed: 7,
    };
    for depth in [0, 1, 2, 4] {
        let (w, names) = attention_pipeline(p, depth).unwrap();
        assert_eq!(names.processes.len(), 5);
        let (run, semantic) = semantic(&w);
        assert_eq!(run.stats.tasks, 7 * 6, "depth {depth}");
        let v = w.verify(&semantic);
        assert!(v.passed(), "depth {depth}, semantic time: {v}");
        let mut threads = w.arena.clone();
        let stats = Shim::default().run(&w.table, &mut threads.bytes).unwrap();
        assert_eq!(stats.tasks, 7 * 6);
        let v = w.verify(&threads);
        assert!(v.passed(), "depth {depth}, shim: {v}");
        assert!(semantic.bytes == threads.bytes, "depth {depth}");
        // The stages overlap: tile j's softmax runs while a later tile's
        // scores do (or the pipeline would be no faster than one chain).
        let busy: u64 = run.launches.iter().map(|l| l.end - l.start).sum();
        assert!(run.makespan < busy, "depth {depth}: no overlap");
    }
    // The oracle is not vacuous: one wrong element fails it.
    let (w, _) = attention_pipeline(p, 2).unwrap();
    let (_, mut arena) = semantic(&w);
    let out = &w.tensors[8];
    assert_eq!(out.name, "out");
    let at = out.arena_offset as usize + 4 * 100;
    let bad = f32::from_le_bytes(arena.bytes[at..at + 4].try_into().unwrap()) + 1e-3;
    arena.bytes[at..at + 4].copy_from_slice(&bad.to_le_bytes());
    assert!(!w.verify(&arena).passed());
}

/// The cycles of every launch of `kernel` in a run (all equal here).
fn cycles_of(run: &SemanticRun, kernel: u32) -> u64 {
    let mut it = run.launches.iter().filter(|l| l.kernel_id == kernel);
    let first = it.next().expect("a launch of the kernel");
    let cycles = first.end - first.start;
    assert!(it.all(|l| l.end - l.start == cycles));
    cycles
}

/// The three-stage pipeline over 8 tiles of 64 x 64 on two cube and two
/// vector cores, against the lower bound of its dependency graph.
///
/// Per tile i (slot s = i % slots): load L_i (add, A cycles) writes
/// stage[s]; square G_i (gemm, G cycles) reads it into squared[i]; store
/// S_i (add) copies squared[i] to out. The graph's edges: L_i -> G_i ->
/// S_i, and with `slots` staging slots G_i -> L_{i+slots} (the load
/// overwrites the slot G_i read). The longest path runs through the
/// loads and squares of one slot, L_s G_s L_{s+slots} G_{s+slots} ... and
/// the last store: (8 / slots) (A + G) + A. The work bound per core
/// kind: cube 8 G / 2, vector 16 A / 2. The bound is the largest of the
/// three.
#[test]
fn the_pipelines_makespan_is_within_5_percent_of_its_lower_bound_at_depth_2() {
    let p = Params::of("pipeline").unwrap();
    let mut rows = Vec::new();
    for depth in [0, 1, 2, 4] {
        let (w, _) = pipeline(p, depth).unwrap();
        let (run, arena) = semantic(&w);
        assert!(w.verify(&arena).passed());
        let (a, g) = (cycles_of(&run, ADD), cycles_of(&run, GEMM));
        let slots = host_tools::pipeline::slots(depth) as u64;
        let chain = (8 / slots) * (a + g) + a;
        let bound = chain.max(8 * g / 2).max(16 * a / 2);
        rows.push((depth, run.makespan, bound));
        eprintln!(
            "depth {depth}: makespan {} cycles, lower bound {bound} ({:.3}x)",
            run.makespan,
            run.makespan as f64 / bound as f64
        );
        assert!(run.makespan >= bound, "depth {depth}: below the bound?");
    }
    let (_, makespan, bound) = rows[2];
    assert!(
        makespan as f64 <= 1.05 * bound as f64,
        "depth 2: {makespan} cycles against a bound of {bound}"
    );
}

/// An independent element-wise sum of two 256 x 256 matrices in 32-tiles
/// (64 add tasks on vector cores), a data-parallel task set of the
/// program's own context.
fn add_set(w: &mut host_tools::program::Workload) {
    const T: u32 = 32;
    let a = w.tensor("ga", &[256, 256]).unwrap();
    let b = w.tensor("gb", &[256, 256]).unwrap();
    let c = w.tensor("gc", &[256, 256]).unwrap();
    let n = 256 / T;
    w.parallel(Axis::Dense(n), |w, i| {
        w.parallel(Axis::Dense(n), |w, j| {
            w.call(
                ADD,
                &[
                    a.tile(i.clone() * T, j.clone() * T, T, T),
                    b.tile(i.clone() * T, j.clone() * T, T, T),
                    c.tile(i * T, j * T, T, T),
                ],
                &[],
            );
        });
    });
}

/// The pipeline and an independent element-wise sum (a data-parallel task
/// set of the program's own context) in one run: both results right, their tasks
/// interleaved on the cores, and the makespan no more than the two runs'
/// sum.
#[test]
fn a_pipeline_and_a_data_parallel_task_set_share_the_cores() {
    const T: u32 = 32;
    let mut rng = host_tools::rng::SplitMix64::new(5);
    let x = rng.fill((8 * T * T) as usize);
    let ga = rng.fill(256 * 256);
    let gb = rng.fill(256 * 256);
    // Runs a program in semantic time with the data written where the
    // tensors of those names are.
    let run = |mut w: host_tools::program::Workload| {
        let table = w.finish().unwrap();
        let layouts = w.layouts().to_vec();
        let mut arena = Arena::zeroed(w.arena_size());
        for (name, data) in [("x", &x), ("ga", &ga), ("gb", &gb)] {
            if let Some(l) = layouts
                .iter()
                .find(|l| l.name == name && l.elements() == data.len())
            {
                arena.write_f32(l, data);
            }
        }
        let run = run_semantic(&table, &mut arena.bytes, &KINDS, &RunOptions::default()).unwrap();
        let read = |name: &str| {
            let layout = layouts.iter().find(|l| l.name == name);
            layout.map_or(Vec::new(), |l| arena.read_f32(l))
        };
        (
            run.makespan,
            run.stats.tasks,
            read("out"),
            read("gc"),
            run,
            arena.bytes.as_ptr() as u64,
            layouts.clone(),
        )
    };
    let mut both = program(8, T, 2).unwrap();
    add_set(&mut both);
    let (together, tasks, out, gc, trace, base, layouts) = run(both);
    assert_eq!(tasks, 3 * 8 + 64);
    let sum: Vec<f64> = ga
        .iter()
        .zip(&gb)
        .map(|(&a, &b)| a as f64 + b as f64)
        .collect();
    // Both results against their f64 references.
    let (want, abs) = reference(&x, 8, T as usize).unwrap();
    let bound = gemm_bound(abs, T);
    for (i, (&o, &w)) in out.iter().zip(&want).enumerate() {
        assert!((o as f64 - w).abs() <= bound(i), "pipeline element {i}");
    }
    // An f32 sum rounds once: within half an ulp of the f64 sum.
    assert_eq!(gc.len(), sum.len());
    for (i, (&o, &w)) in gc.iter().zip(&sum).enumerate() {
        assert!(
            (o as f64 - w).abs() <= w.abs() * f32::EPSILON as f64 / 2.0,
            "sum element {i}"
        );
    }
    // Alone, each takes this long; together, less than the sum.
    let pipe_alone = run(program(8, T, 2).unwrap()).0;
    let mut gemm_only = host_tools::program::Workload::new();
    gemm_only.tensor("x", &[1, 1]).unwrap();
    gemm_only.tensor("out", &[1, 1]).unwrap();
    add_set(&mut gemm_only);
    let gemm_alone = run(gemm_only).0;
    eprintln!("pipeline alone {pipe_alone}, sum alone {gemm_alone}, together {together} cycles");
    // Sharing the cores costs nothing on top of running one after the
    // other. (It saves nothing here either: both load the two vector
    // cores, the sum's 64 tasks are ready first and dispatch is first in,
    // first out, so the pipeline's loads wait behind them. A policy that
    // favours the pipeline's critical path would overlap them.)
    assert!(
        together <= pipe_alone + gemm_alone,
        "together {together} > pipeline {pipe_alone} + sum {gemm_alone}"
    );
    // Interleaved: some tile of the task set starts before the
    // pipeline's last task ends.
    let gc_layout = layouts.iter().find(|l| l.name == "gc").unwrap();
    let gc_base = base + gc_layout.arena_offset;
    let in_gemm = |l: &&host_tools::semantic::Launch| {
        (gc_base..gc_base + 4 * 256 * 256).contains(&l.args.tensors[2].addr)
    };
    let pipe_end = trace
        .launches
        .iter()
        .filter(|l| !in_gemm(l))
        .map(|l| l.end)
        .max()
        .unwrap();
    assert!(trace
        .launches
        .iter()
        .filter(in_gemm)
        .any(|l| l.start < pipe_end));
}

#[test]
fn the_attention_pipeline_reference_refuses_short_inputs() {
    use host_tools::attention_pipeline::reference;
    // One query row of zeros, one KV tile: every score is 0, so each of
    // the 64 keys weighs 1/64; value row e is all e, so every output is
    // (0 + 1 + ... + 63) / 64 = 31.5.
    let v: Vec<f32> = (0..64 * 64).map(|i| (i / 64) as f32).collect();
    let out = reference(&[0.0; 64], &[0.0; 64 * 64], &v, 1, 1).unwrap();
    assert_eq!(out, vec![31.5; 64]);
    // Empty inputs for one row and one tile (once an index panic).
    let e = reference(&[], &[], &[], 1, 1).unwrap_err().to_string();
    assert!(
        e.contains("q has 0 elements") && e.contains("need 64"),
        "{e}"
    );
    let e = reference(&[0.0; 64], &[0.0; 64 * 64], &v[1..], 1, 1)
        .unwrap_err()
        .to_string();
    assert!(e.contains("v has 4095 elements"), "{e}");
    // Sizes whose products pass usize (once an overflow panic in a debug
    // build, a wrapped size in release): 2^58 rows of 64 elements.
    for (rows, tiles) in [(1usize << 58, 1), (1, 1usize << 58), (1 << 40, 1 << 20)] {
        let e = reference(&[], &[], &[], rows, tiles)
            .unwrap_err()
            .to_string();
        assert!(e.contains("the sizes overflow"), "{rows} x {tiles}: {e}");
    }
}

#[test]
fn the_pipeline_reference_refuses_a_zero_tile_and_short_inputs() {
    // Two 2 x 2 tiles: the identity and [[1, 2], [3, 4]], whose squares
    // are the identity and [[7, 10], [15, 22]]; |products| sum to the
    // same (no negative terms).
    let x = [1.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0];
    let (want, abs) = reference(&x, 2, 2).unwrap();
    let squares = vec![1.0, 0.0, 0.0, 1.0, 7.0, 10.0, 15.0, 22.0];
    assert_eq!((want, abs), (squares.clone(), squares));
    // A tile of 0 (once a chunk size of 0) and an x a value short of
    // 2 tiles of 2 x 2 = 8 (once an index past the last tile).
    let why = |x: &[f32], tiles, t| reference(x, tiles, t).unwrap_err().to_string();
    let e = why(&x, 2, 0);
    assert!(e.contains("the pipeline reference: tile 0"), "{e}");
    let e = why(&x[..7], 2, 2);
    assert!(e.contains("x holds 7 values, not 2 tiles of 2 x 2"), "{e}");
    // 3 tiles need 12 values; usize::MAX tiles overflow and are refused.
    let e = why(&x, 3, 2);
    assert!(e.contains("x holds 8 values, not 3 tiles of 2 x 2"), "{e}");
    let e = why(&x, usize::MAX, 2);
    assert!(e.contains("x holds 8 values, not"), "{e}");
}
