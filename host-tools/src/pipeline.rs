//! The `pipeline` workload: a CSP pipeline of three processes over token
//! channels, Loader -> Compute -> Storer, the megakernel shape.
//!
//! ```text
//! channel to_compute(depth), to_store(depth)
//! process loader:  parallel i in 0..tiles:
//!                      stage[i % slots] = x[i] + 0            (add: a copy)
//!                      send(to_compute, i)
//! process compute: consume(to_compute) as i:
//!                      squared[i] += stage[s] @ stage[s]     (gemm_tile)
//!                      send(to_store, i)
//! process storer:  consume(to_store) as i:
//!                      out[i] = squared[i] + 0               (add: a copy)
//! ```
//!
//! Each tile is a `tile` x `tile` block of `x` (the tiles stacked by rows),
//! and its output is the tile's matrix square, `out_i = x_i @ x_i`. The
//! registry has no copy or element-wise square kernel, so copies are
//! `add` with a zero tile (exact) and the compute stage is a GEMM tile
//! (its square), the "GEMM tile" form of issue 17's example.
//!
//! A token's value is the tile index; the staging slot is `i % slots`.
//! The device reserves a token's room before it issues the task the token
//! stands for, and a token counts until its consumer's body ended, so a
//! slot is rewritten only after the reads of the token `slots` before it
//! were submitted, provided the depth is at most the slots: the workload
//! has `max(depth, 2)` slots (2 at depths 0, 1 and 2, as in the issue).
//! Only the task right before a send is held back so: every other task
//! that writes a slot must come after the consume of the token that frees
//! it. The GEMM accumulates, so its output is one zeroed tile per input
//! tile (`squared`), not a staging slot: a slot would need a clear between
//! the storer's copy and the next GEMM, three vector tasks per tile on the
//! critical path instead of two (the makespan test in `tests/pipelines.rs`
//! measured 1.066x of the bound with slots and clears).

use wsp_ffi::{WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM};

use device_runtime::abi::program::MAX_CHANNEL_CAPACITY;

use crate::program::{Axis, CspNames, LowerError, Workload as Program};
use crate::reference;
use crate::rng::SplitMix64;
use crate::table::Arena;
use crate::workloads::{gemm_bound, Params, Verification, Workload, WorkloadError, GEMM_TOLERANCE};

/// The channels' depth of `wsp run pipeline` unless `--depth` says.
pub const DEFAULT_DEPTH: u32 = 2;

/// The staging slots for a channel depth: the depth, and at least 2.
pub fn slots(depth: u32) -> u32 {
    depth.max(2)
}

/// The pipeline's f64 reference: each tile's matrix square, with the
/// per-element sum of |products| that bounds an f32 evaluation. `x` is
/// the `tiles` tiles of `t` x `t` stacked by rows. Refused, naming the
/// sizes: a tile of 0, and an `x` of other than `tiles x t x t` values
/// (sizes whose product overflows included).
pub fn reference(x: &[f32], tiles: usize, t: usize) -> Result<(Vec<f64>, Vec<f64>), WorkloadError> {
    if t == 0 {
        return Err(WorkloadError::Params(
            "the pipeline reference: tile 0 (tiles of 0 x 0)".into(),
        ));
    }
    let want = t.checked_mul(t).and_then(|n| n.checked_mul(tiles));
    if want != Some(x.len()) {
        return Err(WorkloadError::Params(format!(
            "the pipeline reference: x holds {} values, not {tiles} tiles of {t} x {t}",
            x.len()
        )));
    }
    Ok(reference_unchecked(x, tiles, t))
}

/// [`reference`] on sizes the caller has made: `t` >= 1 and `x` holds
/// `tiles x t x t` values.
fn reference_unchecked(x: &[f32], tiles: usize, t: usize) -> (Vec<f64>, Vec<f64>) {
    let mut want = Vec::with_capacity(x.len());
    let mut abs = Vec::with_capacity(x.len());
    for tile in x.chunks(t * t).take(tiles) {
        let (c, a) = reference::gemm_unchecked(tile, tile, t, t, t);
        want.extend(c);
        abs.extend(a);
    }
    (want, abs)
}

/// The workload language's program of the pipeline (not yet lowered),
/// with its tensors: x, zero, stage, squared, out.
pub fn program(tiles: u32, t: u32, depth: u32) -> Result<Program, LowerError> {
    let slots = slots(depth);
    let mut w = Program::new();
    let x = w.tensor("x", &[tiles * t, t])?;
    let zero = w.tensor("zero", &[t, t])?;
    let stage = w.tensor("stage", &[slots * t, t])?;
    let squared = w.tensor("squared", &[tiles * t, t])?;
    let out = w.tensor("out", &[tiles * t, t])?;
    let to_compute = w.channel("to_compute", depth)?;
    let to_store = w.channel("to_store", depth)?;
    let zero_tile = zero.tile(0, 0, t, t);
    w.process("loader", |w| {
        w.parallel(Axis::Dense(tiles), |w, i| {
            let slot = (i.clone() % slots) * t;
            let load = w.call(
                ADD,
                &[
                    x.tile(i.clone() * t, 0, t, t),
                    zero_tile.clone(),
                    stage.tile(slot, 0, t, t),
                ],
                &[],
            );
            w.send(to_compute, i, load);
        });
    });
    w.process("compute", |w| {
        w.consume(to_compute, |w, i| {
            let slot = w.let_((i.clone() % slots) * t);
            let square = w.call(
                GEMM,
                &[
                    stage.tile(slot.clone(), 0, t, t),
                    stage.tile(slot, 0, t, t),
                    squared.tile(i.clone() * t, 0, t, t),
                ],
                &[],
            );
            w.send(to_store, i, square);
        });
    });
    w.process("storer", |w| {
        w.consume(to_store, |w, i| {
            w.call(
                ADD,
                &[
                    squared.tile(i.clone() * t, 0, t, t),
                    zero_tile.clone(),
                    out.tile(i * t, 0, t, t),
                ],
                &[],
            );
        });
    });
    Ok(w)
}

/// The pipeline over `p.m / p.tile` tiles of `p.tile` x `p.tile` (`n` and
/// `k` must equal the tile), with channels of `depth` tokens.
pub fn pipeline(p: Params, depth: u32) -> Result<(Workload, CspNames), WorkloadError> {
    let t = p.tile;
    if t == 0 || t > 64 {
        return Err(WorkloadError::Params(format!("tile {t} must be in 1..=64")));
    }
    if p.m == 0 || !p.m.is_multiple_of(t) {
        return Err(WorkloadError::Params(format!(
            "m = {} must be a positive multiple of tile {t} (m / tile tiles)",
            p.m
        )));
    }
    if p.n != t || p.k != t {
        return Err(WorkloadError::Params(format!(
            "n = {} and k = {} must equal the tile {t}: each tile is squared",
            p.n, p.k
        )));
    }
    if depth as usize > MAX_CHANNEL_CAPACITY {
        return Err(WorkloadError::Params(format!(
            "depth {depth}: a channel holds 0 to {MAX_CHANNEL_CAPACITY} tokens"
        )));
    }
    let tiles = p.m / t;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let mut w = program(tiles, t, depth).map_err(lower)?;
    let table = w.finish().map_err(lower)?;
    let layouts = w.layouts().to_vec();
    let mut arena = Arena::zeroed(w.arena_size());
    let x = SplitMix64::new(p.seed).fill((tiles * t * t) as usize);
    arena.write_f32(&layouts[0], &x);
    // Checked: t in 1..=64, x holds tiles x t x t values.
    let (want, abs) = reference_unchecked(&x, tiles as usize, t as usize);
    let bound = gemm_bound(abs, t);
    let out = layouts[4].clone();
    let check = move |arena: &Arena| {
        Verification::compare("out", &arena.read_f32(&out), &want, &bound, GEMM_TOLERANCE)
    };
    let names = w.csp_names();
    let workload = Workload {
        name: "pipeline",
        summary: format!(
            "CSP pipeline: loader -> compute (a {t}x{t} tile's square) -> storer over {tiles} tiles, \
             channels of depth {depth}, {} staging slots carried by the tokens",
            slots(depth)
        ),
        table,
        arena,
        tensors: layouts,
        tasks: 3 * tiles as usize,
        check: Box::new(check),
        csp: names.clone(),
    };
    Ok((workload, names))
}
