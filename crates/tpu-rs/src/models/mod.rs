//! Ready-made models.

mod gpt;

pub use gpt::{Gpt, GptConfig};
