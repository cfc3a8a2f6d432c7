//! The same tables on the host shim and in QEMU (bare-metal aarch64, core 0
//! scheduling, cores 1-3 running kernels): bit-identical arenas, both within
//! the stated tolerance of the f64 reference; bad tables end with a clear
//! error and exit status.

use host_tools::shim::Shim;
use host_tools::table::{seal, Arena};
use host_tools::workloads::{Params, Workload};
use wsp_tests::run_in_qemu;

fn shim_and_qemu_agree(name: &str, params: Params) {
    let w = Workload::build(name, params).unwrap();
    let mut shim_arena = w.arena.clone();
    let stats = Shim::default()
        .run(&w.table, &mut shim_arena.bytes)
        .unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);

    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    assert_eq!(
        outcome.status, 0,
        "QEMU run failed:\n{}\n{}",
        outcome.stdout, outcome.stderr
    );
    assert!(outcome.stdout.contains("RESULT OK"), "{}", outcome.stdout);
    assert!(
        outcome.stdout.contains(&format!("tasks={}", w.tasks)),
        "{}",
        outcome.stdout
    );
    let qemu_arena = Arena {
        bytes: outcome.arena_out.expect("the firmware writes arena.out"),
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
