//! Host planning time per decode batch: the chunk choice alone
//! ([`choose_chunk`]) and the whole plan ([`Plan::new`]: the chunk choice
//! and the work list, items sorted longest first), for the named decode
//! workloads' batches (32 requests, 32 query / 8 KV heads) at 8 and 24
//! cube cores.
//!
//! Run: `cargo bench -p host-tools --bench decode_plan`. Prints medians
//! over 9 runs of many plans each. `WSP_BENCH_SMOKE=1` runs fewer.

use std::hint::black_box;
use std::time::Instant;

use host_tools::attention::plan::{choose_chunk, CostModel, Plan, Strategy};
use host_tools::attention::workload::shape_of;
use host_tools::workloads::Params;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Median nanoseconds of one call of `f`, over 9 runs of `reps` calls.
fn time(reps: u32, mut f: impl FnMut() -> u64) -> f64 {
    let runs = (0..9)
        .map(|_| {
            let start = Instant::now();
            let mut sink = 0u64;
            for _ in 0..reps {
                sink = sink.wrapping_add(f());
            }
            black_box(sink);
            start.elapsed().as_nanos() as f64 / reps as f64
        })
        .collect();
    median(runs)
}

fn main() {
    let reps = if std::env::var_os("WSP_BENCH_SMOKE").is_some() {
        10
    } else {
        2000
    };
    println!(
        "{:<16} {:>5} {:>7} {:>6} {:>7} {:>14} {:>12}",
        "batch", "cores", "chunk", "items", "merges", "choose_chunk", "plan"
    );
    for name in ["decode", "decode-uniform", "decode-skew"] {
        let shape = shape_of(name, &Params::of(name).unwrap());
        let cost = CostModel::of(shape.group(), shape.d);
        for cores in [8u32, 24] {
            let strategy = Strategy::Planned { cores };
            let plan = Plan::new(&shape, strategy);
            let chunk_ns = time(reps, || {
                choose_chunk(
                    black_box(&shape.lengths),
                    shape.kv_heads,
                    cores,
                    shape.page,
                    cost,
                ) as u64
            });
            let plan_ns = time(reps, || {
                Plan::new(black_box(&shape), strategy).items.len() as u64
            });
            println!(
                "{name:<16} {cores:>5} {:>7} {:>6} {:>7} {:>11.2} us {:>9.2} us",
                plan.chunk,
                plan.items.len(),
                plan.merges(),
                chunk_ns / 1e3,
                plan_ns / 1e3
            );
        }
    }
}
