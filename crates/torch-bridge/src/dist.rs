//! The native half of the `tpu_dist` backend of `torch.distributed`: a
//! tpu-dist process group whose collectives read and write torch tensors
//! (on `tpu` or on the CPU) in place.
//!
//! Every collective runs with the GIL released, so the Python threads of
//! a rank (a data loader, torch's own watchdogs) go on while it waits, and
//! ends within the group's timeout: a dead peer is an error naming the
//! collective and the missing ranks.

use std::sync::Mutex;
use std::time::Duration;

use pyo3::prelude::*;
use tpu_core::{HostBuffer, Runtime, Tensor};
use tpu_dist::{JobOptions, ProcessGroup, ReduceOp, Store};

use crate::error::{BridgeError, Result};
use crate::ops::store;
use crate::torch::{View, cpu_tensor, host_buffer, host_copy};

/// The rendezvous store of one group, served by its rank 0: the other
/// ranks learn its address through torch's own store.
#[pyclass(frozen, module = "torch_tpu_rs._C")]
pub struct DistStore {
    /// Until a group joins in it.
    store: Mutex<Option<Store>>,
    address: String,
}

fn seconds(timeout: f64) -> Result<Duration> {
    Duration::try_from_secs_f64(timeout)
        .map_err(|_| BridgeError::Unsupported(format!("a timeout of {timeout} s")))
}

impl From<Store> for DistStore {
    fn from(store: Store) -> DistStore {
        DistStore {
            address: store.address().to_string(),
            store: Mutex::new(Some(store)),
        }
    }
}

#[pymethods]
impl DistStore {
    /// Serves a store on every interface, on a port the system picks.
    #[staticmethod]
    fn serve(py: Python<'_>, timeout: f64) -> PyResult<DistStore> {
        let timeout = seconds(timeout)?;
        let store = py
            .detach(|| Store::serve("0.0.0.0:0", timeout))
            .map_err(BridgeError::from)?;
        Ok(store.into())
    }

    /// Connects to the store at `address` (`host:port`), retrying until
    /// `timeout` seconds while it is not up yet.
    #[staticmethod]
    fn connect(py: Python<'_>, address: &str, timeout: f64) -> PyResult<DistStore> {
        let timeout = seconds(timeout)?;
        let store = py
            .detach(|| Store::connect(address, timeout))
            .map_err(BridgeError::from)?;
        Ok(store.into())
    }

    /// The port it is served on.
    #[getter]
    fn port(&self) -> Result<u16> {
        self.address
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| BridgeError::internal(format!("a store address {:?}", self.address)))
    }
}

/// The address of this host as seen from `host`: what a store served here
/// is advertised as.
#[pyfunction]
pub fn local_ip_towards(host: &str) -> PyResult<String> {
    Ok(Store::local_ip_towards(host).map_err(BridgeError::from)?)
}

/// One `tpu_dist` process group.
#[pyclass(frozen, module = "torch_tpu_rs._C")]
pub struct DistGroup {
    group: ProcessGroup,
}

/// The reduction torch names `op` (`ReduceOp.SUM` is `"sum"`).
fn reduce_op(op: &str) -> Result<ReduceOp> {
    Ok(match op {
        "sum" => ReduceOp::Sum,
        "avg" => ReduceOp::Mean,
        "product" => ReduceOp::Prod,
        "min" => ReduceOp::Min,
        "max" => ReduceOp::Max,
        other => {
            return Err(BridgeError::Unsupported(format!(
                "tpu_dist: the reduction {other} is not implemented (sum, avg, product, min and \
                 max are)"
            )));
        }
    })
}

/// The elements of torch tensor `t` (on `tpu` or the CPU) in host memory:
/// what crosses to the other processes.
fn elements_of(t: &Bound<'_, PyAny>) -> Result<HostBuffer> {
    match View::of(t)? {
        Some(view) => host_copy(&view.read()?),
        None => host_buffer(t),
    }
}

/// Writes `value` into torch tensor `dst` in place; a value with as many
/// elements in another shape takes `dst`'s (a gathered `[n * k]` into a
/// `[n, k]` output).
fn write_into(dst: &Bound<'_, PyAny>, value: HostBuffer) -> Result<()> {
    let shape: Vec<usize> = dst.getattr("shape")?.extract()?;
    let value = if value.shape().dims() != shape.as_slice()
        && value.shape().numel() == shape.iter().product::<usize>()
    {
        value.reshaped(shape)?
    } else {
        value
    };
    match View::of(dst)? {
        Some(view) => {
            let device = view.storage.device();
            let buffer = value.upload(Runtime::global()?.client(), device)?;
            store(dst, Tensor::from_buffer(buffer))
        }
        None => {
            dst.call_method1("copy_", (cpu_tensor(dst.py(), &value)?,))?;
            Ok(())
        }
    }
}

impl DistGroup {
    /// Runs `collective` on `input`'s elements with the GIL released and
    /// writes its result into `output`.
    fn run(
        &self,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        collective: impl FnOnce(&ProcessGroup, HostBuffer) -> tpu_core::Result<HostBuffer> + Send,
    ) -> Result<()> {
        let x = elements_of(input)?;
        let group = &self.group;
        let y = input.py().detach(|| collective(group, x))?;
        write_into(output, y)
    }
}

#[pymethods]
impl DistGroup {
    /// Joins the group of `world_size` ranks meeting in `store`; rank 0
    /// serves it and its Gloo pairs listen on `master_addr`. Returns once
    /// every rank has joined, or fails after `timeout` seconds.
    #[new]
    fn new(
        py: Python<'_>,
        store: &DistStore,
        rank: usize,
        world_size: usize,
        local_rank: usize,
        master_addr: String,
        timeout: f64,
    ) -> PyResult<DistGroup> {
        let store = store
            .store
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| BridgeError::internal("a rendezvous store joined twice"))?;
        let options = JobOptions {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port: 0,
            timeout: seconds(timeout)?,
        };
        let group = py
            .detach(|| ProcessGroup::with_store(&options, store))
            .map_err(BridgeError::from)?;
        Ok(DistGroup { group })
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.group.rank()
    }

    /// Number of ranks.
    #[getter]
    fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// Reduces `tensor` across the ranks with `op`, in place.
    fn all_reduce(&self, tensor: &Bound<'_, PyAny>, op: &str) -> PyResult<()> {
        let op = reduce_op(op)?;
        Ok(self.run(tensor, tensor, |g, x| g.all_reduce_host(x, op))?)
    }

    /// Every rank's `input`, concatenated along dimension 0 in rank order,
    /// into `output`.
    fn all_gather(&self, output: &Bound<'_, PyAny>, input: &Bound<'_, PyAny>) -> PyResult<()> {
        Ok(self.run(input, output, |g, x| g.all_gather_host(x, 0))?)
    }

    /// Reduces `input` across the ranks with `op` and writes this rank's
    /// block of dimension 0 into `output`.
    fn reduce_scatter(
        &self,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        op: &str,
    ) -> PyResult<()> {
        let op = reduce_op(op)?;
        Ok(self.run(input, output, |g, x| g.reduce_scatter_host(x, op, 0))?)
    }

    /// Sends block `j` of `input`'s dimension 0 to rank `j` and writes the
    /// blocks received, in rank order, into `output`; empty splits mean
    /// equal blocks.
    fn all_to_all(
        &self,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        output_splits: Vec<usize>,
        input_splits: Vec<usize>,
    ) -> PyResult<()> {
        if output_splits.is_empty() && input_splits.is_empty() {
            return Ok(self.run(input, output, |g, x| g.all_to_all_host(x, 0, 0))?);
        }
        let rows = |t: &Bound<'_, PyAny>| -> PyResult<usize> {
            let shape: Vec<usize> = t.getattr("shape")?.extract()?;
            Ok(shape.first().copied().unwrap_or(0))
        };
        let n = self.group.world_size();
        let equal = |t| -> PyResult<Vec<usize>> { Ok(vec![rows(t)? / n.max(1); n]) };
        let input_splits = if input_splits.is_empty() {
            equal(input)?
        } else {
            input_splits
        };
        let output_splits = if output_splits.is_empty() {
            equal(output)?
        } else {
            output_splits
        };
        Ok(self.run(input, output, |g, x| {
            g.all_to_all_v_host(x, &input_splits, &output_splits)
        })?)
    }

    /// Root's `tensor` into every rank's, in place.
    fn broadcast(&self, tensor: &Bound<'_, PyAny>, root: usize) -> PyResult<()> {
        Ok(self.run(tensor, tensor, |g, x| g.broadcast_host(x, root))?)
    }

    /// Sends `tensor` to rank `dst`.
    fn send(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>, dst: usize) -> PyResult<()> {
        let x = elements_of(tensor)?;
        let group = &self.group;
        py.detach(|| group.send_host(&x, dst))
            .map_err(BridgeError::from)?;
        Ok(())
    }

    /// Receives into `tensor` what rank `src` sends.
    fn recv(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>, src: usize) -> PyResult<()> {
        let dtype = crate::torch::dtype_of(&tensor.getattr("dtype")?)?;
        let shape: Vec<usize> = tensor.getattr("shape")?.extract()?;
        let group = &self.group;
        let y = py
            .detach(|| group.recv_host(dtype, shape, src))
            .map_err(BridgeError::from)?;
        Ok(write_into(tensor, y)?)
    }

    /// Returns once every rank has called it.
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let group = &self.group;
        py.detach(|| group.barrier()).map_err(BridgeError::from)?;
        Ok(())
    }
}
