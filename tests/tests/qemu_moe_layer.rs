//! The MoE layer over token tiles in QEMU at reduced sizes (16 experts,
//! top-4 with a threshold, so that tokens keep 4 down to 0 experts; an
//! expert with every token in the skewed layer): routing and tile counts
//! are decided on the device as on the host shim, and the arenas are
//! bit-identical, both within the f64 reference's bound.

use host_tools::moe_layer::{workload, MoeConfig};
use wsp_tests::shim_and_qemu;

fn bit_identical(cfg: &MoeConfig, seed: u64, skew: bool) {
    let w = workload("moe-layer", cfg, seed, skew).unwrap();
    shim_and_qemu(&w);
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
