//! The model kernels: `rope` against rotation written here in f64, `copy`
//! exactly, and their rejections.

use super::*;

/// The rotation of head `x` (D elements) by cos `c` and sin `s` per
/// frequency, in f64: the half-split pairing.
fn rotate(x: &[f64], c: &[f64], s: &[f64]) -> Vec<f64> {
    let h = x.len() / 2;
    let mut y = vec![0.0; x.len()];
    for i in 0..h {
        y[i] = x[i] * c[i] - x[i + h] * s[i];
        y[i + h] = x[i + h] * c[i] + x[i] * s[i];
    }
    y
}

/// `rope` of `n` heads of `d` given as one row (`one_row`) or as rows,
/// against [`rotate`]: each output is `a c - b s` in f32, two products and
/// a difference, so within 3u of the exact value relative to |a c| + |b s|.
fn check_rope(n: u32, d: u32, one_row: bool, seed: u64) {
    let mut rng = Lcg(seed);
    let x = if one_row {
        Mat::random(1, n * d, n * d + 3, &mut rng, -2.0, 2.0)
    } else {
        Mat::random(n, d, d + 5, &mut rng, -2.0, 2.0)
    };
    let pos = 1000.0 + seed as f64;
    let half = (d / 2) as usize;
    let angle = |i: usize| pos * 10000f64.powf(-(2.0 * i as f64) / d as f64);
    let cs = Mat::new(1, d, d, |_, j| {
        if j < half {
            angle(j).cos() as f32
        } else {
            angle(j - half).sin() as f32
        }
    });
    let mut m = [x, cs, Mat::zeros(n, d, d + 1)];
    let cycles = run(ROPE, &mut m, &[]).unwrap();
    assert_eq!(cycles, u64::from(n * 5 * d + d));
    let c: Vec<f64> = (0..half).map(|i| f64::from(m[1].get(0, i))).collect();
    let s: Vec<f64> = (0..half)
        .map(|i| f64::from(m[1].get(0, half + i)))
        .collect();
    let u = f64::from(f32::EPSILON) / 2.0;
    for h in 0..n as usize {
        let head: Vec<f64> = (0..d as usize)
            .map(|i| {
                f64::from(if one_row {
                    m[0].get(0, h * d as usize + i)
                } else {
                    m[0].get(h, i)
                })
            })
            .collect();
        let want = rotate(&head, &c, &s);
        for i in 0..d as usize {
            // y_i pairs element i with its partner across the halves.
            let (j, partner) = if i < half {
                (i, i + half)
            } else {
                (i - half, i - half)
            };
            let scale = head[i].abs() * c[j].abs() + head[partner].abs() * s[j].abs();
            let got = f64::from(m[2].get(h, i));
            assert!(
                (got - want[i]).abs() <= 3.0 * u * scale,
                "head {h} element {i}: {got} vs {}",
                want[i]
            );
        }
    }
    assert!(m.iter().all(Mat::gaps_untouched));
}

#[test]
fn rope_rotates_each_head() {
    check_rope(8, 64, true, 1);
    check_rope(2, 128, false, 2);
    check_rope(64, 2, true, 3);
    check_rope(1, 64, false, 4);
}

#[test]
fn rope_at_position_zero_is_the_identity() {
    // cos 0 = 1, sin 0 = 0: every element is exactly itself.
    let mut rng = Lcg(5);
    let x = Mat::random(4, 8, 8, &mut rng, -1.0, 1.0);
    let cs = Mat::new(1, 8, 8, |_, j| if j < 4 { 1.0 } else { 0.0 });
    let mut m = [x, cs, Mat::zeros(4, 8, 8)];
    run(ROPE, &mut m, &[]).unwrap();
    for r in 0..4 {
        for c in 0..8 {
            assert_eq!(m[2].get(r, c), m[0].get(r, c));
        }
    }
}

#[test]
fn rope_rejects_bad_shapes() {
    let shapes: [&[(u32, u32)]; 4] = [
        // 3 heads of 5: odd D.
        &[(3, 5), (1, 5), (3, 5)],
        // x of 2 rows of 6 for 3 heads of 4: neither layout.
        &[(2, 6), (1, 4), (3, 4)],
        // cs not D wide.
        &[(3, 4), (1, 6), (3, 4)],
        // 65 heads.
        &[(1, 130), (1, 2), (65, 2)],
    ];
    for dims in shapes {
        let mut m: Vec<Mat> = dims.iter().map(|&(r, c)| Mat::zeros(r, c, c)).collect();
        let (checked, result) = invoke(ROPE, &mut m, &[]);
        assert!(checked.is_err() && result.is_err(), "{dims:?}");
    }
}

#[test]
fn copy_moves_every_element_between_layouts() {
    let mut rng = Lcg(6);
    // A [8 x 64] view with stride 66 (the o of 8 attention states) into one
    // row of 512.
    let x = Mat::random(8, 64, 66, &mut rng, -1.0, 1.0);
    let mut m = [x, Mat::zeros(1, 512, 515)];
    assert_eq!(run(COPY, &mut m, &[]), Ok(2 * 512));
    for e in 0..512 {
        assert_eq!(m[1].get(0, e), m[0].get(e / 64, e % 64), "element {e}");
    }
    assert!(m.iter().all(Mat::gaps_untouched));
    // And back, [1 x 12] into [3 x 4] of stride 7.
    let x = Mat::random(1, 12, 12, &mut rng, -1.0, 1.0);
    let mut m = [x, Mat::zeros(3, 4, 7)];
    run(COPY, &mut m, &[]).unwrap();
    for e in 0..12 {
        assert_eq!(m[1].get(e / 4, e % 4), m[0].get(0, e));
    }
}

#[test]
fn copy_rejects_different_counts() {
    let mut m = [Mat::zeros(3, 4, 4), Mat::zeros(2, 5, 5)];
    let (checked, result) = invoke(COPY, &mut m, &[]);
    assert!(checked.is_err() && result.is_err());
    assert!(checked
        .unwrap_err()
        .to_string()
        .contains("tensor argument 0 holds 12 elements, tensor argument 1 10"));
}
