//! Faults end runs cleanly in QEMU: the firmware injects a fault given on
//! its semihosting command line (`fault=..`), reports the typed error the
//! run ended with (naming task, kernel and core), then runs the table again
//! in the same booted image, over the same AICores and mailboxes, without
//! the fault: that run must be clean, pass the reference check and write
//! the same arena as the host shim, bit for bit.

use device_runtime::abi::Table;
use host_tools::shim::Shim;
use host_tools::table::Arena;
use host_tools::workloads::{Params, Workload};
use wsp_tests::{run_in_qemu_configured, QemuOutcome};

fn mlp() -> Workload {
    let p = Params {
        m: 64,
        n: 64,
        k: 64,
        tile: 32,
        seed: 3,
    };
    Workload::build("mlp", p).unwrap()
}

/// Runs `w` in QEMU with `fault` and short timeouts: the faulty run waits
/// for one of them. They count QEMU's clock, which runs on while the host
/// stops QEMU's threads for a moment, so they are far above what a
/// healthy core takes, on a loaded host too.
fn run(w: &Workload, fault: &str) -> QemuOutcome {
    run_in_qemu_configured(&w.table, &w.arena.bytes, |run| {
        run.args = vec![
            format!("fault={fault}"),
            "kernel-timeout-ms=4000".into(),
            "ack-timeout-ms=1500".into(),
        ];
    })
}

/// The faulty run's error line, after checking that the run after it in
/// the same image was clean and bit-identical to the shim's.
fn faulty_then_clean(w: &Workload, fault: &str) -> String {
    let outcome = run(w, fault);
    let all = format!("{}\n{}", outcome.stdout, outcome.stderr);
    assert_eq!(outcome.status, 0, "{fault}: {all}");
    let error = outcome
        .stdout
        .lines()
        .find_map(|l| {
            l.split_once("FAULTY RUN ERROR ")
                .map(|(_, e)| e.to_string())
        })
        .unwrap_or_else(|| panic!("{fault}: no faulty run reported: {all}"));
    assert!(outcome.stdout.contains("RESULT OK"), "{fault}: {all}");
    assert!(
        outcome.stdout.contains(&format!("tasks={} ", w.tasks)),
        "{fault}: the clean run ran every task: {all}"
    );
    let qemu = Arena {
        bytes: outcome.arena_out.expect("the firmware writes arena.out"),
    };
    let check = w.verify(&qemu);
    assert!(check.passed(), "{fault}: the run after the fault: {check}");
    let mut shim = w.arena.clone();
    Shim::default().run(&w.table, &mut shim.bytes).unwrap();
    assert!(
        shim.bytes == qemu.bytes,
        "{fault}: the shim's arena differs"
    );
    error
}

/// The number after `word ` in `text`.
fn number_after(text: &str, word: &str) -> u32 {
    let at = text
        .find(word)
        .unwrap_or_else(|| panic!("{text:?} lacks {word:?}"))
        + word.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("{text:?}: no number after {word:?}"))
}

/// The text names a task of the table that calls kernel `kernel_id`
/// (with its registry name) and core `core`.
fn assert_names(w: &Workload, text: &str, kernel_id: u32, core: u32) {
    let task = number_after(text, "task ");
    let table = Table::parse(&w.table).unwrap();
    assert_eq!(
        table.tasks()[task as usize].kernel_id.get(),
        kernel_id,
        "{text}"
    );
    let name = wsp_ffi::lookup(kernel_id).unwrap().name;
    assert!(
        text.contains(&format!("kernel {kernel_id} ({name})")),
        "{text}"
    );
    assert!(text.contains(&format!("core {core}")), "{text}");
}

const GEMM: u32 = wsp_ffi::WspKernelId_WSP_KERNEL_GEMM_TILE;

#[test]
fn a_kernel_error_code_then_a_clean_run() {
    let w = mlp();
    let text = faulty_then_clean(&w, &format!("error:0:k{GEMM}:42"));
    assert!(
        text.contains("failed on core 0 with error code 42"),
        "{text}"
    );
    assert_names(&w, &text, GEMM, 0);
}

/// The MLP with four times the GEMM tiles: a fault on core 1's first GEMM
/// needs core 1 to get one, and with `mlp`'s few tiles core 0 can take
/// them all when QEMU runs slowly (the host busy with other tests).
fn mlp_wide() -> Workload {
    let p = Params {
        m: 128,
        n: 128,
        k: 64,
        tile: 32,
        seed: 3,
    };
    Workload::build("mlp", p).unwrap()
}

#[test]
fn a_core_that_never_acknowledges_then_a_clean_run() {
    let w = mlp_wide();
    let text = faulty_then_clean(&w, &format!("no-ack:1:k{GEMM}"));
    assert!(
        text.starts_with("core 1 did not acknowledge task"),
        "{text}"
    );
    assert_names(&w, &text, GEMM, 1);
}

#[test]
fn a_core_that_never_finishes_then_a_clean_run() {
    let w = mlp();
    let text = faulty_then_clean(&w, &format!("no-fin:0:k{GEMM}"));
    assert!(
        text.contains("was acknowledged but did not finish"),
        "{text}"
    );
    assert_names(&w, &text, GEMM, 0);
}

#[test]
fn a_kernel_not_built_in_then_a_clean_run() {
    let w = mlp();
    let text = faulty_then_clean(&w, &format!("no-kernel:1:{GEMM}"));
    assert!(text.contains("is not built into core 1"), "{text}");
    assert_names(&w, &text, GEMM, 1);
}

#[test]
fn a_bad_fault_word_is_refused() {
    let w = mlp();
    let outcome = run(&w, "hang:0:1");
    assert_eq!(outcome.status, 4, "{}", outcome.stdout);
    assert!(
        outcome.stdout.contains("no-ack:CORE:TASK"),
        "{}",
        outcome.stdout
    );
}
