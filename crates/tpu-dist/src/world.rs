//! Every device of every process of a job: the local devices reduce
//! in-graph first, then one value per process crosses the host leg.

use tpu_core::{HostBuffer, Result, Runtime, Tensor};

use crate::{DeviceGroup, JobOptions, ProcessGroup, ReduceOp};

/// The local devices of this process and, in a multi-process job, the
/// other processes. Global rank `p * local + d` is device `d` of process
/// `p`; every process must have as many local devices.
#[derive(Clone)]
pub struct World {
    local: DeviceGroup,
    processes: Option<ProcessGroup>,
}

impl From<DeviceGroup> for World {
    fn from(local: DeviceGroup) -> World {
        World::new(local, None)
    }
}

impl World {
    /// `local` alone, or `local` in every process of `processes`.
    pub fn new(local: DeviceGroup, processes: Option<ProcessGroup>) -> World {
        World { local, processes }
    }

    /// `local` in the job torchrun or `tpu-rs launch` started, or alone
    /// when no launcher set `WORLD_SIZE`.
    pub fn from_env(local: DeviceGroup) -> Result<World> {
        let processes = if JobOptions::launched() {
            Some(ProcessGroup::from_env()?)
        } else {
            None
        };
        Ok(World { local, processes })
    }

    /// This process's devices.
    pub fn local(&self) -> &DeviceGroup {
        &self.local
    }

    /// The other processes, in a multi-process job.
    pub fn processes(&self) -> Option<&ProcessGroup> {
        self.processes.as_ref()
    }

    /// Number of devices in the whole job.
    pub fn size(&self) -> usize {
        self.local.len() * self.process_count()
    }

    /// Global rank of this process's first device.
    pub fn first_rank(&self) -> usize {
        self.processes.as_ref().map_or(0, ProcessGroup::rank) * self.local.len()
    }

    fn process_count(&self) -> usize {
        self.processes.as_ref().map_or(1, ProcessGroup::world_size)
    }

    /// Every device gets the elementwise `op` of all devices' tensors
    /// (`xs`: one per local device, in order). A mean needs as many
    /// devices in every process, which [`World`] requires.
    pub fn all_reduce(&self, xs: &[Tensor], op: ReduceOp) -> Result<Vec<Tensor>> {
        let reduced = self.local.all_reduce(xs, op)?;
        let Some(pg) = &self.processes else {
            return Ok(reduced);
        };
        // A mean of per-process means is the mean: each process has as
        // many devices.
        let across = pg.all_reduce_host(HostBuffer::download(&*reduced[0].buffer()?)?, op)?;
        self.scatter_locally(across)
    }

    /// Every device gets global rank `root`'s tensor.
    pub fn broadcast(&self, xs: &[Tensor], root: usize) -> Result<Vec<Tensor>> {
        let n = self.local.len();
        let (process, device) = (root / n, root % n);
        let local = self.local.broadcast(xs, device)?;
        let Some(pg) = &self.processes else {
            return Ok(local);
        };
        let across = pg.broadcast_host(HostBuffer::download(&*local[0].buffer()?)?, process)?;
        self.scatter_locally(across)
    }

    /// Blocks until every device of every process has reached it.
    pub fn barrier(&self) -> Result<()> {
        self.local.barrier()?;
        self.processes
            .as_ref()
            .map_or(Ok(()), ProcessGroup::barrier)
    }

    /// `value` on every local device.
    fn scatter_locally(&self, value: HostBuffer) -> Result<Vec<Tensor>> {
        let client = Runtime::global()?.client();
        self.local
            .devices()
            .iter()
            .map(|&d| Ok(Tensor::from_buffer(value.upload(client, d)?)))
            .collect()
    }
}
