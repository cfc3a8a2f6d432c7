//! The same tables on the host shim and in QEMU (bare-metal aarch64, CPUs
//! 0-3 scheduling, CPUs 4-7 running kernels): bit-identical arenas, both
//! within the stated tolerance of the f64 reference; bad tables end with a
//! clear error and exit status. Workload programs (every axis and loop
//! kind) expand on the device in both, with symbols bound at launch through
//! the launch block, and match the host's reference expansion. Random DAGs
//! run on four scheduler threads under every dispatch policy, on every CPU
//! model ([`CPU_MODELS`]), with the MMU and caches on on every CPU.

use device_runtime::abi::launch::Symbols;
use device_runtime::abi::launch::{Launch, LaunchError};
use device_runtime::sched::RunOptions;
use device_runtime::sched::{PolicyKind, SchedConfig};
use host_tools::dag::{in_table_order, random_dag};
use host_tools::program_examples::{self as examples, Example};
use host_tools::shim::Shim;
use host_tools::table::{seal, Arena};
use host_tools::workloads::{Params, Workload};
use wsp_tests::{
    launch_block, run_in_qemu, run_in_qemu_configured, run_in_qemu_with, QemuOutcome, CPU_MODELS,
};

/// The arena of a QEMU run that succeeded after running `tasks` tasks
/// (`what` names the run in failure messages).
fn ran(outcome: &QemuOutcome, tasks: usize, what: &str) -> Vec<u8> {
    let o = outcome;
    wsp_tests::succeeded(
        "QEMU",
        (o.status, &o.stdout, &o.stderr),
        &o.arena_out,
        tasks,
        what,
    )
}

fn shim_and_qemu_agree(name: &str, params: Params) {
    let w = Workload::build(name, params).unwrap();
    let mut shim_arena = w.arena.clone();
    let stats = Shim::default()
        .run(&w.table, &mut shim_arena.bytes)
        .unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);

    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    let qemu_arena = Arena {
        bytes: ran(&outcome, w.tasks, name),
    };

    let shim_check = w.verify(&shim_arena);
    assert!(shim_check.passed(), "shim: {shim_check}");
    let qemu_check = w.verify(&qemu_arena);
    assert!(qemu_check.passed(), "qemu: {qemu_check}");
    assert!(
        shim_arena.bytes == qemu_arena.bytes,
        "{name}: shim and QEMU arenas differ"
    );
    // The semantic cycle count is a property of the table, not of the machine.
    assert!(
        outcome
            .stdout
            .contains(&format!("cycles={}", stats.total_cycles())),
        "{}",
        outcome.stdout
    );
}

/// mlp with its intermediates (Y, Z, N) as scratch tensors: their storage
/// comes from the heap ring in both, at the same places (the ring's order
/// fixes them), so the whole arenas are bit-identical.
#[test]
fn mlp_scratch_on_the_heap_ring_is_bit_identical_in_shim_and_qemu() {
    let p = Params::of("mlp-scratch").unwrap();
    shim_and_qemu_agree("mlp-scratch", p);
    // The firmware reports the ring: Y and Z (32 KiB each) live at once,
    // and the arena 32 KiB smaller than mlp's.
    let w = Workload::build("mlp-scratch", p).unwrap();
    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    assert!(
        outcome
            .stdout
            .contains("heap_high_water=65536 heap_bytes=65536 arena_saved=32768"),
        "{}",
        outcome.stdout
    );
}

#[test]
fn gemm_256_is_bit_identical_in_shim_and_qemu() {
    shim_and_qemu_agree("gemm", Params::default());
}

#[test]
fn every_kernel_is_bit_identical_in_shim_and_qemu() {
    shim_and_qemu_agree(
        "mlp",
        Params {
            m: 64,
            n: 128,
            k: 128,
            tile: 32,
            seed: 9,
        },
    );
}

#[test]
fn streams_and_events_are_bit_identical_in_shim_and_qemu() {
    shim_and_qemu_agree(
        "streams",
        Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 4,
        },
    );
}

#[test]
fn moe_routing_expands_on_the_device_bit_identical_in_shim_and_qemu() {
    // The expert tasks exist only after the router ran: fixed top-2 and a
    // variable number of experts per token.
    for name in ["moe", "moe-var"] {
        shim_and_qemu_agree(
            name,
            Params {
                m: 32,
                n: 64,
                k: 64,
                tile: 32,
                seed: 3,
            },
        );
    }
}

#[test]
fn a_bad_table_in_qemu_names_the_field_and_exits_2() {
    let w = Workload::build(
        "gemm",
        Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 1,
        },
    )
    .unwrap();
    let mut table = w.table.clone();
    // Tensor 0's dtype, right after the header and its 16-byte name.
    table[device_runtime::abi::HEADER_SIZE + 16] = 9;
    seal(&mut table);
    let outcome = run_in_qemu(&table, &w.arena.bytes);
    assert_eq!(outcome.status, 2, "{}", outcome.stdout);
    assert!(
        outcome.stdout.contains(
            "RESULT ERROR invalid descriptor table: section `tensors`, entry 0, field `dtype`"
        ),
        "{}",
        outcome.stdout
    );
    assert!(
        outcome.arena_out.is_none(),
        "nothing is written back after an error"
    );
}

/// Runs a lowered program example from `arena` on the shim and in QEMU,
/// with `symbols` bound (in QEMU through a launch block): both succeed with
/// the same task count, their arenas are bit-identical, and the output
/// matches the host's reference expansion. Returns the task count.
fn program_agrees(ex: &Example, table: &[u8], arena: &Arena, symbols: &[i64]) -> usize {
    let mut shim_arena = arena.clone();
    let shim = Shim {
        options: RunOptions {
            symbols: Symbols::new(symbols).unwrap(),
            ..RunOptions::default()
        },
        ..Shim::default()
    };
    let stats = shim.run(table, &mut shim_arena.bytes).unwrap();

    let launch = launch_block(symbols, 0, "").unwrap();
    let outcome = run_in_qemu_with(table, &arena.bytes, Some(launch));
    let qemu_arena = Arena {
        bytes: ran(
            &outcome,
            stats.tasks as usize,
            &format!("symbols {symbols:?}"),
        ),
    };
    assert!(
        shim_arena.bytes == qemu_arena.bytes,
        "symbols {symbols:?}: shim and QEMU arenas differ"
    );
    let tasks = ex
        .check(&qemu_arena, symbols)
        .unwrap_or_else(|e| panic!("symbols {symbols:?}: {e}"));
    assert_eq!(tasks, stats.tasks as usize, "the reference's task count");
    tasks
}

#[test]
fn dense_dyn_symbols_bind_at_launch_in_qemu_with_the_same_table() {
    let mut ex = examples::dense_dyn();
    let table = ex.w.finish().unwrap();
    let arena = ex.arena(None);
    for rows in [2i64, 5] {
        let tasks = program_agrees(&ex, &table, &arena, &[rows]);
        assert_eq!(tasks, 3 * rows as usize);
    }
}

#[test]
fn ragged_axes_and_when_follow_the_lengths_in_qemu() {
    let mut ex = examples::ragged();
    let table = ex.w.finish().unwrap();
    for lens in [[8, 7, 1, 0, 5, 2, 3, 4], [0, 4, 4, 2, 6, 0, 1, 8]] {
        let tasks = program_agrees(&ex, &table, &ex.arena(Some(&lens)), &[]);
        let short: usize = lens.iter().filter(|&&l| l <= 4).map(|&l| l as usize).sum();
        let long = lens.iter().filter(|&&l| l > 4).count();
        assert_eq!(tasks, short + long, "{lens:?}");
    }
}

#[test]
fn a_sequential_loop_expands_in_qemu() {
    let mut ex = examples::column(true);
    let table = ex.w.finish().unwrap();
    assert_eq!(program_agrees(&ex, &table, &ex.arena(None), &[]), 8);
}

/// A run that fails before any task: its status, and the error line.
fn fails_with(outcome: &QemuOutcome, status: i32, error: &str) {
    assert_eq!(
        outcome.status, status,
        "{}\n{}",
        outcome.stdout, outcome.stderr
    );
    assert!(
        outcome
            .stdout
            .lines()
            .any(|l| l.starts_with("RESULT ERROR ") && l.contains(error)),
        "wanted `{error}` in:\n{}",
        outcome.stdout
    );
    assert!(outcome.arena_out.is_none(), "nothing is written back");
}

#[test]
fn unbound_symbols_and_bad_launch_blocks_are_clear_errors_in_qemu() {
    let mut ex = examples::dense_dyn();
    let table = ex.w.finish().unwrap();
    let arena = ex.arena(None);
    // No launch block: the program's symbol is unbound.
    let outcome = run_in_qemu_with(&table, &arena.bytes, None);
    fails_with(
        &outcome,
        1,
        "the program reads 1 symbols; the launch binds 0",
    );
    // A block binding no symbols is the same.
    let outcome = run_in_qemu_with(
        &table,
        &arena.bytes,
        Some(launch_block(&[], 0, "").unwrap()),
    );
    fails_with(
        &outcome,
        1,
        "the program reads 1 symbols; the launch binds 0",
    );
    // Malformed blocks: bad magic, too many symbols.
    let mut bad = launch_block(&[2], 0, "").unwrap();
    bad[..4].copy_from_slice(b"WSPX");
    let outcome = run_in_qemu_with(&table, &arena.bytes, Some(bad));
    fails_with(&outcome, 4, "invalid launch block: magic 57 53 50 58");
    let mut bad = launch_block(&[2], 0, "").unwrap();
    bad[8..12].copy_from_slice(&17u32.to_le_bytes());
    let outcome = run_in_qemu_with(&table, &arena.bytes, Some(bad));
    fails_with(&outcome, 4, "invalid launch block: 17 symbols, at most 16");
    // A run that fails midway on four scheduler threads: every thread stops
    // and the error is the dispatcher's.
    let block = launch_block(&[9], 4, "work-stealing").unwrap();
    let outcome = run_in_qemu_with(&table, &arena.bytes, Some(block));
    fails_with(&outcome, 1, "loop count 9 outside [0, 8]");
    // Scheduling the firmware cannot do: more threads than AICPU CPUs, an
    // unknown policy.
    let block = launch_block(&[2], 5, "").unwrap();
    let outcome = run_in_qemu_with(&table, &arena.bytes, Some(block));
    fails_with(
        &outcome,
        4,
        "launch block: 5 scheduler threads; this firmware runs 1 to 4",
    );
    let block = launch_block(&[2], 2, "fastest").unwrap();
    let outcome = run_in_qemu_with(&table, &arena.bytes, Some(block));
    fails_with(
        &outcome,
        4,
        "invalid launch block: policy: unknown dispatch policy",
    );
}

/// The numbers after `key=` in the firmware's output, comma-separated.
fn figures(stdout: &str, key: &str) -> Vec<u64> {
    let at = stdout
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key}= in:\n{stdout}"));
    stdout[at + key.len() + 1..]
        .split(|c: char| c.is_whitespace())
        .next()
        .unwrap()
        .split(',')
        .map(|n| n.parse().unwrap())
        .collect()
}

/// The same table with the same flags means the same schedule in the shim
/// and in QEMU: without a launch block the firmware runs the default
/// schedule of every runner ([`SchedConfig::default`]), and both give core
/// `c` to thread `c % threads` over the same cores (cube cores 0 and 1,
/// vector cores 2 and 3). A GEMM's 512 tasks are all cube tasks; affinity by
/// task index on two threads sends task `i` to thread `i % 2`, whose one cube
/// core is core `i % 2`: 256 tasks each on cores 0 and 1, none on 2 and 3,
/// in both runners (the firmware used to give thread 0 cores 0 and 1, one
/// cube and one vector, and so put the second half on core 2).
#[test]
fn the_shim_and_qemu_mean_the_same_schedule_by_the_same_flags() {
    let w = Workload::build("gemm", Params::of("gemm").unwrap()).unwrap();
    assert_eq!(w.tasks, 512);
    let default = SchedConfig::default();
    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    ran(&outcome, w.tasks, "default schedule");
    let expected = format!(
        "threads={} policy={} ",
        default.threads,
        default.policy.name()
    );
    assert!(
        outcome.stdout.contains(&expected),
        "expected {expected}in:\n{}",
        outcome.stdout
    );
    let shim = Shim::default();
    assert_eq!((shim.cube_cores, shim.vector_cores), (2, 2));
    assert_eq!(shim.sched, default);

    let affinity = SchedConfig {
        threads: 2,
        policy: PolicyKind::Affinity,
        ..SchedConfig::default()
    };
    let mut arena = w.arena.clone();
    let stats = Shim {
        sched: affinity,
        ..Shim::default()
    }
    .run(&w.table, &mut arena.bytes)
    .unwrap();
    let shim_cores: Vec<u64> = stats.cores().iter().map(|c| c.tasks).collect();
    let block = launch_block(&[], 2, "affinity").unwrap();
    let outcome = run_in_qemu_with(&w.table, &w.arena.bytes, Some(block));
    ran(&outcome, w.tasks, "affinity");
    let qemu_cores = figures(&outcome.stdout, "per_core");
    assert_eq!(shim_cores, [256, 256, 0, 0], "shim");
    assert_eq!(qemu_cores, shim_cores, "QEMU: {}", outcome.stdout);
}

/// The randomized DAG test at small size in QEMU, with four scheduler
/// threads (CPUs 0-3) over the four AICores, under every dispatch policy,
/// on every CPU model (the Cortex-A57's exclusives and `max`'s LSE
/// atomics): every task is issued exactly once, and the arena is
/// bit-identical to the tasks run one by one in table order (which the
/// shim's DAG test also matches), so every dependency (RAW, WAR, WAW) was
/// honoured.
#[test]
fn random_dags_run_on_four_scheduler_threads_in_qemu_under_every_policy() {
    const TASKS: usize = 160;
    for seed in [21, 22] {
        let (table, data) = random_dag(seed, TASKS);
        let expect = in_table_order(&table, &data);
        for (policy, cpu) in PolicyKind::ALL
            .into_iter()
            .flat_map(|policy| CPU_MODELS.map(|cpu| (policy, cpu)))
        {
            let block = launch_block(&[], 4, policy.name()).unwrap();
            let outcome = run_in_qemu_configured(&table, &data.bytes, |run| {
                run.launch = Some(block);
                run.cpu = cpu.into();
            });
            let what = format!("seed {seed} {} on {cpu}", policy.name());
            let arena = ran(&outcome, TASKS, &what);
            let stdout = &outcome.stdout;
            assert!(stdout.contains("threads=4 "), "{what}: {}", stdout);
            let per_thread = figures(stdout, "per_thread");
            let per_core = figures(stdout, "per_core");
            assert_eq!(per_thread.len(), 4, "{what}: {}", stdout);
            assert_eq!(per_core.len(), 4, "{what}: {}", stdout);
            assert_eq!(per_thread.iter().sum::<u64>(), TASKS as u64, "{what}");
            assert_eq!(per_core.iter().sum::<u64>(), TASKS as u64, "{what}");
            if policy == PolicyKind::RoundRobin {
                // Round-robin alternates between the threads owning a kind:
                // all four scheduler threads and cores are busy.
                assert!(per_thread.iter().all(|&n| n > 0), "{what}: {per_thread:?}");
            }
            assert!(
                arena == expect,
                "{what}: QEMU differs from the in-order run"
            );
        }
    }
}

/// The MMU and the caches are on, as on a device, on every CPU model: every
/// CPU a four-thread run starts (all 8) reports SCTLR_EL1 with M, C and I
/// set, and the MMU translates a RAM address (the arena) to Normal
/// Write-Back memory (MAIR encoding 0xff), Inner Shareable (PAR_EL1.SH =
/// 0b11), and the UART to Device-nGnRE (0x04): what the runtime's atomics
/// need to be correct between CPUs on real hardware; and the lowest page of
/// each of the 8 stacks faults while the page above it maps (the guards
/// that make a stack overflow a fault). (With the MMU off there is no such
/// line, and every address would be Device-nGnRnE.)
#[test]
fn the_mmu_and_caches_are_on_on_every_cpu_in_qemu() {
    let (table, data) = random_dag(7, 32);
    for cpu in CPU_MODELS {
        let block = launch_block(&[], 4, "").unwrap();
        let outcome = run_in_qemu_configured(&table, &data.bytes, |run| {
            run.launch = Some(block);
            run.cpu = cpu.into();
        });
        ran(&outcome, 32, cpu);
        let line = outcome
            .stdout
            .lines()
            .find(|l| l.contains("mmu on "))
            .unwrap_or_else(|| panic!("{cpu}: no `mmu on` line in:\n{}", outcome.stdout));
        assert!(
            line.contains("mmu on cpus=0xff of 0xff; "),
            "{cpu}: not every CPU has M, C and I set: {line}"
        );
        assert!(
            line.contains("; ram attr=0xff sh=3; "),
            "{cpu}: RAM is not Normal Write-Back Inner Shareable: {line}"
        );
        assert!(
            line.contains("; uart attr=0x4; "),
            "{cpu}: the UART is not Device-nGnRE: {line}"
        );
        assert!(
            line.ends_with("; stack guards=8 of 8"),
            "{cpu}: not every stack has an unmapped guard page below it: {line}"
        );
    }
}

/// QEMU started with fewer CPUs than the firmware needs: the firmware says
/// how many it needs and how many it got, not which PSCI call failed.
#[test]
fn too_few_cpus_are_named_as_such_in_qemu() {
    let w = Workload::build(
        "gemm",
        Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 1,
        },
    )
    .unwrap();
    let outcome = run_in_qemu_configured(&w.table, &w.arena.bytes, |run| run.smp = 4);
    fails_with(
        &outcome,
        1,
        "this firmware needs 8 CPUs (4 scheduler threads + 4 AICores); \
         QEMU started it with 4: pass -smp 8",
    );
}

/// The block `cargo xtask qemu` writes is the one the runtime reads.
#[test]
fn the_hosts_launch_block_is_the_runtimes() {
    let block = launch_block(&[3, -7], 2, "hash").unwrap();
    let launch = Launch::parse(&block).unwrap().unwrap();
    assert_eq!(launch.symbols, Symbols::new(&[3, -7]).unwrap());
    assert_eq!(launch.threads, Some(2));
    assert_eq!(launch.policy, Some(PolicyKind::Hash));
    let mut written = [0u8; device_runtime::abi::launch::LAUNCH_MAX];
    let len = launch.write(&mut written).unwrap();
    assert_eq!(&written[..len], &block[..]);
    assert_eq!(
        Launch::parse(&launch_block(&[], 0, "best").unwrap()),
        Err(LaunchError::Policy(
            device_runtime::sched::PolicyError::Unknown
        ))
    );
    // What the block cannot hold is refused, not cut short.
    assert_eq!(
        launch_block(&[], 0, "a-policy-name-too-long"),
        Err(LaunchError::BadPolicyName)
    );
    assert_eq!(
        launch_block(&[0; 17], 0, ""),
        Err(LaunchError::TooManySymbols { count: 17 })
    );
}

#[test]
fn csp_pipelines_are_bit_identical_in_shim_and_qemu() {
    for name in ["pipeline", "attention-pipeline"] {
        shim_and_qemu_agree(name, Params::of(name).unwrap());
    }
}

/// Two processes that each consume before they send: the firmware ends
/// the run with the channel deadlock report, not a hang.
#[test]
fn a_channel_deadlock_in_qemu_ends_with_its_report() {
    use host_tools::program::Workload as Program;
    use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
    let mut w = Program::new();
    let x = w.tensor("x", &[16, 16]).unwrap();
    let y = w.tensor("y", &[16, 16]).unwrap();
    let ping = w.channel("ping", 1).unwrap();
    let pong = w.channel("pong", 1).unwrap();
    for (name, from, to) in [("left", ping, pong), ("right", pong, ping)] {
        w.process(name, |w| {
            w.consume(from, |w, t| {
                let call = w.call(
                    ADD,
                    &[
                        x.tile(0, 0, 16, 16),
                        x.tile(0, 0, 16, 16),
                        y.tile(0, 0, 16, 16),
                    ],
                    &[],
                );
                w.send(to, t, call);
            });
        });
    }
    let table = w.finish().unwrap();
    let arena = Arena::zeroed(w.arena_size());
    let outcome = run_in_qemu(&table, &arena.bytes);
    fails_with(
        &outcome,
        1,
        "channel deadlock: every process is parked on a channel",
    );
    for needle in [
        "CONSUME waits for a token on channel 0",
        "CONSUME waits for a token on channel 1",
        "in a cycle",
    ] {
        assert!(
            outcome.stdout.contains(needle),
            "{needle}: {}",
            outcome.stdout
        );
    }
}

/// A heap ring too small for the scratch tensors one scope holds at once
/// (A lives until B's writer, which reads it, retires) ends the QEMU run
/// with the report naming the tensor and the sizes, not a hang.
#[test]
fn a_heap_ring_too_small_for_a_scope_in_qemu_ends_with_its_report() {
    use host_tools::table::{Arg, TableBuilder};
    use wsp_ffi::ArgAccess::{In, Out};
    use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
    let mut b = TableBuilder::new();
    let x = b.tensor("X", &[16, 16]).unwrap();
    let a = b.scratch("A", &[16, 16]).unwrap();
    let bb = b.scratch("B", &[16, 16]).unwrap();
    let y = b.tensor("Y", &[16, 16]).unwrap();
    b.heap(1024).unwrap();
    let t = |id, acc| Arg::tile(id, acc, 0, 0, 16, 16);
    b.task(ADD, &[t(x, In), t(x, In), t(a, Out)], &[]).unwrap();
    b.task(ADD, &[t(a, In), t(x, In), t(bb, Out)], &[]).unwrap();
    b.task(ADD, &[t(bb, In), t(x, In), t(y, Out)], &[]).unwrap();
    let table = b.finish().unwrap();
    let arena = Arena::zeroed(b.arena_size());
    let outcome = run_in_qemu(&table, &arena.bytes);
    fails_with(
        &outcome,
        1,
        "heap ring deadlock: task 1 needs 1024 bytes for scratch tensor 2 `B`, \
         but the heap ring holds 1024 of its 1024 bytes for 1 live scratch tensors",
    );
}

/// The three-stage pipeline and an independent element-wise sum (a
/// data-parallel task set of the program's own context) in one run:
/// bit-identical in the shim and QEMU, both results right.
#[test]
fn a_pipeline_beside_a_data_parallel_set_is_bit_identical_in_shim_and_qemu() {
    use host_tools::program::Axis;
    use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
    const T: u32 = 32;
    let mut w = host_tools::pipeline::program(8, T, 2).unwrap();
    let a = w.tensor("ga", &[128, 128]).unwrap();
    let b = w.tensor("gb", &[128, 128]).unwrap();
    let c = w.tensor("gc", &[128, 128]).unwrap();
    w.parallel(Axis::Dense(128 / T), |w, i| {
        w.parallel(Axis::Dense(128 / T), |w, j| {
            w.call(
                ADD,
                &[
                    a.tile(i.clone() * T, j.clone() * T, T, T),
                    b.tile(i.clone() * T, j.clone() * T, T, T),
                    c.tile(i * T, j * T, T, T),
                ],
                &[],
            );
        });
    });
    let table = w.finish().unwrap();
    let layouts = w.layouts().to_vec();
    let mut arena = Arena::zeroed(w.arena_size());
    let mut rng = host_tools::rng::SplitMix64::new(9);
    let (x, ga, gb) = (
        rng.fill(8 * 32 * 32),
        rng.fill(128 * 128),
        rng.fill(128 * 128),
    );
    let layout = |name: &str| layouts.iter().find(|l| l.name == name).unwrap().clone();
    arena.write_f32(&layout("x"), &x);
    arena.write_f32(&layout("ga"), &ga);
    arena.write_f32(&layout("gb"), &gb);
    let tasks = 3 * 8 + 16;
    let mut shim = arena.clone();
    let stats = Shim::default().run(&table, &mut shim.bytes).unwrap();
    assert_eq!(stats.tasks as usize, tasks);
    let outcome = run_in_qemu(&table, &arena.bytes);
    let qemu = ran(&outcome, tasks, "pipeline beside a sum");
    assert!(shim.bytes == qemu, "shim and QEMU arenas differ");
    // The sum exactly (one f32 rounding of the f64 sum of two f32), and
    // the pipeline within the GEMM bound of its f64 reference.
    let sum = shim.read_f32(&layout("gc"));
    for (i, (&s, (&p, &q))) in sum.iter().zip(ga.iter().zip(&gb)).enumerate() {
        assert_eq!(s, (p as f64 + q as f64) as f32, "sum element {i}");
    }
    let (want, abs) = host_tools::pipeline::reference(&x, 8, T as usize).unwrap();
    let bound = host_tools::workloads::gemm_bound(abs, T);
    for (i, (&o, &w)) in shim.read_f32(&layout("out")).iter().zip(&want).enumerate() {
        assert!((o as f64 - w).abs() <= bound(i), "pipeline element {i}");
    }
}

/// Decode attention over a paged KV cache, planned on the host and on the
/// device, at reduced sizes: bit-identical arenas and the same cycles.
#[test]
fn decode_attention_is_bit_identical_in_shim_and_qemu() {
    // 8 requests up to 300 tokens, D 32, pages of 16.
    let p = Params {
        m: 8,
        n: 300,
        k: 32,
        tile: 16,
        seed: 4,
    };
    for name in ["decode", "decode-uniform", "decode-skew", "decode-device"] {
        shim_and_qemu_agree(name, p);
    }
}

/// A stack overflow is never silent: `overflow-stack` makes CPU 0 recurse
/// past the end of its stack, into the unmapped guard page below it, on
/// every CPU model. The run must end with the exception handler's report
/// naming the overflow and exit status 3 (`EXIT_EXCEPTION`), not run on
/// with `.bss` overwritten (exit status 1 with `RESULT ERROR overflow-stack:
/// ... without a fault` means the stack has no guard).
#[test]
fn a_stack_overflow_takes_a_fault_in_the_guard_page_in_qemu() {
    let (table, data) = random_dag(7, 8);
    let outcome = run_in_qemu_configured(&table, &data.bytes, |run| {
        run.args = vec!["overflow-stack".into()];
    });
    assert_eq!(
        outcome.status, 3,
        "expected the guard page's fault:\n{}\n{}",
        outcome.stdout, outcome.stderr
    );
    assert!(
        outcome
            .stdout
            .contains("STACK OVERFLOW on core 0: FAR_EL1=0x"),
        "no stack overflow report:\n{}",
        outcome.stdout
    );
    assert!(
        outcome
            .stdout
            .contains("in the guard page of core 0's stack"),
        "{}",
        outcome.stdout
    );
    assert!(!outcome.stdout.contains("RESULT OK"), "{}", outcome.stdout);
}
