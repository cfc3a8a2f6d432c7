//! The `attention-pipeline` workload: an attention-shaped megakernel, a
//! CSP pipeline of five processes over token channels, pipelined over KV
//! tiles.
//!
//! ```text
//! channel keys, scores, probs, outs (depth each)
//! process loader:   parallel j in 0..tiles:
//!                       kt[s] = kT[:, j] + 0                 (add: loads the key tile)
//!                       send(keys, j)
//! process scores:   consume(keys) as j:
//!                       s[s] += q @ kt[s]                     (gemm_tile)
//!                       send(scores, j)
//! process softmax:  consume(scores) as j:
//!                       p[s] = softmax(s[s])                  (softmax)
//!                       send(probs, j)
//!                       s[s] = 0 + 0                          (clears it for the next gemm)
//! process weighted: consume(probs) as j:
//!                       o[s] += p[s] @ v[j]                   (gemm_tile)
//!                       send(outs, j)
//! process storer:   consume(outs) as j:
//!                       out[j] = o[s] + 0                     (add: stores the tile)
//!                       o[s] = 0 + 0                          (clears it)
//! ```
//!
//! with `s = j % slots`. One block of `rows` queries (head dimension 64,
//! pre-scaled by 1/sqrt(64) on the host) attends to each KV tile of 64
//! keys: `out_j = softmax(q kT_j) v_j`, the per-tile attention a decode
//! kernel computes before merging tiles (this workload stores each tile's
//! output; merging them is the attention issue's `attn_merge`).
//!
//! The staging buffers follow the rules of the pipeline workload
//! ([`crate::pipeline`]): a slot is written by the task right before a
//! send (whose room the device reserves before issuing it) or after the
//! consume of the token that frees it, so with `slots >= depth` no slot is
//! rewritten before its readers were submitted. The value tiles are read
//! from their home in `v`, not staged: the weighted stage is three stages
//! from the loader, further than one channel's depth guards.

use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM,
    WspKernelId_WSP_KERNEL_SOFTMAX as SOFTMAX,
};

use device_runtime::abi::program::MAX_CHANNEL_CAPACITY;

use crate::program::{Axis, CspNames, LowerError, Workload as Program};
use crate::reference;
use crate::rng::SplitMix64;
use crate::table::Arena;
use crate::workloads::{Verification, Workload, WorkloadError};

/// Head dimension and keys per KV tile.
pub const D: u32 = 64;

/// The error bound of the check, absolute, for inputs in [-1, 1) (the
/// queries scaled by 1/8). Derivation: a score is a 64-term f32 dot
/// product of terms at most 1/8, so its error is at most
/// gamma_64 * 64/8 < 64 * 2^-24 * 8 = 3.1e-5; softmax turns an error e in
/// the scores into a relative error of at most 2e (plus a few ulps) in
/// the probabilities, 6.3e-5 + 1e-6; an output is a 64-term sum of
/// probabilities (summing to 1) times values at most 1, so it carries the
/// probabilities' error, at most 6.4e-5, plus its own rounding, at most
/// gamma_64 = 3.9e-6: 7e-5 in all, under 1e-4.
pub const BOUND: f64 = 1e-4;
const TOLERANCE: &str = "|out - ref| <= 1e-4 (from the f32 error of the scores, the softmax and the weighted sum; attention_pipeline::BOUND)";

/// The f64 reference: `softmax(q kT_j) v_j` for every tile `j`, `rows` x
/// 64 each, stacked by rows. `q` is `rows x 64`, `kT` is `64 x (tiles *
/// 64)` and `v` is `(tiles * 64) x 64`; other sizes are refused, naming
/// the tensor.
pub fn reference(
    q: &[f32],
    kt: &[f32],
    v: &[f32],
    rows: usize,
    tiles: usize,
) -> Result<Vec<f64>, WorkloadError> {
    let d = D as usize;
    let product = |a: usize, b: usize| {
        a.checked_mul(b).ok_or_else(|| {
            WorkloadError::Params(format!(
                "{rows} query rows over {tiles} KV tiles of {D}: the sizes overflow"
            ))
        })
    };
    let keys = product(tiles, d)?;
    // The output's size, checked here though only reserved below.
    product(product(tiles, rows)?, d)?;
    for (name, got, want) in [
        ("q", q.len(), product(rows, d)?),
        ("kT", kt.len(), product(d, keys)?),
        ("v", v.len(), product(keys, d)?),
    ] {
        if got != want {
            return Err(WorkloadError::Params(format!(
                "{name} has {got} elements; {rows} query rows over {tiles} KV tiles of {D} need {want}"
            )));
        }
    }
    let mut out = Vec::with_capacity(tiles * rows * d);
    for j in 0..tiles {
        // kT is d x keys; tile j is its columns j*d .. (j+1)*d.
        let mut s = vec![0f64; rows * d];
        for r in 0..rows {
            for c in 0..d {
                s[r * d + c] = (0..d)
                    .map(|e| q[r * d + e] as f64 * kt[e * keys + j * d + c] as f64)
                    .sum();
            }
        }
        let p = reference::softmax_unchecked(&s, d);
        for r in 0..rows {
            for c in 0..d {
                let o: f64 = (0..d)
                    .map(|e| p[r * d + e] * v[(j * d + e) * d + c] as f64)
                    .sum();
                out.push(o);
            }
        }
    }
    Ok(out)
}

/// The program (not yet lowered): tensors q, kT, v, kt (staged key
/// tiles), s, p, o (per slot), zero, out, in that order.
pub fn program(rows: u32, tiles: u32, depth: u32) -> Result<Program, LowerError> {
    let slots = depth.max(2);
    let mut w = Program::new();
    let q = w.tensor("q", &[rows, D])?;
    let k_t = w.tensor("kT", &[D, tiles * D])?;
    let v = w.tensor("v", &[tiles * D, D])?;
    let kt = w.tensor("kt", &[slots * D, D])?;
    let s = w.tensor("s", &[slots * rows, D])?;
    let p = w.tensor("p", &[slots * rows, D])?;
    let o = w.tensor("o", &[slots * rows, D])?;
    let zero = w.tensor("zero", &[D, D])?;
    let out = w.tensor("out", &[tiles * rows, D])?;
    let keys = w.channel("keys", depth)?;
    let scores = w.channel("scores", depth)?;
    let probs = w.channel("probs", depth)?;
    let outs = w.channel("outs", depth)?;
    let zero_kt = zero.tile(0, 0, D, D);
    let zero_rows = zero.tile(0, 0, rows, D);
    w.process("loader", |w| {
        w.parallel(Axis::Dense(tiles), |w, j| {
            let slot = (j.clone() % slots) * D;
            let load = w.call(
                ADD,
                &[
                    k_t.tile(0, j.clone() * D, D, D),
                    zero_kt.clone(),
                    kt.tile(slot, 0, D, D),
                ],
                &[],
            );
            w.send(keys, j, load);
        });
    });
    w.process("scores", |w| {
        w.consume(keys, |w, j| {
            let slot = w.let_(j.clone() % slots);
            let score = w.call(
                GEMM,
                &[
                    q.tile(0, 0, rows, D),
                    kt.tile(slot.clone() * D, 0, D, D),
                    s.tile(slot * rows, 0, rows, D),
                ],
                &[],
            );
            w.send(scores, j, score);
        });
    });
    w.process("softmax", |w| {
        w.consume(scores, |w, j| {
            let row = w.let_((j.clone() % slots) * rows);
            let prob = w.call(
                SOFTMAX,
                &[
                    s.tile(row.clone(), 0, rows, D),
                    p.tile(row.clone(), 0, rows, D),
                ],
                &[],
            );
            w.send(probs, j, prob);
            // Zero for the scores of the token `slots` later.
            w.call(
                ADD,
                &[
                    zero_rows.clone(),
                    zero_rows.clone(),
                    s.tile(row, 0, rows, D),
                ],
                &[],
            );
        });
    });
    w.process("weighted", |w| {
        w.consume(probs, |w, j| {
            let row = w.let_((j.clone() % slots) * rows);
            let weighted = w.call(
                GEMM,
                &[
                    p.tile(row.clone(), 0, rows, D),
                    v.tile(j.clone() * D, 0, D, D),
                    o.tile(row, 0, rows, D),
                ],
                &[],
            );
            w.send(outs, j, weighted);
        });
    });
    w.process("storer", |w| {
        w.consume(outs, |w, j| {
            let row = w.let_((j.clone() % slots) * rows);
            w.call(
                ADD,
                &[
                    o.tile(row.clone(), 0, rows, D),
                    zero_rows.clone(),
                    out.tile(j * rows, 0, rows, D),
                ],
                &[],
            );
            w.call(
                ADD,
                &[
                    zero_rows.clone(),
                    zero_rows.clone(),
                    o.tile(row, 0, rows, D),
                ],
                &[],
            );
        });
    });
    Ok(w)
}

/// The workload: `rows` queries (`p.m`, 1 to 16: the softmax kernel's
/// rows) against `p.n / 64` KV tiles, channels of `depth` tokens. The
/// head dimension and the KV tile are [`D`]: `p.k` and `p.tile` must be
/// 64.
pub fn attention_pipeline(
    p: crate::workloads::Params,
    depth: u32,
) -> Result<(Workload, CspNames), WorkloadError> {
    let rows = p.m;
    if p.k != D || p.tile != D {
        return Err(WorkloadError::Params(format!(
            "k = {} and tile = {} must be {D}: the head dimension and the KV tile are fixed",
            p.k, p.tile
        )));
    }
    if !(1..=16).contains(&rows) {
        return Err(WorkloadError::Params(format!(
            "m = {rows} query rows; 1 to 16 (the softmax kernel's tile)"
        )));
    }
    if p.n == 0 || !p.n.is_multiple_of(D) {
        return Err(WorkloadError::Params(format!(
            "n = {} keys must be a positive multiple of the KV tile {D}",
            p.n
        )));
    }
    if depth as usize > MAX_CHANNEL_CAPACITY {
        return Err(WorkloadError::Params(format!(
            "depth {depth}: a channel holds 0 to {MAX_CHANNEL_CAPACITY} tokens"
        )));
    }
    let tiles = p.n / D;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let mut w = program(rows, tiles, depth).map_err(lower)?;
    let table = w.finish().map_err(lower)?;
    let layouts = w.layouts().to_vec();
    let mut arena = Arena::zeroed(w.arena_size());
    let mut rng = SplitMix64::new(p.seed);
    let q: Vec<f32> = rng
        .fill((rows * D) as usize)
        .iter()
        .map(|x| x / 8.0)
        .collect();
    let kt = rng.fill((D * tiles * D) as usize);
    let v = rng.fill((tiles * D * D) as usize);
    arena.write_f32(&layouts[0], &q);
    arena.write_f32(&layouts[1], &kt);
    arena.write_f32(&layouts[2], &v);
    let want = reference(&q, &kt, &v, rows as usize, tiles as usize)?;
    let out = layouts[8].clone();
    let check = move |arena: &Arena| {
        Verification::compare("out", &arena.read_f32(&out), &want, |_| BOUND, TOLERANCE)
    };
    let names = w.csp_names();
    let workload = Workload {
        name: "attention-pipeline",
        summary: format!(
            "attention-shaped megakernel: load kT tile -> scores -> softmax -> weighted sum -> store, \
             {rows} queries over {tiles} KV tiles of {D}, channels of depth {depth}"
        ),
        table,
        arena,
        tensors: layouts,
        tasks: 7 * tiles as usize,
        check: Box::new(check),
        csp: names.clone(),
    };
    Ok((workload, names))
}
