//! f64 reference implementations of the kernels' math, on row-major data.

/// `a` (m x k) times `b` (k x n), plus the per-element sum of |a_ik * b_kj|
/// that bounds the rounding error of an f32 evaluation.
pub fn gemm(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
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

pub fn add(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x + y).collect()
}

/// Row-wise `x / sqrt(mean(x^2) + eps) * g` over rows of `cols` elements.
pub fn rmsnorm(x: &[f64], g: &[f64], cols: usize, eps: f64) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let ms = row.iter().map(|v| v * v).sum::<f64>() / cols as f64;
            let inv = 1.0 / (ms + eps).sqrt();
            row.iter().zip(g).map(move |(v, w)| v * inv * w)
        })
        .collect()
}

/// Row-wise softmax over rows of `cols` elements.
pub fn softmax(x: &[f64], cols: usize) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / sum)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn small_cases_by_hand() {
        let (c, abs) = super::gemm(&[1.0, 2.0, 3.0, 4.0], &[1.0, -1.0, 0.5, 2.0], 2, 2, 2);
        assert_eq!(c, vec![2.0, 3.0, 5.0, 5.0]);
        assert_eq!(abs, vec![2.0, 5.0, 5.0, 11.0]);
        let s = super::softmax(&[0.0, 0.0], 2);
        assert_eq!(s, vec![0.5, 0.5]);
        let r = super::rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 2, 0.0);
        let inv = 1.0 / 12.5f64.sqrt();
        assert_eq!(r, vec![3.0 * inv, 8.0 * inv]);
    }
}
