//! Named workloads: a table, its initial arena, and how to check the result
//! against the f64 reference.

use std::fmt;

use wsp_ffi::ArgAccess::{In, InOut, Out};
use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM,
    WspKernelId_WSP_KERNEL_RMSNORM as RMSNORM, WspKernelId_WSP_KERNEL_SOFTMAX as SOFTMAX,
};

use crate::reference;
use crate::rng::SplitMix64;
use crate::table::{Arena, Arg, BuildError, TableBuilder, TensorLayout};

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// Sizes and seed of a workload. [`Workload::build`] builds exactly the
/// sizes given, within [`crate::budget`]'s bounds (1 GiB of tensors, 2^20
/// tasks); [`Params::of`] gives a workload's own defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    /// Rows of the GEMM's output (tokens, for the MoE workloads).
    pub m: u32,
    /// Columns of the GEMM's output (the MoE workloads' ffn size).
    pub n: u32,
    /// The GEMM's inner dimension (the MoE workloads' hidden size).
    pub k: u32,
    /// Edge of the square tiles of a tiled workload (see [`sizes_read`]);
    /// `m`, `n` and `k` must be multiples of it.
    pub tile: u32,
    /// Seeds the data only: it never changes sizes or the table.
    pub seed: u64,
}

impl Params {
    /// The default sizes of the workload called `name`, with seed 1:
    /// `gemm` 256 x 256 x 256, `mlp` 64 x 128 x 128, `streams`
    /// 128 x 128 x 128 (all in 32-tiles), `moe` and `moe-var` 32 tokens,
    /// 64 hidden, 64 ffn, `pipeline` 8 tiles of 64 x 64 (m 512, n = k =
    /// tile = 64). The decode workloads read `m` as requests, `n` as the
    /// longest KV length, `k` as the head dimension and `tile` as the page
    /// size: `decode` and `decode-skew` 32 requests up to 8192 tokens,
    /// D 128, pages of 16; `decode-uniform` 32 requests of 1024, D 64,
    /// pages of 64 (see [`crate::attention::workload::lengths_of`]);
    /// `sparse-decode` 8 requests up to 16,384 tokens (one 16K request
    /// among dense and sparse ones), D 128, pages of 64 (see
    /// [`crate::attention::sparse::lengths_of`]). `moe-layer` and
    /// `moe-layer-var`: 256 tokens, hidden 128, ffn 128, expert tiles of 16
    /// rows (m, k, n, tile; see [`crate::moe_layer::named`]). v9's examples (`wsp9-*`)
    /// have fixed sizes: [`crate::wsp9::params`].
    pub fn of(name: &str) -> Result<Params, WorkloadError> {
        let decode = |m, n, k, tile| {
            Ok(Params {
                m,
                n,
                k,
                tile,
                seed: 1,
            })
        };
        if let Some(p) = crate::wsp9::params(name) {
            return Ok(p);
        }
        let (m, n, k) = match name {
            "decode" | "decode-skew" | "decode-device" => return decode(32, 8192, 128, 16),
            "decode-uniform" => return decode(32, 1024, 64, 64),
            "sparse-decode" => return decode(8, 16384, 128, 64),
            "decode-layer" | "decode-layer-dense" => return decode(16, 2048, 512, 16),
            // 24 decode requests and a 128-token prefill chunk.
            "stitched" => return decode(24, 128, 512, 16),
            "gemm" => (256, 256, 256),
            "mlp" | "mlp-scratch" => (64, 128, 128),
            "streams" => (128, 128, 128),
            "moe" | "moe-var" => (32, 64, 64),
            // 256 tokens, hidden 128, ffn 128, expert tiles of 16 rows.
            "moe-layer" | "moe-layer-var" => {
                return Ok(Params {
                    m: 256,
                    n: 128,
                    k: 128,
                    tile: 16,
                    seed: 1,
                })
            }
            "pipeline" => {
                return Ok(Params {
                    m: 512,
                    n: 64,
                    k: 64,
                    tile: 64,
                    seed: 1,
                })
            }
            // 16 queries against 8 KV tiles of 64 keys.
            "attention-pipeline" => {
                return Ok(Params {
                    m: 16,
                    n: 512,
                    k: 64,
                    tile: 64,
                    seed: 1,
                })
            }
            _ => return Err(WorkloadError::Unknown(name.to_string())),
        };
        Ok(Params {
            m,
            n,
            k,
            tile: 32,
            seed: 1,
        })
    }
}

/// `gemm`'s defaults ([`Params::of`] gives each workload's own).
impl Default for Params {
    fn default() -> Self {
        Params {
            m: 256,
            n: 256,
            k: 256,
            tile: 32,
            seed: 1,
        }
    }
}

/// The sizes (of `m`, `n`, `k` and `tile`) the workload called `name`
/// reads, and, when it reads fewer than all four, why not: `moe` and
/// `moe-var` are not built in tiles (their kernels take whole rows; the
/// `moe-layer` workloads' tile is the height of an expert tile),
/// `attention-pipeline` has a head dimension and KV tile fixed at 64, and
/// v9's examples (`wsp9-*`) have fixed sizes. (`pipeline` reads `n` and
/// `k` only to check that they equal the tile.)
pub fn sizes_read(name: &str) -> (&'static [&'static str], &'static str) {
    match name {
        "moe" | "moe-var" => (
            &["m", "n", "k"],
            "it is not built in tiles: its kernels take whole rows",
        ),
        "attention-pipeline" => (
            &["m", "n"],
            "its head dimension and KV tile are fixed at 64",
        ),
        _ if name.starts_with("wsp9-") => {
            (&[], "v9's examples have fixed sizes; only the seed changes")
        }
        _ => (&["m", "n", "k", "tile"], ""),
    }
}

/// The names `Workload::build` accepts (v9's examples last, see
/// [`crate::wsp9`]).
pub const NAMES: [&str; 26] = [
    "gemm",
    "mlp",
    "mlp-scratch",
    "streams",
    "moe",
    "moe-var",
    "pipeline",
    "attention-pipeline",
    "decode",
    "decode-uniform",
    "decode-skew",
    "decode-device",
    "sparse-decode",
    "moe-layer",
    "moe-layer-var",
    "decode-layer",
    "decode-layer-dense",
    "stitched",
    "wsp9-validated-matmul",
    "wsp9-tensor-data-add",
    "wsp9-tensor-data-square",
    "wsp9-attention",
    "wsp9-bgemm",
    "wsp9-softmax",
    "wsp9-csp-pipeline",
    "wsp9-lightning-indexer",
];

/// A built workload.
pub struct Workload {
    /// One of [`NAMES`].
    pub name: &'static str,
    /// One line saying what it computes.
    pub summary: String,
    /// The descriptor table.
    pub table: Vec<u8>,
    /// The initial arena: inputs filled in, outputs zero.
    pub arena: Arena,
    /// The tensors' layouts, in declaration order.
    pub tensors: Vec<TensorLayout>,
    /// Tasks a run executes, the program's included.
    pub tasks: usize,
    /// The names of its channels and processes (none unless it is a
    /// pipeline), to name what a channel deadlock report numbers.
    pub csp: crate::program::CspNames,
    pub(crate) check: Box<dyn Fn(&Arena) -> Verification>,
}

/// How an output compares with the f64 reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Verification {
    /// The tensor checked (or what failed before any tensor could be).
    pub output: String,
    /// Elements compared.
    pub elements: usize,
    /// The largest |output - reference| (NaN if an output is NaN).
    pub max_abs_err: f64,
    /// The largest |output - reference| / |reference| over nonzero
    /// references (NaN if an output is NaN).
    pub max_rel_err: f64,
    /// The largest error divided by its allowed bound: at most 1 to pass.
    pub worst_error_over_bound: f64,
    /// How the bound is defined.
    pub tolerance: &'static str,
}

impl Verification {
    /// Whether every element is within its bound (a NaN never is).
    pub fn passed(&self) -> bool {
        self.worst_error_over_bound <= 1.0
    }

    /// The failed check of an arena of `len` bytes where `expected` were due.
    pub(crate) fn arena_size(len: usize, expected: usize) -> Self {
        Verification {
            output: format!("arena of {len} bytes (expected {expected})"),
            elements: 0,
            max_abs_err: f64::INFINITY,
            max_rel_err: f64::INFINITY,
            worst_error_over_bound: f64::INFINITY,
            tolerance: "arena size must match",
        }
    }

    pub(crate) fn compare(
        output: &str,
        got: &[f32],
        want: &[f64],
        bound: impl Fn(usize) -> f64,
        tolerance: &'static str,
    ) -> Self {
        let mut v = Verification {
            output: output.to_string(),
            elements: got.len(),
            max_abs_err: 0.0,
            max_rel_err: 0.0,
            worst_error_over_bound: 0.0,
            tolerance,
        };
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            let err = (g as f64 - w).abs();
            let ratio = if err == 0.0 { 0.0 } else { err / bound(i) };
            if err.is_nan() || v.max_abs_err.is_nan() {
                // `max` drops a NaN: an output NaN must show in the
                // figures too, not only in the verdict.
                v.max_abs_err = f64::NAN;
                v.max_rel_err = f64::NAN;
            } else {
                v.max_abs_err = v.max_abs_err.max(err);
                if w != 0.0 {
                    v.max_rel_err = v.max_rel_err.max(err / w.abs());
                }
            }
            // NaN compares false everywhere: make it fail loudly.
            v.worst_error_over_bound = if ratio.is_nan() {
                f64::INFINITY
            } else {
                v.worst_error_over_bound.max(ratio)
            };
        }
        if got.len() != want.len() {
            v.worst_error_over_bound = f64::INFINITY;
        }
        v
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} elements, max abs err {:.3e}, max rel err {:.3e}, worst err/bound {:.3} ({})",
            self.output,
            self.elements,
            self.max_abs_err,
            self.max_rel_err,
            self.worst_error_over_bound,
            self.tolerance
        )
    }
}

/// A decode-layer workload's name and feed-forward block; `None` for the
/// other names.
fn decode_layer_mlp(name: &str) -> Option<(&'static str, crate::model::Mlp)> {
    match name {
        "decode-layer" => Some(("decode-layer", crate::model::Mlp::Moe(crate::model::MOE))),
        "decode-layer-dense" => Some(("decode-layer-dense", crate::model::Mlp::Dense)),
        _ => None,
    }
}

impl Workload {
    /// Builds the workload called `name` (see [`NAMES`]), after checking
    /// that its sizes are within [`crate::budget`]'s bounds.
    pub fn build(name: &str, p: Params) -> Result<Workload, WorkloadError> {
        crate::budget::check(name, &p)?;
        match name {
            "gemm" => gemm(p),
            "mlp" => mlp(p, false),
            "mlp-scratch" => mlp(p, true),
            "streams" => streams(p),
            "moe" => crate::moe::moe("moe", p, 2, 0.0),
            "moe-var" => crate::moe::moe("moe-var", p, 4, 0.15),
            "pipeline" => {
                crate::pipeline::pipeline(p, crate::pipeline::DEFAULT_DEPTH).map(|(w, _)| w)
            }
            "attention-pipeline" => {
                crate::attention_pipeline::attention_pipeline(p, crate::pipeline::DEFAULT_DEPTH)
                    .map(|(w, _)| w)
            }
            "decode" => crate::attention::workload::named("decode", p),
            "decode-uniform" => crate::attention::workload::named("decode-uniform", p),
            "decode-skew" => crate::attention::workload::named("decode-skew", p),
            "decode-device" => crate::attention::device::named(p),
            "sparse-decode" => crate::attention::sparse::named("sparse-decode", p),
            "moe-layer" => crate::moe_layer::named("moe-layer", p),
            "moe-layer-var" => crate::moe_layer::named("moe-layer-var", p),
            "decode-layer" | "decode-layer-dense" => match decode_layer_mlp(name) {
                Some((name, mlp)) => {
                    crate::model::layer::named(name, p, mlp, crate::model::layer::DEFAULT_LAYERS)
                }
                None => Err(WorkloadError::Unknown(name.to_string())),
            },
            "stitched" => crate::model::stitch::stitched(p),
            _ if name.starts_with("wsp9-") => crate::wsp9::build(name, p),
            _ => Err(WorkloadError::Unknown(name.to_string())),
        }
    }

    /// Builds the decode-layer workload called `name` (`decode-layer`,
    /// `decode-layer-dense`) with `layers` layers instead of its default
    /// ([`crate::model::layer::DEFAULT_LAYERS`]), after checking its sizes
    /// as [`Workload::build`] does. Other names are refused: they have no
    /// layers.
    pub fn decode_layers(name: &str, p: Params, layers: u32) -> Result<Workload, WorkloadError> {
        let Some((name, mlp)) = decode_layer_mlp(name) else {
            return Err(WorkloadError::Params(format!(
                "{name} has no layers to set: only decode-layer and decode-layer-dense do"
            )));
        };
        crate::budget::check_layers(name, &p, layers)?;
        crate::model::layer::named(name, p, mlp, layers)
    }

    /// Checks an arena after a run.
    pub fn verify(&self, arena: &Arena) -> Verification {
        if arena.bytes.len() != self.arena.bytes.len() {
            return Verification::arena_size(arena.bytes.len(), self.arena.bytes.len());
        }
        (self.check)(arena)
    }
}

/// Why a workload could not be built.
#[derive(Debug)]
pub enum WorkloadError {
    /// A name not in [`NAMES`].
    Unknown(String),
    /// Sizes the workload cannot be built with; says which and why.
    Params(String),
    /// The table builder refused a tensor or task.
    Build(BuildError),
    /// Sizes past a bound of [`crate::budget`]: refused before anything
    /// was built.
    TooLarge {
        /// The sizes the workload reads, e.g. `m = 65536, n = 8192`.
        sizes: String,
        /// The bound they pass.
        bound: crate::budget::Bound,
        /// What they need of it: bytes, or tasks.
        needs: u128,
    },
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadError::Unknown(name) => {
                write!(f, "unknown workload `{name}` (known: {})", NAMES.join(", "))
            }
            WorkloadError::Params(why) => write!(f, "bad sizes: {why}"),
            WorkloadError::Build(e) => write!(f, "{e}"),
            WorkloadError::TooLarge {
                sizes,
                bound,
                needs,
            } => write!(f, "{sizes} need {}; {bound}", bound.amount(*needs)),
        }
    }
}

impl std::error::Error for WorkloadError {}

impl From<BuildError> for WorkloadError {
    fn from(e: BuildError) -> Self {
        WorkloadError::Build(e)
    }
}

fn check_tiling(p: &Params, max_tile: u32) -> Result<(), WorkloadError> {
    if p.tile == 0 || p.tile > max_tile {
        return Err(WorkloadError::Params(format!(
            "tile {} must be in 1..={max_tile}",
            p.tile
        )));
    }
    for (name, v) in [("m", p.m), ("n", p.n), ("k", p.k)] {
        if v == 0 || v % p.tile != 0 {
            return Err(WorkloadError::Params(format!(
                "{name} = {v} must be a positive multiple of tile {}",
                p.tile
            )));
        }
    }
    Ok(())
}

/// Appends the tasks of C += A x B in `t` x `t` tiles, accumulating over k
/// in order, so every C tile is a chain of dependent tasks.
fn gemm_tasks(
    b: &mut TableBuilder,
    ids: [crate::table::TensorId; 3],
    p: &Params,
) -> Result<(), BuildError> {
    gemm_tasks_on(b, 0, ids, p)
}

/// As [`gemm_tasks`], on `stream` (0: none).
fn gemm_tasks_on(
    b: &mut TableBuilder,
    stream: u32,
    ids: [crate::table::TensorId; 3],
    p: &Params,
) -> Result<(), BuildError> {
    let [a, bm, c] = ids;
    let t = p.tile;
    for i in (0..p.m).step_by(t as usize) {
        for j in (0..p.n).step_by(t as usize) {
            for k in (0..p.k).step_by(t as usize) {
                let args = [
                    Arg::tile(a, In, i, k, t, t),
                    Arg::tile(bm, In, k, j, t, t),
                    Arg::tile(c, InOut, i, j, t, t),
                ];
                b.task_on(stream, GEMM, &args, &[])?;
            }
        }
    }
    Ok(())
}

/// The f32 error bound of each element of a `k`-term GEMM, from the
/// per-element sums of |products| that [`crate::reference::gemm`] returns.
pub fn gemm_bound(abs: Vec<f64>, k: u32) -> impl Fn(usize) -> f64 {
    // Recursive summation of k products in f32: |error| <= gamma_(k+1) * sum|a*b|,
    // gamma_n = n*u / (1 - n*u), plus the smallest normal to cover all-zero sums.
    let n = (k + 1) as f64;
    let gamma = n * U / (1.0 - n * U);
    move |i| gamma * abs[i] + f32::MIN_POSITIVE as f64
}

pub(crate) const GEMM_TOLERANCE: &str =
    "|c - ref| <= gamma_(K+1) * sum_k |a_ik * b_kj|, the f32 summation bound";

/// C (m x n) = A (m x k) x B (k x n) in tiles; C starts at zero.
fn gemm(p: Params) -> Result<Workload, WorkloadError> {
    check_tiling(&p, 64)?;
    let mut b = TableBuilder::new();
    let ids = [
        b.tensor("A", &[p.m, p.k])?,
        b.tensor("B", &[p.k, p.n])?,
        b.tensor("C", &[p.m, p.n])?,
    ];
    gemm_tasks(&mut b, ids, &p)?;
    let mut rng = SplitMix64::new(p.seed);
    let (av, bv) = (
        rng.fill((p.m * p.k) as usize),
        rng.fill((p.k * p.n) as usize),
    );
    let mut arena = Arena::zeroed(b.arena_size());
    arena.write_f32(b.layout(ids[0]), &av);
    arena.write_f32(b.layout(ids[1]), &bv);
    let (want, abs) = reference::gemm_unchecked(&av, &bv, p.m as usize, p.n as usize, p.k as usize);
    let c = b.layout(ids[2]).clone();
    let bound = gemm_bound(abs, p.k);
    let check = move |arena: &Arena| {
        Verification::compare("C", &arena.read_f32(&c), &want, &bound, GEMM_TOLERANCE)
    };
    Ok(Workload {
        name: "gemm",
        summary: format!(
            "C[{m}x{n}] = A[{m}x{k}] x B[{k}x{n}], f32, {t}x{t} tiles",
            m = p.m,
            n = p.n,
            k = p.k,
            t = p.tile
        ),
        table: b.finish()?,
        arena,
        tensors: b.layouts().to_vec(),
        tasks: b.num_tasks(),
        check: Box::new(check),
        csp: Default::default(),
    })
}

/// Bytes of `mlp-scratch`'s heap ring for m x n intermediates: room for
/// two of them at once. Y and Z are live together (the adds read Y and
/// write Z); N takes Y's place once the last add retires (the first
/// rmsnorm waits for that: a `HEAP_RING_FULL` stall), and Z's storage
/// returns after the last rmsnorm.
pub fn mlp_scratch_heap(m: u32, n: u32) -> u64 {
    2 * (m as u64 * n as u64 * 4).next_multiple_of(64)
}

/// A block that uses every kernel: Y = X x W (GEMM tiles), Z = Y + R (add),
/// N = rmsnorm(Z) * G, P = softmax(N) per row. X is m x k, W is k x n.
/// With `scratch` (`mlp-scratch`), the intermediates Y, Z and N are
/// scratch tensors: the heap ring ([`mlp_scratch_heap`]) lends them storage
/// while they are live, and the arena holds only X, W, R, G and P.
fn mlp(p: Params, scratch: bool) -> Result<Workload, WorkloadError> {
    check_tiling(&p, 64)?;
    if p.n > 1024 {
        return Err(WorkloadError::Params(format!(
            "n = {} must be at most 1024 (row kernels)",
            p.n
        )));
    }
    let mut b = TableBuilder::new();
    let (x, w) = (b.tensor("X", &[p.m, p.k])?, b.tensor("W", &[p.k, p.n])?);
    let inter = |b: &mut TableBuilder, name: &str| {
        if scratch {
            b.scratch(name, &[p.m, p.n])
        } else {
            b.tensor(name, &[p.m, p.n])
        }
    };
    let (y, r) = (inter(&mut b, "Y")?, b.tensor("R", &[p.m, p.n])?);
    let (z, g) = (inter(&mut b, "Z")?, b.tensor("G", &[1, p.n])?);
    let (nrm, out) = (inter(&mut b, "N")?, b.tensor("P", &[p.m, p.n])?);
    if scratch {
        b.heap(mlp_scratch_heap(p.m, p.n))?;
    }
    gemm_tasks(&mut b, [x, w, y], &p)?;
    let t = p.tile;
    for i in (0..p.m).step_by(t as usize) {
        for j in (0..p.n).step_by(t as usize) {
            let args = [
                Arg::tile(y, In, i, j, t, t),
                Arg::tile(r, In, i, j, t, t),
                Arg::tile(z, Out, i, j, t, t),
            ];
            b.task(ADD, &args, &[])?;
        }
    }
    let eps = 1e-5f32;
    let rows = 16.min(p.m);
    for i in (0..p.m).step_by(rows as usize) {
        let rows = rows.min(p.m - i);
        let args = [
            Arg::tile(z, In, i, 0, rows, p.n),
            Arg::tile(g, In, 0, 0, 1, p.n),
            Arg::tile(nrm, Out, i, 0, rows, p.n),
        ];
        b.task(RMSNORM, &args, &[eps.to_bits() as u64])?;
        b.task(
            SOFTMAX,
            &[
                Arg::tile(nrm, In, i, 0, rows, p.n),
                Arg::tile(out, Out, i, 0, rows, p.n),
            ],
            &[],
        )?;
    }
    let mut rng = SplitMix64::new(p.seed);
    let inputs = [
        (x, rng.fill((p.m * p.k) as usize)),
        (w, rng.fill((p.k * p.n) as usize)),
    ];
    let rv = rng.fill((p.m * p.n) as usize);
    let gv: Vec<f32> = rng
        .fill(p.n as usize)
        .iter()
        .map(|v| 1.0 + 0.5 * v)
        .collect();
    let mut arena = Arena::zeroed(b.arena_size());
    for (id, values) in &inputs {
        arena.write_f32(b.layout(*id), values);
    }
    arena.write_f32(b.layout(r), &rv);
    arena.write_f32(b.layout(g), &gv);
    let (yv, _) = reference::gemm_unchecked(
        &inputs[0].1,
        &inputs[1].1,
        p.m as usize,
        p.n as usize,
        p.k as usize,
    );
    let to64 = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<_>>();
    let zv = reference::add(&yv, &to64(&rv));
    let nv = reference::rmsnorm_unchecked(&zv, &to64(&gv), p.n as usize, eps as f64);
    let want = reference::softmax_unchecked(&nv, p.n as usize);
    let out_layout = b.layout(out).clone();
    const TOL: &str =
        "|p - ref| <= 1e-5 * |ref| + 1e-8 (f32 GEMM error carried through rmsnorm and softmax)";
    let bound = {
        let want = want.clone();
        move |i: usize| 1e-5 * want[i].abs() + 1e-8
    };
    let check = move |arena: &Arena| {
        Verification::compare("P", &arena.read_f32(&out_layout), &want, &bound, TOL)
    };
    Ok(Workload {
        name: if scratch { "mlp-scratch" } else { "mlp" },
        summary: format!(
            "P = softmax(rmsnorm(X[{m}x{k}] x W[{k}x{n}] + R) * G), f32, {t}x{t} GEMM tiles{}",
            if scratch {
                ", Y, Z and N on the heap ring"
            } else {
                ""
            },
            m = p.m,
            n = p.n,
            k = p.k,
            t = p.tile
        ),
        table: b.finish()?,
        arena,
        tensors: b.layouts().to_vec(),
        tasks: b.num_tasks(),
        check: Box::new(check),
        csp: Default::default(),
    })
}

/// Two GEMMs on two streams, joined by events: Y1 = A1 x B1 on stream 1,
/// Y2 = A2 x B2 on stream 2, then Z = Y1 + Y2 in tiles on stream 3, which
/// first waits for an event recorded at the end of each GEMM stream. (The
/// adds also read Y1 and Y2, so their data dependencies order them too; the
/// events show the table form a program uses when they do not.)
fn streams(p: Params) -> Result<Workload, WorkloadError> {
    check_tiling(&p, 64)?;
    let mut b = TableBuilder::new();
    let (a1, b1) = (b.tensor("A1", &[p.m, p.k])?, b.tensor("B1", &[p.k, p.n])?);
    let (a2, b2) = (b.tensor("A2", &[p.m, p.k])?, b.tensor("B2", &[p.k, p.n])?);
    let (y1, y2) = (b.tensor("Y1", &[p.m, p.n])?, b.tensor("Y2", &[p.m, p.n])?);
    let z = b.tensor("Z", &[p.m, p.n])?;
    gemm_tasks_on(&mut b, 1, [a1, b1, y1], &p)?;
    b.record_event(1, 0)?;
    gemm_tasks_on(&mut b, 2, [a2, b2, y2], &p)?;
    b.record_event(2, 1)?;
    b.wait_event(3, 0)?;
    b.wait_event(3, 1)?;
    let t = p.tile;
    for i in (0..p.m).step_by(t as usize) {
        for j in (0..p.n).step_by(t as usize) {
            let args = [
                Arg::tile(y1, In, i, j, t, t),
                Arg::tile(y2, In, i, j, t, t),
                Arg::tile(z, Out, i, j, t, t),
            ];
            b.task_on(3, ADD, &args, &[])?;
        }
    }
    let mut rng = SplitMix64::new(p.seed);
    let (mk, kn) = ((p.m * p.k) as usize, (p.k * p.n) as usize);
    let inputs = [
        (a1, rng.fill(mk)),
        (b1, rng.fill(kn)),
        (a2, rng.fill(mk)),
        (b2, rng.fill(kn)),
    ];
    let mut arena = Arena::zeroed(b.arena_size());
    for (id, values) in &inputs {
        arena.write_f32(b.layout(*id), values);
    }
    let (m, n, k) = (p.m as usize, p.n as usize, p.k as usize);
    let (y1v, abs1) = reference::gemm_unchecked(&inputs[0].1, &inputs[1].1, m, n, k);
    let (y2v, abs2) = reference::gemm_unchecked(&inputs[2].1, &inputs[3].1, m, n, k);
    let want = reference::add(&y1v, &y2v);
    let (bound1, bound2) = (gemm_bound(abs1, p.k), gemm_bound(abs2, p.k));
    let bound = {
        let want = want.clone();
        // Each GEMM's bound, plus the rounding of the add.
        move |i: usize| bound1(i) + bound2(i) + U * want[i].abs()
    };
    const TOL: &str = "|z - ref| <= both GEMMs' f32 summation bounds + u * |ref| for the add";
    let out = b.layout(z).clone();
    let check =
        move |arena: &Arena| Verification::compare("Z", &arena.read_f32(&out), &want, &bound, TOL);
    Ok(Workload {
        name: "streams",
        summary: format!(
            "Z[{m}x{n}] = A1 x B1 (stream 1) + A2 x B2 (stream 2), joined on stream 3 by events, f32, {t}x{t} tiles",
            m = p.m,
            n = p.n,
        ),
        table: b.finish()?,
        arena,
        tensors: b.layouts().to_vec(),
        tasks: b.num_tasks(),
        check: Box::new(check),
        csp: Default::default(),
    })
}
