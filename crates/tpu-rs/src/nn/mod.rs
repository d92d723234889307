//! Neural-network layers, parameters and losses.

mod layers;
mod loss;
mod params;
mod transformer;

pub use layers::{Conv2d, Dropout, Embedding, LayerNorm, Linear, Module, RmsNorm};
pub use loss::{cross_entropy, cross_entropy_with, mse};
pub use params::{Init, ParamStore, Parameter, Path};
pub use transformer::{CausalSelfAttention, LayerCache, Mlp};
