//! The decode layer in QEMU at reduced sizes: two layers (and an MoE step
//! of twelve) over 5 requests of 1 to 80 tokens, hidden 128; the
//! firmware's arena is bit-identical to the shim's and within the f64
//! reference's bound.

use host_tools::model::layer::shape_of;
use host_tools::model::{decode_layer_workload, LayerData, Mlp};
use host_tools::workloads::Params;
use wsp_tests::shim_and_qemu;

/// 5 requests of 1 to 80 tokens, hidden 128, pages of 16.
fn params() -> Params {
    Params {
        m: 5,
        n: 80,
        k: 128,
        tile: 16,
        seed: 9,
    }
}

#[test]
fn decode_layer_dense_is_bit_identical_in_shim_and_qemu() {
    let p = params();
    let data = LayerData::build(shape_of(&p, Mlp::Dense).unwrap(), p.seed).unwrap();
    shim_and_qemu(&decode_layer_workload("decode-layer-dense", &data).unwrap());
}

#[test]
fn decode_layer_moe_is_bit_identical_in_shim_and_qemu() {
    // 16 experts of 64, top 4 above p = 0.1 (4 down to 0 per token), tiles
    // of 4 rows, a shared expert.
    let p = params();
    let cfg = host_tools::moe_layer::MoeConfig {
        tokens: 0,
        hidden: 0,
        ffn: 64,
        experts: 16,
        top_k: 4,
        threshold: 0.1,
        tile: 4,
        shared_ffn: 64,
    };
    let data = LayerData::build(shape_of(&p, Mlp::Moe(cfg)).unwrap(), p.seed).unwrap();
    shim_and_qemu(&decode_layer_workload("decode-layer", &data).unwrap());
}

#[test]
fn a_twelve_layer_moe_step_is_bit_identical_in_shim_and_qemu() {
    // Past the firmware's old limits: a program of more than 4,096
    // instructions (validated in one pass, its jump targets in a bitset on
    // the stack) and 15 data tensors (12 routing tensors and 3 shared);
    // the layers take turns with two layers' scratch tensors.
    let p = params();
    let cfg = host_tools::moe_layer::MoeConfig {
        tokens: 0,
        hidden: 0,
        ffn: 64,
        experts: 16,
        top_k: 2,
        threshold: 0.0,
        tile: 4,
        shared_ffn: 0,
    };
    let shape = host_tools::model::LayerShape {
        layers: 12,
        ..shape_of(&p, Mlp::Moe(cfg)).unwrap()
    };
    let data = LayerData::build(shape, p.seed).unwrap();
    let w = decode_layer_workload("decode-layer", &data).unwrap();
    let table = device_runtime::abi::Table::parse(&w.table).unwrap();
    assert!(table.program().len() > 4096, "{}", table.program().len());
    assert_eq!(table.program_info().data().len(), 12 + 3);
    shim_and_qemu(&w);
}
