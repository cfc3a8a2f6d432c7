//! An MoE FFN layer over token tiles (`moe-layer`, `moe-layer-var`), and
//! [`moe_ffn`], the builder that puts one into any program.
//!
//! The program, in the workload language (M the tile height, blocks of 64
//! columns for the GEMMs):
//!
//! ```text
//! logits = x @ router                        (gemm_tile per 64 tokens and hidden block)
//! ids, weights = moe_route(logits)           (per 64 tokens: top-k, k = 0 allowed)
//! tiles, rows, slot = moe_align(ids)         (pairs sorted by expert, padded to M)
//! parallel e in 0..E:
//!     parallel i in 0 .. tiles[e + 1] - tiles[e]:   -- read after the alignment ran
//!         r = (tiles[e] + i) * M
//!         xg[r..r+M] = gather_rows(rows[r..r+M], x)       (the expert's tokens)
//!         g = xg @ gate_e, u = xg @ up_e                   (gemm_tile per block)
//!         a = silu_mul(g, u)
//!         y[r..r+M] = a @ down_e                           (gemm_tile per block)
//! parallel tokens in tiles of 16:
//!     out = gather_rows(slot, weights, y)    (the weighted combine, in token order)
//! shared expert (optional): out += silu(x @ sg) * (x @ su) @ sd
//! ```
//!
//! Every sum over blocks (the logits, g, u, y, the shared expert's g and u)
//! starts with `matmul` (C = A B, C not read) and adds its other blocks
//! with `gemm_tile` (C += A B): no buffer of the layer needs zeroing, so a
//! launch on an arena an earlier launch left computes the same.
//!
//! Each expert issues `ceil(n_e / M)` tiles, n_e its (token, slot) pairs:
//! none for an expert no token chose, `ceil(T / M)` for one every token
//! chose. The padded rows, at most `pairs + E (M - 1)`, are zero on the way
//! in (gather writes a zero row for index -1) and ignored on the way out.
//!
//! Why a per-(token, slot) buffer `y` and a separate combine rather than
//! each expert tile accumulating into `out` (InOut): the expert tiles write
//! disjoint rows of `y`, so every tile of every expert runs in parallel;
//! accumulating into token rows would make every pair of tiles sharing a
//! token a write-after-write dependency (the TensorMap orders them), so a
//! token's k experts would run one after another, and the sum's order would
//! follow issue order across experts. The combine sums each token's slots
//! in slot order, so the result is the same on every schedule, and the
//! combine tiles write disjoint token rows, so they run in parallel too.
//!
//! Checked against [`reference()`], the layer in f64 with the routing
//! decisions of the f64 router ([`route`]; the data keeps every decision
//! [`MARGIN`] clear, so the f32 router must decide alike, and the device's
//! expert ids are compared exactly), within twice a first-order bound
//! derived op by op (u = 2^-24, gamma_n = n u / (1 - n u)):
//!
//! ```text
//! gate, up:   |dg| <= gamma_(H+1) sum_h |x w|          (and likewise |du|)
//! silu_mul:   |da| <= 1.1 (|u| + |du|) |dg| + |SiLU(g)| |du| + 11 u |SiLU(g) u|
//! down:       |dy| <= sum_j |da_j| |w_j| + gamma_(F+1) sum_j (|a_j| + |da_j|) |w_j|
//! combine:    |do| <= sum_s (w_s |dy_s| + (2E + k + 24) u |w_s y_s|)
//!                     + gamma_(k+1) sum_s (|w_s y_s| + w_s |dy_s|)
//! shared:     + its FFN's |dy| + gamma_(Fs+2) (the combine's and its sum |a w|)
//! ```
//!
//! (|SiLU'| <= 1.1; 11 u is silu_mul's bound with the exp's 8 ulp; the
//! routing weight's relative error covers the f32 softmax, its sum and the
//! renormalisation.) The factor 2 covers the second-order terms.

use std::num::NonZeroU32;

use wsp_ffi::{
    WspKernelId_WSP_KERNEL_GATHER_ROWS as GATHER, WspKernelId_WSP_KERNEL_GEMM_TILE as GEMM,
    WspKernelId_WSP_KERNEL_MATMUL as MATMUL, WspKernelId_WSP_KERNEL_MOE_ALIGN as ALIGN,
    WspKernelId_WSP_KERNEL_MOE_ROUTE as ROUTE, WspKernelId_WSP_KERNEL_SILU_MUL as SILU,
    WspKernelId_WSP_KERNEL_SOFTMAX as SOFTMAX,
};

use crate::attention::sparse::failed;
use crate::program::{Axis, Expr, LowerError, Workload as Program};
use crate::reference;
use crate::rng::SplitMix64;
use crate::table::{Arena, TensorId};
use crate::workloads::{Params, Verification, Workload, WorkloadError};

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// GEMM block edge (gemm_tile's largest tile).
const BLOCK: u32 = 64;
/// Tokens per router task (moe_route's largest tile).
const ROUTE_ROWS: u32 = 64;
/// Tokens per combine task.
const COMBINE_ROWS: u32 = 16;
/// Rows of one softmax task (the kernel's largest tile).
const SOFTMAX_ROWS: u32 = 16;

/// The largest expert FFN size ([`MoeConfig::ffn`], and the shared
/// expert's), 32,768 = 2^15, and the dense decode layer's
/// ([`crate::model::LayerShape::ffn`]). The kernels take the FFN in
/// blocks of 64 columns, so any multiple of 64 would do for them; the
/// limit makes the size budget explicit:
/// - with at most 64 experts and a hidden size of at most 1,024, an
///   expert stack's elements (`experts x hidden x ffn`) stay at most
///   2^6 x 2^10 x 2^15 = 2^31, and every `u32` size the builders derive
///   from the config (element counts, the `experts x ffn` rows of the
///   down projections, `hidden x ffn` of a dense layer) fits;
/// - it admits every size the 1 GiB tensor bound of the built-in
///   workloads ([`crate::budget::MAX_ARENA_BYTES`], which `wsp run`
///   applies) lets through: `moe-layer`'s 3 expert stacks of 64 experts
///   x (at least) 64 hidden x ffn f32 take 49,152 x ffn bytes, over
///   1 GiB past ffn 21,845, so that bound (and the 2^20 tasks of
///   [`crate::budget::MAX_TASKS`]) stays the binding one there;
/// - real models' expert FFNs are well below it (DeepSeek-V3's 2,048,
///   Mixtral's 14,336).
pub const MAX_FFN: u32 = 1 << 15;

/// Sizes of an MoE FFN.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeConfig {
    /// Tokens (rows of x and out), 1 ..= 4096.
    pub tokens: u32,
    /// Hidden size (cols of x and out): at most 64, or a multiple of 64 up
    /// to 1024.
    pub hidden: u32,
    /// Each expert's FFN size: at most 64, or a multiple of 64 up to
    /// [`MAX_FFN`].
    pub ffn: u32,
    /// Routed experts, 1 ..= 64.
    pub experts: u32,
    /// Experts per token at most, 1 ..= experts.
    pub top_k: u32,
    /// Of its top k, a token keeps the experts whose router probability is
    /// at least this (0: all k), in [0, 1); a token may keep none.
    pub threshold: f32,
    /// Rows of an expert tile (the padding unit), 1 ..= 64.
    pub tile: u32,
    /// The shared expert's FFN size (0: none); at most 64, or a multiple
    /// of 64 up to [`MAX_FFN`].
    pub shared_ffn: u32,
}

impl MoeConfig {
    /// Rows of the padded (token, slot) buffers: pairs + E (M - 1), the
    /// rows `tokens x top-k` pairs take with every expert's last tile
    /// padded. Refused, naming the sizes: a tile of 0 rows (no padding
    /// unit) and more rows than `u32` counts. ([`MoeConfig::check`] also
    /// refuses more than 65,536.)
    pub fn padded_rows(&self) -> Result<u32, WorkloadError> {
        let tile = self.tile_rows()?;
        let rows = self.tokens as u128 * self.top_k as u128
            + self.experts as u128 * (tile.get() - 1) as u128;
        u32::try_from(rows).map_err(|_| {
            WorkloadError::Params(format!(
                "tokens x top-k + experts x (tile - 1) = {rows} rows exceed u32::MAX"
            ))
        })
    }

    /// The tile's rows, refused when 0 as [`MoeConfig::check`] refuses them.
    fn tile_rows(&self) -> Result<NonZeroU32, WorkloadError> {
        NonZeroU32::new(self.tile)
            .ok_or_else(|| WorkloadError::Params(format!("tile = {} must be in 1..=64", self.tile)))
    }

    /// Refuses sizes the kernels cannot take, naming them.
    pub fn check(&self) -> Result<(), WorkloadError> {
        let bad = |what: String| Err(WorkloadError::Params(what));
        let blocks = |v: u32| v >= 1 && (v <= BLOCK || v.is_multiple_of(BLOCK));
        if !(1..=4096).contains(&self.tokens) {
            return bad(format!("tokens = {} must be in 1..=4096", self.tokens));
        }
        if !blocks(self.hidden) || self.hidden > 1024 {
            return bad(format!(
                "hidden = {} must be in 1..=64 or a multiple of 64 up to 1024",
                self.hidden
            ));
        }
        for (what, v) in [("ffn", self.ffn), ("shared ffn", self.shared_ffn)] {
            if !(blocks(v) && v <= MAX_FFN || what == "shared ffn" && v == 0) {
                return bad(format!(
                    "{what} = {v} must be in 1..=64 or a multiple of 64 up to {MAX_FFN}"
                ));
            }
        }
        if !(1..=64).contains(&self.experts) {
            return bad(format!("experts = {} must be in 1..=64", self.experts));
        }
        if !(1..=self.experts).contains(&self.top_k) {
            return bad(format!(
                "top-k = {} must be in 1..={} (the experts)",
                self.top_k, self.experts
            ));
        }
        if !(0.0..1.0).contains(&self.threshold) {
            return bad(format!("threshold = {} must be in [0, 1)", self.threshold));
        }
        if !(1..=64).contains(&self.tile) {
            return bad(format!("tile = {} must be in 1..=64", self.tile));
        }
        let rows = self.padded_rows()?;
        if rows > 1 << 16 {
            return bad(format!(
                "tokens x top-k + experts x (tile - 1) = {rows} rows exceed 65536"
            ));
        }
        Ok(())
    }

    /// Tasks the layer runs when expert `e` gets `pairs[e]` (token, slot)
    /// pairs: an independent count for the tests. Refused, naming the
    /// cause: a config [`MoeConfig::check`] refuses (a tile of 0 rows
    /// among them), counts for other than `experts` experts, and more
    /// pairs than the `tokens x top-k` any routing makes. (So the expert
    /// tiles are at most [`MoeConfig::most_tasks`]'s, and the count cannot
    /// overflow.)
    pub fn tasks(&self, pairs: &[usize]) -> Result<usize, WorkloadError> {
        self.check()?;
        let bad = |what: String| Err(WorkloadError::Params(what));
        if pairs.len() != self.experts as usize {
            return bad(format!(
                "pairs counted for {} experts, not the {} of the config",
                pairs.len(),
                self.experts
            ));
        }
        // u128: a sum of at most isize::MAX usizes cannot overflow it.
        let total: u128 = pairs.iter().map(|&n| n as u128).sum();
        let most = self.tokens as u128 * self.top_k as u128;
        if total > most {
            return bad(format!(
                "{total} (token, slot) pairs exceed tokens x top-k = {most}"
            ));
        }
        let m = self.tile_rows()?.get() as usize;
        Ok(self.tasks_of_tiles(pairs.iter().map(|n| n.div_ceil(m)).sum()))
    }

    /// The most tasks any routing makes: [`MoeConfig::tasks`] with every
    /// expert's last tile partly empty, `padded_rows / tile` expert tiles
    /// (`sum ceil(n_e / tile) <= sum (n_e + tile - 1) / tile`). A config
    /// [`MoeConfig::check`] refuses is refused.
    pub fn most_tasks(&self) -> Result<usize, WorkloadError> {
        self.check()?;
        let tiles = self.padded_rows()? / self.tile_rows()?;
        Ok(self.tasks_of_tiles(tiles as usize))
    }

    /// Tasks the layer runs with `expert_tiles` tiles over all experts.
    fn tasks_of_tiles(&self, expert_tiles: usize) -> usize {
        let nb = |v: u32| v.div_ceil(BLOCK) as usize;
        let (nh, nf, ns) = (nb(self.hidden), nb(self.ffn), nb(self.shared_ffn));
        let route_tiles = self.tokens.div_ceil(ROUTE_ROWS) as usize;
        let shared = if self.shared_ffn == 0 {
            0
        } else {
            route_tiles * (2 * ns * nh + ns + nh * ns)
        };
        // ones, router GEMMs and routes, alignment, experts, combine, shared.
        self.tile.div_ceil(SOFTMAX_ROWS) as usize
            + route_tiles * (nh + 1)
            + 1
            + expert_tiles * (1 + 2 * nf * nh + nf + nh * nf)
            + self.tokens.div_ceil(COMBINE_ROWS) as usize
            + shared
    }
}

/// The tensors [`moe_ffn`] declared. The host writes the weights before
/// launch; the rest are the layer's own buffers, which need no zeroing:
/// every sum starts with a product that overwrites its tile (`matmul`), so
/// a launch on an arena a launch left computes the same. (`{name}.zero`,
/// which softmax turns into ones, may hold any finite values.)
#[derive(Clone, Copy, Debug)]
pub struct MoeFfn {
    /// Router weights, f32 hidden x experts.
    pub router: TensorId,
    /// Gate projections, f32 (experts x hidden) x ffn: expert e in rows
    /// e * hidden ...
    pub gate: TensorId,
    /// Up projections, like `gate`.
    pub up: TensorId,
    /// Down projections, f32 (experts x ffn) x hidden: expert e in rows
    /// e * ffn ...
    pub down: TensorId,
    /// The shared expert's gate, up (hidden x shared ffn) and down
    /// (shared ffn x hidden), if it has one.
    pub shared: Option<[TensorId; 3]>,
    /// The router's output: per token its experts in pick order (i32
    /// tokens x top-k, -1 past those it kept) ...
    pub ids: TensorId,
    /// ... and their weights (f32 tokens x top-k, 0 past those).
    pub weights: TensorId,
    /// Each expert's first tile (i32 1 x (experts + 1)).
    pub tiles: TensorId,
}

/// Appends an MoE FFN to `w`: `out` = the routed experts' weighted sum (plus
/// the shared expert's output when `cfg.shared_ffn` > 0), for `x` the
/// normalised input. `x` and `out` are f32 tokens x hidden tensors of `w`;
/// `out` is written (overwritten), not accumulated. Tensors are named
/// `{name}.router`, `{name}.gate`, ...; the returned [`MoeFfn`] names those
/// the host fills.
pub fn moe_ffn(
    w: &mut Program,
    name: &str,
    x: TensorId,
    out: TensorId,
    cfg: &MoeConfig,
) -> Result<MoeFfn, WorkloadError> {
    cfg.check()?;
    let c = *cfg;
    // Checked: E <= 64, H <= 1024 and F <= MAX_FFN = 2^15, so E x H and
    // E x F (the experts' stacked rows) are at most 2^21.
    let (t, h, f, e, k, m) = (c.tokens, c.hidden, c.ffn, c.experts, c.top_k, c.tile);
    let p = c.padded_rows()?;
    let mut tensor = |n: &str, shape: &[u32]| w.tensor(&format!("{name}.{n}"), shape);
    let router = tensor("router", &[h, e]).map_err(lower)?;
    let gate = tensor("gate", &[e * h, f]).map_err(lower)?;
    let up = tensor("up", &[e * h, f]).map_err(lower)?;
    let down = tensor("down", &[e * f, h]).map_err(lower)?;
    let logits = tensor("logits", &[t, e]).map_err(lower)?;
    let weights = tensor("weights", &[t, k]).map_err(lower)?;
    let zero = tensor("zero", &[m, 1]).map_err(lower)?;
    let ones = tensor("ones", &[m, 1]).map_err(lower)?;
    let xg = tensor("xg", &[p, h]).map_err(lower)?;
    let g = tensor("g", &[p, f]).map_err(lower)?;
    let u = tensor("u", &[p, f]).map_err(lower)?;
    let act = tensor("act", &[p, f]).map_err(lower)?;
    let y = tensor("y", &[p, h]).map_err(lower)?;
    let shared = if c.shared_ffn > 0 {
        let s = c.shared_ffn;
        Some((
            [
                tensor("shared_gate", &[h, s]).map_err(lower)?,
                tensor("shared_up", &[h, s]).map_err(lower)?,
                tensor("shared_down", &[s, h]).map_err(lower)?,
            ],
            [
                tensor("shared_g", &[t, s]).map_err(lower)?,
                tensor("shared_u", &[t, s]).map_err(lower)?,
                tensor("shared_act", &[t, s]).map_err(lower)?,
            ],
        ))
    } else {
        None
    };
    let mut tensor_i32 = |n: &str, shape: &[u32]| w.tensor_i32(&format!("{name}.{n}"), shape);
    let ids = tensor_i32("ids", &[t, k]).map_err(lower)?;
    let tiles = tensor_i32("tiles", &[1, e + 1]).map_err(lower)?;
    let rows = tensor_i32("rows", &[p, 1]).map_err(lower)?;
    let slot = tensor_i32("slot", &[t, k]).map_err(lower)?;

    let (bh, bf) = (h.min(BLOCK), f.min(BLOCK));
    let (nh, nf) = (h / bh, f / bf);
    // Token tiles of `rows` (the last one shorter): the tile's row count.
    let tile_rows = |i: Expr, rows: u32| (Expr::from(t) - i * rows).min(rows);

    // Ones for the gather's weights: softmax over one column is exactly 1
    // (in blocks of the softmax kernel's 16 rows).
    for r0 in (0..m).step_by(SOFTMAX_ROWS as usize) {
        let rows = (m - r0).min(SOFTMAX_ROWS);
        w.call(
            SOFTMAX,
            &[zero.tile(r0, 0, rows, 1), ones.tile(r0, 0, rows, 1)],
            &[],
        );
    }
    // The shared expert's gate and up first: they need only x, and fill
    // the cores while the router and the alignment run.
    if let Some(([sg, su, _], [gs, us, acts])) = shared {
        let bs = c.shared_ffn.min(BLOCK);
        let ns = c.shared_ffn / bs;
        w.parallel(Axis::Dense(t.div_ceil(ROUTE_ROWS)), |w, ti| {
            let r0 = w.let_(ti.clone() * ROUTE_ROWS);
            let rows = w.let_(tile_rows(ti, ROUTE_ROWS));
            w.parallel(Axis::Dense(ns), |w, fb| {
                let col = w.let_(fb * bs);
                for (wt, dst) in [(sg, gs), (su, us)] {
                    accumulate(w, nh, |w, kernel, hb| {
                        let hc = hb * bh;
                        w.call(
                            kernel,
                            &[
                                x.tile(r0.clone(), hc.clone(), rows.clone(), bh),
                                wt.tile(hc, col.clone(), bh, bs),
                                dst.tile(r0.clone(), col.clone(), rows.clone(), bs),
                            ],
                            &[],
                        );
                    });
                }
                w.call(
                    SILU,
                    &[
                        gs.tile(r0.clone(), col.clone(), rows.clone(), bs),
                        us.tile(r0.clone(), col.clone(), rows.clone(), bs),
                        acts.tile(r0.clone(), col, rows.clone(), bs),
                    ],
                    &[],
                );
            });
        });
    }

    // Router: logits per 64 tokens, then top-k per 64 tokens.
    w.parallel(Axis::Dense(t.div_ceil(ROUTE_ROWS)), |w, ti| {
        let r0 = w.let_(ti.clone() * ROUTE_ROWS);
        let rows = w.let_(tile_rows(ti, ROUTE_ROWS));
        accumulate(w, nh, |w, kernel, hb| {
            let hc = hb * bh;
            w.call(
                kernel,
                &[
                    x.tile(r0.clone(), hc.clone(), rows.clone(), bh),
                    router.tile(hc, 0, bh, e),
                    logits.tile(r0.clone(), 0, rows.clone(), e),
                ],
                &[],
            );
        });
        w.call(
            ROUTE,
            &[
                logits.tile(r0.clone(), 0, rows.clone(), e),
                ids.tile(r0.clone(), 0, rows.clone(), k),
                weights.tile(r0, 0, rows, k),
            ],
            &[Expr::Const(c.threshold.to_bits() as i64)],
        );
    });
    w.call(
        ALIGN,
        &[
            ids.tile(0, 0, t, k),
            tiles.tile(0, 0, 1, e + 1),
            rows.tile(0, 0, p, 1),
            slot.tile(0, 0, t, k),
        ],
        &[Expr::from(m)],
    );

    // The experts: each issues the tiles its tokens fill.
    w.parallel(Axis::Dense(e), |w, ex| {
        let first = w.let_(Expr::load(tiles, vec![Expr::Const(0), ex.clone()]));
        let count = Expr::load(tiles, vec![Expr::Const(0), ex.clone() + 1]) - first.clone();
        let max = t.div_ceil(m);
        w.parallel(Axis::Count { count, max }, |w, i| {
            let r = w.let_((first + i) * m);
            w.call(
                GATHER,
                &[
                    rows.tile(r.clone(), 0, m, 1),
                    ones.tile(0, 0, m, 1),
                    x.tile(0, 0, t, h),
                    xg.tile(r.clone(), 0, m, h),
                ],
                &[],
            );
            w.parallel(Axis::Dense(nf), |w, fb| {
                let col = w.let_(fb * bf);
                for (wt, dst) in [(gate, g), (up, u)] {
                    accumulate(w, nh, |w, kernel, hb| {
                        let hc = hb * bh;
                        let wrow = ex.clone() * h + hc.clone();
                        w.call(
                            kernel,
                            &[
                                xg.tile(r.clone(), hc, m, bh),
                                wt.tile(wrow, col.clone(), bh, bf),
                                dst.tile(r.clone(), col.clone(), m, bf),
                            ],
                            &[],
                        );
                    });
                }
                w.call(
                    SILU,
                    &[
                        g.tile(r.clone(), col.clone(), m, bf),
                        u.tile(r.clone(), col.clone(), m, bf),
                        act.tile(r.clone(), col, m, bf),
                    ],
                    &[],
                );
            });
            w.parallel(Axis::Dense(nh), |w, hb| {
                let hc = w.let_(hb * bh);
                accumulate(w, nf, |w, kernel, fb| {
                    let fc = fb * bf;
                    w.call(
                        kernel,
                        &[
                            act.tile(r.clone(), fc.clone(), m, bf),
                            down.tile(ex.clone() * f + fc, hc.clone(), bf, bh),
                            y.tile(r.clone(), hc.clone(), m, bh),
                        ],
                        &[],
                    );
                });
            });
        });
    });

    // The weighted combine into token order.
    w.parallel(Axis::Dense(t.div_ceil(COMBINE_ROWS)), |w, ti| {
        let r0 = w.let_(ti.clone() * COMBINE_ROWS);
        let rows = w.let_(tile_rows(ti, COMBINE_ROWS));
        w.call(
            GATHER,
            &[
                slot.tile(r0.clone(), 0, rows.clone(), k),
                weights.tile(r0.clone(), 0, rows.clone(), k),
                y.tile(0, 0, p, h),
                out.tile(r0, 0, rows, h),
            ],
            &[],
        );
    });

    // The shared expert's down projection, accumulated onto the combine's.
    if let Some(([_, _, sd], [_, _, acts])) = shared {
        let bs = c.shared_ffn.min(BLOCK);
        let ns = c.shared_ffn / bs;
        w.parallel(Axis::Dense(t.div_ceil(ROUTE_ROWS)), |w, ti| {
            let r0 = w.let_(ti.clone() * ROUTE_ROWS);
            let rows = w.let_(tile_rows(ti, ROUTE_ROWS));
            w.parallel(Axis::Dense(nh), |w, hb| {
                let hc = w.let_(hb * bh);
                w.parallel(Axis::Dense(ns), |w, fb| {
                    let fc = fb * bs;
                    w.call(
                        GEMM,
                        &[
                            acts.tile(r0.clone(), fc.clone(), rows.clone(), bs),
                            sd.tile(fc, hc.clone(), bs, bh),
                            out.tile(r0.clone(), hc.clone(), rows.clone(), bh),
                        ],
                        &[],
                    );
                });
            });
        });
    }

    Ok(MoeFfn {
        router,
        gate,
        up,
        down,
        shared: shared.map(|(weights, _)| weights),
        ids,
        weights,
        tiles,
    })
}

/// One tile's sum of `blocks` products: `product(w, kernel, b)` adds the
/// call for block `b`. Block 0 is `matmul` (C = A B: the tile is written,
/// not read, so it needs no zeroing and a second launch on the same arena
/// computes the same), the others `gemm_tile` (C += A B), in order of `b`
/// (the runtime orders writes to one tile by submission).
fn accumulate(w: &mut Program, blocks: u32, product: impl Fn(&mut Program, u32, Expr)) {
    product(w, MATMUL, Expr::Const(0));
    if blocks > 1 {
        w.parallel(Axis::Dense(blocks - 1), |w, b| product(w, GEMM, b + 1));
    }
}

fn lower(e: LowerError) -> WorkloadError {
    WorkloadError::Params(e.to_string())
}

/// How far apart (in router probability) the data keeps every routing
/// decision (the order of a token's top k + 1 and each top-k probability
/// from the threshold), so that the f32 router and the f64 reference
/// decide alike: the logits are exact in f32 (see [`MoeData`]), so the
/// only difference is the f32 softmax's, a few ulp of p < 1e-6.
pub const MARGIN: f64 = 1e-5;

/// One token's routing: its kept experts in pick order and their weights.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenRoute {
    /// Kept experts, largest probability first (lowest index on ties).
    pub experts: Vec<usize>,
    /// Their weights, p / (sum of p over the kept), in f64.
    pub weights: Vec<f64>,
}

/// The f64 router with moe_route's semantics: p = softmax of the token's
/// logits (`experts` each); its top `k` by p (lowest index on ties), kept
/// while p >= `threshold`; weights renormalised over the kept. Refused: 0
/// experts, `k` above `experts`, and logits that are not whole rows.
pub fn route(
    logits: &[f32],
    experts: usize,
    k: usize,
    threshold: f64,
) -> Result<Vec<TokenRoute>, WorkloadError> {
    let bad = |what: String| Err(WorkloadError::Params(what));
    if experts == 0 {
        return bad("routing over 0 experts".into());
    }
    if k > experts {
        return bad(format!("top-k = {k} of {experts} experts"));
    }
    if !logits.len().is_multiple_of(experts) {
        return bad(format!(
            "{} logits are not whole rows of {experts} experts",
            logits.len()
        ));
    }
    // A NaN would make the softmax NaN and the top-k arbitrary.
    if let Some(i) = logits.iter().position(|v| !v.is_finite()) {
        return bad(format!(
            "token {}'s logit for expert {} is {} (logits must be finite)",
            i / experts,
            i % experts,
            logits[i]
        ));
    }
    Ok(logits
        .chunks(experts)
        .map(|row| {
            let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
            let p = reference::softmax_unchecked(&row, experts);
            let mut order: Vec<usize> = (0..experts).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let kept: Vec<usize> = order[..k]
                .iter()
                .copied()
                .take_while(|&e| p[e] >= threshold)
                .collect();
            let sum: f64 = kept.iter().map(|&e| p[e]).sum();
            TokenRoute {
                weights: kept.iter().map(|&e| p[e] / sum).collect(),
                experts: kept,
            }
        })
        .collect())
}

/// (token, slot) pairs per expert of a routing over `experts` experts; a
/// route naming an expert past those is refused, naming its token.
pub fn pairs_per_expert(
    routes: &[TokenRoute],
    experts: usize,
) -> Result<Vec<usize>, WorkloadError> {
    let mut n = vec![0; experts];
    for (t, r) in routes.iter().enumerate() {
        for &e in &r.experts {
            let Some(count) = n.get_mut(e) else {
                return Err(WorkloadError::Params(format!(
                    "token {t} is routed to expert {e} of {experts}"
                )));
            };
            *count += 1;
        }
    }
    Ok(n)
}

/// Whether every routing decision of a token with these probabilities is
/// clear by [`MARGIN`].
fn decisive(p: &[f64], k: usize, threshold: f64) -> bool {
    let mut sorted = p.to_vec();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let order = (0..k.min(p.len() - 1)).all(|i| sorted[i] - sorted[i + 1] > MARGIN);
    let away = threshold == 0.0 || sorted[..k].iter().all(|v| (v - threshold).abs() > MARGIN);
    order && away
}

/// The inputs of an MoE layer.
#[derive(Clone, Debug)]
pub struct MoeData {
    /// tokens x hidden.
    pub x: Vec<f32>,
    /// hidden x experts: the identity on the first `experts` hidden units,
    /// so logits = x[:, ..experts] exactly in f32 (sums of products with 1
    /// and 0), and routing depends only on the softmax.
    pub router: Vec<f32>,
    /// (experts x hidden) x ffn.
    pub gate: Vec<f32>,
    /// (experts x hidden) x ffn.
    pub up: Vec<f32>,
    /// (experts x ffn) x hidden.
    pub down: Vec<f32>,
    /// hidden x shared ffn, hidden x shared ffn, shared ffn x hidden.
    pub shared: [Vec<f32>; 3],
}

impl MoeData {
    /// Seeded data whose routing is clear by [`MARGIN`]: token t's logits
    /// are d_t x (a permutation of 0 .. E), the step d_t log-uniform in
    /// [0.002, 0.3) (small steps give flat probabilities, which a threshold
    /// may drop entirely: k = 0). `skew`: expert 0 is every token's first
    /// choice and expert E - 1 its last. Needs hidden >= experts.
    pub fn new(cfg: &MoeConfig, seed: u64, skew: bool) -> Result<MoeData, WorkloadError> {
        cfg.check()?;
        // Checked: T x H <= 2^22 and E x H x F <= 2^31 (MAX_FFN).
        let (t, h, f, e, s) = (
            cfg.tokens as usize,
            cfg.hidden as usize,
            cfg.ffn as usize,
            cfg.experts as usize,
            cfg.shared_ffn as usize,
        );
        if h < e {
            return Err(WorkloadError::Params(format!(
                "the layer's data needs hidden ({h}) >= experts ({e})"
            )));
        }
        let mut rng = SplitMix64::new(seed);
        let mut x = rng.fill(t * h);
        for row in x.chunks_mut(h) {
            let found = (0..1000).any(|_| {
                let step = 0.002 * 150f64.powf((rng.unit_f32() as f64 + 1.0) / 2.0);
                let mut rank: Vec<usize> = (0..e).collect();
                for i in (1..e).rev() {
                    rank.swap(i, rng.below(i as u64 + 1) as usize);
                }
                if skew && e > 1 {
                    let top = rank.iter().position(|&r| r == e - 1).unwrap();
                    rank.swap(0, top);
                    let bottom = rank.iter().position(|&r| r == 0).unwrap();
                    rank.swap(e - 1, bottom);
                }
                for (v, &r) in row.iter_mut().zip(&rank) {
                    *v = (step * r as f64) as f32;
                }
                let logits: Vec<f64> = row[..e].iter().map(|&v| v as f64).collect();
                let p = reference::softmax_unchecked(&logits, e);
                decisive(&p, cfg.top_k as usize, cfg.threshold as f64)
            });
            if !found {
                return Err(WorkloadError::Params(
                    "no draw gives routing clear of ties and the threshold".into(),
                ));
            }
        }
        let mut router = vec![0f32; h * e];
        for i in 0..e {
            router[i * e + i] = 1.0;
        }
        let scaled = |rng: &mut SplitMix64, n: usize, fan_in: usize| -> Vec<f32> {
            let scale = 1.0 / (fan_in as f32).sqrt();
            rng.fill(n).iter().map(|v| v * scale).collect()
        };
        Ok(MoeData {
            gate: scaled(&mut rng, e * h * f, h),
            up: scaled(&mut rng, e * h * f, h),
            down: scaled(&mut rng, e * f * h, f),
            shared: [
                scaled(&mut rng, h * s, h),
                scaled(&mut rng, h * s, h),
                scaled(&mut rng, s * h, s.max(1)),
            ],
            x,
            router,
        })
    }

    /// Checks the buffers' sizes against `cfg` (which must pass
    /// [`MoeConfig::check`]): `x` tokens x hidden, `router` hidden x
    /// experts, `gate` and `up` (experts x hidden) x ffn, `down` (experts
    /// x ffn) x hidden, the shared expert's hidden x shared ffn (twice)
    /// and shared ffn x hidden (empty without one), as [`MoeData::new`]
    /// makes them. The first buffer of another size is refused, naming
    /// it, its size and the size its shape takes.
    pub fn check(&self, cfg: &MoeConfig) -> Result<(), WorkloadError> {
        cfg.check()?;
        // Checked: each product is at most 64 x 1024 x 2^15 = 2^31.
        let (t, h, f, e, s) = (
            cfg.tokens as u64,
            cfg.hidden as u64,
            cfg.ffn as u64,
            cfg.experts as u64,
            cfg.shared_ffn as u64,
        );
        let [sg, su, sd] = &self.shared;
        for (what, values, rows, cols) in [
            ("x", &self.x, t, h),
            ("router", &self.router, h, e),
            ("gate", &self.gate, e * h, f),
            ("up", &self.up, e * h, f),
            ("down", &self.down, e * f, h),
            ("shared gate", sg, h, s),
            ("shared up", su, h, s),
            ("shared down", sd, s, h),
        ] {
            if values.len() as u64 != rows * cols {
                return Err(WorkloadError::Params(format!(
                    "MoE data: {what} holds {} values; its shape takes {rows} rows of {cols}, {}",
                    values.len(),
                    rows * cols
                )));
            }
        }
        Ok(())
    }
}

/// SiLU(z) = z / (1 + e^-z) in f64.
fn silu(z: f64) -> f64 {
    z / (1.0 + (-z).exp())
}

/// One SwiGLU FFN of a token row in f64, and a first-order bound on the
/// error of its f32 evaluation by the kernels: the gate and up GEMMs
/// (gamma_(H+1) sum |x w| each), silu_mul (11 u |SiLU(g) u|, the kernel's
/// bound with the exp's 8 ulp) with the GEMMs' errors carried through
/// (|SiLU'| <= 1.1), then the down GEMM (gamma_(F+1) sum |a w| plus the
/// carried errors times |w|). Returns the output, its bound and its
/// sum |a w| per element.
fn ffn_row(x: &[f32], gate: &[f32], up: &[f32], down: &[f32], h: usize, f: usize) -> [Vec<f64>; 3] {
    let gamma = |n: usize| (n + 1) as f64 * U / (1.0 - (n + 1) as f64 * U);
    let mut act = vec![0f64; f];
    let mut act_abs = vec![0f64; f];
    let mut act_err = vec![0f64; f];
    for j in 0..f {
        let (mut g, mut ga, mut u, mut ua) = (0f64, 0f64, 0f64, 0f64);
        for i in 0..h {
            let xi = x[i] as f64;
            g += xi * gate[i * f + j] as f64;
            ga += (xi * gate[i * f + j] as f64).abs();
            u += xi * up[i * f + j] as f64;
            ua += (xi * up[i * f + j] as f64).abs();
        }
        let (eg, eu) = (gamma(h) * ga, gamma(h) * ua);
        act[j] = silu(g) * u;
        act_abs[j] = act[j].abs();
        act_err[j] = 1.1 * (u.abs() + eu) * eg + silu(g).abs() * eu + 11.0 * U * act_abs[j];
    }
    let mut y = vec![0f64; h];
    let mut err = vec![0f64; h];
    let mut abs = vec![0f64; h];
    for o in 0..h {
        for j in 0..f {
            let wd = down[j * h + o] as f64;
            y[o] += act[j] * wd;
            abs[o] += ((act_abs[j] + act_err[j]) * wd).abs();
            err[o] += act_err[j] * wd.abs();
        }
        err[o] += gamma(f) * abs[o];
    }
    [y, err, abs]
}

/// The layer in f64 on `routes`: `out[t]` = the sum over t's kept experts
/// of weight x `FFN_e(x[t])` (+ the shared expert's `FFN(x[t])`), and a
/// per-element bound on the f32 evaluation's error: each FFN's
/// (`ffn_row`'s), the combine's (the weight's f32 error, at most
/// (2E + k + 24) u relative: softmax and renormalisation, plus
/// gamma_(k+1) of the sum), and the shared down projection accumulated on
/// top (gamma_(F_s + 2) of |combine| + sum |a w|). Both tokens x hidden.
///
/// Refused, naming the cause: a config [`MoeConfig::check`] refuses, data
/// [`MoeData::check`] refuses for it, routes for other than `tokens`
/// tokens, and a route with more than top-k experts, with experts and
/// weights of different counts or with an expert past `experts`.
pub fn reference(
    cfg: &MoeConfig,
    data: &MoeData,
    routes: &[TokenRoute],
) -> Result<(Vec<f64>, Vec<f64>), WorkloadError> {
    data.check(cfg)?;
    let bad = |why: String| Err(WorkloadError::Params(why));
    if routes.len() != cfg.tokens as usize {
        return bad(format!(
            "routes for {} tokens; the config has {}",
            routes.len(),
            cfg.tokens
        ));
    }
    for (t, r) in routes.iter().enumerate() {
        if r.experts.len() != r.weights.len() {
            return bad(format!(
                "token {t}'s route has {} experts and {} weights",
                r.experts.len(),
                r.weights.len()
            ));
        }
        if r.experts.len() > cfg.top_k as usize {
            return bad(format!(
                "token {t}'s route keeps {} experts, more than top-k = {}",
                r.experts.len(),
                cfg.top_k
            ));
        }
        if let Some(&ex) = r.experts.iter().find(|&&ex| ex >= cfg.experts as usize) {
            return bad(format!(
                "token {t} is routed to expert {ex} of {}",
                cfg.experts
            ));
        }
    }
    let (h, f, e, k, s) = (
        cfg.hidden as usize,
        cfg.ffn as usize,
        cfg.experts as usize,
        cfg.top_k as usize,
        cfg.shared_ffn as usize,
    );
    let gamma = |n: usize| (n + 1) as f64 * U / (1.0 - (n + 1) as f64 * U);
    let eps_w = (2 * e + k + 24) as f64 * U;
    let mut out = Vec::with_capacity(routes.len() * h);
    let mut bound = Vec::with_capacity(routes.len() * h);
    for (t, r) in routes.iter().enumerate() {
        let xt = &data.x[t * h..(t + 1) * h];
        let mut acc = vec![0f64; h];
        let mut abs = vec![0f64; h];
        let mut err = vec![0f64; h];
        for (&ex, &wt) in r.experts.iter().zip(&r.weights) {
            let [y, ey, _] = ffn_row(
                xt,
                &data.gate[ex * h * f..(ex + 1) * h * f],
                &data.up[ex * h * f..(ex + 1) * h * f],
                &data.down[ex * f * h..(ex + 1) * f * h],
                h,
                f,
            );
            for o in 0..h {
                acc[o] += wt * y[o];
                abs[o] += (wt * y[o]).abs() + wt * ey[o];
                err[o] += wt * ey[o] + eps_w * (wt * y[o]).abs();
            }
        }
        for o in 0..h {
            err[o] += gamma(k) * abs[o];
        }
        if s > 0 {
            let [sg, su, sd] = &data.shared;
            let [y, ey, ya] = ffn_row(xt, sg, su, sd, h, s);
            for o in 0..h {
                err[o] += ey[o] + gamma(s + 1) * (abs[o] + ya[o]);
                acc[o] += y[o];
            }
        }
        out.extend_from_slice(&acc);
        bound.extend_from_slice(&err);
    }
    Ok((out, bound))
}

/// What the layer's check allows, in words.
const TOLERANCE: &str = "|out - ref| <= 2 x the first-order f32 bound of gate/up GEMMs, \
                         silu_mul, down GEMM, combine and shared expert (see moe_layer::reference)";

/// The `moe-layer` workloads: 64 experts, top 8 (`moe-layer`: all 8;
/// `moe-layer-var`: those with router probability >= 0.02, so between 8
/// and 0), a shared expert of the routed experts' size. Params: m = tokens,
/// k = hidden, n = ffn (and shared ffn), tile = expert tile height.
pub fn named(name: &'static str, p: Params) -> Result<Workload, WorkloadError> {
    workload(name, &config(name, &p), p.seed, false)
}

/// The config of the `moe-layer` workload called `name` from `p` (see
/// [`named`]).
pub fn config(name: &str, p: &Params) -> MoeConfig {
    MoeConfig {
        tokens: p.m,
        hidden: p.k,
        ffn: p.n,
        experts: 64,
        top_k: 8,
        threshold: if name == "moe-layer-var" { 0.02 } else { 0.0 },
        tile: p.tile,
        shared_ffn: p.n,
    }
}

/// A workload of one MoE layer with `cfg`'s sizes on [`MoeData::new`]'s data.
pub fn workload(
    name: &'static str,
    cfg: &MoeConfig,
    seed: u64,
    skew: bool,
) -> Result<Workload, WorkloadError> {
    let data = MoeData::new(cfg, seed, skew)?;
    let (t, h, e, k) = (
        cfg.tokens as usize,
        cfg.hidden as usize,
        cfg.experts as usize,
        cfg.top_k as usize,
    );
    let mut w = Program::new();
    let x = w.tensor("x", &[cfg.tokens, cfg.hidden]).map_err(lower)?;
    let out = w.tensor("out", &[cfg.tokens, cfg.hidden]).map_err(lower)?;
    let layer = moe_ffn(&mut w, "moe", x, out, cfg)?;
    let table = w.finish().map_err(lower)?;

    let mut arena = Arena::zeroed(w.arena_size());
    arena.write_f32(w.layout(x), &data.x);
    arena.write_f32(w.layout(layer.router), &data.router);
    arena.write_f32(w.layout(layer.gate), &data.gate);
    arena.write_f32(w.layout(layer.up), &data.up);
    arena.write_f32(w.layout(layer.down), &data.down);
    if let Some(shared) = layer.shared {
        for (id, values) in shared.iter().zip(&data.shared) {
            arena.write_f32(w.layout(*id), values);
        }
    }
    // The routing the f64 reference plans, on the exact logits.
    let logits: Vec<f32> = data.x.chunks(h).flat_map(|row| row[..e].to_vec()).collect();
    let routes = route(&logits, e, k, cfg.threshold as f64)?;
    let tasks = cfg.tasks(&pairs_per_expert(&routes, e)?)?;

    let layouts = [out, layer.ids].map(|id| w.layout(id).clone());
    let threshold = cfg.threshold;
    let c = *cfg;
    let check = move |arena: &Arena| {
        let [l_out, l_ids] = &layouts;
        // 1. The routing decisions, against the f64 router's.
        let ids = arena.read_i32(l_ids);
        for (tok, r) in routes.iter().enumerate() {
            let want: Vec<i32> = (0..k)
                .map(|i| r.experts.get(i).map_or(-1, |&e| e as i32))
                .collect();
            if ids[tok * k..(tok + 1) * k] != want[..] {
                return Verification {
                    output: format!(
                        "routing of token {tok}: device {:?}, f64 reference {want:?}",
                        &ids[tok * k..(tok + 1) * k]
                    ),
                    elements: t * k,
                    max_abs_err: f64::INFINITY,
                    max_rel_err: f64::INFINITY,
                    worst_error_over_bound: f64::INFINITY,
                    tolerance: "each token's experts must equal the f64 router's",
                };
            }
        }
        // 2. The layer's output.
        let (want, bound) = match reference(&c, &data, &routes) {
            Ok(r) => r,
            Err(e) => return failed(format!("the f64 reference: {e}"), TOLERANCE),
        };
        Verification::compare(
            "out",
            &arena.read_f32(l_out),
            &want,
            |i| 2.0 * bound[i] + f32::MIN_POSITIVE as f64,
            TOLERANCE,
        )
    };
    Ok(Workload {
        name,
        summary: format!(
            "MoE layer over token tiles: {t} tokens x {h} hidden, {e} experts of ffn {}, \
             top-{k}{}, tiles of {} rows{}; routing and tile counts decided on the device",
            cfg.ffn,
            if threshold > 0.0 {
                format!(" (experts under p = {threshold} dropped)")
            } else {
                String::new()
            },
            cfg.tile,
            if cfg.shared_ffn > 0 {
                format!(", shared expert of ffn {}", cfg.shared_ffn)
            } else {
                String::new()
            }
        ),
        table,
        arena,
        tensors: w.layouts().to_vec(),
        tasks,
        check: Box::new(check),
        csp: Default::default(),
    })
}
