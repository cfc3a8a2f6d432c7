//! `sparse-decode` in QEMU at reduced sizes (dense up to 64 tokens,
//! top-16, indexer chunks of 16 up to 128 tokens and of 32 up to 512): the
//! tiers are chosen on the device as on the host shim, and the arenas are
//! bit-identical, both within the f64 reference's bound.

use host_tools::attention::sparse::{sparse_workload, SparseData, SparseShape, Tier, Tiers};
use host_tools::attention::DecodeShape;
use wsp_tests::shim_and_qemu;

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
    shim_and_qemu(&w);
}
