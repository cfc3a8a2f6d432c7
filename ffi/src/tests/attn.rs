//! The attention kernels against f64 references written here, with error
//! bounds derived from f32 rounding (unit roundoff u = 2^-24, gamma_n =
//! n u / (1 - n u) for a sum of n terms, as the GEMM check uses), their
//! contracts' rules one by one, and their run-time rejections.
//!
//! Bounds, per query row (see `reference_partial` and `merge_bound`):
//! - scores: c = fl(scale log2 e) and s2_i = fl(fl(q . k_i) c) are off by at
//!   most E = |c| gamma_D A + 4 u S, A = max_i sum_d |q_d k_id|,
//!   S = max_i |s2_i|;
//! - a token's weight 2^(s2_i - m) (after the rescales of later blocks) is
//!   off by a relative eps_p = ln2 (2E + 2u R) + (nb + 1)(X + 2u), R = 2S
//!   bounding every exponent, nb the blocks of 32 tokens, X = 8u the
//!   relative error of the kernels' exp2;
//! - o, a weighted mean of the values, is off by at most
//!   Vmax (2.1 (eps_p + gamma_(n+1) + (nb + 1) u) + u); m by E; m + log2 l
//!   by E + 1.1 (eps_p + gamma_(n+1) + (nb + 1) u) / ln2.
//! - a merge of states whose m lie within Rm of their max: weights are off
//!   by eps_w = X + ln2 u Rm + u, o by beta Omax with beta = 2.1 (eps_w +
//!   gamma_(n+1) + u) + u, l by eps_w + gamma_(n+1) <= beta. A merge tree of
//!   depth d passes a level's o error on and adds 2 x its l error as weight
//!   error at the next level: o is off by at most d^2 beta Omax.

use super::*;
use std::f64::consts::{LN_2, LOG2_E};

/// Unit roundoff of f32.
const U: f64 = 1.0 / (1u64 << 24) as f64;
/// Relative error of the kernels' exp2_f32 (wsp_tile.hpp): the reduction
/// r = (x - k) ln2 (0.5 u of |r| <= 0.35), Horner's rounding (< 3 u for
/// |r| <= 0.35) and the truncation (< 0.1 u), rounded up to 8 u.
const EXP2: f64 = 8.0 * U;
/// Tokens per block of the partial kernels (wsp_attn.hpp).
const BLOCK: usize = 32;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

impl Lcg {
    /// Uniform in 0..n.
    fn below(&mut self, n: usize) -> usize {
        ((self.next(0.0, 1.0) * n as f32) as usize).min(n - 1)
    }
}

/// An i32 matrix from its rows.
fn i32_mat(rows: &[Vec<i32>], stride: u32) -> Mat {
    let cols = rows[0].len();
    Mat::new(rows.len() as u32, cols as u32, stride, |r, c| {
        f32::from_bits(rows[r][c] as u32)
    })
    .with_dtype(DTYPE_I32)
}

fn f32_bits(x: f32) -> u64 {
    u64::from(x.to_bits())
}

/// A paged KV pool of one KV head: `pages` pages of `page` tokens (keys in
/// the first `page` rows of a page, values in the next), D cols.
struct Pool {
    kv: Mat,
    page: usize,
}

impl Pool {
    fn random(pages: u32, page: u32, d: u32, stride: u32, rng: &mut Lcg) -> Self {
        Self {
            kv: Mat::random(pages * 2 * page, d, stride, rng, -1.0, 1.0),
            page: page as usize,
        }
    }

    fn pages(&self) -> usize {
        self.kv.rows as usize / (2 * self.page)
    }

    /// The pool row of token `t`'s key through `table`.
    fn key_row(&self, table: &[i32], t: usize) -> usize {
        table[t / self.page] as usize * 2 * self.page + t % self.page
    }

    fn row(&self, r: usize) -> Vec<f64> {
        (0..self.kv.cols as usize)
            .map(|c| f64::from(self.kv.get(r, c)))
            .collect()
    }

    /// Keys and values of `tokens` through `table`.
    fn gather(&self, table: &[i32], tokens: &[usize]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        tokens
            .iter()
            .map(|&t| {
                let r = self.key_row(table, t);
                (self.row(r), self.row(r + self.page))
            })
            .unzip()
    }
}

/// `w` distinct pages of a pool of `pages`, in a random order.
fn shuffled_table(w: usize, pages: usize, rng: &mut Lcg) -> Vec<i32> {
    let mut all: Vec<i32> = (0..pages as i32).collect();
    for i in (1..pages).rev() {
        all.swap(i, rng.below(i + 1));
    }
    all.truncate(w);
    all
}

/// A partial state in f64, per query row.
#[derive(Clone, Debug)]
struct State {
    o: Vec<Vec<f64>>,
    m: Vec<f64>,
    l: Vec<f64>,
}

impl State {
    /// Rows `first .. first + g` of a state tensor (D + 2 cols).
    fn read(mat: &Mat, first: usize, g: usize) -> Self {
        let d = mat.cols as usize - 2;
        let o = (first..first + g)
            .map(|r| (0..d).map(|c| f64::from(mat.get(r, c))).collect())
            .collect();
        let m = (first..first + g)
            .map(|r| f64::from(mat.get(r, d)))
            .collect();
        let l = (first..first + g)
            .map(|r| f64::from(mat.get(r, d + 1)))
            .collect();
        Self { o, m, l }
    }

    fn lse(&self, r: usize) -> f64 {
        self.m[r] + self.l[r].log2()
    }

    /// The state stacked as f32 rows below `rows` (a merge's input).
    fn push_rows(&self, rows: &mut Vec<Vec<f32>>) {
        for r in 0..self.m.len() {
            let mut row: Vec<f32> = self.o[r].iter().map(|&v| v as f32).collect();
            row.push(self.m[r] as f32);
            row.push(self.l[r] as f32);
            rows.push(row);
        }
    }
}

/// The exact partial state of `keys` / `values` for query rows `q` and its
/// error bounds (module doc) per row: o, m and m + log2 l.
struct Reference {
    state: State,
    bound_o: Vec<f64>,
    bound_m: Vec<f64>,
    bound_lse: Vec<f64>,
}

fn reference_partial(q: &Mat, keys: &[Vec<f64>], values: &[Vec<f64>], scale: f32) -> Reference {
    let (g, d, n) = (q.rows as usize, q.cols as usize, keys.len());
    let nb = n.div_ceil(BLOCK);
    let c = f64::from(scale) * LOG2_E;
    let vmax = values.iter().flatten().fold(0.0f64, |a, v| a.max(v.abs()));
    let mut state = State {
        o: Vec::new(),
        m: Vec::new(),
        l: Vec::new(),
    };
    let (mut bound_o, mut bound_m, mut bound_lse) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..g {
        let qr: Vec<f64> = (0..d).map(|j| f64::from(q.get(r, j))).collect();
        let s2: Vec<f64> = keys
            .iter()
            .map(|k| c * qr.iter().zip(k).map(|(a, b)| a * b).sum::<f64>())
            .collect();
        let a = keys
            .iter()
            .map(|k| qr.iter().zip(k).map(|(a, b)| (a * b).abs()).sum::<f64>())
            .fold(0.0f64, f64::max);
        let m = s2.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s2.iter().map(|s| (s - m).exp2()).collect();
        let l: f64 = p.iter().sum();
        let o = (0..d)
            .map(|j| p.iter().zip(values).map(|(p, v)| p * v[j]).sum::<f64>() / l)
            .collect();
        state.o.push(o);
        state.m.push(m);
        state.l.push(l);

        let s = s2.iter().fold(0.0f64, |acc, v| acc.max(v.abs()));
        let e = c.abs() * gamma(d) * a * (1.0 + 1e-6) + 4.0 * U * s;
        let eps_p = LN_2 * (2.0 * e + 4.0 * U * s) + (nb + 1) as f64 * (EXP2 + 2.0 * U);
        let sums = gamma(n + 1) + (nb + 1) as f64 * U;
        bound_o.push(vmax * (2.1 * (eps_p + sums) + U));
        bound_m.push(e);
        bound_lse.push(e + 1.1 * (eps_p + sums) / LN_2);
    }
    Reference {
        state,
        bound_o,
        bound_m,
        bound_lse,
    }
}

/// `got` against the reference within its bounds, scaled by `slack` (1 for a
/// kernel's own output).
fn assert_state_near(got: &State, want: &Reference, slack: f64, what: &str) {
    for r in 0..got.m.len() {
        for (j, (&a, &b)) in got.o[r].iter().zip(&want.state.o[r]).enumerate() {
            assert!(
                (a - b).abs() <= slack * want.bound_o[r],
                "{what}: o({r}, {j}) {a} vs {b}, bound {}",
                slack * want.bound_o[r]
            );
        }
        let (m, m_want) = (got.m[r], want.state.m[r]);
        assert!(
            (m - m_want).abs() <= slack * want.bound_m[r],
            "{what}: m({r}) {m} vs {m_want}"
        );
        let (lse, lse_want) = (got.lse(r), want.state.m[r] + want.state.l[r].log2());
        assert!(
            (lse - lse_want).abs() <= slack * want.bound_lse[r],
            "{what}: lse({r}) {lse} vs {lse_want}, bound {}",
            slack * want.bound_lse[r]
        );
    }
}

/// attn_decode_partial's cost (attn_decode_partial.cpp).
fn decode_cost(g: u64, d: u64, first: u64, n: u64, page: u64) -> u64 {
    let pages = (first + n - 1) / page - first / page + 1;
    let nb = n.div_ceil(BLOCK as u64);
    4 * g * d + 4 * g + n * (2 * d + 2 * g * d + 6 * g) + nb * (g * d + 6 * g) + pages
}

/// One decode case: G query rows, head dim D, page size P, tokens first ..
/// first + n of a request whose table holds `w` pages of a pool of `pages`.
struct DecodeCase {
    g: u32,
    d: u32,
    page: u32,
    first: usize,
    n: usize,
    w: usize,
    pages: u32,
    scale: f32,
    seed: u64,
}

/// Runs the decode case, checks values (within the bounds), the cost and the
/// gaps, and returns the kernel's state.
fn check_decode(case: &DecodeCase) -> State {
    let DecodeCase {
        g,
        d,
        page,
        first,
        n,
        w,
        pages,
        scale,
        seed,
    } = *case;
    let mut rng = Lcg(seed);
    let pool = Pool::random(pages, page, d, d + 3, &mut rng);
    let table = shuffled_table(w, pool.pages(), &mut rng);
    let q = Mat::random(g, d, d + 1, &mut rng, -1.0, 1.0);
    let tokens: Vec<usize> = (first..first + n).collect();
    let (keys, values) = pool.gather(&table, &tokens);
    let want = reference_partial(&q, &keys, &values, scale);
    let mut m = [
        q,
        pool.kv,
        i32_mat(&[table], w as u32 + 2),
        Mat::zeros(g, d + 2, d + 5),
    ];
    let scalars = [first as u64, n as u64, u64::from(page), f32_bits(scale)];
    let cycles = run(DECODE, &mut m, &scalars).unwrap();
    assert_eq!(
        cycles,
        decode_cost(
            u64::from(g),
            u64::from(d),
            first as u64,
            n as u64,
            u64::from(page)
        )
    );
    let got = State::read(&m[3], 0, g as usize);
    assert_state_near(&got, &want, 1.0, "decode");
    assert!(m.iter().all(Mat::gaps_untouched));
    got
}

#[test]
fn decode_partial_matches_reference() {
    let cases = [
        // A chunk across pages of a shuffled table.
        DecodeCase {
            g: 4,
            d: 64,
            page: 16,
            first: 5,
            n: 100,
            w: 8,
            pages: 12,
            scale: 0.125,
            seed: 21,
        },
        // The largest group and head dim, one token.
        DecodeCase {
            g: 16,
            d: 128,
            page: 64,
            first: 0,
            n: 1,
            w: 1,
            pages: 2,
            scale: 0.088,
            seed: 22,
        },
        // D = 1, P = 1, one query row.
        DecodeCase {
            g: 1,
            d: 1,
            page: 1,
            first: 3,
            n: 40,
            w: 43,
            pages: 50,
            scale: 1.0,
            seed: 23,
        },
        // A long chunk: 1000 tokens in 32 blocks.
        DecodeCase {
            g: 8,
            d: 128,
            page: 16,
            first: 7,
            n: 1000,
            w: 64,
            pages: 64,
            scale: 0.088,
            seed: 24,
        },
        // Scores over a wide range: s2 spans about [-60, 60].
        DecodeCase {
            g: 4,
            d: 32,
            page: 8,
            first: 0,
            n: 77,
            w: 10,
            pages: 10,
            scale: 2.5,
            seed: 25,
        },
        // A partial last block (n = 33) with a negative scale.
        DecodeCase {
            g: 2,
            d: 16,
            page: 4,
            first: 2,
            n: 33,
            w: 9,
            pages: 9,
            scale: -0.5,
            seed: 26,
        },
    ];
    for case in &cases {
        check_decode(case);
    }
}

/// attn_decode_partial's tensors: q G x D, a pool of `pages` pages of P,
/// a table of `w` entries (all page 0), part G x (D + 2).
fn decode_mats(g: u32, d: u32, pages: u32, page: u32, w: u32) -> [Mat; 4] {
    [
        Mat::zeros(g, d, d),
        Mat::zeros(pages * 2 * page, d, d),
        Mat::zeros_i32(1, w, w),
        Mat::zeros(g, d + 2, d + 2),
    ]
}

#[test]
fn decode_partial_contract_rules() {
    let kernel = lookup(DECODE).unwrap();
    let half = f32_bits(0.5);
    let shapes = |m: &[Mat]| m.iter().map(Mat::shape).collect::<Vec<_>>();
    let err = |m: &mut [Mat], s: &[u64]| {
        let e = kernel.check(&shapes(m), s).unwrap_err();
        assert!(run(DECODE, m, s).is_err(), "{e}");
        e
    };
    // Valid at the limits: tokens up to the table's last entry, the largest
    // tiles, the scale's sign free.
    assert!(run(DECODE, &mut decode_mats(3, 4, 4, 2, 5), &[1, 9, 2, half]).is_ok());
    assert!(run(DECODE, &mut decode_mats(16, 128, 1, 1, 1), &[0, 1, 1, half]).is_ok());
    let neg = f32_bits(-3.0);
    assert!(run(DECODE, &mut decode_mats(1, 1, 1, 8, 2), &[8, 8, 8, neg]).is_ok());
    assert!(run(
        DECODE,
        &mut decode_mats(1, 4, 1 << 19, 1, 1),
        &[0, 1, 1, half]
    )
    .is_ok());

    // A length above the page table: the last token is on entry 5 of 5.
    let e = err(&mut decode_mats(3, 4, 4, 2, 5), &[1, 10, 2, half]);
    assert_eq!(
        e,
        ShapeError::Span {
            count: 1,
            last: 10,
            entry: 5,
            table: 2,
            cols: 5
        }
    );
    assert_eq!(
        e.to_string(),
        "scalar 1: a length above the page table: token 10 is on page table entry 5, \
         beyond the 5 entries of tensor argument 2"
    );
    let e = err(&mut decode_mats(3, 4, 4, 2, 5), &[u64::MAX, 2, 2, half]);
    assert_eq!(e.to_string(), "scalar 1: the token range overflows");
    // n = 0.
    let e = err(&mut decode_mats(3, 4, 4, 2, 5), &[0, 0, 2, half]);
    assert_eq!(e.to_string(), "scalar 1: count 0 must be at least 1");
    // P = 0, and pool rows (16) not a multiple of 2P (P = 3, P = 16).
    for p in [0, 3, 16] {
        let e = err(&mut decode_mats(3, 4, 4, 2, 5), &[0, 1, p, half]);
        assert_eq!(
            e,
            ShapeError::PageSize {
                index: 2,
                value: p,
                arg: 1,
                rows: 16
            }
        );
    }
    // Scale: NaN, infinite, high bits set.
    for bad in [
        f32_bits(f32::NAN),
        f32_bits(f32::NEG_INFINITY),
        half | 1 << 32,
    ] {
        let e = err(&mut decode_mats(3, 4, 4, 2, 5), &[0, 1, 2, bad]);
        assert_eq!(
            e,
            ShapeError::Scale {
                index: 3,
                value: bad
            }
        );
    }
    // Shapes: kv cols, part rows, part cols; the table with 2 rows.
    let mut m = decode_mats(3, 4, 4, 2, 5);
    m[1] = Mat::zeros(16, 5, 5);
    assert!(matches!(
        err(&mut m, &[0, 1, 2, half]),
        ShapeError::Mismatch { arg: 1, .. }
    ));
    let mut m = decode_mats(3, 4, 4, 2, 5);
    m[3] = Mat::zeros(2, 6, 6);
    assert!(matches!(
        err(&mut m, &[0, 1, 2, half]),
        ShapeError::Mismatch { arg: 3, .. }
    ));
    let mut m = decode_mats(3, 4, 4, 2, 5);
    m[3] = Mat::zeros(3, 4, 4);
    assert!(matches!(
        err(&mut m, &[0, 1, 2, half]),
        ShapeError::Mismatch { arg: 3, .. }
    ));
    let mut m = decode_mats(3, 4, 4, 2, 5);
    m[2] = Mat::zeros_i32(2, 5, 5);
    assert!(matches!(
        err(&mut m, &[0, 1, 2, half]),
        ShapeError::Capacity { arg: 2, .. }
    ));
    // Dtypes: an f32 table, an i32 pool.
    let mut m = decode_mats(3, 4, 4, 2, 5);
    m[2].dtype = DTYPE_F32;
    assert!(matches!(
        err(&mut m, &[0, 1, 2, half]),
        ShapeError::Dtype { arg: 2, .. }
    ));
    let mut m = decode_mats(3, 4, 4, 2, 5);
    m[1].dtype = DTYPE_I32;
    assert!(matches!(
        err(&mut m, &[0, 1, 2, half]),
        ShapeError::Dtype { arg: 1, .. }
    ));
    // Capacities: 17 query rows, D = 129, a pool over 2^20 rows.
    assert!(run(DECODE, &mut decode_mats(17, 4, 4, 2, 5), &[0, 1, 2, half]).is_err());
    assert!(run(DECODE, &mut decode_mats(3, 129, 4, 2, 5), &[0, 1, 2, half]).is_err());
    assert!(run(
        DECODE,
        &mut decode_mats(1, 1, (1 << 19) + 1, 1, 1),
        &[0, 1, 1, half]
    )
    .is_err());
}

#[test]
fn decode_partial_rejects_a_page_outside_the_pool() {
    // Pool of 4 pages of P = 2; the chunk (tokens 2 .. 6) uses entries 1 and 2.
    let half = f32_bits(0.5);
    for (entry, bad) in [(1, 4), (2, -1), (2, i32::MAX), (1, i32::MIN)] {
        let mut table = vec![0, 1, 2, 3];
        table[entry] = bad;
        let mut m = decode_mats(3, 4, 4, 2, 4);
        m[2] = i32_mat(&[table], 4);
        m[3] = Mat::new(3, 6, 6, |_, _| 7.0);
        let (checked, result) = invoke(DECODE, &mut m, &[2, 4, 2, half]);
        assert_eq!(checked, Ok(()), "the contract cannot see the data");
        assert_eq!(result, Err(KernelRejected { kernel: DECODE }), "page {bad}");
        assert!(m[3].data.iter().all(|&v| v == 7.0), "nothing written");
    }
    // A bad entry the chunk does not use is no error.
    let mut m = decode_mats(3, 4, 4, 2, 4);
    m[2] = i32_mat(&[vec![-1, 1, 2, 9]], 4);
    assert!(run(DECODE, &mut m, &[2, 4, 2, half]).is_ok());
}

/// attn_merge's cost (attn_merge.cpp).
fn merge_cost(g: u64, d: u64, n: u64, state_out: bool) -> u64 {
    3 * g * d + 2 * g + n * (3 * g * d + 8 * g) + if state_out { 2 * g } else { 0 }
}

/// The exact merge of `states` (the log-sum-exp rule in f64).
fn merge_reference(states: &[State]) -> State {
    let g = states[0].m.len();
    let mut out = State {
        o: Vec::new(),
        m: Vec::new(),
        l: Vec::new(),
    };
    for r in 0..g {
        let m = states
            .iter()
            .map(|s| s.m[r])
            .fold(f64::NEG_INFINITY, f64::max);
        let w: Vec<f64> = states
            .iter()
            .map(|s| s.l[r] * (s.m[r] - m).exp2())
            .collect();
        let l: f64 = w.iter().sum();
        let d = states[0].o[r].len();
        let o = (0..d)
            .map(|j| {
                states
                    .iter()
                    .zip(&w)
                    .map(|(s, w)| s.o[r][j] * w)
                    .sum::<f64>()
                    / l
            })
            .collect();
        out.o.push(o);
        out.m.push(m);
        out.l.push(l);
    }
    out
}

/// beta of the module doc for merges of at most `fan_in` states drawn from
/// `leaves`: the relative bound on one merge's o (times Omax) and l.
fn merge_bound(leaves: &[State], fan_in: usize) -> f64 {
    let g = leaves[0].m.len();
    let rm = (0..g)
        .map(|r| {
            let ms = leaves.iter().map(|s| s.m[r]);
            ms.clone().fold(f64::NEG_INFINITY, f64::max) - ms.fold(f64::INFINITY, f64::min)
        })
        .fold(0.0f64, f64::max);
    let eps_w = EXP2 + LN_2 * U * rm + U;
    2.1 * (eps_w + gamma(fan_in + 1) + U) + U
}

fn omax(states: &[State]) -> f64 {
    states
        .iter()
        .flat_map(|s| s.o.iter().flatten())
        .fold(0.0f64, |a, v| a.max(v.abs()))
}

/// Runs attn_merge on `states` (stacked, parts stride D + 4) into a state or,
/// when `state_out` is false, into o only; checks the cost and the gaps.
fn merge(states: &[State], state_out: bool) -> State {
    let g = states[0].m.len();
    let d = states[0].o[0].len() as u32;
    let mut rows = Vec::new();
    for s in states {
        s.push_rows(&mut rows);
    }
    let parts = Mat::new(rows.len() as u32, d + 2, d + 4, |r, c| rows[r][c]);
    let out_cols = if state_out { d + 2 } else { d };
    let mut m = [parts, Mat::zeros(g as u32, out_cols, out_cols + 1)];
    let n = states.len() as u64;
    let cycles = run(MERGE, &mut m, &[n]).unwrap();
    assert_eq!(cycles, merge_cost(g as u64, u64::from(d), n, state_out));
    assert!(m.iter().all(Mat::gaps_untouched));
    if state_out {
        State::read(&m[1], 0, g)
    } else {
        let o = (0..g)
            .map(|r| (0..d as usize).map(|c| f64::from(m[1].get(r, c))).collect())
            .collect();
        State {
            o,
            m: vec![f64::NAN; g],
            l: vec![f64::NAN; g],
        }
    }
}

/// `got`'s o (and m, l unless NaN, for an o-only output) against `want`
/// within `bound` (absolute, o) and `rel` (relative, l); m exactly.
fn assert_merged(got: &State, want: &State, bound: f64, rel: f64, what: &str) {
    for r in 0..want.m.len() {
        for (j, (&a, &b)) in got.o[r].iter().zip(&want.o[r]).enumerate() {
            assert!(
                (a - b).abs() <= bound,
                "{what}: o({r}, {j}) {a} vs {b}, bound {bound}"
            );
        }
        if !got.m[r].is_nan() {
            assert_eq!(got.m[r], want.m[r] as f32 as f64, "{what}: m({r})");
            assert!(
                (got.l[r] - want.l[r]).abs() <= rel * want.l[r],
                "{what}: l({r}) {} vs {}",
                got.l[r],
                want.l[r]
            );
        }
    }
}

/// `n` random states of G rows, D cols: o in [-1, 1), m in [-40, 40),
/// l in [1, 64).
fn random_states(n: usize, g: usize, d: usize, rng: &mut Lcg) -> Vec<State> {
    (0..n)
        .map(|_| {
            let mut s = State {
                o: Vec::new(),
                m: Vec::new(),
                l: Vec::new(),
            };
            for _ in 0..g {
                s.o.push((0..d).map(|_| f64::from(rng.next(-1.0, 1.0))).collect());
                s.m.push(f64::from(rng.next(-40.0, 40.0)));
                s.l.push(f64::from(rng.next(1.0, 64.0)));
            }
            s
        })
        .collect()
}

#[test]
fn merge_matches_reference() {
    let mut rng = Lcg(31);
    for (n, g, d) in [(1, 1, 1), (2, 4, 64), (7, 16, 128), (256, 16, 8), (3, 2, 5)] {
        let states = random_states(n, g, d, &mut rng);
        let want = merge_reference(&states);
        let beta = merge_bound(&states, n);
        let bound = beta * omax(&states);
        assert_merged(&merge(&states, true), &want, bound, beta, "state");
        assert_merged(&merge(&states, false), &want, bound, beta, "o only");
    }
    // One state merges to itself: its weight is l * 2^0 = l exactly, so l
    // and m come back bit for bit and o as fl(fl(o l) / l), within 2u.
    let states = random_states(1, 3, 6, &mut rng);
    let got = merge(&states, true);
    for r in 0..3 {
        assert_eq!(got.m[r], states[0].m[r]);
        assert_eq!(got.l[r], states[0].l[r]);
        for (a, b) in got.o[r].iter().zip(&states[0].o[r]) {
            assert!((a - b).abs() <= 2.0 * U * b.abs(), "{a} vs {b}");
        }
    }
}

#[test]
fn merge_tree_flat_and_chain_agree_and_equal_the_unsplit_partial() {
    // One request of 300 tokens (first 0), split at 40, 41, 200: chunks of
    // 40, 1, 159 and 100 tokens; scores over a wide range.
    let (g, d, page) = (8u32, 64u32, 16u32);
    let mut rng = Lcg(41);
    let pool = Pool::random(24, page, d, d, &mut rng);
    let table = shuffled_table(19, pool.pages(), &mut rng);
    let q = Mat::random(g, d, d, &mut rng, -1.0, 1.0);
    let scale = 0.75f32;
    let partial = |first: usize, n: usize| {
        let mut m = [
            Mat::new(g, d, d, |r, c| q.get(r, c)),
            Mat::new(pool.kv.rows, d, d, |r, c| pool.kv.get(r, c)),
            i32_mat(std::slice::from_ref(&table), 19),
            Mat::zeros(g, d + 2, d + 2),
        ];
        run(
            DECODE,
            &mut m,
            &[first as u64, n as u64, u64::from(page), f32_bits(scale)],
        )
        .unwrap();
        let tokens: Vec<usize> = (first..first + n).collect();
        let (keys, values) = pool.gather(&table, &tokens);
        let want = reference_partial(&q, &keys, &values, scale);
        let got = State::read(&m[3], 0, g as usize);
        assert_state_near(&got, &want, 1.0, "chunk");
        (got, want)
    };
    let chunks: Vec<(State, Reference)> = [(0, 40), (40, 1), (41, 159), (200, 100)]
        .into_iter()
        .map(|(f, n)| partial(f, n))
        .collect();
    let leaves: Vec<State> = chunks.iter().map(|(s, _)| s.clone()).collect();
    let (whole, whole_ref) = partial(0, 300);

    // Each composition against the exact merge of the same four states.
    let exact = merge_reference(&leaves);
    let beta = merge_bound(&leaves, 4);
    let om = omax(&leaves);
    let flat = merge(&leaves, false);
    let ab = merge(&leaves[..2], true);
    let cd = merge(&leaves[2..], true);
    let tree = merge(&[ab.clone(), cd], false);
    let chain = merge(
        &[merge(&[ab, leaves[2].clone()], true), leaves[3].clone()],
        false,
    );
    assert_merged(&flat, &exact, beta * om, beta, "flat");
    assert_merged(&tree, &exact, 4.0 * beta * om, beta, "tree");
    assert_merged(&chain, &exact, 9.0 * beta * om, beta, "chain");
    assert_merged(&tree, &flat, 5.0 * beta * om, f64::INFINITY, "tree vs flat");
    assert_merged(
        &chain,
        &flat,
        10.0 * beta * om,
        f64::INFINITY,
        "chain vs flat",
    );

    // The merge of the split equals the unsplit partial: both against the
    // f64 attention over all 300 tokens. A chunk's o error passes through the
    // merge, its log-sum-exp error becomes a relative weight error ln2 x its
    // bound (twice in o), and the merge adds beta.
    let chunk_o = chunks
        .iter()
        .map(|(_, r)| r.bound_o.iter().copied().fold(0.0, f64::max))
        .fold(0.0, f64::max);
    let chunk_lse = chunks
        .iter()
        .map(|(_, r)| r.bound_lse.iter().copied().fold(0.0, f64::max))
        .fold(0.0, f64::max);
    let vmax = pool
        .kv
        .data
        .iter()
        .fold(0.0f64, |a, v| a.max(f64::from(*v).abs()));
    let merged_bound = chunk_o + 2.0 * LN_2 * chunk_lse * 1.01 * vmax + beta * vmax;
    let whole_bound = whole_ref.bound_o.iter().copied().fold(0.0, f64::max);
    for r in 0..g as usize {
        for j in 0..d as usize {
            let want = whole_ref.state.o[r][j];
            let (a, b) = (flat.o[r][j], whole.o[r][j]);
            assert!(
                (a - want).abs() <= merged_bound,
                "merged o({r}, {j}) {a} vs {want}"
            );
            assert!(
                (b - want).abs() <= whole_bound,
                "whole o({r}, {j}) {b} vs {want}"
            );
            assert!((a - b).abs() <= merged_bound + whole_bound);
        }
    }
}

#[test]
fn merge_contract_rules() {
    let kernel = lookup(MERGE).unwrap();
    let f = |r, c| Mat::zeros(r, c, c);
    let check = |m: &[Mat], n: u64| {
        let shapes: Vec<TileShape> = m.iter().map(Mat::shape).collect();
        kernel.check(&shapes, &[n])
    };
    // Valid: a state out or o only; n = 1; the largest stack.
    for m in [[f(6, 6), f(3, 6)], [f(6, 6), f(3, 4)]] {
        assert_eq!(check(&m, 2), Ok(()));
        assert!(run(MERGE, &mut { m }, &[2]).is_ok());
    }
    assert!(run(MERGE, &mut [f(3, 3), f(3, 1)], &[1]).is_ok());
    assert!(run(MERGE, &mut [f(4096, 130), f(16, 130)], &[256]).is_ok());
    // n = 0, n x out rows != parts rows.
    for n in [0, 1, 3, u64::MAX] {
        let e = check(&[f(6, 6), f(3, 6)], n).unwrap_err();
        assert_eq!(
            e,
            ShapeError::States {
                index: 0,
                n,
                arg: 0,
                rows: 6,
                out: 1,
                out_rows: 3
            }
        );
        assert!(run(MERGE, &mut [f(6, 6), f(3, 6)], &[n]).is_err());
    }
    assert_eq!(
        check(&[f(6, 6), f(3, 6)], 3).unwrap_err().to_string(),
        "scalar 0: 3 partial states of the rows 3 of tensor argument 1 do not fill the rows 6 \
         of tensor argument 0 (n must be >= 1)"
    );
    // out cols neither D + 2 nor D; D = 0.
    for (pc, oc) in [(6, 5), (6, 3), (6, 7), (2, 2), (2, 1)] {
        let e = check(&[f(6, pc), f(3, oc)], 2).unwrap_err();
        assert_eq!(
            e,
            ShapeError::StateCols {
                arg: 1,
                value: oc,
                other: 0,
                other_value: pc
            }
        );
        assert!(run(MERGE, &mut [f(6, pc), f(3, oc)], &[2]).is_err());
    }
    // Capacities: 17 rows out, 131 cols, 4097 stacked rows.
    assert!(run(MERGE, &mut [f(34, 6), f(17, 6)], &[2]).is_err());
    assert!(run(MERGE, &mut [f(6, 131), f(3, 131)], &[2]).is_err());
    assert!(run(MERGE, &mut [f(4097, 6), f(1, 6)], &[4097]).is_err());
}

/// indexer_scores's cost (indexer_scores.cpp).
fn indexer_cost(h: u64, dq: u64, s: u64) -> u64 {
    h * dq + h + s * (dq + h * dq + 3 * h + 2)
}

/// indexer_scores on H heads of dim Dq and S keys, against f64 within
/// gamma_(Dq+1) sum_j |w_j| sum_d |q_jd k_sd| (the dot products, through a
/// 1-Lipschitz ReLU) + gamma_(H+1) sum_j |w_j ReLU(q_j . k_s)| (the weighted
/// sum), times 1.01 for the second-order terms.
fn check_indexer(h: u32, dq: u32, s: u32, seed: u64) {
    let mut rng = Lcg(seed);
    let mut m = [
        Mat::random(h, dq, dq + 1, &mut rng, -1.0, 1.0),
        Mat::random(1, h, h + 2, &mut rng, -1.0, 1.0),
        Mat::random(s, dq, dq + 3, &mut rng, -1.0, 1.0),
        Mat::zeros(1, s, s + 1),
    ];
    let cycles = run(INDEXER, &mut m, &[]).unwrap();
    assert_eq!(
        cycles,
        indexer_cost(u64::from(h), u64::from(dq), u64::from(s))
    );
    let (h, dq) = (h as usize, dq as usize);
    let mut positive = 0;
    for key in 0..s as usize {
        let (mut want, mut dots, mut sums) = (0.0, 0.0, 0.0);
        for j in 0..h {
            let w = f64::from(m[1].get(0, j));
            let prods = (0..dq).map(|d| f64::from(m[0].get(j, d)) * f64::from(m[2].get(key, d)));
            let dot: f64 = prods.clone().sum();
            let relu = dot.max(0.0);
            positive += usize::from(dot > 0.0);
            want += w * relu;
            dots += w.abs() * prods.map(f64::abs).sum::<f64>();
            sums += (w * relu).abs();
        }
        let bound = 1.01 * (gamma(dq + 1) * dots + gamma(h + 1) * sums);
        let got = f64::from(m[3].get(0, key));
        assert!(
            (got - want).abs() <= bound,
            "key {key}: {got} vs {want}, bound {bound}"
        );
    }
    // The ReLU cuts: some but not all dot products are positive.
    if h * s as usize >= 16 {
        assert!(positive > 0 && positive < h * s as usize);
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

#[test]
fn indexer_scores_matches_reference() {
    check_indexer(4, 16, 70, 51);
    check_indexer(64, 128, 1024, 52);
    check_indexer(1, 1, 1, 53);
    check_indexer(3, 5, 32, 54);
}

#[test]
fn indexer_scores_relu_and_weights() {
    // q . k = +2 for head 0 and -2 for head 1: only head 0 counts, weighted.
    let mut m = [
        Mat::new(2, 2, 2, |r, _| if r == 0 { 1.0 } else { -1.0 }),
        Mat::new(1, 2, 2, |_, c| [3.0, 100.0][c]),
        Mat::new(1, 2, 2, |_, _| 1.0),
        Mat::zeros(1, 1, 1),
    ];
    run(INDEXER, &mut m, &[]).unwrap();
    assert_eq!(m[3].get(0, 0), 6.0);
    // A NaN key gives a NaN score, never a silent 0.
    m[2] = Mat::new(1, 2, 2, |_, c| [f32::NAN, 1.0][c]);
    run(INDEXER, &mut m, &[]).unwrap();
    assert!(m[3].get(0, 0).is_nan());
}

#[test]
fn indexer_scores_contract_rules() {
    let f = |r, c| Mat::zeros(r, c, c);
    let ok = |mut m: [Mat; 4]| run(INDEXER, &mut m, &[]).is_ok();
    assert!(ok([f(3, 4), f(1, 3), f(5, 4), f(1, 5)]));
    assert!(ok([f(64, 128), f(1, 64), f(1024, 128), f(1, 1024)]));
    // w cols != H, k cols != Dq, scores cols != S, w with 2 rows.
    assert!(!ok([f(3, 4), f(1, 4), f(5, 4), f(1, 5)]));
    assert!(!ok([f(3, 4), f(1, 3), f(5, 5), f(1, 5)]));
    assert!(!ok([f(3, 4), f(1, 3), f(5, 4), f(1, 6)]));
    assert!(!ok([f(3, 4), f(2, 3), f(5, 4), f(1, 5)]));
    // Capacities: 65 heads, Dq 129, 1025 keys.
    assert!(!ok([f(65, 4), f(1, 65), f(5, 4), f(1, 5)]));
    assert!(!ok([f(3, 129), f(1, 3), f(5, 129), f(1, 5)]));
    assert!(!ok([f(3, 4), f(1, 3), f(1025, 4), f(1, 1025)]));
}

/// The top-k reference: positions by score descending, then position
/// ascending; the first k, in increasing order.
fn topk_reference(scores: &[f32], k: usize) -> Vec<i32> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| {
        scores[b]
            .partial_cmp(&scores[a])
            .expect("no NaN")
            .then(a.cmp(&b))
    });
    let mut top: Vec<i32> = order[..k].iter().map(|&p| p as i32).collect();
    top.sort_unstable();
    top
}

/// topk's cost (topk.cpp): depth = floor(log2 k) + 1.
fn topk_cost(len: u64, k: u64) -> u64 {
    let depth = u64::from(64 - k.leading_zeros());
    len * (2 + depth) + k * (depth + 1)
}

fn check_topk(scores: &[f32], k: usize) -> Vec<i32> {
    let len = scores.len() as u32;
    let mut m = [
        Mat::new(1, len, len + 1, |_, c| scores[c]),
        Mat::zeros_i32(1, k as u32, k as u32 + 3),
    ];
    let cycles = run(TOPK, &mut m, &[k as u64]).unwrap();
    assert_eq!(cycles, topk_cost(u64::from(len), k as u64));
    let got: Vec<i32> = (0..k).map(|i| m[1].get_i32(0, i)).collect();
    assert_eq!(got, topk_reference(scores, k), "k = {k} of {len}");
    assert!(m.iter().all(Mat::gaps_untouched));
    got
}

#[test]
fn topk_matches_reference_with_ties() {
    let mut rng = Lcg(61);
    // Scores from 8 levels: many ties across the k-th place.
    for (len, k) in [
        (100, 10),
        (100, 1),
        (100, 100),
        (1000, 333),
        (16384, 2048),
        (1, 1),
    ] {
        let scores: Vec<f32> = (0..len)
            .map(|_| (rng.next(0.0, 8.0) as i32) as f32 - 4.0)
            .collect();
        check_topk(&scores, k);
    }
    // Continuous scores, and a worst case for the heap: increasing scores.
    let scores: Vec<f32> = (0..5000).map(|_| rng.next(-1e3, 1e3)).collect();
    check_topk(&scores, 700);
    let rising: Vec<f32> = (0..3000).map(|i| i as f32).collect();
    assert_eq!(check_topk(&rising, 5), [2995, 2996, 2997, 2998, 2999]);
    // Ties go to the lower position, -0 ties with +0, and infinities rank.
    let all_equal = vec![1.5f32; 50];
    assert_eq!(check_topk(&all_equal, 3), [0, 1, 2]);
    let zeros = [0.0f32, -0.0, 0.0, -0.0, -1.0];
    assert_eq!(check_topk(&zeros, 3), [0, 1, 2]);
    let mixed = [-0.0f32, 0.0, f32::NEG_INFINITY, f32::INFINITY, -0.0];
    assert_eq!(check_topk(&mixed, 2), [0, 3]);
    assert_eq!(check_topk(&mixed, 5), [0, 1, 2, 3, 4]);
}

#[test]
fn topk_rejects_a_nan_score() {
    for at in [0, 7, 99] {
        let mut m = [
            Mat::new(
                1,
                100,
                100,
                |_, c| if c == at { f32::NAN } else { c as f32 },
            ),
            Mat::new(1, 10, 10, |_, _| f32::from_bits(77)).with_dtype(DTYPE_I32),
        ];
        let (checked, result) = invoke(TOPK, &mut m, &[10]);
        assert_eq!(checked, Ok(()));
        assert_eq!(result, Err(KernelRejected { kernel: TOPK }), "NaN at {at}");
        assert!((0..10).all(|i| m[1].get_i32(0, i) == 77), "nothing written");
    }
}

#[test]
fn topk_contract_rules() {
    let kernel = lookup(TOPK).unwrap();
    let mats = |len: u32, cols: u32| [Mat::zeros(1, len, len), Mat::zeros_i32(1, cols, cols)];
    let check = |len: u32, cols: u32, k: u64| {
        let m = mats(len, cols);
        kernel.check(&[m[0].shape(), m[1].shape()], &[k])
    };
    for (len, cols, k) in [(8, 5, 5), (8, 8, 8), (1, 1, 1), (16384, 2048, 2048)] {
        assert_eq!(check(len, cols, k), Ok(()));
        assert!(run(TOPK, &mut mats(len, cols), &[k]).is_ok());
    }
    // k = 0, k > L, idx cols != k, k > 2048 (idx capped at 2048 cols).
    for (len, cols, k) in [
        (8, 1, 0),
        (8, 8, 9),
        (8, 5, 4),
        (8, 4, 5),
        (4096, 2048, 2049),
    ] {
        let e = check(len, cols, k).unwrap_err();
        assert_eq!(
            e,
            ShapeError::Select {
                index: 0,
                k,
                arg: 0,
                max: len.min(2048),
                idx: 1,
                idx_cols: cols
            }
        );
        assert!(run(TOPK, &mut mats(len, cols), &[k]).is_err());
    }
    assert_eq!(
        check(8, 5, 9).unwrap_err().to_string(),
        "scalar 0: k 9 must be in 1..=8 (the cols of tensor argument 0, at most 2048) and \
         equal the cols 5 of tensor argument 1"
    );
    // Capacities: L = 16385, idx of 2049 cols; 2 rows of scores.
    assert!(run(TOPK, &mut mats(16385, 5), &[5]).is_err());
    assert!(run(TOPK, &mut mats(4096, 2049), &[2049]).is_err());
    let mut m = mats(8, 5);
    m[0] = Mat::zeros(2, 8, 8);
    assert!(run(TOPK, &mut m, &[5]).is_err());
}

/// attn_sparse_partial's cost (attn_sparse_partial.cpp).
fn sparse_cost(g: u64, d: u64, n: u64) -> u64 {
    let nb = n.div_ceil(BLOCK as u64);
    n + 4 * g * d + 4 * g + n * (2 * d + 2 * g * d + 6 * g) + nb * (g * d + 6 * g)
}

/// The sparse kernel's tensors for a request of context `lc` on a pool of
/// `pages` pages of P (table shuffled, W = `w` entries) and `selected`
/// positions (meta row 1, the rest of the row -5).
fn sparse_mats(q: &Mat, pool: &Pool, table: &[i32], selected: &[i32], w: usize) -> [Mat; 4] {
    let (g, d) = (q.rows, q.cols);
    let mut row0 = table.to_vec();
    row0.resize(w, -7);
    let mut row1 = selected.to_vec();
    row1.resize(w, -5);
    [
        Mat::new(g, d, d + 2, |r, c| q.get(r, c)),
        Mat::new(pool.kv.rows, d, pool.kv.stride, |r, c| pool.kv.get(r, c)),
        i32_mat(&[row0, row1], w as u32 + 1),
        Mat::zeros(g, d + 2, d + 3),
    ]
}

#[test]
fn sparse_partial_matches_reference() {
    let (g, d, page) = (4u32, 64u32, 16u32);
    let mut rng = Lcg(71);
    let pool = Pool::random(40, page, d, d + 1, &mut rng);
    let lc = 500usize;
    let table = shuffled_table(lc.div_ceil(page as usize), pool.pages(), &mut rng);
    let q = Mat::random(g, d, d, &mut rng, -1.0, 1.0);
    for (n, w, scale) in [(1, 40, 0.125f32), (100, 120, 0.125), (300, 300, 1.5)] {
        // Random positions in a random order, duplicates allowed.
        let selected: Vec<i32> = (0..n).map(|_| rng.below(lc) as i32).collect();
        let tokens: Vec<usize> = selected.iter().map(|&t| t as usize).collect();
        let (keys, values) = pool.gather(&table, &tokens);
        let want = reference_partial(&q, &keys, &values, scale);
        let mut m = sparse_mats(&q, &pool, &table, &selected, w);
        let scalars = [n as u64, u64::from(page), f32_bits(scale), lc as u64];
        let cycles = run(SPARSE, &mut m, &scalars).unwrap();
        assert_eq!(cycles, sparse_cost(u64::from(g), u64::from(d), n as u64));
        assert_state_near(&State::read(&m[3], 0, g as usize), &want, 1.0, "sparse");
        assert!(m.iter().all(Mat::gaps_untouched));
    }
}

#[test]
fn sparse_over_a_contiguous_range_is_the_decode_partial_bit_for_bit() {
    // The same core over the same tokens in the same order.
    let (g, d, page) = (8u32, 32u32, 4u32);
    let mut rng = Lcg(72);
    let pool = Pool::random(30, page, d, d, &mut rng);
    let table = shuffled_table(30, pool.pages(), &mut rng);
    let q = Mat::random(g, d, d, &mut rng, -1.0, 1.0);
    let (first, n, scale) = (9usize, 70usize, 0.3f32);
    let selected: Vec<i32> = (first as i32..(first + n) as i32).collect();
    let mut sparse = sparse_mats(&q, &pool, &table, &selected, 100);
    run(SPARSE, &mut sparse, &[n as u64, 4, f32_bits(scale), 120]).unwrap();
    let mut dense = [
        Mat::new(g, d, d, |r, c| q.get(r, c)),
        Mat::new(pool.kv.rows, d, d, |r, c| pool.kv.get(r, c)),
        i32_mat(std::slice::from_ref(&table), 30),
        Mat::zeros(g, d + 2, d + 2),
    ];
    run(
        DECODE,
        &mut dense,
        &[first as u64, n as u64, 4, f32_bits(scale)],
    )
    .unwrap();
    for r in 0..g as usize {
        for c in 0..d as usize + 2 {
            assert_eq!(
                sparse[3].get(r, c).to_bits(),
                dense[3].get(r, c).to_bits(),
                "({r}, {c})"
            );
        }
    }
}

#[test]
fn sparse_partial_rejects_bad_positions_and_pages() {
    // Context 10 tokens on pages of 4 (entries 0..3 used), a pool of 4 pages.
    let mut rng = Lcg(73);
    let pool = Pool::random(4, 4, 8, 8, &mut rng);
    let q = Mat::random(2, 8, 8, &mut rng, -1.0, 1.0);
    let scalars = [3, 4, f32_bits(0.5), 10];
    let good_table = [3, 0, 1, 2];
    let cases: [(&[i32], [i32; 3]); 5] = [
        (&good_table, [1, 10, 2]),       // position = Lc
        (&good_table, [-1, 0, 2]),       // negative position
        (&good_table, [0, 5, i32::MAX]), // far past Lc
        (&[3, 4, 1, 2], [0, 5, 1]),      // token 5 on page 4 of 4
        (&[3, 0, -2, 2], [0, 9, 8]),     // token 8 on page -2
    ];
    for (table, selected) in cases {
        let mut m = sparse_mats(&q, &pool, table, &selected, 6);
        m[3] = Mat::new(2, 10, 10, |_, _| 7.0);
        let (checked, result) = invoke(SPARSE, &mut m, &scalars);
        assert_eq!(checked, Ok(()), "{selected:?}");
        assert_eq!(
            result,
            Err(KernelRejected { kernel: SPARSE }),
            "{selected:?}"
        );
        assert!(m[3].data.iter().all(|&v| v == 7.0), "nothing written");
    }
    // Bad pages and positions outside the n selected are no error.
    let mut m = sparse_mats(&q, &pool, &[3, 0, 1, -9], &[0, 9, 5, 99, -1], 6);
    assert!(run(SPARSE, &mut m, &scalars).is_ok());
}

#[test]
fn sparse_partial_contract_rules() {
    let kernel = lookup(SPARSE).unwrap();
    let half = f32_bits(0.5);
    // q 3 x 4, a pool of 4 pages of P = 2, meta 2 x 6, part 3 x 6.
    let mats = || {
        [
            Mat::zeros(3, 4, 4),
            Mat::zeros(16, 4, 4),
            Mat::zeros_i32(2, 6, 6),
            Mat::zeros(3, 6, 6),
        ]
    };
    let err = |m: &mut [Mat], s: &[u64]| {
        let shapes: Vec<TileShape> = m.iter().map(Mat::shape).collect();
        let e = kernel.check(&shapes, s).unwrap_err();
        assert!(run(SPARSE, m, s).is_err(), "{e}");
        e
    };
    // Valid: n = W, the table covering Lc = W x P exactly.
    assert!(run(SPARSE, &mut mats(), &[6, 2, half, 12]).is_ok());
    assert!(run(SPARSE, &mut mats(), &[1, 2, half, 1]).is_ok());
    // n = 0, n > W.
    for n in [0, 7] {
        let e = err(&mut mats(), &[n, 2, half, 7]);
        assert_eq!(
            e,
            ShapeError::Count {
                index: 0,
                value: n,
                arg: 2,
                max: 6
            }
        );
    }
    assert_eq!(
        err(&mut mats(), &[7, 2, half, 7]).to_string(),
        "scalar 0: count 7 is not in 1..=6 (the cols of tensor argument 2)"
    );
    // Lc = 0; a context above the page table: (13 - 1) / 2 = 6 >= 6.
    let e = err(&mut mats(), &[1, 2, half, 0]);
    assert!(matches!(
        e,
        ShapeError::Count {
            index: 3,
            value: 0,
            ..
        }
    ));
    let e = err(&mut mats(), &[1, 2, half, 13]);
    assert_eq!(
        e,
        ShapeError::Span {
            count: 3,
            last: 12,
            entry: 6,
            table: 2,
            cols: 6
        }
    );
    // P = 0, P not splitting 16 rows; a bad scale.
    assert!(matches!(
        err(&mut mats(), &[1, 0, half, 7]),
        ShapeError::PageSize { .. }
    ));
    assert!(matches!(
        err(&mut mats(), &[1, 3, half, 7]),
        ShapeError::PageSize { .. }
    ));
    let nan = f32_bits(f32::NAN);
    assert!(matches!(
        err(&mut mats(), &[1, 2, nan, 7]),
        ShapeError::Scale { index: 2, .. }
    ));
    // meta with 1 row; part cols != D + 2; an f32 meta.
    let mut m = mats();
    m[2] = Mat::zeros_i32(1, 6, 6);
    assert_eq!(
        err(&mut m, &[1, 2, half, 7]),
        ShapeError::Rows {
            arg: 2,
            value: 1,
            expected: 2
        }
    );
    let mut m = mats();
    m[3] = Mat::zeros(3, 5, 5);
    assert!(matches!(
        err(&mut m, &[1, 2, half, 7]),
        ShapeError::Mismatch { arg: 3, .. }
    ));
    let mut m = mats();
    m[2].dtype = DTYPE_F32;
    assert!(matches!(
        err(&mut m, &[1, 2, half, 7]),
        ShapeError::Dtype { arg: 2, .. }
    ));
}

#[test]
fn exp2_is_within_the_bound_the_others_assume() {
    // Through attn_merge: state A (o = 1, m = x, l = 1) with state B (o = 0,
    // m = 0, l = 0) and x <= 0 merge to l = 1 x 2^(x - 0) + 0: the kernel's
    // exp2(x), unrounded by anything else. Checked against f64 within EXP2
    // (relative) on the normal range, on a grid over [-126, 0] and near the
    // integers where the reduction switches k.
    let mut xs: Vec<f32> = (0..=126 * 64).map(|i| -(i as f32) / 64.0).collect();
    for k in 0..126 {
        for delta in [0.499_99f32, 0.5, 0.500_01, 1e-6] {
            xs.push(-(k as f32) - delta);
            xs.push(-(k as f32) + delta.min(k as f32));
        }
    }
    let mut worst = 0.0f64;
    for chunk in xs.chunks(16) {
        let g = chunk.len();
        let mut rows = Vec::new();
        for &x in chunk {
            rows.push(vec![1.0, x, 1.0]);
        }
        rows.extend((0..g).map(|_| vec![0.0, 0.0, 0.0]));
        let mut m = [
            Mat::new(2 * g as u32, 3, 3, |r, c| rows[r][c]),
            Mat::zeros(g as u32, 3, 3),
        ];
        run(MERGE, &mut m, &[2]).unwrap();
        for (r, &x) in chunk.iter().enumerate() {
            let want = f64::from(x).exp2();
            let got = f64::from(m[1].get(r, 2));
            let rel = (got - want).abs() / want;
            assert!(rel <= EXP2, "exp2({x}) = {got}, want {want}: {rel:e}");
            worst = worst.max(rel);
        }
    }
    // Some error is there to see: the grid is no set of exact cases.
    assert!(worst > 0.0);
    // Exact at 0; 0 below -150 and at -inf.
    let mut m = [
        Mat::new(4, 3, 3, |r, c| {
            [
                [1.0, 0.0, 1.0],
                [1.0, -151.0, 1.0],
                [0.0, 0.0, 0.0],
                [0.0, 0.0, 0.0],
            ][r][c]
        }),
        Mat::zeros(2, 3, 3),
    ];
    run(MERGE, &mut m, &[2]).unwrap();
    assert_eq!(m[1].get(0, 2), 1.0);
    assert_eq!(m[1].get(1, 2), 0.0);
}
