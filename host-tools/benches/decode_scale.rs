//! The decode layer at scale (issue: model workloads, item 6): a dense
//! decode step of 256 requests through 9 layers (hidden 1024, 16 query
//! and 4 KV heads of 64, ffn 2048, contexts of 1 to 64 tokens in pages of
//! 16), over 100,000 tasks, expanded on the device and run with a
//! 256-task window in semantic time. Prints the program's size, its tasks, the
//! expander's cost per task alone (the orchestrator's answers stubbed, as
//! in the expansion bench) and the whole run's.
//!
//! Run: `cargo bench -p host-tools --bench decode_scale`.
//! `WSP_BENCH_SMOKE=1` uses 1 layer of 64 requests (the CI smoke run).

use std::time::Instant;

use device_runtime::abi::Table;
use device_runtime::sched::RunOptions;
use host_tools::attention::plan::{choose_chunk, CostModel};
use host_tools::model::layer::{decode_layer_workload, task_count, PLAN_CORES};
use host_tools::model::{LayerData, LayerShape, Mlp};
use host_tools::semantic::run_semantic;
use wsp_ffi::CoreKind;

fn main() {
    let smoke = std::env::var_os("WSP_BENCH_SMOKE").is_some();
    let (layers, batch) = if smoke { (1, 64) } else { (9, 256) };
    let shape = LayerShape {
        lengths: (0..batch).map(|i| 1 + (i * 37) % 64).collect(),
        q_heads: 16,
        kv_heads: 4,
        d: 64,
        ffn: 2048,
        page: 16,
        layers,
        mlp: Mlp::Dense,
    };
    let t0 = Instant::now();
    let data = LayerData::build(shape.clone(), 7).unwrap();
    let w = decode_layer_workload("decode-layer-dense", &data).unwrap();
    let built = t0.elapsed().as_secs_f64();
    let table = Table::parse(&w.table).unwrap();
    let program = std::mem::size_of_val(table.program());
    println!(
        "decode scale: {layers} layers, {batch} requests, hidden 1024, ffn 2048: {} tasks, a program of {} \
         instructions ({program} bytes), table {} bytes, arena {} bytes (built in {built:.1} s)",
        w.tasks,
        table.program().len(),
        w.table.len(),
        w.arena.bytes.len()
    );
    // The expander alone, over an arena holding the chunk decode_plan
    // would write (the host planner's rule).
    let mut arena = w.arena.clone();
    let chunk = choose_chunk(
        &shape.lengths,
        shape.kv_heads,
        PLAN_CORES,
        shape.page,
        CostModel::of(shape.q_heads / shape.kv_heads, shape.d).unwrap(),
    )
    .unwrap();
    let plan = w.tensors.iter().find(|t| t.name == "plan").unwrap().clone();
    arena.write_i32(&plan, &[chunk as i32]);
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let n = host_tools::inspect::expand_program(&table, &arena.bytes).unwrap();
        times.push(t.elapsed().as_secs_f64());
        assert_eq!(n as usize, w.tasks);
    }
    times.sort_by(f64::total_cmp);
    let expand_ns = times[2] * 1e9 / w.tasks as f64;
    println!("expander alone: {expand_ns:.1} ns per task (median of 5)");
    // The whole runtime: expansion, orchestration with a 256-task window,
    // dispatch to 8 cube and 16 vector cores, in semantic time.
    let mut kinds = vec![CoreKind::Cube; 8];
    kinds.extend([CoreKind::Vector; 16]);
    let mut arena = w.arena.clone();
    let options = RunOptions {
        window: Some(256),
        ..RunOptions::default()
    };
    let t = Instant::now();
    let run = run_semantic(&w.table, &mut arena.bytes, &kinds, &options).unwrap();
    let wall = t.elapsed().as_secs_f64();
    assert_eq!(run.stats.tasks as usize, task_count(&data).unwrap());
    let check = w.verify(&arena);
    assert!(check.passed(), "{check}");
    println!(
        "run with a 256-task window: {} tasks, makespan {} cycles on 8 cube + 16 vector cores, \
         window high water {}, {wall:.1} s wall (kernels included); {check}",
        run.stats.tasks,
        run.makespan,
        run.stats
            .stalls
            .of(device_runtime::orch::StallReason::TaskRingFull)
            .high_water
    );
}
