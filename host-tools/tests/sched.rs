//! Scheduling: every dispatch policy with several scheduler threads, in the
//! threaded shim and in deterministic semantic time, checked against the
//! workloads' f64 references and against a sequential run of random DAGs.

use device_runtime::orch::StallReason;
use device_runtime::sched::{
    ConfigError, DispatchKey, DispatchPolicy, Load, Placement, PolicyKind, SchedConfig, TaskInfo,
};
use device_runtime::sched::{RunError, RunOptions, RunStats};
use host_tools::dag::{in_table_order, random_dag};
use host_tools::semantic::{run_semantic_custom, run_semantic_with, SemanticRun};
use host_tools::shim::{Shim, ShimError};
use host_tools::workloads::{Params, Workload};
use wsp_ffi::CoreKind;

/// 256 x 256 x 128 in 32-tiles: 64 chains of 4 GEMM tiles (256 tasks).
fn gemm() -> Workload {
    let p = Params {
        m: 256,
        n: 256,
        k: 128,
        tile: 32,
        seed: 3,
    };
    Workload::build("gemm", p).unwrap()
}

/// `key` for a key-based policy; the others are given none (a run refuses
/// a key its policy would ignore).
fn config(threads: usize, policy: PolicyKind, key: DispatchKey) -> SchedConfig {
    SchedConfig {
        threads,
        policy,
        key: if policy.uses_key() {
            key
        } else {
            DispatchKey::TaskIndex
        },
        ..SchedConfig::default()
    }
}

/// The output row block of a GEMM tile task (argument 2 is C).
const ROW_BLOCK: DispatchKey = DispatchKey::Tile { arg: 2, dim: 0 };

fn semantic(w: &Workload, cores: usize, sched: &SchedConfig) -> SemanticRun {
    let mut arena = w.arena.clone();
    let kinds = vec![CoreKind::Cube; cores];
    let run = run_semantic_with(
        &w.table,
        &mut arena.bytes,
        &kinds,
        sched,
        &RunOptions::default(),
    )
    .unwrap();
    let check = w.verify(&arena);
    assert!(check.passed(), "{:?}: {check}", sched);
    run
}

fn issued(stats: &RunStats) -> Vec<u64> {
    stats.threads().iter().map(|t| t.issued).collect()
}

#[test]
fn every_policy_runs_every_workload_on_several_threads_in_the_shim() {
    for name in ["gemm", "mlp", "streams"] {
        let w = Workload::build(
            name,
            Params {
                m: 128,
                n: 128,
                k: 96,
                tile: 32,
                seed: 9,
            },
        )
        .unwrap();
        // mlp's RMSNorm and softmax tasks have no third argument, so no
        // row block: a key that a task lacks is refused.
        let key = match name {
            "mlp" => DispatchKey::TaskIndex,
            _ => ROW_BLOCK,
        };
        for policy in PolicyKind::ALL {
            for threads in [2, 4] {
                let shim = Shim {
                    cube_cores: 4,
                    vector_cores: 4,
                    sched: config(threads, policy, key),
                    ..Shim::default()
                };
                let mut arena = w.arena.clone();
                let stats = shim.run(&w.table, &mut arena.bytes).unwrap();
                let check = w.verify(&arena);
                assert!(check.passed(), "{name} {policy:?} x{threads}: {check}");
                assert_eq!(stats.tasks as usize, w.tasks);
                assert_eq!(stats.threads().len(), threads);
                assert_eq!(issued(&stats).iter().sum::<u64>(), w.tasks as u64);
                let placed: u64 = stats.threads().iter().map(|t| t.placed).sum();
                if policy == PolicyKind::Shared {
                    assert_eq!(placed, 0, "the shared policy uses no thread queue");
                    for t in stats.threads() {
                        assert_eq!(t.from_shared, t.issued, "{name} x{threads}");
                    }
                } else {
                    // A task is placed by the dispatcher or, under a policy
                    // that keeps released tasks, queued by the thread that
                    // released it: never both, never neither.
                    let released: u64 = stats.threads().iter().map(|t| t.released).sum();
                    assert_eq!(
                        placed + released,
                        w.tasks as u64,
                        "{name} {policy:?} x{threads}"
                    );
                    // (Which thread sees which completion depends on
                    // timing here; semantic time checks who keeps what.)
                    if !matches!(policy, PolicyKind::WorkStealing | PolicyKind::Adaptive) {
                        assert_eq!(released, 0, "{policy:?} places every task");
                    }
                }
                for t in stats.threads() {
                    assert!(t.steals <= t.steal_attempts);
                    if !matches!(policy, PolicyKind::WorkStealing | PolicyKind::Adaptive) {
                        assert_eq!(t.steal_attempts, 0, "{policy:?} does not steal");
                    }
                }
            }
        }
    }
}

#[test]
fn semantic_time_reproduces_every_policy_exactly() {
    let w = gemm();
    for policy in PolicyKind::ALL {
        let sched = config(3, policy, ROW_BLOCK);
        let first = semantic(&w, 6, &sched);
        let again = semantic(&w, 6, &sched);
        assert_eq!(first.makespan, again.makespan, "{policy:?}");
        assert_eq!(issued(&first.stats), issued(&again.stats), "{policy:?}");
        // Under work stealing the threads that do not dispatch keep the
        // tasks they release (the GEMM's chains along K); thread 0, which
        // dispatches, and every placing policy hand them to the dispatcher.
        let released: Vec<u64> = first.stats.threads().iter().map(|t| t.released).collect();
        if policy == PolicyKind::WorkStealing {
            assert_eq!(released[0], 0, "{released:?}");
            assert!(released[1..].iter().all(|&r| r > 0), "{released:?}");
        } else if policy != PolicyKind::Adaptive {
            assert!(released.iter().all(|&r| r == 0), "{policy:?}: {released:?}");
        }
        // The cost model by hand: a 32^3 GEMM tile costs its loads of A,
        // B and C (3 * 32 * 32), its store of C (32 * 32) and 32^3 MACs:
        // 4096 + 32768 = 36864 cycles; scheduling costs nothing. 256 tasks
        // (64 output tiles, chains of 4 along K) on 6 cores: some core runs
        // at least ceil(256 / 6) = 43 tasks, and 64 chains of 4 can be
        // packed so that none runs more (the chains are independent and
        // far outnumber the cores): the bound is 43 * 36864.
        assert_eq!(w.tasks, 256);
        let task = 32 * 32 * 4 + 32 * 32 * 32;
        assert_eq!(task, 36_864);
        let bound = 43 * task;
        let expected = match policy {
            // Any free core takes the next ready task: the bound.
            PolicyKind::RoundRobin | PolicyKind::WorkStealing | PolicyKind::Shared => bound,
            // The row block picks the thread; no stealing. Each thread's
            // two cores share its row blocks' chains evenly, so a core runs
            // half of its thread's tasks: for affinity, blocks b % 3 give
            // threads 3, 3 and 2 blocks of 32 tasks, 48 tasks a core; for
            // the hash, the same from the counts it issued per thread.
            PolicyKind::Affinity | PolicyKind::Hash => {
                let most = issued(&first.stats).into_iter().max().unwrap();
                if policy == PolicyKind::Affinity {
                    assert_eq!(issued(&first.stats), [96, 96, 64]);
                }
                most.div_ceil(2) * task
            }
            // Starts as affinity and steals once a thread's queue runs
            // dry: within one task of the bound, not derived further.
            PolicyKind::Adaptive => {
                assert!((bound..=bound + task).contains(&first.makespan));
                first.makespan
            }
        };
        assert_eq!(first.makespan, expected, "{policy:?}");
    }
}

#[test]
fn affinity_keeps_each_key_on_one_thread() {
    let w = gemm();
    let run = semantic(&w, 4, &config(2, PolicyKind::Affinity, ROW_BLOCK));
    // Row blocks 0..8, each 32 tasks: even blocks on thread 0, odd on 1.
    assert_eq!(issued(&run.stats), [128, 128]);
    // Keys all equal (GEMM tasks have no stream, so the stream key is 0):
    // every task on thread 0.
    let run = semantic(&w, 4, &config(2, PolicyKind::Affinity, DispatchKey::Stream));
    assert_eq!(issued(&run.stats), [256, 0]);
    let run = semantic(&w, 4, &config(2, PolicyKind::Hash, DispatchKey::Stream));
    assert!(
        issued(&run.stats).contains(&256),
        "hash keeps one key together"
    );
}

#[test]
fn stealing_balances_a_skewed_load_and_adaptive_chooses_it() {
    let w = gemm();
    // Every task keyed 0: affinity piles all 256 on thread 0 (2 of 4 cores).
    let skew = DispatchKey::Stream;
    let fixed = semantic(&w, 4, &config(2, PolicyKind::Affinity, skew));
    let stolen = semantic(&w, 4, &config(2, PolicyKind::WorkStealing, skew));
    let adaptive = semantic(&w, 4, &config(2, PolicyKind::Adaptive, skew));
    let thread1 = &stolen.stats.threads()[1];
    assert!(thread1.steals > 0 && thread1.issued > 0, "{thread1:?}");
    // Work / 4 cores bounds the balanced run; the skewed one uses 2 cores.
    assert!(
        stolen.makespan * 10 < fixed.makespan * 6,
        "stealing {} vs affinity {}",
        stolen.makespan,
        fixed.makespan
    );
    assert!(
        adaptive.stats.policy.contains("stealing"),
        "{}",
        adaptive.stats.policy
    );
    assert!(adaptive.makespan * 10 < fixed.makespan * 7);
    // On a balanced load adaptive stays static.
    let balanced = semantic(&w, 4, &config(2, PolicyKind::Adaptive, ROW_BLOCK));
    assert!(
        balanced.stats.policy.contains("static"),
        "{}",
        balanced.stats.policy
    );
}

#[test]
fn a_full_dispatch_queue_stalls_dispatch_with_ready_queue_full() {
    let w = gemm();
    let sched = SchedConfig {
        queue_depth: 2,
        ..config(2, PolicyKind::RoundRobin, ROW_BLOCK)
    };
    let run = semantic(&w, 2, &sched);
    let full = run.stats.stalls.of(StallReason::ReadyQueueFull);
    assert!(full.stalls > 0, "{full:?}");
    assert_eq!(full.capacity, 2);
    assert!(full.high_water <= 2);
    for t in run.stats.threads() {
        assert!(t.queue_high_water <= 2, "{t:?}");
    }
    let roomy = semantic(&w, 2, &config(2, PolicyKind::RoundRobin, ROW_BLOCK));
    assert_eq!(roomy.stats.stalls.of(StallReason::ReadyQueueFull).stalls, 0);
    assert!(
        roomy
            .stats
            .stalls
            .of(StallReason::ReadyQueueFull)
            .high_water
            > 2
    );
}

fn config_error(result: Result<SemanticRun, ShimError>) -> ConfigError {
    match result {
        Err(ShimError::Run(e)) => match *e {
            RunError::Config(c) => c,
            other => panic!("expected a config error, got {other}"),
        },
        Err(other) => panic!("expected a config error, got {other}"),
        Ok(_) => panic!("expected a config error, the run passed"),
    }
}

/// Places every task on a thread that does not exist.
struct OutOfRange;

impl DispatchPolicy for OutOfRange {
    fn name(&self) -> &'static str {
        "out-of-range"
    }
    fn place(&mut self, _: &TaskInfo, threads: usize, _: &Load) -> Placement {
        Placement::Thread(threads + 5)
    }
}

#[test]
fn settings_the_runtime_cannot_honour_are_errors() {
    let w = gemm();
    let opts = RunOptions::default();
    let run = |cores: usize, sched: SchedConfig| {
        let mut arena = w.arena.clone();
        let kinds = vec![CoreKind::Cube; cores];
        run_semantic_with(&w.table, &mut arena.bytes, &kinds, &sched, &opts)
    };
    let base = SchedConfig::default();
    for threads in [0, 5] {
        let e = config_error(run(8, SchedConfig { threads, ..base }));
        assert_eq!(e, ConfigError::Threads { threads, max: 4 });
    }
    let e = config_error(run(2, SchedConfig { threads: 3, ..base }));
    assert_eq!(e, ConfigError::ThreadWithoutCores { thread: 2 });
    // Core c belongs to thread c % threads: 129 cores on 2 threads give
    // thread 0 65, one more than a thread drives (MAX_CORES, 64), which
    // semantic time used to leave idle without a word.
    let e = config_error(run(129, SchedConfig { threads: 2, ..base }));
    let want = ConfigError::ThreadCores {
        thread: 0,
        cores: 65,
        max: 64,
    };
    assert_eq!(e, want);
    run(128, SchedConfig { threads: 2, ..base }).unwrap();
    for depth in [0, 3] {
        let mut arena = w.arena.clone();
        let options = RunOptions {
            issue_depth: Some(depth),
            ..opts
        };
        let result = run_semantic_with(
            &w.table,
            &mut arena.bytes,
            &[CoreKind::Cube; 2],
            &base,
            &options,
        );
        let e = config_error(result);
        assert_eq!(e, ConfigError::IssueDepth { depth, max: 2 });
        assert!(e.to_string().contains("issue depth"), "{e}");
    }
    for depth in [0, 257] {
        let e = config_error(run(
            2,
            SchedConfig {
                queue_depth: depth,
                ..base
            },
        ));
        assert_eq!(e, ConfigError::QueueDepth { depth, max: 256 });
    }
    let mut arena = w.arena.clone();
    let kinds = [CoreKind::Cube; 2];
    let sched = SchedConfig { threads: 2, ..base };
    let result = run_semantic_custom(
        &w.table,
        &mut arena.bytes,
        &kinds,
        &sched,
        &mut OutOfRange,
        &opts,
    );
    let e = config_error(result);
    assert_eq!(
        e,
        ConfigError::BadPlacement {
            policy: "out-of-range",
            thread: 7,
            threads: 2
        }
    );
    assert!(e.to_string().contains("out-of-range"));
    // The shim refuses the same settings.
    let shim = Shim {
        sched: SchedConfig { threads: 9, ..base },
        ..Shim::default()
    };
    let mut arena = w.arena.clone();
    let err = shim.run(&w.table, &mut arena.bytes).unwrap_err();
    assert!(err.to_string().contains("9 scheduler threads"), "{err}");
}

/// Issue depth 2 queues a task behind a running one (the handshake's second
/// payload buffer); depth 1 issues to idle cores only. Both compute the
/// right result, in semantic time and in the threaded shim over mailboxes.
#[test]
fn issue_depth_two_queues_behind_running_tasks_and_one_does_not() {
    let w = gemm();
    let sched = SchedConfig {
        threads: 1,
        ..SchedConfig::default()
    };
    let options = |depth| RunOptions {
        issue_depth: Some(depth),
        ..RunOptions::default()
    };
    let queued = |stats: &RunStats| stats.threads().iter().map(|t| t.queued).sum::<u64>();
    let semantic = |depth| {
        let mut arena = w.arena.clone();
        let run = run_semantic_with(
            &w.table,
            &mut arena.bytes,
            &[CoreKind::Cube; 2],
            &sched,
            &options(depth),
        )
        .unwrap();
        let check = w.verify(&arena);
        assert!(check.passed(), "depth {depth}: {check}");
        run
    };
    let (one, two) = (semantic(1), semantic(2));
    assert_eq!(queued(&one.stats), 0);
    assert!(
        queued(&two.stats) > 0,
        "every core had a task queued behind it"
    );
    // Scheduling costs nothing in semantic time, so the queue cannot make
    // the cores finish sooner; here it does not make them later either.
    assert_eq!(one.makespan, two.makespan);
    for depth in [1, 2] {
        let shim = Shim {
            cube_cores: 2,
            vector_cores: 0,
            sched,
            options: options(depth),
            ..Shim::default()
        };
        let mut arena = w.arena.clone();
        let stats = shim.run(&w.table, &mut arena.bytes).unwrap();
        let check = w.verify(&arena);
        assert!(check.passed(), "shim, depth {depth}: {check}");
        assert_eq!(stats.tasks, 256);
        // Whether a depth-2 run finds a core that has acknowledged its task
        // depends on how the host schedules the core threads (the mailbox
        // tests check the queueing itself); depth 1 never queues.
        if depth == 1 {
            assert_eq!(queued(&stats), 0);
        }
    }
}

#[test]
fn random_dags_match_a_sequential_run_under_every_policy() {
    for seed in 1..=3 {
        let (table, data) = random_dag(seed, 400);
        let expect = in_table_order(&table, &data);
        for policy in PolicyKind::ALL {
            let sched = config(3, policy, DispatchKey::Tile { arg: 2, dim: 0 });
            let shim = Shim {
                cube_cores: 3,
                vector_cores: 3,
                sched,
                ..Shim::default()
            };
            let mut threaded = data.clone();
            let stats = shim.run(&table, &mut threaded.bytes).unwrap();
            assert_eq!(stats.tasks, 400);
            assert!(
                threaded.bytes == expect,
                "seed {seed} {policy:?}: threaded run differs"
            );
            let mut stepped = data.clone();
            let kinds = shim.core_kinds();
            run_semantic_with(
                &table,
                &mut stepped.bytes,
                &kinds,
                &sched,
                &RunOptions::default(),
            )
            .unwrap();
            assert!(
                stepped.bytes == expect,
                "seed {seed} {policy:?}: semantic run differs"
            );
        }
    }
}

/// The issue path builds a table task's kernel arguments straight from its
/// descriptors; the dispatcher and the expander build them through a
/// `TaskSpec`. Both must give a core the same views and scalars.
#[test]
fn the_issue_path_builds_the_same_kernel_arguments_as_a_task_spec() {
    use device_runtime::abi::Table;
    use device_runtime::expand::TaskSpec;
    use device_runtime::sched::{kernel_args, Arena};
    let mut checked = 0;
    // (moe's tasks come from its program, launched from records.)
    for name in ["gemm", "mlp", "streams"] {
        let w = Workload::build(name, Params::of(name).unwrap()).unwrap();
        let table = Table::parse(&w.table).unwrap();
        let mut bytes = w.arena.bytes.clone();
        let arena = Arena::new(&mut bytes);
        checked += table.tasks().len();
        for task in 0..table.tasks().len() {
            let direct = kernel_args(&table, &arena, task as u32).unwrap();
            let spec = TaskSpec::of_task(&table, task).kernel_args(&table, arena.base());
            assert_eq!(
                format!("{direct:?}"),
                format!("{spec:?}"),
                "{name} task {task}"
            );
        }
    }
    assert!(checked > 100, "{checked} tasks");
}

/// A scheduler thread keeps one `ViewCache` for the whole run: filled task
/// after task (tensors of ranks 1 to 4, more tensors than the cache has
/// slots, tasks with fewer arguments or scalars after ones with more), it
/// must give what a `TaskSpec` builds from scratch every time.
#[test]
fn a_view_cache_reused_across_tasks_builds_what_a_task_spec_builds() {
    use device_runtime::abi::Table;
    use device_runtime::expand::{TaskSpec, NO_VIEW};
    use device_runtime::sched::{Arena, ViewCache, VIEW_CACHE};
    use host_tools::table::{Arg, TableBuilder};
    use wsp_ffi::ArgAccess::{In, Out};
    use wsp_ffi::{
        WspKernelArgs, WspKernelId_WSP_KERNEL_ADD as ADD,
        WspKernelId_WSP_KERNEL_RMSNORM as RMSNORM, WspKernelId_WSP_KERNEL_SOFTMAX as SOFTMAX,
    };
    let mut b = TableBuilder::new();
    let shapes: [&[u32]; 4] = [&[64], &[4, 16], &[3, 4, 16], &[2, 3, 4, 16]];
    let tensors: Vec<_> = (0..VIEW_CACHE as u32 + 5)
        .map(|i| {
            let shape = shapes[i as usize % 4];
            (b.tensor(&format!("t{i}"), shape).unwrap(), shape.len())
        })
        .collect();
    // A 1 x 8 tile at `at` in the last dimension, one index into the others.
    let tile = |(t, rank): (host_tools::table::TensorId, usize), access, at: u32| {
        let mut offset = [0u32; 4];
        let mut extent = [1u32; 4];
        for (d, o) in offset.iter_mut().enumerate().take(rank - 1) {
            *o = (at + d as u32) % 2;
        }
        offset[rank - 1] = at % 2 * 8;
        extent[rank - 1] = 8;
        Arg {
            tensor: t,
            access,
            offset,
            extent,
        }
    };
    let n = tensors.len();
    for i in 0..3 * n {
        let (x, y, z) = (
            tensors[i % n],
            tensors[(i * 7 + 1) % n],
            tensors[(i * 5 + 3) % n],
        );
        if x.0 == z.0 || y.0 == z.0 {
            continue;
        }
        let at = i as u32;
        match i % 3 {
            0 => b.task(
                ADD,
                &[tile(x, In, at), tile(y, In, at + 1), tile(z, Out, at)],
                &[],
            ),
            1 => b.task(SOFTMAX, &[tile(x, In, at), tile(z, Out, at + 1)], &[]),
            _ => b.task(
                RMSNORM,
                &[tile(x, In, at), tile(y, In, 0), tile(z, Out, at)],
                &[1e-5f32.to_bits() as u64],
            ),
        }
        .unwrap();
    }
    let bytes = b.finish().unwrap();
    let table = Table::parse(&bytes).unwrap();
    let mut data = vec![0u8; table.arena_size() as usize];
    let arena = Arena::new(&mut data);
    let mut cache = ViewCache::new();
    let mut args = WspKernelArgs {
        num_tensors: 0,
        num_scalars: 0,
        tensors: [NO_VIEW; 4],
        scalars: [0; 4],
    };
    assert!(table.tasks().len() > 2 * VIEW_CACHE);
    for (task, desc) in table.tasks().iter().enumerate() {
        cache.fill(&table, &arena, desc, &mut args);
        let spec = TaskSpec::of_task(&table, task).kernel_args(&table, arena.base());
        assert_eq!(format!("{args:?}"), format!("{spec:?}"), "task {task}");
    }
}
