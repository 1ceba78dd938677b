//! Initial weights: PyTorch's default distributions, drawn from ChaCha8
//! words turned into floats here, so that they stay the same across `rand`
//! releases (pinned by a test).

use rand::RngCore;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A uniform f32 in `[0, 1)` from 24 random bits, exactly: ChaCha8 words
/// turned into floats here, not by `rand`'s distributions, so the values
/// stay the same across `rand` releases.
pub fn unit_f32(rng: &mut ChaCha8Rng) -> f32 {
    (rng.next_u32() >> 8) as f32 / (1u32 << 24) as f32
}

/// PyTorch's default distributions for `Conv2d` and `Linear`: weights
/// (kaiming-uniform with a = √5) and biases uniform in ±1/√fan_in, drawn
/// from one ChaCha8 stream seeded with `seed`, tensor after tensor; each
/// tensor is `(element count, fan_in)`.
pub fn pytorch_default_init(seed: u64, tensors: &[(usize, usize)]) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut params = Vec::with_capacity(tensors.iter().map(|t| t.0).sum());
    for &(count, fan_in) in tensors {
        let bound = 1.0 / (fan_in as f32).sqrt();
        params.extend((0..count).map(|_| (2.0 * unit_f32(&mut rng) - 1.0) * bound));
    }
    params
}
