//! v9's CSP pipeline: loader -> square -> storer over 8 tiles of 64 x 64,
//! channels of depth 2.
//!
//! ```text
//! channel to_square(2), to_store(2)
//! process loader:  parallel i in 0..8:
//!                      stage[i % 2] = x[i]             (copy)
//!                      send(to_square, i)
//! process square:  consume(to_square) as i:
//!                      squared[i] = stage[i % 2]^2     (square, elementwise)
//!                      send(to_store, i)
//! process storer:  consume(to_store) as i:
//!                      out[i] = squared[i]             (copy)
//! ```
//!
//! The two staging slots (as many as the channel's depth, see
//! [`crate::pipeline`]) make the loader's copy of tile i + 2 wait for the
//! square of tile i, which read its slot.

use wsp_ffi::{WspKernelId_WSP_KERNEL_COPY as COPY, WspKernelId_WSP_KERNEL_SQUARE as SQUARE};

use super::U;
use crate::program::{Axis, LowerError, Workload as Program};
use crate::rng::SplitMix64;
use crate::table::Arena;
use crate::workloads::{Verification, Workload, WorkloadError};

/// Tiles, their edge and the channels' depth (= staging slots).
const TILES: u32 = 8;
const T: u32 = 64;
const DEPTH: u32 = 2;

/// The pipeline's program, with its tensors x, stage, squared, out.
fn program() -> Result<Program, LowerError> {
    let mut w = Program::new();
    let x = w.tensor("x", &[TILES * T, T])?;
    let stage = w.tensor("stage", &[DEPTH * T, T])?;
    let squared = w.tensor("squared", &[TILES * T, T])?;
    let out = w.tensor("out", &[TILES * T, T])?;
    let to_square = w.channel("to_square", DEPTH)?;
    let to_store = w.channel("to_store", DEPTH)?;
    w.process("loader", |w| {
        w.parallel(Axis::Dense(TILES), |w, i| {
            let slot = (i.clone() % DEPTH) * T;
            let load = w.call(
                COPY,
                &[x.tile(i.clone() * T, 0, T, T), stage.tile(slot, 0, T, T)],
                &[],
            );
            w.send(to_square, i, load);
        });
    });
    w.process("square", |w| {
        w.consume(to_square, |w, i| {
            let slot = w.let_((i.clone() % DEPTH) * T);
            let square = w.call(
                SQUARE,
                &[
                    stage.tile(slot, 0, T, T),
                    squared.tile(i.clone() * T, 0, T, T),
                ],
                &[],
            );
            w.send(to_store, i, square);
        });
    });
    w.process("storer", |w| {
        w.consume(to_store, |w, i| {
            w.call(
                COPY,
                &[
                    squared.tile(i.clone() * T, 0, T, T),
                    out.tile(i * T, 0, T, T),
                ],
                &[],
            );
        });
    });
    Ok(w)
}

pub(super) fn csp_pipeline(seed: u64) -> Result<Workload, WorkloadError> {
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let mut w = program().map_err(lower)?;
    let table = w.finish().map_err(lower)?;
    let layouts = w.layouts().to_vec();
    let mut arena = Arena::zeroed(w.arena_size());
    let x = SplitMix64::new(seed).fill((TILES * T * T) as usize);
    arena.write_f32(&layouts[0], &x);
    let want: Vec<f64> = x.iter().map(|&v| v as f64 * v as f64).collect();
    const TOL: &str = "|out - ref| <= u * |ref|: one rounded f32 product, copied exactly";
    let out = layouts[3].clone();
    let check = move |arena: &Arena| {
        let bound = |i: usize| U * want[i].abs();
        Verification::compare("out", &arena.read_f32(&out), &want, bound, TOL)
    };
    Ok(Workload {
        name: "wsp9-csp-pipeline",
        summary: format!(
            "CSP pipeline: loader (copy) -> square (elementwise) -> storer (copy) over {TILES} \
             tiles of {T}x{T}, channels of depth {DEPTH}, {DEPTH} staging slots"
        ),
        table,
        arena,
        tensors: layouts,
        tasks: 3 * TILES as usize,
        csp: w.csp_names(),
        check: Box::new(check),
    })
}
