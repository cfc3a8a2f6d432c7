//! Host tests: each kernel through the registry against an f64 reference,
//! strided views, the cost model, and rejections agreeing with `check`.
//! route_topk is checked against a straightforward f64 routing written here;
//! the attention kernels in [`attn`].

use crate::*;

mod attn;
mod model;
mod plan;

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

/// A strided matrix of 4-byte elements in host memory: f32, or i32 held as
/// f32 bit patterns (`dtype` says which the kernel sees). The view starts
/// `skip` elements into `data`.
struct Mat {
    data: Vec<f32>,
    skip: usize,
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
            skip: 0,
            rows,
            cols,
            stride,
            dtype: DTYPE_F32,
        }
    }

    /// The same matrix, seen by the kernel as `dtype`.
    fn with_dtype(mut self, dtype: u32) -> Self {
        self.dtype = dtype;
        self
    }

    /// An all-zero i32 matrix.
    fn zeros_i32(rows: u32, cols: u32, stride: u32) -> Self {
        Self::zeros(rows, cols, stride).with_dtype(DTYPE_I32)
    }

    fn random(rows: u32, cols: u32, stride: u32, rng: &mut Lcg, lo: f32, hi: f32) -> Self {
        Self::new(rows, cols, stride, |_, _| rng.next(lo, hi))
    }

    fn zeros(rows: u32, cols: u32, stride: u32) -> Self {
        Self::new(rows, cols, stride, |_, _| 0.0)
    }

    fn get(&self, r: usize, c: usize) -> f32 {
        self.data[self.skip + r * self.stride as usize + c]
    }

    /// Element (r, c) of an i32 matrix.
    fn get_i32(&self, r: usize, c: usize) -> i32 {
        self.get(r, c).to_bits() as i32
    }

    fn view(&mut self) -> WspTensorView {
        WspTensorView {
            addr: self.data[self.skip..].as_mut_ptr() as u64,
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
        assert_eq!(
            self.skip, 0,
            "a view into a larger matrix has no gap pattern"
        );
        self.data.iter().enumerate().all(|(i, v)| {
            let (r, c) = (i / self.stride as usize, i % self.stride as usize);
            (r < self.rows as usize && c < self.cols as usize) || v.to_bits() == GAP
        })
    }
}

/// Runs kernel `id` on `mats` (in signature order) and `scalars`, after
/// checking that the Rust-side `check` agrees with the kernel's verdict.
fn run(id: u32, mats: &mut [Mat], scalars: &[u64]) -> Result<u64, KernelRejected> {
    let (checked, result) = invoke(id, mats, scalars);
    assert_eq!(
        checked.is_ok(),
        result.is_ok(),
        "check {checked:?} vs kernel {result:?}"
    );
    result
}

/// Runs kernel `id` on `mats` and `scalars`; returns the Rust-side `check`'s
/// verdict (the same from `check` and `check_args`) and the kernel's.
fn invoke(
    id: u32,
    mats: &mut [Mat],
    scalars: &[u64],
) -> (Result<(), ShapeError>, Result<u64, KernelRejected>) {
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
    // A fifth scalar does not fit the block: num_scalars says it is there.
    for (slot, &value) in args.scalars.iter_mut().zip(scalars) {
        *slot = value;
    }
    let shapes: Vec<TileShape> = mats.iter().map(Mat::shape).collect();
    let checked = kernel.check(&shapes, scalars);
    assert_eq!(checked, kernel.check_args(&args));
    // SAFETY: each view covers `rows * stride` 4-byte elements of its own Vec
    // from `skip` on (aligned for f32 and i32, live for the call, distinct
    // allocations), and nothing else runs.
    let result = unsafe { kernel.invoke(&args) };
    (checked, result)
}

fn eps_bits(eps: f32) -> u64 {
    u64::from(eps.to_bits())
}

const ADD: u32 = WspKernelId_WSP_KERNEL_ADD;
const GEMM: u32 = WspKernelId_WSP_KERNEL_GEMM_TILE;
const RMSNORM: u32 = WspKernelId_WSP_KERNEL_RMSNORM;
const SOFTMAX: u32 = WspKernelId_WSP_KERNEL_SOFTMAX;
const ROUTE: u32 = WspKernelId_WSP_KERNEL_ROUTE_TOPK;
const EXPERT: u32 = WspKernelId_WSP_KERNEL_EXPERT_ROWS;
const DECODE: u32 = WspKernelId_WSP_KERNEL_ATTN_DECODE_PARTIAL;
const MERGE: u32 = WspKernelId_WSP_KERNEL_ATTN_MERGE;
const INDEXER: u32 = WspKernelId_WSP_KERNEL_INDEXER_SCORES;
const TOPK: u32 = WspKernelId_WSP_KERNEL_TOPK;
const SPARSE: u32 = WspKernelId_WSP_KERNEL_ATTN_SPARSE_PARTIAL;
const PLAN: u32 = WspKernelId_WSP_KERNEL_DECODE_PLAN;
const SILU: u32 = WspKernelId_WSP_KERNEL_SILU_MUL;
const MOE_ROUTE: u32 = WspKernelId_WSP_KERNEL_MOE_ROUTE;
const ALIGN: u32 = WspKernelId_WSP_KERNEL_MOE_ALIGN;
const GATHER: u32 = WspKernelId_WSP_KERNEL_GATHER_ROWS;
const ROPE: u32 = WspKernelId_WSP_KERNEL_ROPE;
const MATMUL: u32 = WspKernelId_WSP_KERNEL_MATMUL;
const SQUARE: u32 = WspKernelId_WSP_KERNEL_SQUARE;
const COPY: u32 = WspKernelId_WSP_KERNEL_COPY;

#[test]
fn registry_is_consistent() {
    let ids: Vec<u32> = all().iter().map(|k| k.id).collect();
    assert_eq!(
        ids,
        [
            ADD, GEMM, RMSNORM, SOFTMAX, ROUTE, EXPERT, DECODE, MERGE, INDEXER, TOPK, SPARSE, PLAN,
            SILU, MOE_ROUTE, ALIGN, GATHER, MATMUL, SQUARE, COPY, ROPE
        ]
    );
    // Ids are stable numbers, in order.
    assert_eq!(ids, (1..=20).collect::<Vec<u32>>());
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
        for spec in kernel.tensor_args {
            assert!(
                spec.dtype == DTYPE_F32 || spec.dtype == DTYPE_I32,
                "{}",
                kernel.name
            );
        }
    }
    assert!(lookup(0).is_none() && lookup(ROPE + 1).is_none() && lookup(u32::MAX).is_none());
    for (id, kind) in [
        (DECODE, CoreKind::Cube),
        (MERGE, CoreKind::Vector),
        (INDEXER, CoreKind::Cube),
        (TOPK, CoreKind::Vector),
        (SPARSE, CoreKind::Cube),
        (SILU, CoreKind::Vector),
        (MOE_ROUTE, CoreKind::Vector),
        (ALIGN, CoreKind::Vector),
        (GATHER, CoreKind::Vector),
        (MATMUL, CoreKind::Cube),
        (SQUARE, CoreKind::Vector),
        (COPY, CoreKind::Vector),
    ] {
        assert_eq!(lookup(id).unwrap().kind, kind);
    }
    assert_eq!(lookup(GEMM).unwrap().kind, CoreKind::Cube);
    assert_eq!(lookup(EXPERT).unwrap().kind, CoreKind::Cube);
    assert_eq!(lookup(ADD).unwrap().kind, CoreKind::Vector);
    assert_eq!(lookup(ROUTE).unwrap().kind, CoreKind::Vector);
    let route_dtypes: Vec<u32> = lookup(ROUTE)
        .unwrap()
        .tensor_args
        .iter()
        .map(|a| a.dtype)
        .collect();
    assert_eq!(route_dtypes, [DTYPE_F32, DTYPE_I32, DTYPE_I32, DTYPE_F32]);
    assert_ne!(DTYPE_F32, DTYPE_I32);
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

/// OUT = SiLU(G) * U against f64 within 12 u of |SiLU(g) u| (the kernel's
/// stated bound is (e + 3) u with the exp's error e < 8 ulp), on strided
/// views; the extremes: a large negative gate gives -0, NaN stays NaN.
#[test]
fn silu_mul_matches_f64() {
    let mut rng = Lcg(31);
    let (r, c) = (11, 37);
    let mut m = [
        Mat::random(r, c, 40, &mut rng, -12.0, 12.0),
        Mat::random(r, c, c, &mut rng, -3.0, 3.0),
        Mat::zeros(r, c, 45),
    ];
    let cycles = run(SILU, &mut m, &[]).unwrap();
    assert_eq!(cycles, 8 * u64::from(r * c));
    let u = f64::from(f32::EPSILON) / 2.0;
    for i in 0..r as usize {
        for j in 0..c as usize {
            let (g, up) = (f64::from(m[0].get(i, j)), f64::from(m[1].get(i, j)));
            let want = g / (1.0 + (-g).exp()) * up;
            let got = f64::from(m[2].get(i, j));
            assert!(
                (got - want).abs() <= 12.0 * u * want.abs(),
                "({i}, {j}): {got} vs {want}"
            );
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));

    let gates = [-100.0f32, f32::NAN, 0.0, 100.0];
    let mut m = [
        Mat::new(1, 4, 4, |_, j| gates[j]),
        Mat::new(1, 4, 4, |_, _| 2.0),
        Mat::zeros(1, 4, 4),
    ];
    assert_eq!(run(SILU, &mut m, &[]), Ok(8 * 4));
    assert_eq!(m[2].get(0, 0).to_bits(), (-0.0f32).to_bits());
    assert!(m[2].get(0, 1).is_nan());
    assert_eq!(m[2].get(0, 2), 0.0);
    assert_eq!(m[2].get(0, 3), 200.0);
    // Shapes that disagree, or a tile past 64 x 64, are rejected.
    assert!(run(
        SILU,
        &mut [
            Mat::zeros(2, 3, 3),
            Mat::zeros(2, 3, 3),
            Mat::zeros(3, 2, 2)
        ],
        &[]
    )
    .is_err());
    assert!(run(
        SILU,
        &mut [
            Mat::zeros(65, 2, 2),
            Mat::zeros(65, 2, 2),
            Mat::zeros(65, 2, 2)
        ],
        &[]
    )
    .is_err());
}

fn i32_mat(rows: u32, cols: u32, f: impl Fn(usize, usize) -> i32) -> Mat {
    Mat::new(rows, cols, cols, |r, c| f32::from_bits(f(r, c) as u32)).with_dtype(DTYPE_I32)
}

/// moe_route on 3 tokens over 4 experts, top 3 with threshold 0.2: a
/// token keeps 3, 1 or 0 experts (the f32 softmax's own values decide).
#[test]
fn moe_route_keeps_top_k_above_threshold() {
    let logits = [
        [0.0f32, 0.1, 0.2, 0.3], // p ~ 0.21 0.24 0.26 0.29: keeps 3 2 1
        [5.0, 0.0, 0.0, 0.0],    // p ~ 0.98: keeps 0 only
        [0.0, 0.0, 0.0, 0.0],    // p = 0.25 each: keeps 0 1 2 (ties low first)
    ];
    let mut m = [
        Mat::new(3, 4, 4, |r, c| logits[r][c]),
        Mat::zeros_i32(3, 3, 3),
        Mat::zeros(3, 3, 3),
    ];
    assert_eq!(
        run(MOE_ROUTE, &mut m, &[eps_bits(0.2)]),
        Ok((7 + 3) * 12 + 4 * 9)
    );
    let ids: Vec<Vec<i32>> = (0..3)
        .map(|r| (0..3).map(|c| m[1].get_i32(r, c)).collect())
        .collect();
    assert_eq!(ids, [vec![3, 2, 1], vec![0, -1, -1], vec![0, 1, 2]]);
    assert_eq!(m[2].get(1, 0), 1.0);
    assert_eq!(m[2].get(1, 1), 0.0);
    assert!((m[2].get(2, 0) - 1.0 / 3.0).abs() < 1e-6);
    // Threshold 0.3 drops every expert of token 0 and 2: k = 0.
    assert!(run(MOE_ROUTE, &mut m, &[eps_bits(0.3)]).is_ok());
    assert_eq!((m[1].get_i32(0, 0), m[1].get_i32(2, 0)), (-1, -1));
    assert_eq!(m[2].get(0, 0), 0.0);
}

/// moe_align: pairs sorted by expert, padded to tiles of 2, an expert with
/// none gets no tile; a bad id or too few rows is rejected before writing.
#[test]
fn moe_align_pads_each_expert_to_tiles() {
    // Experts of 3 tokens x 2 slots (4 experts): e0 x3, e1 x0, e2 x1, e3 x1.
    let ids = [[0, 2], [0, -1], [3, 0]];
    let mut m = [
        i32_mat(3, 2, |r, c| ids[r][c]),
        Mat::zeros_i32(1, 5, 5),
        Mat::zeros_i32(10, 1, 1),
        Mat::zeros_i32(3, 2, 2),
    ];
    assert_eq!(run(ALIGN, &mut m, &[2]), Ok(3 * 6 + 5 + 10));
    let tiles: Vec<i32> = (0..5).map(|c| m[1].get_i32(0, c)).collect();
    assert_eq!(tiles, [0, 2, 2, 3, 4]);
    let rows: Vec<i32> = (0..10).map(|r| m[2].get_i32(r, 0)).collect();
    assert_eq!(rows, [0, 1, 2, -1, 0, -1, 2, -1, -1, -1]);
    let slot: Vec<i32> = (0..6).map(|i| m[3].get_i32(i / 2, i % 2)).collect();
    assert_eq!(slot, [0, 4, 1, -1, 6, 2]);
    // An id past the experts, or -2: rejected, outputs untouched.
    for bad in [4, -2] {
        let mut m = [
            i32_mat(3, 2, |r, c| if (r, c) == (2, 1) { bad } else { ids[r][c] }),
            Mat::zeros_i32(1, 5, 5),
            Mat::zeros_i32(10, 1, 1),
            Mat::zeros_i32(3, 2, 2),
        ];
        let (checked, result) = invoke(ALIGN, &mut m, &[2]);
        assert!(checked.is_ok() && result.is_err(), "id {bad}");
        assert!((0..10).all(|r| m[2].get_i32(r, 0) == 0));
    }
    // 8 padded rows do not fit in 7.
    let mut m = [
        i32_mat(3, 2, |r, c| ids[r][c]),
        Mat::zeros_i32(1, 5, 5),
        Mat::zeros_i32(7, 1, 1),
        Mat::zeros_i32(3, 2, 2),
    ];
    let (checked, result) = invoke(ALIGN, &mut m, &[2]);
    assert!(checked.is_ok() && result.is_err());
}

/// gather_rows: a weighted sum of source rows per output row, -1 skipped;
/// an index past the source is rejected before writing.
#[test]
fn gather_rows_weighted_sum() {
    let idx = [[2, -1], [0, 2], [-1, -1]];
    let mut m = [
        i32_mat(3, 2, |r, c| idx[r][c]),
        Mat::new(3, 2, 2, |r, c| [[1.0, 9.0], [0.5, 0.25], [7.0, 7.0]][r][c]),
        Mat::new(3, 4, 6, |r, c| (r * 10 + c) as f32),
        Mat::new(3, 4, 4, |_, _| 99.0),
    ];
    assert_eq!(run(GATHER, &mut m, &[]), Ok(2 * 6 + 2 * 12 + 3 * 6 * 4));
    for c in 0..4 {
        assert_eq!(m[3].get(0, c), (20 + c) as f32);
        assert_eq!(m[3].get(1, c), 0.5 * c as f32 + 0.25 * (20 + c) as f32);
        assert_eq!(m[3].get(2, c), 0.0);
    }
    m[0] = i32_mat(3, 2, |r, c| if (r, c) == (2, 0) { 3 } else { idx[r][c] });
    m[3] = Mat::new(3, 4, 4, |_, _| 99.0);
    let (checked, result) = invoke(GATHER, &mut m, &[]);
    assert!(checked.is_ok() && result.is_err());
    assert_eq!(m[3].get(0, 0), 99.0);
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

/// matmul writes C = A x B whatever C held: C starts as NaN here, and
/// every element must still be the product within 1e-5 of sum |a b|. One
/// 16 x 16 x 16 product costs load A 256 + load B 256 + matmul 4096 +
/// store C 256 = 4864 (no load of C).
#[test]
fn matmul_overwrites_c_and_costs_4864_at_16_cubed() {
    for (mm, kk, nn, strides, seed, cost) in [
        (16, 16, 16, [16, 16, 16], 30, Some(4864)),
        (7, 33, 5, [40, 9, 6], 31, None),
    ] {
        let mut rng = Lcg(seed);
        let mut m = [
            Mat::random(mm, kk, strides[0], &mut rng, -1.0, 1.0),
            Mat::random(kk, nn, strides[1], &mut rng, -1.0, 1.0),
            Mat::new(mm, nn, strides[2], |_, _| f32::NAN),
        ];
        let cycles = run(MATMUL, &mut m, &[]).unwrap();
        let (mk, kn, mn) = (u64::from(mm * kk), u64::from(kk * nn), u64::from(mm * nn));
        assert_eq!(cycles, mk + kn + mk * u64::from(nn) + mn);
        if let Some(cost) = cost {
            assert_eq!(cycles, cost);
        }
        for i in 0..mm as usize {
            for j in 0..nn as usize {
                let (mut want, mut scale) = (0.0f64, 0.0f64);
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
}

/// square: C = A * A, each element the correctly rounded f32 square (so
/// equal to the f64 square rounded to f32), at 3 x rows x cols cycles.
#[test]
fn square_is_exactly_rounded_and_costs_three_passes() {
    let mut rng = Lcg(32);
    let (r, c) = (13, 29);
    let mut m = [
        Mat::random(r, c, 32, &mut rng, -10.0, 10.0),
        Mat::zeros(r, c, 41),
    ];
    assert_eq!(run(SQUARE, &mut m, &[]), Ok(3 * u64::from(r * c)));
    for i in 0..r as usize {
        for j in 0..c as usize {
            let a = f64::from(m[0].get(i, j));
            assert_eq!(
                m[1].get(i, j).to_bits(),
                ((a * a) as f32).to_bits(),
                "({i}, {j})"
            );
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

/// copy: C = A bit for bit, at 2 x rows x cols cycles.
#[test]
fn copy_is_bit_exact_and_costs_two_passes() {
    let mut rng = Lcg(33);
    let (r, c) = (64, 64);
    let mut m = [
        Mat::random(r, c, 70, &mut rng, -10.0, 10.0),
        Mat::zeros(r, c, 64),
    ];
    assert_eq!(run(COPY, &mut m, &[]), Ok(2 * 64 * 64));
    for i in 0..r as usize {
        for j in 0..c as usize {
            assert_eq!(m[1].get(i, j).to_bits(), m[0].get(i, j).to_bits());
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
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
    other[1].dtype = DTYPE_I32;
    assert!(run(ADD, &mut other, &[]).is_err());
    other[1].dtype = 7;
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

/// route_topk's tensors: logits T x E, indptr, tokens and weights of C slots.
fn route_mats(t: u32, e: u32, c: u32) -> [Mat; 4] {
    [
        Mat::zeros(t, e, e),
        Mat::zeros_i32(1, e + 1, e + 1),
        Mat::zeros_i32(1, c, c),
        Mat::zeros(1, c, c),
    ]
}

#[test]
fn route_topk_rejections_agree_with_check() {
    let thr = eps_bits(0.1);
    let ok = |mut m: [Mat; 4], s: &[u64]| run(ROUTE, &mut m, s).is_ok();
    // Valid, at the limits: k = E, C = T x k exactly, the largest tiles.
    assert!(ok(route_mats(5, 6, 10), &[2, thr]));
    assert!(ok(route_mats(5, 6, 30), &[6, thr]));
    assert!(ok(route_mats(1, 1, 1), &[1, 0]));
    assert!(ok(route_mats(64, 64, 4096), &[64, eps_bits(0.999_999_94)]));
    assert!(ok(route_mats(64, 64, 4096), &[1, eps_bits(-0.0)]));
    // Bad k: 0, more than E, too many slots needed, high bits set.
    for k in [0, 7, 3, 1 << 32 | 2, u64::MAX] {
        assert!(!ok(route_mats(5, 6, 10), &[k, thr]), "k = {k:#x}");
    }
    // Bad threshold: negative, 1, above 1, NaN, infinite, high bits set.
    for bad in [
        eps_bits(-0.5),
        eps_bits(1.0),
        eps_bits(2.0),
        eps_bits(f32::NAN),
        eps_bits(f32::INFINITY),
        thr | 1 << 32,
    ] {
        assert!(!ok(route_mats(5, 6, 10), &[2, bad]), "threshold {bad:#x}");
    }
    // Shapes: indptr cols != E + 1, indptr or slots with 2 rows, tokens and
    // weights of different lengths, too many tokens / experts / slots.
    let mut m = route_mats(5, 6, 10);
    m[1] = Mat::zeros_i32(1, 6, 6);
    assert!(!ok(m, &[2, thr]));
    let mut m = route_mats(5, 6, 10);
    m[1] = Mat::zeros_i32(1, 8, 8);
    assert!(!ok(m, &[2, thr]));
    let mut m = route_mats(5, 6, 10);
    m[1] = Mat::zeros_i32(2, 7, 7);
    assert!(!ok(m, &[2, thr]));
    let mut m = route_mats(5, 6, 10);
    m[2] = Mat::zeros_i32(2, 10, 10);
    m[3] = Mat::zeros(2, 10, 10);
    assert!(!ok(m, &[2, thr]));
    let mut m = route_mats(5, 6, 10);
    m[3] = Mat::zeros(1, 11, 11);
    assert!(!ok(m, &[2, thr]));
    assert!(!ok(route_mats(65, 6, 4096), &[1, thr]));
    assert!(!ok(route_mats(5, 65, 4096), &[1, thr]));
    assert!(!ok(route_mats(5, 6, 4097), &[1, thr]));
    assert!(!ok(route_mats(0, 6, 10), &[1, thr]));
    // Dtypes: each argument with the other dtype, and an unknown one.
    for arg in 0..4 {
        for dtype in [DTYPE_F32, DTYPE_I32, 0, 7] {
            let mut m = route_mats(5, 6, 10);
            let expected = m[arg].dtype;
            m[arg].dtype = dtype;
            assert_eq!(
                ok(m, &[2, thr]),
                dtype == expected,
                "arg {arg} dtype {dtype}"
            );
        }
    }
    // Counts.
    let mut m = route_mats(5, 6, 10);
    assert!(run(ROUTE, &mut m, &[2]).is_err());
    assert!(run(ROUTE, &mut m[..3], &[2, thr]).is_err());
}

/// expert_rows's tensors: x R x H, w H x F, gate R x 1, out R x F.
fn expert_mats(r: u32, h: u32, f: u32) -> [Mat; 4] {
    [
        Mat::zeros(r, h, h),
        Mat::zeros(h, f, f),
        Mat::zeros(r, 1, 1),
        Mat::zeros(r, f, f),
    ]
}

#[test]
fn expert_rows_rejections_agree_with_check() {
    let ok = |mut m: [Mat; 4]| run(EXPERT, &mut m, &[]).is_ok();
    assert!(ok(expert_mats(3, 4, 5)));
    assert!(ok(expert_mats(1, 1, 1)));
    assert!(ok(expert_mats(16, 64, 64)));
    // Too large.
    assert!(!ok(expert_mats(17, 4, 5)));
    assert!(!ok(expert_mats(3, 65, 5)));
    assert!(!ok(expert_mats(3, 4, 65)));
    // Mismatches: w rows, gate rows, gate cols, out rows, out cols.
    let bad: [(usize, Mat); 5] = [
        (1, Mat::zeros(5, 5, 5)),
        (2, Mat::zeros(2, 1, 1)),
        (2, Mat::zeros(3, 2, 2)),
        (3, Mat::zeros(4, 5, 5)),
        (3, Mat::zeros(3, 6, 6)),
    ];
    for (arg, mat) in bad {
        let mut m = expert_mats(3, 4, 5);
        m[arg] = mat;
        assert!(!ok(m), "arg {arg}");
    }
    // An i32 view where each f32 argument goes.
    for arg in 0..4 {
        let mut m = expert_mats(3, 4, 5);
        m[arg].dtype = DTYPE_I32;
        assert!(!ok(m), "arg {arg}");
    }
    let mut m = expert_mats(3, 4, 5);
    assert!(run(EXPERT, &mut m, &[0]).is_err());
}

/// A valid argument set of each kernel: (rows, cols) per tensor, scalars.
fn valid_args(id: u32) -> (Vec<(u32, u32)>, Vec<u64>) {
    match id {
        ADD => (vec![(3, 5); 3], vec![]),
        GEMM => (vec![(3, 4), (4, 5), (3, 5)], vec![]),
        RMSNORM => (vec![(3, 8), (1, 8), (3, 8)], vec![eps_bits(1e-5)]),
        SOFTMAX => (vec![(3, 8); 2], vec![]),
        ROUTE => (
            vec![(5, 6), (1, 7), (1, 10), (1, 10)],
            vec![2, eps_bits(0.25)],
        ),
        EXPERT => (vec![(3, 4), (4, 5), (3, 1), (3, 5)], vec![]),
        // q, a pool of 4 pages of P = 2, a table of 5 pages, part; tokens 1..7.
        DECODE => (
            vec![(3, 4), (16, 4), (1, 5), (3, 6)],
            vec![1, 6, 2, eps_bits(0.5)],
        ),
        MERGE => (vec![(6, 6), (3, 6)], vec![2]),
        INDEXER => (vec![(3, 4), (1, 3), (5, 4), (1, 5)], vec![]),
        TOPK => (vec![(1, 8), (1, 5)], vec![5]),
        // 2 selected tokens of a 7-token context, P = 2, 6 meta cols.
        SPARSE => (
            vec![(3, 4), (16, 4), (2, 6), (3, 6)],
            vec![2, 2, eps_bits(0.5), 7],
        ),
        // 4 lengths; 2 KV heads, 3 cores, P = 16, items of 100 + 10 t.
        PLAN => (vec![(1, 4), (1, 1)], vec![2, 3, 16, 100 | 10 << 32]),
        SILU => (vec![(3, 5); 3], vec![]),
        MOE_ROUTE => (vec![(5, 6), (5, 3), (5, 3)], vec![eps_bits(0.25)]),
        // 5 tokens x 3 slots over 3 experts (tiles 1 x 4), 20 rows, M = 2.
        ALIGN => (vec![(5, 3), (1, 4), (20, 1), (5, 3)], vec![2]),
        GATHER => (vec![(3, 2), (3, 2), (4, 5), (3, 5)], vec![]),
        MATMUL => (vec![(3, 4), (4, 5), (3, 5)], vec![]),
        SQUARE => (vec![(3, 5); 2], vec![]),
        // 3 heads of 4 as one row.
        ROPE => (vec![(1, 12), (1, 4), (3, 4)], vec![]),
        COPY => (vec![(3, 4), (2, 6)], vec![]),
        _ => panic!("no valid arguments for kernel {id}"),
    }
}

/// Runs kernel `id` on zero-filled tensors of these shapes and dtypes
/// (decode_plan's lengths 1) (`run` asserts that `check` and the kernel
/// agree).
fn run_shapes(id: u32, dims: &[(u32, u32)], dtypes: &[u32], scalars: &[u64]) -> bool {
    let mut mats: Vec<Mat> = dims
        .iter()
        .zip(dtypes)
        .map(|(&(r, c), &dtype)| match (id, dtype) {
            // decode_plan's lengths must be at least 1 (a run-time rule).
            (PLAN, DTYPE_I32) => Mat::new(r, c, c, |_, _| f32::from_bits(1)).with_dtype(dtype),
            // moe_align's ids -1 (no pair): its padding fits any row count.
            (ALIGN, DTYPE_I32) => {
                Mat::new(r, c, c, |_, _| f32::from_bits(u32::MAX)).with_dtype(dtype)
            }
            _ => Mat::zeros(r, c, c).with_dtype(dtype),
        })
        .collect();
    run(id, &mut mats, scalars).is_ok()
}

#[test]
fn check_agrees_with_every_kernel_around_valid_args() {
    // Every rows / cols of each argument one off, zero, at and past its
    // capacity; every dtype; every scalar over integers and f32 patterns.
    let scalar_values = [
        0,
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        1 << 32,
        1 << 32 | 2,
        u64::MAX,
        eps_bits(0.0),
        eps_bits(-0.0),
        eps_bits(0.5),
        eps_bits(0.999_999_94),
        eps_bits(1.0),
        eps_bits(-1.0),
        eps_bits(f32::NAN),
        eps_bits(f32::INFINITY),
        eps_bits(f32::MAX),
    ];
    for kernel in all() {
        let (dims, scalars) = valid_args(kernel.id);
        let dtypes: Vec<u32> = kernel.tensor_args.iter().map(|a| a.dtype).collect();
        assert!(
            run_shapes(kernel.id, &dims, &dtypes, &scalars),
            "{}",
            kernel.name
        );
        for (i, spec) in kernel.tensor_args.iter().enumerate() {
            let (r, c) = dims[i];
            let variants = [
                (0, c),
                (r, 0),
                (r - 1, c),
                (r + 1, c),
                (r, c - 1),
                (r, c + 1),
                (spec.max_rows, c),
                (spec.max_rows + 1, c),
                (r, spec.max_cols),
                (r, spec.max_cols + 1),
            ];
            for v in variants {
                let mut d = dims.clone();
                d[i] = v;
                run_shapes(kernel.id, &d, &dtypes, &scalars);
            }
            for dtype in [0, DTYPE_F32, DTYPE_I32, 7] {
                let mut t = dtypes.clone();
                t[i] = dtype;
                let got = run_shapes(kernel.id, &dims, &t, &scalars);
                assert_eq!(got, dtype == spec.dtype, "{} arg {i}", kernel.name);
            }
        }
        for i in 0..scalars.len() {
            for &value in &scalar_values {
                let mut s = scalars.clone();
                s[i] = value;
                run_shapes(kernel.id, &dims, &dtypes, &s);
            }
        }
        // One tensor or one scalar too many.
        let mut d = dims.clone();
        d.push((1, 1));
        let mut t = dtypes.clone();
        t.push(DTYPE_F32);
        assert!(!run_shapes(kernel.id, &d, &t, &scalars));
        let mut s = scalars.clone();
        s.push(0);
        assert!(!run_shapes(kernel.id, &dims, &dtypes, &s));
    }
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
            other_value: 5,
            plus: 0,
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

    // Dtypes: an i32 view where f32 goes, and the other way round.
    let i = |rows, cols| TileShape {
        rows,
        cols,
        dtype: DTYPE_I32,
    };
    let err = gemm.check(&[s(4, 5), i(5, 4), s(4, 4)], &[]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::Dtype {
            arg: 1,
            dtype: DTYPE_I32,
            expected: DTYPE_F32
        }
    );
    assert_eq!(
        err.to_string(),
        format!(
            "tensor argument 1: dtype {DTYPE_I32} (i32) where the kernel takes dtype \
             {DTYPE_F32} (f32)"
        )
    );
    let route = lookup(ROUTE).unwrap();
    let thr = eps_bits(0.25);
    let err = route
        .check(&[s(5, 6), s(1, 7), i(1, 10), s(1, 10)], &[2, thr])
        .unwrap_err();
    assert_eq!(
        err,
        ShapeError::Dtype {
            arg: 1,
            dtype: DTYPE_F32,
            expected: DTYPE_I32
        }
    );
    let err = route
        .check(&[s(5, 6), i(1, 10), i(1, 7), s(1, 7)], &[2, thr])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "tensor argument 1: cols 10 must equal cols 6 + 1 of tensor argument 0"
    );
    let valid = [s(5, 6), i(1, 7), i(1, 10), s(1, 10)];
    assert_eq!(route.check(&valid, &[2, thr]), Ok(()));
    let err = route.check(&valid, &[7, thr]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::TopK {
            index: 0,
            k: 7,
            arg: 0,
            max: 6
        }
    );
    assert_eq!(
        err.to_string(),
        "scalar 0: k 7 is not in 1..=6 (the cols of tensor argument 0)"
    );
    let err = route.check(&valid, &[3, thr]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::TooFewCols {
            arg: 2,
            value: 10,
            min: 15,
            rows_of: 0,
            scalar: 0
        }
    );
    assert_eq!(
        err.to_string(),
        "tensor argument 2: cols 10 are fewer than 15, the rows of tensor argument 0 \
         times scalar 0"
    );
    let one = eps_bits(1.0);
    let err = route.check(&valid, &[2, one]).unwrap_err();
    assert_eq!(
        err,
        ShapeError::Threshold {
            index: 1,
            value: one
        }
    );
    assert_eq!(
        err.to_string(),
        "scalar 1: 0x3f800000 is not an f32 threshold in [0, 1) in the low 32 bits"
    );
}

/// The routing of `logits` (T x E) computed here in f64: per token, p =
/// softmax of its row; the k experts of largest p (lower index first on
/// ties); the first always kept, the others dropped when p < threshold;
/// weights p / (sum of kept p). Returns indptr and the (token, weight)
/// entries in CSR order by expert. Panics when the data puts a decision
/// within 1e-5 (relative) of flipping, where the f32 kernel could rightly
/// decide the other way: such data makes no test.
fn route_reference(logits: &Mat, k: usize, threshold: f32) -> (Vec<usize>, Vec<(usize, f64)>) {
    let (tokens, experts) = (logits.rows as usize, logits.cols as usize);
    let threshold = f64::from(threshold);
    let mut by_expert: Vec<Vec<(usize, f64)>> = vec![Vec::new(); experts];
    for t in 0..tokens {
        let x: Vec<f64> = (0..experts).map(|e| f64::from(logits.get(t, e))).collect();
        let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let exp: Vec<f64> = x.iter().map(|v| (v - max).exp()).collect();
        let sum: f64 = exp.iter().sum();
        let p: Vec<f64> = exp.iter().map(|v| v / sum).collect();
        let mut order: Vec<usize> = (0..experts).collect();
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]).then(a.cmp(&b)));
        if k < experts {
            let (last, next) = (order[k - 1], order[k]);
            assert!(
                x[last] == x[next] || p[last] - p[next] > 1e-5 * p[last],
                "token {t}: experts {last} and {next} nearly tie"
            );
        }
        let mut kept = vec![order[0]];
        for &e in &order[1..k] {
            assert!(
                threshold == 0.0 || (p[e] - threshold).abs() > 1e-5 * threshold,
                "token {t}: expert {e} is nearly at the threshold"
            );
            if p[e] >= threshold {
                kept.push(e);
            }
        }
        let kept_sum: f64 = kept.iter().map(|&e| p[e]).sum();
        for &e in &kept {
            by_expert[e].push((t, p[e] / kept_sum));
        }
    }
    let mut indptr = vec![0];
    let mut entries = Vec::new();
    for list in by_expert {
        entries.extend(list);
        indptr.push(entries.len());
    }
    (indptr, entries)
}

/// Runs route_topk on `logits` with C = T x k + `spare` slots (outputs with
/// row strides past their cols, to catch stray writes) and checks it against
/// [`route_reference`]: indptr and tokens exactly, weights within 1e-6 of
/// themselves, zeros after the last entry, and the cost formula. Returns the
/// number of experts kept per token.
fn check_route(logits: Mat, k: u32, threshold: f32, spare: u32) -> Vec<usize> {
    let (t, e) = (logits.rows, logits.cols);
    let c = t * k + spare;
    let (indptr_want, entries) = route_reference(&logits, k as usize, threshold);
    let mut m = [
        logits,
        Mat::zeros_i32(1, e + 1, e + 3),
        Mat::zeros_i32(1, c, c + 1),
        Mat::zeros(1, c, c + 2),
    ];
    // Outputs start non-zero so the zero fill is seen.
    for slot in 0..c as usize {
        m[2].data[slot] = f32::from_bits(0x55);
        m[3].data[slot] = 0.5;
    }
    let scalars = [u64::from(k), u64::from(threshold.to_bits())];
    let cycles = run(ROUTE, &mut m, &scalars).unwrap();
    let (t64, e64, k64, c64) = (u64::from(t), u64::from(e), u64::from(k), u64::from(c));
    assert_eq!(
        cycles,
        (8 + k64) * t64 * e64 + 2 * t64 * k64 + (e64 + 1) + 2 * c64
    );
    let indptr: Vec<usize> = (0..=e as usize)
        .map(|i| usize::try_from(m[1].get_i32(0, i)).expect("indptr >= 0"))
        .collect();
    assert_eq!(indptr, indptr_want);
    for (slot, &(token, weight)) in entries.iter().enumerate() {
        assert_eq!(m[2].get_i32(0, slot), token as i32, "slot {slot}");
        let got = f64::from(m[3].get(0, slot));
        assert!(
            (got - weight).abs() <= 1e-6 * weight,
            "slot {slot} (token {token}): weight {got} vs {weight}"
        );
    }
    for slot in entries.len()..c as usize {
        assert_eq!(m[2].get_i32(0, slot), 0, "slot {slot}");
        assert_eq!(m[3].get(0, slot).to_bits(), 0, "slot {slot}");
    }
    assert!(m.iter().all(Mat::gaps_untouched));
    let mut per_token = vec![0; t as usize];
    for &(token, _) in &entries {
        per_token[token] += 1;
    }
    per_token
}

#[test]
fn route_topk_fixed_k_matches_reference() {
    let mut rng = Lcg(12);
    for k in 1..=3 {
        let logits = Mat::random(64, 64, 64, &mut rng, -4.0, 4.0);
        let per_token = check_route(logits, k, 0.0, 0);
        assert!(per_token.iter().all(|&n| n == k as usize));
        let logits = Mat::random(13, 8, 11, &mut rng, -2.0, 2.0);
        let per_token = check_route(logits, k, 0.0, 5);
        assert!(per_token.iter().all(|&n| n == k as usize));
    }
}

#[test]
fn route_topk_threshold_varies_experts_per_token() {
    let mut rng = Lcg(13);
    for (t, e, k, threshold) in [(40, 8, 3, 0.15), (64, 16, 4, 0.08), (7, 5, 5, 0.2)] {
        let logits = Mat::random(t, e, e, &mut rng, -2.5, 2.5);
        let per_token = check_route(logits, k, threshold, 3);
        assert!(per_token.iter().all(|&n| (1..=k as usize).contains(&n)));
        // The data exercises the threshold: some token keeps fewer than k
        // experts, and some keeps more than one.
        assert!(per_token.iter().any(|&n| n < k as usize), "{per_token:?}");
        assert!(per_token.iter().any(|&n| n > 1), "{per_token:?}");
    }
}

#[test]
fn route_topk_ties_and_edges() {
    // Logits from a few values: many exact ties, broken by expert index.
    let ties = Mat::new(12, 6, 6, |r, c| ((r * 7 + c * 3) % 4) as f32);
    check_route(ties, 2, 0.0, 0);
    let ties = Mat::new(12, 6, 6, |r, c| ((r + c * 5) % 3) as f32);
    check_route(ties, 4, 0.1, 2);
    // All experts, every token to every expert; one token, one expert.
    let mut rng = Lcg(14);
    check_route(Mat::random(9, 7, 7, &mut rng, -3.0, 3.0), 7, 0.0, 0);
    check_route(Mat::random(1, 1, 1, &mut rng, -3.0, 3.0), 1, 0.0, 2);
    // A threshold above every p but the top one keeps exactly one expert.
    let per_token = check_route(Mat::random(10, 4, 4, &mut rng, -1.0, 1.0), 3, 0.99, 0);
    assert!(per_token.iter().all(|&n| n == 1));
}

/// OUT += GATE * (X x W) with W rows `expert * h ..` of a stacked
/// (experts * h) x f matrix; checked against f64 within the first-order bound
/// (H + 2) u (|OUT_in| + |GATE| sum |X W|) the kernel documents.
fn check_expert_rows(r: u32, h: u32, f: u32, experts: u32, expert: u32, seed: u64) {
    let mut rng = Lcg(seed);
    let w_stride = f + 3;
    let mut w = Mat::random(experts * h, f, w_stride, &mut rng, -1.0, 1.0);
    let bits = |data: &[f32]| data.iter().map(|v| v.to_bits()).collect::<Vec<u32>>();
    let stacked = bits(&w.data);
    w.skip = (expert * h * w_stride) as usize;
    w.rows = h;
    let mut m = [
        Mat::random(r, h, h + 1, &mut rng, -2.0, 2.0),
        w,
        Mat::random(r, 1, 2, &mut rng, 0.0, 1.0),
        Mat::random(r, f, f, &mut rng, -1.0, 1.0),
    ];
    let out_in: Vec<Vec<f32>> = (0..r as usize)
        .map(|i| (0..f as usize).map(|j| m[3].get(i, j)).collect())
        .collect();
    let cycles = run(EXPERT, &mut m, &[]).unwrap();
    let (r64, h64, f64_) = (u64::from(r), u64::from(h), u64::from(f));
    assert_eq!(
        cycles,
        r64 * h64 + h64 * f64_ + r64 + 5 * r64 * f64_ + r64 * h64 * f64_
    );
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = f64::from(h + 2) * u / (1.0 - f64::from(h + 2) * u);
    for (i, row) in out_in.iter().enumerate() {
        let g = f64::from(m[2].get(i, 0));
        for (j, &o) in row.iter().enumerate() {
            let (mut y, mut y_abs) = (0.0, 0.0);
            for p in 0..h as usize {
                let prod = f64::from(m[0].get(i, p)) * f64::from(m[1].get(p, j));
                y += prod;
                y_abs += prod.abs();
            }
            let want = f64::from(o) + g * y;
            let bound = gamma * (f64::from(o).abs() + g.abs() * y_abs);
            let got = f64::from(m[3].get(i, j));
            assert!(
                (got - want).abs() <= bound,
                "({i}, {j}): {got} vs {want} (bound {bound})"
            );
        }
    }
    assert!(
        bits(&m[1].data) == stacked,
        "the stacked weights are read only"
    );
    for k in [0, 2, 3] {
        assert!(m[k].gaps_untouched());
    }
}

#[test]
fn expert_rows_matches_reference() {
    check_expert_rows(5, 12, 9, 4, 2, 15);
    check_expert_rows(16, 64, 64, 3, 0, 16);
    check_expert_rows(16, 64, 64, 3, 2, 17);
    check_expert_rows(1, 1, 1, 1, 0, 18);
}

#[test]
fn expert_rows_with_zero_gate_keeps_out() {
    // gate 0: out + 0 * y == out exactly (finite y).
    let mut rng = Lcg(19);
    let mut m = [
        Mat::random(4, 8, 8, &mut rng, -1.0, 1.0),
        Mat::random(8, 6, 6, &mut rng, -1.0, 1.0),
        Mat::zeros(4, 1, 1),
        Mat::random(4, 6, 6, &mut rng, -1.0, 1.0),
    ];
    let before = m[3].data.clone();
    run(EXPERT, &mut m, &[]).unwrap();
    assert_eq!(m[3].data, before);
}
