//! The user-facing tensor: a value on a device plus what autograd needs.

use std::panic::Location;
use std::sync::{Arc, Mutex};

use ndarray::ArrayD;
use tpu_core::host::HostTensor;
use tpu_core::op::{Attrs, registry};
use tpu_core::profile;
use tpu_core::stablehlo::TensorType;
use tpu_core::{DType, Device, Element, HostBuffer, Shape};

use crate::autograd::{self, Node, Saved};
use crate::error::{Error, Result};

struct Inner {
    value: tpu_core::Tensor,
    requires_grad: bool,
    grad_fn: Option<(Arc<Node>, usize)>,
    grad: Mutex<Option<tpu_core::Tensor>>,
}

/// A tensor on `cpu` or `tpu:N`. Cheap to clone; clones share value,
/// gradient and history.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<Inner>,
}

impl Tensor {
    fn wrap(
        value: tpu_core::Tensor,
        requires_grad: bool,
        grad_fn: Option<(Arc<Node>, usize)>,
    ) -> Tensor {
        Tensor {
            inner: Arc::new(Inner {
                value,
                requires_grad,
                grad_fn,
                grad: Mutex::new(None),
            }),
        }
    }

    /// A tensor with no history around a core tensor.
    pub fn from_core(value: tpu_core::Tensor) -> Tensor {
        Tensor::wrap(value, false, None)
    }

    /// The core tensor (value and device) behind this one.
    pub fn value(&self) -> &tpu_core::Tensor {
        &self.inner.value
    }

    // ---- Creation. ----

    /// A tensor from a slice and a shape.
    pub fn from_slice<T: Element>(
        data: &[T],
        shape: impl Into<Shape>,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        if data.len() != shape.numel() {
            return Err(tpu_core::Error::InvalidInput {
                kind: tpu_core::op::OpErrorKind::Invalid,
                op: "from_slice".into(),
                inputs: format!("{} {} values", data.len(), T::DTYPE),
                device: device.to_string(),
                reason: format!("shape {shape} holds {} elements", shape.numel()),
            }
            .into());
        }
        let host = HostBuffer::from_slice(data, shape)?;
        Tensor::from_host(HostTensor::from_buffer(&host), device)
    }

    /// A tensor from a vector and a shape.
    pub fn from_vec<T: Element>(
        data: Vec<T>,
        shape: impl Into<Shape>,
        device: Device,
    ) -> Result<Tensor> {
        Tensor::from_slice(&data, shape, device)
    }

    /// A tensor from host values.
    pub fn from_host(host: HostTensor, device: Device) -> Result<Tensor> {
        Ok(Tensor::from_core(tpu_core::Tensor::from_host(
            host, device,
        )?))
    }

    /// A rank-0 tensor.
    pub fn scalar(value: f64, dtype: DType, device: Device) -> Result<Tensor> {
        // Device scalars are shared: `x * 0.5` in a loop uploads 0.5 once.
        Ok(Tensor::from_core(tpu_core::scalars::scalar(
            dtype, value, device,
        )?))
    }

    /// A tensor of `shape` filled with `value`.
    pub fn full(
        shape: impl Into<Shape>,
        value: f64,
        dtype: DType,
        device: Device,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let attrs = Attrs::new()
            .with("shape", shape.dims())
            .with("dtype", dtype)
            .with("value", value);
        Tensor::create("full", attrs, device)
    }

    /// Zeros.
    pub fn zeros(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    /// Ones.
    pub fn ones(shape: impl Into<Shape>, dtype: DType, device: Device) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Ones shaped like `self`.
    pub fn ones_like(&self) -> Result<Tensor> {
        Tensor::ones(self.shape().clone(), self.dtype(), self.device())
    }

    /// Zeros shaped like `self`.
    pub fn zeros_like(&self) -> Result<Tensor> {
        Tensor::zeros(self.shape().clone(), self.dtype(), self.device())
    }

    pub(crate) fn zeros_of(t: &tpu_core::Tensor) -> Result<Tensor> {
        Tensor::zeros(t.shape().clone(), t.dtype(), t.device())
    }

    /// A tensor from a creation op (no inputs) on `device`.
    #[track_caller]
    pub fn create(op: &str, attrs: Attrs, device: Device) -> Result<Tensor> {
        crate::link();
        let mut out = tpu_core::policy::call(op, &[], &attrs, Some(device))?;
        Ok(Tensor::from_core(out.remove(0)))
    }

    /// A tensor from an `ndarray` array.
    pub fn from_ndarray<T: Element>(array: &ArrayD<T>, device: Device) -> Result<Tensor> {
        let shape = Shape::from(array.shape());
        match array.as_slice() {
            Some(s) => Tensor::from_slice(s, shape, device),
            None => Tensor::from_vec(array.iter().copied().collect(), shape, device),
        }
    }

    // ---- Properties. ----

    /// Dtype and shape.
    pub fn ty(&self) -> &TensorType {
        self.inner.value.ty()
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.inner.value.dtype()
    }

    /// Shape.
    pub fn shape(&self) -> &Shape {
        self.inner.value.shape()
    }

    /// Dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape().dims()
    }

    /// Rank.
    pub fn rank(&self) -> usize {
        self.shape().rank()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape().numel()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.inner.value.device()
    }

    // ---- Moving data. ----

    /// The values in host memory.
    #[track_caller]
    pub fn to_host(&self) -> Result<HostTensor> {
        Ok(self.inner.value.to_host()?)
    }

    /// The values as a vector; `T` must match the dtype.
    #[track_caller]
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        Ok(self.to_host()?.to_buffer().to_vec::<T>()?)
    }

    /// The values as f64, whatever the dtype.
    #[track_caller]
    pub fn to_f64_vec(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64().into_iter().collect())
    }

    /// The single value of a one-element tensor, as f64.
    #[track_caller]
    pub fn item(&self) -> Result<f64> {
        let v = self.to_f64_vec()?;
        match v.as_slice() {
            [x] => Ok(*x),
            _ => Err(Error::shape(
                "item",
                format!("needs a one-element tensor, got shape {}", self.shape()),
            )),
        }
    }

    /// The values as an `ndarray` array; `T` must match the dtype.
    #[track_caller]
    pub fn to_ndarray<T: Element>(&self) -> Result<ArrayD<T>> {
        let values = self.to_vec::<T>()?;
        ArrayD::from_shape_vec(self.dims(), values)
            .map_err(|e| Error::shape("to_ndarray", e.to_string()))
    }

    /// A copy on `device`; gradients flow back through the copy.
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        if device == self.device() {
            return Ok(self.clone());
        }
        let value = match (self.device(), device) {
            (Device::Tpu(_), Device::Tpu(to)) => {
                let buffer = self.inner.value.buffer()?;
                tpu_core::Tensor::from_buffer(buffer.copy_to_device(to)?)
            }
            _ => tpu_core::Tensor::from_host(self.to_host()?, device)?,
        };
        Ok(Tensor::wrap(
            value,
            self.requires_grad() && autograd::is_grad_enabled(),
            None,
        ))
    }

    // ---- Autograd. ----

    /// True when gradients flow to (or through) this tensor.
    pub fn requires_grad(&self) -> bool {
        self.inner.requires_grad
    }

    /// A leaf sharing this value that collects gradients (`true`) or not.
    pub fn with_requires_grad(&self, requires_grad: bool) -> Tensor {
        Tensor::wrap(self.inner.value.clone(), requires_grad, None)
    }

    /// The same value without history.
    pub fn detach(&self) -> Tensor {
        self.with_requires_grad(false)
    }

    /// The gradient accumulated by `backward()`, if any.
    pub fn grad(&self) -> Option<Tensor> {
        self.inner
            .grad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .map(Tensor::from_core)
    }

    /// Forgets the accumulated gradient.
    pub fn zero_grad(&self) {
        *self.inner.grad.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Backpropagates from this scalar: leaves that require grad accumulate
    /// their gradients. Profile traces attribute its ops to the caller.
    #[track_caller]
    pub fn backward(&self) -> Result<()> {
        profile::at(Location::caller(), || autograd::backward(self, None))
    }

    /// Backpropagates with an explicit incoming gradient (for non-scalars).
    #[track_caller]
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        if grad.shape() != self.shape() {
            return Err(Error::shape(
                "backward",
                format!(
                    "gradient of shape {} for a tensor of shape {}",
                    grad.shape(),
                    self.shape()
                ),
            ));
        }
        profile::at(Location::caller(), || autograd::backward(self, Some(grad)))
    }

    /// Replaces the accumulated gradient.
    pub fn set_grad(&self, grad: Tensor) {
        *self.inner.grad.lock().unwrap_or_else(|e| e.into_inner()) = Some(grad.inner.value.clone());
    }

    pub(crate) fn grad_fn(&self) -> Option<(Arc<Node>, usize)> {
        self.inner.grad_fn.clone()
    }

    pub(crate) fn accumulate_grad(&self, g: tpu_core::Tensor) -> Result<()> {
        let mut slot = self.inner.grad.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(match slot.take() {
            Some(acc) => autograd::add(&acc, &g)?,
            None => g,
        });
        Ok(())
    }

    // ---- Ops. ----

    /// Calls any registered op on `inputs`, recording it for autograd when
    /// an input requires grad.
    #[track_caller]
    pub fn apply(op: &str, inputs: &[&Tensor], attrs: Attrs) -> Result<Vec<Tensor>> {
        crate::link();
        if let Some(cast) = crate::amp::cast_inputs(op, inputs)? {
            return Tensor::apply(op, &cast.iter().collect::<Vec<_>>(), attrs);
        }
        let values: Vec<tpu_core::Tensor> = inputs.iter().map(|t| t.inner.value.clone()).collect();
        let outputs = tpu_core::policy::call(op, &values, &attrs, None)?;
        let record = autograd::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        let def = registry()?.get(op)?;
        if !record || def.vjp.is_none() {
            return Ok(outputs.into_iter().map(Tensor::from_core).collect());
        }
        let node = Arc::new(Node {
            op: def,
            attrs,
            num_outputs: outputs.len(),
            saved: Mutex::new(Some(Saved {
                inputs: inputs.iter().map(|t| (*t).clone()).collect(),
                outputs: outputs.clone(),
            })),
        });
        Ok(outputs
            .into_iter()
            .enumerate()
            .map(|(i, v)| {
                let float = v.dtype().is_inexact();
                Tensor::wrap(v, float, float.then(|| (node.clone(), i)))
            })
            .collect())
    }

    /// [`Tensor::apply`] for single-output ops.
    #[track_caller]
    pub fn apply1(op: &str, inputs: &[&Tensor], attrs: Attrs) -> Result<Tensor> {
        let mut outs = Tensor::apply(op, inputs, attrs)?;
        if outs.len() != 1 {
            return Err(Error::shape(
                op,
                format!("returned {} outputs where one was expected", outs.len()),
            ));
        }
        Ok(outs.remove(0))
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor({} on {}", self.ty(), self.device())?;
        if self.requires_grad() {
            write!(f, ", requires_grad")?;
        }
        write!(f, ")")
    }
}
