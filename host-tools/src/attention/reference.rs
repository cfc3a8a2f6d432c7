//! The f64 reference of decode attention and its error bound.

use super::kv::DecodeData;

/// f32 unit roundoff.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Relative error of the kernels' `exp2` on [-126, 128) (`exp2_f32` in
/// the kernels' tile library documents "a few ulp, < 1e-6").
pub const EXP2_ERROR: f64 = 1e-6;
/// Tokens per block of the kernels' online softmax (`kBlock`): each
/// block rescales the running sums once.
pub const KERNEL_BLOCK: u32 = 32;

/// `gamma_n = n u / (1 - n u)`.
fn gamma(n: f64) -> f64 {
    n * U / (1.0 - n * U)
}

/// softmax(scale q K^T) V per query row, in f64, with what the error
/// bound needs.
#[derive(Clone, Debug)]
pub struct Reference {
    /// `[B * q_heads, D]`: the attention output per query row.
    pub o: Vec<f64>,
    /// `[B * q_heads, D]`: `sum_j p_j |v_j|` per element (the weighted
    /// size the output's rounding errors scale with).
    pub weighted_abs: Vec<f64>,
    /// Per query row: the largest `sum_i |q_i k_ji|` over its tokens.
    pub dot_abs: Vec<f64>,
    /// Per query row: the largest `|scale * q.k_j * log2 e|`.
    pub score2_abs: Vec<f64>,
    /// Head dimension.
    pub d: u32,
    /// Per query row: the tokens it attends to (its request's KV length
    /// for dense attention).
    pub len: Vec<u32>,
}

/// The reference for `data`, scale `1/sqrt(D)` exactly. Data
/// [`DecodeData::check`] refuses (bad metadata, a NaN or infinite input)
/// is refused with its reason.
pub fn attention(data: &DecodeData) -> Result<Reference, String> {
    attention_over(data, |b| (0..data.shape.lengths[b]).collect())
}

/// The reference over a subset of each request's tokens: request `b`
/// attends to the positions `tokens(b)` only (each `< len[b]`, in any
/// order; e.g. the ones a sparse indexer selected). [`Reference::len`]
/// is then the number of tokens attended, which is what [`bound`] needs.
/// Refused, naming the request: a position `>= len[b]`, and no position
/// at all (a softmax over nothing); and data [`DecodeData::check`]
/// refuses.
pub fn attention_over(
    data: &DecodeData,
    tokens: impl Fn(usize) -> Vec<u32>,
) -> Result<Reference, String> {
    data.check().map_err(|e| e.to_string())?;
    let s = &data.shape;
    let (d, g) = (s.d as usize, s.group());
    let scale = 1.0 / (s.d as f64).sqrt();
    let rows = s.lengths.len() * s.q_heads as usize;
    let mut r = Reference {
        o: vec![0.0; rows * d],
        weighted_abs: vec![0.0; rows * d],
        dot_abs: vec![0.0; rows],
        score2_abs: vec![0.0; rows],
        d: s.d,
        len: vec![0; rows],
    };
    let mut scores = Vec::new();
    for b in 0..s.lengths.len() {
        let picked = tokens(b);
        let len = s.lengths[b];
        if picked.is_empty() {
            return Err(format!(
                "request {b}: no tokens to attend to (a softmax over nothing)"
            ));
        }
        if let Some(&t) = picked.iter().find(|&&t| t >= len) {
            return Err(format!(
                "request {b}: token {t} is past its {len} KV tokens"
            ));
        }
        for j in 0..s.q_heads {
            let row = b * s.q_heads as usize + j as usize;
            let h = j / g;
            let q = &data.q[row * d..(row + 1) * d];
            scores.clear();
            // Checked: the data, b and h; every picked t < len.
            for &t in &picked {
                let k = data.kv_row_unchecked(b, h, t, false);
                let dot: f64 = q.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                let abs: f64 = q
                    .iter()
                    .zip(k)
                    .map(|(&a, &b)| (a as f64 * b as f64).abs())
                    .sum();
                r.dot_abs[row] = r.dot_abs[row].max(abs);
                let s = scale * dot;
                r.score2_abs[row] = r.score2_abs[row].max((s * std::f64::consts::LOG2_E).abs());
                scores.push(s);
            }
            let m = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let p: Vec<f64> = scores.iter().map(|&x| (x - m).exp()).collect();
            let sum: f64 = p.iter().sum();
            let (o, wa) = (
                &mut r.o[row * d..(row + 1) * d],
                &mut r.weighted_abs[row * d..(row + 1) * d],
            );
            for (&t, &pt) in picked.iter().zip(&p) {
                let v = data.kv_row_unchecked(b, h, t, true);
                for e in 0..d {
                    o[e] += pt / sum * v[e] as f64;
                    wa[e] += pt / sum * (v[e] as f64).abs();
                }
            }
            r.len[row] = picked.len() as u32;
        }
    }
    Ok(r)
}

/// What the bound allows, in words.
pub const TOLERANCE: &str =
    "|o - ref| <= (2 rho + 2 gamma_(n+c+2) + 2u) * sum_j p_j |v_j| + n * 2^-126, \
     rho = the weights' relative error (scores, exp2, rescales); reference::bound";

/// The error bound of each output element (`[B * q_heads, D]`, as
/// [`Reference::o`]) when each query row's tokens were split into
/// `chunks(row)` chunks.
///
/// Derivation, for a row of `n` tokens in `c` chunks, base 2 throughout:
/// - a score `s2_j = fl(fl(q . k_j) * fl(scale * log2 e))` is off by at
///   most `e2 = log2e * scale * (gamma_D + 3u) * max_j sum_i |q_i k_ji|`
///   (the D-term dot product, the rounded scale and the product);
/// - a weight `2^(s2_j - m)` then carries a relative error of at most
///   `ln2 * (e2 + 2u * max|s2|)` (the score, the subtraction) plus
///   `EXP2_ERROR`; each rescale `alpha = 2^(m - m')` it goes through (one
///   per block of [`KERNEL_BLOCK`] tokens: at most `ceil(n / 32) + c`)
///   and each merge weight `l_c 2^(m_c - m)` adds `EXP2_ERROR + 2u` and
///   `ln2 * u * |m - m'|` (these sum to at most `ln2 * 2u * 2 max|s2|`):
///   `rho = ln2 * (e2 + 6u max|s2|) + (ceil(n/32) + 2c + 1) * (EXP2_ERROR + 2u)`;
/// - `o = sum_j w_j v_j / sum_j w_j` with every weight off by at most
///   `rho` relative and both sums rounded over at most `n + c` terms is
///   off by at most `(2 rho + 2 gamma_(n+c+2) + 2u) * sum_j p_j |v_j|`;
/// - weights below 2^-126 are subnormal in f32 and off by up to 2^-149
///   absolute each: `n * 2^-126` covers them (|v| < 1).
///
/// Refused, naming the sizes: a reference [`attention`] cannot have made,
/// of head dimension 0, per-row vectors (`len`, `dot_abs`,
/// `score2_abs`) of different lengths, or `o` and `weighted_abs` other
/// than those rows of `d` values.
pub fn bound(r: &Reference, chunks: impl Fn(usize) -> u32) -> Result<Vec<f64>, String> {
    if r.d == 0 {
        return Err("the reference has head dimension 0".into());
    }
    let rows = r.len.len();
    if r.dot_abs.len() != rows || r.score2_abs.len() != rows {
        return Err(format!(
            "the reference has {rows} row lengths but {} dot_abs and {} score2_abs",
            r.dot_abs.len(),
            r.score2_abs.len()
        ));
    }
    let want = rows as u128 * r.d as u128;
    if r.o.len() as u128 != want || r.weighted_abs.len() != r.o.len() {
        return Err(format!(
            "the reference has {} o and {} weighted_abs values; {rows} rows of {} take {want}",
            r.o.len(),
            r.weighted_abs.len(),
            r.d
        ));
    }
    Ok(bound_unchecked(r, chunks))
}

/// [`bound`] of a reference [`attention`] or [`attention_over`] made (or
/// one [`bound`] accepts): `d` >= 1, `len`, `dot_abs` and `score2_abs`
/// one per row, `o` and `weighted_abs` `d` per row; other sizes panic.
pub(crate) fn bound_unchecked(r: &Reference, chunks: impl Fn(usize) -> u32) -> Vec<f64> {
    let d = r.d as usize;
    let per_row: Vec<f64> = (0..r.len.len())
        .map(|row| {
            relative_error(
                r.len[row],
                chunks(row),
                r.d,
                r.dot_abs[row],
                r.score2_abs[row],
            )
        })
        .collect();
    (0..r.o.len())
        .map(|i| {
            per_row[i / d] * r.weighted_abs[i] + r.len[i / d] as f64 * f32::MIN_POSITIVE as f64
        })
        .collect()
}

/// The factor of [`bound`] for one query row of `len` tokens in `chunks`
/// chunks, head dimension `d`, whose largest `sum_i |q_i k_ji|` is
/// `dot_abs` and largest base-2 score magnitude `score2_abs`: the row's
/// error is at most this times `sum_j p_j |v_j|`, plus `len * 2^-126`.
pub fn relative_error(len: u32, chunks: u32, d: u32, dot_abs: f64, score2_abs: f64) -> f64 {
    let ln2 = std::f64::consts::LN_2;
    let log2e = std::f64::consts::LOG2_E;
    let scale = 1.0 / (d as f64).sqrt();
    let (n, c) = (len as f64, chunks as f64);
    let e2 = log2e * scale * (gamma(d as f64) + 3.0 * U) * dot_abs;
    let blocks = (len.div_ceil(KERNEL_BLOCK)) as f64;
    let rho = ln2 * (e2 + 6.0 * U * score2_abs) + (blocks + 2.0 * c + 1.0) * (EXP2_ERROR + 2.0 * U);
    2.0 * rho + 2.0 * gamma(n + c + 2.0) + 2.0 * U
}
