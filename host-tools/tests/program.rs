//! The workload program: each axis and loop kind expanded on the device
//! (shim and semantic time) against the host's reference expansion of the
//! same loops, and bad programs refused with errors that say why.

use device_runtime::abi::launch::Symbols;
use device_runtime::abi::program::*;
use device_runtime::abi::Section;
use device_runtime::expand::ExpandError;
use device_runtime::sched::{RunError, RunOptions};
use host_tools::program::{Axis, Expr, LowerError, Workload};
use host_tools::semantic::run_semantic;
use host_tools::shim::{Shim, ShimError};
use host_tools::table::{seal, Arena, BuildError, TensorId};
use wsp_ffi::{CoreKind, WspKernelId_WSP_KERNEL_ADD as ADD};

use host_tools::program_examples::{self as examples, add_tile, T};

fn options(symbols: &[i64]) -> RunOptions {
    RunOptions {
        symbols: Symbols::new(symbols).unwrap(),
        ..RunOptions::default()
    }
}

fn run_shim(table: &[u8], arena: &mut Arena, symbols: &[i64]) -> Result<u64, ShimError> {
    let shim = Shim {
        options: options(symbols),
        ..Shim::default()
    };
    shim.run(table, &mut arena.bytes).map(|s| s.tasks)
}

#[test]
fn dense_and_dense_dyn_axes_expand_on_the_device() {
    let mut ex = examples::dense_dyn();
    let table = ex.w.finish().unwrap();
    for rows in [0i64, 2, 5, 8] {
        let mut arena = ex.arena(None);
        let tasks = run_shim(&table, &mut arena, &[rows]).unwrap();
        assert_eq!(tasks, rows as u64 * 3, "rows = {rows}");
        // The tiles the reference writes, with the right values.
        assert_eq!(ex.check(&arena, &[rows]), Ok(tasks as usize));
        assert_eq!(ex.written_tiles(&arena).len(), rows as usize * 3);
    }
    // The same table with the symbol unbound, or out of the axis' bound.
    let mut arena = ex.arena(None);
    let e = run_shim(&table, &mut arena, &[]).unwrap_err();
    assert!(
        matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::UnboundSymbols { needed: 1, bound: 0 })),
        "{e}"
    );
    let e = run_shim(&table, &mut arena, &[9]).unwrap_err();
    assert!(
        matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::Expand { why: ExpandError::BadCount { count: 9, max: 8 }, .. })),
        "{e}"
    );
    assert!(e.to_string().contains("loop count 9 outside [0, 8]"), "{e}");
}

#[test]
fn ragged_axes_and_when_follow_the_data() {
    let mut ex = examples::ragged();
    let table = ex.w.finish().unwrap();
    for lens in [
        [0, 1, 2, 3, 4, 5, 6, 8],
        [4, 4, 4, 4, 0, 0, 0, 0],
        [8, 7, 1, 0, 5, 2, 3, 4],
    ] {
        let mut arena = ex.arena(Some(&lens));
        let tasks = run_shim(&table, &mut arena, &[]).unwrap();
        let short: u64 = lens.iter().filter(|&&l| l <= 4).map(|&l| l as u64).sum();
        let long = lens.iter().filter(|&&l| l > 4).count() as u64;
        assert_eq!(tasks, short + long, "{lens:?}");
        // Tiles and values against the reference expansion, and the long
        // row blocks (only those) softmaxed.
        assert_eq!(ex.check(&arena, &[]), Ok(tasks as usize), "{lens:?}");
    }
    // A negative length is an error naming the instruction, not a silent 0.
    let mut arena = ex.arena(Some(&[1, 1, 1, -3, 1, 1, 1, 1]));
    let e = run_shim(&table, &mut arena, &[]).unwrap_err();
    assert!(
        e.to_string().contains("loop count -3 outside [0, 8]"),
        "{e}"
    );
}

#[test]
fn the_device_expansion_matches_the_host_reference_task_for_task() {
    let mut ex = examples::ragged();
    let table = ex.w.finish().unwrap();
    let mut arena = ex.arena(Some(&[3, 0, 6, 2, 8, 1, 4, 5]));
    let kinds = [CoreKind::Cube, CoreKind::Vector, CoreKind::Vector];
    let run = run_semantic(&table, &mut arena.bytes, &kinds, &options(&[])).unwrap();
    let expected = ex.w.expand(&arena, &[]).unwrap();
    // Each launch's first argument view identifies its task: compare the
    // kernels and the views' shapes, in sorted order.
    let mut device: Vec<(u32, u32, u32)> = run
        .launches
        .iter()
        .map(|l| (l.kernel_id, l.args.tensors[0].rows, l.args.tensors[0].cols))
        .collect();
    let mut host: Vec<(u32, u32, u32)> = expected
        .iter()
        .map(|t| (t.kernel, t.args[0].2[0], t.args[0].2[1]))
        .collect();
    device.sort();
    host.sort();
    assert_eq!(device, host);
}

#[test]
fn a_sequential_loop_waits_for_each_iteration_and_a_parallel_one_does_not() {
    let build = |sequential: bool| {
        let mut ex = examples::column(sequential);
        (ex.w.finish().unwrap(), ex.w.arena_size())
    };
    let kinds = [CoreKind::Vector; 4];
    let mut makespans = Vec::new();
    for sequential in [false, true] {
        let (table, size) = build(sequential);
        let mut arena = Arena::zeroed(size);
        let run = run_semantic(&table, &mut arena.bytes, &kinds, &options(&[])).unwrap();
        assert_eq!(run.stats.tasks, 8);
        // Sequential: no two launches overlap in time.
        let mut spans: Vec<(u64, u64)> = run.launches.iter().map(|l| (l.start, l.end)).collect();
        spans.sort();
        let overlap = spans.windows(2).any(|p| p[1].0 < p[0].1);
        assert_eq!(overlap, !sequential, "sequential = {sequential}: {spans:?}");
        makespans.push(run.makespan);
    }
    assert!(makespans[1] > 2 * makespans[0], "{makespans:?}");
}

fn refused(program: &[u8]) -> device_runtime::abi::TableError {
    device_runtime::abi::Table::parse(program).unwrap_err()
}

/// The bytes of instruction `pc` of a built table.
fn instr(table: &mut [u8], pc: usize) -> &mut [u8] {
    // The program's section ref is the header's last field (bytes 72..80).
    let offset = u32::from_le_bytes(table[72..76].try_into().unwrap()) as usize + pc * 16;
    &mut table[offset..offset + 16]
}

#[test]
fn malformed_programs_are_refused_with_the_instruction_named() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::Dense(2), |w, i| add_tile(w, x, y, i, Expr::Const(0)));
    let good = w.finish().unwrap();
    // Find the LOOP and END.
    let code: Vec<u8> = (0..MAX_PROGRAM)
        .map_while(|pc| {
            let mut t = good.clone();
            let off = u32::from_le_bytes(t[72..76].try_into().unwrap()) as usize + pc * 16;
            (off + 16 <= t.len()).then(|| instr(&mut t, pc)[0])
        })
        .collect();
    let loop_pc = code.iter().position(|&op| op == OP_LOOP).unwrap();
    let end_pc = code.iter().position(|&op| op == OP_END).unwrap();
    type Edit = Box<dyn Fn(&mut [u8])>;
    let cases: Vec<(usize, Edit, &str)> = vec![
        (0, Box::new(|i: &mut [u8]| i[0] = 99), "unknown opcode 99"),
        (
            loop_pc,
            Box::new(|i: &mut [u8]| i[1] = 40),
            "register operand",
        ),
        (
            end_pc,
            Box::new(|i: &mut [u8]| i[8] = 0),
            "END does not match",
        ),
        (
            end_pc,
            Box::new(|i: &mut [u8]| i[0] = OP_JUMP),
            "does not name its END",
        ),
    ];
    for (pc, edit, text) in cases {
        let mut t = good.clone();
        edit(instr(&mut t, pc));
        seal(&mut t);
        let e = refused(&t);
        assert_eq!(e.section, Section::Program, "{e}");
        assert!(e.to_string().contains(text), "{e} (wanted {text})");
    }
}

#[test]
fn workloads_that_cannot_lower_say_why() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.call(ADD, &[x.tile(0, 0, 8, 8), y.tile(0, 0, 8, 8)], &[]);
    let e = w.finish().unwrap_err();
    assert!(matches!(e, LowerError::Call { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("2 tensor arguments, the kernel takes 3"),
        "{e}"
    );

    // Loading from an f32 tensor.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    w.parallel(
        Axis::Ragged {
            lengths: x,
            at: vec![Expr::Const(0), Expr::Const(0)],
            max: 4,
        },
        |_, _| {},
    );
    let e = w.finish().unwrap_err();
    assert!(
        e.to_string().contains("only i32 tensors can be loaded"),
        "{e}"
    );

    // Loading data nobody writes: refused by validation, with the tensor named.
    let mut w = Workload::new();
    let lengths = w.tensor_i32("lengths", &[1, 4]).unwrap();
    w.parallel(
        Axis::Ragged {
            lengths,
            at: vec![Expr::Const(0), Expr::Const(1)],
            max: 4,
        },
        |_, _| {},
    );
    let e = w.finish().unwrap_err();
    assert!(
        e.to_string()
            .contains("no task writes and no INPUT declares"),
        "{e}"
    );

    // A region past the tensor: refused on the device when the loop reaches it.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::Dense(9), |w, i| add_tile(w, x, y, i, Expr::Const(0)));
    let table = w.finish().unwrap();
    let mut arena = Arena::zeroed(w.arena_size());
    let e = run_shim(&table, &mut arena, &[]).unwrap_err();
    assert!(
        matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::Expand { why: ExpandError::BadRegion { arg: 0, .. }, .. })),
        "{e}"
    );
    assert!(e.to_string().contains("past the tensor's size 64"), "{e}");
}

/// The MoE layer: which expert tasks exist depends on the router's output,
/// computed on the device; the result matches the f64 reference for
/// several inputs, and a wrong expert choice is caught.
#[test]
fn moe_expert_choice_follows_the_data_and_matches_the_reference() {
    use host_tools::workloads::{Params, Workload as Named};
    let mut counts = std::collections::BTreeSet::new();
    let mut routings = std::collections::BTreeSet::new();
    for name in ["moe", "moe-var"] {
        for seed in 1..=4 {
            let params = Params {
                m: 32,
                n: 32,
                k: 64,
                tile: 32,
                seed,
            };
            let w = Named::build(name, params).unwrap();
            let mut arena = w.arena.clone();
            let tasks = Shim::default()
                .run(&w.table, &mut arena.bytes)
                .unwrap()
                .tasks;
            assert_eq!(tasks as usize, w.tasks, "{name} seed {seed}");
            let check = w.verify(&arena);
            assert!(check.passed(), "{name} seed {seed}: {check}");
            let indptr = w.tensors.iter().find(|t| t.name == "indptr").unwrap();
            routings.insert(arena.read_i32(indptr));
            counts.insert((name, tasks));
            if name == "moe" {
                assert_eq!(tasks, 2 + 32 * 2, "top-2: two expert tasks per token");
            }
            // Tamper with the expert choice: the check names the routing.
            let tokens = w.tensors.iter().find(|t| t.name == "tokens").unwrap();
            let mut chosen = arena.read_i32(tokens);
            let other = 1 + chosen[1..].iter().position(|&t| t != chosen[0]).unwrap();
            chosen.swap(0, other);
            let mut bad = arena.clone();
            bad.write_i32(tokens, &chosen);
            let check = w.verify(&bad);
            assert!(
                !check.passed() && check.output.starts_with("routing"),
                "{check}"
            );
        }
    }
    assert!(
        routings.len() >= 6,
        "the routing depends on the input: {routings:?}"
    );
    let var: Vec<_> = counts.iter().filter(|(n, _)| *n == "moe-var").collect();
    assert!(
        var.len() >= 2,
        "moe-var's task count depends on the data: {var:?}"
    );
}

#[test]
fn inspect_shows_the_program_as_loops_and_counts_its_tasks() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::DenseDyn { symbol: 0, max: 8 }, |w, i| {
        w.sequential(Axis::Dense(3), |w, j| add_tile(w, x, y, i, j))
    });
    let table = w.finish().unwrap();
    let text = host_tools::inspect::inspect(&table, false);
    for want in [
        "parallel r",
        "sequential r",
        "call add",
        "in x[at",
        "out y[at",
        "symbol 0",
    ] {
        assert!(text.contains(want), "{want} in:\n{text}");
    }
    // Without the symbol, 0 to 8 iterations of 3 tasks; with it, the
    // device's expander counts.
    assert!(
        text.contains("between 0 and 24 tasks (depending on symbols not bound here)"),
        "{text}"
    );
    let parsed = device_runtime::abi::Table::parse(&table).unwrap();
    let n = host_tools::inspect::expanded_tasks(&parsed, None, &[5]).unwrap();
    assert_eq!(n, 15);
    // A program that loads data computed at run time is counted as far as
    // the loops' maxima go: the GEMM and the router, then 0 to 32 tokens
    // for each of 8 experts.
    let params = host_tools::workloads::Params::of("moe").unwrap();
    let moe = host_tools::workloads::Workload::build("moe", params).unwrap();
    let text = host_tools::inspect::inspect(&moe.table, false);
    assert!(
        text.contains("between 2 and 258 tasks (depending on data read at run time)"),
        "{text}"
    );
    assert!(text.contains("(waits for its writers)"), "{text}");
}

/// The host counts a table's tasks with the arena at launch: data the
/// program declares `INPUT` is read from it, data a run writes is not
/// (the MoE router's counts, above, are a range). The ragged example's
/// lengths 1, 2, 3, 0, 4, 6, 8, 2: rows of at most 4 run that many adds
/// (1 + 2 + 3 + 0 + 4 + 2 = 12), the rows of 6 and 8 one softmax each:
/// 14 tasks, which a run on the shim runs.
#[test]
fn the_host_counts_with_the_inputs_of_the_arena_at_launch() {
    let mut ex = examples::ragged();
    let table = ex.w.finish().unwrap();
    let parsed = device_runtime::abi::Table::parse(&table).unwrap();
    let mut arena = ex.arena(Some(&[1, 2, 3, 0, 4, 6, 8, 2]));
    let count = |arena| host_tools::task_count::count_tasks(&parsed, arena, &[]).unwrap();
    assert_eq!(
        count(Some(&arena.bytes)),
        host_tools::task_count::TaskCount::Exact(14)
    );
    assert!(
        count(None).to_string().contains("data read at run time"),
        "{}",
        count(None)
    );
    assert_eq!(run_shim(&table, &mut arena, &[]).unwrap(), 14);
}

/// A run's task limit (`RunOptions::max_tasks`) bounds a run whose length
/// data computed on the device decides, which the host can only count as
/// a range: the MoE layer (the router, then two expert tasks per token for
/// 32 tokens, 66 tasks; the host counts 2 to 258) runs and checks within
/// a limit of exactly 66, and a limit of 65 ends the run with an error
/// naming it, on the shim's threads and in semantic time; a limit of 0 or
/// past 2^32 is refused before the run.
#[test]
fn a_task_limit_bounds_a_run_whose_length_the_data_decides() {
    use device_runtime::sched::{ConfigError, SchedConfig, MAX_RUN_TASKS};
    use host_tools::semantic::run_semantic_with;
    use host_tools::workloads::{Params, Workload as Named};
    let params = Params {
        m: 32,
        n: 32,
        k: 64,
        tile: 32,
        seed: 1,
    };
    let w = Named::build("moe", params).unwrap();
    let parsed = device_runtime::abi::Table::parse(&w.table).unwrap();
    let counted = host_tools::task_count::count_tasks(&parsed, Some(&w.arena.bytes), &[]);
    assert_eq!(
        counted.unwrap().to_string(),
        "between 2 and 258 tasks (depending on data read at run time)"
    );
    let limit = |max| RunOptions {
        max_tasks: max,
        ..RunOptions::default()
    };
    let shim = |max| {
        let mut arena = w.arena.clone();
        let shim = Shim {
            options: limit(max),
            ..Shim::default()
        };
        let run = shim.run(&w.table, &mut arena.bytes).map(|s| s.tasks);
        (run, arena)
    };
    let semantic = |max| {
        let mut arena = w.arena.clone();
        let kinds = Shim::default().core_kinds();
        run_semantic_with(
            &w.table,
            &mut arena.bytes,
            &kinds,
            &SchedConfig::default(),
            &limit(max),
        )
        .map(|r| r.stats.tasks)
    };
    let (ran, arena) = shim(Some(66));
    assert_eq!(ran.unwrap(), 66);
    assert!(w.verify(&arena).passed());
    assert_eq!(semantic(Some(66)).unwrap(), 66);
    for e in [
        shim(Some(65)).0.unwrap_err(),
        semantic(Some(65)).unwrap_err(),
    ] {
        assert!(
            matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::TooManyTasks { max: 65 })),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("more than 65 tasks, the most this run was allowed"),
            "{e}"
        );
    }
    for bad in [0, MAX_RUN_TASKS + 1] {
        let e = shim(Some(bad)).0.unwrap_err();
        assert!(
            matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::Config(ConfigError::MaxTasks { tasks, max: MAX_RUN_TASKS }) if tasks == bad)),
            "{e}"
        );
        assert!(
            e.to_string().contains("1 to 4294967296 are supported"),
            "{e}"
        );
    }
    assert_eq!(shim(Some(MAX_RUN_TASKS)).0.unwrap(), 66);
}

/// `moe_with`'s routing settings out of range are errors naming them, not
/// panics in the data's search or the reference.
#[test]
fn moe_routing_settings_out_of_range_are_refused() {
    use host_tools::moe::moe_with;
    use host_tools::workloads::Params;
    let p = Params::of("moe").unwrap();
    for (top, threshold, why) in [
        (0, 0.0, "top = 0 experts per token must be in 1..=8"),
        (9, 0.0, "top = 9 experts per token must be in 1..=8"),
        (2, 1.0, "threshold = 1 must be in [0, 1)"),
        (2, -0.5, "threshold = -0.5 must be in [0, 1)"),
        (2, f32::NAN, "threshold = NaN must be in [0, 1)"),
    ] {
        let e = moe_with("moe", p, top, threshold, None).err().unwrap();
        assert!(e.to_string().contains(why), "{e}");
    }
    // The ends of the ranges are taken.
    assert!(moe_with("moe", p, 8, 0.0, None).is_ok());
    assert!(moe_with("moe", p, 1, 0.0, None).is_ok());
}

/// `DispatchKey::Loop(0)` with affinity, as the expert loop's own taskset,
/// keeps each expert of the MoE layer on one scheduler thread; the
/// task-index key spreads them. (As the run's key, `loop:0` is refused:
/// the router's calls sit in no loop.)
#[test]
fn a_loop_index_key_keeps_an_expert_on_one_thread() {
    use device_runtime::sched::{DispatchKey, PolicyKind, RunError, SchedConfig, Schedule};
    use host_tools::moe::moe_with;
    use host_tools::semantic::run_semantic_with;
    use host_tools::shim::ShimError;
    use host_tools::workloads::{Params, Workload as Named};
    let moe = |experts| moe_with("moe", Params::of("moe").unwrap(), 2, 0.0, experts).unwrap();
    let w = Named::build("moe", Params::of("moe").unwrap()).unwrap();
    let weights = w.tensors.iter().find(|t| t.name == "w").unwrap();
    let hidden = w.tensors.iter().find(|t| t.name == "x").unwrap().shape[1] as u64;
    let expert_bytes = hidden * weights.shape[1] as u64 * 4;
    let kinds = [
        CoreKind::Cube,
        CoreKind::Cube,
        CoreKind::Vector,
        CoreKind::Vector,
    ];
    let sched = SchedConfig {
        threads: 2,
        policy: PolicyKind::Affinity,
        key: DispatchKey::Loop(0),
        ..SchedConfig::default()
    };
    let mut arena = w.arena.clone();
    let refused = run_semantic_with(&w.table, &mut arena.bytes, &kinds, &sched, &options(&[]));
    assert!(
        matches!(
            refused,
            Err(ShimError::Run(ref e)) if matches!(**e, RunError::KeyNotInTask { pc: Some(_), .. })
        ),
        "{refused:?}"
    );
    let threads_per_expert = |key| {
        let w = moe(Some(Schedule {
            policy: PolicyKind::Affinity,
            key,
        }));
        let sched = SchedConfig {
            threads: 2,
            ..SchedConfig::default()
        };
        let mut arena = w.arena.clone();
        let base = arena.bytes.as_ptr() as u64;
        let run =
            run_semantic_with(&w.table, &mut arena.bytes, &kinds, &sched, &options(&[])).unwrap();
        assert!(w.verify(&arena).passed());
        let mut seen = std::collections::BTreeMap::<u64, std::collections::BTreeSet<usize>>::new();
        for l in run
            .launches
            .iter()
            .filter(|l| l.kernel_id == wsp_ffi::WspKernelId_WSP_KERNEL_EXPERT_ROWS)
        {
            let expert = (l.args.tensors[1].addr - base - weights.arena_offset) / expert_bytes;
            // Core c belongs to thread c % threads.
            seen.entry(expert).or_default().insert(l.core % 2);
        }
        seen
    };
    let by_loop = threads_per_expert(DispatchKey::Loop(0));
    assert_eq!(by_loop.len(), 8, "{by_loop:?}");
    assert!(by_loop.values().all(|t| t.len() == 1), "{by_loop:?}");
    let by_task = threads_per_expert(DispatchKey::TaskIndex);
    assert!(by_task.values().any(|t| t.len() == 2), "{by_task:?}");
}

/// Tasks of the tasks section run first (launched from the table), then
/// the program's (launched from records), in one run.
#[test]
fn table_tasks_and_program_tasks_run_in_one_table() {
    use host_tools::table::Arg;
    use wsp_ffi::ArgAccess::{In, Out};
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    let z = w.tensor("z", &[64, 64]).unwrap();
    // Task: y = x + x on the whole tensor; program: z tiles = y + y, which
    // must see the task's output.
    let whole = |t, a| Arg::tile(t, a, 0, 0, 64, 64);
    w.builder()
        .task(ADD, &[whole(x, In), whole(x, In), whole(y, Out)], &[])
        .unwrap();
    w.parallel(Axis::Dense(8), |w, i| {
        let r = w.let_(i * T);
        w.call(
            ADD,
            &[
                y.tile(r.clone(), 0, T, 64),
                y.tile(r.clone(), 0, T, 64),
                z.tile(r, 0, T, 64),
            ],
            &[],
        );
    });
    let table = w.finish().unwrap();
    for threads in [1, 2] {
        let mut arena = Arena::zeroed(w.arena_size());
        let n = w.layout(x).elements();
        let xs: Vec<f32> = (0..n).map(|i| (i % 97) as f32 + 0.5).collect();
        arena.write_f32(w.layout(x), &xs);
        let shim = Shim {
            sched: device_runtime::sched::SchedConfig {
                threads,
                ..Default::default()
            },
            ..Shim::default()
        };
        let stats = shim.run(&table, &mut arena.bytes).unwrap();
        assert_eq!(stats.tasks, 9);
        let (xs, zs) = (arena.read_f32(w.layout(x)), arena.read_f32(w.layout(z)));
        assert!(
            xs.iter().zip(&zs).all(|(x, z)| *z == 4.0 * x),
            "threads {threads}"
        );
    }
}

/// `y[0..16, 0..16] = x + x` on the same tile wherever it is called.
fn add_on_one_tile(w: &mut Workload, x: TensorId, y: TensorId) {
    w.call(
        ADD,
        &[
            x.tile(0, 0, 16, 16),
            x.tile(0, 0, 16, 16),
            y.tile(0, 0, 16, 16),
        ],
        &[],
    );
}

/// A small table whose loops run 2^32 - 1 x 2^32 - 1 times: `add` on one
/// fixed tile in each iteration.
fn huge_loops(inner: Axis) -> (Workload, Vec<u8>) {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::Dense(u32::MAX), |w, _| {
        w.parallel(inner, |w, _| {
            add_on_one_tile(w, x, y);
        });
    });
    let table = w.finish().unwrap();
    (w, table)
}

#[test]
fn inspect_counts_huge_loops_without_expanding_them() {
    let (_, table) = huge_loops(Axis::Dense(u32::MAX));
    let text = host_tools::inspect::inspect(&table, false);
    let n = (u32::MAX as u128) * (u32::MAX as u128);
    assert!(text.contains(&format!("expands to {n} tasks;")), "{text}");
    assert!(
        text.contains("a run stops after 4294967296 tasks (task numbers are u32)"),
        "{text}"
    );
    // An inner axis bound at launch: 0 to 2^32 - 1 iterations unless the
    // symbol is given.
    let (_, table) = huge_loops(Axis::DenseDyn {
        symbol: 0,
        max: u32::MAX,
    });
    let text = host_tools::inspect::inspect(&table, false);
    assert!(
        text.contains(&format!(
            "between 0 and {n} tasks (depending on symbols not bound here)"
        )),
        "{text}"
    );
    let parsed = device_runtime::abi::Table::parse(&table).unwrap();
    let count = host_tools::task_count::count_tasks(&parsed, None, &[3]).unwrap();
    assert_eq!(
        count,
        host_tools::task_count::TaskCount::Exact(u32::MAX as u128 * 3)
    );
}

#[test]
fn the_host_reference_refuses_to_list_huge_expansions() {
    use host_tools::task_count::MAX_HOST_ITERATIONS;
    use host_tools::task_count::MAX_HOST_TASKS;
    // 2^32 - 1 x 2^32 - 1 iterations are refused before they run.
    let (w, table) = huge_loops(Axis::Dense(u32::MAX));
    let parsed = device_runtime::abi::Table::parse(&table).unwrap();
    let arena = Arena::zeroed(parsed.arena_size());
    let e = w.expand(&arena, &[]).unwrap_err();
    assert!(
        e.contains(&format!("more than {MAX_HOST_ITERATIONS} iterations")),
        "{e}"
    );
    // One task more than the host lists.
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.parallel(Axis::Dense(MAX_HOST_TASKS as u32), |w, _| {
        add_on_one_tile(w, x, y);
    });
    add_on_one_tile(&mut w, x, y);
    w.finish().unwrap();
    let e = w.expand(&arena, &[]).unwrap_err();
    assert!(
        e.contains(&format!("more than {MAX_HOST_TASKS} tasks")),
        "{e}"
    );
    // Loops of no calls are bounded too.
    let mut w = Workload::new();
    w.parallel(Axis::Dense(u32::MAX), |w, _| {
        w.parallel(Axis::Dense(u32::MAX), |_, _| {})
    });
    w.finish().unwrap();
    let e = w.expand(&arena, &[]).unwrap_err();
    assert!(
        e.contains(&format!("more than {MAX_HOST_ITERATIONS} iterations")),
        "{e}"
    );
}

#[test]
fn a_when_in_a_huge_loop_counts_both_branches() {
    use host_tools::task_count::{count_tasks, TaskCount};
    let count = |otherwise_calls: usize| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        let add = move |w: &mut Workload| {
            w.call(
                ADD,
                &[
                    x.tile(0, 0, 16, 16),
                    x.tile(0, 0, 16, 16),
                    y.tile(0, 0, 16, 16),
                ],
                &[],
            );
        };
        w.parallel(Axis::Dense(u32::MAX), |w, i| {
            w.when(
                (i % 3).equals(0),
                |w| {
                    add(w);
                    add(w);
                },
                |w| (0..otherwise_calls).for_each(|_| add(w)),
            );
        });
        let table = w.finish().unwrap();
        let parsed = device_runtime::abi::Table::parse(&table).unwrap();
        count_tasks(&parsed, None, &[]).unwrap()
    };
    let n = u32::MAX as u128;
    // Which branch runs depends on the loop index, which the count does
    // not follow: 0 to 2 tasks per iteration...
    assert_eq!(
        count(0),
        TaskCount::Between {
            lo: 0,
            hi: 2 * n,
            symbols: false,
            data: false,
            tokens: false
        }
    );
    // ... but 2 either way is exact.
    assert_eq!(count(2), TaskCount::Exact(2 * n));
}

/// A `Count` axis: the number of iterations computed on the device from
/// data the program read, `ceil(len / 3)` column tiles per row block.
#[test]
fn a_count_axis_loops_over_a_count_computed_on_the_device() {
    let mut w = Workload::new();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    let lengths = w.tensor_i32("lengths", &[1, 8]).unwrap();
    w.input(lengths);
    w.parallel(Axis::Dense(8), |w, b| {
        let len = w.let_(Expr::load(lengths, vec![Expr::Const(0), b.clone()]));
        w.parallel(
            Axis::Count {
                count: (len + 2) / 3,
                max: 8,
            },
            |w, c| add_tile(w, x, y, b.clone(), c),
        );
    });
    let table = w.finish().unwrap();
    let lens = [0i32, 1, 2, 3, 4, 9, 21, 24];
    let mut arena = Arena::zeroed(w.arena_size());
    arena.write_i32(w.layout(lengths), &lens);
    let data: Vec<f32> = (0..64 * 64).map(|i| 1.0 + i as f32).collect();
    arena.write_f32(w.layout(x), &data);
    // ceil(len / 3) per block, derived by hand: 0+1+1+1+2+3+7+8 = 23.
    assert_eq!(run_shim(&table, &mut arena, &[]).unwrap(), 23);
    // Row block b got exactly its first ceil(len / 3) tiles: x + x there.
    let (xs, ys) = (arena.read_f32(w.layout(x)), arena.read_f32(w.layout(y)));
    for (b, &len) in lens.iter().enumerate() {
        let tiles = (len as usize).div_ceil(3);
        for c in 0..8 {
            let at = b * 8 * 64 + c * 8;
            let want = if c < tiles { xs[at] + xs[at] } else { 0.0 };
            assert_eq!(ys[at], want, "block {b} tile {c}");
        }
    }
    // A count past the stated maximum is an error, not a silent cut.
    let mut arena = Arena::zeroed(w.arena_size());
    arena.write_i32(w.layout(lengths), &[27, 0, 0, 0, 0, 0, 0, 0]);
    let e = run_shim(&table, &mut arena, &[]).unwrap_err();
    assert!(e.to_string().contains("loop count 9 outside [0, 8]"), "{e}");
}

/// A load of data a task writes, reached before any task wrote it: the
/// data does not exist yet, so the device refuses the run and names the
/// tensor (validation passes: a call does write it). The same load after
/// the writing call waits for that task and runs.
#[test]
fn a_load_before_any_task_wrote_the_tensor_is_refused() {
    use host_tools::attention::device::{plan_call, AttnDims};
    let build = |load_first: bool| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        let lens = w.tensor_i32("lens", &[1, 4]).unwrap();
        w.input(lens);
        let plan = w.tensor_i32("plan", &[1, 1]).unwrap();
        let dims = AttnDims {
            batch: 4,
            kv_heads: 1,
            group: 1,
            d: 64,
            page: 16,
            pool: 64,
            width: 4,
            most: 8,
        };
        // One iteration whatever the plan holds, but the load runs.
        let one = || Axis::Count {
            count: Expr::load(plan, vec![Expr::Const(0), Expr::Const(0)])
                .min(1)
                .max(1),
            max: 1,
        };
        let add = |w: &mut Workload| {
            w.parallel(one(), |w, c| add_tile(w, x, y, Expr::Const(0), c));
        };
        if load_first {
            add(&mut w);
            plan_call(&mut w, &dims, lens, plan, 2);
        } else {
            plan_call(&mut w, &dims, lens, plan, 2);
            add(&mut w);
        }
        let table = w.finish().unwrap();
        let mut arena = Arena::zeroed(w.arena_size());
        arena.write_i32(w.layout(lens), &[16, 32, 8, 40]);
        (table, arena, plan)
    };
    let (table, mut arena, plan) = build(true);
    let e = run_shim(&table, &mut arena, &[]).unwrap_err();
    assert!(
        matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::Expand { why: ExpandError::ReadBeforeWrite { tensor }, .. } if tensor == plan.0)),
        "{e}"
    );
    assert!(e.to_string().contains("before any task wrote it"), "{e}");
    let (table, mut arena, _) = build(false);
    assert_eq!(
        run_shim(&table, &mut arena, &[]).unwrap(),
        2,
        "plan, then add"
    );
}

/// A tensor id another workload returned (its index past this one's
/// tensors), loaded, freed or declared an input: an error from `finish`
/// naming the id, not a panic; and `finish` called inside a body is an
/// error, not a failed assertion.
#[test]
fn misused_handles_are_errors_not_panics() {
    // Tensor 2 of `other`: this workload has tensors 0 and 1 only.
    let mut other = Workload::new();
    other.tensor("a", &[8, 8]).unwrap();
    other.tensor("b", &[8, 8]).unwrap();
    let foreign_i32 = other.tensor_i32("c", &[1, 4]).unwrap();
    let foreign_scratch = other.scratch("d", &[8, 8]).unwrap();
    let unknown = |id: u32| LowerError::Build(BuildError::UnknownTensor(id));
    let base = || {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        (w, x, y)
    };

    let (mut w, x, y) = base();
    let count = Expr::load(foreign_i32, vec![Expr::Const(0), Expr::Const(0)]);
    w.parallel(Axis::Count { count, max: 4 }, |w, i| {
        add_tile(w, x, y, i, Expr::Const(0))
    });
    let e = w.finish().unwrap_err();
    assert_eq!(e, unknown(2));
    assert!(e.to_string().contains("tensor 2 was not declared"), "{e}");

    let (mut w, x, y) = base();
    add_tile(&mut w, x, y, Expr::Const(0), Expr::Const(0));
    w.free(foreign_scratch);
    assert_eq!(w.finish().unwrap_err(), unknown(3));

    // An arena tensor is not freed; the error used to call the table
    // invalid.
    let (mut w, x, y) = base();
    add_tile(&mut w, x, y, Expr::Const(0), Expr::Const(0));
    w.free(x);
    let e = w.finish().unwrap_err();
    assert_eq!(e, LowerError::FreeNotScratch("x".into()));
    assert!(e.to_string().contains("`x` is an arena tensor"), "{e}");

    // It used to reach validation, which named the program's INPUT
    // operand, not the tensor.
    let (mut w, x, y) = base();
    w.input(foreign_i32);
    add_tile(&mut w, x, y, Expr::Const(0), Expr::Const(0));
    assert_eq!(w.finish().unwrap_err(), unknown(2));

    let (mut w, x, y) = base();
    let mut inner = None;
    w.parallel(Axis::Dense(1), |w, i| {
        add_tile(w, x, y, i, Expr::Const(0));
        inner = Some(w.finish());
    });
    let e = inner.unwrap().unwrap_err();
    assert_eq!(e, LowerError::FinishInBody);
    assert!(e.to_string().contains("inside a loop"), "{e}");
    // The workload itself still lowers once its bodies have returned.
    w.finish().unwrap();
}

/// The host's reference expansion refuses what the device refuses, naming
/// the call or load, rather than listing a wrapped region (an offset of -8
/// used to become 4294967288, one of 2^32 became 0) or panicking (a load
/// with three indices into a rank-2 tensor, an arena shorter than the
/// loaded tensor).
#[test]
fn the_host_reference_refuses_what_the_device_refuses() {
    type Row = dyn Fn(Expr) -> Expr;
    let expand = |row: &Row, rows: i64, cols: i64| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        w.parallel(Axis::Dense(2), |w, i| {
            let r = row(i);
            let tile = |t: TensorId| t.tile(r.clone(), 0, rows, cols);
            w.call(ADD, &[tile(x), tile(x), tile(y)], &[]);
        });
        let table = w.finish().unwrap();
        let mut a = Arena::zeroed(w.arena_size());
        let reference = w.expand(&a, &[]);
        (reference, run_shim(&table, &mut a, &[]))
    };
    // Rows -8 and 0; 2^32 and 2^32 + 8; 60 .. 68 of 64; an empty tile.
    let cases: [(&Row, i64, i64, &str); 4] = [
        (
            &|i| (i - 1) * 8,
            8,
            8,
            "offset or extent -8 outside [0, 4294967295]",
        ),
        (
            &|i| i * 8 + (1i64 << 32),
            8,
            8,
            "offset or extent 4294967296 outside [0, 4294967295]",
        ),
        (
            &|i| i * 4 + 60,
            8,
            8,
            "dimension 0: 8 elements from 60 end past the tensor's size 64",
        ),
        (&|i| i * 8, 0, 8, "dimension 0: an empty region (extent 0)"),
    ];
    for (row, rows, cols, why) in cases {
        let (reference, run) = expand(row, rows, cols);
        let e = reference.unwrap_err();
        assert!(e.contains("call of add: argument 0 (x): "), "{e}");
        assert!(e.contains(why), "{e} (wanted {why})");
        // The device refuses the same call.
        assert!(run.is_err(), "{why}");
    }

    // A load with one index too many, and an arena too short for it.
    let mut w = Workload::new();
    let lengths = w.tensor_i32("lengths", &[1, 4]).unwrap();
    let x = w.tensor("x", &[64, 64]).unwrap();
    let y = w.tensor("y", &[64, 64]).unwrap();
    w.input(lengths);
    let at = |n: usize| vec![Expr::Const(0); n];
    let ragged = |at| Axis::Ragged {
        lengths,
        at,
        max: 4,
    };
    w.parallel(ragged(at(3)), |w, i| add_tile(w, x, y, i, Expr::Const(0)));
    let e = w.expand(&Arena::zeroed(w.arena_size()), &[]).unwrap_err();
    assert_eq!(e, "load from lengths: 3 indices for a rank-2 tensor");
    let mut w = Workload::new();
    let lengths = w.tensor_i32("lengths", &[1, 4]).unwrap();
    w.input(lengths);
    w.parallel(ragged(at(2)), |_, _| {});
    // Element [0, 0] is bytes 0 .. 4: 3 bytes are too few, 4 enough.
    let e = w.expand(&Arena::zeroed(3), &[]).unwrap_err();
    assert!(e.contains("the arena of 3 bytes ends before"), "{e}");
    let mut short = Arena::zeroed(4);
    short.bytes[0] = 3;
    assert_eq!(w.expand(&short, &[]).unwrap(), []);
    // The element was read: 5 is past the axis' 4.
    short.bytes[0] = 5;
    assert_eq!(
        w.expand(&short, &[]).unwrap_err(),
        "loop count 5 outside [0, 4]"
    );
}

/// `n` i32 input tensors of one element, `d0 ..`.
fn data_inputs(w: &mut Workload, n: usize) -> Vec<TensorId> {
    (0..n)
        .map(|k| {
            let d = w.tensor_i32(&format!("d{k}"), &[1, 1]).unwrap();
            w.input(d);
            d
        })
        .collect()
}

/// The data tensors (those a program LOADs from) go up to
/// `MAX_DATA_TENSORS` = 64, a bit each of a u64 mask: 64 input tensors,
/// each loaded as the count (0 or 1) of a loop over one tile of its own,
/// run on the shim. The tiles written are those whose tensor holds 1, so
/// every load read its own tensor; the 65th is refused by the builder
/// (naming it) and, in a table built by hand, by the device's validation
/// (naming the LOAD).
#[test]
fn a_program_loads_from_64_distinct_tensors_and_not_65() {
    assert_eq!(MAX_DATA_TENSORS, 64);
    let build = |n: usize| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        let data = data_inputs(&mut w, n);
        for (k, &d) in data.iter().enumerate() {
            let count = Expr::load(d, vec![Expr::Const(0), Expr::Const(0)]);
            let (row, col) = (Expr::Const(k as i64 / 8), Expr::Const(k as i64 % 8));
            w.parallel(Axis::Count { count, max: 1 }, |w, _| {
                add_tile(w, x, y, row, col)
            });
        }
        (w, x, y, data)
    };
    // Tensor k holds 1 for k = 1 mod 3 (1, 4, .., 61: 21 of them) and for
    // k >= 60 (60, 62, 63 more): 24 tasks, one on tile (k / 8, k % 8) each.
    let holds = |k: usize| (k % 3 == 1 || k >= 60) as i32;
    let want: Vec<(u32, u32)> = (0..64)
        .filter(|&k| holds(k) == 1)
        .map(|k| (k as u32 / 8, k as u32 % 8))
        .collect();
    assert_eq!(want.len(), 24);

    let (mut w, x, y, data) = build(64);
    let table = w.finish().unwrap();
    let parsed = device_runtime::abi::Table::parse(&table).unwrap();
    let info = parsed.program_info();
    assert_eq!(info.data(), data.iter().map(|d| d.0).collect::<Vec<_>>());
    assert_eq!(info.inputs, u64::MAX, "all 64 are inputs");
    let ex = examples::Example {
        w,
        x,
        y,
        z: None,
        lengths: None,
    };
    let mut arena = ex.arena(None);
    for (k, &d) in data.iter().enumerate() {
        arena.write_i32(ex.w.layout(d), &[holds(k)]);
    }
    assert_eq!(run_shim(&table, &mut arena, &[]).unwrap(), 24);
    assert_eq!(ex.written_tiles(&arena), want);
    assert_eq!(ex.check(&arena, &[]), Ok(24));

    // The 65th: the builder names it.
    let (mut w, ..) = build(65);
    let e = w.finish().unwrap_err();
    assert_eq!(
        e,
        LowerError::TooManyDataTensors {
            tensor: "d64".into(),
            max: 64
        }
    );
    assert!(
        e.to_string()
            .contains("load from d64: a program LOADs from at most 64 distinct tensors"),
        "{e}"
    );

    // A table built by hand: the device names the 65th LOAD. (INPUT of
    // each, then a LOAD of each: LOAD k is at pc 65 + k.)
    use device_runtime::abi::{Problem, Table};
    use host_tools::asm::Asm;
    use host_tools::table::TableBuilder;
    let table = |n: usize| {
        let mut b = TableBuilder::new();
        let data: Vec<TensorId> = (0..n)
            .map(|k| b.tensor_i32(&format!("d{k}"), &[1, 1]).unwrap())
            .collect();
        let mut asm = Asm::default();
        for d in &data {
            asm.op(OP_INPUT, 0, [NO_REG; 6], d.0, 0);
        }
        for d in &data {
            asm.op(OP_LOAD, 0, [NO_REG; 6], d.0, 0);
        }
        b.set_program(asm.code);
        b.finish().unwrap()
    };
    let t64 = table(64);
    assert_eq!(Table::parse(&t64).unwrap().program_info().data().len(), 64);
    let t65 = table(65);
    let e = Table::parse(&t65).unwrap_err();
    assert_eq!(
        (e.section, e.index, e.field, e.problem),
        (
            Section::Program,
            65 + 64,
            "imm",
            Problem::TooManyDataTensors { max: 64 }
        )
    );
    assert!(
        e.to_string()
            .contains("a program LOADs from more than 64 distinct tensors (MAX_DATA_TENSORS)"),
        "{e}"
    );
}

/// A load of data a task writes, from the data tensor of index `before`
/// (the first `before` loaded are inputs): refused before the writing
/// call, read after it. Indices 8, 33 and 63 are past a u8 and a u32
/// mask: a truncated bit would name another tensor (an input, so the
/// first load would pass) or shift out of range.
#[test]
fn the_written_mask_covers_data_tensors_past_8_and_32() {
    use host_tools::attention::device::{plan_call, AttnDims};
    let dims = AttnDims {
        batch: 4,
        kv_heads: 1,
        group: 1,
        d: 64,
        page: 16,
        pool: 64,
        width: 4,
        most: 8,
    };
    let build = |before: usize, load_first: bool| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[64, 64]).unwrap();
        let y = w.tensor("y", &[64, 64]).unwrap();
        let lens = w.tensor_i32("lens", &[1, 4]).unwrap();
        w.input(lens);
        let plan = w.tensor_i32("plan", &[1, 1]).unwrap();
        // Each holds 0: a loop of no iterations, but the load runs and
        // takes the next data index.
        for d in data_inputs(&mut w, before) {
            let count = Expr::load(d, vec![Expr::Const(0), Expr::Const(0)]);
            w.parallel(Axis::Count { count, max: 1 }, |w, c| {
                add_tile(w, x, y, Expr::Const(0), c)
            });
        }
        let add = |w: &mut Workload| {
            let count = Expr::load(plan, vec![Expr::Const(0), Expr::Const(0)])
                .min(1)
                .max(1);
            w.parallel(Axis::Count { count, max: 1 }, |w, c| {
                add_tile(w, x, y, Expr::Const(1), c)
            });
        };
        if load_first {
            add(&mut w);
            plan_call(&mut w, &dims, lens, plan, 2);
        } else {
            plan_call(&mut w, &dims, lens, plan, 2);
            add(&mut w);
        }
        let table = w.finish().unwrap();
        let index = device_runtime::abi::Table::parse(&table)
            .unwrap()
            .program_info()
            .data_index(plan.0);
        assert_eq!(index, Some(before));
        let mut arena = Arena::zeroed(w.arena_size());
        arena.write_i32(w.layout(lens), &[16, 32, 8, 40]);
        (table, arena, plan)
    };
    for before in [8, 33, 63] {
        let (table, mut arena, plan) = build(before, true);
        let e = run_shim(&table, &mut arena, &[]).unwrap_err();
        assert!(
            matches!(e, ShimError::Run(ref r) if matches!(**r, RunError::Expand { why: ExpandError::ReadBeforeWrite { tensor }, .. } if tensor == plan.0)),
            "index {before}: {e}"
        );
        let (table, mut arena, _) = build(before, false);
        assert_eq!(
            run_shim(&table, &mut arena, &[]).unwrap(),
            2,
            "index {before}: plan, then add"
        );
    }
}

/// A longest program (`MAX_PROGRAM` instructions) of `WHEN`s on a symbol
/// the host is not given, each to the last instruction: the device
/// validates it and the host counts its tasks. Both took time quadratic in
/// the program's length once (validation walked each jump to its target,
/// the count scanned every pending jump at each instruction); no time is
/// asserted.
#[test]
fn a_longest_program_of_branches_validates_and_counts() {
    use device_runtime::abi::Instr;
    use host_tools::table::TableBuilder;
    use zerocopy::little_endian::U32;
    let instr = |op, r, x0, imm: usize| Instr {
        op,
        r,
        x: [x0, NO_REG, NO_REG, NO_REG, NO_REG, NO_REG],
        imm: U32::new(imm as u32),
        imm2: U32::new(0),
    };
    let last = MAX_PROGRAM - 1;
    let mut program = vec![instr(OP_SYMBOL, 0, NO_REG, 0)];
    program.extend((1..last).map(|_| instr(OP_WHEN, 0, 0, last)));
    program.push(instr(OP_CONST, 1, NO_REG, 0));
    assert_eq!(program.len(), MAX_PROGRAM);
    let mut b = TableBuilder::new();
    b.set_program(program);
    let bytes = b.finish().unwrap();
    let table = device_runtime::abi::Table::parse(&bytes).unwrap();
    let count = host_tools::task_count::count_tasks(&table, None, &[]).unwrap();
    assert_eq!(count, host_tools::task_count::TaskCount::Exact(0));
}

/// The host's length check counts the `HEAP` instruction the table
/// builder appends for a heap ring: a program one instruction short of
/// `MAX_PROGRAM` with a heap is the longest accepted, and one of exactly
/// `MAX_PROGRAM` is refused as too long (the device's own check refused
/// it after lowering, as an invalid table, before).
#[test]
fn the_heap_instruction_counts_toward_the_program_limit() {
    // Two calls through a scratch tensor, then `frees` FREEs of it, one
    // instruction each: the program's own length is `base + frees`, with
    // `base` what the calls lower to (read off the first refusal).
    let build = |frees: usize| {
        let mut w = Workload::new();
        let x = w.tensor("x", &[16, 16]).unwrap();
        let s = w.scratch("s", &[16, 16]).unwrap();
        let y = w.tensor("y", &[16, 16]).unwrap();
        w.heap(1024).unwrap();
        let tile = |t: TensorId| t.tile(0, 0, 16, 16);
        w.call(ADD, &[tile(x), tile(x), tile(s)], &[]);
        w.call(ADD, &[tile(s), tile(x), tile(y)], &[]);
        for _ in 0..frees {
            w.free(s);
        }
        w.finish()
    };
    let base = match build(MAX_PROGRAM) {
        Err(LowerError::TooLong { instructions, max }) => {
            assert_eq!(max, MAX_PROGRAM);
            // The program's own instructions and the HEAP.
            instructions - MAX_PROGRAM - 1
        }
        other => panic!("{other:?}"),
    };
    // `base + frees` own instructions and the HEAP: MAX_PROGRAM in all.
    let table = build(MAX_PROGRAM - base - 1).unwrap();
    let parsed = device_runtime::abi::Table::parse(&table).unwrap();
    assert_eq!(parsed.program().len(), MAX_PROGRAM);
    assert_eq!(parsed.program().last().unwrap().op, OP_HEAP);
    match build(MAX_PROGRAM - base) {
        Err(LowerError::TooLong { instructions, .. }) => {
            assert_eq!(instructions, MAX_PROGRAM + 1)
        }
        other => panic!("{other:?}"),
    }
}
