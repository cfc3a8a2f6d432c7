//! Orchestration cost per task: submit (dependency inference in the
//! TensorMap, DepList wiring) plus hand-out, completion and retirement, with
//! kernels that take no time. Four DAGs:
//! (a) independent tasks, (b) one chain, (c) a tiled GEMM like the reference
//!     runtime's bgemm: 16 x 16 output tiles x 16 k steps = 4096 tasks, each
//!     C[i,j] += A[i,k] x B[k,j] (C InOut, A and B In);
//! (d) the scheduling bench's fan-out/fan-in graph: rounds of 256 tile
//!     tasks, each reading X[j] and writing Y[j], then one task reading
//!     all of Y and writing all of X.
//!
//! Peer in the same run: a hand-written scheduler for the same DAG with its
//! edges given up front (fan-in counters and consumer lists precomputed,
//! outside the timing; no inference, no bounds): the least that dependency
//! bookkeeping costs. The machine is shared and noisy, so the ratio of the
//! two is the figure to compare across runs.
//!
//! Run: `cargo bench -p device-runtime --bench orchestration`. Prints medians
//! over 15 runs of nanoseconds per task. `WSP_BENCH_ONLY=a|b|c|d` runs one DAG.

use std::collections::VecDeque;
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
    let region = Region {
        offset: [row * 16, col * 16, 0, 0],
        extent: [16, 16, 1, 1],
    };
    TaskArg {
        tensor,
        region,
        access,
    }
}

/// Submits every task; when submission stalls, or every `batch` tasks,
/// completes what is ready (a device that finishes kernels instantly),
/// as the dispatcher takes its threads' reports: each task completed,
/// then one retirement for them all.
fn drive(o: &mut Orch, batch: usize, args: &[[TaskArg; 3]], nargs: usize) {
    let complete_ready = |o: &mut Orch| {
        while let Some(t) = o.pop_ready(CoreKind::Cube) {
            o.complete_unretired(t.id).unwrap();
        }
        o.retire_completed();
    };
    // Callgrind counts the loop's own bookkeeping with the orchestrator's:
    // a countdown, not `i % batch` (a division per task). About 20
    // instructions per task remain the loop's (BENCHMARKS.md).
    let mut left = batch;
    for (tag, a) in args.iter().enumerate() {
        let a = &a[..nargs];
        loop {
            match o.submit(0, KERNEL, a, 0, &[], tag as u64) {
                Ok(_) => break,
                Err(SubmitError::Stall(_)) => complete_ready(o),
                Err(e) => panic!("{e}"),
            }
        }
        left -= 1;
        if left == 0 {
            left = batch;
            complete_ready(o);
        }
    }
    while !o.is_drained() {
        complete_ready(o);
    }
}

/// Median ns per task over 15 runs of `run`.
fn median(tasks: usize, mut run: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..15)
        .map(|_| {
            let start = Instant::now();
            run();
            start.elapsed().as_nanos() as f64 / tasks as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[7]
}

/// The DAG's edges, computed outside the timing, for the peer: per argument,
/// the nearest earlier conflicting task. For these three DAGs that is the
/// transitive reduction, the fewest edges any scheduler must follow.
fn edges(
    tasks: usize,
    args: &impl Fn(usize) -> [TaskArg; 3],
    nargs: usize,
) -> (Vec<u32>, Vec<Vec<u32>>) {
    let writes = |a: &TaskArg| a.access.contains(Access::WRITE);
    let mut fanin = vec![0u32; tasks];
    let mut consumers: Vec<Vec<u32>> = vec![Vec::new(); tasks];
    for (t, fanin_t) in fanin.iter_mut().enumerate() {
        let a = args(t);
        for x in &a[..nargs] {
            let nearest = (t.saturating_sub(64)..t).rev().find(|&u| {
                args(u)[..nargs].iter().any(|y| {
                    x.tensor == y.tensor && (writes(x) || writes(y)) && x.region.overlaps(&y.region)
                })
            });
            if let Some(u) = nearest {
                if !consumers[u].contains(&(t as u32)) {
                    *fanin_t += 1;
                    consumers[u].push(t as u32);
                }
            }
        }
    }
    (fanin, consumers)
}

/// The peer: runs the DAG from its given edges, completing tasks as they
/// become ready.
fn peer(fanin: &[u32], consumers: &[Vec<u32>]) {
    let mut count = fanin.to_vec();
    let mut ready: VecDeque<u32> = (0..fanin.len() as u32)
        .filter(|&t| count[t as usize] == 0)
        .collect();
    while let Some(t) = ready.pop_front() {
        for &c in &consumers[t as usize] {
            count[c as usize] -= 1;
            if count[c as usize] == 0 {
                ready.push_back(c);
            }
        }
    }
    black_box(&count);
}

/// Whether `WSP_BENCH_ONLY` leaves the DAG called `name` out (`=c` runs
/// only the one whose name starts with "(c)", for profiling).
fn skipped(name: &str) -> bool {
    std::env::var("WSP_BENCH_ONLY").is_ok_and(|only| !name.starts_with(&format!("({only})")))
}

fn measure(name: &str, tasks: usize, args: impl Fn(usize) -> [TaskArg; 3], nargs: usize) {
    if skipped(name) {
        return;
    }
    let given = edges(tasks, &args, nargs);
    measure_with(name, tasks, args, nargs, given);
}

/// [`measure`] with the peer's edges given.
fn measure_with(
    name: &str,
    tasks: usize,
    args: impl Fn(usize) -> [TaskArg; 3],
    nargs: usize,
    (fanin, consumers): (Vec<u32>, Vec<Vec<u32>>),
) {
    let mut orch = Box::new(Orch::new(0));
    // The submitter's arguments are built outside the timing, as the peer's edges are.
    let all: Vec<[TaskArg; 3]> = (0..tasks).map(&args).collect();
    let ours = median(tasks, || drive(black_box(&mut orch), 64, &all, nargs));
    let peer_ns = median(tasks, || peer(black_box(&fanin), &consumers));
    println!(
        "{name:<26} {tasks:>7} tasks  {ours:>6.1} ns/task; peer with given edges {peer_ns:>5.1} ns/task; ratio {:.1}",
        ours / peer_ns
    );
}

fn main() {
    const N: usize = 100_000;
    let independent = |i: usize| {
        [
            tile(i as u32 % 4096, 0, 0, Access::WRITE),
            tile(0, 0, 0, Access::READ),
            tile(0, 0, 0, Access::READ),
        ]
    };
    measure("(a) independent", N, independent, 1);
    measure(
        "(b) chain",
        N,
        |_| [tile(0, 0, 0, Access::READ | Access::WRITE); 3],
        1,
    );
    let bgemm = |i: usize| {
        let (ij, k) = (i / 16, (i % 16) as u32);
        let (r, c) = ((ij / 16) as u32, (ij % 16) as u32);
        [
            tile(1, r, k, Access::READ),
            tile(2, k, c, Access::READ),
            tile(3, r, c, Access::READ | Access::WRITE),
        ]
    };
    measure("(c) bgemm 16x16x16 tiles", 4096, bgemm, 3);

    // (d): X and Y are 16 x 16 tiles; a round is 256 tile tasks and a
    // whole-tensor task. The peer's edges, by hand (the nearest-conflict
    // rule of `edges` finds one of a whole-tensor task's 256 producers):
    // a tile task waits for the last round's whole-tensor task (it reads
    // the X tile that task wrote; its Y write comes after that task's
    // read and the last tile write there, which that task waited for),
    // and a whole-tensor task for its round's 256 tile tasks.
    const PER: usize = 257;
    let name = "(d) fan-out/fan-in rounds";
    if !skipped(name) {
        let tasks = N / PER * PER;
        let round = |i: usize| {
            let j = (i % PER) as u32;
            if j == 256 {
                let all = |t, access| TaskArg {
                    tensor: t,
                    region: Region {
                        offset: [0; 4],
                        extent: [256, 256, 1, 1],
                    },
                    access,
                };
                return [
                    all(2, Access::READ),
                    all(1, Access::WRITE),
                    all(0, Access::READ),
                ];
            }
            [
                tile(1, j / 16, j % 16, Access::READ),
                tile(2, j / 16, j % 16, Access::WRITE),
                tile(0, 0, 0, Access::READ),
            ]
        };
        let mut fanin = vec![0u32; tasks];
        let mut consumers: Vec<Vec<u32>> = vec![Vec::new(); tasks];
        for base in (0..tasks).step_by(PER) {
            for t in base..base + 256 {
                if base > 0 {
                    consumers[base - 1].push(t as u32);
                    fanin[t] += 1;
                }
                consumers[t].push((base + 256) as u32);
                fanin[base + 256] += 1;
            }
        }
        measure_with(name, tasks, round, 2, (fanin, consumers));
    }
}
