//! Neural-network layers, parameters and losses.

mod layers;
mod loss;
mod modules;
mod params;
mod transformer;

pub use layers::{Conv2d, Conv2dConfig, Dropout, Embedding, LayerNorm, Linear, Module, RmsNorm};
pub use loss::{cross_entropy, cross_entropy_with, mse};
pub use modules::{
    Activation, AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Flatten, GroupNorm, MaxPool2d,
    Sequential,
};
pub use params::{Init, ParamStore, Parameter, Path};
pub use transformer::{CausalSelfAttention, LayerCache, Mlp};
