//! Host tests: each kernel through the registry against an f64 reference,
//! strided views, the cost model, and rejections agreeing with `check`.

use crate::*;

/// Written into row gaps (row_stride > cols) to check kernels leave them alone.
const GAP: u32 = 0x7fc0_dead;

/// Deterministic pseudo-random numbers (Knuth's MMIX LCG).
struct Lcg(u64);

impl Lcg {
    /// Uniform in [lo, hi).
    fn next(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let unit = (self.0 >> 40) as f32 / (1u64 << 24) as f32;
        lo + (hi - lo) * unit
    }
}

/// A strided f32 matrix in host memory.
struct Mat {
    data: Vec<f32>,
    rows: u32,
    cols: u32,
    stride: u32,
    dtype: u32,
}

impl Mat {
    fn new(rows: u32, cols: u32, stride: u32, mut f: impl FnMut(usize, usize) -> f32) -> Self {
        let len = (rows * stride).max(1) as usize;
        let mut data = vec![f32::from_bits(GAP); len];
        for r in 0..rows as usize {
            for c in 0..cols as usize {
                data[r * stride as usize + c] = f(r, c);
            }
        }
        Self {
            data,
            rows,
            cols,
            stride,
            dtype: DTYPE_F32,
        }
    }

    fn random(rows: u32, cols: u32, stride: u32, rng: &mut Lcg, lo: f32, hi: f32) -> Self {
        Self::new(rows, cols, stride, |_, _| rng.next(lo, hi))
    }

    fn zeros(rows: u32, cols: u32, stride: u32) -> Self {
        Self::new(rows, cols, stride, |_, _| 0.0)
    }

    fn get(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.stride as usize + c]
    }

    fn view(&mut self) -> WspTensorView {
        WspTensorView {
            addr: self.data.as_mut_ptr() as u64,
            rows: self.rows,
            cols: self.cols,
            row_stride: self.stride,
            dtype: self.dtype,
        }
    }

    fn shape(&self) -> TileShape {
        TileShape {
            rows: self.rows,
            cols: self.cols,
            dtype: self.dtype,
        }
    }

    /// Every element outside the valid region still holds the gap pattern.
    fn gaps_untouched(&self) -> bool {
        self.data.iter().enumerate().all(|(i, v)| {
            let (r, c) = (i / self.stride as usize, i % self.stride as usize);
            (r < self.rows as usize && c < self.cols as usize) || v.to_bits() == GAP
        })
    }
}

/// Runs kernel `id` on `mats` (in signature order) and `scalars`, after
/// checking that the Rust-side `check` agrees with the kernel's verdict.
fn run(id: u32, mats: &mut [Mat], scalars: &[u64]) -> Result<u64, KernelRejected> {
    let kernel = lookup(id).expect("registered kernel");
    let mut args = WspKernelArgs {
        num_tensors: mats.len() as u32,
        num_scalars: scalars.len() as u32,
        tensors: [WspTensorView {
            addr: 0,
            rows: 0,
            cols: 0,
            row_stride: 0,
            dtype: 0,
        }; 4],
        scalars: [0; 4],
    };
    for (slot, mat) in args.tensors.iter_mut().zip(mats.iter_mut()) {
        *slot = mat.view();
    }
    args.scalars[..scalars.len()].copy_from_slice(scalars);
    let shapes: Vec<TileShape> = mats.iter().map(Mat::shape).collect();
    let checked = kernel.check(&shapes, scalars);
    assert_eq!(checked, kernel.check_args(&args));
    // SAFETY: each view covers `rows * stride` f32s of its own Vec (aligned,
    // live for the call, distinct allocations), and nothing else runs.
    let result = unsafe { kernel.invoke(&args) };
    assert_eq!(
        checked.is_ok(),
        result.is_ok(),
        "check {checked:?} vs kernel {result:?}"
    );
    result
}

fn eps_bits(eps: f32) -> u64 {
    u64::from(eps.to_bits())
}

const ADD: u32 = WspKernelId_WSP_KERNEL_ADD;
const GEMM: u32 = WspKernelId_WSP_KERNEL_GEMM_TILE;
const RMSNORM: u32 = WspKernelId_WSP_KERNEL_RMSNORM;
const SOFTMAX: u32 = WspKernelId_WSP_KERNEL_SOFTMAX;

#[test]
fn registry_is_consistent() {
    let ids: Vec<u32> = all().iter().map(|k| k.id).collect();
    assert_eq!(ids, [ADD, GEMM, RMSNORM, SOFTMAX]);
    for kernel in all() {
        assert_eq!(
            kernel.num_tensors as usize,
            kernel.tensor_args.len(),
            "{}",
            kernel.name
        );
        assert_eq!(
            kernel.num_scalars as usize,
            kernel.scalars.len(),
            "{}",
            kernel.name
        );
        assert!(kernel.entry().is_some());
        assert!(core::ptr::eq(lookup(kernel.id).unwrap(), kernel));
    }
    assert!(lookup(0).is_none() && lookup(5).is_none());
    assert_eq!(lookup(GEMM).unwrap().kind, CoreKind::Cube);
    assert_eq!(lookup(ADD).unwrap().kind, CoreKind::Vector);
    assert_eq!(CoreKind::from_u32(1), Some(CoreKind::Vector));
    assert_eq!(CoreKind::from_u32(2), None);
    assert_eq!(ArgAccess::from_u32(3), Some(ArgAccess::InOut));
    assert_eq!(ArgAccess::from_u32(0), None);
    assert!(ArgAccess::InOut.reads() && ArgAccess::InOut.writes());
    assert!(!ArgAccess::Out.reads() && !ArgAccess::In.writes());
}

#[test]
fn add_strided_is_exact() {
    let mut rng = Lcg(1);
    let (r, c) = (13, 29);
    let mut m = [
        Mat::random(r, c, 32, &mut rng, -10.0, 10.0),
        Mat::random(r, c, c, &mut rng, -10.0, 10.0),
        Mat::zeros(r, c, 41),
    ];
    let cycles = run(ADD, &mut m, &[]).unwrap();
    assert_eq!(cycles, 4 * u64::from(r * c));
    // An f32 sum is correctly rounded, so it equals the rounded f64 sum.
    for i in 0..r as usize {
        for j in 0..c as usize {
            let want = (f64::from(m[0].get(i, j)) + f64::from(m[1].get(i, j))) as f32;
            assert_eq!(m[2].get(i, j).to_bits(), want.to_bits(), "({i}, {j})");
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

#[test]
fn add_full_tile() {
    let mut rng = Lcg(2);
    let mut m = [
        Mat::random(64, 64, 64, &mut rng, -1.0, 1.0),
        Mat::random(64, 64, 64, &mut rng, -1.0, 1.0),
        Mat::zeros(64, 64, 64),
    ];
    assert_eq!(run(ADD, &mut m, &[]), Ok(4 * 64 * 64));
    assert_eq!(m[2].get(63, 63), m[0].get(63, 63) + m[1].get(63, 63));
}

/// C += A x B, compared per element within 1e-5 of sum |c| + sum |a b|.
fn check_gemm(mm: u32, kk: u32, nn: u32, strides: [u32; 3], seed: u64) {
    let mut rng = Lcg(seed);
    let mut m = [
        Mat::random(mm, kk, strides[0], &mut rng, -1.0, 1.0),
        Mat::random(kk, nn, strides[1], &mut rng, -1.0, 1.0),
        Mat::random(mm, nn, strides[2], &mut rng, -1.0, 1.0),
    ];
    let c_in: Vec<Vec<f32>> = (0..mm as usize)
        .map(|i| (0..nn as usize).map(|j| m[2].get(i, j)).collect())
        .collect();
    let cycles = run(GEMM, &mut m, &[]).unwrap();
    let (mk, kn, mn) = (u64::from(mm * kk), u64::from(kk * nn), u64::from(mm * nn));
    assert_eq!(cycles, mk + kn + mn + mk * u64::from(nn) + mn);
    for (i, row) in c_in.iter().enumerate() {
        for (j, &c0) in row.iter().enumerate() {
            let (mut want, mut scale) = (f64::from(c0), f64::from(c0).abs());
            for p in 0..kk as usize {
                let prod = f64::from(m[0].get(i, p)) * f64::from(m[1].get(p, j));
                want += prod;
                scale += prod.abs();
            }
            let got = f64::from(m[2].get(i, j));
            assert!(
                (got - want).abs() <= 1e-5 * scale,
                "({i}, {j}): {got} vs {want}"
            );
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

#[test]
fn gemm_16x16x16_cost_and_values() {
    // load A 256 + load B 256 + load C 256 + matmul 4096 + store C 256.
    let mut rng = Lcg(3);
    let mut m = [
        Mat::random(16, 16, 16, &mut rng, -1.0, 1.0),
        Mat::random(16, 16, 16, &mut rng, -1.0, 1.0),
        Mat::zeros(16, 16, 16),
    ];
    assert_eq!(run(GEMM, &mut m, &[]), Ok(5120));
    check_gemm(16, 16, 16, [16, 16, 16], 4);
}

#[test]
fn gemm_rectangular_strided() {
    check_gemm(7, 33, 5, [40, 9, 6], 5);
    check_gemm(64, 64, 64, [64, 70, 64], 6);
    check_gemm(1, 1, 1, [1, 1, 3], 7);
}

fn check_rmsnorm(r: u32, c: u32, strides: [u32; 3], eps: f32, seed: u64) {
    let mut rng = Lcg(seed);
    let mut m = [
        Mat::random(r, c, strides[0], &mut rng, -3.0, 3.0),
        Mat::random(1, c, strides[1], &mut rng, 0.5, 1.5),
        Mat::zeros(r, c, strides[2]),
    ];
    let cycles = run(RMSNORM, &mut m, &[eps_bits(eps)]).unwrap();
    assert_eq!(
        cycles,
        u64::from(c) + 6 * u64::from(r * c) + 3 * u64::from(r)
    );
    for i in 0..r as usize {
        let sq: f64 = (0..c as usize)
            .map(|j| f64::from(m[0].get(i, j)).powi(2))
            .sum();
        let rms = (sq / f64::from(c) + f64::from(eps)).sqrt();
        for j in 0..c as usize {
            let want = f64::from(m[0].get(i, j)) / rms * f64::from(m[1].get(0, j));
            let got = f64::from(m[2].get(i, j));
            assert!(
                (got - want).abs() <= 1e-5 * want.abs(),
                "({i}, {j}): {got} vs {want}"
            );
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

#[test]
fn rmsnorm_matches_reference() {
    check_rmsnorm(5, 37, [40, 37, 64], 1e-5, 8);
    check_rmsnorm(16, 1024, [1024, 1024, 1030], 1e-6, 9);
    check_rmsnorm(1, 1, [1, 2, 1], 0.0, 10);
}

/// Softmax per row against f64, each output within `rel` of itself.
fn check_softmax(x: Mat, y_stride: u32, rel: f64) {
    let (r, c) = (x.rows, x.cols);
    let mut m = [x, Mat::zeros(r, c, y_stride)];
    assert_eq!(run(SOFTMAX, &mut m, &[]), Ok(7 * u64::from(r * c)));
    for i in 0..r as usize {
        let row: Vec<f64> = (0..c as usize).map(|j| f64::from(m[0].get(i, j))).collect();
        let max = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for (j, v) in row.iter().enumerate() {
            let want = (v - max).exp() / sum;
            let got = f64::from(m[1].get(i, j));
            assert!(
                (got - want).abs() <= rel * want,
                "({i}, {j}): {got} vs {want}"
            );
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

#[test]
fn softmax_matches_reference() {
    let mut rng = Lcg(11);
    check_softmax(Mat::random(6, 100, 128, &mut rng, -8.0, 8.0), 101, 1e-5);
    check_softmax(
        Mat::random(16, 1024, 1024, &mut rng, -20.0, 20.0),
        1024,
        1e-5,
    );
    check_softmax(Mat::random(3, 1, 1, &mut rng, -1.0, 1.0), 2, 1e-5);
}

#[test]
fn softmax_exp_over_wide_range() {
    // One 0 per row and the rest down to about -80: every exp(x - max) argument
    // spans about [-80, 0]. Each output is within 1e-6 of itself: TEXP's own
    // accuracy plus the rounding of the row sum and the division.
    let x = Mat::new(4, 161, 161, |r, c| {
        if c == r {
            0.0
        } else {
            -0.5 * c as f32 - 0.01 * r as f32
        }
    });
    check_softmax(x, 161, 1e-6);
}

#[test]
fn rejections_agree_with_check() {
    let f = |r, c| Mat::zeros(r, c, c);
    let eps = eps_bits(1e-5);
    // Wrong tensor / scalar counts.
    assert!(run(ADD, &mut [f(2, 2), f(2, 2)], &[]).is_err());
    assert!(run(ADD, &mut [f(2, 2), f(2, 2), f(2, 2)], &[1]).is_err());
    assert!(run(RMSNORM, &mut [f(2, 2), f(1, 2), f(2, 2)], &[]).is_err());
    assert!(run(SOFTMAX, &mut [f(2, 2), f(2, 2), f(2, 2)], &[]).is_err());
    // Tiles too large.
    assert!(run(ADD, &mut [f(65, 2), f(65, 2), f(65, 2)], &[]).is_err());
    assert!(run(GEMM, &mut [f(2, 65), f(65, 2), f(2, 2)], &[]).is_err());
    assert!(run(SOFTMAX, &mut [f(17, 8), f(17, 8)], &[]).is_err());
    assert!(run(SOFTMAX, &mut [f(2, 1025), f(2, 1025)], &[]).is_err());
    assert!(run(RMSNORM, &mut [f(2, 8), f(2, 8), f(2, 8)], &[eps]).is_err());
    // Shape mismatches.
    assert!(run(ADD, &mut [f(2, 3), f(2, 3), f(3, 2)], &[]).is_err());
    assert!(run(GEMM, &mut [f(4, 5), f(6, 4), f(4, 4)], &[]).is_err());
    assert!(run(GEMM, &mut [f(4, 5), f(5, 3), f(4, 4)], &[]).is_err());
    assert!(run(RMSNORM, &mut [f(2, 8), f(1, 7), f(2, 8)], &[eps]).is_err());
    assert!(run(SOFTMAX, &mut [f(2, 8), f(3, 8)], &[]).is_err());
    // Empty tiles and other dtypes.
    assert!(run(SOFTMAX, &mut [f(0, 8), f(0, 8)], &[]).is_err());
    let mut other = [f(2, 2), f(2, 2), f(2, 2)];
    other[1].dtype = 2;
    assert!(run(ADD, &mut other, &[]).is_err());
    // Bad eps: negative, NaN, infinite, high bits set.
    for bad in [
        eps_bits(-1.0),
        eps_bits(f32::NAN),
        eps_bits(f32::INFINITY),
        eps | 1 << 32,
    ] {
        assert!(run(RMSNORM, &mut [f(2, 8), f(1, 8), f(2, 8)], &[bad]).is_err());
    }
    // The same kernels accept the limits.
    assert!(run(GEMM, &mut [f(4, 5), f(5, 3), f(4, 3)], &[]).is_ok());
    assert!(run(RMSNORM, &mut [f(16, 1024), f(1, 1024), f(16, 1024)], &[eps]).is_ok());
    assert!(run(RMSNORM, &mut [f(1, 8), f(1, 8), f(1, 8)], &[eps_bits(-0.0)]).is_ok());
}

#[test]
fn shape_errors_name_argument_and_rule() {
    let gemm = lookup(GEMM).unwrap();
    let s = |rows, cols| TileShape {
        rows,
        cols,
        dtype: DTYPE_F32,
    };
    let err = gemm.check(&[s(4, 5), s(6, 4), s(4, 4)], &[]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::Mismatch {
            arg: 1,
            dim: Dim::Rows,
            value: 6,
            other: 0,
            other_dim: Dim::Cols,
            other_value: 5
        }
    );
    assert_eq!(
        err.to_string(),
        "tensor argument 1: rows 6 must equal cols 5 of tensor argument 0"
    );
    let err = gemm.check(&[s(4, 65), s(65, 4), s(4, 4)], &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor argument 0: cols 65 exceeds the capacity max 64"
    );
    let err = gemm.check(&[s(4, 4)], &[]).unwrap_err();
    assert_eq!(err.to_string(), "expected 3 tensor arguments, got 1");
    let err = lookup(RMSNORM)
        .unwrap()
        .check(&[s(1, 1), s(1, 1), s(1, 1)], &[1 << 32])
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::Scalar {
            index: 0,
            value: 1 << 32
        }
    );
    assert_eq!(
        KernelRejected { kernel: 2 }.to_string(),
        "kernel 2 rejected its arguments"
    );
}
