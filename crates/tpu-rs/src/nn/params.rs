//! Named parameters: a store shared by a model's layers, with PyTorch
//! `state_dict` naming (`block.0.attn.c_attn.weight`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tpu_core::op::Gen;
use tpu_core::{DType, Device, Shape};

use crate::error::Result;
use crate::tensor::Tensor;

/// A trainable tensor that an optimizer can replace in place.
#[derive(Clone)]
pub struct Parameter {
    name: Arc<str>,
    value: Arc<Mutex<Tensor>>,
}

impl Parameter {
    /// The parameter's full name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current value (a leaf that collects gradients).
    pub fn get(&self) -> Tensor {
        self.value.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the value; the new value becomes a gradient-collecting leaf.
    pub fn set(&self, value: &Tensor) {
        *self.value.lock().unwrap_or_else(|e| e.into_inner()) =
            value.detach().with_requires_grad(true);
    }
}

/// How a parameter starts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
    /// Uniform in `[-bound, bound]`.
    Uniform(f64),
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
}

struct StoreInner {
    params: Mutex<BTreeMap<String, Parameter>>,
    training: AtomicBool,
    seed: AtomicU64,
    device: Device,
    dtype: DType,
}

/// The parameters of a model, by name.
#[derive(Clone)]
pub struct ParamStore {
    inner: Arc<StoreInner>,
}

impl ParamStore {
    /// An empty store whose parameters live on `device` as `dtype`, drawn
    /// from a generator seeded with `seed`.
    pub fn new(device: Device, dtype: DType, seed: u64) -> ParamStore {
        ParamStore {
            inner: Arc::new(StoreInner {
                params: Mutex::new(BTreeMap::new()),
                training: AtomicBool::new(true),
                seed: AtomicU64::new(seed),
                device,
                dtype,
            }),
        }
    }

    /// The device parameters live on.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The parameters' dtype.
    pub fn dtype(&self) -> DType {
        self.inner.dtype
    }

    /// A path at the root.
    pub fn root(&self) -> Path {
        Path {
            store: self.clone(),
            prefix: String::new(),
        }
    }

    /// Every parameter, sorted by name.
    pub fn parameters(&self) -> Vec<Parameter> {
        self.lock().values().cloned().collect()
    }

    /// A parameter by name.
    pub fn get(&self, name: &str) -> Option<Parameter> {
        self.lock().get(name).cloned()
    }

    /// Total number of parameter elements.
    pub fn num_elements(&self) -> usize {
        self.parameters().iter().map(|p| p.get().numel()).sum()
    }

    /// A table of every parameter (name, shape, dtype, elements) and the
    /// totals, in PyTorch's `state_dict` order of names (sorted):
    /// `println!("{}", store.summary())`.
    pub fn summary(&self) -> String {
        let (mut elements, mut bytes) = (0, 0);
        let rows: Vec<[String; 4]> = self
            .parameters()
            .iter()
            .map(|p| {
                let t = p.get();
                elements += t.numel();
                bytes += t.numel() * t.dtype().size_in_bytes();
                [
                    p.name().to_string(),
                    t.shape().to_string(),
                    t.dtype().to_string(),
                    t.numel().to_string(),
                ]
            })
            .collect();
        let header = ["parameter", "shape", "dtype", "elements"].map(String::from);
        let mut widths = header.clone().map(|h| h.len());
        for row in &rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.len());
            }
        }
        let line = |row: &[String; 4]| {
            format!(
                "{:<a$}  {:<b$}  {:<c$}  {:>d$}\n",
                row[0],
                row[1],
                row[2],
                row[3],
                a = widths[0],
                b = widths[1],
                c = widths[2],
                d = widths[3]
            )
        };
        let mut out = line(&header);
        for row in &rows {
            out += &line(row);
        }
        out += &format!(
            "{} parameters, {elements} elements, {bytes} bytes on {}\n",
            rows.len(),
            self.device()
        );
        out
    }

    /// Training mode (dropout active, batch statistics) or evaluation.
    pub fn set_training(&self, training: bool) {
        self.inner.training.store(training, Ordering::Relaxed);
    }

    /// True in training mode.
    pub fn is_training(&self) -> bool {
        self.inner.training.load(Ordering::Relaxed)
    }

    /// A fresh 64-bit seed (for initialisers and dropout keys).
    pub(crate) fn next_seed(&self) -> u64 {
        self.inner
            .seed
            .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Parameter>> {
        self.inner.params.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn insert(&self, name: String, value: Tensor) -> Parameter {
        let p = Parameter {
            name: name.as_str().into(),
            value: Arc::new(Mutex::new(value.with_requires_grad(true))),
        };
        self.lock().insert(name, p.clone());
        p
    }
}

/// A name prefix inside a store, for building nested layers.
#[derive(Clone)]
pub struct Path {
    store: ParamStore,
    prefix: String,
}

impl Path {
    /// The store.
    pub fn store(&self) -> &ParamStore {
        &self.store
    }

    /// A child path: `prefix.name`.
    pub fn sub(&self, name: impl std::fmt::Display) -> Path {
        let prefix = if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        };
        Path {
            store: self.store.clone(),
            prefix,
        }
    }

    /// The full name of `name` under this path.
    pub fn name(&self, name: &str) -> String {
        if self.prefix.is_empty() {
            name.to_string()
        } else {
            format!("{}.{name}", self.prefix)
        }
    }

    /// Creates parameter `name` of `shape`, initialised by `init`.
    pub fn param(&self, name: &str, shape: impl Into<Shape>, init: Init) -> Result<Parameter> {
        let shape = shape.into();
        let mut g = Gen::new(self.store.next_seed());
        let n = shape.numel();
        let values: Vec<f64> = match init {
            Init::Zeros => vec![0.0; n],
            Init::Ones => vec![1.0; n],
            Init::Uniform(b) => (0..n).map(|_| g.uniform(-b, b)).collect(),
            Init::Normal(std) => (0..n)
                .map(|_| {
                    let (u1, u2) = (g.uniform(f64::MIN_POSITIVE, 1.0), g.uniform(0.0, 1.0));
                    std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
                })
                .collect(),
        };
        let host = tpu_core::HostTensor::from_f64(self.store.dtype(), shape, values)
            .ok_or_else(|| crate::Error::shape(name, "bad parameter shape"))?;
        let t = Tensor::from_host(host, self.store.device())?;
        Ok(self.store.insert(self.name(name), t))
    }
}
