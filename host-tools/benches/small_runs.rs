//! What a small run costs on the host shim: a table of a few tasks, run
//! again and again, as tests, `wsp run` and a relaunched decode step do.
//! Per-task overhead is the scheduling bench's; this is the cost of a run
//! around its tasks (checking the kernels, starting the scheduler threads,
//! setting up the dispatcher, the dispatch queues and the orchestrator,
//! the statistics at the end).
//!
//! Tables of 1, 8 and 64 independent `add` tasks run on cores whose
//! kernels are empty, with one and two scheduler threads, each run on
//! the queues and orchestrator an earlier run left, recycled
//! ([`host_tools::heap::run_state`]). "new thread" runs each run on a
//! thread of its own, as `cargo test` runs each test (a new thread's
//! stack and allocations fault in fresh pages); "thread" is starting and
//! joining an empty thread, measured alone. "shim" runs the same table
//! on the host shim as `wsp run` and the tests do: two cube and two
//! vector AICores, each a host thread of its own, running the real `add`
//! kernel (a run's threads are workers kept between runs,
//! [`host_tools::workers`]).
//!
//! Peer in the same run: a `rayon` pool of as many threads running the
//! same number of empty tasks in a `scope` (what a run of independent
//! tasks costs a pool that already exists).
//!
//! Run: `cargo bench -p host-tools --bench small_runs`. Prints medians of
//! 9 samples of microseconds per run. `WSP_BENCH_SMOKE=1` takes one
//! sample of a few runs (CI).

use std::hint::black_box;
use std::time::Instant;

use device_runtime::abi::Table;
use device_runtime::sched::{RunOptions, SchedConfig};
use host_tools::pinning::Placement;
use host_tools::shim::{run_threads_placed, HostClock, Shim};

mod common;
use common::EmptyCores;

const CORES_PER_THREAD: usize = 4;

fn smoke() -> bool {
    std::env::var_os("WSP_BENCH_SMOKE").is_some()
}

/// One run of `table` on `threads` scheduler threads of empty cores.
fn run(table: &Table<'_>, arena: &mut [u8], threads: usize, clock: &HostClock) {
    let (platforms, cores) = EmptyCores::for_threads(threads, CORES_PER_THREAD, clock);
    let sched = SchedConfig {
        threads,
        ..SchedConfig::default()
    };
    let options = RunOptions::default();
    let stats = run_threads_placed(
        table,
        arena,
        platforms,
        &cores,
        &sched,
        &options,
        Placement::Os,
    )
    .unwrap();
    assert_eq!(stats.tasks as usize, table.tasks().len());
}

/// Median over the samples of microseconds per call of `f`, `per` calls
/// a sample.
fn median(per: usize, mut f: impl FnMut()) -> f64 {
    let samples = if smoke() { 1 } else { 9 };
    let mut us: Vec<f64> = (0..samples)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..per {
                f();
            }
            start.elapsed().as_secs_f64() * 1e6 / per as f64
        })
        .collect();
    us.sort_by(f64::total_cmp);
    us[us.len() / 2]
}

fn main() {
    let clock = HostClock::new();
    let per = if smoke() { 3 } else { 200 };
    println!(
        "{:>6} {:>7}  {:>9} {:>9} {:>7}  {:>10} {:>8} {:>8}",
        "tasks", "threads", "ours µs", "rayon µs", "ratio", "new thread", "thread", "shim µs"
    );
    for threads in [1, 2] {
        for n in [1, 8, 64] {
            let (bytes, size) = common::independent(n);
            let table = Table::parse(&bytes).unwrap();
            let mut arena = vec![0u8; size];
            // Once first, so that there is state to recycle.
            run(&table, &mut arena, threads, &clock);
            let ours = median(per, || run(&table, &mut arena, threads, &clock));
            let fresh = median(per / 4 + 1, || {
                std::thread::scope(|s| {
                    s.spawn(|| run(&table, &mut arena, threads, &clock));
                })
            });
            let shim = Shim {
                sched: SchedConfig {
                    threads,
                    ..SchedConfig::default()
                },
                ..Shim::default()
            };
            let on_shim = median(per / 4 + 1, || {
                let stats = shim.run(&bytes, &mut arena).unwrap();
                assert_eq!(stats.tasks as usize, table.tasks().len());
            });
            let spawn = median(per / 4 + 1, || {
                std::thread::scope(|s| {
                    s.spawn(|| black_box(0));
                })
            });
            // Built after ours ran and dropped before the next: idle rayon
            // workers spin for a while before they sleep, on the
            // processors our next runs would use.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let peer = median(per, || {
                pool.scope(|s| {
                    for i in 0..n {
                        s.spawn(move |_| {
                            black_box(i);
                        });
                    }
                })
            });
            drop(pool);
            println!(
                "{n:>6} {threads:>7}  {ours:>9.1} {peer:>9.1} {:>7.1}  {fresh:>10.1} {spawn:>8.1} {on_shim:>8.1}",
                ours / peer
            );
        }
    }
}
