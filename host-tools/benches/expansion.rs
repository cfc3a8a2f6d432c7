//! Program size and device-side expansion cost for a decode layer's
//! attention: batch 64, 32 heads, KV lengths drawn up to 16K tokens,
//! one task per (request, head, 64-token KV chunk):
//!
//! ```text
//! parallel b in 0..64:
//!     parallel h in 0..32:
//!         parallel c in 0..chunks[b]        (Ragged: read from a tensor)
//!             s[b*32 + h, c*64 ..] += q[b*32 + h] @ kT[:, c*64 ..]   (gemm_tile)
//! ```
//!
//! Figures: the program's bytes against the bytes of the same tasks as
//! task records (one `TaskDesc` and three `TensorArg`s each, what a table
//! without a program needs), and the nanoseconds per task of the device's
//! expander ([`Expander::step_into`], filling one spec, with the orchestrator's answers stubbed:
//! no writer pending, every iteration complete) against reading the same
//! tasks from task records (`TaskSpec::of_task`), the peer, in the same run.
//!
//! Run: `cargo bench -p host-tools --bench expansion`. Prints medians over
//! 9 runs. `WSP_BENCH_SMOKE=1` uses batch 4 (the CI smoke run).

use std::hint::black_box;
use std::time::Instant;

use device_runtime::abi::Table;
use device_runtime::expand::{Expander, Next, TaskSpec};
use host_tools::inspect::HostExpansion;
use host_tools::program::{Axis, Expr, Workload};
use host_tools::rng::SplitMix64;
use host_tools::table::{Arena, Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, InOut};
use wsp_ffi::WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM;

const HEADS: u32 = 32;
const CHUNK: u32 = 64;
const MAX_KV: u32 = 16 * 1024;
const MAX_CHUNKS: u32 = MAX_KV / CHUNK;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Expands the whole program (the timed work of the expander), with the
/// orchestrator's answers stubbed; returns the tasks and a checksum.
/// Not inlined, so that a profiler can count it on its own.
#[inline(never)]
fn expand_all(table: &Table<'_>, arena: &[u8]) -> (u64, u64) {
    let mut expander = Expander::new(table);
    let mut cx = HostExpansion {
        arena: Some(arena),
        run_writes: &[],
        symbols: &[],
        next: 0,
        needs_data: false,
    };
    let mut spec = TaskSpec::empty();
    let mut checksum = 0u64;
    loop {
        match expander.step_into(table, &mut cx, &mut spec).unwrap() {
            Next::Task => {
                checksum += spec.args[2].region.offset[1] as u64;
                cx.next += 1;
            }
            Next::Done => break,
            _ => {}
        }
    }
    (cx.next, checksum)
}

/// Reads every task of the tasks section (the timed work of the peer);
/// returns a checksum. Not inlined, as [`expand_all`].
#[inline(never)]
fn read_records(table: &Table<'_>) -> u64 {
    let mut checksum = 0u64;
    for i in 0..table.tasks().len() {
        let spec = TaskSpec::of_task(table, i);
        checksum += spec.args[2].region.offset[1] as u64;
    }
    checksum
}

fn main() {
    let batch: u32 = if std::env::var_os("WSP_BENCH_SMOKE").is_some() {
        4
    } else {
        64
    };
    let mut rng = SplitMix64::new(7);
    // KV lengths uniform in 1..=16K tokens, in whole chunks.
    let chunks: Vec<i32> = (0..batch)
        .map(|_| (rng.below(MAX_CHUNKS as u64) + 1) as i32)
        .collect();
    let tasks: u64 = chunks.iter().map(|&c| c as u64 * HEADS as u64).sum();

    let mut w = Workload::new();
    let q = w.tensor("q", &[batch * HEADS, 64]).unwrap();
    let kt = w.tensor("kT", &[64, MAX_KV]).unwrap();
    let s = w.tensor("s", &[batch * HEADS, MAX_KV]).unwrap();
    let lens = w.tensor_i32("chunks", &[1, batch]).unwrap();
    w.input(lens);
    w.parallel(Axis::Dense(batch), |w, b| {
        w.parallel(Axis::Dense(HEADS), |w, h| {
            // Computed once per (b, h), not per chunk.
            let row = w.let_(b.clone() * HEADS + h);
            let at = vec![Expr::Const(0), b.clone()];
            let ragged = Axis::Ragged {
                lengths: lens,
                at,
                max: MAX_CHUNKS,
            };
            w.parallel(ragged, |w, c| {
                let col = c * CHUNK;
                w.call(
                    GEMM,
                    &[
                        q.tile(row.clone(), 0, 1, 64),
                        kt.tile(0, col.clone(), 64, CHUNK),
                        s.tile(row.clone(), col, 1, CHUNK),
                    ],
                    &[],
                );
            });
        });
    });
    let table_bytes = w.finish().unwrap();
    let table = Table::parse(&table_bytes).unwrap();
    let mut arena = Arena::zeroed(w.arena_size());
    arena.write_i32(w.layout(lens), &chunks);
    let program_bytes = std::mem::size_of_val(table.program());
    let record_bytes = tasks * (56 + 3 * 40);

    // The same tasks as task records: the peer reads them back.
    let mut flat = TableBuilder::new();
    let fq = flat.tensor("q", &[batch * HEADS, 64]).unwrap();
    let fk = flat.tensor("kT", &[64, MAX_KV]).unwrap();
    let fs = flat.tensor("s", &[batch * HEADS, MAX_KV]).unwrap();
    for b in 0..batch {
        for h in 0..HEADS {
            let row = b * HEADS + h;
            for c in 0..chunks[b as usize] as u32 {
                let args = [
                    Arg::tile(fq, In, row, 0, 1, 64),
                    Arg::tile(fk, In, 0, c * CHUNK, 64, CHUNK),
                    Arg::tile(fs, InOut, row, c * CHUNK, 1, CHUNK),
                ];
                flat.task(GEMM, &args, &[]).unwrap();
            }
        }
    }
    let flat_bytes = flat.finish().unwrap();
    let flat_table = Table::parse(&flat_bytes).unwrap();
    assert_eq!(flat_table.tasks().len() as u64, tasks);

    let mut ours = Vec::new();
    let mut peer = Vec::new();
    for _ in 0..9 {
        let start = Instant::now();
        let (expanded, checksum) = expand_all(&table, &arena.bytes);
        ours.push(start.elapsed().as_nanos() as f64 / tasks as f64);
        assert_eq!(expanded, tasks, "the device expands every task");
        black_box(checksum);

        let start = Instant::now();
        let checksum = read_records(&flat_table);
        peer.push(start.elapsed().as_nanos() as f64 / tasks as f64);
        black_box(checksum);
    }
    let (ours, peer) = (median(ours), median(peer));
    println!("decode-layer attention: batch {batch}, {HEADS} heads, KV up to {MAX_KV} in {CHUNK}-token chunks");
    println!("  tasks                     {tasks}");
    println!(
        "  program                   {program_bytes} bytes ({} instructions)",
        table.program().len()
    );
    println!(
        "  as task records           {record_bytes} bytes ({:.0}x the program)",
        record_bytes as f64 / program_bytes as f64
    );
    println!("  table with the program    {} bytes", table_bytes.len());
    println!("  table of task records     {} bytes", flat_bytes.len());
    println!("  expansion                 {ours:.1} ns per task (median of 9)");
    println!("  reading task records      {peer:.1} ns per task (peer, same run)");
    println!("  ratio                     {:.2}", ours / peer);
}
