//! Random numbers without handling keys: a process-wide [`Generator`]
//! ([`manual_seed`] resets it) hands each draw a fresh key, so
//! `Tensor::randn([2, 3], DType::F32, device)` is PyTorch's `torch.randn`.
//! The same seed gives the same numbers in every eager mode and on every
//! device (the draws are the explicit-key ops, [`Tensor::normal`] and
//! friends, which compute the same bits everywhere); PyTorch's own
//! generator gives other numbers.

use std::sync::Mutex;

use tpu_core::{DType, Device, Shape};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// PyTorch's default seed, so an unseeded process is reproducible too.
const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// A stream of keys: each draw's key is a hash of the seed and the draw's
/// number, so streams from different seeds (or [`Generator::split`]s) do
/// not overlap in practice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    drawn: u64,
}

impl Generator {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Generator {
        Generator { seed, drawn: 0 }
    }

    /// The next draw's key (a `u32[2]` tensor on `device`).
    pub fn key(&mut self, device: Device) -> Result<Tensor> {
        Tensor::random_key(self.next_u64(), device)
    }

    /// A generator of its own, seeded from this one's next draw: the two
    /// streams are independent (JAX's key splitting, on the host).
    pub fn split(&mut self) -> Generator {
        Generator::new(self.next_u64())
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.drawn += 1;
        splitmix(self.seed ^ splitmix(self.drawn))
    }
}

/// SplitMix64's finalizer: a bijective mix of the bits of `x`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

static GLOBAL: Mutex<Generator> = Mutex::new(Generator {
    seed: DEFAULT_SEED,
    drawn: 0,
});

/// Reseeds the process-wide generator, as `torch.manual_seed` does.
pub fn manual_seed(seed: u64) {
    *GLOBAL.lock().unwrap_or_else(|e| e.into_inner()) = Generator::new(seed);
}

/// The next key of the process-wide generator.
fn next_key(device: Device) -> Result<Tensor> {
    GLOBAL.lock().unwrap_or_else(|e| e.into_inner()).key(device)
}

impl Tensor {
    /// Standard normal values from the process-wide generator.
    #[track_caller]
    pub fn randn(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::normal(&next_key(device)?, shape, dtype, 0.0, 1.0)
    }

    /// Uniform values in `[0, 1)` from the process-wide generator.
    #[track_caller]
    pub fn rand(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::uniform(&next_key(device)?, shape, dtype, 0.0, 1.0)
    }

    /// Integers in `[low, high)`, each equally likely, as `i64`, from the
    /// process-wide generator. The range may hold at most 2^24 values (the
    /// draw is a float32 uniform).
    #[track_caller]
    pub fn randint(low: i64, high: i64, shape: impl Into<Shape>, device: Device) -> Result<Tensor> {
        Tensor::randint_with(&next_key(device)?, low, high, shape)
    }

    /// [`Tensor::randint`] drawn from `key`.
    #[track_caller]
    pub fn randint_with(
        key: &Tensor,
        low: i64,
        high: i64,
        shape: impl Into<Shape>,
    ) -> Result<Tensor> {
        let span = high
            .checked_sub(low)
            .filter(|&n| (1..=1 << 24).contains(&n));
        let Some(span) = span else {
            return Err(Error::shape(
                "randint",
                format!("the range [{low}, {high}) must hold 1 to 2^24 values"),
            ));
        };
        // floor(u * span) for u in [0, 1); the clamp guards the top value
        // against a product rounded up to `span`.
        let u = Tensor::uniform(key, shape, DType::F32, 0.0, 1.0)?;
        let picks = u.scale(span as f64)?.floor()?.to_dtype(DType::I64)?;
        picks
            .clamp(Some(0.0), Some((span - 1) as f64))?
            .add_scalar(low as f64)
    }

    /// `true` with probability `p`, from the process-wide generator.
    #[track_caller]
    pub fn rand_bernoulli(shape: impl Into<Shape>, p: f64, device: Device) -> Result<Tensor> {
        Tensor::bernoulli(&next_key(device)?, shape, p)
    }
}
