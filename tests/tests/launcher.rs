//! The C launcher (`launcher/`) that stands in for CANN's launch flow and
//! the AICores, under qemu-user, with a minimal AICPU program
//! (`launcher/fake_aicpu.c`) that follows CANN's handshake by the letter:
//! bring-up, two ADD tasks per core (both payload buffers), shut-down.
//! The launcher must serve the handshake, run the kernels at the addresses
//! it published, report results and errors through the result word, and
//! inject the faults it is asked for without hanging.

use wsp_tests::{run_in_launcher, LauncherOutcome, FAKE_AICPU_SO};

/// The fake's arena: per core, A, B and C of 8 f32 each (96 bytes).
fn arena(cores: usize) -> Vec<u8> {
    let mut bytes = Vec::new();
    for c in 0..cores {
        let a = (0..8).map(|i| (c * 10 + i) as f32);
        let b = (0..8).map(|i| i as f32 * 0.5 + c as f32);
        for x in a.chain(b).chain([0.0; 8]) {
            bytes.extend_from_slice(&x.to_le_bytes());
        }
    }
    bytes
}

/// C of every core after both tasks: A + B, then + B again.
fn expected_c(cores: usize) -> Vec<Vec<f32>> {
    (0..cores)
        .map(|c| {
            (0..8)
                .map(|i| {
                    let (a, b) = ((c * 10 + i) as f32, i as f32 * 0.5 + c as f32);
                    a + b + b
                })
                .collect()
        })
        .collect()
}

fn c_of(arena: &[u8], cores: usize) -> Vec<Vec<f32>> {
    (0..cores)
        .map(|c| {
            arena[96 * c + 64..96 * c + 96]
                .as_chunks::<4>()
                .0
                .iter()
                .map(|w| f32::from_le_bytes(*w))
                .collect()
        })
        .collect()
}

fn fake(cores: usize, options: &[&str]) -> LauncherOutcome {
    run_in_launcher(FAKE_AICPU_SO, &[0; 64], &arena(cores), options)
}

#[test]
fn the_launcher_serves_every_cores_handshake_and_runs_its_kernels() {
    for (cube, vector, threads) in [("2", "2", "2"), ("1", "2", "3"), ("3", "0", "1")] {
        let cores: usize = cube.parse::<usize>().unwrap() + vector.parse::<usize>().unwrap();
        let what = format!("{cube} cube + {vector} vector, {threads} threads");
        let outcome = fake(
            cores,
            &["--cube", cube, "--vector", vector, "--threads", threads],
        );
        assert_eq!(
            outcome.status, 0,
            "{what}:\n{}\n{}",
            outcome.stdout, outcome.stderr
        );
        assert!(
            outcome.stdout.contains("RESULT OK"),
            "{what}: {}",
            outcome.stdout
        );
        assert!(
            outcome.stdout.contains(&format!("tasks={} ", 2 * cores)),
            "{what}: {}",
            outcome.stdout
        );
        let out = outcome
            .arena_out
            .expect("a successful run writes the arena");
        assert_eq!(c_of(&out, cores), expected_c(cores), "{what}");
        // A and B are inputs only.
        assert_eq!(out[..64], arena(cores)[..64], "{what}");
    }
}

/// A fake run that must fail: the launcher exits 1 (not 3, timed out: the
/// faulty core still leaves when told to) and prints the program's error
/// text, which is returned.
fn failed_with(options: &[&str]) -> String {
    let outcome = fake(4, options);
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

#[test]
fn a_core_that_never_acknowledges_is_reported_and_still_exits() {
    let error = failed_with(&["--fault", "never-ack=1"]);
    assert_eq!(error, "core 1 did not acknowledge task 1 (kernel add)");
}

#[test]
fn a_core_that_never_finishes_is_reported_and_still_exits() {
    let error = failed_with(&["--fault", "never-fin=2"]);
    assert_eq!(error, "task 1 (kernel add) on core 2 did not finish");
}

#[test]
fn an_injected_kernel_error_arrives_as_the_failed_result_word() {
    let error = failed_with(&["--fault", "error=1:7"]);
    assert_eq!(
        error,
        "task 1 (kernel add) failed on core 0 with error code 7"
    );
}

#[test]
fn an_omitted_kernel_has_address_zero() {
    let error = failed_with(&["--omit-kernel", "1"]);
    assert_eq!(error, "kernel add is not built in; the table declares it");
}

#[test]
fn bad_launcher_options_are_refused_with_a_message() {
    for bad in [
        &["--threads", "0"][..],
        &["--cube", "0", "--vector", "0"],
        &["--fault", "never-ack=4"],
        &["--fault", "sometimes"],
        &["--fault", "error=1"],
        &["--fault", "error=99:1"],
        &["--omit-kernel", "x"],
        &["--threads"],
        &["--launch", "no-such-launch-block.bin"],
    ] {
        let outcome = fake(4, bad);
        assert_eq!(outcome.status, 2, "{bad:?}: {}", outcome.stderr);
        assert!(
            outcome.stderr.contains("wsp-launcher: "),
            "{bad:?}: {}",
            outcome.stderr
        );
        assert!(outcome.arena_out.is_none());
    }
}

/// A table file is one table: one with bytes after its header's
/// `total_len` (`cat table.bin garbage > t2.bin`) is refused as bad input
/// before the program is loaded, naming the table's length and the
/// file's, as `wsp run` refuses it; the runtime would read the table and
/// silently ignore the rest. The table itself passes the launcher's check
/// (and the fake program, which ignores it, runs).
#[test]
fn a_table_file_with_bytes_after_the_table_is_refused() {
    let p = host_tools::workloads::Params {
        m: 32,
        n: 32,
        k: 32,
        tile: 32,
        seed: 1,
    };
    let table = host_tools::workloads::Workload::build("gemm", p)
        .unwrap()
        .table;
    let total = table.len();
    let mut appended = table.clone();
    appended.extend_from_slice(b"garbage\n");
    let outcome = run_in_launcher(FAKE_AICPU_SO, &appended, &arena(4), &[]);
    assert_eq!(outcome.status, 2, "{}\n{}", outcome.stdout, outcome.stderr);
    let says = format!(
        "table.bin: invalid descriptor table: section `header`, entry 0, field `total_len`: \
         the table is {total} bytes long, but {} bytes were given: 8 bytes follow it",
        total + 8
    );
    assert!(outcome.stderr.contains(&says), "{}", outcome.stderr);
    assert!(!outcome.stdout.contains("RESULT"), "{}", outcome.stdout);
    assert!(outcome.arena_out.is_none());
    let outcome = run_in_launcher(FAKE_AICPU_SO, &table, &arena(4), &[]);
    assert_eq!(outcome.status, 0, "{}\n{}", outcome.stdout, outcome.stderr);
    assert!(outcome.stdout.contains("RESULT OK"), "{}", outcome.stdout);
}
