//! The MoE layer over token tiles in QEMU at reduced sizes (16 experts,
//! top-4 with a threshold, so that tokens keep 4 down to 0 experts; an
//! expert with every token in the skewed layer): routing and tile counts
//! are decided on the device as on the host shim, and the arenas are
//! bit-identical, both within the f64 reference's bound.

use host_tools::moe_layer::{workload, MoeConfig};
use host_tools::shim::Shim;
use host_tools::table::Arena;
use wsp_tests::run_in_qemu;

fn bit_identical(cfg: &MoeConfig, seed: u64, skew: bool) {
    let w = workload("moe-layer", cfg, seed, skew).unwrap();
    let mut shim = w.arena.clone();
    let stats = Shim::default().run(&w.table, &mut shim.bytes).unwrap();
    assert_eq!(stats.tasks as usize, w.tasks);
    let outcome = run_in_qemu(&w.table, &w.arena.bytes);
    assert_eq!(
        outcome.status, 0,
        "QEMU run failed:\n{}\n{}",
        outcome.stdout, outcome.stderr
    );
    assert!(
        outcome.stdout.contains(&format!("tasks={} ", w.tasks)),
        "expected {} tasks: {}",
        w.tasks,
        outcome.stdout
    );
    let qemu = Arena {
        bytes: outcome.arena_out.expect("the firmware writes arena.out"),
    };
    let check = w.verify(&shim);
    assert!(check.passed(), "shim: {check}");
    let check = w.verify(&qemu);
    assert!(check.passed(), "qemu: {check}");
    assert!(shim.bytes == qemu.bytes, "shim and QEMU arenas differ");
}

#[test]
fn moe_layer_is_bit_identical_in_shim_and_qemu() {
    let cfg = MoeConfig {
        tokens: 80,
        hidden: 64,
        ffn: 64,
        experts: 16,
        top_k: 4,
        threshold: 0.08,
        tile: 8,
        shared_ffn: 64,
    };
    bit_identical(&cfg, 5, false);
    bit_identical(
        &MoeConfig {
            threshold: 0.0,
            ..cfg
        },
        6,
        true,
    );
}
