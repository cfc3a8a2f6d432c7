//! The decode step in f64, each value carrying a bound on how far the f32
//! run's value may be from it (a running error analysis: each step's bound
//! is what the step's f32 rounding adds plus how far the step moves the
//! errors already in its inputs).
//!
//! The bound is probabilistic, in the model of Higham and Mary
//! ("A new approach to probabilistic rounding error analysis", SISC 2019):
//! rounding errors are independent and of mean zero, so an n-term sum's
//! error is at most `gamma~_n = LAMBDA sqrt(n) u` times the sum of its
//! terms' magnitudes except with probability at most `2n exp(-LAMBDA^2 /
//! 2)` (about `3e-8 n` at `LAMBDA = 6`), and independent errors `e_k`
//! carried through fixed weights `w_k` add as `sqrt(sum (w_k e_k)^2)`.
//! The worst-case rules (`gamma_n = n u`, errors adding as `sum |w_k| e_k`)
//! hold always but compound through two layers of GEMMs and norms to
//! bounds near the values themselves, which no test could fail; these
//! stay within a few hundred times the errors runs show. Deterministic
//! errors (the kernels' `exp`, the attention kernels' own bound) keep
//! their worst-case terms.
//!
//! Rules, `u = 2^-24`, `|a|` a value's magnitude plus its bound:
//! - GEMM `c = acc + a W` (K terms, W exact): `e_c = sqrt(e_acc^2 +
//!   sum_k (e_a W)^2) + LAMBDA sqrt(K+1) u (|acc| + sum_k |a| |W|)`;
//! - RMSNorm `y = g x / rho`, `rho = sqrt(mean x^2 + eps)`: `rho` moves by
//!   `d_rho = sqrt(sum_i (x_i e_i)^2) / (n rho)`, so
//!   `e_y = |g| (e_x / rho + |x| d_rho / rho^2) + LAMBDA sqrt(n+5) u |y|`
//!   (the kernel: squares, an n-term sum, /n, +eps, sqrt, divide, scale);
//! - rope `y = a c - b s` with `c`, `s` the cache's f32 roundings of the
//!   exact cos and sin: `e_y = sqrt((e_a c)^2 + (e_b s)^2) + 5u (|a| |c| +
//!   |b| |s|)`;
//! - attention: a score moves by at most `Delta = scale max_t sqrt(sum_d
//!   (e_q k)^2 + (q e_k)^2)` (keys appended this step carry errors, the
//!   cache's others none), every weight by a factor within `e^(+-2
//!   Delta)`, so `e_o = (e^(2 Delta) - 1) sum_t p_t |v_t| + e^(2 Delta)
//!   sum_t p_t e_v_t`, plus the
//!   kernels' own worst-case error on their inputs
//!   ([`crate::attention::reference::relative_error`], chunked as finely
//!   as the device planner may);
//! - copies are exact; `silu_mul` (`silu(g) u`):
//!   `e = sqrt((1.1 e_g |u|)^2 + (silu(g) e_u)^2) + 11u |silu(g) u|`
//!   (`|silu'| <= 1.1`; the kernel's rounding and exp per its header).
//!
//! Bounds are first order in the rounding (terms of order `u^2` dropped).

use std::num::NonZeroU32;

use super::layer::{LayerData, LayerWeights, MoeWeights as LayerMoe, EPS, THETA};
use crate::attention::plan::min_chunk;
use crate::attention::reference::relative_error;
use crate::moe_layer::{MoeConfig, TokenRoute};
use crate::workloads::WorkloadError;

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// The probabilistic bounds' multiple of the standard deviation.
pub const LAMBDA: f64 = 6.0;

/// `gamma~_n = LAMBDA sqrt(n) u`.
fn gamma(n: f64) -> f64 {
    LAMBDA * n.sqrt() * U
}

/// What the bound allows, in words.
pub const TOLERANCE: &str =
    "a running probabilistic bound (lambda 6): each step's f32 rounding plus how it moves \
     its inputs' errors (model::reference)";

/// A row-major matrix of values and their bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Val {
    /// The f64 values.
    pub v: Vec<f64>,
    /// How far the f32 run's values may be from them.
    pub e: Vec<f64>,
    /// Columns.
    pub cols: usize,
}

impl Val {
    /// Exact values (inputs).
    pub fn exact(x: &[f32], cols: usize) -> Val {
        Val {
            v: x.iter().map(|&a| a as f64).collect(),
            e: vec![0.0; x.len()],
            cols,
        }
    }

    fn zeros(rows: usize, cols: usize) -> Val {
        Val {
            v: vec![0.0; rows * cols],
            e: vec![0.0; rows * cols],
            cols,
        }
    }

    fn rows(&self) -> usize {
        self.v.len() / self.cols
    }

    /// The most the computed value's magnitude can be.
    fn abs(&self, i: usize) -> f64 {
        self.v[i].abs() + self.e[i]
    }
}

/// `acc + a w`, `w` exact `[k, n]`. Private, on sizes the caller has
/// checked (the public steps check theirs at entry): `a.cols` = `k` >= 1
/// (it panics on 0), `a.v` and `a.e` whole rows of `k`, `w` at least
/// `k x n` values and `acc`, if any, `a`'s rows of `n` values and bounds;
/// shorter buffers panic.
fn gemm(a: &Val, w: &[f32], n: usize, acc: Option<&Val>) -> Val {
    let (m, k) = (a.rows(), a.cols);
    let mut c = acc.cloned().unwrap_or_else(|| Val::zeros(m, n));
    let g = gamma((k + 1) as f64);
    for i in 0..m {
        for j in 0..n {
            let at = i * n + j;
            let (mut sum, mut moved, mut size) = (c.v[at], c.e[at] * c.e[at], c.abs(at));
            for p in 0..k {
                let wv = w[p * n + j] as f64;
                sum += a.v[i * k + p] * wv;
                moved += (a.e[i * k + p] * wv).powi(2);
                size += a.abs(i * k + p) * wv.abs();
            }
            c.v[at] = sum;
            c.e[at] = moved.sqrt() + g * size;
        }
    }
    c
}

/// `rmsnorm(x) * g` per row. Private, on sizes the caller has checked:
/// `x.cols` >= 1 (it panics on 0), `x.v` and `x.e` whole rows of
/// `x.cols` and `g` at least `x.cols` values; shorter buffers panic.
fn rmsnorm(x: &Val, g: &[f32], eps: f64) -> Val {
    let n = x.cols;
    let mut y = Val::zeros(x.rows(), n);
    let round = gamma((n + 5) as f64);
    for r in 0..x.rows() {
        let row = r * n..(r + 1) * n;
        let mean = x.v[row.clone()].iter().map(|v| v * v).sum::<f64>() / n as f64;
        let rho = (mean + eps).sqrt();
        let d_rho = row
            .clone()
            .map(|i| (x.v[i] * x.e[i]).powi(2))
            .sum::<f64>()
            .sqrt()
            / (n as f64 * rho);
        for (c, i) in row.enumerate() {
            let gv = g[c] as f64;
            y.v[i] = gv * x.v[i] / rho;
            y.e[i] =
                gv.abs() * (x.e[i] / rho + x.abs(i) * d_rho / (rho * rho)) + round * y.v[i].abs();
        }
    }
    y
}

/// The exact cos and sin of position `pos`, frequency `i` of `d`.
fn angle(pos: u32, i: usize, d: usize) -> (f64, f64) {
    let a = pos as f64 * THETA.powf(-2.0 * i as f64 / d as f64);
    (a.cos(), a.sin())
}

/// Rotates the `d`-wide heads of `x` (`v`, `e`: one row of heads) to
/// position `pos`.
fn rope(v: &[f64], e: &[f64], d: usize, pos: u32) -> (Vec<f64>, Vec<f64>) {
    let half = d / 2;
    let (mut yv, mut ye) = (vec![0.0; v.len()], vec![0.0; v.len()]);
    for h in 0..v.len() / d {
        for i in 0..half {
            let (c, s) = angle(pos, i, d);
            let (a, b) = (h * d + i, h * d + half + i);
            let (aa, ba) = (v[a].abs() + e[a], v[b].abs() + e[b]);
            yv[a] = v[a] * c - v[b] * s;
            yv[b] = v[b] * c + v[a] * s;
            ye[a] = (e[a] * c).hypot(e[b] * s) + 5.0 * U * (aa * c.abs() + ba * s.abs());
            ye[b] = (e[b] * c).hypot(e[a] * s) + 5.0 * U * (ba * c.abs() + aa * s.abs());
        }
    }
    (yv, ye)
}

/// One cache row the step appended, and what it should hold.
#[derive(Clone, Debug)]
pub struct Appended {
    /// Its row in the layer's cache tensor, `[kv_heads * pool rows]`.
    pub row: usize,
    /// Its values.
    pub value: Vec<f64>,
    /// Their bounds.
    pub bound: Vec<f64>,
}

/// The step's output and cache rows.
#[derive(Clone, Debug)]
pub struct Step {
    /// `[B, H]`: the last layer's output.
    pub out: Val,
    /// Per layer, the rows the step appended (key then value, per request
    /// and KV head).
    pub appended: Vec<Vec<Appended>>,
    /// Per MoE layer, each token's routing (the f64 router's choices).
    pub routes: Vec<Vec<TokenRoute>>,
}

/// The whole step in f64 with bounds. Data [`LayerData::check`] refuses
/// (e.g. a buffer edited to another size than its shape's) is refused
/// with its error.
pub fn step(data: &LayerData) -> Result<Step, WorkloadError> {
    data.check()?;
    let mut x = Val::exact(&data.x, data.shape.hidden() as usize);
    let (mut appended, mut routes) = (Vec::new(), Vec::new());
    for lw in &data.layers {
        // Checked above: the tables, every layer's weights and x (each
        // layer's output is `[B, H]` again).
        let (out, rows, r) = layer_unchecked(data, lw, &x);
        x = out;
        appended.push(rows);
        routes.extend(r);
    }
    Ok(Step {
        out: x,
        appended,
        routes,
    })
}

/// Refuses what [`attention_half`] and [`layer`] cannot take, naming it:
/// `data`'s shape and tables ([`LayerData::check`]'s first part), `lw`
/// not of the shape's sizes (or not finite), and `x` not `[B, H]` values
/// with as many bounds.
fn check_layer_inputs(data: &LayerData, lw: &LayerWeights, x: &Val) -> Result<(), WorkloadError> {
    data.check_tables()?;
    data.check_weights("the layer", lw)?;
    let s = &data.shape;
    // Checked: B <= 256 and H <= 1024.
    let (b, h) = (s.batch() as usize, s.hidden() as usize);
    if x.cols != h || x.v.len() != b * h || x.e.len() != x.v.len() {
        return Err(WorkloadError::Params(format!(
            "x holds {} values and {} bounds in rows of {}; the shape takes {b} rows of {h}, {}",
            x.v.len(),
            x.e.len(),
            x.cols,
            b * h
        )));
    }
    Ok(())
}

/// The attention half of a layer from `x`: the residual stream after it,
/// its norm (the feed-forward block's input) and the cache rows appended.
/// `x` is `[B, H]`; `lw` one layer's weights of `data`'s shape (not read
/// from `data.layers`). Refused, naming the cause: a shape or tables
/// [`LayerData::check`] refuses, weights of other sizes than the
/// shape's (or not finite), and an `x` of another size.
pub fn attention_half(
    data: &LayerData,
    lw: &LayerWeights,
    x: &Val,
) -> Result<(Val, Val, Vec<Appended>), WorkloadError> {
    check_layer_inputs(data, lw, x)?;
    Ok(attention_half_unchecked(data, lw, x))
}

/// [`attention_half`] on inputs the caller has checked
/// ([`check_layer_inputs`] accepts them, as it does the parts of data
/// [`LayerData::check`] accepts): the loops index without checks.
pub(crate) fn attention_half_unchecked(
    data: &LayerData,
    lw: &LayerWeights,
    x: &Val,
) -> (Val, Val, Vec<Appended>) {
    let s = &data.shape;
    let (h, d) = (s.hidden() as usize, s.d as usize);
    let (qh, kvh) = (s.q_heads as usize, s.kv_heads as usize);
    let xn = rmsnorm(x, &lw.g1, EPS as f64);
    let qkv = gemm(&xn, &lw.wqkv, s.qkv() as usize, None);
    let w = qkv.cols;
    let pool = data.pool_rows() as usize;
    // The cache as the attention reads it: every request's new key and
    // value appended first (rows of a prefill chunk share pages, so a
    // token attends to the keys other rows of the step appended).
    let mut cache = Val::exact(&lw.kv, d);
    let mut appended = Vec::new();
    let mut queries = Vec::new();
    for (b, &len) in s.lengths.iter().enumerate() {
        let pos = len - 1;
        let row = &qkv.v[b * w..(b + 1) * w];
        let err = &qkv.e[b * w..(b + 1) * w];
        queries.push(rope(&row[..qh * d], &err[..qh * d], d, pos));
        let (k, ek) = rope(
            &row[qh * d..(qh + kvh) * d],
            &err[qh * d..(qh + kvh) * d],
            d,
            pos,
        );
        let (v, ev) = (&row[(qh + kvh) * d..], &err[(qh + kvh) * d..]);
        for kh in 0..kvh {
            let head = kh * d..(kh + 1) * d;
            for (value, bound, at_value) in [(&k[..], &ek[..], false), (v, ev, true)] {
                let at = kh * pool + data.row_in_pool(b, pos, at_value);
                cache.v[at * d..(at + 1) * d].copy_from_slice(&value[head.clone()]);
                cache.e[at * d..(at + 1) * d].copy_from_slice(&bound[head.clone()]);
                appended.push(Appended {
                    row: at,
                    value: value[head.clone()].to_vec(),
                    bound: bound[head.clone()].to_vec(),
                });
            }
        }
    }
    let mut o = Val::zeros(s.batch() as usize, h);
    for (b, (q, eq)) in queries.iter().enumerate() {
        for j in 0..qh {
            let kh = j / (qh / kvh);
            let (ov, oe) = attend(
                data,
                &cache,
                b,
                kh,
                (&q[j * d..(j + 1) * d], &eq[j * d..(j + 1) * d]),
            );
            o.v[b * h + j * d..b * h + (j + 1) * d].copy_from_slice(&ov);
            o.e[b * h + j * d..b * h + (j + 1) * d].copy_from_slice(&oe);
        }
    }
    let hres = gemm(&o, &lw.wo, h, Some(x));
    let hn = rmsnorm(&hres, &lw.g2, EPS as f64);
    (hres, hn, appended)
}

/// One layer's output, the cache rows it appended and, for an MoE layer,
/// its routing.
type LayerOut = (Val, Vec<Appended>, Option<Vec<TokenRoute>>);

/// One layer from `x`: its output, the cache rows it appended and, for an
/// MoE layer, its routing. Refused as [`attention_half`] refuses.
pub fn layer(data: &LayerData, lw: &LayerWeights, x: &Val) -> Result<LayerOut, WorkloadError> {
    check_layer_inputs(data, lw, x)?;
    Ok(layer_unchecked(data, lw, x))
}

/// [`layer`] on inputs the caller has checked (as
/// [`attention_half_unchecked`]'s).
pub(crate) fn layer_unchecked(data: &LayerData, lw: &LayerWeights, x: &Val) -> LayerOut {
    let s = &data.shape;
    let h = s.hidden() as usize;
    let (hres, hn, appended) = attention_half_unchecked(data, lw, x);
    let (out, routes) = match (s.moe(), &lw.moe) {
        (Some(cfg), Some(m)) => {
            let (y, routes) = moe(&hn, m, &cfg);
            (add(&hres, &y), Some(routes))
        }
        _ => {
            let f = s.ffn as usize;
            let gate = gemm(&hn, &lw.wg, f, None);
            let up = gemm(&hn, &lw.wu, f, None);
            let act = silu_mul(&gate, &up);
            (gemm(&act, &lw.wd, h, Some(&hres)), None)
        }
    };
    (out, appended, routes)
}

/// `a + b` elementwise (one rounding).
fn add(a: &Val, b: &Val) -> Val {
    let mut y = a.clone();
    for i in 0..y.v.len() {
        y.v[i] += b.v[i];
        y.e[i] = a.e[i].hypot(b.e[i]) + U * y.v[i].abs();
    }
    y
}

/// Row `r` of `x` as a one-row matrix.
fn row_of(x: &Val, r: usize) -> Val {
    let c = x.cols;
    Val {
        v: x.v[r * c..(r + 1) * c].to_vec(),
        e: x.e[r * c..(r + 1) * c].to_vec(),
        cols: c,
    }
}

/// A SwiGLU FFN of one row: `(silu(x g) * (x u)) d`.
fn ffn(x: &Val, g: &[f32], u: &[f32], d: &[f32], f: usize) -> Val {
    let act = silu_mul(&gemm(x, g, f, None), &gemm(x, u, f, None));
    gemm(&act, d, x.cols, None)
}

/// How far (as a multiple of its bound) every routing decision must be
/// from flipping for the check to trust the f64 router's choices.
pub const ROUTE_MARGIN: f64 = 10.0;

/// The MoE block on `x` with the f64 router's choices, which must agree
/// with the f32 router's: [`decisive`] tells whether the logits' bounds
/// allow it. A kept expert's weight `p_i / sum p` moves by a factor
/// within `e^(+-2 Delta)` (`Delta` the largest logit bound of the token),
/// plus the kernel's f32 softmax and renormalisation, `(2E + k + 24) u`
/// relative; the combine sums `k` (+1 shared) terms.
fn moe(x: &Val, m: &LayerMoe, cfg: &MoeConfig) -> (Val, Vec<TokenRoute>) {
    let (h, f, e, k) = (
        cfg.hidden as usize,
        cfg.ffn as usize,
        cfg.experts as usize,
        cfg.top_k as usize,
    );
    let logits = gemm(x, &m.router, e, None);
    let routes = route(&logits.v, e, k, cfg.threshold as f64);
    let mut out = Val::zeros(x.rows(), h);
    let eps_w = (2 * e + k + 24) as f64 * U;
    let terms = k + 1 + usize::from(cfg.shared_ffn > 0);
    for (t, r) in routes.iter().enumerate() {
        let xt = row_of(x, t);
        let delta = logits.e[t * e..(t + 1) * e]
            .iter()
            .copied()
            .fold(0.0, f64::max);
        let rel_w = (2.0 * delta).exp() - 1.0 + eps_w;
        let (mut moved, mut size) = (vec![0f64; h], vec![0f64; h]);
        for (&ex, &wt) in r.experts.iter().zip(&r.weights) {
            let y = ffn(
                &xt,
                &m.gate[ex * h * f..(ex + 1) * h * f],
                &m.up[ex * h * f..(ex + 1) * h * f],
                &m.down[ex * f * h..(ex + 1) * f * h],
                f,
            );
            for o in 0..h {
                out.v[t * h + o] += wt * y.v[o];
                moved[o] += (wt * y.e[o]).powi(2) + (rel_w * wt * y.v[o]).powi(2);
                size[o] += wt * y.abs(o);
            }
        }
        if cfg.shared_ffn > 0 {
            let [sg, su, sd] = &m.shared;
            let y = ffn(&xt, sg, su, sd, cfg.shared_ffn as usize);
            for o in 0..h {
                out.v[t * h + o] += y.v[o];
                moved[o] += y.e[o].powi(2);
                size[o] += y.abs(o);
            }
        }
        for o in 0..h {
            out.e[t * h + o] = moved[o].sqrt() + gamma(terms as f64) * size[o];
        }
    }
    (out, routes)
}

/// Whether every routing decision of `x`'s tokens is clear of flipping by
/// [`ROUTE_MARGIN`] times what the logits' bounds allow: the k-th and
/// (k+1)-th largest probabilities apart, and each kept one away from the
/// threshold, with probabilities moving by a factor within
/// `e^(+-2 Delta) (1 +- (2E + 24) u)`.
///
/// Refused, naming the sizes: a config [`MoeConfig::check`] refuses (a
/// top-k of 0 among them), `x` not `[tokens, hidden]` values with as
/// many bounds, and a `router` not `[hidden, experts]`.
pub fn decisive(x: &Val, router: &[f32], cfg: &MoeConfig) -> Result<bool, WorkloadError> {
    cfg.check()?;
    // Checked: tokens <= 4096, hidden <= 1024, experts <= 64.
    let (t, h, e) = (
        cfg.tokens as usize,
        cfg.hidden as usize,
        cfg.experts as usize,
    );
    if x.cols != h || x.v.len() != t * h || x.e.len() != x.v.len() {
        return Err(WorkloadError::Params(format!(
            "x holds {} values and {} bounds in rows of {}; the config takes {t} rows of {h}, {}",
            x.v.len(),
            x.e.len(),
            x.cols,
            t * h
        )));
    }
    if router.len() != h * e {
        return Err(WorkloadError::Params(format!(
            "the router holds {} values; the config takes {h} rows of {e}, {}",
            router.len(),
            h * e
        )));
    }
    Ok(decisive_unchecked(x, router, cfg))
}

/// [`decisive`] on sizes the caller has checked.
fn decisive_unchecked(x: &Val, router: &[f32], cfg: &MoeConfig) -> bool {
    let (e, k) = (cfg.experts as usize, cfg.top_k as usize);
    let logits = gemm(x, router, e, None);
    (0..x.rows()).all(|t| {
        let row = &logits.v[t * e..(t + 1) * e];
        let delta = logits.e[t * e..(t + 1) * e]
            .iter()
            .copied()
            .fold(0.0, f64::max);
        let rel = ROUTE_MARGIN * ((2.0 * delta).exp() - 1.0 + (2 * e + 24) as f64 * U);
        let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let mut p: Vec<f64> = row.iter().map(|&v| (v - m).exp()).collect();
        let sum: f64 = p.iter().sum();
        p.iter_mut().for_each(|v| *v /= sum);
        p.sort_by(|a, b| b.total_cmp(a));
        let apart = k >= e || p[k - 1] * (1.0 - rel) > p[k] * (1.0 + rel);
        let thr = cfg.threshold as f64;
        let away = thr == 0.0 || p[..k].iter().all(|&v| (v - thr).abs() > rel * v);
        apart && away
    })
}

/// The f64 router: per token, the top `k` experts of softmax(logits)
/// (lowest index on ties) kept while p >= `threshold`, weights
/// renormalised over the kept.
fn route(logits: &[f64], e: usize, k: usize, threshold: f64) -> Vec<TokenRoute> {
    logits
        .chunks(e)
        .map(|row| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = row.iter().map(|&v| (v - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            let mut order: Vec<usize> = (0..e).collect();
            order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
            let kept: Vec<usize> = order[..k]
                .iter()
                .copied()
                .take_while(|&i| p[i] / sum >= threshold)
                .collect();
            let ks: f64 = kept.iter().map(|&i| p[i]).sum();
            TokenRoute {
                weights: kept.iter().map(|&i| p[i] / ks).collect(),
                experts: kept,
            }
        })
        .collect()
}

/// `silu(g) * u` elementwise. Private, on sizes the caller has checked:
/// `g.cols` >= 1 (it panics on 0), `g.e` as long as `g.v`, and `u` at
/// least as many values and bounds; shorter buffers panic.
fn silu_mul(g: &Val, u: &Val) -> Val {
    let mut y = Val::zeros(g.rows(), g.cols);
    for i in 0..g.v.len() {
        let silu = g.v[i] / (1.0 + (-g.v[i]).exp());
        y.v[i] = silu * u.v[i];
        y.e[i] = (1.1 * g.e[i] * u.abs(i)).hypot(silu * u.e[i]) + 11.0 * U * y.v[i].abs();
    }
    y
}

/// Attention of query head `q` of request `b` over KV head `kh` of the
/// layer's `cache` (`[kv_heads * pool rows, D]`, this step's rows
/// appended, with their bounds).
fn attend(
    data: &LayerData,
    cache: &Val,
    b: usize,
    kh: usize,
    (q, eq): (&[f64], &[f64]),
) -> (Vec<f64>, Vec<f64>) {
    let s = &data.shape;
    let d = s.d as usize;
    let len = s.lengths[b];
    let scale = 1.0 / (d as f64).sqrt();
    let base = kh * data.pool_rows() as usize;
    let row = |t: u32, value: bool| {
        let at = (base + data.row_in_pool(b, t, value)) * d;
        (&cache.v[at..at + d], &cache.e[at..at + d])
    };
    let (mut scores, mut delta, mut dot_abs, mut score2_abs) = (Vec::new(), 0f64, 0f64, 0f64);
    for t in 0..len {
        let (k, ek) = row(t, false);
        let dot: f64 = q.iter().zip(k).map(|(a, b)| a * b).sum();
        let size: f64 = (0..d)
            .map(|i| (q[i].abs() + eq[i]) * (k[i].abs() + ek[i]))
            .sum();
        let moved: f64 = (0..d)
            .map(|i| (eq[i] * (k[i].abs() + ek[i])).powi(2) + (q[i] * ek[i]).powi(2))
            .sum::<f64>()
            .sqrt();
        delta = delta.max(scale * moved);
        dot_abs = dot_abs.max(size);
        score2_abs = score2_abs.max((scale * dot * std::f64::consts::LOG2_E).abs());
        scores.push(scale * dot);
    }
    let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let p: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
    let sum: f64 = p.iter().sum();
    let (mut o, mut weighted, mut carried) = (vec![0.0; d], vec![0.0; d], vec![0.0; d]);
    for (t, pt) in p.iter().enumerate() {
        let (v, ev) = row(t as u32, true);
        for e in 0..d {
            o[e] += pt / sum * v[e];
            weighted[e] += pt / sum * v[e].abs();
            carried[e] += pt / sum * ev[e];
        }
    }
    // The most chunks the device planner may cut this request into. (A
    // page of 0 tokens never gets here, the shape's check refuses it; `len`
    // would bound the chunks of any size.)
    let chunks = NonZeroU32::new(s.page).map_or(len, |p| len.div_ceil(min_chunk(p).get()));
    let own = relative_error(len, chunks, s.d, dot_abs, score2_abs);
    let grow = (2.0 * delta).exp();
    let err = (0..d)
        .map(|e| {
            (grow - 1.0) * weighted[e]
                + grow * carried[e]
                + own * (weighted[e] + carried[e])
                + len as f64 * f32::MIN_POSITIVE as f64
        })
        .collect();
    (o, err)
}
