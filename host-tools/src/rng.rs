//! SplitMix64: a small seeded generator for reproducible inputs.

/// The generator's state: one `u64`, advanced by a fixed odd step per draw.
/// The same seed gives the same sequence on every platform.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

/// What one draw adds to the state.
const STEP: u64 = 0x9E37_79B9_7F4A_7C15;

impl SplitMix64 {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(STEP);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Skips `n` draws at once: each adds `STEP` to the state, so `n`
    /// of them add `n * STEP` (mod 2^64).
    pub fn skip(&mut self, n: u64) {
        self.0 = self.0.wrapping_add(STEP.wrapping_mul(n));
    }

    /// Uniform in `[-1, 1)` with 24 random bits (exact in f32).
    pub fn unit_f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// `n` values of [`SplitMix64::unit_f32`], in draw order.
    pub fn fill(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.unit_f32()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::SplitMix64;

    /// A skip of `n` leaves the generator where `n` draws one at a time do.
    #[test]
    fn a_skip_is_that_many_draws() {
        for seed in [0, 1, 0x9E37_79BA, u64::MAX] {
            for n in (0..=64).chain([1000, 65_537]) {
                let mut drawn = SplitMix64::new(seed);
                for _ in 0..n {
                    drawn.next_u64();
                }
                let mut skipped = SplitMix64::new(seed);
                skipped.skip(n);
                for _ in 0..4 {
                    assert_eq!(
                        skipped.next_u64(),
                        drawn.next_u64(),
                        "seed {seed}, skip {n}"
                    );
                }
            }
        }
    }
}
