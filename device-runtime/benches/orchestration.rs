//! Orchestration cost per task: submit (dependency inference in the
//! TensorMap, DepList wiring) plus hand-out, completion and retirement, with
//! kernels that take no time. Three DAGs:
//! (a) independent tasks, (b) one chain, (c) a tiled GEMM like the reference
//!     runtime's bgemm: 16 x 16 output tiles x 16 k steps = 4096 tasks, each
//!     C[i,j] += A[i,k] x B[k,j] (C InOut, A and B In).
//!
//! Run: `cargo bench -p device-runtime --bench orchestration`. Prints the
//! median over 15 runs of nanoseconds per task.

use std::hint::black_box;
use std::time::Instant;

use device_runtime::abi::{Access, Region};
use device_runtime::orch::{KernelRef, Orchestrator, SubmitError, TaskArg};
use device_runtime::CoreKind;

type Orch = Orchestrator<1024, 4096, 8192>;

const KERNEL: KernelRef = KernelRef {
    id: 2,
    kind: CoreKind::Cube,
};

fn tile(tensor: u32, row: u32, col: u32, access: Access) -> TaskArg {
    TaskArg {
        tensor,
        region: Region {
            offset: [row * 16, col * 16, 0, 0],
            extent: [16, 16, 1, 1],
        },
        access,
    }
}

/// Submits every task; when submission stalls, or every `batch` tasks,
/// completes what is ready (a device that finishes kernels instantly).
fn drive(
    o: &mut Orch,
    tasks: usize,
    batch: usize,
    args: impl Fn(usize) -> [TaskArg; 3],
    nargs: usize,
) {
    let complete_ready = |o: &mut Orch| {
        while let Some(t) = o.pop_ready(CoreKind::Cube) {
            o.complete(t.id).unwrap();
        }
    };
    let mut i = 0;
    while i < tasks {
        let a = args(i);
        match o.submit(0, KERNEL, &a[..nargs], 0, &[], i as u64) {
            Ok(_) => {
                i += 1;
                if i % batch == 0 {
                    complete_ready(o);
                }
            }
            Err(SubmitError::Stall(_)) => complete_ready(o),
            Err(e) => panic!("{e}"),
        }
    }
    while !o.is_drained() {
        complete_ready(o);
    }
}

fn measure(name: &str, tasks: usize, run: impl Fn(&mut Orch)) {
    let mut orch = Box::new(Orch::new(0));
    let mut samples: Vec<f64> = (0..15)
        .map(|_| {
            let start = Instant::now();
            run(black_box(&mut orch));
            start.elapsed().as_nanos() as f64 / tasks as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    println!(
        "{name:<28} {tasks:>7} tasks  {:>7.1} ns/task (median of 15; min {:.1}, max {:.1})",
        samples[7], samples[0], samples[14]
    );
}

fn main() {
    // Ignore cargo bench's own arguments (e.g. --bench).
    const N: usize = 100_000;
    measure("(a) independent", N, |o| {
        drive(
            o,
            N,
            64,
            |i| {
                [
                    tile(i as u32 % 4096, 0, 0, Access::WRITE),
                    tile(0, 0, 0, Access::READ),
                    tile(0, 0, 0, Access::READ),
                ]
            },
            1,
        )
    });
    measure("(b) chain", N, |o| {
        drive(
            o,
            N,
            64,
            |_| [tile(0, 0, 0, Access::READ | Access::WRITE); 3],
            1,
        )
    });
    let bgemm = |i: usize| {
        let (ij, k) = (i / 16, (i % 16) as u32);
        let (r, c) = ((ij / 16) as u32, (ij % 16) as u32);
        [
            tile(1, r, k, Access::READ),
            tile(2, k, c, Access::READ),
            tile(3, r, c, Access::READ | Access::WRITE),
        ]
    };
    measure("(c) bgemm 16x16x16 tiles", 4096, |o| {
        drive(o, 4096, 64, bgemm, 3)
    });
}
