//! v9's attention and lightning-indexer examples.

use wsp_ffi::ArgAccess::{In, Out};
use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ATTN_DECODE_PARTIAL as PARTIAL, WspKernelId_WSP_KERNEL_TOPK as TOPK,
};

use super::finish;
use crate::rng::SplitMix64;
use crate::table::{Arena, Arg, TableBuilder};
use crate::workloads::{Verification, Workload, WorkloadError};

/// Heads, sequence length, head dimension and query rows per task of the
/// attention example (B1 H2 S16 D8, tile 8).
const HEADS: u32 = 2;
const SEQ: u32 = 16;
const DIM: u32 = 8;
const ROWS: u32 = 8;

/// O = softmax(Q K^T / sqrt(D)) V per head, B1 H2 S16 D8, no mask: one
/// `attn_decode_partial` task per head and 8 query rows, over all 16 keys
/// (4 tasks). Each head's keys and values are one page of 16 tokens (keys
/// in rows 0..16 of the head's pool region, values in rows 16..32); the
/// task writes o (the output rows) and the rows' m and l.
pub(super) fn attention(seed: u64) -> Result<Workload, WorkloadError> {
    let mut b = TableBuilder::new();
    let q = b.tensor("Q", &[HEADS * SEQ, DIM])?;
    let kv = b.tensor("KV", &[HEADS * 2 * SEQ, DIM])?;
    let table = b.tensor_i32("table", &[1, 1])?;
    let o = b.tensor("O", &[HEADS * SEQ, DIM + 2])?;
    let scale = (1.0 / (DIM as f64).sqrt()) as f32;
    for h in 0..HEADS {
        for r in (0..SEQ).step_by(ROWS as usize) {
            let args = [
                Arg::tile(q, In, h * SEQ + r, 0, ROWS, DIM),
                Arg::tile(kv, In, h * 2 * SEQ, 0, 2 * SEQ, DIM),
                Arg::tile(table, In, 0, 0, 1, 1),
                Arg::tile(o, Out, h * SEQ + r, 0, ROWS, DIM + 2),
            ];
            // first token 0, 16 tokens, pages of 16, the scale.
            let scalars = [0, SEQ as u64, SEQ as u64, scale.to_bits() as u64];
            b.task(PARTIAL, &args, &scalars)?;
        }
    }
    let mut rng = SplitMix64::new(seed);
    let qv = rng.fill((HEADS * SEQ * DIM) as usize);
    let kvv = rng.fill((HEADS * 2 * SEQ * DIM) as usize);
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(q), &qv);
    arena.write_f32(b.layout(kv), &kvv);
    arena.write_i32(b.layout(table), &[0]);
    let want = reference(&qv, &kvv);
    let vmax = kvv.iter().map(|v| v.abs() as f64).fold(0.0, f64::max);
    // o mixes the values convexly: f32 dot products of D terms, sums of 16
    // and exp2 (< 1e-6 relative) stay well inside 1e-5 of the largest |v|.
    const TOL: &str = "|o - ref| <= 1e-5 * max |v| (o is a convex mix of the values)";
    let out = b.layout(o).clone();
    let check = move |arena: &Arena| {
        let states = arena.read_f32(&out);
        let got: Vec<f32> = states
            .chunks((DIM + 2) as usize)
            .flat_map(|row| row[..DIM as usize].to_vec())
            .collect();
        let bound = |_| 1e-5 * vmax + f32::MIN_POSITIVE as f64;
        Verification::compare("O", &got, &want, bound, TOL)
    };
    let summary = format!(
        "O = softmax(Q K^T / sqrt(D)) V, B1 H{HEADS} S{SEQ} D{DIM}, f32, {} tasks of {ROWS} query rows over all {SEQ} keys",
        HEADS * SEQ / ROWS
    );
    finish("wsp9-attention", summary, &b, arena, check)
}

/// The f64 attention output, [HEADS * SEQ, DIM], from Q and the KV pool.
fn reference(q: &[f32], kv: &[f32]) -> Vec<f64> {
    let (s, d) = (SEQ as usize, DIM as usize);
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = Vec::with_capacity(q.len());
    for h in 0..HEADS as usize {
        let pool = &kv[h * 2 * s * d..(h + 1) * 2 * s * d];
        let (keys, values) = pool.split_at(s * d);
        for row in q[h * s * d..(h + 1) * s * d].chunks(d) {
            let scores: Vec<f64> = keys
                .chunks(d)
                .map(|k| {
                    scale
                        * row
                            .iter()
                            .zip(k)
                            .map(|(&a, &b)| a as f64 * b as f64)
                            .sum::<f64>()
                })
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            for c in 0..d {
                let acc: f64 = p
                    .iter()
                    .zip(values.chunks(d))
                    .map(|(&w, v)| w * v[c] as f64)
                    .sum();
                out.push(acc / sum);
            }
        }
    }
    out
}

/// Query tokens (2 batches x 4), scores per token and k of the indexer.
const TOKENS: u32 = 8;
const SCORES: u32 = 32;
const TOP: u32 = 8;

/// The lightning indexer's selection: the top-8 positions of each query
/// token's 32 scores (scores [2,4,32]), one `topk` task per token. v9's
/// context tiers (2K/8K/64K/128K) choose a selection size by context
/// length; 32 scores lie in the first tier, so all 8 tasks are alike.
pub(super) fn lightning_indexer(seed: u64) -> Result<Workload, WorkloadError> {
    let mut b = TableBuilder::new();
    let scores = b.tensor("scores", &[TOKENS, SCORES])?;
    let idx = b.tensor_i32("idx", &[TOKENS, TOP])?;
    for r in 0..TOKENS {
        let args = [
            Arg::tile(scores, In, r, 0, 1, SCORES),
            Arg::tile(idx, Out, r, 0, 1, TOP),
        ];
        b.task(TOPK, &args, &[TOP as u64])?;
    }
    let sv = SplitMix64::new(seed).fill((TOKENS * SCORES) as usize);
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(scores), &sv);
    let want: Vec<f64> = sv
        .chunks(SCORES as usize)
        .flat_map(|row| top_positions(row, TOP as usize))
        .map(|p| p as f64)
        .collect();
    const TOL: &str = "positions equal the reference's (highest scores, ties to the lower position, in increasing order)";
    let out = b.layout(idx).clone();
    let check = move |arena: &Arena| {
        let got: Vec<f32> = arena.read_i32(&out).iter().map(|&p| p as f32).collect();
        Verification::compare("idx", &got, &want, |_| 0.5, TOL)
    };
    let summary =
        format!("top-{TOP} positions of scores [2,4,{SCORES}] per query token, {TOKENS} tasks");
    finish("wsp9-lightning-indexer", summary, &b, arena, check)
}

/// The positions of the k highest scores (ties to the lower position), in
/// increasing order: a full sort, independent of the kernel's heap.
fn top_positions(row: &[f32], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..row.len()).collect();
    // As f32 values (-0 == +0); the scores hold no NaN.
    order.sort_by(|&a, &b| {
        row[b]
            .partial_cmp(&row[a])
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.cmp(&b))
    });
    let mut top = order[..k].to_vec();
    top.sort_unstable();
    top
}
