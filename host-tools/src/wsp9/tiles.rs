//! v9's tile examples: validated_matmul, tensor_data (add and square),
//! bgemm and softmax.

use wsp_ffi::ArgAccess::{In, InOut, Out};
use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM,
    WspKernelId_WSP_KERNEL_MATMUL as MATMUL, WspKernelId_WSP_KERNEL_SOFTMAX as SOFTMAX,
    WspKernelId_WSP_KERNEL_SQUARE as SQUARE,
};

use super::{finish, U};
use crate::reference;
use crate::rng::SplitMix64;
use crate::table::{Arena, Arg, TableBuilder};
use crate::workloads::{gemm_bound, Verification, Workload, WorkloadError, GEMM_TOLERANCE};

/// One 16 x 16 x 16 product, C = A x B: one `matmul` task.
pub(super) fn validated_matmul(seed: u64) -> Result<Workload, WorkloadError> {
    matmul_like("wsp9-validated-matmul", 16, 16, seed)
}

/// C = A x B, 64 x 64 x 64 in 16 x 16 tiles, each C tile accumulating its
/// four k-steps in order (`gemm_tile`, C starting at zero): 16 chains of 4
/// dependent tasks.
pub(super) fn bgemm(seed: u64) -> Result<Workload, WorkloadError> {
    matmul_like("wsp9-bgemm", 64, 16, seed)
}

/// C (n x n) = A x B in t x t tiles: one `matmul` when the tile is the
/// whole matrix, else `gemm_tile` accumulating over k.
fn matmul_like(name: &'static str, n: u32, t: u32, seed: u64) -> Result<Workload, WorkloadError> {
    let mut b = TableBuilder::new();
    let (a, bm, c) = (
        b.tensor("A", &[n, n])?,
        b.tensor("B", &[n, n])?,
        b.tensor("C", &[n, n])?,
    );
    for i in (0..n).step_by(t as usize) {
        for j in (0..n).step_by(t as usize) {
            for k in (0..n).step_by(t as usize) {
                let (kernel, c_access) = if t == n { (MATMUL, Out) } else { (GEMM, InOut) };
                let args = [
                    Arg::tile(a, In, i, k, t, t),
                    Arg::tile(bm, In, k, j, t, t),
                    Arg::tile(c, c_access, i, j, t, t),
                ];
                b.task(kernel, &args, &[])?;
            }
        }
    }
    let mut rng = SplitMix64::new(seed);
    let (av, bv) = (rng.fill((n * n) as usize), rng.fill((n * n) as usize));
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(a), &av);
    arena.write_f32(b.layout(bm), &bv);
    let (want, abs) = reference::gemm_unchecked(&av, &bv, n as usize, n as usize, n as usize);
    let bound = gemm_bound(abs, n);
    let out = b.layout(c).clone();
    let check = move |arena: &Arena| {
        Verification::compare("C", &arena.read_f32(&out), &want, &bound, GEMM_TOLERANCE)
    };
    let summary = format!(
        "C[{n}x{n}] = A x B, f32, {t}x{t}x{t} tiles{}",
        if t == n {
            " (one matmul task)"
        } else {
            ", accumulating over k in order"
        }
    );
    finish(name, summary, &b, arena, check)
}

/// Rows of the tensor_data tensors, their leading dimensions flattened
/// ([2,2,2,32,32] and [2,4,32,32] both hold 8 tiles of 32 x 32).
const DATA_ROWS: u32 = 8 * 32;
const DATA_TILE: u32 = 32;

const ROUNDED_ONCE: &str = "|c - ref| <= u * |ref|: one correctly rounded f32 op per element";

/// C = A + B on [2,2,2,32,32] (as 256 x 32): 8 `add` tasks of 32 x 32.
pub(super) fn tensor_data_add(seed: u64) -> Result<Workload, WorkloadError> {
    let mut b = TableBuilder::new();
    let (a, bm, c) = (
        b.tensor("A", &[DATA_ROWS, DATA_TILE])?,
        b.tensor("B", &[DATA_ROWS, DATA_TILE])?,
        b.tensor("C", &[DATA_ROWS, DATA_TILE])?,
    );
    for i in (0..DATA_ROWS).step_by(DATA_TILE as usize) {
        let args = [
            Arg::tile(a, In, i, 0, DATA_TILE, DATA_TILE),
            Arg::tile(bm, In, i, 0, DATA_TILE, DATA_TILE),
            Arg::tile(c, Out, i, 0, DATA_TILE, DATA_TILE),
        ];
        b.task(ADD, &args, &[])?;
    }
    let mut rng = SplitMix64::new(seed);
    let len = (DATA_ROWS * DATA_TILE) as usize;
    let (av, bv) = (rng.fill(len), rng.fill(len));
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(a), &av);
    arena.write_f32(b.layout(bm), &bv);
    let want: Vec<f64> = av
        .iter()
        .zip(&bv)
        .map(|(&x, &y)| x as f64 + y as f64)
        .collect();
    let out = b.layout(c).clone();
    let check = move |arena: &Arena| {
        let bound = |i: usize| U * want[i].abs();
        Verification::compare("C", &arena.read_f32(&out), &want, bound, ROUNDED_ONCE)
    };
    let summary = "C = A + B on [2,2,2,32,32] (as 256x32), f32, 8 tiles of 32x32".to_string();
    finish("wsp9-tensor-data-add", summary, &b, arena, check)
}

/// C = A * A on [2,4,32,32] (as 256 x 32): 8 `square` tasks of 32 x 32.
pub(super) fn tensor_data_square(seed: u64) -> Result<Workload, WorkloadError> {
    let mut b = TableBuilder::new();
    let (a, c) = (
        b.tensor("A", &[DATA_ROWS, DATA_TILE])?,
        b.tensor("C", &[DATA_ROWS, DATA_TILE])?,
    );
    for i in (0..DATA_ROWS).step_by(DATA_TILE as usize) {
        let args = [
            Arg::tile(a, In, i, 0, DATA_TILE, DATA_TILE),
            Arg::tile(c, Out, i, 0, DATA_TILE, DATA_TILE),
        ];
        b.task(SQUARE, &args, &[])?;
    }
    let av = SplitMix64::new(seed).fill((DATA_ROWS * DATA_TILE) as usize);
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(a), &av);
    let want: Vec<f64> = av.iter().map(|&x| x as f64 * x as f64).collect();
    let out = b.layout(c).clone();
    let check = move |arena: &Arena| {
        let bound = |i: usize| U * want[i].abs();
        Verification::compare("C", &arena.read_f32(&out), &want, bound, ROUNDED_ONCE)
    };
    let summary = "C = A * A on [2,4,32,32] (as 256x32), f32, 8 tiles of 32x32".to_string();
    finish("wsp9-tensor-data-square", summary, &b, arena, check)
}

/// Row softmax of 1 x 32 x 256 (as 32 x 256) in 4 `softmax` tasks of 8
/// rows: each row's max, exp(x - max), sum and divide (v9's three phases)
/// in one kernel, since a row's normalisation needs the whole row.
pub(super) fn softmax(seed: u64) -> Result<Workload, WorkloadError> {
    const ROWS: u32 = 32;
    const COLS: u32 = 256;
    const BLOCK: u32 = 8;
    let mut b = TableBuilder::new();
    let (x, y) = (b.tensor("X", &[ROWS, COLS])?, b.tensor("Y", &[ROWS, COLS])?);
    for i in (0..ROWS).step_by(BLOCK as usize) {
        let args = [
            Arg::tile(x, In, i, 0, BLOCK, COLS),
            Arg::tile(y, Out, i, 0, BLOCK, COLS),
        ];
        b.task(SOFTMAX, &args, &[])?;
    }
    let xv = SplitMix64::new(seed).fill((ROWS * COLS) as usize);
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(x), &xv);
    let x64: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
    let want = reference::softmax_unchecked(&x64, COLS as usize);
    // The row sum of COLS positive terms (gamma_COLS), the subtraction and
    // division (u each), and the exp's own error (< 1e-6 relative, see
    // wsp_tile.hpp), with margin.
    const TOL: &str = "|y - ref| <= ((cols + 8) u + 1e-6) |ref|: f32 row sum, exp and divide";
    let rel = (COLS + 8) as f64 * U + 1e-6;
    let out = b.layout(y).clone();
    let check = move |arena: &Arena| {
        let bound = |i: usize| rel * want[i].abs();
        Verification::compare("Y", &arena.read_f32(&out), &want, bound, TOL)
    };
    let summary = format!(
        "Y = softmax(X) per row, X 1x{ROWS}x{COLS} f32, {} tasks of {BLOCK} rows",
        ROWS / BLOCK
    );
    finish("wsp9-softmax", summary, &b, arena, check)
}
