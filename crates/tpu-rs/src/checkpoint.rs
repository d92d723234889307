//! safetensors checkpoints of parameter stores, with PyTorch `state_dict`
//! names, so checkpoints move between tpu-rs and PyTorch.

use std::collections::BTreeMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, TensorView};
use tpu_core::{DType, HostBuffer, HostTensor, Shape};

use crate::error::{Error, Result};
use crate::nn::ParamStore;
use crate::optim::Optimizer;
use crate::tensor::Tensor;

/// The safetensors dtype of `d`; the format has no complex128 (PyTorch
/// refuses to save one too), so that is an error naming the tensor.
fn to_safetensors(d: DType, name: &str) -> Result<Dtype> {
    Ok(match d {
        DType::Bool => Dtype::BOOL,
        DType::I8 => Dtype::I8,
        DType::I16 => Dtype::I16,
        DType::I32 => Dtype::I32,
        DType::I64 => Dtype::I64,
        DType::U8 => Dtype::U8,
        DType::U32 => Dtype::U32,
        DType::F16 => Dtype::F16,
        DType::BF16 => Dtype::BF16,
        DType::F32 => Dtype::F32,
        DType::F64 => Dtype::F64,
        DType::C64 => Dtype::C64,
        DType::C128 => {
            return Err(Error::Io {
                path: name.to_string(),
                message: "safetensors has no complex128 dtype; save c64 or the parts".into(),
            });
        }
    })
}

fn from_safetensors(d: Dtype, name: &str) -> Result<DType> {
    Ok(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::I32 => DType::I32,
        Dtype::I64 => DType::I64,
        Dtype::U8 => DType::U8,
        Dtype::U32 => DType::U32,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::BF16,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::C64 => DType::C64,
        other => {
            return Err(Error::Io {
                path: name.to_string(),
                message: format!("unsupported safetensors dtype {other:?}"),
            });
        }
    })
}

fn io(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

/// Writes named tensors to a safetensors file.
pub fn save_tensors(tensors: &[(String, Tensor)], path: impl AsRef<Path>) -> Result<()> {
    let path = path.as_ref();
    let buffers: Vec<(String, HostBuffer)> = tensors
        .iter()
        .map(|(n, t)| Ok((n.clone(), t.to_host()?.to_buffer())))
        .collect::<Result<_>>()?;
    let views: Vec<(String, TensorView<'_>)> = buffers
        .iter()
        .map(|(n, b)| {
            TensorView::new(
                to_safetensors(b.dtype(), n)?,
                b.shape().dims().to_vec(),
                b.bytes(),
            )
            .map(|v| (n.clone(), v))
            .map_err(|e| io(path, e))
        })
        .collect::<Result<_>>()?;
    let bytes = safetensors::serialize(views, None).map_err(|e| io(path, e))?;
    std::fs::write(path, bytes).map_err(|e| io(path, e))
}

/// Reads every tensor of a safetensors file into host memory.
pub fn load_tensors(path: impl AsRef<Path>) -> Result<BTreeMap<String, HostTensor>> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io(path, e))?;
    let file = SafeTensors::deserialize(&bytes).map_err(|e| io(path, e))?;
    file.tensors()
        .into_iter()
        .map(|(name, view)| {
            let dtype = from_safetensors(view.dtype(), &name)?;
            let host =
                HostBuffer::from_bytes(view.data().to_vec(), dtype, Shape::from(view.shape()))?;
            Ok((name, HostTensor::from_buffer(&host)))
        })
        .collect()
}

/// Saves `optimizer`'s state ([`Optimizer::state`]): with [`save`] of the
/// parameters, what resuming training needs.
pub fn save_optimizer(optimizer: &dyn Optimizer, path: impl AsRef<Path>) -> Result<()> {
    save_tensors(&optimizer.state()?, path)
}

/// Restores `optimizer`'s state from a file [`save_optimizer`] wrote.
pub fn load_optimizer(optimizer: &mut dyn Optimizer, path: impl AsRef<Path>) -> Result<()> {
    optimizer.load_state(&load_tensors(path)?)
}

/// Saves every parameter of `store` under its name.
pub fn save(store: &ParamStore, path: impl AsRef<Path>) -> Result<()> {
    let tensors: Vec<(String, Tensor)> = store
        .parameters()
        .iter()
        .map(|p| (p.name().to_string(), p.get()))
        .collect();
    save_tensors(&tensors, path)
}

/// Loads a checkpoint into `store`: every parameter must be present with
/// its shape; values are converted to the store's dtype. Any mismatch is an
/// error listing every missing, unexpected and mis-shaped name, and nothing
/// is changed.
pub fn load(store: &ParamStore, path: impl AsRef<Path>) -> Result<()> {
    let tensors = load_tensors(path)?;
    let params = store.parameters();
    let mut missing = Vec::new();
    let mut mismatched = Vec::new();
    for p in &params {
        match tensors.get(p.name()) {
            None => missing.push(p.name().to_string()),
            Some(t) if t.shape() != *p.get().shape() => {
                mismatched.push(format!(
                    "{}: {} vs {}",
                    p.name(),
                    t.shape(),
                    p.get().shape()
                ));
            }
            Some(_) => {}
        }
    }
    let unexpected: Vec<String> = tensors
        .keys()
        .filter(|k| store.get(k).is_none())
        .cloned()
        .collect();
    if !missing.is_empty() || !mismatched.is_empty() || !unexpected.is_empty() {
        return Err(Error::Checkpoint {
            missing: missing.join(", "),
            unexpected: unexpected.join(", "),
            mismatched: mismatched.join(", "),
        });
    }
    for p in &params {
        if let Some(t) = tensors.get(p.name()) {
            let value = Tensor::from_host(t.cast(store.dtype()), store.device())?;
            p.set(&value);
        }
    }
    Ok(())
}
