//! Scheduling benchmarks (issue 4).
//!
//! 1. Runtime overhead per task, end to end: the dispatcher and the
//!    scheduler threads run real tables (submission, dependency inference,
//!    dispatch, issue, completion) on cores whose kernels are empty (a
//!    platform that completes every launch at once), for (a) independent
//!    tasks, (b) a chain, (c) rounds of a wide fan-out and a fan-in. In the
//!    same run, `rayon` (scope spawns) and a `crossbeam-deque` work-stealing
//!    executor (given the edges, atomic fan-in counters) run the same graphs
//!    with empty tasks on the same number of threads. The contestants run
//!    in rounds, one run each per round (see `rounds`); a ratio is the
//!    median of the rounds' ours / peer, printed with its range.
//! 2. Load balance in semantic time on a skewed load: MoE experts with
//!    Zipf-distributed token counts, every policy keyed by expert; makespan
//!    divided by the lower bound max(total work / cores, longest task).
//!
//! `cargo bench -p host-tools --bench scheduling`; `WSP_BENCH_SMOKE=1` runs
//! small sizes once (CI); `WSP_BENCH_ONLY=a|b|c` runs one graph;
//! `WSP_BENCH_PROFILE=THREADS` runs only ours, once (for callgrind), or
//! `WSP_BENCH_REPS` times (for a sampling profiler such as `perf record`);
//! `WSP_BENCH_THREADS=1` prints each of our runs' tasks issued and stolen
//! per scheduler thread; `WSP_BENCH_WINDOW=N` runs ours with a task
//! window of N tasks instead of the default.
//!
//! `WSP_BENCH_PIN=1` pins every contestant's threads one to a processor
//! (ours with [`Placement::Pinned`], the peers' from their threads'
//! start): left to the OS, two threads of a run sometimes share one
//! processor while the other idles, and the run measures one processor
//! instead of two; pinned, our runs were slower on this project's machine
//! (`BENCHMARKS.md`, "Seventh pass").

use std::hint::black_box;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use crossbeam_deque::{Injector, Steal, Stealer, Worker};
use device_runtime::abi::Table;
use device_runtime::sched::RunOptions;
use device_runtime::sched::{DispatchKey, PolicyKind, SchedConfig};
use host_tools::pinning::{pin_to_nth, Pins, Placement};
use host_tools::semantic::run_semantic_with;
use host_tools::shim::{run_threads_placed, HostClock};
use host_tools::table::{Arg, TableBuilder};
use wsp_ffi::ArgAccess::In;
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM};

mod common;
use common::{EmptyCores, WIDTH};

const THREADS: usize = 2;

const CORES_PER_THREAD: usize = 4;

/// Where every contestant's threads run: where the OS puts them, or with
/// `WSP_BENCH_PIN=1` pinned one to a processor (if the host has `THREADS`
/// processors for this process; said once if not).
fn placement() -> Placement {
    static PLACEMENT: OnceLock<Placement> = OnceLock::new();
    *PLACEMENT.get_or_init(|| {
        if !std::env::var("WSP_BENCH_PIN").is_ok_and(|v| v == "1") {
            return Placement::Os;
        }
        match Pins::plan(THREADS) {
            Ok(_) => Placement::Pinned,
            Err(e) => {
                eprintln!("WSP_BENCH_PIN=1: threads not pinned ({e})");
                Placement::Os
            }
        }
    })
}

/// Pins the calling peer thread `index` as [`placement`] says.
fn pin_peer(index: usize) {
    if placement() == Placement::Pinned {
        pin_to_nth(index).expect("the processors were there when the plan was made");
    }
}

/// Our runs' task window: `WSP_BENCH_WINDOW`, else the default.
fn window() -> Option<usize> {
    let w = std::env::var("WSP_BENCH_WINDOW").ok()?;
    Some(w.parse().expect("WSP_BENCH_WINDOW is a number of tasks"))
}

/// A graph as the peers get it: successors and fan-in counts.
struct Graph {
    succ: Vec<Vec<u32>>,
    fanin: Vec<u32>,
}

struct Dag {
    name: &'static str,
    table: Vec<u8>,
    arena: usize,
    graph: Graph,
}

fn independent(n: u32) -> Dag {
    let graph = Graph {
        succ: vec![Vec::new(); n as usize],
        fanin: vec![0; n as usize],
    };
    dag("(a) independent", common::independent(n), graph)
}

fn chain(n: u32) -> Dag {
    let mut succ: Vec<Vec<u32>> = (1..n).map(|i| vec![i]).collect();
    succ.push(Vec::new());
    let mut fanin = vec![1; n as usize];
    fanin[0] = 0;
    dag("(b) chain", common::chain(n), Graph { succ, fanin })
}

/// Each round's tile tasks wait for the round before's fan-in task, which
/// waits for its round's tile tasks.
fn fan(rounds: u32) -> Dag {
    let per = WIDTH + 1;
    let n = (rounds * per) as usize;
    let mut succ = vec![Vec::new(); n];
    let mut fanin = vec![0; n];
    for r in 0..rounds {
        let base = r * per;
        for j in 0..WIDTH {
            let task = base + j;
            if r > 0 {
                succ[(base - 1) as usize].push(task);
                fanin[task as usize] += 1;
            }
            succ[task as usize].push(base + WIDTH);
            fanin[(base + WIDTH) as usize] += 1;
        }
    }
    dag(
        "(c) fan-out/fan-in",
        common::fan(rounds),
        Graph { succ, fanin },
    )
}

fn dag(name: &'static str, (table, arena): common::Built, graph: Graph) -> Dag {
    Dag {
        name,
        table,
        arena,
        graph,
    }
}

fn ours(dag: &Dag, policy: PolicyKind) -> f64 {
    ours_on(dag, policy, THREADS)
}

fn ours_on(dag: &Dag, policy: PolicyKind, threads: usize) -> f64 {
    let table = Table::parse(&dag.table).unwrap();
    let mut arena = vec![0u8; dag.arena];
    let clock = HostClock::new();
    let start = Instant::now();
    let (platforms, cores) = EmptyCores::for_threads(threads, CORES_PER_THREAD, &clock);
    let sched = SchedConfig {
        threads,
        policy,
        ..SchedConfig::default()
    };
    let stats = run_threads_placed(
        &table,
        &mut arena,
        platforms,
        &cores,
        &sched,
        &RunOptions {
            window: window(),
            ..RunOptions::default()
        },
        placement(),
    )
    .unwrap();
    let elapsed = start.elapsed().as_nanos() as f64;
    if std::env::var_os("WSP_BENCH_THREADS").is_some() {
        let each: Vec<String> = stats
            .threads()
            .iter()
            .map(|t| {
                let (issued, stolen) = (t.issued, t.steals);
                let (placed, kept) = (t.placed, t.released);
                format!(
                    "thread {}: {issued} issued, {stolen} stolen, {placed} placed by the dispatcher, {kept} kept",
                    t.thread
                )
            })
            .collect();
        let ns = elapsed / stats.tasks as f64;
        eprintln!("{} {ns:.1} ns on {threads}: {}", dag.name, each.join("; "));
    }
    assert_eq!(stats.tasks as usize, dag.graph.fanin.len());
    elapsed / stats.tasks as f64
}

fn rayon_peer(dag: &Dag, pool: &rayon::ThreadPool) -> f64 {
    let n = dag.graph.fanin.len();
    let start = Instant::now();
    match dag.name.as_bytes()[1] {
        b'a' => pool.scope(|s| {
            for i in 0..n {
                s.spawn(move |_| {
                    black_box(i);
                });
            }
        }),
        b'b' => {
            fn link<'s>(s: &rayon::Scope<'s>, i: usize, n: usize) {
                black_box(i);
                if i + 1 < n {
                    s.spawn(move |s| link(s, i + 1, n));
                }
            }
            pool.scope(|s| link(s, 0, n));
        }
        _ => pool.install(|| {
            for round in 0..n / (WIDTH as usize + 1) {
                rayon::scope(|s| {
                    for j in 0..WIDTH as usize {
                        s.spawn(move |_| {
                            black_box((round, j));
                        });
                    }
                });
                black_box(round);
            }
        }),
    }
    start.elapsed().as_nanos() as f64 / n as f64
}

/// A minimal work-stealing DAG executor on crossbeam-deque: per-thread
/// LIFO workers, an injector for the initial ready tasks, atomic fan-in.
fn crossbeam_peer(dag: &Dag) -> f64 {
    let g = &dag.graph;
    let n = g.fanin.len();
    let start = Instant::now();
    let fanin: Vec<AtomicU32> = g.fanin.iter().map(|&f| AtomicU32::new(f)).collect();
    let injector = Injector::new();
    for (t, &f) in g.fanin.iter().enumerate() {
        if f == 0 {
            injector.push(t as u32);
        }
    }
    let done = AtomicUsize::new(0);
    let workers: Vec<Worker<u32>> = (0..THREADS).map(|_| Worker::new_lifo()).collect();
    let stealers: Vec<Stealer<u32>> = workers.iter().map(|w| w.stealer()).collect();
    std::thread::scope(|s| {
        for (id, worker) in workers.into_iter().enumerate() {
            let (fanin, injector, done, stealers) = (&fanin, &injector, &done, &stealers);
            s.spawn(move || {
                pin_peer(id);
                while done.load(Ordering::Acquire) < n {
                    let task = worker.pop().or_else(|| loop {
                        let found = injector.steal_batch_and_pop(&worker).or_else(|| {
                            (1..THREADS)
                                .map(|k| stealers[(id + k) % THREADS].steal())
                                .collect()
                        });
                        if !found.is_retry() {
                            break found.success();
                        }
                    });
                    let Some(t) = task else {
                        std::hint::spin_loop();
                        continue;
                    };
                    black_box(t);
                    for &c in &g.succ[t as usize] {
                        if fanin[c as usize].fetch_sub(1, Ordering::AcqRel) == 1 {
                            worker.push(c);
                        }
                    }
                    done.fetch_add(1, Ordering::Release);
                }
            });
        }
    });
    let _ = Steal::<u32>::Empty;
    start.elapsed().as_nanos() as f64 / n as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Times every contestant `rounds` times, in rounds of one run each (the
/// order rotating from round to round), and returns each one's samples:
/// a slow phase of a shared machine (they last seconds to minutes) then
/// falls on all contestants alike, not on whichever ran during it, and a
/// round's ratios compare runs made a second or so apart.
fn rounds<const N: usize>(
    rounds: usize,
    contestants: [&mut dyn FnMut() -> f64; N],
) -> [Vec<f64>; N] {
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(rounds));
    for round in 0..rounds {
        for k in 0..N {
            let c = (round + k) % N;
            samples[c].push(contestants[c]());
        }
    }
    samples
}

/// The median of the rounds' ratios `ours[r] / peer[r]`, and their range.
fn ratio(ours: &[f64], peer: &[f64]) -> (f64, f64, f64) {
    let r: Vec<f64> = ours.iter().zip(peer).map(|(o, p)| o / p).collect();
    let (lo, hi) = (
        r.iter().copied().fold(f64::INFINITY, f64::min),
        r.iter().copied().fold(0.0, f64::max),
    );
    (median(r), lo, hi)
}

/// MoE experts with Zipf(1.1)-distributed token counts: expert e runs
/// ceil(tokens_e / 16) independent 16x16x16 GEMM tiles, its outputs in row
/// block e (the dispatch key).
fn moe(experts: u32, tokens: u32) -> (Vec<u8>, Vec<u8>, u64) {
    let weights: Vec<f64> = (1..=experts).map(|r| 1.0 / (r as f64).powf(1.1)).collect();
    let total: f64 = weights.iter().sum();
    let tiles: Vec<u32> = weights
        .iter()
        .map(|w| ((w / total * tokens as f64) / 16.0).ceil().max(1.0) as u32)
        .collect();
    let most = *tiles.iter().max().unwrap();
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[16, 16]).unwrap();
    let w = b.tensor("w", &[16, 16]).unwrap();
    let y = b.tensor("y", &[experts * 16, most * 16]).unwrap();
    for (e, &n) in tiles.iter().enumerate() {
        for t in 0..n {
            let args = [
                Arg::tile(x, In, 0, 0, 16, 16),
                Arg::tile(w, In, 0, 0, 16, 16),
                Arg::tile(y, wsp_ffi::ArgAccess::InOut, e as u32 * 16, t * 16, 16, 16),
            ];
            b.task(GEMM, &args, &[]).unwrap();
        }
    }
    let arena = vec![0u8; b.arena_size() as usize];
    let count: u64 = tiles.iter().map(|&t| t as u64).sum();
    (b.finish().unwrap(), arena, count)
}

fn main() {
    let smoke = std::env::var_os("WSP_BENCH_SMOKE").is_some();
    let (n, samples) = if smoke { (20_000, 1) } else { (1_000_000, 5) };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(THREADS)
        .start_handler(pin_peer)
        .build()
        .unwrap();
    let placed = match placement() {
        Placement::Os => "placed by the OS",
        Placement::Pinned => "each pinned to a processor",
    };
    println!(
        "overhead per task, empty kernels, {THREADS} threads ({placed}; {CORES_PER_THREAD} empty cores each for ours); median of {samples} rounds"
    );
    let dags = [independent(n), chain(n / 10), fan((n / 10) / (WIDTH + 1))];
    // `WSP_BENCH_ONLY=a|b|c` runs one graph (for profiling).
    let only = std::env::var("WSP_BENCH_ONLY").ok();
    for dag in &dags {
        if let Some(only) = &only {
            if !dag.name.starts_with(&format!("({only})")) {
                continue;
            }
        }
        let tasks = dag.graph.fanin.len();
        // `WSP_BENCH_PROFILE=THREADS` runs ours once on that many threads
        // (for callgrind: instructions per task of the whole path).
        if let Some(threads) = std::env::var("WSP_BENCH_PROFILE")
            .ok()
            .and_then(|t| t.parse().ok())
        {
            let reps = std::env::var("WSP_BENCH_REPS")
                .ok()
                .and_then(|r| r.parse().ok())
                .unwrap_or(1);
            let mut ns = 0.0;
            for _ in 0..reps {
                ns = ours_on(dag, PolicyKind::WorkStealing, threads);
            }
            println!(
                "{:<20} {tasks:>8} tasks  ours {ns:>6.1} ns on {threads} threads",
                dag.name
            );
            continue;
        }
        let [ws, rr, ry, cb] = rounds(
            samples,
            [
                &mut || ours(dag, PolicyKind::WorkStealing),
                &mut || ours_on(dag, PolicyKind::RoundRobin, 1),
                &mut || rayon_peer(dag, &pool),
                &mut || crossbeam_peer(dag),
            ],
        );
        let (to_ry, to_cb) = (ratio(&ws, &ry), ratio(&ws, &cb));
        println!(
            "{:<20} {tasks:>8} tasks  ours {:>6.1} ns (1 thread {:>6.1})  rayon {:>6.1} ns (ratio {:.2}, rounds {:.2}-{:.2})  crossbeam-deque {:>6.1} ns (ratio {:.2}, rounds {:.2}-{:.2})",
            dag.name,
            median(ws.clone()),
            median(rr),
            median(ry),
            to_ry.0,
            to_ry.1,
            to_ry.2,
            median(cb),
            to_cb.0,
            to_cb.1,
            to_cb.2,
        );
    }

    let (experts, tokens) = if smoke { (16, 2048) } else { (64, 16384) };
    let (table, arena, tasks) = moe(experts, tokens);
    let cores = 8;
    let task_cycles = 5120u64;
    let bound = (tasks * task_cycles)
        .div_ceil(cores as u64)
        .max(task_cycles);
    println!(
        "load balance, semantic time: {experts} experts, Zipf(1.1) over {tokens} tokens = {tasks} GEMM tiles, {cores} cube cores on 4 threads, key = expert; lower bound {bound} cycles"
    );
    let kinds = vec![CoreKind::Cube; cores];
    for policy in PolicyKind::ALL {
        let sched = SchedConfig {
            threads: 4,
            policy,
            // Round-robin and the shared queue place without a key, and
            // a run refuses one given with them.
            key: if policy.uses_key() {
                DispatchKey::Tile { arg: 2, dim: 0 }
            } else {
                DispatchKey::TaskIndex
            },
            ..SchedConfig::default()
        };
        let mut a = arena.clone();
        let run =
            run_semantic_with(&table, &mut a, &kinds, &sched, &RunOptions::default()).unwrap();
        println!(
            "  {:<14} makespan {:>9} cycles  makespan/bound {:.3}  ({})",
            policy.name(),
            run.makespan,
            run.makespan as f64 / bound as f64,
            run.stats.policy
        );
    }
}
