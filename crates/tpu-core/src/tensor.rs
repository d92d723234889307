//! The tensor handle every layer above the runtime passes around: a type, a
//! device, and a value that is on the host, in a device buffer, or pending
//! in a policy's deferred graph.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::error::{Error, Result};
use crate::host::HostTensor;
use crate::op::OpErrorKind;
use crate::pjrt::Buffer;
use crate::policy::ExecutionPolicy;
use crate::stablehlo::TensorType;
use crate::{DType, Device, HostBuffer, Runtime, Shape};

/// A value not computed yet: the policy that will compute it, and its token
/// for it.
#[derive(Clone)]
pub struct Pending {
    /// The policy holding the deferred computation.
    pub policy: Arc<dyn ExecutionPolicy>,
    /// What the policy knows the value by.
    pub token: u64,
}

/// Where a tensor's value is.
#[derive(Clone)]
pub enum TensorValue {
    /// In host memory (the `cpu` device).
    Host(Arc<HostTensor>),
    /// In a device buffer (a `tpu` device).
    Device(Arc<Buffer>),
    /// In a device buffer of another shape with the same elements in
    /// row-major order: a reshape that ran no program. Programs reading it
    /// reshape it inside (free in XLA); [`Tensor::buffer`] makes a buffer of
    /// the tensor's own shape only when asked for one.
    Reshaped(Arc<Buffer>),
    /// Not computed yet.
    Pending(Pending),
}

struct Inner {
    id: u64,
    ty: TensorType,
    device: Device,
    value: Mutex<TensorValue>,
}

/// A tensor: cheap to clone (clones share the value), immutable in value.
#[derive(Clone)]
pub struct Tensor {
    inner: Arc<Inner>,
}

/// A tensor reference that does not keep the value alive (the default
/// refers to no tensor).
#[derive(Clone, Default)]
pub struct WeakTensor {
    inner: Weak<Inner>,
}

impl WeakTensor {
    /// The tensor, if anyone still holds it.
    pub fn upgrade(&self) -> Option<Tensor> {
        self.inner.upgrade().map(|inner| Tensor { inner })
    }

    /// Whether anyone still holds the tensor (cheaper than `upgrade`).
    pub fn is_alive(&self) -> bool {
        self.inner.strong_count() > 0
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Tensor {
    fn new(ty: TensorType, device: Device, value: TensorValue) -> Tensor {
        Tensor {
            inner: Arc::new(Inner {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                ty,
                device,
                value: Mutex::new(value),
            }),
        }
    }

    /// A tensor holding `value` on `device` (uploaded for `tpu:N`).
    pub fn from_host(value: HostTensor, device: Device) -> Result<Tensor> {
        match device {
            Device::Cpu => Ok(Tensor::new(
                value.ty(),
                device,
                TensorValue::Host(Arc::new(value)),
            )),
            Device::Tpu(index) => {
                let runtime = Runtime::global()?;
                let buffer = value.to_buffer().upload(runtime.client(), index)?;
                Ok(Tensor::from_buffer(buffer))
            }
        }
    }

    /// A tensor owning a device buffer.
    pub fn from_buffer(buffer: Buffer) -> Tensor {
        Tensor::from_shared_buffer(Arc::new(buffer))
    }

    /// A tensor sharing a device buffer.
    pub fn from_shared_buffer(buffer: Arc<Buffer>) -> Tensor {
        let ty = TensorType::new(buffer.dtype(), buffer.shape().clone());
        let device = Device::Tpu(buffer.device());
        Tensor::new(ty, device, TensorValue::Device(buffer))
    }

    /// A tensor of type `ty` holding `buffer`'s elements (same dtype and
    /// element count) in row-major order: a reshape without a copy.
    pub fn reshaped(buffer: Arc<Buffer>, ty: TensorType) -> Result<Tensor> {
        if buffer.dtype() != ty.dtype || buffer.shape().numel() != ty.shape.numel() {
            return Err(Error::InvalidInput {
                kind: OpErrorKind::Invalid,
                op: "reshape".into(),
                inputs: format!("{}{}", buffer.dtype(), buffer.shape()),
                device: Device::Tpu(buffer.device()).to_string(),
                reason: format!("cannot hold the elements of {ty}"),
            });
        }
        if buffer.shape() == &ty.shape {
            return Ok(Tensor::from_shared_buffer(buffer));
        }
        let device = Device::Tpu(buffer.device());
        Ok(Tensor::new(ty, device, TensorValue::Reshaped(buffer)))
    }

    /// A tensor whose value `pending.policy` will compute.
    pub fn pending(ty: TensorType, device: Device, pending: Pending) -> Tensor {
        Tensor::new(ty, device, TensorValue::Pending(pending))
    }

    /// A process-unique id.
    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Dtype and shape.
    pub fn ty(&self) -> &TensorType {
        &self.inner.ty
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.inner.ty.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &Shape {
        &self.inner.ty.shape
    }

    /// The device it lives on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// A weak reference.
    pub fn downgrade(&self) -> WeakTensor {
        WeakTensor {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// True when no other handle shares this one's value.
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.inner) == 1
    }

    /// True when both handles share one value.
    pub fn same(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// The current value (cheap: shares buffers).
    pub fn value(&self) -> TensorValue {
        self.inner
            .value
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the value; policies call this when a pending value is
    /// computed. The type must not change.
    pub fn set_value(&self, value: TensorValue) {
        *self.inner.value.lock().unwrap_or_else(|e| e.into_inner()) = value;
    }

    /// True while the value waits in a deferred graph.
    pub fn is_pending(&self) -> bool {
        matches!(self.value(), TensorValue::Pending(_))
    }

    /// The device buffer, of this tensor's shape, computing a pending value
    /// first.
    pub fn buffer(&self) -> Result<Arc<Buffer>> {
        if let TensorValue::Reshaped(base) = self.value() {
            let buffer = Arc::new(reshape_on_device(&base, &self.inner.ty)?);
            self.set_value(TensorValue::Device(buffer.clone()));
            return Ok(buffer);
        }
        self.elements()
    }

    /// The device buffer holding this tensor's elements in row-major order,
    /// computing a pending value first. Its shape may differ from the
    /// tensor's (see [`TensorValue::Reshaped`]); programs that take it
    /// reshape it themselves.
    pub fn elements(&self) -> Result<Arc<Buffer>> {
        loop {
            match self.value() {
                TensorValue::Device(b) | TensorValue::Reshaped(b) => return Ok(b),
                TensorValue::Pending(p) => {
                    p.policy.materialize(self)?;
                    if self.is_pending() {
                        return Err(Error::InvalidInput {
                            kind: OpErrorKind::Invalid,
                            op: "materialize".into(),
                            inputs: self.ty().to_string(),
                            device: self.device().to_string(),
                            reason: "the policy left the value pending".into(),
                        });
                    }
                }
                TensorValue::Host(_) => {
                    return Err(Error::InvalidInput {
                        kind: OpErrorKind::Invalid,
                        op: "buffer".into(),
                        inputs: self.ty().to_string(),
                        device: self.device().to_string(),
                        reason: "a cpu tensor has no device buffer".into(),
                    });
                }
            }
        }
    }

    /// The value in host memory (computing and downloading as needed).
    /// A graph this cuts is attributed to the caller in profile traces.
    #[track_caller]
    pub fn to_host(&self) -> Result<HostTensor> {
        if let TensorValue::Host(h) = self.value() {
            return Ok((*h).clone());
        }
        let host = crate::profile::at(std::panic::Location::caller(), || {
            // The elements may sit in a buffer of another shape.
            HostBuffer::download(&*self.elements()?)?.reshaped(self.shape().clone())
        });
        crate::profile::flush();
        Ok(HostTensor::from_buffer(&host?))
    }
}

impl std::fmt::Debug for Tensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match self.value() {
            TensorValue::Host(_) => "host",
            TensorValue::Device(_) => "device",
            TensorValue::Reshaped(_) => "device, reshaped",
            TensorValue::Pending(_) => "pending",
        };
        write!(f, "Tensor({} on {}, {state})", self.ty(), self.device())
    }
}

/// A copy of `base` shaped as `ty`, by a one-op program.
fn reshape_on_device(base: &Buffer, ty: &TensorType) -> Result<Buffer> {
    let mut builder = crate::stablehlo::Builder::new("reshape");
    let x = builder.parameter(TensorType::new(base.dtype(), base.shape().clone()));
    let y = builder.reshape(&x, ty.shape.dims());
    let program = builder.finish(&[y]);
    let options = crate::pjrt::CompileOptions::on_device(base.device());
    let executable = Runtime::global()?.compile(&program, &options)?;
    executable
        .run(&[base])?
        .pop()
        .ok_or_else(|| Error::Signature("a reshape program gave no result".into()))
}
