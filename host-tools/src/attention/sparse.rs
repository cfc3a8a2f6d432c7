//! The `sparse-decode` workload: DeepSeek-style sparse attention for one
//! decode step, the tier of each request decided on the device from its
//! length.
//!
//! Per request `b` (one query token, GQA as in [decode](super)):
//! - **dense**, `len <= dense_max`: one `attn_decode_partial` per KV head
//!   over all `len` tokens, straight into `out` (no split);
//! - **sparse**, longer: the lightning indexer scores every token
//!   (`indexer_scores` over chunks of the request's indexer keys into its
//!   scores row), `topk` keeps the `k = min(k_max, len)` best positions
//!   (into meta row `2b + 1`, in increasing position order), and one
//!   `attn_sparse_partial` per KV head attends to those tokens only,
//!   straight into `out`. The indexer's chunk size is the request's tier's.
//!
//! # Tiers ([`Tiers::full`]; the tests scale every number down)
//!
//! | tier      | KV length        | path                                       |
//! |-----------|------------------|--------------------------------------------|
//! | dense     | 1 ..= 2,048      | `attn_decode_partial` over all tokens      |
//! | sparse-8K | 2,049 ..= 8,192  | indexer in chunks of 512 keys, top-2,048   |
//! | sparse-16K| 8,193 ..= 16,384 | indexer in chunks of 1,024 keys, top-2,048 |
//! | refused   | > 16,384         | before the run: `topk` takes 16,384 scores |
//!
//! The program (the lengths and key offsets are read on the device):
//!
//! ```text
//! parallel b in 0..B:
//!     len = load lens[0, b]; start = load lens[1, b]
//!     when len <= dense_max:
//!         parallel h: attn_decode_partial(q[b, h], kv[h], meta[b, 0], out[b, h]; 0, len)
//!     otherwise:
//!         when len <= 8K:  parallel i in 0..ceil(len / 512):   (a Count axis)
//!                              indexer_scores(iq[b], iw[b], keys[start + 512 i ..], scores[start + 512 i ..])
//!         otherwise:       the same in chunks of 1,024
//!         topk(scores[start .. start + len] -> meta[b, 1, 0..k]; k = min(k_max, len))
//!         parallel h: attn_sparse_partial(q[b, h], kv[h], meta[b, 0..2], out[b, h]; k, P, scale, len)
//! ```
//!
//! The runtime orders `topk` after its request's indexer tasks and the
//! sparse partials after `topk` from the regions alone.
//!
//! # Layout
//!
//! The decode tensors `q`, `kv`, `meta` and `out` of [the module
//! layout](super), seen with more dimensions as in [`super::device`], with
//! `meta` `W = max(pages, k_max)` wide (row `2b + 1` holds up to `k_max`
//! selected positions), and:
//!
//! | tensor   | dtype | shape          | contents |
//! |----------|-------|----------------|----------|
//! | `iq`     | f32   | `[B, H, Dq]`   | request `b`'s indexer query heads |
//! | `iw`     | f32   | `[B, 1, H]`    | its indexer head weights |
//! | `keys`   | f32   | `[T, Dq]`      | indexer keys, request `b`'s `len[b]` rows from `start[b]` (`T` = all tokens) |
//! | `scores` | f32   | `[1, T]`       | indexer scores, laid out as `keys` (scratch) |
//! | `lens`   | i32   | `[2, B]`       | row 0 the lengths, row 1 the key offsets `start[b]` (an input) |
//!
//! # The oracle and an unambiguous top-k
//!
//! The f64 reference computes the indexer scores in f64, takes the top-k
//! in f64 (ties to the lower position) and attends to exactly those
//! tokens ([`reference::attention_over`], error bound [`reference::bound`]
//! with one chunk). A selection is only well defined between f32 and f64
//! when the k-th and (k+1)-th scores are further apart than twice the f32
//! scores' error, so the data is built to make them so (see
//! [`SparseData::build`]) and the check verifies the margin (else it
//! fails, naming the request), then that the device selected exactly the
//! reference's positions, then the outputs.

use std::cmp::Ordering;

use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ATTN_SPARSE_PARTIAL as SPARSE_PARTIAL,
    WspKernelId_WSP_KERNEL_INDEXER_SCORES as INDEXER, WspKernelId_WSP_KERNEL_TOPK as TOPK,
};

use super::kv::{DecodeData, DecodeShape, MetaError};
use super::reference;
use super::workload::PARTIAL;
use crate::program::{Axis, Expr, LowerError, Region, Workload as Program};
use crate::rng::SplitMix64;
use crate::table::{Arena, TensorId};
use crate::workloads::{Params, Verification, Workload, WorkloadError};

/// `topk`'s most scores per call: the longest request a tier may take.
pub const MAX_SCORES: u32 = 16384;
/// `topk`'s largest k.
pub const MAX_TOPK: u32 = 2048;
/// `indexer_scores`' most keys per call: the largest indexer chunk.
pub const MAX_KEYS: u32 = 1024;
/// `indexer_scores`' most heads.
pub const MAX_INDEX_HEADS: u32 = 64;
/// `indexer_scores`' largest key dimension.
pub const MAX_INDEX_DIM: u32 = 128;
/// Spacing of the distinct indexer scores the data is built with.
pub const SCORE_STEP: f32 = 1.0 / 16.0;

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;

/// One sparse tier: requests up to `longest` tokens run the indexer in
/// chunks of `chunk` keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tier {
    /// The longest KV length the tier takes.
    pub longest: u32,
    /// Indexer keys per `indexer_scores` call.
    pub chunk: u32,
}

/// How each request is served, by its length (see [the tier
/// table](self)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tiers {
    /// Requests up to this length run dense attention.
    pub dense_max: u32,
    /// The most tokens a sparse request attends to.
    pub k_max: u32,
    /// The sparse tiers, by increasing `longest`; a request longer than
    /// the last one is refused.
    pub sparse: Vec<Tier>,
}

/// Which path a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// Dense attention over every token.
    Dense,
    /// Sparse tier `tier` (an index into [`Tiers::sparse`]).
    Sparse {
        /// The tier's index.
        tier: usize,
    },
}

impl Tiers {
    /// The release-size tiers: dense up to 2,048, k = 2,048, indexer
    /// chunks of 512 up to 8K and of 1,024 up to 16K.
    pub fn full() -> Tiers {
        Tiers {
            dense_max: 2048,
            k_max: 2048,
            sparse: vec![
                Tier {
                    longest: 8192,
                    chunk: 512,
                },
                Tier {
                    longest: 16384,
                    chunk: 1024,
                },
            ],
        }
    }

    /// Checks the tiers against the kernels' limits.
    pub fn check(&self) -> Result<(), String> {
        if self.dense_max == 0 {
            return Err("dense_max 0: no tier takes a 1-token request".into());
        }
        if self.k_max == 0 || self.k_max > MAX_TOPK {
            return Err(format!("k_max {} is not in 1..={MAX_TOPK}", self.k_max));
        }
        let mut below = self.dense_max;
        for (i, t) in self.sparse.iter().enumerate() {
            if t.longest <= below {
                return Err(format!(
                    "sparse tier {i} ends at {} tokens, not above the tier below it ({below})",
                    t.longest
                ));
            }
            if t.chunk == 0 || t.chunk > MAX_KEYS {
                return Err(format!(
                    "sparse tier {i}: an indexer chunk of {} keys is not in 1..={MAX_KEYS}",
                    t.chunk
                ));
            }
            below = t.longest;
        }
        if below > MAX_SCORES {
            return Err(format!(
                "the last tier ends at {below} tokens, above topk's {MAX_SCORES} scores"
            ));
        }
        Ok(())
    }

    /// The longest request any tier takes.
    pub fn longest(&self) -> u32 {
        self.sparse.last().map_or(self.dense_max, |t| t.longest)
    }

    /// The path of a request of `len` tokens; `None` when it is too long.
    pub fn path(&self, len: u32) -> Option<Path> {
        if len <= self.dense_max {
            return Some(Path::Dense);
        }
        let tier = self.sparse.iter().position(|t| len <= t.longest)?;
        Some(Path::Sparse { tier })
    }

    /// Tokens a sparse request of `len` tokens attends to.
    pub fn k(&self, len: u32) -> u32 {
        self.k_max.min(len)
    }
}

/// The sizes of one sparse decode step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparseShape {
    /// The attention sizes (lengths, heads, head dimension, page size).
    pub decode: DecodeShape,
    /// Indexer heads `H`.
    pub index_heads: u32,
    /// Indexer key dimension `Dq`.
    pub index_dim: u32,
    /// The tiers.
    pub tiers: Tiers,
}

impl SparseShape {
    /// Checks the shape: the decode shape, the indexer sizes, the tiers,
    /// and every length against the longest tier (naming the request).
    pub fn check(&self) -> Result<(), WorkloadError> {
        let bad = |why: String| Err(WorkloadError::Params(why));
        self.decode
            .check()
            .map_err(|e| WorkloadError::Params(e.to_string()))?;
        if self.index_heads == 0 || self.index_heads > MAX_INDEX_HEADS {
            return bad(format!(
                "{} indexer heads are not in 1..={MAX_INDEX_HEADS}",
                self.index_heads
            ));
        }
        if self.index_dim == 0 || self.index_dim > MAX_INDEX_DIM {
            return bad(format!(
                "indexer dimension {} is not in 1..={MAX_INDEX_DIM}",
                self.index_dim
            ));
        }
        self.tiers.check().map_err(WorkloadError::Params)?;
        let longest = self.tiers.longest();
        if let Some((b, &len)) = self
            .decode
            .lengths
            .iter()
            .enumerate()
            .find(|(_, &l)| l > longest)
        {
            return bad(format!(
                "request {b}: KV length {len} exceeds the longest tier's {longest} tokens \
                 (topk takes at most {MAX_SCORES} scores)"
            ));
        }
        let total: u64 = self.decode.lengths.iter().map(|&l| l as u64).sum();
        if total > i32::MAX as u64 {
            return bad(format!("{total} indexer keys do not fit 32-bit offsets"));
        }
        Ok(())
    }
}

/// One sparse decode step's data.
#[derive(Clone, Debug)]
pub struct SparseData {
    /// The sizes.
    pub shape: SparseShape,
    /// Queries, the paged pool and the metadata, `meta` widened to
    /// `max(pages, k_max)` columns.
    pub attn: DecodeData,
    /// `[B, H, Dq]`: indexer queries.
    pub iq: Vec<f32>,
    /// `[B, H]`: indexer head weights.
    pub iw: Vec<f32>,
    /// `[T, Dq]`: indexer keys, request `b`'s from row `start[b]`.
    pub keys: Vec<f32>,
    /// First key row of each request.
    pub start: Vec<u32>,
}

impl SparseData {
    /// Random data for `shape`, seeded by `seed`, built so that each
    /// sparse request's top-k is unambiguous: indexer head 0 has weight 1
    /// and the unit query `e_0`, every other head weight 0, so
    /// `I[s] = ReLU(k_s[0])` exactly in f32; each request's `k_s[0]` are a
    /// shuffled set of distinct multiples of [`SCORE_STEP`], of which
    /// `(len - k) / 2` are `<= 0` (the ReLU ties at 0 only below the k-th
    /// largest). The other key and query elements are random in [-1, 1).
    pub fn build(shape: SparseShape, seed: u64) -> Result<SparseData, WorkloadError> {
        shape.check()?;
        let mut attn = DecodeData::build(shape.decode.clone(), seed)
            .map_err(|e| WorkloadError::Params(e.to_string()))?;
        // Widen meta to hold k_max selected positions per request.
        let width = attn.width.max(shape.tiers.k_max);
        let (old, new) = (attn.width as usize, width as usize);
        // 2B rows of W (the build's pool bounds both below 2^31) widened
        // to at most max(W, k_max <= 2048) columns: below 2^63.
        let mut meta = vec![-1i32; attn.meta.len() / old * new];
        for (row, src) in attn.meta.chunks_exact(old).enumerate() {
            meta[row * new..row * new + old].copy_from_slice(src);
        }
        attn.meta = meta;
        attn.width = width;

        let lengths = &shape.decode.lengths;
        let (b, h, dq) = (
            lengths.len(),
            shape.index_heads as usize,
            shape.index_dim as usize,
        );
        let mut rng = SplitMix64::new(seed ^ 0x5EA5_E1D3_A7E5_0001);
        let mut iq = rng.fill(b * h * dq);
        let mut iw = vec![0.0f32; b * h];
        for r in 0..b {
            let head0 = &mut iq[r * h * dq..(r * h + 1) * dq];
            head0.fill(0.0);
            head0[0] = 1.0;
            iw[r * h] = 1.0;
        }
        let total: usize = lengths.iter().map(|&l| l as usize).sum();
        let mut keys = rng.fill(total * dq);
        let mut start = Vec::with_capacity(b);
        let mut at = 0usize;
        for &len in lengths {
            start.push(at as u32);
            let k = shape.tiers.k(len);
            let zeros = ((len - k) / 2) as i64;
            let mut rank: Vec<i64> = (0..len as i64).collect();
            for i in (1..rank.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                rank.swap(i, j);
            }
            for (s, &r) in rank.iter().enumerate() {
                keys[(at + s) * dq] = (r + 1 - zeros) as f32 * SCORE_STEP;
            }
            at += len as usize;
        }
        Ok(SparseData {
            shape,
            attn,
            iq,
            iw,
            keys,
            start,
        })
    }
}

impl SparseData {
    /// Checks the data against its shape: the shape ([`SparseShape::check`]),
    /// the attention data ([`DecodeData::check`]), the sizes of the
    /// indexer's buffers (`iq` `[B, H, Dq]`, `iw` `[B, H]`, `keys` `[T, Dq]`
    /// with `T` the lengths' sum) and key offsets (request `b`'s `len[b]`
    /// keys from row `start[b]` within `keys`), and that every indexer
    /// query, weight and key is finite: [`MetaError::NonFinite`] names the
    /// first that is not (its tensor seen as rows of its last dimension),
    /// as for the attention data, since a NaN score makes the top-k
    /// arbitrary and the reference's margin NaN.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let params = |e: MetaError| WorkloadError::Params(e.to_string());
        self.shape.check()?;
        self.attn.check().map_err(params)?;
        let s = &self.shape;
        // The sizes are held twice (`shape.decode`, `attn.shape`): the
        // indexer reads one, the attention the other.
        if let Some(why) = differ(&s.decode, &self.attn.shape) {
            return Err(WorkloadError::Params(format!(
                "shape.decode and attn.shape differ ({why}): the attention data is of \
                 other sizes than the indexer's"
            )));
        }
        let lengths = &s.decode.lengths;
        let (b, h, dq) = (
            lengths.len() as u64,
            s.index_heads as u64,
            s.index_dim as u64,
        );
        // The shape's check bounds B by u32, H by 64 and Dq by 128.
        let total: u64 = lengths.iter().map(|&l| l as u64).sum();
        for (tensor, values, rows, cols) in [
            ("iq", &self.iq, b * h, dq),
            ("iw", &self.iw, b, h),
            ("keys", &self.keys, total, dq),
        ] {
            if values.len() as u64 != rows * cols {
                return Err(WorkloadError::Params(format!(
                    "{tensor} holds {} values; its shape takes {rows} rows of {cols}, {}",
                    values.len(),
                    rows * cols
                )));
            }
        }
        if self.start.len() != lengths.len() {
            return Err(WorkloadError::Params(format!(
                "{} key offsets for {} requests",
                self.start.len(),
                lengths.len()
            )));
        }
        for (r, (&start, &len)) in self.start.iter().zip(lengths).enumerate() {
            if start as u64 + len as u64 > total {
                return Err(WorkloadError::Params(format!(
                    "request {r}: its {len} indexer keys from row {start} run past the {total} rows of keys"
                )));
            }
        }
        for (tensor, values, cols) in [
            ("iq", &self.iq, dq as usize),
            ("iw", &self.iw, h as usize),
            ("keys", &self.keys, dq as usize),
        ] {
            if let Some(i) = values.iter().position(|v| !v.is_finite()) {
                return Err(params(MetaError::NonFinite {
                    tensor,
                    row: i / cols,
                    col: i % cols,
                    bits: values[i].to_bits(),
                }));
            }
        }
        Ok(())
    }
}

/// The first size in which `a` and `b` differ, named with both values.
fn differ(a: &DecodeShape, b: &DecodeShape) -> Option<String> {
    if a.lengths.len() != b.lengths.len() {
        return Some(format!(
            "{} requests against {}",
            a.lengths.len(),
            b.lengths.len()
        ));
    }
    if let Some((r, (x, y))) = a
        .lengths
        .iter()
        .zip(&b.lengths)
        .enumerate()
        .find(|(_, (x, y))| x != y)
    {
        return Some(format!("request {r}: KV length {x} against {y}"));
    }
    [
        ("query heads", a.q_heads, b.q_heads),
        ("KV heads", a.kv_heads, b.kv_heads),
        ("head dimension", a.d, b.d),
        ("page", a.page, b.page),
    ]
    .into_iter()
    .find(|(_, x, y)| x != y)
    .map(|(what, x, y)| format!("{what} {x} against {y}"))
}

/// The f64 reference's selection for one sparse request.
#[derive(Clone, Debug, PartialEq)]
pub struct Selection {
    /// The top-k positions, increasing.
    pub positions: Vec<u32>,
    /// The k-th largest score minus the (k+1)-th (infinite when all are
    /// selected).
    pub margin: f64,
    /// Twice the largest error bound of an f32 score: the selection is
    /// unambiguous when `margin > ambiguity`.
    pub ambiguity: f64,
}

/// The f64 indexer and top-k of request `b` (a sparse one), of data
/// [`SparseData::check`] accepts (refused with its reason otherwise).
///
/// Score error bound, per key `s`: the f32 dot products `q_j . k_s` (Dq
/// terms), ReLU (exact) and the weighted sum (H terms) are off by at most
/// `gamma_(Dq + H + 1) * sum_j |w_j| sum_d |q_jd k_sd|`.
pub fn select(data: &SparseData, b: usize) -> Result<Selection, WorkloadError> {
    data.check()?;
    let batch = data.shape.decode.lengths.len();
    if b >= batch {
        return Err(WorkloadError::Params(format!(
            "request {b} of a batch of {batch}"
        )));
    }
    Ok(selection(data, b))
}

/// [`select`] of checked data and a request of its batch.
fn selection(data: &SparseData, b: usize) -> Selection {
    let s = &data.shape;
    let (h, dq) = (s.index_heads as usize, s.index_dim as usize);
    let len = s.decode.lengths[b] as usize;
    let k = s.tiers.k(len as u32) as usize;
    let n = (dq + h + 1) as f64;
    let gamma = n * U / (1.0 - n * U);
    let q = &data.iq[b * h * dq..(b + 1) * h * dq];
    let w = &data.iw[b * h..(b + 1) * h];
    let mut scored: Vec<(f64, u32)> = Vec::with_capacity(len);
    let mut worst = 0.0f64;
    for t in 0..len {
        let key = &data.keys[(data.start[b] as usize + t) * dq..][..dq];
        let (mut score, mut abs) = (0.0f64, 0.0f64);
        for j in 0..h {
            let qj = &q[j * dq..(j + 1) * dq];
            let dot: f64 = qj.iter().zip(key).map(|(&a, &c)| a as f64 * c as f64).sum();
            let dot_abs: f64 = qj
                .iter()
                .zip(key)
                .map(|(&a, &c)| (a as f64 * c as f64).abs())
                .sum();
            score += w[j] as f64 * dot.max(0.0);
            abs += (w[j] as f64).abs() * dot_abs;
        }
        worst = worst.max(gamma * abs);
        scored.push((score, t as u32));
    }
    // Higher score first; ties to the lower position.
    scored.sort_by(|a, b| {
        b.0.partial_cmp(&a.0)
            .unwrap_or(Ordering::Equal)
            .then(a.1.cmp(&b.1))
    });
    let margin = if k < len {
        scored[k - 1].0 - scored[k].0
    } else {
        f64::INFINITY
    };
    let mut positions: Vec<u32> = scored[..k].iter().map(|&(_, t)| t).collect();
    positions.sort_unstable();
    Selection {
        positions,
        margin,
        ambiguity: 2.0 * worst,
    }
}

/// The tensors of the sparse decode program, in declaration order (see
/// [the layout](self)).
#[derive(Clone, Copy, Debug)]
pub struct SparseTensors {
    /// `[B, kv_heads, G, D]`.
    pub q: TensorId,
    /// `[kv_heads, pages * 2P, D]`.
    pub kv: TensorId,
    /// i32 `[B, 2, W]`.
    pub meta: TensorId,
    /// `[B, kv_heads, G, D + 2]`: the final states.
    pub out: TensorId,
    /// `[B, H, Dq]`.
    pub iq: TensorId,
    /// `[B, 1, H]`.
    pub iw: TensorId,
    /// `[T, Dq]`.
    pub keys: TensorId,
    /// `[1, T]`.
    pub scores: TensorId,
    /// i32 `[2, B]`: lengths, key offsets.
    pub lens: TensorId,
}

/// The sparse decode program for `data`'s shape (see [the
/// program](self)). Data [`SparseData::check`] refuses is refused, and so
/// are sizes the table cannot hold.
pub fn sparse_program(data: &SparseData) -> Result<(Program, SparseTensors), WorkloadError> {
    data.check()?;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let sh = &data.shape;
    let s = &sh.decode;
    let (b, d, g, kvh, page) = (s.batch(), s.d, s.group(), s.kv_heads, s.page);
    let (pool, width) = (data.attn.pool_rows(), data.attn.width);
    let (h, dq) = (sh.index_heads, sh.index_dim);
    // The shape's check bounds the keys' total by i32::MAX.
    let total: u32 = s.lengths.iter().sum();
    let tiers = sh.tiers.clone();
    let mut w = Program::new();
    let mut tensors = || -> Result<SparseTensors, LowerError> {
        Ok(SparseTensors {
            q: w.tensor("q", &[b, kvh, g, d])?,
            kv: w.tensor("kv", &[kvh, pool, d])?,
            meta: w.tensor_i32("meta", &[b, 2, width])?,
            out: w.tensor("out", &[b, kvh, g, d + 2])?,
            iq: w.tensor("iq", &[b, h, dq])?,
            iw: w.tensor("iw", &[b, 1, h])?,
            keys: w.tensor("keys", &[total, dq])?,
            scores: w.tensor("scores", &[1, total])?,
            lens: w.tensor_i32("lens", &[2, b])?,
        })
    };
    let t = tensors().map_err(lower)?;
    w.input(t.lens);
    let scale = Expr::Const(((1.0 / (d as f64).sqrt()) as f32).to_bits() as i64);
    let zero = || Expr::Const(0);
    w.parallel(Axis::Dense(b), |w, r| {
        // Read where used, not held: the program machine's registers.
        let len = || Expr::load(t.lens, vec![zero(), r.clone()]);
        let start = || Expr::load(t.lens, vec![Expr::Const(1), r.clone()]);
        let k = || len().min(tiers.k_max);
        // Every KV head: q[b, h], the pool of KV head h, meta[b, rows].
        let per_head =
            |w: &mut Program, kernel: u32, meta_rows: u32, scalars: &dyn Fn() -> [Expr; 4]| {
                w.parallel(Axis::Dense(kvh), |w, hd| {
                    let at = |t: TensorId, cols: u32| Region {
                        tensor: t,
                        offset: vec![r.clone(), hd.clone(), zero(), zero()],
                        rows: g.into(),
                        cols: cols.into(),
                    };
                    let kv = Region {
                        tensor: t.kv,
                        offset: vec![hd.clone(), zero(), zero()],
                        rows: pool.into(),
                        cols: d.into(),
                    };
                    let meta = Region {
                        tensor: t.meta,
                        offset: vec![r.clone(), zero(), zero()],
                        rows: meta_rows.into(),
                        cols: width.into(),
                    };
                    w.call(
                        kernel,
                        &[at(t.q, d), kv, meta, at(t.out, d + 2)],
                        &scalars(),
                    );
                });
            };
        // The indexer in chunks of `chunk` keys, at most `most` chunks.
        let indexer = |w: &mut Program, chunk: u32, most: u32| {
            w.parallel(
                Axis::Count {
                    count: (len() + (chunk - 1)) / chunk,
                    max: most,
                },
                |w, i| {
                    let first = || start() + i.clone() * chunk;
                    let n = || (len() - i.clone() * chunk).min(chunk);
                    let per_request = |t: TensorId, rows: u32, cols: u32| Region {
                        tensor: t,
                        offset: vec![r.clone(), zero(), zero()],
                        rows: rows.into(),
                        cols: cols.into(),
                    };
                    w.call(
                        INDEXER,
                        &[
                            per_request(t.iq, h, dq),
                            per_request(t.iw, 1, h),
                            Region {
                                tensor: t.keys,
                                offset: vec![first(), zero()],
                                rows: n(),
                                cols: dq.into(),
                            },
                            t.scores.tile(zero(), first(), 1, n()),
                        ],
                        &[],
                    );
                },
            );
        };
        w.when(
            len().le(tiers.dense_max),
            |w| {
                per_head(w, PARTIAL, 1, &|| {
                    [zero(), len(), Expr::Const(page as i64), scale.clone()]
                })
            },
            |w| {
                // Tier i if len <= its longest, else the next: nested whens.
                fn tiers_from(
                    w: &mut Program,
                    tiers: &[Tier],
                    len: &dyn Fn() -> Expr,
                    indexer: &dyn Fn(&mut Program, u32, u32),
                ) {
                    let (first, rest) = tiers.split_first().expect("at least one sparse tier");
                    let mine = |w: &mut Program| {
                        indexer(w, first.chunk, first.longest.div_ceil(first.chunk))
                    };
                    if rest.is_empty() {
                        // Longer requests were refused before the run; on
                        // the device the Count axis's bound refuses them.
                        mine(w);
                    } else {
                        w.when(len().le(first.longest), mine, |w| {
                            tiers_from(w, rest, len, indexer)
                        });
                    }
                }
                tiers_from(w, &tiers.sparse, &len, &indexer);
                w.call(
                    TOPK,
                    &[
                        t.scores.tile(zero(), start(), 1, len()),
                        Region {
                            tensor: t.meta,
                            offset: vec![r.clone(), Expr::Const(1), zero()],
                            rows: 1.into(),
                            cols: k(),
                        },
                    ],
                    &[k()],
                );
                per_head(w, SPARSE_PARTIAL, 2, &|| {
                    [k(), Expr::Const(page as i64), scale.clone(), len()]
                });
            },
        );
    });
    Ok((w, t))
}

/// Tasks the program expands for `tiers` over `lengths` with `kv_heads`
/// KV heads: `kv_heads` per dense request; per sparse one, its indexer
/// chunks, one `topk` and `kv_heads` sparse partials; none for a length
/// no tier takes (refused before a run). Tiers [`Tiers::check`] refuses
/// (e.g. an indexer chunk of 0 keys) are refused.
pub fn task_count(tiers: &Tiers, lengths: &[u32], kv_heads: u32) -> Result<usize, String> {
    tiers.check()?;
    Ok(lengths
        .iter()
        .map(|&len| match tiers.path(len) {
            None => 0,
            Some(Path::Dense) => kv_heads as usize,
            Some(Path::Sparse { tier }) => {
                len.div_ceil(tiers.sparse[tier].chunk) as usize + 1 + kv_heads as usize
            }
        })
        .sum())
}

/// A failed check that compared nothing: `output` says what failed.
pub(crate) fn failed(output: String, tolerance: &'static str) -> Verification {
    Verification {
        output,
        elements: 0,
        max_abs_err: f64::INFINITY,
        max_rel_err: f64::INFINITY,
        worst_error_over_bound: f64::INFINITY,
        tolerance,
    }
}

/// The sparse decode workload over `data`, checked against the f64
/// reference (see [the oracle](self)). The reference is computed when the
/// check runs, from `reference_data()` (e.g. the data rebuilt from its
/// seed: independent of the arena the run wrote).
pub fn sparse_workload_with(
    name: &'static str,
    data: &SparseData,
    reference_data: impl Fn() -> SparseData + 'static,
) -> Result<Workload, WorkloadError> {
    data.check()?;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let (mut w, t) = sparse_program(data)?;
    let table = w.finish().map_err(lower)?;
    let mut arena = Arena::zeroed(w.arena_size());
    arena.write_f32(w.layout(t.q), &data.attn.q);
    arena.write_f32(w.layout(t.kv), &data.attn.kv);
    arena.write_i32(w.layout(t.meta), &data.attn.meta);
    arena.write_f32(w.layout(t.iq), &data.iq);
    arena.write_f32(w.layout(t.iw), &data.iw);
    arena.write_f32(w.layout(t.keys), &data.keys);
    let s = &data.shape.decode;
    let mut lens: Vec<i32> = s.lengths.iter().map(|&l| l as i32).collect();
    lens.extend(data.start.iter().map(|&x| x as i32));
    arena.write_i32(w.layout(t.lens), &lens);

    let tiers = data.shape.tiers.clone();
    let check_tiers = tiers.clone();
    let (d, width) = (s.d as usize, data.attn.width as usize);
    let (out, meta) = (w.layout(t.out).clone(), w.layout(t.meta).clone());
    let check = move |arena: &Arena| {
        let want = reference_data();
        // Checked once here, then each request's `selection` of it.
        if let Err(e) = want.check() {
            return failed(format!("the f64 reference: {e}"), reference::TOLERANCE);
        }
        let lengths = &want.shape.decode.lengths;
        let mut picked: Vec<Vec<u32>> = Vec::with_capacity(lengths.len());
        let got_meta = arena.read_i32(&meta);
        for (b, &len) in lengths.iter().enumerate() {
            if check_tiers.path(len) == Some(Path::Dense) {
                picked.push((0..len).collect());
                continue;
            }
            let sel = selection(&want, b);
            if sel.margin.is_nan() || sel.margin <= sel.ambiguity {
                return failed(
                    format!(
                        "request {b}: top-k ambiguous (k-th minus (k+1)-th score {:.3e}, \
                         f32 score error up to {:.3e})",
                        sel.margin,
                        sel.ambiguity / 2.0
                    ),
                    "the k-th and (k+1)-th indexer scores must differ by more than twice \
                     the f32 scores' error",
                );
            }
            let row = &got_meta[(2 * b + 1) * width..][..sel.positions.len()];
            if row
                .iter()
                .zip(&sel.positions)
                .any(|(&g, &p)| g as i64 != p as i64)
            {
                return failed(
                    format!(
                        "meta row {}: request {b}'s selected positions differ from the \
                         reference top-{}",
                        2 * b + 1,
                        sel.positions.len()
                    ),
                    "the selection must equal the f64 top-k exactly",
                );
            }
            picked.push(sel.positions);
        }
        let r = match reference::attention_over(&want.attn, |b| picked[b].clone()) {
            Ok(r) => r,
            Err(e) => return failed(format!("the f64 reference: {e}"), reference::TOLERANCE),
        };
        // Made by the reference: its sizes are right.
        let bound = reference::bound_unchecked(&r, |_| 1);
        let got: Vec<f32> = arena
            .read_f32(&out)
            .chunks_exact(d + 2)
            .flat_map(|row| row[..d].to_vec())
            .collect();
        Verification::compare(
            "out (every selection equal to the f64 top-k)",
            &got,
            &r.o,
            |i| bound[i],
            reference::TOLERANCE,
        )
    };
    let dense = s
        .lengths
        .iter()
        .filter(|&&l| tiers.path(l) == Some(Path::Dense))
        .count();
    let tasks =
        task_count(&data.shape.tiers, &s.lengths, s.kv_heads).map_err(WorkloadError::Params)?;
    let total: u64 = s.lengths.iter().map(|&l| l as u64).sum();
    Ok(Workload {
        name,
        summary: format!(
            "sparse decode attention: {} requests ({dense} dense, {} sparse), {total} KV tokens \
             (longest {}), {} query / {} KV heads, D {}, pages of {}; dense up to {}, top-{} \
             of {} indexer heads of dim {}, tiers chosen on the device",
            s.batch(),
            s.lengths.len() - dense,
            s.lengths.iter().max().copied().unwrap_or(0),
            s.q_heads,
            s.kv_heads,
            s.d,
            s.page,
            data.shape.tiers.dense_max,
            data.shape.tiers.k_max,
            data.shape.index_heads,
            data.shape.index_dim,
        ),
        table,
        arena,
        tensors: w.layouts().to_vec(),
        tasks,
        check: Box::new(check),
        csp: Default::default(),
    })
}

/// [`sparse_workload_with`] whose reference uses a copy of `data`.
pub fn sparse_workload(name: &'static str, data: &SparseData) -> Result<Workload, WorkloadError> {
    let copy = data.clone();
    sparse_workload_with(name, data, move || copy.clone())
}

/// Query heads of the named workload (MQA, as DeepSeek's MLA decode: all
/// query heads share one latent KV head).
pub const Q_HEADS: u32 = 16;
/// KV heads of the named workload.
pub const KV_HEADS: u32 = 1;
/// Indexer heads of the named workload (DeepSeek's).
pub const INDEX_HEADS: u32 = 64;
/// Indexer key dimension of the named workload (DeepSeek's).
pub const INDEX_DIM: u32 = 128;

/// The lengths of `sparse-decode`: `m` requests, the longest `n`: `n`,
/// then 1 and each tier's bounds and the length just above (those below
/// `n`), then lengths spread geometrically over 1 ..= n; `m` in all.
/// A bound of `u32::MAX` has no length above it.
pub fn lengths_of(m: u32, n: u32, tiers: &Tiers) -> Vec<u32> {
    let mut v = vec![n, 1];
    let mut bounds = vec![tiers.dense_max];
    bounds.extend(tiers.sparse.iter().map(|t| t.longest));
    for bound in bounds {
        v.push(bound);
        v.extend(bound.checked_add(1));
    }
    let mut seen = std::collections::HashSet::new();
    v.retain(|&l| l >= 1 && l <= n && seen.insert(l));
    let mut i = 1u32;
    while (v.len() as u32) < m {
        // Geometric steps from 1 towards n.
        let f = i as f64 / (m as f64 + 1.0);
        v.push(((n as f64).powf(f).round() as u32).clamp(1, n));
        i += 1;
    }
    v.truncate(m as usize);
    v
}

/// Builds `sparse-decode` from `p` at full-size tiers: `m` requests, the
/// longest `n` tokens, head dimension `k`, pages of `tile`, 16 query
/// heads on 1 KV head, 64 indexer heads of dimension 128.
pub fn named(name: &'static str, p: Params) -> Result<Workload, WorkloadError> {
    if p.m == 0 || p.n == 0 {
        return Err(WorkloadError::Params(format!(
            "m (requests) = {} and n (longest KV length) = {} must be positive",
            p.m, p.n
        )));
    }
    let tiers = Tiers::full();
    let shape = SparseShape {
        decode: DecodeShape {
            lengths: lengths_of(p.m, p.n, &tiers),
            q_heads: Q_HEADS,
            kv_heads: KV_HEADS,
            d: p.k,
            page: p.tile,
        },
        index_heads: INDEX_HEADS,
        index_dim: INDEX_DIM,
        tiers,
    };
    let data = SparseData::build(shape.clone(), p.seed)?;
    // The reference rebuilds the data from its seed when the check runs.
    let rebuild = move || SparseData::build(shape.clone(), p.seed).expect("built once already");
    sparse_workload_with(name, &data, rebuild)
}
