//! decode_plan: the chunk rule on hand-derived cases, run-time rejections
//! of bad lengths, and contract rejections agreeing with `check`.

use super::*;

/// The lengths as an i32 row.
fn lens(values: &[i32]) -> Mat {
    Mat::new(1, values.len() as u32, values.len() as u32, |_, c| {
        f32::from_bits(values[c] as u32)
    })
    .with_dtype(DTYPE_I32)
}

/// The chunk the kernel plans (and its cycles), or its rejection.
fn plan(
    values: &[i32],
    heads: u64,
    cores: u64,
    page: u64,
    item: u64,
    token: u64,
) -> Result<(i32, u64), KernelRejected> {
    let mut mats = [lens(values), Mat::zeros_i32(1, 1, 1)];
    let cycles = run(PLAN, &mut mats, &[heads, cores, page, item | token << 32])?;
    Ok((mats[1].get_i32(0, 0), cycles))
}

#[test]
fn decode_plan_picks_the_rules_chunk() {
    // One request of 1000 tokens, 1 head, 1 core, pages of 16, items of
    // 100 + 10 t cycles. lo = 128, hi = 1008. hi: 1 item, total 10,100,
    // largest 10,100: 8 x 10,100 > 10,100, no. lo: 8 items, total
    // 8 x 100 + 10,000 = 10,800, largest 100 + 1,280 = 1,380: 8 x 1,380 =
    // 11,040 > 10,800, no. So the smallest chunk, 128.
    assert_eq!(plan(&[1000], 1, 1, 16, 100, 10).unwrap().0, 128);
    // Eight requests of 4096, 8 heads, 9 cores, pages of 16, the same
    // items: c fits when 8 (100 + 10 c) 9 <= 8 (800 ceil(4096 / c) +
    // 327,680), i.e. 900 + 90 c <= 800 ceil(4096 / c) + 327,680. At
    // c = 3648 (2 chunks): 329,220 <= 329,280, yes; at 3664: 330,660, no;
    // every c from 2049 up has 2 chunks and a growing left side, and hi =
    // 4096 does not fit (1 chunk: 369,540 > 328,480). So 3648.
    let (chunk, cycles) = plan(&[4096; 8], 8, 9, 16, 100, 10).unwrap();
    assert_eq!(chunk, 3648);
    // Cost: B (probes + 1) + 1 with 2 + 8 probes (a search over 248
    // pages: hi - lo = 256 - 8 halves in 8 steps).
    assert_eq!(cycles, 8 * (10 + 1) + 1);
    // With 8 cores the whole length fits: 8 x 41,060 x 8 = 2,627,840 =
    // total. No request splits.
    assert_eq!(plan(&[4096; 8], 8, 8, 16, 100, 10).unwrap().0, 4096);
    // Pages of 256: the smallest chunk is one page (128 rounded up).
    assert_eq!(plan(&[1000], 1, 1, 256, 100, 10).unwrap().0, 256);
}

#[test]
fn decode_plan_rejects_bad_lengths_and_scalars() {
    // Lengths are data: 0, negative or past 2^24 reject at run time.
    for bad in [0, -5, (1 << 24) + 1] {
        let (checked, result) = invoke(
            PLAN,
            &mut [lens(&[7, bad]), Mat::zeros_i32(1, 1, 1)],
            &[1, 1, 16, 1],
        );
        assert!(checked.is_ok() && result.is_err(), "length {bad}");
    }
    // Scalars: the contract and the kernel agree (`run` asserts it).
    for scalars in [
        [0, 1, 16, 1],
        [257, 1, 16, 1],
        [1, 0, 16, 1],
        [1, 4097, 16, 1],
        [1, 1, 0, 1],
        [1, 1, 65537, 1],
        [1, 1, 16, 1 << 16],
        [1, 1, 16, 1 << 48],
    ] {
        let mut mats = [lens(&[100]), Mat::zeros_i32(1, 1, 1)];
        assert!(run(PLAN, &mut mats, &scalars).is_err(), "{scalars:?}");
    }
    // A plan of two cells, or f32 lengths: refused by both.
    let mut mats = [lens(&[100]), Mat::zeros_i32(1, 2, 2)];
    assert!(run(PLAN, &mut mats, &[1, 1, 16, 1]).is_err());
    let mut mats = [Mat::zeros(1, 1, 1), Mat::zeros_i32(1, 1, 1)];
    assert!(run(PLAN, &mut mats, &[1, 1, 16, 1]).is_err());
}
