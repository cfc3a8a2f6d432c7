//! A schedule attached to a workload: per-taskset dispatch policies and
//! keys (`Workload::dispatch`) and the task window (`Workload::window`).
//! Each changes what the device does, in deterministic semantic time, and
//! malformed encodings are refused.

use device_runtime::abi::program::*;
use device_runtime::abi::{Section, Table, MAX_RANK, MAX_SCALARS, MAX_STREAMS, MAX_TENSOR_ARGS};
use device_runtime::orch::StallReason;
use device_runtime::sched::{ConfigError, DispatchKey, PolicyKind, SchedConfig};
use device_runtime::sched::{RunError, RunOptions};
use host_tools::program::{Axis, Expr, LowerError, Workload};
use host_tools::semantic::{run_semantic_with, SemanticRun};
use host_tools::shim::ShimError;
use host_tools::table::{seal, Arena, TensorId};
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD};

const T: u32 = 8;

/// `out[tile] = x[tile] + x[tile]` for tile `i` (of 64) of 64x64 tensors.
fn add_tile(w: &mut Workload, x: TensorId, out: TensorId, i: Expr) {
    let r = w.let_((i.clone() / 8) * T);
    let c = w.let_((i % 8) * T);
    w.call(
        ADD,
        &[
            x.tile(r.clone(), c.clone(), T, T),
            x.tile(r.clone(), c.clone(), T, T),
            out.tile(r, c, T, T),
        ],
        &[],
    );
}

/// Four scheduler threads with one vector core each (core c on thread c).
fn run(table: &[u8], size: u64, sched: &SchedConfig, options: &RunOptions) -> SemanticRun {
    let mut arena = Arena::zeroed(size);
    let kinds = [CoreKind::Vector; 4];
    run_semantic_with(table, &mut arena.bytes, &kinds, sched, options).unwrap()
}

fn sched(policy: PolicyKind) -> SchedConfig {
    SchedConfig {
        threads: 4,
        policy,
        key: DispatchKey::TaskIndex,
        ..SchedConfig::default()
    }
}

/// Three loops of 24 tasks, each writing its own tensor. Every task of the
/// first two has key 0 (`loop:0` of a one-iteration outer loop), so a
/// key-based policy places them all on thread 0: the first with work
/// stealing (`scheduled`), the second with affinity; the third runs with
/// the run's policy.
fn three_loops(scheduled: bool) -> (Vec<u8>, u64, Vec<TensorId>, Workload) {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let outs: Vec<TensorId> = (0..3)
        .map(|i| w.tensor(&format!("y{i}"), &[64, 64]).unwrap())
        .collect();
    let loop_of = |w: &mut Workload, out: TensorId| {
        w.parallel(Axis::Dense(1), |w, _| {
            w.parallel(Axis::Dense(24), |w, i| add_tile(w, x, out, i))
        })
    };
    let key = DispatchKey::Loop(0);
    if scheduled {
        w.dispatch(PolicyKind::WorkStealing, key, |w| loop_of(w, outs[0]));
        w.dispatch(PolicyKind::Affinity, key, |w| loop_of(w, outs[1]));
    } else {
        loop_of(&mut w, outs[0]);
        loop_of(&mut w, outs[1]);
    }
    loop_of(&mut w, outs[2]);
    let table = w.finish().unwrap();
    let size = w.arena_size();
    (table, size, outs, w)
}

/// Per output tensor, the scheduler threads (= cores) its tasks ran on.
fn threads_of(w: &Workload, outs: &[TensorId], run: &SemanticRun, base: u64) -> Vec<Vec<usize>> {
    outs.iter()
        .map(|&t| {
            let layout = w.layout(t);
            let (from, to) = (layout.arena_offset, layout.arena_offset + 64 * 64 * 4);
            let mut threads: Vec<usize> = run
                .launches
                .iter()
                .filter(|l| (from..to).contains(&(l.args.tensors[2].addr - base)))
                .map(|l| l.core)
                .collect();
            threads.sort();
            threads
        })
        .collect()
}

#[test]
fn each_taskset_runs_under_its_own_policy_and_key() {
    let (table, size, outs, w) = three_loops(true);
    let mut arena = Arena::zeroed(size);
    let base = arena.bytes.as_ptr() as u64;
    let kinds = [CoreKind::Vector; 4];
    let r = run_semantic_with(
        &table,
        &mut arena.bytes,
        &kinds,
        &sched(PolicyKind::RoundRobin),
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(r.stats.tasks, 72);
    let threads = threads_of(&w, &outs, &r, base);
    let distinct = |v: &Vec<usize>| {
        let mut d = v.clone();
        d.dedup();
        d
    };
    // Work stealing by loop:0: placed on thread 0, taken by idle threads.
    assert_eq!(threads[0].len(), 24);
    assert!(distinct(&threads[0]).len() > 1, "{:?}", threads[0]);
    // Affinity by loop:0: all on thread 0, none stolen.
    assert_eq!(distinct(&threads[1]), vec![0], "{:?}", threads[1]);
    // The run's round-robin spreads the rest.
    assert_eq!(distinct(&threads[2]), vec![0, 1, 2, 3], "{:?}", threads[2]);
    let steals: u64 = r.stats.threads().iter().map(|t| t.steals).sum();
    assert!(steals > 0);
    // The statistics name each taskset's policy and count its tasks, as the
    // host's reference expansion assigns them.
    let expected = w.expand(&arena, &[]).unwrap();
    for set in 0..3u8 {
        let stats = r.stats.tasksets[set as usize].unwrap();
        let count = expected.iter().filter(|t| t.taskset == set).count() as u64;
        assert_eq!(stats.placed, count, "taskset {set}");
        assert_eq!(count, 24);
    }
    assert_eq!(r.stats.tasksets[1].unwrap().decision, "work-stealing");
    assert_eq!(r.stats.tasksets[2].unwrap().decision, "affinity");
    assert_eq!(r.stats.tasksets[0].unwrap().decision, "round-robin");
    assert!(r.stats.tasksets[3].is_none());

    // Without the schedule, the run's policy places every loop: the
    // second loop's tasks spread over the threads.
    let (plain, size, outs, w) = three_loops(false);
    let mut arena = Arena::zeroed(size);
    let base = arena.bytes.as_ptr() as u64;
    let r = run_semantic_with(
        &plain,
        &mut arena.bytes,
        &kinds,
        &sched(PolicyKind::RoundRobin),
        &RunOptions::default(),
    )
    .unwrap();
    let threads = threads_of(&w, &outs, &r, base);
    assert_eq!(distinct(&threads[1]), vec![0, 1, 2, 3], "{:?}", threads[1]);
    assert!(r.stats.tasksets[1].is_none());
    assert!(plain.len() < table.len(), "the schedule is in the program");
}

#[test]
fn the_run_policy_applies_to_taskset_0_only() {
    // With affinity by task index as the run's policy, the program's
    // work-stealing taskset is still stolen from and its affinity taskset
    // still kept on thread 0.
    let (table, size, outs, w) = three_loops(true);
    let mut arena = Arena::zeroed(size);
    let base = arena.bytes.as_ptr() as u64;
    let r = run_semantic_with(
        &table,
        &mut arena.bytes,
        &[CoreKind::Vector; 4],
        &sched(PolicyKind::Affinity),
        &RunOptions::default(),
    )
    .unwrap();
    let threads = threads_of(&w, &outs, &r, base);
    let mut stolen = threads[0].clone();
    stolen.dedup();
    assert!(stolen.len() > 1, "{stolen:?}");
    assert!(threads[1].iter().all(|&t| t == 0), "{:?}", threads[1]);
    assert_eq!(r.stats.tasksets[0].unwrap().decision, "affinity");
}

/// 64 independent tasks.
fn independent(window: Option<u32>) -> (Vec<u8>, u64) {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    if let Some(n) = window {
        w.window(n);
    }
    w.parallel(Axis::Dense(64), |w, i| add_tile(w, x, y, i));
    (w.finish().unwrap(), w.arena_size())
}

#[test]
fn the_task_window_bounds_the_tasks_in_flight() {
    let ring = |r: &SemanticRun| r.stats.stalls.resources[StallReason::TaskRingFull as usize];
    let rr = sched(PolicyKind::RoundRobin);
    let (table, size) = independent(None);
    let open = run(&table, size, &rr, &RunOptions::default());
    // The default: the runtime's documented window.
    assert_eq!(open.stats.window, device_runtime::abi::TASK_WINDOW as u64);
    assert!(open.stats.window >= 1024);
    assert_eq!(ring(&open).high_water, 64, "all 64 in flight at once");
    assert_eq!(ring(&open).stalls, 0);

    let (table, size) = independent(Some(4));
    let four = run(&table, size, &rr, &RunOptions::default());
    assert_eq!(four.stats.tasks, 64);
    assert_eq!(four.stats.window, 4);
    assert_eq!(ring(&four).high_water, 4);
    assert_eq!(ring(&four).capacity, 4);
    assert!(ring(&four).stalls > 0);

    // A window of 1 runs the tasks one at a time, though 4 cores are idle.
    let (table1, _) = independent(Some(1));
    let one = run(&table1, size, &rr, &RunOptions::default());
    let mut spans: Vec<(u64, u64)> = one.launches.iter().map(|l| (l.start, l.end)).collect();
    spans.sort();
    assert_eq!(spans.len(), 64);
    assert!(spans.windows(2).all(|p| p[1].0 >= p[0].1), "{spans:?}");
    // Every task but the first waits for room once; none after the last.
    assert_eq!(ring(&one).stalls, 63);
    // A window as large as the run never stalls it.
    let full = RunOptions {
        window: Some(64),
        ..RunOptions::default()
    };
    let sixty_four = run(&table1, size, &rr, &full);
    assert_eq!(ring(&sixty_four).high_water, 64);
    assert_eq!(ring(&sixty_four).stalls, 0);
    assert!(
        one.makespan > 4 * open.makespan / 2,
        "{} vs {}",
        one.makespan,
        open.makespan
    );

    // A launch overrides the program's window.
    let wide = RunOptions {
        window: Some(16),
        ..RunOptions::default()
    };
    let sixteen = run(&table, size, &rr, &wide);
    assert_eq!(sixteen.stats.window, 16);
    assert_eq!(ring(&sixteen).high_water, 16);

    // Out of range: at launch and when lowering.
    const MAX: usize = device_runtime::abi::TASK_WINDOW;
    for bad in [0, MAX + 1] {
        let options = RunOptions {
            window: Some(bad),
            ..RunOptions::default()
        };
        let mut arena = Arena::zeroed(size);
        let e = run_semantic_with(
            &table,
            &mut arena.bytes,
            &[CoreKind::Vector; 4],
            &rr,
            &options,
        )
        .unwrap_err();
        assert!(
            matches!(
                &e,
                ShimError::Run(run) if matches!(
                    **run,
                    RunError::Config(ConfigError::Window { tasks, max: MAX }) if tasks == bad
                )
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains(&format!("1 to {MAX}")), "{e}");
    }
    for bad in [0, MAX as u32 + 44] {
        let mut w = Workload::new();
        w.window(bad);
        let e = w.finish().unwrap_err();
        assert!(matches!(e, LowerError::Schedule(_)), "{e}");
        assert!(e.to_string().contains(&format!("1 to {MAX}")), "{e}");
    }
}

#[test]
fn more_tasksets_than_the_device_keeps_do_not_lower() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    for n in 0..MAX_TASKSETS as u8 {
        w.dispatch(PolicyKind::Hash, DispatchKey::Loop(n), |w| {
            add_tile(w, x, y, Expr::Const(n as i64))
        });
    }
    let e = w.finish().unwrap_err();
    assert!(matches!(e, LowerError::Schedule(_)), "{e}");
    assert!(e.to_string().contains("at most 7"), "{e}");
}

/// A schedule setting that would change nothing, or name what no task
/// has, is refused when the workload lowers (it used to lower: a key given
/// to round-robin or the shared queue was dropped, a stream past 8 with no
/// call in its body was dropped, and an impossible key reached validation
/// as a number).
#[test]
fn schedule_settings_that_would_be_ignored_do_not_lower() {
    let lower = |build: &dyn Fn(&mut Workload, TensorId, TensorId)| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        build(&mut w, x, y);
        w.finish()
    };
    let in_loop = |w: &mut Workload, x, y| {
        w.parallel(Axis::Dense(2), |w, i| add_tile(w, x, y, i));
    };
    for policy in [PolicyKind::RoundRobin, PolicyKind::Shared] {
        let e = lower(&|w, x, y| w.dispatch(policy, DispatchKey::Loop(0), |w| in_loop(w, x, y)))
            .unwrap_err();
        assert!(matches!(e, LowerError::Schedule(_)), "{e}");
        let text = e.to_string();
        assert!(text.contains("dispatch key loop:0"), "{text}");
        assert!(
            text.contains(&format!("{} places tasks without a key", policy.name())),
            "{text}"
        );
        // Without a key it lowers.
        lower(&|w, x, y| w.dispatch(policy, DispatchKey::TaskIndex, |w| in_loop(w, x, y))).unwrap();
    }
    for key in [
        DispatchKey::Scalar(MAX_SCALARS as u8),
        DispatchKey::Tile {
            arg: MAX_TENSOR_ARGS as u8,
            dim: 0,
        },
        DispatchKey::Tile {
            arg: 0,
            dim: MAX_RANK as u8,
        },
        DispatchKey::Loop(MAX_LOOP_DEPTH as u8),
    ] {
        let e =
            lower(&|w, x, y| w.dispatch(PolicyKind::Hash, key, |w| in_loop(w, x, y))).unwrap_err();
        assert!(matches!(e, LowerError::Schedule(_)), "{key}: {e}");
        assert!(e.to_string().contains("no task has it"), "{e}");
    }
    // A stream past the last: refused even with no call in its body.
    let over = MAX_STREAMS as u8 + 1;
    for calls in [true, false] {
        let e = lower(&|w, x, y| {
            w.on_stream(over, |w| {
                if calls {
                    in_loop(w, x, y)
                }
            });
            in_loop(w, x, y)
        })
        .unwrap_err();
        assert!(matches!(e, LowerError::Stream(_)), "{e}");
        assert!(e.to_string().contains(&format!("on_stream({over})")), "{e}");
    }
    lower(&|w, x, y| w.on_stream(MAX_STREAMS as u8, |w| in_loop(w, x, y))).unwrap();
    // Stream 0 is none, also inside another stream's body.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.on_stream(3, |w| {
        add_tile(w, x, y, Expr::Const(0));
        w.on_stream(0, |w| add_tile(w, x, y, Expr::Const(1)));
    });
    w.finish().unwrap();
    let tasks = w.expand(&Arena::zeroed(w.arena_size()), &[]).unwrap();
    let streams: Vec<u8> = tasks.iter().map(|t| t.stream).collect();
    assert_eq!(streams, [3, 0]);
}

/// The bytes of instruction `pc` of a built table.
fn instr(table: &mut [u8], pc: usize) -> &mut [u8] {
    let offset = u32::from_le_bytes(table[72..76].try_into().unwrap()) as usize + pc * 16;
    &mut table[offset..offset + 16]
}

#[test]
fn malformed_schedules_are_refused_with_the_instruction_named() {
    let (good, _, _, _) = three_loops(true);
    let table = Table::parse(&good).unwrap();
    let ops: Vec<u8> = table.program().iter().map(|i| i.op).collect();
    let dispatch: Vec<usize> = (0..ops.len())
        .filter(|&pc| ops[pc] == OP_DISPATCH)
        .collect();
    // Two tasksets: enter 1, back to 0, enter 2, back to 0.
    assert_eq!(dispatch.len(), 4);
    assert_eq!(table.program_info().tasksets_defined, 0b111);
    let (first, back) = (dispatch[0], dispatch[1]);
    type Edit = Box<dyn Fn(&mut [u8])>;
    let cases: Vec<(usize, Edit, &str)> = vec![
        // An unknown policy, key kind, or out-of-range key parameter.
        (
            first,
            Box::new(|i: &mut [u8]| i[12] = 9),
            "not a known dispatch policy",
        ),
        (
            first,
            Box::new(|i: &mut [u8]| i[13] = 7),
            "not a known dispatch policy",
        ),
        (
            first,
            Box::new(|i: &mut [u8]| i[14] = 8),
            "not a known dispatch policy",
        ),
        // Round-robin (policy 0) with the taskset's key, loop:0: the key
        // would be ignored.
        (
            first,
            Box::new(|i: &mut [u8]| i[12] = 0),
            "a key to a policy that places tasks without one",
        ),
        // Taskset 0 is the run's: it has no schedule of its own.
        (
            back,
            Box::new(|i: &mut [u8]| i[12] = 1),
            "taskset 0's must be 0",
        ),
        (
            first,
            Box::new(|i: &mut [u8]| i[8] = MAX_TASKSETS as u8),
            "outside [0, 7]",
        ),
        // The second taskset's DISPATCH names the first with another schedule.
        (
            dispatch[2],
            Box::new(|i: &mut [u8]| i[8] = 1),
            "another schedule",
        ),
        (first, Box::new(|i: &mut [u8]| i[2] = 0), "register operand"),
    ];
    for (pc, edit, text) in cases {
        let mut t = good.clone();
        edit(instr(&mut t, pc));
        seal(&mut t);
        let e = Table::parse(&t).unwrap_err();
        assert_eq!(e.section, Section::Program, "{e}");
        assert_eq!(e.index, pc as u32, "{e}");
        assert!(e.to_string().contains(text), "{e} (wanted {text})");
    }

    // Two WINDOWs, and a window of 0.
    let (good, _) = independent(Some(4));
    let table = Table::parse(&good).unwrap();
    assert_eq!(table.program_info().window, 4);
    assert_eq!(table.program()[0].op, OP_WINDOW);
    let mut t = good.clone();
    instr(&mut t, 0)[8] = 0;
    seal(&mut t);
    let e = Table::parse(&t).unwrap_err();
    let range = format!("outside [1, {}]", device_runtime::abi::TASK_WINDOW);
    assert!(e.to_string().contains(&range), "{e}");
    let mut t = good.clone();
    let window: Vec<u8> = instr(&mut t, 0).to_vec();
    instr(&mut t, 1).copy_from_slice(&window);
    seal(&mut t);
    let e = Table::parse(&t).unwrap_err();
    assert!(e.to_string().contains("a second WINDOW"), "{e}");
}

#[test]
fn inspect_shows_the_schedule() {
    let (table, _, _, _) = three_loops(true);
    let text = host_tools::inspect::inspect(&table, false);
    assert!(
        text.contains("dispatch taskset 1: policy work-stealing, key loop:0"),
        "{text}"
    );
    assert!(
        text.contains("dispatch taskset 2: policy affinity, key loop:0"),
        "{text}"
    );
    let (table, _) = independent(Some(4));
    let text = host_tools::inspect::inspect(&table, false);
    assert!(text.contains("task window 4"), "{text}");
}

/// Four batches of 6 tasks, batch `b` on stream `stream(b)`.
fn streams_by_batch(stream: impl Fn(Expr) -> Expr) -> (Vec<u8>, u64, TensorId, Workload) {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::Dense(4), |w, b| {
        w.on_stream_of(stream(b.clone()), |w| {
            w.parallel(Axis::Dense(6), |w, i| add_tile(w, x, y, b * 8 + i))
        })
    });
    let table = w.finish().unwrap();
    let size = w.arena_size();
    (table, size, y, w)
}

#[test]
fn a_stream_key_computed_from_the_loop_index_puts_each_batch_on_its_stream() {
    let (table, size, y, w) = streams_by_batch(|b| b + 1);
    let text = host_tools::inspect::inspect(&table, false);
    assert!(text.contains("call add on stream r"), "{text}");
    let mut arena = Arena::zeroed(size);
    let base = arena.bytes.as_ptr() as u64 + w.layout(y).arena_offset;
    let by_stream = SchedConfig {
        key: DispatchKey::Stream,
        ..sched(PolicyKind::Affinity)
    };
    let r = run_semantic_with(
        &table,
        &mut arena.bytes,
        &[CoreKind::Vector; 4],
        &by_stream,
        &RunOptions::default(),
    )
    .unwrap();
    assert_eq!(r.stats.tasks, 24);
    // Tile t of y is at row block t / 8, column block t % 8.
    let tile_of = |addr: u64| {
        let at = (addr - base) / 4;
        (at / (64 * 8) * 8 + at % 64 / 8) as i64
    };
    let mut per_batch = vec![Vec::new(); 4];
    for l in &r.launches {
        let t = tile_of(l.args.tensors[2].addr);
        per_batch[(t / 8) as usize].push((t % 8, l.core, l.issued));
    }
    for (b, launches) in per_batch.iter_mut().enumerate() {
        assert_eq!(launches.len(), 6);
        // Affinity by stream: the batch's stream b + 1 on thread (b + 1) % 4.
        assert!(
            launches.iter().all(|&(_, core, _)| core == (b + 1) % 4),
            "batch {b}: {launches:?}"
        );
        // A stream issues in program order.
        launches.sort();
        assert!(
            launches.windows(2).all(|p| p[0].2 <= p[1].2),
            "batch {b}: {launches:?}"
        );
    }
    let expected = w.expand(&arena, &[]).unwrap();
    let streams: Vec<u8> = expected.iter().map(|t| t.stream).collect();
    assert_eq!(streams, [1, 2, 3, 4].map(|s| [s; 6]).concat());

    // A stream out of range ends the run, naming the call.
    let (table, size, _, _) = streams_by_batch(|b| b + 6);
    let mut arena = Arena::zeroed(size);
    let e = run_semantic_with(
        &table,
        &mut arena.bytes,
        &[CoreKind::Vector; 4],
        &by_stream,
        &RunOptions::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("stream 9; streams are 1 to 8"),
        "{e}"
    );
}

/// A run whose dispatch key names a scalar, argument, dimension or loop
/// that one of its tasks lacks fails before anything runs, naming the key
/// and the first task or call that lacks it; it does not give such tasks
/// key 0.
#[test]
fn a_run_key_that_a_task_lacks_is_refused_at_the_start() {
    let expect = |table: &[u8], size: u64, key: DispatchKey| {
        let mut arena = Arena::zeroed(size);
        let config = SchedConfig {
            threads: 2,
            policy: PolicyKind::Affinity,
            key,
            ..SchedConfig::default()
        };
        let kinds = [CoreKind::Cube, CoreKind::Vector, CoreKind::Vector];
        let run = run_semantic_with(
            table,
            &mut arena.bytes,
            &kinds,
            &config,
            &RunOptions::default(),
        );
        match run {
            Err(ShimError::Run(e)) => *e,
            Err(e) => panic!("{key}: {e}"),
            Ok(run) => panic!("{key} ran {} tasks", run.stats.tasks),
        }
    };
    // `wsp run gemm --key scalar:9`: tasks of the tasks section.
    let gemm = host_tools::workloads::Workload::build("gemm", Default::default()).unwrap();
    let size = gemm.arena.bytes.len() as u64;
    let err = expect(&gemm.table, size, DispatchKey::Scalar(9));
    let RunError::KeyNotInTask {
        key,
        taskset: 0,
        task: Some(0),
        pc: None,
        what: "scalars",
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    assert_eq!(key, DispatchKey::Scalar(9));
    let text = format!("{err}");
    assert!(
        text.contains("scalar:9") && text.contains("task 0"),
        "{text}"
    );
    let err = expect(&gemm.table, size, DispatchKey::Tile { arg: 7, dim: 0 });
    assert!(
        matches!(
            err,
            RunError::KeyNotInTask {
                what: "tensor arguments",
                has: 3,
                ..
            }
        ),
        "{err:?}"
    );
    // Task records have no loops around them: a loop key is refused (it
    // used to read as 0 for every task, one thread, without a word).
    let err = expect(&gemm.table, size, DispatchKey::Loop(0));
    let want = RunError::KeyNotInTask {
        key: DispatchKey::Loop(0),
        taskset: 0,
        task: Some(0),
        pc: None,
        has: 0,
        what: "loops around its call",
    };
    assert_eq!(err, want);

    // Some tasks have it, some do not: mlp's GEMM tasks have a third tensor
    // argument, its RMSNorm tasks only two. The run is refused (it used to
    // give the RMSNorm tasks key 0, one thread, without a word).
    let mlp = host_tools::workloads::Workload::build(
        "mlp",
        host_tools::workloads::Params::of("mlp").unwrap(),
    )
    .unwrap();
    let mlp_size = mlp.arena.bytes.len() as u64;
    let err = expect(&mlp.table, mlp_size, DispatchKey::Tile { arg: 2, dim: 0 });
    let RunError::KeyNotInTask {
        task: Some(task),
        has: 2,
        what: "tensor arguments",
        ..
    } = err
    else {
        panic!("{err:?}");
    };
    let lacking = Table::parse(&mlp.table).unwrap().tasks()[task as usize];
    assert_eq!(lacking.num_args.get(), 2, "task {task}");
    // A policy that places without a key neither computes nor checks one,
    // and a key given with it is refused: it would be ignored.
    let mut arena = mlp.arena.clone();
    let kinds = [CoreKind::Cube, CoreKind::Vector, CoreKind::Vector];
    let options = RunOptions::default();
    for policy in [PolicyKind::RoundRobin, PolicyKind::Shared] {
        let keyed = SchedConfig {
            threads: 2,
            policy,
            key: DispatchKey::Tile { arg: 2, dim: 0 },
            ..SchedConfig::default()
        };
        let err = run_semantic_with(&mlp.table, &mut arena.bytes, &kinds, &keyed, &options)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "dispatch key tile:2:0 with the {} policy",
                policy.name()
            )) && err.contains("it would be ignored"),
            "{err}"
        );
    }
    assert_eq!(
        arena.bytes, mlp.arena.bytes,
        "a refused run changes nothing"
    );
    let round_robin = SchedConfig {
        threads: 2,
        policy: PolicyKind::RoundRobin,
        ..SchedConfig::default()
    };
    run_semantic_with(&mlp.table, &mut arena.bytes, &kinds, &round_robin, &options).unwrap();
    assert!(mlp.verify(&arena).passed());

    // Program calls: one loop around each `ADD` of 2-D tiles, no scalars.
    let (table, size, _, _) = three_loops(false);
    let call = Table::parse(&table)
        .unwrap()
        .program()
        .iter()
        .position(|i| i.op == OP_CALL);
    let call = call.map(|pc| pc as u32);
    for (key, has, what) in [
        (DispatchKey::Loop(2), 2, "loops around its call"),
        (DispatchKey::Scalar(0), 0, "scalars"),
        (DispatchKey::Tile { arg: 3, dim: 0 }, 3, "tensor arguments"),
        (
            DispatchKey::Tile { arg: 2, dim: 2 },
            2,
            "dimensions in that tensor argument",
        ),
    ] {
        let err = expect(&table, size, key);
        let want = RunError::KeyNotInTask {
            key,
            taskset: 0,
            task: None,
            pc: call,
            has,
            what,
        };
        assert_eq!(err, want, "{key}");
        assert!(format!("{err}").contains("program instruction"), "{err}");
    }
    // Keys the tasks have run.
    for key in [DispatchKey::Loop(1), DispatchKey::Tile { arg: 2, dim: 1 }] {
        run(
            &table,
            size,
            &SchedConfig {
                key,
                ..sched(PolicyKind::Affinity)
            },
            &RunOptions::default(),
        );
    }
}

/// A program taskset's key is checked against the calls of its
/// `DISPATCH` the same way.
#[test]
fn a_taskset_key_that_a_call_lacks_is_refused_at_the_start() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.dispatch(PolicyKind::WorkStealing, DispatchKey::Scalar(1), |w| {
        w.parallel(Axis::Dense(4), |w, i| add_tile(w, x, y, i))
    });
    let table = w.finish().unwrap();
    let mut arena = Arena::zeroed(w.arena_size());
    let kinds = [CoreKind::Vector; 4];
    let config = sched(PolicyKind::RoundRobin);
    let options = RunOptions::default();
    let Err(err) = run_semantic_with(&table, &mut arena.bytes, &kinds, &config, &options) else {
        panic!("a key the tasks lack ran");
    };
    let ShimError::Run(err) = err else {
        panic!("{err}")
    };
    let RunError::KeyNotInTask {
        taskset: 1,
        task: None,
        pc: Some(_),
        has: 0,
        what: "scalars",
        ..
    } = *err
    else {
        panic!("{err:?}");
    };
}
