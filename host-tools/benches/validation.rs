//! Table validation cost per task: `Table::parse` (checksum, sections,
//! every tensor, kernel, task and argument against the kernel registry's
//! contracts), which runs before every launch, in the shim and on the
//! device, and which nothing else in a run repeats.
//!
//! Tables: the scheduling bench's three graphs ((a) 100,000 independent
//! tasks, (b) a chain of 100,000, (c) rounds of a 256-wide fan-out and a
//! fan-in, about 100,000 tasks; `add` with three tile arguments each), the
//! tiled `gemm` workload at 1024 x 1024 x 1024 in 32-tiles (32,768
//! `gemm_tile` tasks), and the `decode` workload's attention table (its
//! default sizes: split-KV partial tasks and merges planned on the host).
//!
//! Peer in the same run: reading every task record once
//! (`TaskSpec::of_task`, the descriptor and its arguments, what a run
//! reads of a task), the least any per-task check of the records costs.
//!
//! Run: `cargo bench -p host-tools --bench validation`. Prints medians of
//! 9 runs, ns per task. `WSP_BENCH_SMOKE=1` builds small tables and runs
//! once (CI); `WSP_BENCH_ONLY=NAME` builds only the table whose name
//! starts with NAME, and `WSP_BENCH_PROFILE=1` then parses it once, for
//! callgrind (`--toggle-collect='*Table*parse*'`, divided by the tasks
//! printed).

use std::hint::black_box;
use std::time::Instant;

use device_runtime::abi::Table;
use device_runtime::expand::TaskSpec;
use host_tools::workloads::{Params, Workload};

mod common;

fn workload(name: &str, p: Params) -> Vec<u8> {
    Workload::build(name, p).unwrap().table
}

/// Reads every task record once (the peer); returns a checksum. Not
/// inlined, so that the work is not folded into the caller.
#[inline(never)]
fn read_records(table: &Table<'_>) -> u64 {
    let mut checksum = 0u64;
    for i in 0..table.tasks().len() {
        let spec = TaskSpec::of_task(table, i);
        checksum = checksum.wrapping_add(spec.args()[0].region.offset[1] as u64);
    }
    checksum
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let smoke = std::env::var_os("WSP_BENCH_SMOKE").is_some();
    let only = std::env::var("WSP_BENCH_ONLY").ok();
    let profile = std::env::var_os("WSP_BENCH_PROFILE").is_some();
    let (n, rounds, gemm) = if smoke {
        (2_000, 8, 256)
    } else {
        (100_000, 389, 1024)
    };
    let tables: [(&str, &dyn Fn() -> Vec<u8>); 5] = [
        ("(a) independent", &|| common::independent(n).0),
        ("(b) chain", &|| common::chain(n).0),
        ("(c) fan-out/fan-in", &|| common::fan(rounds).0),
        ("gemm 32-tiles", &|| {
            let p = Params {
                m: gemm,
                n: gemm,
                k: gemm,
                tile: 32,
                seed: 1,
            };
            workload("gemm", p)
        }),
        ("decode", &|| {
            workload("decode", Params::of("decode").unwrap())
        }),
    ];
    let runs = if smoke { 1 } else { 9 };
    println!("table validation (Table::parse), median of {runs}, ns per task");
    for (name, build) in tables {
        if only.as_deref().is_some_and(|o| !name.starts_with(o)) {
            continue;
        }
        let bytes = build();
        let table = Table::parse(black_box(&bytes)).unwrap();
        let tasks = table.tasks().len();
        if profile {
            println!("{name}: {tasks} tasks, parsed once");
            continue;
        }
        let (mut ours, mut peer) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            let start = Instant::now();
            let parsed = Table::parse(black_box(&bytes)).unwrap();
            black_box(parsed.tasks().len());
            ours.push(start.elapsed().as_nanos() as f64 / tasks as f64);
            let start = Instant::now();
            black_box(read_records(black_box(&table)));
            peer.push(start.elapsed().as_nanos() as f64 / tasks as f64);
        }
        let (ours, peer) = (median(ours), median(peer));
        println!(
            "{name:<20} {tasks:>7} tasks, {:>5.1} bytes each: parse {ours:>6.1} ns/task; \
             reading the records {peer:>5.1} ns/task (peer); ratio {:.2}",
            bytes.len() as f64 / tasks as f64,
            ours / peer
        );
    }
}
