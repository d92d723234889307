//! Ready-made models.

mod generate;
mod gpt;

pub use generate::Sampling;
pub use gpt::{Gpt, GptConfig, KvCache};
