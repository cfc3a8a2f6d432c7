//! Randomized stress of the orchestrator: random DAGs over partially
//! overlapping regions, tiny capacities so that every ring wraps and every
//! resource stalls, tasks completed in random order by a driver that plays a
//! handful of cores. After each run an independent oracle checks that every
//! task ran exactly once and after every earlier task it truly depends on
//! (read-after-write, write-after-write, write-after-read, decided from the
//! sets of elements the regions touch, not from `Region::overlaps`; and
//! explicit dependencies), that each stream's tasks were issued in order,
//! and that a task waiting on an event started after every task the event
//! stands for ended.
//!
//! Release builds run 4000 seeds x 500 tasks (2 million tasks); debug
//! builds (plain `cargo test`) run 25 seeds so the suite stays quick.
//! `cargo xtask ci` runs the release size.

use device_runtime::abi::{Access, Region};
use device_runtime::orch::{
    DeadlockCause, KernelRef, Orchestrator, StallReason, SubmitError, TaskArg, TaskId,
};
use device_runtime::CoreKind;

mod element_sets;
use element_sets::{SelfCheck, Sweep, Touch};

/// Elements of one tensor's index space as the oracle lays it out: row
/// major with rows `ROW` elements apart. Every region here lies below 464
/// in both dimensions, so distinct indices are distinct elements and the
/// three tensors occupy disjoint ranges.
const ROW: u64 = 512;
const TENSOR: u64 = ROW * ROW;

/// The elements an argument touches, as the oracle numbers them.
fn touch(a: &TaskArg) -> Touch {
    assert!(a.region.offset[0] + a.region.extent[0] <= ROW as u32);
    assert!(a.region.offset[1] + a.region.extent[1] <= ROW as u32);
    let base = a.tensor as u64 * TENSOR;
    let elements = element_sets::elements(&a.region.offset, &a.region.extent, &[ROW, 1, 1, 1]);
    Touch {
        elements: elements.into_iter().map(|e| base + e).collect(),
        writes: a.access.contains(Access::WRITE),
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Task {
    args: Vec<TaskArg>,
    /// The oracle's view of `args`.
    touches: Vec<Touch>,
    deps: Vec<TaskId>,
    kind: CoreKind,
    /// 0 (none) or 1 ..= 3.
    stream: u32,
    /// Event waits it carries: tasks of stream `.0` below id `.1`.
    waits: Vec<(u32, u64)>,
}

/// A 2-D region at a random offset below `span`, with random extents of 1
/// to `size`.
fn random_region(rng: &mut Rng, span: u64, size: u64) -> Region {
    let (r0, c0) = (rng.below(span) as u32, rng.below(span) as u32);
    Region {
        offset: [r0, c0, 0, 0],
        extent: [1 + rng.below(size) as u32, 1 + rng.below(size) as u32, 1, 1],
    }
}

fn random_task(rng: &mut Rng, submitted: u64, check: &mut SelfCheck) -> Task {
    loop {
        let n = 1 + rng.below(3) as usize;
        let args: Vec<TaskArg> = (0..n)
            .map(|_| {
                // Mostly small regions packed close together (many
                // conflicts); some over cell boundaries, some wider than
                // their tensor's cells, a few so large that lookups scan
                // every bucket; and aligned square tiles of 1, 2 or 4
                // elements a side, which are exactly one cell when their
                // tensor's cells have their size (the lookup's fast path).
                // A tensor's cells are refitted after a few regions in a
                // row of another size, so shapes change as the run goes,
                // also while entries placed with the old shape are live.
                let region = match rng.below(24) {
                    0..=13 => random_region(rng, 12, 4),
                    14..=17 => random_region(rng, 200, 40),
                    18 => random_region(rng, 160, 100),
                    19 => random_region(rng, 64, 400),
                    _ => {
                        let side = 1 << rng.below(3);
                        let (r0, c0) = (side * rng.below(4) as u32, side * rng.below(4) as u32);
                        Region {
                            offset: [r0, c0, 0, 0],
                            extent: [side, side, 1, 1],
                        }
                    }
                };
                let access = [Access::READ, Access::WRITE, Access::READ | Access::WRITE]
                    [rng.below(3) as usize];
                TaskArg {
                    tensor: rng.below(3) as u32,
                    region,
                    access,
                }
            })
            .collect();
        // A task must not write what another of its arguments touches.
        let touches: Vec<Touch> = args.iter().map(touch).collect();
        if check.conflicts_with_itself(&touches) {
            continue;
        }
        let deps = if submitted > 0 && rng.below(8) == 0 {
            vec![submitted - 1 - rng.below(submitted.min(20))]
        } else {
            vec![]
        };
        let kind = if rng.below(2) == 0 {
            CoreKind::Cube
        } else {
            CoreKind::Vector
        };
        let stream = rng.below(4) as u32;
        return Task {
            args,
            touches,
            deps,
            kind,
            stream,
            waits: Vec::new(),
        };
    }
}

/// One run: returns how many stalls each resource saw.
fn run(seed: u64, count: usize, oracle: &mut (Sweep, SelfCheck)) -> [u64; 4] {
    let mut rng = Rng(seed);
    // 24 TensorMap entries, not a power of two (as a table run's three per
    // task of the window): entry positions skip the end of each block.
    let mut o = Orchestrator::<16, 24, 10>::new(2048);
    let cores = 1 + rng.below(4) as usize;
    let mut tasks: Vec<Task> = Vec::with_capacity(count);
    let (mut start, mut end) = (vec![u64::MAX; count], vec![u64::MAX; count]);
    let mut running: Vec<TaskId> = Vec::new();
    let mut clock = 0u64;
    let mut pending: Option<Task> = None;
    let mut scope_left = 0;
    // The streams' model: what each event stands for, the waits pending on
    // each stream, and the order in which tasks were issued.
    let mut events: [Option<(u32, u64)>; 4] = [None; 4];
    let mut waits: [Vec<(u32, u64)>; 4] = Default::default();
    let mut issue_seq = vec![u64::MAX; count];
    let mut issues = 0u64;
    while tasks.len() < count || !o.is_drained() {
        clock += 1;
        // Submit while we can.
        if tasks.len() < count {
            if scope_left == 0 && rng.below(50) == 0 {
                o.scope_begin("stress").unwrap();
                scope_left = 1 + rng.below(8); // fewer than the 16-slot window
            }
            let mut task = match pending.take() {
                Some(task) => task,
                None => {
                    // Before a new task: perhaps an event record or wait.
                    let (stream, event) = (1 + rng.below(3) as u32, rng.below(4) as u32);
                    match rng.below(10) {
                        0 => {
                            o.record_event(stream, event).unwrap();
                            events[event as usize] = Some((stream, tasks.len() as u64));
                        }
                        1 => match events[event as usize] {
                            Some(record) => {
                                o.wait_event(stream, event).unwrap();
                                waits[stream as usize].push(record);
                            }
                            None => assert!(o.wait_event(stream, event).is_err()),
                        },
                        _ => {}
                    }
                    random_task(&mut rng, tasks.len() as u64, &mut oracle.1)
                }
            };
            if task.stream != 0 {
                task.waits = waits[task.stream as usize].clone();
            }
            let heap = if rng.below(4) == 0 {
                1 + rng.below(700)
            } else {
                0
            };
            match o.submit_on(
                clock,
                task.stream,
                KernelRef {
                    id: 1,
                    kind: task.kind,
                },
                &task.args,
                heap,
                &task.deps,
                0,
            ) {
                Ok(id) => {
                    assert_eq!(id as usize, tasks.len());
                    if task.stream != 0 {
                        waits[task.stream as usize].clear();
                    }
                    tasks.push(task);
                    if scope_left > 0 {
                        scope_left -= 1;
                        if scope_left == 0 {
                            o.scope_end().unwrap();
                        }
                    }
                    continue;
                }
                Err(SubmitError::Stall(_)) => pending = Some(task),
                // The scope's tasks fill the heap ring or the TensorMap:
                // nothing can retire before it ends. A program would have to
                // be fixed; the test ends the scope early and goes on.
                Err(SubmitError::Deadlock(
                    cause @ (DeadlockCause::ScopeExceedsPool { scope, .. }
                    | DeadlockCause::ScopeExceedsWindow { scope, .. }),
                )) => {
                    assert!(scope_left > 0 && scope == "stress", "seed {seed}: {cause}");
                    o.scope_end().unwrap();
                    scope_left = 0;
                    pending = Some(task);
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
        } else if scope_left > 0 {
            o.scope_end().unwrap();
            scope_left = 0;
        }
        // Hand ready tasks to free "cores", then finish a random running one.
        while running.len() < cores {
            let kind = if rng.below(2) == 0 {
                CoreKind::Cube
            } else {
                CoreKind::Vector
            };
            let Some(t) = o.pop_ready(kind).or_else(|| {
                o.pop_ready(if kind == CoreKind::Cube {
                    CoreKind::Vector
                } else {
                    CoreKind::Cube
                })
            }) else {
                break;
            };
            assert_eq!(
                start[t.id as usize],
                u64::MAX,
                "seed {seed}: task {} handed out twice",
                t.id
            );
            start[t.id as usize] = clock;
            // Issued as soon as it is handed out, mostly; sometimes only
            // when it completes (which counts as issued too).
            if rng.below(4) != 0 {
                o.issued(t.id).unwrap();
            }
            issue_seq[t.id as usize] = issues;
            issues += 1;
            running.push(t.id);
        }
        if running.is_empty() {
            if scope_left > 0 {
                // The open scope may be what blocks the ring: close it.
                o.scope_end().unwrap();
                scope_left = 0;
                continue;
            }
            o.check_progress(0, [true, true])
                .unwrap_or_else(|r| panic!("seed {seed}: {r}"));
            continue;
        }
        let i = rng.below(running.len() as u64) as usize;
        let id = running.swap_remove(i);
        clock += 1;
        end[id as usize] = clock;
        o.complete(id).unwrap();
    }
    check(seed, &tasks, &start, &end, &issue_seq, &mut oracle.0);
    stalls(&o.stats())
}

/// The oracle, task by task in program order: every task ran, after the
/// one before it on its stream was issued (`issued`: the order of issue),
/// after every task an event it waits on stands for ended, and after every
/// producer the element sets name (and every explicit dependency) ended.
fn check(seed: u64, tasks: &[Task], start: &[u64], end: &[u64], issued: &[u64], sweep: &mut Sweep) {
    sweep.reset();
    for t in 0..tasks.len() {
        assert!(end[t] != u64::MAX, "seed {seed}: task {t} never ran");
        let stream = tasks[t].stream;
        if let Some(u) = (0..t)
            .rev()
            .find(|&u| stream != 0 && tasks[u].stream == stream)
        {
            assert!(
                issued[u] < issued[t],
                "seed {seed}: task {t} issued before {u}, the one before it on stream {stream}"
            );
        }
        for &(src, bound) in &tasks[t].waits {
            for u in 0..bound as usize {
                if tasks[u].stream == src {
                    assert!(
                        end[u] < start[t],
                        "seed {seed}: task {t} started before {u}, which an event it waits on stands for, ended"
                    );
                }
            }
        }
        let producers = sweep.task(&tasks[t].touches);
        for u in producers
            .iter()
            .map(|&u| u as u64)
            .chain(tasks[t].deps.iter().copied())
        {
            assert!(
                end[u as usize] < start[t],
                "seed {seed}: task {t} started before its producer {u} ended"
            );
        }
    }
}

/// Stalls per resource: task ring, TensorMap, DepList (or edge) pool, heap.
fn stalls(s: &device_runtime::orch::StallStats) -> [u64; 4] {
    [
        StallReason::TaskRingFull,
        StallReason::TensorMapPoolFull,
        StallReason::DepListPoolFull,
        StallReason::HeapRingFull,
    ]
    .map(|r| s.of(r).stalls)
}

#[test]
fn random_dags_against_a_brute_force_oracle() {
    let (seeds, count) = if cfg!(debug_assertions) {
        (25, 600)
    } else {
        (4000, 500)
    };
    let mut stalls = [0u64; 4];
    let space = 3 * TENSOR as usize;
    let mut oracle = (Sweep::new(space), SelfCheck::new(space));
    for seed in 0..seeds {
        let s = run(seed, count, &mut oracle);
        for (total, n) in stalls.iter_mut().zip(s) {
            *total += n;
        }
    }
    // Every resource was exhausted at some point (the capacities are tiny).
    assert!(
        stalls.iter().all(|&n| n > 0),
        "stalls per resource: {stalls:?}"
    );
}

/// One run through the release graph ([`Orchestrator::submit_linked`]):
/// `threads` worker threads play cores; each takes a ready task, issues
/// it (releasing its stream successor), runs it, and completes it in the
/// graph, queueing whatever that releases, as scheduler threads do; the
/// driver submits, queues the tasks that are ready at once and reports
/// finished tasks back (`finished`), as the dispatcher does. Start and end
/// times come from one atomic counter, so an end that happens before a
/// start has the smaller number. Returns the stalls per resource.
fn run_linked(
    seed: u64,
    count: usize,
    threads: usize,
    oracle: &mut (Sweep, SelfCheck),
) -> [u64; 4] {
    use device_runtime::orch::ReleaseGraph;
    use std::collections::VecDeque;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::SeqCst};
    use std::sync::Mutex;

    const WINDOW: usize = 16;
    let mut rng = Rng(seed);
    // Edges for half a producer per task of the window: the pool runs dry
    // often, yet never for good (a stalled task's count is of producers
    // still running, which complete and drop out of it).
    let graph = Box::new(ReleaseGraph::<WINDOW, 8>::new());
    // 24 TensorMap entries, not a power of two (see `run`).
    let mut o = Box::new(Orchestrator::<WINDOW, 24, 0>::new(0));
    let ready: Mutex<VecDeque<u64>> = Mutex::new(VecDeque::new());
    let done: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    let clock = AtomicU64::new(1);
    let start: Vec<AtomicU64> = (0..count).map(|_| AtomicU64::new(u64::MAX)).collect();
    let end: Vec<AtomicU64> = (0..count).map(|_| AtomicU64::new(u64::MAX)).collect();
    let streams: Vec<AtomicU32> = (0..count).map(|_| AtomicU32::new(0)).collect();
    let stop = AtomicBool::new(false);
    // Whether the workers hold back (see `Episode`).
    let hold = AtomicBool::new(false);
    let mut tasks: Vec<Task> = Vec::with_capacity(count);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                while !stop.load(SeqCst) {
                    if hold.load(SeqCst) {
                        std::thread::yield_now();
                        continue;
                    }
                    let Some(t) = ready.lock().unwrap().pop_front() else {
                        std::thread::yield_now();
                        continue;
                    };
                    let slot = t as usize % WINDOW;
                    let queue = |tag| ready.lock().unwrap().push_back(tag);
                    assert_eq!(
                        start[t as usize].swap(clock.fetch_add(1, SeqCst), SeqCst),
                        u64::MAX
                    );
                    if streams[t as usize].load(SeqCst) != 0 {
                        graph.issued(slot, queue);
                    }
                    end[t as usize].store(clock.fetch_add(1, SeqCst), SeqCst);
                    graph.complete(slot, queue);
                    done.lock().unwrap().push(t);
                }
            });
        }
        // Stops the workers however this thread leaves the scope, a failed
        // assertion included: the scope joins them, so a failure would
        // otherwise hang instead of being reported.
        struct StopOnDrop<'a>(&'a AtomicBool);
        impl Drop for StopOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let _stop = StopOnDrop(&stop);
        let mut pending: Option<Task> = None;
        let mut scope_left = 0;
        let mut events: [Option<(u32, u64)>; 4] = [None; 4];
        let mut waits: [Vec<(u32, u64)>; 4] = Default::default();
        let mut idle = 0u64;
        let mut episode: Option<Episode> = None;
        while tasks.len() < count || !o.is_drained() {
            let mut progress = false;
            let finished: Vec<u64> = core::mem::take(&mut *done.lock().unwrap());
            for id in finished {
                o.finished(id).unwrap();
                progress = true;
            }
            let mut drain_first = false;
            if episode.is_none()
                && pending.is_none()
                && tasks.len() % Episode::EVERY == Episode::EVERY - 1
                && count - tasks.len() > 2 * WINDOW
            {
                if scope_left > 0 {
                    o.scope_end().unwrap();
                    scope_left = 0;
                }
                if o.is_drained() {
                    episode = Some(Episode::of(tasks.len()));
                    hold.store(true, SeqCst);
                } else {
                    drain_first = true;
                }
            }
            if tasks.len() < count && !drain_first {
                if episode.is_none() && scope_left == 0 && pending.is_none() && rng.below(50) == 0 {
                    o.scope_begin("stress").unwrap();
                    scope_left = 1 + rng.below(8);
                }
                let mut task = match pending.take() {
                    Some(task) => task,
                    None if episode.is_some_and(|e| e != Episode::Random) => {
                        episode.unwrap().task(&mut rng)
                    }
                    None => {
                        let (stream, event) = (1 + rng.below(3) as u32, rng.below(4) as u32);
                        match rng.below(10) {
                            0 => {
                                o.record_event(stream, event).unwrap();
                                events[event as usize] = Some((stream, tasks.len() as u64));
                            }
                            1 => {
                                if let Some(record) = events[event as usize] {
                                    o.wait_event(stream, event).unwrap();
                                    waits[stream as usize].push(record);
                                }
                            }
                            _ => {}
                        }
                        let mut task = random_task(&mut rng, tasks.len() as u64, &mut oracle.1);
                        task.deps.clear(); // (submit_linked takes none)
                        task
                    }
                };
                if task.stream != 0 {
                    task.waits = waits[task.stream as usize].clone();
                }
                let id = tasks.len() as u64;
                streams[id as usize].store(task.stream, SeqCst);
                let kernel = KernelRef {
                    id: 1,
                    kind: task.kind,
                };
                let now = clock.load(SeqCst);
                match o.submit_linked(&graph, now, task.stream, kernel, &task.args, id, id) {
                    Ok((got, now_ready)) => {
                        assert_eq!(got, id);
                        if now_ready {
                            ready.lock().unwrap().push_back(id);
                        }
                        if task.stream != 0 {
                            waits[task.stream as usize].clear();
                        }
                        tasks.push(task);
                        progress = true;
                        if scope_left > 0 {
                            scope_left -= 1;
                            if scope_left == 0 {
                                o.scope_end().unwrap();
                            }
                        }
                    }
                    Err(SubmitError::Stall(reason)) => {
                        if let Some(e) = episode.take() {
                            hold.store(false, SeqCst);
                            if let Some(expected) = e.runs_out() {
                                assert_eq!(reason, expected, "seed {seed}: {e:?}");
                            }
                        }
                        pending = Some(task);
                    }
                    Err(SubmitError::Deadlock(
                        cause @ (DeadlockCause::ScopeExceedsPool { scope, .. }
                        | DeadlockCause::ScopeExceedsWindow { scope, .. }),
                    )) => {
                        assert!(scope_left > 0 && scope == "stress", "seed {seed}: {cause}");
                        o.scope_end().unwrap();
                        scope_left = 0;
                        pending = Some(task);
                    }
                    Err(e) => panic!("seed {seed}: {e}"),
                }
            } else if scope_left > 0 {
                o.scope_end().unwrap();
                scope_left = 0;
            }
            assert!(
                !hold.load(SeqCst) || progress,
                "seed {seed}: {episode:?} ran out of nothing"
            );
            if progress {
                idle = 0;
                continue;
            }
            if scope_left > 0 && o.check_progress_linked(&graph).is_err() {
                // The open scope may be what blocks the ring: close it.
                o.scope_end().unwrap();
                scope_left = 0;
                continue;
            }
            o.check_progress_linked(&graph)
                .unwrap_or_else(|r| panic!("seed {seed}: {r}"));
            idle += 1;
            assert!(idle < 50_000_000, "seed {seed}: no progress");
            std::thread::yield_now();
        }
    });
    let (start, end): (Vec<u64>, Vec<u64>) = start
        .iter()
        .zip(&end)
        .map(|(s, e)| (s.load(SeqCst), e.load(SeqCst)))
        .unzip();
    // A worker issues a task as it starts it.
    check(seed, &tasks, &start, &end, &start, &mut oracle.0);
    stalls(&o.stats())
}

/// Every `EVERY` tasks, `run_linked` waits until its orchestrator drains,
/// then holds its workers back and submits until a pool runs out; the
/// workers resume at that stall. However fast the workers are compared
/// with the submitter (a debug build, a busy machine), each pool thus runs
/// full in every run.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Episode {
    /// The random tasks: two arguments each on average, so the TensorMap
    /// (24 entries) mostly runs out before the window (16 tasks).
    Random,
    /// Tasks without arguments: only the window fills.
    Empty,
    /// Tasks reading and writing one element: each has one edge to the one
    /// before it, so the release graph's 8 edges run out at the tenth task,
    /// before the window or the TensorMap (9 tasks, 9 entries).
    Chain,
}

impl Episode {
    const EVERY: usize = 50;

    fn of(submitted: usize) -> Episode {
        [Episode::Random, Episode::Empty, Episode::Chain][submitted / Episode::EVERY % 3]
    }

    /// The pool this episode must run out of first, where that is certain.
    fn runs_out(self) -> Option<StallReason> {
        match self {
            Episode::Random => None,
            Episode::Empty => Some(StallReason::TaskRingFull),
            Episode::Chain => Some(StallReason::DepListPoolFull),
        }
    }

    /// One of this episode's tasks (not for `Random`).
    fn task(self, rng: &mut Rng) -> Task {
        let args = match self {
            Episode::Random => unreachable!("random tasks come from random_task"),
            Episode::Empty => vec![],
            Episode::Chain => vec![TaskArg {
                tensor: 0,
                region: Region {
                    offset: [0; 4],
                    extent: [1, 1, 1, 1],
                },
                access: Access::READ | Access::WRITE,
            }],
        };
        Task {
            touches: args.iter().map(touch).collect(),
            args,
            deps: vec![],
            kind: if rng.below(2) == 0 {
                CoreKind::Cube
            } else {
                CoreKind::Vector
            },
            stream: 0,
            waits: vec![],
        }
    }
}

/// The same random DAGs released by worker threads through the release
/// graph, racing the submitter's linking: release builds run 1000 seeds x
/// 500 tasks on 1 to 3 threads (half a million tasks).
#[test]
fn random_dags_released_by_threads_against_the_oracle() {
    let (seeds, count) = if cfg!(debug_assertions) {
        (10, 300)
    } else {
        (1000, 500)
    };
    let mut stalls = [0u64; 4];
    let space = 3 * TENSOR as usize;
    let mut oracle = (Sweep::new(space), SelfCheck::new(space));
    for seed in 0..seeds {
        let threads = 1 + seed as usize % 3;
        let s = run_linked(seed, count, threads, &mut oracle);
        for (total, n) in stalls.iter_mut().zip(s) {
            *total += n;
        }
    }
    // The window, the TensorMap and the release graph's edges all ran full
    // (no heap here: `submit_linked` takes no heap block).
    assert!(
        stalls[..3].iter().all(|&n| n > 0),
        "stalls per resource: {stalls:?}"
    );
}
