//! The earlier implementation's (v9's) examples, at its sizes, as named
//! workloads (`wsp run wsp9-bgemm`), each checked against an f64
//! reference like the other workloads.
//!
//! v9 timed them in semantic cycles under the same cost model as ours
//! (TLOAD, TSTORE and elementwise ops: rows x cols; TMATMUL: M K N), on 4
//! workers, issuing strictly in program order with no dependency
//! inference. Our runtime tracks dependencies and issues out of order, and
//! our cores are typed: v9's 4 workers are 4 cores of the kind the
//! example's kernels run on (cube for the matrix products and the
//! attention, vector for the rest). The examples:
//!
//! | name | computes | tasks |
//! |---|---|---|
//! | `wsp9-validated-matmul` | one 16 x 16 x 16 product (`matmul`) | 1 |
//! | `wsp9-tensor-data-add` | C = A + B on `[2,2,2,32,32]` in 32 x 32 tiles (`add`) | 8 |
//! | `wsp9-tensor-data-square` | C = A * A on `[2,4,32,32]` in 32 x 32 tiles (`square`) | 8 |
//! | `wsp9-attention` | softmax(Q K^T / sqrt(D)) V, B1 H2 S16 D8, 8 query rows a task over all 16 keys (`attn_decode_partial`) | 4 |
//! | `wsp9-bgemm` | C = A x B, 64^3 in 16^3 tiles, accumulating over k in order (`gemm_tile`) | 64 |
//! | `wsp9-softmax` | row softmax of 1x32x256 in blocks of 8 rows (`softmax`: max, exp, sum and divide in one kernel) | 4 |
//! | `wsp9-csp-pipeline` | loader -> square -> storer over 8 tiles of 64 x 64, channels of depth 2 (`copy`, `square`, `copy`) | 24 |
//! | `wsp9-lightning-indexer` | top-8 of 32 scores for each of 2 x 4 query tokens (`topk`) | 8 |
//!
//! Their sizes are v9's and fixed: [`params`] gives them, and a build with
//! other sizes is refused (the seed may change).

mod attention;
mod pipeline;
mod tiles;

use crate::table::{Arena, TableBuilder};
use crate::workloads::{Params, Verification, Workload, WorkloadError};

/// f32 unit roundoff.
pub(crate) const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The examples' names, as `wsp run` takes them.
pub const NAMES: [&str; 8] = [
    "wsp9-validated-matmul",
    "wsp9-tensor-data-add",
    "wsp9-tensor-data-square",
    "wsp9-attention",
    "wsp9-bgemm",
    "wsp9-softmax",
    "wsp9-csp-pipeline",
    "wsp9-lightning-indexer",
];

const fn sizes(m: u32, n: u32, k: u32, tile: u32) -> Params {
    Params {
        m,
        n,
        k,
        tile,
        seed: 1,
    }
}

/// The fixed sizes of the example called `name`, with seed 1. What `m`,
/// `n`, `k` and `tile` stand for differs per example:
/// `wsp9-validated-matmul` and `wsp9-bgemm`: M, N, K and the tile edge;
/// `wsp9-tensor-data-*`: rows (the leading dimensions flattened), columns,
/// columns again, and the tile edge; `wsp9-attention`: query rows S, keys
/// S, head dimension D, query rows per task; `wsp9-softmax`: rows, columns,
/// columns again, rows per task; `wsp9-csp-pipeline`: tiles x tile rows,
/// the tile edge twice and the tile edge; `wsp9-lightning-indexer`: query
/// tokens (2 batches x 4), scores per token, k, scores per token.
pub fn params(name: &str) -> Option<Params> {
    Some(match name {
        "wsp9-validated-matmul" => sizes(16, 16, 16, 16),
        "wsp9-tensor-data-add" => sizes(256, 32, 32, 32),
        "wsp9-tensor-data-square" => sizes(256, 32, 32, 32),
        "wsp9-attention" => sizes(16, 16, 8, 8),
        "wsp9-bgemm" => sizes(64, 64, 64, 16),
        "wsp9-softmax" => sizes(32, 256, 256, 8),
        "wsp9-csp-pipeline" => sizes(512, 64, 64, 64),
        "wsp9-lightning-indexer" => sizes(8, 32, 8, 32),
        _ => return None,
    })
}

/// Builds the example called `name` (one of [`NAMES`]) with `p`'s seed;
/// `p`'s sizes must be the example's own ([`params`]).
pub fn build(name: &str, p: Params) -> Result<Workload, WorkloadError> {
    let own = params(name).ok_or_else(|| WorkloadError::Unknown(name.to_string()))?;
    if p != (Params {
        seed: p.seed,
        ..own
    }) {
        return Err(WorkloadError::Params(format!(
            "{name} has v9's fixed sizes (m {}, n {}, k {}, tile {}); only --seed may change",
            own.m, own.n, own.k, own.tile
        )));
    }
    let seed = p.seed;
    match name {
        "wsp9-validated-matmul" => tiles::validated_matmul(seed),
        "wsp9-tensor-data-add" => tiles::tensor_data_add(seed),
        "wsp9-tensor-data-square" => tiles::tensor_data_square(seed),
        "wsp9-attention" => attention::attention(seed),
        "wsp9-bgemm" => tiles::bgemm(seed),
        "wsp9-softmax" => tiles::softmax(seed),
        "wsp9-csp-pipeline" => pipeline::csp_pipeline(seed),
        "wsp9-lightning-indexer" => attention::lightning_indexer(seed),
        _ => Err(WorkloadError::Unknown(name.to_string())),
    }
}

/// The workload of a finished table builder.
pub(crate) fn finish(
    name: &'static str,
    summary: String,
    b: &TableBuilder,
    arena: Arena,
    check: impl Fn(&Arena) -> Verification + 'static,
) -> Result<Workload, WorkloadError> {
    Ok(Workload {
        name,
        summary,
        table: b.finish()?,
        arena,
        tensors: b.layouts().to_vec(),
        tasks: b.num_tasks(),
        csp: Default::default(),
        check: Box::new(check),
    })
}
