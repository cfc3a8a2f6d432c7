//! Stitching: two independent batches in one run. A decode step of `m`
//! requests and a prefill chunk of `n` tokens of another request (tokens
//! `PREFILL_START .. PREFILL_START + n` of it, attending causally to its
//! cache and to each other), each through the layers, as one program with
//! no dependency between the two: their tasks interleave on the cores,
//! and the cores one batch leaves idle (the decode step's attention is
//! short of work, the chunk's GEMMs are long) run the other's.

use super::layer::{
    shape_of, stitched_workload, summary_of, LayerData, LayerShape, Mlp, MAX_BATCH,
};
use crate::workloads::{Params, Workload, WorkloadError};

/// Tokens of the chunk's request already in its cache.
pub const PREFILL_START: u32 = 384;

/// The two batches of `stitched` from `p`: `m` decode requests with the
/// `decode` lengths up to 2,048, and a prefill chunk of `n` tokens; hidden
/// `k` (heads of 64), pages of `tile`; the chunk's data seeded apart.
pub fn batches(p: &Params) -> Result<[LayerData; 2], WorkloadError> {
    let [decode, chunk] = shapes(p)?;
    Ok([
        LayerData::build(decode, p.seed)?,
        LayerData::prefill_chunk(chunk, p.seed ^ 0x5eed)?,
    ])
}

/// The shapes of [`batches`]: the decode step's and the prefill chunk's.
pub fn shapes(p: &Params) -> Result<[LayerShape; 2], WorkloadError> {
    let decode = shape_of(&Params { n: 2048, ..*p }, Mlp::Dense)?;
    // The chunk's tokens are its rows: as many as a batch may have
    // (checked here, before a length is listed for each).
    if p.n == 0 || p.n > MAX_BATCH {
        let why = format!(
            "a prefill chunk of {} tokens: the layer takes 1 ..= {}",
            p.n, MAX_BATCH
        );
        return Err(WorkloadError::Params(why));
    }
    let chunk = LayerShape {
        lengths: (PREFILL_START + 1..=PREFILL_START + p.n).collect(),
        ..decode.clone()
    };
    Ok([decode, chunk])
}

/// `stitched`: [`batches`] as one program.
pub fn stitched(p: Params) -> Result<Workload, WorkloadError> {
    let [a, b] = batches(&p)?;
    let summary = format!(
        "two independent batches in one run: (a) {}; (b) a prefill chunk of {} tokens \
         (positions {} ..= {}) of one request, same layers",
        summary_of(&a),
        p.n,
        PREFILL_START,
        PREFILL_START + p.n - 1
    );
    stitched_workload("stitched", &[a, b], summary)
}
