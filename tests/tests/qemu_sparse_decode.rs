//! `sparse-decode` in QEMU at reduced sizes (dense up to 64 tokens,
//! top-16, indexer chunks of 16 up to 128 tokens and of 32 up to 512): the
//! tiers are chosen on the device as on the host shim, and the arenas are
//! bit-identical, both within the f64 reference's bound.

use host_tools::attention::sparse::{sparse_workload, SparseData, SparseShape, Tier, Tiers};
use host_tools::attention::DecodeShape;
use host_tools::shim::Shim;
use host_tools::table::Arena;
use wsp_tests::run_in_qemu;

#[test]
fn sparse_decode_is_bit_identical_in_shim_and_qemu() {
    let shape = SparseShape {
        decode: DecodeShape {
            lengths: vec![1, 64, 65, 300, 17, 128, 129, 512],
            q_heads: 8,
            kv_heads: 2,
            d: 32,
            page: 16,
        },
        index_heads: 4,
        index_dim: 16,
        tiers: Tiers {
            dense_max: 64,
            k_max: 16,
            sparse: vec![
                Tier {
                    longest: 128,
                    chunk: 16,
                },
                Tier {
                    longest: 512,
                    chunk: 32,
                },
            ],
        },
    };
    let data = SparseData::build(shape, 4).unwrap();
    let w = sparse_workload("sparse-decode", &data).unwrap();
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
