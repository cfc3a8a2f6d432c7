//! The kernels in f64, each value with a bound on an f32 result's
//! distance from it.

const U: f64 = 1.0 / (1u64 << 24) as f64;
/// The relative error the exp of `kernels/include/wsp_tile.hpp` documents.
const EXP_REL: f64 = 1e-6;
pub(super) const TINY: f64 = f32::MIN_POSITIVE as f64;

fn gamma(n: usize) -> f64 {
    let nu = n as f64 * U;
    nu / (1.0 - nu)
}

/// Values and their error bounds, row-major.
pub(super) struct Tile {
    rows: usize,
    cols: usize,
    pub(super) v: Vec<f64>,
    pub(super) e: Vec<f64>,
}

impl Tile {
    pub(super) fn new(rows: usize, cols: usize) -> Tile {
        Tile {
            rows,
            cols,
            v: vec![0.0; rows * cols],
            e: vec![0.0; rows * cols],
        }
    }
}

/// The kernels [`run_kernel`] has an f64 reference for, in the order the
/// docs list them: the only kernels a workload file may call (the
/// resolver refuses the registry's others, whose results the file's check
/// could not judge).
pub(super) const CHECKED: [&str; 6] = [
    "add",
    "gemm_tile",
    "rmsnorm",
    "softmax",
    "route_topk",
    "expert_rows",
];

/// Runs kernel `name` in f64 on its (contract-checked) arguments and
/// returns the new value of each argument it writes, in argument order
/// (`None` for the ones it only reads). Each value comes with a bound on
/// the distance of the kernel's f32 result from it, given the inputs'
/// bounds; the operation order is that of `kernels/src/*.cpp`. A kernel
/// not in [`CHECKED`] (which the resolver refuses) is an error.
pub(super) fn run_kernel(
    name: &str,
    a: &[Tile],
    scalars: &[u64],
    note: &mut dyn FnMut(String),
) -> Result<Vec<Option<Tile>>, String> {
    let f32_scalar = |s: u64| f32::from_bits(s as u32) as f64;
    Ok(match name {
        "add" => vec![None, None, Some(add(&a[0], &a[1]))],
        "gemm_tile" => vec![None, None, Some(gemm(&a[0], &a[1], &a[2]))],
        "rmsnorm" => vec![
            None,
            None,
            Some(rmsnorm(&a[0], &a[1], f32_scalar(scalars[0]))),
        ],
        "softmax" => vec![None, Some(softmax(&a[0]))],
        "expert_rows" => vec![
            None,
            None,
            None,
            Some(expert_rows(&a[0], &a[1], &a[2], &a[3])),
        ],
        "route_topk" => {
            let (indptr, tokens, weights) = route_topk(
                &a[0],
                a[1].cols,
                a[2].cols,
                scalars[0] as usize,
                f32_scalar(scalars[1]),
                note,
            )?;
            vec![None, Some(indptr), Some(tokens), Some(weights)]
        }
        // Every name of `CHECKED` has its arm above (the unit test below
        // runs each); the resolver refuses any other kernel.
        other => return Err(format!("kernel {other} has no f64 reference")),
    })
}

/// c = a + b: one rounding.
fn add(a: &Tile, b: &Tile) -> Tile {
    let mut c = Tile::new(a.rows, a.cols);
    for i in 0..a.v.len() {
        c.v[i] = a.v[i] + b.v[i];
        let mag = a.v[i].abs() + a.e[i] + b.v[i].abs() + b.e[i];
        c.e[i] = a.e[i] + b.e[i] + U * mag;
    }
    c
}

/// c += a x b, each c(i, j) accumulating its K products in increasing k:
/// gamma_(K+1) (|c| + sum |a b|).
fn gemm(a: &Tile, b: &Tile, c: &Tile) -> Tile {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut out = Tile::new(m, n);
    let g = gamma(k + 1);
    for i in 0..m {
        for j in 0..n {
            let at = i * n + j;
            let (mut v, mut prop, mut mag) = (c.v[at], c.e[at], c.v[at].abs() + c.e[at]);
            for p in 0..k {
                let (x, ex) = (a.v[i * k + p], a.e[i * k + p]);
                let (y, ey) = (b.v[p * n + j], b.e[p * n + j]);
                v += x * y;
                prop += x.abs() * ey + y.abs() * ex + ex * ey;
                mag += (x.abs() + ex) * (y.abs() + ey);
            }
            out.v[at] = v;
            out.e[at] = prop + g * mag;
        }
    }
    out
}

/// out += gate * (x @ w) per row: gamma_(H+2) (|out| + |gate| sum |x w|).
fn expert_rows(x: &Tile, w: &Tile, gate: &Tile, out: &Tile) -> Tile {
    let (r, h, f) = (x.rows, x.cols, w.cols);
    let mut o = Tile::new(r, f);
    let g = gamma(h + 2);
    for i in 0..r {
        let (gv, ge) = (gate.v[i], gate.e[i]);
        for j in 0..f {
            let at = i * f + j;
            let (mut y, mut prop, mut mag) = (0.0, 0.0, 0.0);
            for p in 0..h {
                let (xv, xe) = (x.v[i * h + p], x.e[i * h + p]);
                let (wv, we) = (w.v[p * f + j], w.e[p * f + j]);
                y += xv * wv;
                prop += xv.abs() * we + wv.abs() * xe + xe * we;
                mag += (xv.abs() + xe) * (wv.abs() + we);
            }
            o.v[at] = out.v[at] + gv * y;
            o.e[at] = out.e[at]
                + gv.abs() * prop
                + ge * mag
                + g * (out.v[at].abs() + out.e[at] + (gv.abs() + ge) * mag);
        }
    }
    o
}

/// y = x / sqrt(mean(x^2) + eps) * g per row: the sum of squares, the
/// mean, + eps, sqrt, divide and scale round to gamma_(n+6) |y| at most.
fn rmsnorm(x: &Tile, gamma_row: &Tile, eps: f64) -> Tile {
    let (rows, n) = (x.rows, x.cols);
    let mut y = Tile::new(rows, n);
    let g = gamma(n + 6);
    for r in 0..rows {
        let row = &x.v[r * n..(r + 1) * n];
        let errs = &x.e[r * n..(r + 1) * n];
        let ms = row.iter().map(|v| v * v).sum::<f64>() / n as f64;
        let rms = (ms + eps).sqrt();
        // d y_i / d x_j = g_i / rms (delta_ij - x_i x_j / (n rms^2)).
        let q =
            row.iter().zip(errs).map(|(v, e)| v.abs() * e).sum::<f64>() / (n as f64 * rms * rms);
        for i in 0..n {
            let (xv, xe) = (row[i], errs[i]);
            let (gv, ge) = (gamma_row.v[i], gamma_row.e[i]);
            let v = xv / rms * gv;
            y.v[r * n + i] = v;
            y.e[r * n + i] =
                gv.abs() / rms * (xe + xv.abs() * q) + xv.abs() / rms * ge + g * v.abs();
        }
    }
    y
}

/// A softmax row and its bounds: per element, the exp's error (1e-6 plus
/// the rounding of x - max, u |x - max|), the sum's and the divide's, and
/// the inputs' bounds carried through (d y_i = y_i (dx_i - sum_j y_j dx_j)).
fn softmax_row(x: &[f64], ex: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let n = x.len();
    let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = x.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    let y: Vec<f64> = e.iter().map(|v| v / s).collect();
    let delta: Vec<f64> = x.iter().map(|v| EXP_REL + U * (v - m).abs()).collect();
    let max_delta = delta.iter().copied().fold(0.0, f64::max);
    let carried: f64 = y.iter().zip(ex).map(|(y, e)| y * e).sum();
    let bounds = (0..n)
        .map(|i| y[i] * (delta[i] + max_delta + gamma(n + 1) + ex[i] + carried) + TINY)
        .collect();
    (y, bounds)
}

fn softmax(x: &Tile) -> Tile {
    let n = x.cols;
    let mut y = Tile::new(x.rows, n);
    for r in 0..x.rows {
        let (v, e) = softmax_row(&x.v[r * n..(r + 1) * n], &x.e[r * n..(r + 1) * n]);
        y.v[r * n..(r + 1) * n].copy_from_slice(&v);
        y.e[r * n..(r + 1) * n].copy_from_slice(&e);
    }
    y
}

/// route_topk (see `kernels/src/route_topk.cpp`): per token the softmax,
/// k picks of the largest p (lowest index on ties), later picks dropped
/// under the threshold, weights p / (sum of the kept p); CSR by expert,
/// zeros after the last entry. A decision whose margin is within the f32
/// router's error (p's bounds) is noted: the f32 router may decide it the
/// other way, and then the check fails on the CSR outputs.
///
/// Refused, naming the value (the kernel's contract refuses them before a
/// call gets here): `k` outside 1 ..= experts, a threshold outside
/// [0, 1), an indptr of other than experts + 1 columns, and fewer than
/// tokens x k slots.
fn route_topk(
    logits: &Tile,
    indptr_cols: usize,
    slots: usize,
    k: usize,
    threshold: f64,
    note: &mut dyn FnMut(String),
) -> Result<(Tile, Tile, Tile), String> {
    let (tokens, experts) = (logits.rows, logits.cols);
    crate::reference::check_topk(experts, k, threshold).map_err(|e| format!("route_topk: {e}"))?;
    if indptr_cols != experts + 1 {
        return Err(format!(
            "route_topk: indptr has {indptr_cols} columns, not experts + 1 = {}",
            experts + 1
        ));
    }
    // Every token keeps at most k experts.
    if tokens.checked_mul(k).is_none_or(|n| n > slots) {
        return Err(format!(
            "route_topk: {slots} slots cannot hold {tokens} tokens x top-{k}"
        ));
    }
    // Per token, the kept experts with their weight and its bound.
    let mut kept: Vec<Vec<(usize, f64, f64)>> = Vec::new();
    let mut unclear = Vec::new();
    for t in 0..tokens {
        let row = t * experts..(t + 1) * experts;
        let (p, pb) = softmax_row(&logits.v[row.clone()], &logits.e[row]);
        let mut free = vec![true; experts];
        let mut picks = Vec::new();
        for i in 0..k {
            let mut best = None::<usize>;
            for e in 0..experts {
                if free[e] && best.is_none_or(|b| p[e] > p[b]) {
                    best = Some(e);
                }
            }
            // i < k <= experts (checked above): an expert is still free.
            let best = best.ok_or_else(|| format!("route_topk: no expert left for pick {i}"))?;
            free[best] = false;
            if let Some(other) = (0..experts)
                .filter(|&e| free[e])
                .max_by(|&a, &b| p[a].total_cmp(&p[b]).then(b.cmp(&a)))
            {
                if p[best] - p[other] <= pb[best] + pb[other] {
                    unclear.push(format!(
                        "token {t}: pick {i} expert {best} (p {:.6}) vs expert {other} (p {:.6})",
                        p[best], p[other]
                    ));
                }
            }
            let keep = i == 0 || p[best] >= threshold;
            if i > 0 && threshold > 0.0 && (p[best] - threshold).abs() <= pb[best] {
                unclear.push(format!(
                    "token {t}: expert {best} p {:.6} vs threshold {threshold}",
                    p[best]
                ));
            }
            if keep {
                picks.push(best);
            }
        }
        let s: f64 = picks.iter().map(|&e| p[e]).sum();
        let s_rel: f64 = picks.iter().map(|&e| pb[e]).sum::<f64>() / s;
        kept.push(
            picks
                .iter()
                .map(|&e| {
                    let w = p[e] / s;
                    let bound = w * (pb[e] / p[e] + s_rel + gamma(picks.len() + 1)) + TINY;
                    (e, w, bound)
                })
                .collect(),
        );
    }
    if !unclear.is_empty() {
        note(format!(
            "{} routing decisions are within the f32 router's error of a tie or the \
             threshold, so the device may decide them otherwise: {}",
            unclear.len(),
            unclear.join("; ")
        ));
    }
    let mut indptr = Tile::new(1, indptr_cols);
    let mut toks = Tile::new(1, slots);
    let mut weights = Tile::new(1, slots);
    let mut pos = 0;
    for e in 0..experts {
        for (t, picks) in kept.iter().enumerate() {
            if let Some(&(_, w, b)) = picks.iter().find(|p| p.0 == e) {
                toks.v[pos] = t as f64;
                weights.v[pos] = w;
                weights.e[pos] = b;
                pos += 1;
            }
        }
        indptr.v[e + 1] = pos as f64;
    }
    Ok((indptr, toks, weights))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel a file may call is in the registry and has a reference
    /// that returns a value for exactly the arguments the registry says it
    /// writes; any other name is an error, not a panic.
    #[test]
    fn every_checked_kernel_has_a_reference() {
        let tiles = |shapes: &[(usize, usize)]| -> Vec<Tile> {
            shapes.iter().map(|&(r, c)| Tile::new(r, c)).collect()
        };
        // Small arguments that fit each kernel's contract, and its scalars.
        let f32_bits = |v: f32| v.to_bits() as u64;
        let cases: [(&str, Vec<Tile>, Vec<u64>); 6] = [
            ("add", tiles(&[(1, 2), (1, 2), (1, 2)]), vec![]),
            ("gemm_tile", tiles(&[(1, 1), (1, 1), (1, 1)]), vec![]),
            (
                "rmsnorm",
                tiles(&[(1, 2), (1, 2), (1, 2)]),
                vec![f32_bits(1e-5)],
            ),
            ("softmax", tiles(&[(1, 2), (1, 2)]), vec![]),
            (
                "route_topk",
                tiles(&[(1, 2), (1, 3), (1, 1), (1, 1)]),
                vec![1, f32_bits(0.0)],
            ),
            (
                "expert_rows",
                tiles(&[(1, 1), (1, 1), (1, 1), (1, 1)]),
                vec![],
            ),
        ];
        let names: Vec<&str> = cases.iter().map(|c| c.0).collect();
        assert_eq!(names, CHECKED);
        for (name, args, scalars) in &cases {
            let info = wsp_ffi::all()
                .iter()
                .find(|k| k.name == *name)
                .unwrap_or_else(|| panic!("{name} is not in the registry"));
            let out = run_kernel(name, args, scalars, &mut |_| {}).unwrap();
            let written: Vec<bool> = out.iter().map(Option::is_some).collect();
            let writes: Vec<bool> = info.tensor_args.iter().map(|a| a.access.writes()).collect();
            assert_eq!(written, writes, "{name}");
        }
        let e = run_kernel("square", &tiles(&[(1, 1), (1, 1)]), &[], &mut |_| {})
            .err()
            .unwrap();
        assert_eq!(e, "kernel square has no f64 reference");
    }

    /// route_topk's reference refuses arguments its contract would have
    /// refused with an error naming them, not a panic.
    #[test]
    fn route_topk_refuses_arguments_outside_its_contract() {
        let f32_bits = |v: f32| v.to_bits() as u64;
        // Logits of `tokens` x `experts`, indptr of `cols`, `slots` slots.
        let run = |tokens: usize, experts: usize, cols: usize, slots: usize, k: u64, t: f32| {
            let args = [
                Tile::new(tokens, experts),
                Tile::new(1, cols),
                Tile::new(1, slots),
                Tile::new(1, slots),
            ];
            run_kernel("route_topk", &args, &[k, f32_bits(t)], &mut |_| {})
        };
        // 1 token over 2 experts, indptr of 2 + 1 = 3, k = 1 in 1 slot: fine.
        assert!(run(1, 2, 3, 1, 1, 0.0).is_ok());
        let why = |r: Result<Vec<Option<Tile>>, String>| r.err().unwrap();
        // k = 3 picks more experts than the 2 there are (the old code's
        // `expect`); k = 0 picks none.
        assert_eq!(
            why(run(1, 2, 3, 3, 3, 0.0)),
            "route_topk: top-k = 3 must be in 1..=2 (the experts)"
        );
        assert_eq!(
            why(run(1, 2, 3, 1, 0, 0.0)),
            "route_topk: top-k = 0 must be in 1..=2 (the experts)"
        );
        assert_eq!(
            why(run(1, 2, 3, 1, 1, 1.0)),
            "route_topk: threshold = 1 must be in [0, 1)"
        );
        // indptr needs 2 + 1 = 3 columns, not 2.
        assert_eq!(
            why(run(1, 2, 2, 1, 1, 0.0)),
            "route_topk: indptr has 2 columns, not experts + 1 = 3"
        );
        // 3 tokens x top-2 = 6 entries, but 5 slots.
        assert_eq!(
            why(run(3, 2, 3, 5, 2, 0.0)),
            "route_topk: 5 slots cannot hold 3 tokens x top-2"
        );
    }
}
