//! f64 reference implementations of the kernels' math, on row-major data.

use crate::workloads::WorkloadError;

/// `a` (m x k) times `b` (k x n), plus the per-element sum of |a_ik * b_kj|
/// that bounds the rounding error of an f32 evaluation. Refused, naming
/// the sizes: an `a` of other than `m x k` values, a `b` of other than
/// `k x n` (sizes whose product overflows included), and `m x n` outputs
/// that overflow usize.
pub fn gemm(
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> Result<(Vec<f64>, Vec<f64>), WorkloadError> {
    let bad = |what: String| Err(WorkloadError::Params(what));
    if m.checked_mul(k) != Some(a.len()) {
        return bad(format!("gemm: a holds {} values, not {m} x {k}", a.len()));
    }
    if k.checked_mul(n) != Some(b.len()) {
        return bad(format!("gemm: b holds {} values, not {k} x {n}", b.len()));
    }
    if m.checked_mul(n).is_none() {
        return bad(format!("gemm: {m} x {n} outputs overflow usize"));
    }
    Ok(gemm_unchecked(a, b, m, n, k))
}

/// [`gemm`] on sizes the caller has made: `a` holds at least `m x k`
/// values, `b` at least `k x n`, and `m x n` fits usize (it panics
/// otherwise).
pub(crate) fn gemm_unchecked(
    a: &[f32],
    b: &[f32],
    m: usize,
    n: usize,
    k: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut c = vec![0f64; m * n];
    let mut abs = vec![0f64; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = a[i * k + p] as f64;
            for j in 0..n {
                let y = b[p * n + j] as f64;
                c[i * n + j] += x * y;
                abs[i * n + j] += (x * y).abs();
            }
        }
    }
    (c, abs)
}

/// Element-wise `a + b` (up to the shorter length).
pub fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Refuses rows of 0 columns and an `x` that is not whole rows of `cols`,
/// naming `what` and the sizes.
fn check_rows(what: &str, x: &[f64], cols: usize) -> Result<(), WorkloadError> {
    if cols == 0 {
        return Err(WorkloadError::Params(format!("{what}: rows of 0 columns")));
    }
    if !x.len().is_multiple_of(cols) {
        return Err(WorkloadError::Params(format!(
            "{what}: x holds {} values, not whole rows of {cols}",
            x.len()
        )));
    }
    Ok(())
}

/// Row-wise `x / sqrt(mean(x^2) + eps) * g` over rows of `cols` elements.
/// Refused, naming the sizes: `cols` = 0, an `x` that is not whole rows
/// of `cols` and a `g` of other than `cols` values.
pub fn rmsnorm(x: &[f64], g: &[f64], cols: usize, eps: f64) -> Result<Vec<f64>, WorkloadError> {
    check_rows("rmsnorm", x, cols)?;
    if g.len() != cols {
        return Err(WorkloadError::Params(format!(
            "rmsnorm: g holds {} values, not {cols} (one per column)",
            g.len()
        )));
    }
    Ok(rmsnorm_unchecked(x, g, cols, eps))
}

/// [`rmsnorm`] on sizes the caller has made: `cols` >= 1 (it panics on
/// 0), `x` whole rows of `cols` and `g` `cols` values (a shorter `g` or
/// last row would cut rows short).
pub(crate) fn rmsnorm_unchecked(x: &[f64], g: &[f64], cols: usize, eps: f64) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(g).map(move |(v, w)| v * inv * w)
        })
        .collect()
}

/// Row-wise softmax over rows of `cols` elements. Refused, naming the
/// sizes: `cols` = 0 and an `x` that is not whole rows of `cols`.
pub fn softmax(x: &[f64], cols: usize) -> Result<Vec<f64>, WorkloadError> {
    check_rows("softmax", x, cols)?;
    Ok(softmax_unchecked(x, cols))
}

/// [`softmax`] on sizes the caller has made: `cols` >= 1 (it panics on
/// 0) and `x` whole rows of `cols` (a last row cut short would be
/// softmaxed on its own).
pub(crate) fn softmax_unchecked(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / sum)
        })
        .collect()
}

/// A routing of tokens to experts in CSR form, grouped by expert: expert
/// `e`'s entries are `indptr[e]..indptr[e + 1]` (so `indptr` has one more
/// element than there are experts and starts at 0), each a token index (in
/// increasing order within an expert) and its weight. The layout of the
/// route_topk kernel's output, without its zero padding.
#[derive(Clone, Debug, PartialEq)]
pub struct Routing {
    /// Where each expert's entries start in `tokens` and `weights`, then
    /// the total number of entries.
    pub indptr: Vec<usize>,
    /// The token index of each entry.
    pub tokens: Vec<usize>,
    /// The weight of each entry (a token's kept weights sum to 1).
    pub weights: Vec<f64>,
}

/// Refuses a top-k routing's `k` outside 1 ..= `experts` and a
/// `threshold` outside [0, 1) (NaN included), naming the value: what
/// [`route_topk`] and the workload files' f64 route_topk refuse.
pub(crate) fn check_topk(experts: usize, k: usize, threshold: f64) -> Result<(), String> {
    if !(1..=experts).contains(&k) {
        return Err(format!(
            "top-k = {k} must be in 1..={experts} (the experts)"
        ));
    }
    if !(0.0..1.0).contains(&threshold) {
        return Err(format!("threshold = {threshold} must be in [0, 1)"));
    }
    Ok(())
}

/// Top-k routing of `tokens` x `experts` row-major `logits`, in f64, with
/// the semantics of the route_topk kernel: per token, p = softmax of its row;
/// the k experts of largest p, the lower index first on ties; the first of
/// them always kept, the others dropped when p < `threshold`; each kept
/// expert weighted p / (sum of p over the kept experts, summed largest p
/// first). Refused, naming the value: `k` outside 1 ..= `experts`, a
/// `threshold` outside [0, 1) (NaN included), and `logits` that are not
/// tokens x experts values.
pub fn route_topk(
    logits: &[f32],
    tokens: usize,
    experts: usize,
    k: usize,
    threshold: f64,
) -> Result<Routing, WorkloadError> {
    let bad = |what: String| Err(WorkloadError::Params(what));
    check_topk(experts, k, threshold).map_err(WorkloadError::Params)?;
    if tokens.checked_mul(experts) != Some(logits.len()) {
        return bad(format!(
            "{} logits are not {tokens} tokens x {experts} experts",
            logits.len()
        ));
    }
    let mut by_expert: Vec<Vec<(usize, f64)>> = vec![Vec::new(); experts];
    for (t, row) in logits.chunks(experts).enumerate() {
        let row: Vec<f64> = row.iter().map(|&v| v as f64).collect();
        // Checked: the row holds `experts` >= 1 (k >= 1) values.
        let p = softmax_unchecked(&row, experts);
        let mut order: Vec<usize> = (0..experts).collect();
        // A stable sort keeps equal p in index order.
        order.sort_by(|&a, &b| p[b].total_cmp(&p[a]));
        let kept: Vec<usize> = order[..k]
            .iter()
            .enumerate()
            .filter(|&(i, &e)| i == 0 || p[e] >= threshold)
            .map(|(_, &e)| e)
            .collect();
        let sum: f64 = kept.iter().map(|&e| p[e]).sum();
        for &e in &kept {
            by_expert[e].push((t, p[e] / sum));
        }
    }
    let mut routing = Routing {
        indptr: vec![0],
        tokens: Vec::new(),
        weights: Vec::new(),
    };
    for list in by_expert {
        for (t, w) in list {
            routing.tokens.push(t);
            routing.weights.push(w);
        }
        routing.indptr.push(routing.tokens.len());
    }
    Ok(routing)
}

/// A Mixture-of-Experts layer: `out[t, :]` = the sum over the experts `e`
/// routing sends token `t` to of `weight * (x[t, :] @ w_e)`, with `x`
/// row-major `tokens` x `hidden` and `w` the experts' `hidden` x `ffn`
/// matrices stacked row-major as (experts * hidden) x `ffn` (expert `e` in
/// rows `e * hidden..`). Also returns the per-element sum over the same
/// terms of `|weight| * sum_h |x[t, h] * w_e[h, j]|`, which bounds the
/// rounding error of an f32 evaluation as `gemm`'s does. Both are
/// `tokens` x `ffn`, row-major; a token routed nowhere gets zeros.
///
/// Refused, naming the cause: an `x` of other than `tokens x hidden`
/// values, a `w` of other than `experts x hidden x ffn` (`experts` one
/// less than `routing.indptr` has entries; sizes whose product overflows
/// included), and a routing that is not CSR over those experts (an
/// `indptr` that does not start at 0, decreases or does not end at its
/// entries, `tokens` and `weights` of different lengths, a token index
/// past `tokens`).
pub fn moe(
    x: &[f32],
    w: &[f32],
    routing: &Routing,
    tokens: usize,
    hidden: usize,
    ffn: usize,
) -> Result<(Vec<f64>, Vec<f64>), WorkloadError> {
    let bad = |what: String| Err(WorkloadError::Params(what));
    let experts = routing.indptr.len().saturating_sub(1);
    if tokens.checked_mul(hidden) != Some(x.len()) {
        return bad(format!(
            "x holds {} values, not {tokens} tokens x {hidden} hidden",
            x.len()
        ));
    }
    let per_expert = hidden.checked_mul(ffn);
    if per_expert.and_then(|n| n.checked_mul(experts)) != Some(w.len()) {
        return bad(format!(
            "w holds {} values, not {experts} experts x {hidden} hidden x {ffn} ffn",
            w.len()
        ));
    }
    let entries = routing.tokens.len();
    if routing.indptr.first() != Some(&0)
        || routing.indptr.windows(2).any(|p| p[0] > p[1])
        || routing.indptr.last() != Some(&entries)
    {
        return bad(format!(
            "routing indptr {:?} does not run from 0 up to its {entries} entries",
            routing.indptr
        ));
    }
    if routing.weights.len() != entries {
        return bad(format!(
            "routing has {entries} tokens but {} weights",
            routing.weights.len()
        ));
    }
    if let Some(i) = routing.tokens.iter().position(|&t| t >= tokens) {
        return bad(format!(
            "routing entry {i} is token {}, past the {tokens} tokens",
            routing.tokens[i]
        ));
    }
    let Some(cells) = tokens.checked_mul(ffn) else {
        return bad(format!(
            "{tokens} tokens x {ffn} ffn outputs overflow usize"
        ));
    };
    // Checked above: w holds experts x size values, so every slice is in it.
    let size = per_expert.unwrap_or(0);
    let mut out = vec![0f64; cells];
    let mut abs = vec![0f64; cells];
    for e in 0..experts {
        let w_e = &w[e * size..(e + 1) * size];
        for i in routing.indptr[e]..routing.indptr[e + 1] {
            let (t, g) = (routing.tokens[i], routing.weights[i]);
            let (y, y_abs) = gemm_unchecked(&x[t * hidden..(t + 1) * hidden], w_e, 1, ffn, hidden);
            for j in 0..ffn {
                out[t * ffn + j] += g * y[j];
                abs[t * ffn + j] += g.abs() * y_abs[j];
            }
        }
    }
    Ok((out, abs))
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_cases_by_hand() {
        let (c, abs) = super::gemm(&[1.0, 2.0, 3.0, 4.0], &[1.0, -1.0, 0.5, 2.0], 2, 2, 2).unwrap();
        assert_eq!(c, vec![2.0, 3.0, 5.0, 5.0]);
        assert_eq!(abs, vec![2.0, 5.0, 5.0, 11.0]);
        let s = super::softmax(&[0.0, 0.0], 2).unwrap();
        assert_eq!(s, vec![0.5, 0.5]);
        let r = super::rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 2, 0.0).unwrap();
        let inv = 1.0 / 12.5f64.sqrt();
        assert_eq!(r, vec![3.0 * inv, 8.0 * inv]);
    }

    #[test]
    fn gemm_rmsnorm_and_softmax_refuse_sizes_that_do_not_fit() {
        let why = |e: crate::workloads::WorkloadError| e.to_string();
        // small_cases_by_hand's GEMM: a and b are 2 x 2, 4 values each.
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [1.0, -1.0, 0.5, 2.0]);
        // m = 3 would read a past its 4 values (3 x 2 = 6); k = 3 too.
        let e = why(super::gemm(&a, &b, 3, 2, 2).unwrap_err());
        assert!(e.contains("gemm: a holds 4 values, not 3 x 2"), "{e}");
        let e = why(super::gemm(&a[..2], &b, 2, 2, 2).unwrap_err());
        assert!(e.contains("gemm: a holds 2 values, not 2 x 2"), "{e}");
        let e = why(super::gemm(&a, &b[..3], 2, 2, 2).unwrap_err());
        assert!(e.contains("gemm: b holds 3 values, not 2 x 2"), "{e}");
        // 2 x usize::MAX overflows: refused as a size, not a wrapped one.
        let e = why(super::gemm(&a, &b, 2, usize::MAX, 2).unwrap_err());
        assert!(e.contains("gemm: b holds 4 values, not 2 x"), "{e}");
        // k = 0: a and b are empty and right, but 2^40 x 2^30 outputs
        // overflow a 64-bit usize.
        let e = why(super::gemm(&[], &[], 1 << 40, 1 << 30, 0).unwrap_err());
        assert!(
            e.contains("gemm: 1099511627776 x 1073741824 outputs overflow usize"),
            "{e}"
        );
        // k = 0 of sizes that fit: a zero m x n product.
        assert_eq!(
            super::gemm(&[], &[], 1, 2, 0).unwrap(),
            (vec![0.0; 2], vec![0.0; 2])
        );
        // Rows of 0 columns (a chunk size of 0), and 3 values in rows of 2.
        let e = why(super::softmax(&[0.0, 0.0], 0).unwrap_err());
        assert!(e.contains("softmax: rows of 0 columns"), "{e}");
        let e = why(super::softmax(&[0.0, 0.0, 0.0], 2).unwrap_err());
        assert!(
            e.contains("softmax: x holds 3 values, not whole rows of 2"),
            "{e}"
        );
        let e = why(super::rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 0, 0.0).unwrap_err());
        assert!(e.contains("rmsnorm: rows of 0 columns"), "{e}");
        let e = why(super::rmsnorm(&[3.0, 4.0, 5.0], &[1.0, 2.0], 2, 0.0).unwrap_err());
        assert!(
            e.contains("rmsnorm: x holds 3 values, not whole rows of 2"),
            "{e}"
        );
        // A g of 1 value for rows of 2 (the old code cut each row to 1).
        let e = why(super::rmsnorm(&[3.0, 4.0], &[1.0], 2, 0.0).unwrap_err());
        assert!(
            e.contains("rmsnorm: g holds 1 values, not 2 (one per column)"),
            "{e}"
        );
        // No rows at all is whole rows: an empty result.
        assert_eq!(super::softmax(&[], 3).unwrap(), Vec::<f64>::new());
    }

    /// Three tokens over four experts: equal logits, logits 0 1 0 2, and
    /// one large logit over three equal ones.
    const LOGITS: [f32; 12] = [0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 5.0, 0.0, 0.0, 0.0];

    fn close(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-15)
    }

    #[test]
    fn route_topk_fixed_k_by_hand() {
        let e = 1f64.exp();
        let e5 = 5f64.exp();
        let r = super::route_topk(&LOGITS, 3, 4, 2, 0.0).unwrap();
        // Token 0: a four-way tie, so experts 0 and 1, half each. Token 1:
        // experts 3 (e^2) and 1 (e). Token 2: expert 0 (e^5), then the
        // lowest of three tied experts, 1.
        assert_eq!(r.indptr, vec![0, 2, 5, 5, 6]);
        assert_eq!(r.tokens, vec![0, 2, 0, 1, 2, 1]);
        let want = [
            0.5,
            e5 / (e5 + 1.0),
            0.5,
            1.0 / (e + 1.0),
            1.0 / (e5 + 1.0),
            e / (e + 1.0),
        ];
        assert!(close(&r.weights, &want), "{:?}", r.weights);
        // k = 1 gives every token weight 1 on its top expert.
        let r = super::route_topk(&LOGITS, 3, 4, 1, 0.0).unwrap();
        assert_eq!(r.indptr, vec![0, 2, 2, 2, 3]);
        assert_eq!(r.tokens, vec![0, 2, 1]);
        assert_eq!(r.weights, vec![1.0; 3]);
    }

    #[test]
    fn route_topk_threshold_by_hand() {
        // p: token 0 all 1/4; token 1 (1, e, 1, e^2) / (2 + e + e^2), so
        // about 0.083, 0.225, 0.083, 0.610; token 2 about 0.980 then 0.0066.
        let e = 1f64.exp();
        let e5 = 5f64.exp();
        // 0.2 keeps token 0's second expert (1/4) and token 1's (0.225).
        let r = super::route_topk(&LOGITS, 3, 4, 2, 0.2).unwrap();
        assert_eq!(r.indptr, vec![0, 2, 4, 4, 5]);
        assert_eq!(r.tokens, vec![0, 2, 0, 1, 1]);
        let want = [0.5, 1.0, 0.5, 1.0 / (e + 1.0), e / (e + 1.0)];
        assert!(close(&r.weights, &want), "{:?}", r.weights);
        // 0.3 drops every second expert; token 0's top one (1/4 < 0.3) stays.
        let r = super::route_topk(&LOGITS, 3, 4, 2, 0.3).unwrap();
        assert_eq!(r.indptr, vec![0, 2, 2, 2, 3]);
        assert_eq!(r.tokens, vec![0, 2, 1]);
        assert_eq!(r.weights, vec![1.0; 3]);
        // k = 4 at 0.05: tokens 0 and 1 keep all four experts (weights = p),
        // token 2 only expert 0 (the others have p = 1 / (e^5 + 3) < 0.05).
        let r = super::route_topk(&LOGITS, 3, 4, 4, 0.05).unwrap();
        assert_eq!(r.indptr, vec![0, 3, 5, 7, 9]);
        assert_eq!(r.tokens, vec![0, 1, 2, 0, 1, 0, 1, 0, 1]);
        let s1 = 2.0 + e + e * e;
        let want = [
            0.25,
            1.0 / s1,
            1.0,
            0.25,
            e / s1,
            0.25,
            1.0 / s1,
            0.25,
            e * e / s1,
        ];
        assert!(close(&r.weights, &want), "{:?}", r.weights);
        assert!(1.0 / (e5 + 3.0) < 0.05);
    }

    #[test]
    fn route_topk_refuses_a_bad_k_threshold_or_size() {
        let why =
            |r: Result<super::Routing, crate::workloads::WorkloadError>| r.unwrap_err().to_string();
        // LOGITS are 3 tokens x 4 experts: k must be 1 ..= 4.
        let w = why(super::route_topk(&LOGITS, 3, 4, 0, 0.0));
        assert!(w.contains("top-k = 0 must be in 1..=4"), "{w}");
        let w = why(super::route_topk(&LOGITS, 3, 4, 5, 0.0));
        assert!(w.contains("top-k = 5 must be in 1..=4"), "{w}");
        // The threshold must be in [0, 1): 1, below 0 and NaN are not.
        for t in [1.0, -0.5, f64::NAN] {
            let w = why(super::route_topk(&LOGITS, 3, 4, 2, t));
            assert!(
                w.contains(&format!("threshold = {t} must be in [0, 1)")),
                "{w}"
            );
        }
        // 12 logits are not 4 x 4, nor usize::MAX x 4 (which overflows).
        let w = why(super::route_topk(&LOGITS, 4, 4, 2, 0.0));
        assert!(w.contains("12 logits are not 4 tokens x 4 experts"), "{w}");
        let w = why(super::route_topk(&LOGITS, usize::MAX, 4, 2, 0.0));
        assert!(w.contains("12 logits are not"), "{w}");
    }

    #[test]
    fn moe_by_hand() {
        // Expert 0 the identity, expert 1 diag(2, -1); x rows (1, 2), (3, -1).
        let w = [1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, -1.0];
        let x = [1.0, 2.0, 3.0, -1.0];
        let routing = super::Routing {
            indptr: vec![0, 2, 3],
            tokens: vec![0, 1, 1],
            weights: vec![0.25, 0.5, 0.5],
        };
        let (out, abs) = super::moe(&x, &w, &routing, 2, 2, 2).unwrap();
        // Token 0: 0.25 (1, 2). Token 1: 0.5 (3, -1) + 0.5 (6, 1).
        assert_eq!(out, vec![0.25, 0.5, 4.5, 0.0]);
        assert_eq!(abs, vec![0.25, 0.5, 4.5, 1.0]);
        // A token routed nowhere gets zeros.
        let none = super::Routing {
            indptr: vec![0, 1, 1],
            tokens: vec![1],
            weights: vec![1.0],
        };
        let (out, _) = super::moe(&x, &w, &none, 2, 2, 2).unwrap();
        assert_eq!(out, vec![0.0, 0.0, 3.0, -1.0]);
    }

    #[test]
    fn moe_refuses_sizes_and_routings_that_do_not_fit() {
        // moe_by_hand's layer: 2 tokens x 2 hidden, 2 experts of 2 x 2, so
        // x holds 4 values and w 8; indptr [0, 2, 3] over 3 entries.
        let w = [1.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, -1.0];
        let x = [1.0, 2.0, 3.0, -1.0];
        let good = super::Routing {
            indptr: vec![0, 2, 3],
            tokens: vec![0, 1, 1],
            weights: vec![0.25, 0.5, 0.5],
        };
        let why = |x: &[f32], w: &[f32], r: &super::Routing, t: usize, h: usize, f: usize| {
            super::moe(x, w, r, t, h, f).unwrap_err().to_string()
        };
        // 3 tokens x 2 hidden would be 6 values of x.
        let e = why(&x, &w, &good, 3, 2, 2);
        assert!(
            e.contains("x holds 4 values, not 3 tokens x 2 hidden"),
            "{e}"
        );
        // ffn 3: w would need 2 x 2 x 3 = 12 values, not 8.
        let e = why(&x, &w, &good, 2, 2, 3);
        assert!(
            e.contains("w holds 8 values, not 2 experts x 2 hidden x 3 ffn"),
            "{e}"
        );
        // usize::MAX ffn: 2 x usize::MAX overflows; refused as a size.
        let e = why(&x, &w, &good, 2, 2, usize::MAX);
        assert!(e.contains("w holds 8 values"), "{e}");
        // A routing past the tokens, or not CSR.
        let past = super::Routing {
            tokens: vec![0, 2, 1],
            ..good.clone()
        };
        let e = why(&x, &w, &past, 2, 2, 2);
        assert!(
            e.contains("routing entry 1 is token 2, past the 2 tokens"),
            "{e}"
        );
        for indptr in [vec![1, 2, 3], vec![0, 2, 1], vec![0, 2, 2]] {
            let r = super::Routing {
                indptr: indptr.clone(),
                ..good.clone()
            };
            let e = why(&x, &w, &r, 2, 2, 2);
            assert!(
                e.contains(&format!(
                    "routing indptr {indptr:?} does not run from 0 up to its 3 entries"
                )),
                "{e}"
            );
        }
        let short = super::Routing {
            weights: vec![1.0],
            ..good.clone()
        };
        let e = why(&x, &w, &short, 2, 2, 2);
        assert!(e.contains("routing has 3 tokens but 1 weights"), "{e}");
        // No values, no hidden: x and w are empty and right, but 2^40
        // tokens x 2^30 ffn outputs overflow a 64-bit usize.
        let none = super::Routing {
            indptr: vec![0],
            tokens: vec![],
            weights: vec![],
        };
        let e = why(&[], &[], &none, 1 << 40, 0, 1 << 30);
        assert!(
            e.contains("tokens x 1073741824 ffn outputs overflow usize"),
            "{e}"
        );
    }

    #[test]
    fn moe_top1_is_each_tokens_expert_gemm() {
        // With k = 1 every weight is 1: out rows are x rows times the chosen
        // expert's matrix.
        let (tokens, experts, hidden, ffn) = (3, 4, 3, 2);
        let w: Vec<f32> = (0..experts * hidden * ffn)
            .map(|i| i as f32 * 0.5 - 3.0)
            .collect();
        let x: Vec<f32> = (0..tokens * hidden)
            .map(|i| 1.0 - i as f32 * 0.25)
            .collect();
        let routing = super::route_topk(&LOGITS, tokens, experts, 1, 0.0).unwrap();
        let (out, abs) = super::moe(&x, &w, &routing, tokens, hidden, ffn).unwrap();
        for e in 0..experts {
            let w_e = &w[e * hidden * ffn..(e + 1) * hidden * ffn];
            for &t in &routing.tokens[routing.indptr[e]..routing.indptr[e + 1]] {
                let (y, y_abs) =
                    super::gemm(&x[t * hidden..(t + 1) * hidden], w_e, 1, ffn, hidden).unwrap();
                assert_eq!(out[t * ffn..(t + 1) * ffn], y[..]);
                assert_eq!(abs[t * ffn..(t + 1) * ffn], y_abs[..]);
            }
        }
    }
}
