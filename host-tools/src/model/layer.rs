//! The decode layer: its sizes, data, program and workload (see [the
//! module](super)).

use wsp_ffi::{
    WspKernelId_WSP_KERNEL_ADD as ADD, WspKernelId_WSP_KERNEL_COPY as COPY,
    WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM, WspKernelId_WSP_KERNEL_MATMUL as MATMUL,
    WspKernelId_WSP_KERNEL_RMSNORM as RMSNORM, WspKernelId_WSP_KERNEL_ROPE as ROPE,
    WspKernelId_WSP_KERNEL_SILU_MUL as SILU_MUL,
};

use super::reference;
use crate::attention::device::{attention_calls, most_chunks, plan_call, AttnDims, AttnTensors};
use crate::attention::kv::{check_meta, DecodeData, DecodeShape, MAX_DIM, MAX_GROUP};
use crate::attention::plan::{choose_chunk, CostModel, Plan};
use crate::moe_layer::{moe_ffn, pairs_per_expert, MoeConfig, MoeFfn, MAX_FFN};
use crate::program::{Axis, Expr, LowerError, Region, Workload as Program};
use crate::rng::SplitMix64;
use crate::table::{product, Arena, TensorId};
use crate::workloads::{Verification, Workload, WorkloadError};

/// Edge of the GEMM tiles.
pub const TILE: u32 = 64;
/// Rows of one `rmsnorm` task.
pub(crate) const NORM_ROWS: u32 = 16;
/// Largest batch (rows: requests, or a prefill chunk's tokens), in GEMM
/// row blocks of [`TILE`].
pub const MAX_BATCH: u32 = 256;
/// Largest hidden size: `rmsnorm`'s row.
pub const MAX_HIDDEN: u32 = 1024;
/// The RMSNorm epsilon.
pub const EPS: f32 = 1e-5;
/// The rotary embedding's base.
pub const THETA: f64 = 10000.0;
/// Cube cores the device planner plans attention for.
pub const PLAN_CORES: u32 = 8;

/// The feed-forward block of a layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mlp {
    /// `(silu(x Wg) * (x Wu)) Wd`, inner size [`LayerShape::ffn`].
    Dense,
    /// A mixture of experts over token tiles ([`crate::moe_layer::moe_ffn`]):
    /// `tokens` and `hidden` of the config are the batch's and are set
    /// when the layer is built.
    Moe(MoeConfig),
}

/// The MoE block of the named decode-layer workloads: 64 experts of ffn
/// 128, top 8, expert tiles of 16 rows, a shared expert of ffn 256
/// (fine-grained experts, as DeepSeek's and Qwen's MoE layers have).
pub const MOE: MoeConfig = MoeConfig {
    tokens: 0,
    hidden: 0,
    ffn: 128,
    experts: 64,
    top_k: 8,
    threshold: 0.0,
    tile: 16,
    shared_ffn: 256,
};

/// The sizes of a decode step through `layers` layers.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerShape {
    /// KV length of each request, this step's token included (each >= 1):
    /// the new token is at position `len - 1`.
    pub lengths: Vec<u32>,
    /// Query heads.
    pub q_heads: u32,
    /// KV heads; divides `q_heads`.
    pub kv_heads: u32,
    /// Head dimension (even). The hidden size is `q_heads * d`.
    pub d: u32,
    /// The dense feed-forward block's inner size, a multiple of [`TILE`]
    /// up to [`MAX_FFN`] (the MoE block's sizes are its config's).
    pub ffn: u32,
    /// Tokens per page of the KV cache.
    pub page: u32,
    /// Layers, back to back.
    pub layers: u32,
    /// The feed-forward block.
    pub mlp: Mlp,
}

impl LayerShape {
    /// The MoE block's config for this batch, if the layer has one.
    pub fn moe(&self) -> Option<MoeConfig> {
        match self.mlp {
            Mlp::Dense => None,
            Mlp::Moe(c) => Some(MoeConfig {
                tokens: self.batch(),
                hidden: self.hidden(),
                ..c
            }),
        }
    }

    /// Requests; `u32::MAX` for more, which [`LayerShape::check`]
    /// refuses (rather than a count cut to 32 bits).
    pub fn batch(&self) -> u32 {
        u32::try_from(self.lengths.len()).unwrap_or(u32::MAX)
    }

    /// The hidden size, `q_heads * d`: exact for a shape
    /// [`LayerShape::check`] accepts (at most [`MAX_HIDDEN`]); `u32::MAX`
    /// when it passes 32 bits, which the check refuses.
    pub fn hidden(&self) -> u32 {
        self.q_heads.saturating_mul(self.d)
    }

    /// Columns of the QKV projection, `(q_heads + 2 kv_heads) * d`: exact
    /// for a shape [`LayerShape::check`] accepts (at most 3 x
    /// [`MAX_HIDDEN`]); `u32::MAX` when it passes 32 bits, which the check
    /// refuses.
    pub fn qkv(&self) -> u32 {
        let heads = self.kv_heads.saturating_mul(2).saturating_add(self.q_heads);
        heads.saturating_mul(self.d)
    }

    /// The attention's shape (the lengths as they are after the append).
    pub fn attention(&self) -> DecodeShape {
        DecodeShape {
            lengths: self.lengths.clone(),
            q_heads: self.q_heads,
            kv_heads: self.kv_heads,
            d: self.d,
            page: self.page,
        }
    }

    /// Refuses sizes the kernels or the tiling cannot take, naming them.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let bad = |why: String| Err(WorkloadError::Params(why));
        // Exact: the accessors saturate past 32 bits.
        let (b, h) = (self.lengths.len(), self.q_heads as u64 * self.d as u64);
        if b == 0 || b > MAX_BATCH as usize {
            return bad(format!("{b} requests: the layer takes 1 ..= {MAX_BATCH}"));
        }
        let b = b as u32;
        if self.layers == 0 {
            return bad("0 layers".into());
        }
        if self.d == 0 || !self.d.is_multiple_of(2) || self.d > MAX_DIM {
            return bad(format!(
                "head dimension {} must be even and at most {MAX_DIM} (rope pairs halves)",
                self.d
            ));
        }
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a whole number of groups of {} KV heads",
                self.q_heads, self.kv_heads
            ));
        }
        if self.q_heads / self.kv_heads > MAX_GROUP {
            return bad(format!("a GQA group above {MAX_GROUP}"));
        }
        if h == 0 || !h.is_multiple_of(TILE as u64) || h > MAX_HIDDEN as u64 {
            return bad(format!(
                "hidden size {h} (q_heads x d) must be a multiple of {TILE} up to {MAX_HIDDEN}"
            ));
        }
        // q_heads x d <= 1024 and kv_heads <= q_heads: the QKV columns
        // are at most 3072, exact.
        if !self.qkv().is_multiple_of(TILE) {
            return bad(format!(
                "the QKV projection's {} columns are not a multiple of {TILE}",
                self.qkv()
            ));
        }
        if self.ffn == 0 || !self.ffn.is_multiple_of(TILE) || self.ffn > MAX_FFN {
            return bad(format!(
                "ffn {} must be a positive multiple of {TILE} up to {MAX_FFN}",
                self.ffn
            ));
        }
        if let Some(cfg) = self.moe() {
            cfg.check()?;
        }
        self.attention()
            .check()
            .map_err(|e| WorkloadError::Params(e.to_string()))?;
        crate::attention::device::check_plan(b, self.kv_heads, self.page, PLAN_CORES)
            .map_err(WorkloadError::Params)
    }
}

/// One layer's weights and KV cache.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[1, H]`: the attention norm's gain.
    pub g1: Vec<f32>,
    /// `[H, QKV]`: query heads, then key heads, then value heads.
    pub wqkv: Vec<f32>,
    /// `[H, H]`.
    pub wo: Vec<f32>,
    /// `[1, H]`: the feed-forward norm's gain.
    pub g2: Vec<f32>,
    /// `[H, F]`.
    pub wg: Vec<f32>,
    /// `[H, F]`.
    pub wu: Vec<f32>,
    /// `[F, H]`.
    pub wd: Vec<f32>,
    /// The MoE block's weights, if the layer has one (then `wg`, `wu` and
    /// `wd` are empty).
    pub moe: Option<MoeWeights>,
    /// `[kv_heads, pool rows, D]`: the paged cache (rows at each request's
    /// new position are overwritten by the step).
    pub kv: Vec<f32>,
}

/// One MoE block's weights, laid out as [`crate::moe_layer::MoeFfn`]'s
/// tensors.
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `[H, E]`.
    pub router: Vec<f32>,
    /// `[E * H, F]`.
    pub gate: Vec<f32>,
    /// `[E * H, F]`.
    pub up: Vec<f32>,
    /// `[E * F, H]`.
    pub down: Vec<f32>,
    /// The shared expert's gate and up `[H, Fs]` and down `[Fs, H]`.
    pub shared: [Vec<f32>; 3],
}

/// A decode step's inputs.
#[derive(Clone, Debug)]
pub struct LayerData {
    /// The sizes.
    pub shape: LayerShape,
    /// `[B, H]`: the new tokens' hidden states entering layer 0.
    pub x: Vec<f32>,
    /// Each layer's weights and cache.
    pub layers: Vec<LayerWeights>,
    /// The page tables, shared by every layer's cache (`[B, 2, W]` as the
    /// attention kernels take it).
    pub meta: Vec<i32>,
    /// Pages per KV head's pool.
    pub pages: u32,
    /// Page table width.
    pub width: u32,
    /// `[max length, D]`: row `p` holds `cos(p f_i)` then `sin(p f_i)`,
    /// `f_i = THETA^(-2i/D)`, computed in f64 and rounded.
    pub cs: Vec<f32>,
}

/// Refuses `values` unless they are `rows x cols` finite values, naming
/// `what` and its first value that is not finite (by row and column).
fn buffer(what: &str, values: &[f32], rows: u64, cols: u64) -> Result<(), WorkloadError> {
    let want = rows as u128 * cols as u128;
    if values.len() as u128 != want {
        return Err(WorkloadError::Params(format!(
            "{what} holds {} values; its shape takes {rows} rows of {cols}, {want}",
            values.len()
        )));
    }
    // With no columns there are no values, and nothing to divide.
    let cols = cols.max(1);
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(i) => Err(WorkloadError::Params(format!(
            "{what} row {} column {} is {} (inputs, weights and caches must be finite: \
             the f64 reference would be NaN)",
            i as u64 / cols,
            i as u64 % cols,
            values[i]
        ))),
    }
}

/// `n` values uniform in [-1, 1) times `2^-s`, `2^s` the power of two
/// nearest `sqrt(fan_in)` from above: activations stay near 1 and every
/// value is exact in f32.
fn weights(rng: &mut SplitMix64, n: usize, fan_in: u32) -> Vec<f32> {
    let s = (fan_in as f64).sqrt().log2().ceil() as i32;
    let scale = 2f32.powi(-s);
    rng.fill(n).into_iter().map(|v| v * scale).collect()
}

/// An MoE block's weights for `cfg` (a config [`MoeConfig::check`]
/// refuses is refused).
pub fn moe_weights(rng: &mut SplitMix64, cfg: &MoeConfig) -> Result<MoeWeights, WorkloadError> {
    cfg.check()?;
    // Checked: E <= 64, H <= 1024, F and Fs <= MAX_FFN = 2^15, so every
    // count below is at most 2^31.
    let (h, f, e, s) = (cfg.hidden, cfg.ffn, cfg.experts, cfg.shared_ffn);
    Ok(MoeWeights {
        router: router(rng, cfg),
        gate: weights(rng, (e * h * f) as usize, h),
        up: weights(rng, (e * h * f) as usize, h),
        down: weights(rng, (e * f * h) as usize, f),
        shared: [
            weights(rng, (h * s) as usize, h),
            weights(rng, (h * s) as usize, h),
            weights(rng, (s * h) as usize, s.max(1)),
        ],
    })
}

/// A router `[H, E]` whose logits are a few units apart (entries of
/// `2^-s` times 4, `2^s` near `sqrt(H)`): most draws route clearly. (Of a
/// checked config: H x E is at most 2^16.)
fn router(rng: &mut SplitMix64, cfg: &MoeConfig) -> Vec<f32> {
    let (h, e) = (cfg.hidden, cfg.experts);
    weights(rng, (h * e) as usize, h)
        .into_iter()
        .map(|v| 4.0 * v)
        .collect()
}

/// Router draws [`LayerData::build`] tries per MoE layer before it
/// plants them ([`plant`]), and in all.
const RANDOM_DRAWS: u32 = 100;
const MAX_DRAWS: u32 = 110;

/// How far [`plant`] raises each token's top-k logits above the rest:
/// the k-th and (k+1)-th probabilities then differ by a factor e^2 at
/// least. [`reference::decisive`] needs `e^2 > (1 + rel) / (1 - rel)`,
/// that is `rel < tanh 1 = 0.76`, with `rel` ten times `e^(2 Delta) - 1`
/// (and a term of f32 units): logits' bounds `Delta` below 0.036, which
/// a step at hidden 128 (2.5e-4 more a layer) reaches past 140 layers.
const PLANT: f64 = 2.0;

/// Adds to `router` (`[H, E]`, f32) the least change (least squares,
/// in f64) that raises each token's `k` largest logits on `hn` (`[T, H]`,
/// the f64 values of the router's input) by [`PLANT`], leaving the
/// others: `router += hn^T (hn hn^T)^-1 B`, where `B` holds `PLANT` at
/// each token's top-k experts and 0 elsewhere. Each token's choice and
/// the weights among its chosen experts (a softmax renormalised over
/// them, unchanged by a common shift) stay as they were; only the gap to
/// the experts left out widens. Changes nothing when `T > H` or `hn hn^T`
/// is singular (no exact solution): the caller draws again.
fn plant(router: &mut [f32], hn: &[f64], cfg: &MoeConfig) {
    let (h, e, k) = (
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.top_k as usize,
    );
    let t = hn.len() / h.max(1);
    if t == 0 || t > h || k >= e || router.len() != h * e {
        return;
    }
    let row = |i: usize| &hn[i * h..(i + 1) * h];
    // B: each token's top-k experts by its logits (hn W).
    let mut b = vec![0.0f64; t * e];
    for i in 0..t {
        let logits: Vec<f64> = (0..e)
            .map(|j| (0..h).map(|c| row(i)[c] * router[c * e + j] as f64).sum())
            .collect();
        let mut order: Vec<usize> = (0..e).collect();
        order.sort_by(|&a, &c| logits[c].total_cmp(&logits[a]));
        for &j in &order[..k] {
            b[i * e + j] = PLANT;
        }
    }
    // Solve (hn hn^T) Y = B by Gauss-Jordan elimination with partial
    // pivoting: one T x T system (T <= 256 requests) per planted layer,
    // written out here rather than taking a linear-algebra crate into the
    // tree for it.
    let mut g: Vec<f64> = (0..t * t)
        .map(|ij| {
            let (i, j) = (ij / t, ij % t);
            row(i).iter().zip(row(j)).map(|(a, c)| a * c).sum()
        })
        .collect();
    let scale = g.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    for col in 0..t {
        let Some(pivot) =
            (col..t).max_by(|&a, &c| g[a * t + col].abs().total_cmp(&g[c * t + col].abs()))
        else {
            return;
        };
        if g[pivot * t + col].abs() <= 1e-12 * scale {
            return;
        }
        for c in 0..t {
            g.swap(col * t + c, pivot * t + c);
        }
        for c in 0..e {
            b.swap(col * e + c, pivot * e + c);
        }
        for r in 0..t {
            if r == col {
                continue;
            }
            let f = g[r * t + col] / g[col * t + col];
            if f == 0.0 {
                continue;
            }
            for c in 0..t {
                g[r * t + c] -= f * g[col * t + c];
            }
            for c in 0..e {
                b[r * e + c] -= f * b[col * e + c];
            }
        }
    }
    for i in 0..t {
        let d = g[i * t + i];
        b[i * e..(i + 1) * e].iter_mut().for_each(|v| *v /= d);
    }
    // router += hn^T Y.
    for c in 0..h {
        for j in 0..e {
            let add: f64 = (0..t).map(|i| row(i)[c] * b[i * e + j]).sum();
            router[c * e + j] = (router[c * e + j] as f64 + add) as f32;
        }
    }
}

/// Gains `1 + v / 2`, `v` uniform in [-1, 1).
fn gains(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    rng.fill(n).into_iter().map(|v| 1.0 + 0.5 * v).collect()
}

/// The cos/sin cache for positions `0 .. len`, head dimension `d` (even
/// and positive: rope pairs the halves; others are refused).
pub fn cos_sin(len: u32, d: u32) -> Result<Vec<f32>, WorkloadError> {
    if d == 0 || !d.is_multiple_of(2) {
        return Err(WorkloadError::Params(format!(
            "head dimension {d} must be even and positive (rope pairs halves)"
        )));
    }
    let half = (d / 2) as usize;
    let mut cs = vec![0f32; len as usize * d as usize];
    for (p, row) in cs.chunks_exact_mut(d as usize).enumerate() {
        for i in 0..half {
            let a = p as f64 * THETA.powf(-2.0 * i as f64 / d as f64);
            row[i] = a.cos() as f32;
            row[half + i] = a.sin() as f32;
        }
    }
    Ok(cs)
}

impl LayerData {
    /// Random inputs, weights and caches for `shape`, seeded by `seed`:
    /// each request has pages of its own.
    pub fn build(shape: LayerShape, seed: u64) -> Result<LayerData, WorkloadError> {
        shape.check()?;
        let attn = DecodeData::build(shape.attention(), seed)
            .map_err(|e| WorkloadError::Params(e.to_string()))?;
        let (pages, width, meta) = (attn.pages, attn.width, attn.meta);
        Self::with_tables(shape, seed, pages, width, meta)?.decisive(seed)
    }

    /// A prefill chunk: the rows of `shape` are consecutive tokens of one
    /// request (`lengths` = `start + 1 ..= start + n`), which share its
    /// pages. Each row is a query token that appends its key and value and
    /// attends to every token up to itself: causal attention over the
    /// cache and the chunk, with the decode kernels.
    pub fn prefill_chunk(shape: LayerShape, seed: u64) -> Result<LayerData, WorkloadError> {
        shape.check()?;
        let first = shape.lengths[0];
        if shape
            .lengths
            .iter()
            .zip(first..)
            .any(|(&l, want)| l != want)
        {
            return Err(WorkloadError::Params(
                "a prefill chunk's lengths must be consecutive positions".into(),
            ));
        }
        let longest = *shape.lengths.last().expect("checked: not empty");
        let one = DecodeShape {
            lengths: vec![longest],
            ..shape.attention()
        };
        let attn =
            DecodeData::build(one, seed).map_err(|e| WorkloadError::Params(e.to_string()))?;
        let w = attn.width as usize;
        let rows = shape.lengths.len();
        let meta: Vec<i32> = (0..rows)
            .flat_map(|_| attn.meta[..2 * w].to_vec())
            .collect();
        Self::with_tables(shape, seed, attn.pages, attn.width, meta)?.decisive(seed)
    }

    /// Redraws each MoE layer's router until every routing decision on
    /// the layer's input is clear of flipping
    /// ([`reference::decisive`]), so that the f32 router must choose as
    /// the f64 reference does: a choice of data, made layer by layer.
    /// The logits' bounds grow with depth (about 2.5e-4 a layer at the
    /// default sizes), and past a dozen layers few random draws clear
    /// them: a draw that does not is then [`plant`]ed (its top-k logits
    /// raised by a margin), which clears them without changing what the
    /// layer computes.
    fn decisive(mut self, seed: u64) -> Result<LayerData, WorkloadError> {
        let Some(cfg) = self.shape.moe() else {
            return Ok(self);
        };
        let mut rng = SplitMix64::new(seed ^ 0x0072_6f75_7465);
        let mut x = reference::Val::exact(&self.x, self.shape.hidden() as usize);
        for l in 0..self.layers.len() {
            // Built for a checked shape: the tables, weights and x are
            // of its sizes.
            let (_, hn, _) = reference::attention_half_unchecked(&self, &self.layers[l], &x);
            let Some(m) = self.layers[l].moe.as_mut() else {
                return Err(WorkloadError::Params(format!(
                    "layer {l} has no MoE weights in an MoE step"
                )));
            };
            let mut tries = 0;
            while !reference::decisive(&hn, &m.router, &cfg)? {
                tries += 1;
                if tries > MAX_DRAWS {
                    return Err(WorkloadError::Params(format!(
                        "layer {l}: no router draw keeps every routing decision clear of the \
                         logits' error bounds, which grow with depth (fewer layers, or a larger \
                         hidden size, keep them smaller)"
                    )));
                }
                // Random draws first (shallow layers' data are what they
                // drew), then the last draw planted, then planted draws.
                if tries <= RANDOM_DRAWS || tries > RANDOM_DRAWS + 1 {
                    m.router = router(&mut rng, &cfg);
                }
                if tries > RANDOM_DRAWS {
                    plant(&mut m.router, &hn.v, &cfg);
                }
            }
            x = reference::layer_unchecked(&self, &self.layers[l], &x).0;
        }
        Ok(self)
    }

    /// The data of a checked `shape` on page tables `meta` over `pages`
    /// pages (as [`DecodeData::build`] made them: the pool fits u32 rows).
    fn with_tables(
        shape: LayerShape,
        seed: u64,
        pages: u32,
        width: u32,
        meta: Vec<i32>,
    ) -> Result<LayerData, WorkloadError> {
        // The shape's check bounds B <= 256, H <= 1024, QKV <= 3072 and
        // F <= 2^15: the u32 products below are at most 2^25.
        let (b, h, f, d) = (shape.batch() as usize, shape.hidden(), shape.ffn, shape.d);
        let mut rng = SplitMix64::new(seed ^ 0x006c_6179_6572);
        let x = rng.fill(b * h as usize);
        // The pool's rows fit u32, but times D (up to 128) they may not:
        // in usize.
        let pool = shape.kv_heads as usize * pages as usize * 2 * shape.page as usize * d as usize;
        let moe = shape.moe();
        let layers = (0..shape.layers)
            .map(|_| {
                let dense = |rng: &mut SplitMix64, n: u32, fan_in: u32| match moe {
                    None => weights(rng, n as usize, fan_in),
                    Some(_) => Vec::new(),
                };
                Ok(LayerWeights {
                    g1: gains(&mut rng, h as usize),
                    wqkv: weights(&mut rng, (h * shape.qkv()) as usize, h),
                    wo: weights(&mut rng, (h * h) as usize, h),
                    g2: gains(&mut rng, h as usize),
                    wg: dense(&mut rng, h * f, h),
                    wu: dense(&mut rng, h * f, h),
                    wd: dense(&mut rng, f * h, f),
                    moe: moe.map(|c| moe_weights(&mut rng, &c)).transpose()?,
                    kv: rng.fill(pool),
                })
            })
            .collect::<Result<_, WorkloadError>>()?;
        let longest = *shape.lengths.iter().max().expect("checked: not empty");
        Ok(LayerData {
            cs: cos_sin(longest, d)?,
            pages,
            width,
            meta,
            x,
            layers,
            shape,
        })
    }

    /// Checks the data against its shape, as [`DecodeData::check`] does
    /// for attention data: the shape ([`LayerShape::check`]); the page
    /// tables against the lengths and the pool
    /// ([`crate::attention::kv::check_meta`]), the pool's
    /// `kv_heads x pages x 2P` rows fitting `u32` as [`LayerData::build`]
    /// makes them; the size of every buffer (`x` `[B, H]`; one
    /// [`LayerWeights`] per layer, each matrix of its documented shape,
    /// the MoE block's weights if and only if the shape has one, and then
    /// no dense ones; the cache `[kv_heads, pool rows, D]`; `cs`
    /// `[longest length, D]`); and that `x`, every weight and the caches
    /// are finite, since the f64 reference would be NaN and the check a
    /// FAIL naming no cause (`cs` is not read by the reference: a wrong
    /// one fails the check). The first problem is returned, naming the
    /// buffer, its layer and the first bad value's row and column.
    pub fn check(&self) -> Result<(), WorkloadError> {
        self.check_tables()?;
        let s = &self.shape;
        let bad = |why: String| Err(WorkloadError::Params(why));
        // The shape's check bounds B, H and D (each at most 2^15): their
        // u64 products below cannot overflow.
        let (b, h, d) = (s.batch() as u64, s.hidden() as u64, s.d as u64);
        buffer("x", &self.x, b, h)?;
        let longest = s.lengths.iter().copied().max().unwrap_or(0);
        if self.cs.len() as u64 != longest as u64 * d {
            return bad(format!(
                "cs holds {} values; its shape takes {longest} positions of {d}, {}",
                self.cs.len(),
                longest as u64 * d
            ));
        }
        if self.layers.len() != s.layers as usize {
            return bad(format!(
                "{} layers of weights for a shape of {} layers",
                self.layers.len(),
                s.layers
            ));
        }
        for (l, lw) in self.layers.iter().enumerate() {
            self.check_weights(&format!("layer {l}"), lw)?;
        }
        Ok(())
    }

    /// The part of [`LayerData::check`] every layer's reference needs:
    /// the shape, the page tables against the lengths and the pool, and
    /// the pool's rows fitting `u32`.
    pub(crate) fn check_tables(&self) -> Result<(), WorkloadError> {
        let s = &self.shape;
        s.check()?;
        check_meta(&s.lengths, &self.meta, self.width, self.pages, s.page)
            .map_err(|e| WorkloadError::Params(e.to_string()))?;
        let pool = s.kv_heads as u128 * self.pages as u128 * 2 * s.page as u128;
        if pool > u32::MAX as u128 {
            return Err(WorkloadError::Params(format!(
                "a pool of {} KV heads x {} pages x 2 x {} tokens = {pool} rows does not fit \
                 32-bit indices",
                s.kv_heads, self.pages, s.page
            )));
        }
        Ok(())
    }

    /// The part of [`LayerData::check`] about one layer's weights `lw`
    /// (named `layer` in errors), on data whose tables
    /// [`LayerData::check_tables`] accepts: each matrix of its documented
    /// shape and finite, the MoE block's weights if and only if the shape
    /// has one (and then no dense ones), the cache `[kv_heads, pool rows,
    /// D]`.
    pub(crate) fn check_weights(
        &self,
        layer: &str,
        lw: &LayerWeights,
    ) -> Result<(), WorkloadError> {
        let s = &self.shape;
        let bad = |why: String| Err(WorkloadError::Params(why));
        // The shape's check bounds H, QKV, D, F and the MoE sizes (each at
        // most 2^15), the tables' the pool's rows by u32: their u64
        // products below cannot overflow.
        let (h, d, f) = (s.hidden() as u64, s.d as u64, s.ffn as u64);
        let pool = s.kv_heads as u64 * self.pool_rows() as u64;
        let what = |name: &str| format!("{layer}: {name}");
        buffer(&what("g1"), &lw.g1, 1, h)?;
        buffer(&what("wqkv"), &lw.wqkv, h, s.qkv() as u64)?;
        buffer(&what("wo"), &lw.wo, h, h)?;
        buffer(&what("g2"), &lw.g2, 1, h)?;
        buffer(&what("kv"), &lw.kv, pool, d)?;
        for (name, values, rows, cols) in [
            ("wg", &lw.wg, h, f),
            ("wu", &lw.wu, h, f),
            ("wd", &lw.wd, f, h),
        ] {
            match s.moe() {
                None => buffer(&what(name), values, rows, cols)?,
                Some(_) if !values.is_empty() => {
                    return bad(format!(
                        "{} holds {} values; an MoE layer has no dense weights",
                        what(name),
                        values.len()
                    ))
                }
                Some(_) => {}
            }
        }
        match (s.moe(), &lw.moe) {
            (None, None) => {}
            (Some(c), Some(m)) => {
                let (e, mf, sf) = (c.experts as u64, c.ffn as u64, c.shared_ffn as u64);
                buffer(&what("router"), &m.router, h, e)?;
                buffer(&what("gate"), &m.gate, e * h, mf)?;
                buffer(&what("up"), &m.up, e * h, mf)?;
                buffer(&what("down"), &m.down, e * mf, h)?;
                let [sg, su, sd] = &m.shared;
                buffer(&what("shared gate"), sg, h, sf)?;
                buffer(&what("shared up"), su, h, sf)?;
                buffer(&what("shared down"), sd, sf, h)?;
            }
            (Some(_), None) => return bad(what("an MoE shape without MoE weights")),
            (None, Some(_)) => return bad(what("MoE weights for a dense shape")),
        }
        Ok(())
    }

    /// Rows of one KV head's pool, `pages x 2P`; `u32::MAX` for more,
    /// which [`LayerData::check`] refuses (rather than a count wrapped to
    /// 32 bits).
    pub fn pool_rows(&self) -> u32 {
        let rows = self.pages as u128 * 2 * self.shape.page as u128;
        u32::try_from(rows).unwrap_or(u32::MAX)
    }

    /// The pool row of token `t` of request `b` (key, or value when
    /// `value`), within a KV head's pool (`0 ..` [`LayerData::pool_rows`]).
    /// Refused, naming the index and its bound: a request past the batch,
    /// a token past the request's length, and tables or a pool
    /// [`LayerData::check`] refuses (e.g. a page table entry naming no
    /// page of the pool).
    pub fn pool_row(&self, b: usize, t: u32, value: bool) -> Result<usize, WorkloadError> {
        let s = &self.shape;
        let Some(&len) = s.lengths.get(b) else {
            return Err(WorkloadError::Params(format!(
                "request {b} of a batch of {}",
                s.lengths.len()
            )));
        };
        if t >= len {
            return Err(WorkloadError::Params(format!(
                "token {t} of request {b}, past its {len} KV tokens"
            )));
        }
        self.check_tables()?;
        Ok(self.row_in_pool(b, t, value))
    }

    /// [`LayerData::pool_row`] unchecked, for the reference's inner loops:
    /// the caller has checked the tables ([`LayerData::check_tables`])
    /// and that `b` is a request and `t < lengths[b]`, so the entry is a
    /// page of the pool and the row is below the pool's `u32` rows.
    pub(crate) fn row_in_pool(&self, b: usize, t: u32, value: bool) -> usize {
        let (p, w) = (self.shape.page, self.width as usize);
        let page = self.meta[2 * b * w + (t / p) as usize] as usize;
        page * 2 * p as usize + if value { p as usize } else { 0 } + (t % p) as usize
    }

    /// The most chunks the device planner may split a request into; 0 for
    /// pages of 0 tokens (which hold none; the shape's check refuses them).
    pub fn max_chunks(&self) -> u32 {
        most_chunks(self.width, self.shape.page)
    }

    /// The attention's sizes for [`attention_calls`].
    fn attn_dims(&self) -> AttnDims {
        let s = &self.shape;
        AttnDims {
            batch: s.batch(),
            kv_heads: s.kv_heads,
            group: s.q_heads / s.kv_heads,
            d: s.d,
            page: s.page,
            pool: self.pool_rows(),
            width: self.width,
            most: self.max_chunks(),
        }
    }
}

/// The tensors of one layer.
#[derive(Clone, Copy, Debug)]
pub struct LayerTensors {
    /// `[1, H]`.
    pub g1: TensorId,
    /// `[H, QKV]`.
    pub wqkv: TensorId,
    /// `[H, H]`.
    pub wo: TensorId,
    /// `[1, H]`.
    pub g2: TensorId,
    /// `[kv_heads, pool rows, D]`: the cache.
    pub kv: TensorId,
    /// `[B, H]`: the normed input.
    pub xn: TensorId,
    /// `[B, QKV]`: the projection.
    pub qkv: TensorId,
    /// `[B, q_heads, D]`: rotated queries.
    pub q: TensorId,
    /// `[B, q_heads, D + 2]`: attention states.
    pub state: TensorId,
    /// `[B * kv_heads, max chunks * G, D + 2]`: partial states.
    pub parts: TensorId,
    /// `[B, H]`: the heads' o, one row per request.
    pub o: TensorId,
    /// `[B, H]`: the residual stream after attention.
    pub h: TensorId,
    /// `[B, H]`: its norm.
    pub hn: TensorId,
    /// The feed-forward block's.
    pub mlp: MlpTensors,
}

/// The tensors of a layer's feed-forward block.
#[derive(Clone, Copy, Debug)]
pub enum MlpTensors {
    /// The dense block's.
    Dense {
        /// `[H, F]`.
        wg: TensorId,
        /// `[H, F]`.
        wu: TensorId,
        /// `[F, H]`.
        wd: TensorId,
        /// `[B, F]`.
        gate: TensorId,
        /// `[B, F]`.
        up: TensorId,
        /// `[B, F]`: `silu(gate) * up`.
        act: TensorId,
    },
    /// The MoE block's output `[B, H]` (before the residual); the block's
    /// own tensors are declared with its calls ([`StepTensors::moe`]).
    Moe {
        /// `[B, H]`.
        out: TensorId,
    },
}

/// The tensors of the whole step.
#[derive(Clone, Debug)]
pub struct StepTensors {
    /// `x[l]`, `[B, H]`: layer `l`'s input; `x[L]` is the step's output.
    /// Between layers the stream is two scratch tensors in turn: `x[l]`
    /// is `x[l - 2]` for `2 < l < L`.
    pub x: Vec<TensorId>,
    /// Each layer's. Layer `l` from 2 on has layer `l - 2`'s
    /// intermediates (the scratch tensors) and weights of its own.
    pub layers: Vec<LayerTensors>,
    /// i32 `[B, 2, W]`.
    pub meta: TensorId,
    /// i32 `[1, B]`.
    pub lens: TensorId,
    /// i32 `[1, 1]`: the chunk size.
    pub plan: TensorId,
    /// `[max length, D]`.
    pub cs: TensorId,
    /// Each layer's MoE block's tensors, if it has one.
    pub moe: Vec<Option<MoeFfn>>,
}

fn region(tensor: TensorId, offset: Vec<Expr>, rows: impl Into<Expr>, cols: u32) -> Region {
    Region {
        tensor,
        offset,
        rows: rows.into(),
        cols: cols.into(),
    }
}

/// Calls `body` for blocks of `size` rows covering `rows` (the first row
/// as an expression, and the block's rows): the full blocks in one
/// parallel loop, so that the program does not grow with the batch, and a
/// last partial block after it.
fn each_block(
    w: &mut Program,
    rows: u32,
    size: u32,
    mut body: impl FnMut(&mut Program, Expr, u32),
) {
    let full = rows / size;
    match full {
        0 => {}
        1 => body(w, Expr::Const(0), size),
        _ => w.parallel(Axis::Dense(full), |w, i| body(w, i * size, size)),
    }
    if !rows.is_multiple_of(size) {
        body(w, Expr::Const((full * size) as i64), rows % size);
    }
}

/// [`each_block`] in blocks of [`TILE`] rows.
fn row_blocks(w: &mut Program, rows: u32, body: impl FnMut(&mut Program, Expr, u32)) {
    each_block(w, rows, TILE, body);
}

/// `c (+)= a b` in tiles of at most [`TILE`] rows by [`TILE`] columns: `a`
/// is `[rows, k]`, `b` `[k, n]`, `c` `[rows, n]`. Each tile of `c` takes
/// its `k / TILE` products in order of `k`, which the runtime keeps from
/// the regions: with `fresh`, the first is `matmul` (`C = A B`, `c`'s
/// contents are not read: it may be a scratch tensor) and the rest
/// `gemm_tile` (`C += A B`); without, all accumulate onto `c`.
pub fn gemm(w: &mut Program, [a, b, c]: [TensorId; 3], rows: u32, k: u32, n: u32, fresh: bool) {
    let call = |w: &mut Program, kernel: u32, r: Expr, m: u32, j: Expr, kk: Expr| {
        w.call(
            kernel,
            &[
                a.tile(r.clone(), kk.clone() * TILE, m, TILE),
                b.tile(kk * TILE, j.clone() * TILE, TILE, TILE),
                c.tile(r, j * TILE, m, TILE),
            ],
            &[],
        );
    };
    row_blocks(w, rows, |w, r, m| {
        w.parallel(Axis::Dense(n / TILE), |w, j| {
            let first = u32::from(fresh);
            if fresh {
                call(w, MATMUL, r.clone(), m, j.clone(), Expr::Const(0));
            }
            if k / TILE > first {
                w.parallel(Axis::Dense(k / TILE - first), |w, kk| {
                    call(w, GEMM, r.clone(), m, j.clone(), kk + first);
                });
            }
        });
    });
}

/// `y = copy(x)` in the tiles of [`gemm`]: each tile of `y` is ready as
/// soon as its accumulation can start.
fn copy_tiles(w: &mut Program, x: TensorId, y: TensorId, rows: u32, cols: u32) {
    row_blocks(w, rows, |w, r, m| {
        w.parallel(Axis::Dense(cols / TILE), |w, j| {
            w.call(
                COPY,
                &[
                    x.tile(r.clone(), j.clone() * TILE, m, TILE),
                    y.tile(r.clone(), j * TILE, m, TILE),
                ],
                &[],
            );
        });
    });
}

/// `y = rmsnorm(x) * g` in blocks of [`NORM_ROWS`] rows.
fn rmsnorm(w: &mut Program, x: TensorId, g: TensorId, y: TensorId, rows: u32, cols: u32) {
    let eps = Expr::Const(EPS.to_bits() as i64);
    each_block(w, rows, NORM_ROWS, |w, r0, n| {
        w.call(
            RMSNORM,
            &[
                x.tile(r0.clone(), 0, n, cols),
                g.tile(0, 0, 1, cols),
                y.tile(r0, 0, n, cols),
            ],
            std::slice::from_ref(&eps),
        );
    });
}

/// Declares layer `l`'s tensors: its weights, and its intermediates
/// unless `reuse` gives them (another layer's, whose scopes have ended).
fn layer_tensors(
    w: &mut Program,
    data: &LayerData,
    prefix: &str,
    l: u32,
    reuse: Option<&LayerTensors>,
) -> Result<LayerTensors, LowerError> {
    let s = &data.shape;
    let (b, h, f, d) = (s.batch(), s.hidden(), s.ffn, s.d);
    let g = s.q_heads / s.kv_heads;
    // The data's check bounds B, H, QKV, F, D and the pool; the parts'
    // rows are products it leaves unbounded (W is the meta buffer's).
    let groups = product("parts: requests x KV heads", &[b, s.kv_heads])?;
    let rows = product("parts: most chunks x group", &[data.max_chunks(), g])?;
    let mut t = |name: &str, shape: &[u32]| w.tensor(&format!("{prefix}l{l}.{name}"), shape);
    let weights = (
        t("g1", &[1, h])?,
        t("wqkv", &[h, s.qkv()])?,
        t("wo", &[h, h])?,
        t("g2", &[1, h])?,
        t("kv", &[s.kv_heads, data.pool_rows(), d])?,
        t("parts", &[groups, rows, d + 2])?,
    );
    // The layer's intermediates live on the heap ring (scratch tensors):
    // the arena keeps weights, the cache, inputs and outputs.
    let dense = match s.mlp {
        Mlp::Dense => Some((t("wg", &[h, f])?, t("wu", &[h, f])?, t("wd", &[f, h])?)),
        Mlp::Moe(_) => None,
    };
    if let Some(r) = reuse {
        let mlp = match (dense, r.mlp) {
            (Some((wg, wu, wd)), MlpTensors::Dense { gate, up, act, .. }) => MlpTensors::Dense {
                wg,
                wu,
                wd,
                gate,
                up,
                act,
            },
            // The MoE block declares its weights with its calls. (A step's
            // layers all have the block of `s.mlp`.)
            (_, mlp) => mlp,
        };
        return Ok(LayerTensors {
            g1: weights.0,
            wqkv: weights.1,
            wo: weights.2,
            g2: weights.3,
            kv: weights.4,
            parts: weights.5,
            mlp,
            ..*r
        });
    }
    let mut t = |name: &str, shape: &[u32]| w.scratch(&format!("{prefix}l{l}.{name}"), shape);
    Ok(LayerTensors {
        g1: weights.0,
        wqkv: weights.1,
        wo: weights.2,
        g2: weights.3,
        kv: weights.4,
        parts: weights.5,
        xn: t("xn", &[b, h])?,
        qkv: t("qkv", &[b, s.qkv()])?,
        q: t("q", &[b, s.q_heads, d])?,
        state: t("state", &[b, s.q_heads, d + 2])?,
        o: t("o", &[b, h])?,
        h: t("h", &[b, h])?,
        hn: t("hn", &[b, h])?,
        mlp: match dense {
            Some((wg, wu, wd)) => MlpTensors::Dense {
                wg,
                wu,
                wd,
                gate: t("gate", &[b, f])?,
                up: t("up", &[b, f])?,
                act: t("act", &[b, f])?,
            },
            None => MlpTensors::Moe {
                out: t("moe", &[b, h])?,
            },
        },
    })
}

/// Layer `l`'s calls: from `x` (its input) to `out`; the MoE block's
/// tensors (named `name`), if the layer has one.
fn layer_calls(
    w: &mut Program,
    name: &str,
    data: &LayerData,
    st: &StepTensors,
    t: &LayerTensors,
    [x, out]: [TensorId; 2],
    c: &Expr,
) -> Result<Option<MoeFfn>, WorkloadError> {
    let s = &data.shape;
    let (b, h, f, d, page) = (s.batch(), s.hidden(), s.ffn, s.d, s.page);
    let (qh, kvh) = (s.q_heads, s.kv_heads);
    rmsnorm(w, x, t.g1, t.xn, b, h);
    gemm(w, [t.xn, t.wqkv, t.qkv], b, h, s.qkv(), true);
    // Rotary embedding and the append of each request's new K and V.
    let zero = || Expr::Const(0);
    w.parallel(Axis::Dense(b), |w, r| {
        let pos = || Expr::load(st.lens, vec![zero(), r.clone()]) - 1;
        let cs = || st.cs.tile(pos(), 0, 1, d);
        w.call(
            ROPE,
            &[
                t.qkv.tile(r.clone(), 0, 1, qh * d),
                cs(),
                region(t.q, vec![r.clone(), zero(), zero()], qh, d),
            ],
            &[],
        );
        // The pool row of the new token: page meta[r][pos / P], row pos % P.
        let row = || {
            Expr::load(st.meta, vec![r.clone(), zero(), pos() / page]) * (2 * page) + pos() % page
        };
        w.parallel(Axis::Dense(kvh), |w, kh| {
            w.call(
                ROPE,
                &[
                    t.qkv.tile(r.clone(), (kh.clone() + qh) * d, 1, d),
                    cs(),
                    region(t.kv, vec![kh.clone(), row(), zero()], 1, d),
                ],
                &[],
            );
            w.call(
                COPY,
                &[
                    t.qkv.tile(r.clone(), (kh.clone() + qh + kvh) * d, 1, d),
                    region(t.kv, vec![kh, row() + page, zero()], 1, d),
                ],
                &[],
            );
        });
    });
    let attn = AttnTensors {
        q: t.q,
        kv: t.kv,
        meta: st.meta,
        out: t.state,
        parts: t.parts,
        lens: st.lens,
    };
    attention_calls(w, &attn, &data.attn_dims(), c);
    w.parallel(Axis::Dense(b), |w, r| {
        w.call(
            COPY,
            &[
                region(t.state, vec![r.clone(), zero(), zero()], qh, d),
                t.o.tile(r, 0, 1, h),
            ],
            &[],
        );
    });
    copy_tiles(w, x, t.h, b, h);
    gemm(w, [t.o, t.wo, t.h], b, h, h, false);
    rmsnorm(w, t.h, t.g2, t.hn, b, h);
    match t.mlp {
        MlpTensors::Dense {
            wg,
            wu,
            wd,
            gate,
            up,
            act,
        } => {
            gemm(w, [t.hn, wg, gate], b, h, f, true);
            gemm(w, [t.hn, wu, up], b, h, f, true);
            row_blocks(w, b, |w, r, m| {
                w.parallel(Axis::Dense(f / TILE), |w, j| {
                    let tile = |t: TensorId| t.tile(r.clone(), j.clone() * TILE, m, TILE);
                    w.call(SILU_MUL, &[tile(gate), tile(up), tile(act)], &[]);
                });
            });
            copy_tiles(w, t.h, out, b, h);
            gemm(w, [act, wd, out], b, f, h, false);
            Ok(None)
        }
        MlpTensors::Moe { out: moe_out } => {
            let cfg = s.moe().expect("an MoE layer");
            let ffn = moe_ffn(w, name, t.hn, moe_out, &cfg)?;
            // The residual: out = h + moe, in the GEMM tiles.
            row_blocks(w, b, |w, r, m| {
                w.parallel(Axis::Dense(h / TILE), |w, j| {
                    let tile = |t: TensorId| t.tile(r.clone(), j.clone() * TILE, m, TILE);
                    w.call(ADD, &[tile(t.h), tile(moe_out), tile(out)], &[]);
                });
            });
            Ok(Some(ffn))
        }
    }
}

/// Declares the step's tensors in `w`, each name prefixed by `prefix`,
/// and adds its calls: one batch of a program that may hold several.
/// Data [`LayerData::check`] refuses is refused, before anything is
/// declared.
pub fn step_into(
    w: &mut Program,
    data: &LayerData,
    prefix: &str,
) -> Result<StepTensors, WorkloadError> {
    data.check()?;
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let s = &data.shape;
    let (b, h) = (s.batch(), s.hidden());
    let name = |n: &str| format!("{prefix}{n}");
    let mut x = vec![w.tensor(&name("x0"), &[b, h]).map_err(lower)?];
    let meta = w
        .tensor_i32(&name("meta"), &[b, 2, data.width])
        .map_err(lower)?;
    let lens = w.tensor_i32(&name("lens"), &[1, b]).map_err(lower)?;
    let plan = w.tensor_i32(&name("plan"), &[1, 1]).map_err(lower)?;
    let longest = *s.lengths.iter().max().expect("checked: not empty");
    let cs = w.tensor(&name("cs"), &[longest, s.d]).map_err(lower)?;
    w.input(lens);
    w.input(meta);
    // Layers 0 and 1 declare their intermediates (scratch tensors); layer
    // `l` from 2 on reuses layer `l - 2`'s, whose scopes ended (`FREE`) at
    // that layer's end, so a later write takes new storage. So a step
    // declares two layers' scratch tensors however deep it is (a table
    // holds at most MAX_SCRATCH), and layer `l + 1` never shares a tensor
    // with layer `l`, whose last tasks it may overlap: the TensorMap
    // orders accesses by tensor, and a shared one would make the next
    // layer's first writes wait for this layer's last reads.
    let mut layers: Vec<LayerTensors> = Vec::new();
    for l in 0..s.layers {
        let reuse = (l as usize).checked_sub(2).map(|i| layers[i]);
        layers.push(layer_tensors(w, data, prefix, l, reuse.as_ref()).map_err(lower)?);
        // Between layers the stream is scratch, in two tensors taken in
        // turn as the intermediates are (`x[l + 1]` is `x[l - 1]`, freed
        // at the end of layer `l - 1`); the last layer's output is the
        // step's and stays in the arena.
        let xl = name(&format!("x{}", l + 1));
        let next = if l + 1 == s.layers {
            w.tensor(&xl, &[b, h]).map_err(lower)?
        } else if l >= 2 {
            x[l as usize - 1]
        } else {
            w.scratch(&xl, &[b, h]).map_err(lower)?
        };
        x.push(next);
    }
    let mut st = StepTensors {
        x,
        layers,
        meta,
        lens,
        plan,
        cs,
        moe: Vec::new(),
    };
    let dims = data.attn_dims();
    plan_call(w, &dims, lens, plan, PLAN_CORES);
    // Read where used rather than held in a register for the whole
    // program: stitched steps would hold one each.
    let c = Expr::load(plan, vec![Expr::Const(0), Expr::Const(0)]);
    for (l, t) in st.layers.iter().enumerate() {
        // Table names keep 16 bytes: the MoE block's are short.
        let moe = name(&format!("m{l}"));
        let ffn = layer_calls(w, &moe, data, &st, t, [st.x[l], st.x[l + 1]], &c)?;
        st.moe.push(ffn);
        // The layer's intermediates (and its input, if scratch) are dead:
        // free them in the order they were first written.
        if l > 0 {
            w.free(st.x[l]);
        }
        for tensor in [t.xn, t.qkv, t.q, t.state, t.o, t.h, t.hn] {
            w.free(tensor);
        }
        match t.mlp {
            MlpTensors::Dense { gate, up, act, .. } => {
                [gate, up, act].into_iter().for_each(|t| w.free(t))
            }
            MlpTensors::Moe { out } => w.free(out),
        }
    }
    Ok(st)
}

/// The program of the whole step over `data`'s sizes.
pub fn step_program(data: &LayerData) -> Result<(Program, StepTensors), WorkloadError> {
    let mut w = Program::new();
    let st = step_into(&mut w, data, "")?;
    Ok((w, st))
}

/// Tasks of the step, counted from the sizes and the host planner's chunk
/// (the rule `decode_plan` computes on the device). `data` is one
/// [`LayerData::build`] made: it is checked again ([`LayerData::check`]:
/// a shape edited past [`LayerShape::check`], or buffers that do not fit
/// it, are refused, naming the size or buffer, before the MoE count runs
/// the reference on them), and what the host planner or the MoE count
/// refuses is returned.
pub fn task_count(data: &LayerData) -> Result<usize, WorkloadError> {
    let s = &data.shape;
    data.check()?;
    // Checked: B <= 256, H <= 1024, QKV <= 3072, F <= 2^15, so every
    // count per layer is exact in usize; the layers (a u32) multiply in
    // u128 below.
    let (b, h, f) = (s.batch() as usize, s.hidden() as usize, s.ffn as usize);
    let t = TILE as usize;
    let (ht, ft, qt) = (h / t, f / t, s.qkv() as usize / t);
    // Row blocks of the GEMMs, copies and silu_mul.
    let rb = b.div_ceil(t);
    let norms = 2 * (b.div_ceil(NORM_ROWS as usize));
    let attn = {
        let a = s.attention();
        let planner = |e: String| WorkloadError::Params(format!("the host planner: {e}"));
        let cost = CostModel::of(a.group(), a.d).map_err(planner)?;
        let chunk =
            choose_chunk(&a.lengths, a.kv_heads, PLAN_CORES, a.page, cost).map_err(planner)?;
        let plan = Plan::with_chunk(&a, chunk);
        plan.items.len() + plan.merges()
    };
    let rope = b * (1 + 2 * s.kv_heads as usize);
    let attention_half = norms + rb * qt * ht + rope + attn + b + rb * (ht + ht * ht);
    // u128: fewer than 2^32 layers of fewer than 2^64 tasks each.
    let layers = s.layers as u128;
    let mlp: u128 = match s.moe() {
        None => layers * (rb * (2 * ft * ht + ft + ht + ht * ft)) as u128,
        // Each layer's expert tiles follow its routing (the f64 router's):
        // the block's own count, plus the residual's adds.
        Some(cfg) => reference::step(data)?
            .routes
            .iter()
            .map(|r| {
                let block = cfg.tasks(&pairs_per_expert(r, cfg.experts as usize)?)?;
                Ok((block + rb * ht) as u128)
            })
            .sum::<Result<u128, WorkloadError>>()?,
    };
    let tasks = 1 + layers * attention_half as u128 + mlp;
    usize::try_from(tasks)
        .map_err(|_| WorkloadError::Params(format!("the step's {tasks} tasks do not fit usize")))
}

/// What a step's check compares: the values the run wrote, the
/// reference's and their bounds.
type Compared = (Vec<f32>, Vec<f64>, Vec<f64>);

/// Writes the step's inputs into `arena` and returns its check against
/// [`reference::step`]: the output and every appended cache row (or the
/// reference's refusal).
fn fill_and_check(
    w: &Program,
    arena: &mut Arena,
    data: &LayerData,
    st: &StepTensors,
) -> impl Fn(&Arena) -> Result<Compared, WorkloadError> + 'static {
    let s = &data.shape;
    arena.write_f32(w.layout(st.x[0]), &data.x);
    arena.write_i32(w.layout(st.meta), &data.meta);
    let lens: Vec<i32> = s.lengths.iter().map(|&l| l as i32).collect();
    arena.write_i32(w.layout(st.lens), &lens);
    arena.write_f32(w.layout(st.cs), &data.cs);
    for (lw, t) in data.layers.iter().zip(&st.layers) {
        for (id, v) in [
            (t.g1, &lw.g1),
            (t.wqkv, &lw.wqkv),
            (t.wo, &lw.wo),
            (t.g2, &lw.g2),
            (t.kv, &lw.kv),
        ] {
            arena.write_f32(w.layout(id), v);
        }
        if let MlpTensors::Dense { wg, wu, wd, .. } = t.mlp {
            for (id, v) in [(wg, &lw.wg), (wu, &lw.wu), (wd, &lw.wd)] {
                arena.write_f32(w.layout(id), v);
            }
        }
    }
    for (ffn, lw) in st.moe.iter().zip(&data.layers) {
        if let (Some(ffn), Some(m)) = (ffn, &lw.moe) {
            for (id, v) in [
                (ffn.router, &m.router),
                (ffn.gate, &m.gate),
                (ffn.up, &m.up),
                (ffn.down, &m.down),
            ] {
                arena.write_f32(w.layout(id), v);
            }
            if let Some(shared) = ffn.shared {
                for (id, v) in shared.iter().zip(&m.shared) {
                    arena.write_f32(w.layout(*id), v);
                }
            }
        }
    }
    let out = w.layout(*st.x.last().expect("a layer")).clone();
    let kv: Vec<_> = st.layers.iter().map(|t| w.layout(t.kv).clone()).collect();
    let copy = data.clone();
    move |arena: &Arena| {
        let want = reference::step(&copy)?;
        let mut got = arena.read_f32(&out);
        let (mut value, mut bound) = (want.out.v.clone(), want.out.e.clone());
        let d = copy.shape.d as usize;
        for (l, layer) in want.appended.iter().enumerate() {
            let pool = arena.read_f32(&kv[l]);
            for a in layer {
                let at = a.row * d;
                got.extend_from_slice(&pool[at..at + d]);
                value.extend_from_slice(&a.value);
                bound.extend_from_slice(&a.bound);
            }
        }
        Ok((got, value, bound))
    }
}

/// Bytes of heap ring a step needs: one layer's scratch tensors, and the
/// layer's input and output between layers, in 64-byte blocks, and room
/// for the largest block once more (a block that would cross the ring's
/// end starts at its beginning). A layer's scratch tensors are freed at
/// its end, so the next layer's first writer waits for them to retire.
/// A shape [`LayerShape::check`] refuses is refused.
pub fn heap_bytes(data: &LayerData) -> Result<u64, WorkloadError> {
    let s = &data.shape;
    // Checked: B <= 256, H <= 1024, QKV <= 3072, D <= 128, F <= 2^15, so
    // each count below is below 2^24 and the sum far below 2^64.
    s.check()?;
    let (b, h, d, qh) = (
        s.batch() as u64,
        s.hidden() as u64,
        s.d as u64,
        s.q_heads as u64,
    );
    let mut floats = vec![
        b * h,
        b * s.qkv() as u64,
        b * qh * d,
        b * qh * (d + 2),
        b * h,
        b * h,
        b * h,
    ];
    match s.mlp {
        Mlp::Dense => floats.extend([b * s.ffn as u64; 3]),
        Mlp::Moe(_) => floats.push(b * h),
    }
    let block = |f: &u64| (4 * f).next_multiple_of(64);
    let blocks: u64 = floats.iter().map(block).sum();
    // A block that does not fit before the ring's end starts again at its
    // beginning, leaving the end unused: room for the largest block more.
    let largest = floats.iter().map(block).max().unwrap_or(0);
    let stream = if s.layers > 1 { 2 * block(&(b * h)) } else { 0 };
    Ok(blocks + stream + largest)
}

/// Most steps [`stitched_workload`] takes: their tensors are prefixed
/// `a.` to `z.`.
pub const MAX_STEPS: usize = 26;

/// Several independent steps in one program (tensors prefixed `a.`,
/// `b.`, ...), checked together: nothing orders one batch's tasks after
/// another's, so they interleave on the cores. One to [`MAX_STEPS`]
/// steps; each refused as [`step_into`] refuses it.
pub fn stitched_workload(
    name: &'static str,
    steps: &[LayerData],
    summary: String,
) -> Result<Workload, WorkloadError> {
    if !(1..=MAX_STEPS).contains(&steps.len()) {
        return Err(WorkloadError::Params(format!(
            "{} steps: a stitched workload takes 1 ..= {MAX_STEPS} (prefixes a. to z.)",
            steps.len()
        )));
    }
    let lower = |e: LowerError| WorkloadError::Params(e.to_string());
    let mut w = Program::new();
    // At most 26 steps, each ring below 2^32 bytes (its shape is checked):
    // the sum cannot overflow u64, and the ring's own check refuses one
    // past 4 GiB.
    let heap = steps
        .iter()
        .map(heap_bytes)
        .sum::<Result<u64, WorkloadError>>()?;
    w.heap(heap).map_err(lower)?;
    let mut sts = Vec::new();
    for (i, data) in steps.iter().enumerate() {
        let prefix = if steps.len() == 1 {
            String::new()
        } else {
            format!("{}.", (b'a' + i as u8) as char)
        };
        sts.push(step_into(&mut w, data, &prefix)?);
    }
    let table = w.finish().map_err(lower)?;
    let mut arena = Arena::zeroed(w.arena_size());
    let checks: Vec<_> = steps
        .iter()
        .zip(&sts)
        .map(|(data, st)| fill_and_check(&w, &mut arena, data, st))
        .collect();
    let check = move |arena: &Arena| {
        let (mut got, mut value, mut bound) = (Vec::new(), Vec::new(), Vec::new());
        for c in &checks {
            // The data was checked before the program was built; a
            // refusal still fails the check.
            let (g, v, b) = match c(arena) {
                Ok(r) => r,
                Err(e) => {
                    return crate::attention::sparse::failed(
                        format!("the f64 reference: {e}"),
                        reference::TOLERANCE,
                    )
                }
            };
            got.extend(g);
            value.extend(v);
            bound.extend(b);
        }
        Verification::compare(
            "out+cache",
            &got,
            &value,
            |i| bound[i],
            reference::TOLERANCE,
        )
    };
    // The planning tasks are in each step's count.
    let tasks = steps
        .iter()
        .map(task_count)
        .sum::<Result<usize, WorkloadError>>()?;
    Ok(Workload {
        name,
        summary,
        table,
        arena,
        tensors: w.layouts().to_vec(),
        tasks,
        check: Box::new(check),
        csp: Default::default(),
    })
}

/// The decode step over `data` as a workload, checked against
/// [`reference::step`]: the output and every appended cache row.
pub fn decode_layer_workload(
    name: &'static str,
    data: &LayerData,
) -> Result<Workload, WorkloadError> {
    stitched_workload(name, std::slice::from_ref(data), summary_of(data))
}

/// One line saying what the step computes.
pub fn summary_of(data: &LayerData) -> String {
    let s = &data.shape;
    let total: u64 = s.lengths.iter().map(|&l| l as u64).sum();
    let mlp = match s.mlp {
        Mlp::Dense => format!("dense MLP of {}", s.ffn),
        Mlp::Moe(c) => format!(
            "MoE of {} experts of {}, top {}{}, shared expert of {}",
            c.experts,
            c.ffn,
            c.top_k,
            if c.threshold > 0.0 {
                format!(" with p >= {}", c.threshold)
            } else {
                String::new()
            },
            c.shared_ffn
        ),
    };
    format!(
        "decode step: {} layers, {} requests ({total} KV tokens, longest {}), hidden {}, \
         {} query / {} KV heads of {}, pages of {}, {mlp}",
        s.layers,
        s.lengths.len(),
        s.lengths.iter().max().copied().unwrap_or(0),
        // Exact for any shape: the summary is made before any check.
        s.q_heads as u64 * s.d as u64,
        s.q_heads,
        s.kv_heads,
        s.d,
        s.page,
    )
}

/// The shape of the named decode-layer workloads from `p`: `m` requests
/// with the `decode` workload's lengths up to `n` (1, 2, 3, 63, 64, 65,
/// n-1, n, then spread; see [`crate::attention::workload::lengths_of`]),
/// hidden size `k` in heads of 64 (`k / 64` query heads, a quarter as
/// many KV heads, at least 1), ffn `2k`, pages of `tile`, 2 layers.
pub fn shape_of(p: &crate::workloads::Params, mlp: Mlp) -> Result<LayerShape, WorkloadError> {
    // Each message names only the size that is wrong (`stitched` passes
    // an n of its own).
    for (what, v, least) in [
        ("m (requests)", p.m, 1),
        ("n (longest KV length)", p.n, 1),
        ("k (hidden)", p.k, 64),
    ] {
        if v < least {
            return Err(WorkloadError::Params(format!(
                "{what} = {v} must be at least {least}"
            )));
        }
    }
    if !p.k.is_multiple_of(64) {
        return Err(WorkloadError::Params(format!(
            "k (hidden) = {} must be a multiple of 64 (heads of 64)",
            p.k
        )));
    }
    // Checked here too, before a length is listed for each request.
    if p.m > MAX_BATCH {
        return Err(WorkloadError::Params(format!(
            "m = {} requests: the layer takes 1 ..= {MAX_BATCH}",
            p.m
        )));
    }
    let q_heads = p.k / 64;
    Ok(LayerShape {
        lengths: crate::attention::workload::lengths_of("decode", p.m, p.n),
        q_heads,
        kv_heads: (q_heads / 4).max(1),
        d: 64,
        ffn: p.k.saturating_mul(2), // too large for `check` either way
        page: p.tile,
        layers: DEFAULT_LAYERS,
        mlp,
    })
}

/// Layers of the built-in decode-layer workloads unless `wsp run
/// --layers` gives another count ([`named`]).
pub const DEFAULT_LAYERS: u32 = 2;

/// Builds the named decode-layer workload from `p` (see [`shape_of`]),
/// of `layers` layers.
pub fn named(
    name: &'static str,
    p: crate::workloads::Params,
    mlp: Mlp,
    layers: u32,
) -> Result<Workload, WorkloadError> {
    let shape = LayerShape {
        layers,
        ..shape_of(&p, mlp)?
    };
    let data = LayerData::build(shape, p.seed)?;
    decode_layer_workload(name, &data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(hidden: u32, experts: u32, top_k: u32) -> MoeConfig {
        MoeConfig {
            hidden,
            experts,
            top_k,
            ..MOE
        }
    }

    #[test]
    fn plant_raises_each_tokens_top_k_logits_and_nothing_else() {
        // hn = [[1, 0, 0, 0], [0, 2, 0, 0]]: token 0's logits are the
        // router's row 0, [0.5, 0.1, 0.2] (top-1: expert 0); token 1's
        // twice row 1, [0.2, 0.6, 0.4] (top-1: expert 1). B = [[2, 0, 0],
        // [0, 2, 0]], hn hn^T = diag(1, 4), Y = [[2, 0, 0], [0, 0.5, 0]],
        // hn^T Y adds [2, 0, 0] to row 0 and 2 x [0, 0.5, 0] to row 1.
        let hn = [1.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0];
        let mut router = vec![
            0.5, 0.1, 0.2, //
            0.1, 0.3, 0.2, //
            1.0, 1.0, 1.0, //
            -1.0, 0.0, 1.0,
        ];
        plant(&mut router, &hn, &config(4, 3, 1));
        let want = [
            2.5, 0.1, 0.2, //
            0.1, 1.3, 0.2, //
            1.0, 1.0, 1.0, //
            -1.0, 0.0, 1.0,
        ];
        for (i, (got, want)) in router.iter().zip(want).enumerate() {
            assert!((got - want).abs() < 1e-6, "entry {i}: {got} vs {want}");
        }
    }

    #[test]
    fn plant_changes_nothing_without_an_exact_solution() {
        let router = vec![0.5f32; 2 * 3];
        // Three tokens in two dimensions: hn hn^T is singular.
        let hn = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut r = router.clone();
        plant(&mut r, &hn, &config(2, 3, 1));
        assert_eq!(r, router);
        // Two tokens along one direction: singular too.
        let hn = [1.0, 0.0, 2.0, 0.0];
        plant(&mut r, &hn, &config(2, 3, 1));
        assert_eq!(r, router);
        // Every expert chosen: nothing to set apart.
        let hn = [1.0, 0.0, 0.0, 1.0];
        plant(&mut r, &hn, &config(2, 3, 3));
        assert_eq!(r, router);
    }
}
