//! The firmware's measuring modes (`cargo xtask qemu-bench`) in QEMU:
//! `empty-kernels` runs the table's tasks without calling their kernels
//! (the arena comes back as it went in, where a normal run changes it),
//! `baseline=N` gets N tasks through the cores without a table, both print
//! their timer ticks (the same every time when QEMU counts instructions),
//! and an unknown word is a clear error.

use host_tools::table::{Arg, TableBuilder};
use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::WspKernelId_WSP_KERNEL_ADD as ADD;
use wsp_tests::{run_in_qemu, run_in_qemu_configured, QemuOutcome};

/// 8 adds of 1 x 4 tiles: z[i] = x[i] + y[i]; the table and an arena of
/// ones in x and y (z starts at 0).
fn adds() -> (Vec<u8>, Vec<u8>) {
    let mut b = TableBuilder::new();
    let x = b.tensor("x", &[8, 4]).unwrap();
    let y = b.tensor("y", &[8, 4]).unwrap();
    let z = b.tensor("z", &[8, 4]).unwrap();
    for i in 0..8 {
        let row = |t, access| Arg::tile(t, access, i, 0, 1, 4);
        b.task(ADD, &[row(x, In), row(y, In), row(z, Out)], &[])
            .unwrap();
    }
    let mut arena = vec![0u8; b.arena_size() as usize];
    for t in [x, y] {
        let layout = b.layout(t);
        let start = layout.arena_offset as usize;
        let bytes = &mut arena[start..start + layout.elements() * 4];
        for word in bytes.as_chunks_mut::<4>().0 {
            *word = 1.0f32.to_le_bytes();
        }
    }
    (b.finish().unwrap(), arena)
}

/// The `bench` line's `tasks` and `ticks` (and a positive `freq`).
fn bench_line(outcome: &QemuOutcome) -> (u64, u64) {
    assert_eq!(outcome.status, 0, "{}\n{}", outcome.stdout, outcome.stderr);
    let line = outcome
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("bench "))
        .unwrap_or_else(|| panic!("no bench line: {}", outcome.stdout));
    let field = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            .parse()
            .unwrap()
    };
    assert!(field("freq") > 0, "{line}");
    (field("tasks"), field("ticks"))
}

#[test]
fn empty_kernels_run_every_task_without_its_kernel_in_qemu() {
    let (table, arena) = adds();
    let normal = run_in_qemu(&table, &arena);
    assert_eq!(normal.status, 0, "{}", normal.stdout);
    assert!(
        !normal.stdout.contains("bench "),
        "a normal run prints no bench line: {}",
        normal.stdout
    );
    assert_ne!(
        normal.arena_out.as_deref(),
        Some(&arena[..]),
        "a normal run adds"
    );

    let empty = run_in_qemu_configured(&table, &arena, |run| {
        run.args = vec!["empty-kernels".into()];
    });
    let (tasks, ticks) = bench_line(&empty);
    assert_eq!(tasks, 8);
    assert!(ticks > 0);
    assert!(
        empty.stdout.contains("tasks=8 "),
        "every task ran: {}",
        empty.stdout
    );
    assert_eq!(
        empty.arena_out.as_deref(),
        Some(&arena[..]),
        "no kernel ran, so the arena is as it went in"
    );
}

#[test]
fn the_baseline_gets_n_tasks_through_the_cores_in_qemu() {
    // No table or arena: the baseline reads neither.
    let outcome = run_in_qemu_configured(&[], &[], |run| {
        (run.table, run.arena) = (None, None);
        run.args = vec!["baseline=1001".into()];
    });
    let (tasks, ticks) = bench_line(&outcome);
    assert_eq!(tasks, 1001);
    assert!(ticks > 0);
    assert!(outcome.stdout.contains("RESULT OK"), "{}", outcome.stdout);
}

#[test]
fn unknown_measuring_words_are_clear_errors_in_qemu() {
    for (word, error) in [
        ("fast", "unknown word on the semihosting command line"),
        ("baseline=0", "baseline=N: N must be a whole number above 0"),
        ("baseline=x", "baseline=N: N must be a whole number above 0"),
        // (0 ms is refused by `QemuRun` before QEMU starts; the firmware
        // refuses it with this message too.)
        (
            "ack-timeout-ms=x",
            "kernel-timeout-ms=N, ack-timeout-ms=N: N must be a whole number above 0",
        ),
    ] {
        let outcome = run_in_qemu_configured(&[], &[], |run| {
            (run.table, run.arena) = (None, None);
            run.args = vec![word.into()];
        });
        assert_eq!(outcome.status, 4, "{word}: {}", outcome.stdout);
        assert!(
            outcome.stdout.contains(&format!("RESULT ERROR {error}")),
            "{word}: {}",
            outcome.stdout
        );
    }
}

#[test]
fn under_icount_the_baseline_takes_the_same_ticks_every_time_in_qemu() {
    let ticks = |tasks: u64| {
        let outcome = run_in_qemu_configured(&[], &[], |run| {
            (run.table, run.arena) = (None, None);
            run.icount = true;
            run.args = vec![format!("baseline={tasks}")];
        });
        let (ran, ticks) = bench_line(&outcome);
        assert_eq!(ran, tasks);
        ticks
    };
    let once = ticks(2000);
    assert_eq!(once, ticks(2000), "instructions, not the host's clock");
    assert!(ticks(4000) > once, "more tasks, more instructions");
}
