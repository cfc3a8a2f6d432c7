//! Host planning time per decode batch: the chunk choice alone
//! ([`choose_chunk`]) and the whole plan ([`Plan::new`]: the chunk choice
//! and the work list, items sorted longest first), for the named decode
//! workloads' batches (32 requests, 32 query / 8 KV heads) at 8 and 24
//! cube cores.
//!
//! And the device planner's side ([`device::decode_program`]): the
//! nanoseconds per task of the device's expander turning the program into
//! the same partials and merges (the planning task's chunk written into
//! the arena, as `decode_plan` leaves it, and the orchestrator's answers
//! stubbed as in the expansion bench), against reading the host-planned
//! table's task records (`TaskSpec::of_task`), the peer.
//!
//! Run: `cargo bench -p host-tools --bench decode_plan`. Prints medians
//! over 9 runs of many plans each. `WSP_BENCH_SMOKE=1` runs fewer (the CI
//! smoke run).

use std::hint::black_box;
use std::time::Instant;

use device_runtime::abi::Table;
use device_runtime::expand::TaskSpec;
use host_tools::attention::device;
use host_tools::attention::plan::{choose_chunk, CostModel, Plan, Strategy};
use host_tools::attention::workload::{decode_table, shape_of};
use host_tools::attention::DecodeData;
use host_tools::table::Arena;
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
        let cost = CostModel::of(shape.group(), shape.d).unwrap();
        for cores in [8u32, 24] {
            let strategy = Strategy::Planned { cores };
            let plan = Plan::new(&shape, strategy).unwrap();
            let chunk_ns = time(reps, || {
                choose_chunk(
                    black_box(&shape.lengths),
                    shape.kv_heads,
                    cores,
                    shape.page,
                    cost,
                )
                .unwrap() as u64
            });
            let plan_ns = time(reps, || {
                Plan::new(black_box(&shape), strategy).unwrap().items.len() as u64
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
    device_expansion(reps / 100 + 1);
}

/// Reads every task record of `table`; returns a checksum.
#[inline(never)]
fn read_records(table: &Table<'_>) -> u64 {
    (0..table.tasks().len())
        .map(|i| TaskSpec::of_task(table, i).args[0].region.offset[0] as u64)
        .sum()
}

fn device_expansion(reps: u32) {
    println!();
    println!(
        "{:<16} {:>5} {:>7} {:>6} {:>18} {:>14} {:>6}",
        "device planner", "cores", "chunk", "tasks", "expand (ns/task)", "records", "ratio"
    );
    let p = Params::of("decode").unwrap();
    let shape = shape_of("decode", &p);
    let data = DecodeData::build(shape.clone(), p.seed).unwrap();
    for cores in [8u32, 24] {
        let (mut w, t) = device::decode_program(&data, cores).unwrap();
        let bytes = w.finish().unwrap();
        let table = Table::parse(&bytes).unwrap();
        let chunk = choose_chunk(
            &shape.lengths,
            shape.kv_heads,
            cores,
            shape.page,
            CostModel::of(shape.group(), shape.d).unwrap(),
        )
        .unwrap();
        // Only the lengths and the plan are read: a small arena will do
        // for the loads, the rest of the bytes untouched.
        let mut arena = Arena::zeroed(w.arena_size());
        let lens: Vec<i32> = shape.lengths.iter().map(|&l| l as i32).collect();
        arena.write_i32(w.layout(t.attn.lens), &lens);
        arena.write_i32(w.layout(t.plan), &[chunk as i32]);
        let plan = Plan::with_chunk(&shape, chunk);
        let tasks = host_tools::inspect::expand_program(&table, &arena.bytes).unwrap();
        assert_eq!(tasks as usize, 1 + plan.items.len() + plan.merges());
        let (host, _, _) = decode_table(&data, &plan).unwrap();
        let host_bytes = host.finish().unwrap();
        let host_table = Table::parse(&host_bytes).unwrap();
        assert_eq!(host_table.tasks().len() as u64, tasks - 1);
        let expand = time(reps, || {
            host_tools::inspect::expand_program(&table, &arena.bytes).unwrap()
        }) / tasks as f64;
        let records = time(reps, || read_records(&host_table)) / (tasks - 1) as f64;
        println!(
            "{:<16} {cores:>5} {chunk:>7} {tasks:>6} {expand:>18.1} {records:>14.1} {:>6.2}",
            "decode",
            expand / records
        );
    }
}
