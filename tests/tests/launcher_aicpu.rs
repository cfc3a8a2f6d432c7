//! The AICPU shared object (`libwsp_aicpu.so`) as CANN's launch flow would
//! run it, without hardware: the C launcher (`launcher/`, tested on its own
//! in `launcher.rs`) dlopens it, calls its entry points on AICPU threads and
//! emulates the AICores over malloc'd register files, all under qemu-user. The same tables as the host
//! shim must give bit-identical arenas and the same task counts; injected
//! faults must end the run with the runtime's error text naming the task,
//! the kernel and the core.

use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workloads::{Params, Workload};
use wsp_tests::{launch_block, run_in_launcher, run_in_launcher_with, LauncherOutcome, AICPU_SO};

/// A workload at reduced sizes, so that the debug CI run stays short.
fn small(name: &str) -> Workload {
    let params = match name {
        "gemm" => Params {
            m: 64,
            n: 64,
            k: 64,
            tile: 32,
            seed: 1,
        },
        // Requests, longest KV length, head dimension, page size.
        "decode" => Params {
            m: 8,
            n: 256,
            k: 64,
            tile: 16,
            seed: 1,
        },
        _ => Params::of(name).unwrap(),
    };
    Workload::build(name, params).unwrap()
}

/// The arena of a launcher run that succeeded after `tasks` tasks.
fn ran(outcome: &LauncherOutcome, tasks: usize, what: &str) -> Vec<u8> {
    let o = outcome;
    wsp_tests::succeeded(
        "launcher",
        (o.status, &o.stdout, &o.stderr),
        &o.arena_out,
        tasks,
        what,
    )
}

/// Runs workload `name` on the host shim and through the launcher (on
/// `threads` AICPU threads, all of them schedulers): bit-identical arenas,
/// the same tasks, both within the workload's tolerance of the f64
/// reference.
fn shim_and_launcher_agree(name: &str, threads: u32) {
    let w = small(name);
    let mut shim = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut shim.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    let launch = launch_block(&[], threads, "").unwrap();
    let threads = threads.to_string();
    let outcome = run_in_launcher_with(
        AICPU_SO,
        &w.table,
        &w.arena.bytes,
        Some(&launch),
        &["--threads", &threads],
    );
    let launched = Arena {
        bytes: ran(&outcome, w.tasks, name),
    };
    let check = w.verify(&shim);
    assert!(check.passed(), "{name} shim: {check}");
    let check = w.verify(&launched);
    assert!(check.passed(), "{name} launcher: {check}");
    assert!(
        shim.bytes == launched.bytes,
        "{name}: shim and launcher arenas differ"
    );
}

#[test]
fn gemm_through_the_aicpu_so_is_bit_identical_to_the_shim() {
    shim_and_launcher_agree("gemm", 2);
}

#[test]
fn moe_through_the_aicpu_so_is_bit_identical_to_the_shim() {
    shim_and_launcher_agree("moe", 2);
}

#[test]
fn decode_through_the_aicpu_so_is_bit_identical_to_the_shim() {
    shim_and_launcher_agree("decode", 2);
}

#[test]
fn one_and_four_aicpu_threads_give_the_same_arena() {
    shim_and_launcher_agree("gemm", 1);
    shim_and_launcher_agree("gemm", 4);
}

/// Without a launch block the runtime takes its defaults.
#[test]
fn no_launch_block_runs_with_the_runtimes_defaults() {
    let w = small("gemm");
    let outcome = run_in_launcher(AICPU_SO, &w.table, &w.arena.bytes, &[]);
    ran(&outcome, w.tasks, "gemm without a launch block");
}

/// A run of gemm that must fail: the launcher exits 1 and prints the
/// runtime's error text, which is returned.
fn failed_with(options: &[&str]) -> String {
    failed_on(None, options)
}

/// [`failed_with`] with a launch block, if given.
fn failed_on(launch: Option<&[u8]>, options: &[&str]) -> String {
    let w = small("gemm");
    let outcome = run_in_launcher_with(AICPU_SO, &w.table, &w.arena.bytes, launch, options);
    assert_eq!(
        outcome.status, 1,
        "{options:?}: expected a failed run:\n{}\n{}",
        outcome.stdout, outcome.stderr
    );
    assert!(outcome.arena_out.is_none(), "a failed run writes no arena");
    let line = outcome
        .stdout
        .lines()
        .find(|l| l.starts_with("RESULT ERROR "))
        .unwrap_or_else(|| panic!("{options:?}: no RESULT ERROR line:\n{}", outcome.stdout));
    line["RESULT ERROR ".len()..].to_string()
}

/// The number after the first `word ` in `text` (e.g. `core 1`), if any.
fn number_after(text: &str, word: &str) -> Option<u64> {
    let at = text.find(&format!("{word} "))? + word.len() + 1;
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The error names a task of the table, a kernel and core `core`.
fn names_task_kernel_and_core(error: &str, core: u64) {
    let tasks = small("gemm").tasks as u64;
    let task = number_after(error, "task").unwrap_or_else(|| panic!("no task in: {error}"));
    assert!(task < tasks, "task {task} of {tasks}: {error}");
    assert!(error.contains("kernel "), "no kernel in: {error}");
    assert_eq!(number_after(error, "core"), Some(core), "{error}");
}

#[test]
fn a_core_that_never_finishes_ends_the_run_naming_task_kernel_and_core() {
    let error = failed_with(&["--fault", "never-fin=0"]);
    names_task_kernel_and_core(&error, 0);
}

/// On one AICPU thread, which owns both cube cores: gemm's first four
/// tiles are ready at once and that thread issues one to each idle core,
/// so core 1 surely gets a task. (On two threads, core 1's thread could
/// find every task stolen by the other before it ran a round, on a loaded
/// host, and the run then passed without the fault.)
#[test]
fn a_core_that_never_acknowledges_ends_the_run_naming_task_kernel_and_core() {
    let launch = launch_block(&[], 1, "").unwrap();
    let error = failed_on(Some(&launch), &["--threads", "1", "--fault", "never-ack=1"]);
    names_task_kernel_and_core(&error, 1);
}

/// The AICore reports `WSP_KERNEL_FAILED_BASE | 7` as the task's result.
#[test]
fn an_injected_kernel_error_ends_the_run_naming_task_kernel_core_and_code() {
    let error = failed_with(&["--fault", "error=2:7"]);
    assert!(error.contains("error code 7"), "{error}");
    // gemm's tiles run on the cube cores, 0 and 1.
    let core = number_after(&error, "core").unwrap_or_else(|| panic!("no core in: {error}"));
    names_task_kernel_and_core(&error, core);
}

/// Kernel 2 (gemm_tile) has address 0 in the kernel address table: the
/// run ends before anything runs.
#[test]
fn a_kernel_not_built_in_is_refused_before_the_run() {
    let error = failed_with(&["--omit-kernel", "2"]);
    assert!(error.contains("not built into core"), "{error}");
}

/// The shim's arena of gemm, and the launcher's outcome of `options` with
/// gemm's launch block on two threads.
fn gemm_shim_and_launcher(options: &[&str]) -> (Arena, LauncherOutcome) {
    let w = small("gemm");
    let mut shim = w.arena.clone();
    Shim::default().run(&w.table, &mut shim.bytes).unwrap();
    let launch = launch_block(&[], 2, "").unwrap();
    let outcome = run_in_launcher_with(AICPU_SO, &w.table, &w.arena.bytes, Some(&launch), options);
    (shim, outcome)
}

/// Three launches of one table in one dlopen, as CANN makes every
/// inference step a launch: each from a fresh copy of the input arena,
/// each with every task, each arena the shim's (the launcher compares the
/// launches' arenas; the last is written).
#[test]
fn three_launches_in_one_load_each_give_the_shims_arena() {
    let (shim, outcome) = gemm_shim_and_launcher(&["--repeat", "3"]);
    let tasks = small("gemm").tasks;
    let arena = ran(&outcome, tasks, "gemm, three launches");
    for l in 1..=3 {
        assert!(
            outcome
                .stdout
                .contains(&format!("LAUNCH {l} OK tasks={tasks}\n")),
            "launch {l}: {}",
            outcome.stdout
        );
    }
    assert!(
        arena == shim.bytes,
        "the launches' arena differs from the shim's"
    );
}

/// A launch that a kernel fault ends, then two more in the same load:
/// they run clean, as the first launch of a load would.
#[test]
fn launches_after_a_kernel_fault_in_the_same_load_are_clean() {
    let (shim, outcome) = gemm_shim_and_launcher(&[
        "--repeat",
        "3",
        "--fault",
        "error=2:7",
        "--faulty-launches",
        "1",
    ]);
    let tasks = small("gemm").tasks;
    let arena = ran(&outcome, tasks, "gemm after a kernel fault");
    let faulty = outcome
        .stdout
        .lines()
        .find(|l| l.starts_with("LAUNCH 1 ERROR "))
        .unwrap_or_else(|| panic!("launch 1 did not fail: {}", outcome.stdout));
    assert!(faulty.contains("error code 7"), "{faulty}");
    for l in 2..=3 {
        assert!(
            outcome
                .stdout
                .contains(&format!("LAUNCH {l} OK tasks={tasks}\n")),
            "launch {l}: {}",
            outcome.stdout
        );
    }
    assert!(
        arena == shim.bytes,
        "the clean launches' arena differs from the shim's"
    );
}
