//! Programs written for global shapes, partitioned by XLA over a mesh.
//!
//! Each device's buffers hold its block, so `@main` takes and returns
//! per-device shapes marked `{manual}`; inside, `SPMDShardToFullShape`
//! turns each argument into its global value with its input sharding, the
//! caller's body computes on global values, and `SPMDFullToShardShape`
//! turns each result back into blocks with its output sharding (the
//! inverse of JAX's `shard_map`). Everything between is XLA's to
//! partition: it inserts the all-reduces, all-gathers and all-to-alls the
//! shardings imply.

use std::sync::Arc;
use tpu_core::op::OpErrorKind;

use tpu_core::pjrt::{Arg, Buffer, CompileOptions};
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{Error, Result, Runtime, Tensor};

use super::spec::MANUAL;
use super::{Mesh, ShardedTensor, ShardingSpec};

/// `stablehlo.custom_call @target(x)` carrying `mhlo.sharding = sharding`.
fn annotate(b: &mut Builder, target: &str, x: &Value, sharding: &str, ty: TensorType) -> Value {
    let attrs = format!("call_target_name = \"{target}\", mhlo.sharding = \"{sharding}\"");
    b.op1("stablehlo.custom_call", &[x], &attrs, ty)
}

impl Mesh {
    /// Runs a program written for global shapes over the mesh, tensor
    /// parallel. `body` gets one global-shaped value per input (in order)
    /// and returns the program's global-shaped results; result `i` comes
    /// back laid out by `out_specs[i]`. The program is compiled (once per
    /// program text, mesh and layout, through the runtime's compile cache)
    /// with one SPMD partition per mesh device, and XLA inserts the
    /// collectives the input and output shardings imply.
    ///
    /// `body` builds ops only: parameters it adds would not get arguments.
    /// Errors name `name`, the inputs and the mesh: inputs laid out over
    /// another mesh, a result count other than `out_specs.len()`, or an
    /// output spec that does not fit its result's shape.
    ///
    /// ```no_run
    /// use tpu_core::{DType, Device, HostTensor, Tensor};
    /// use tpu_dist::{Mesh, ShardingSpec, shard};
    ///
    /// let mesh = Mesh::all(&[("model", 4)])?;
    /// let ones = |dims: [usize; 2]| {
    ///     let h = HostTensor::from_f64(DType::F32, dims, vec![1.0; dims[0] * dims[1]]);
    ///     Tensor::from_host(h.expect("as many values as elements"), Device::Cpu)
    /// };
    /// let columns = ShardingSpec::new(&[None, Some("model")]);
    /// let x = shard(&ones([2, 8])?, &mesh, &ShardingSpec::replicated())?;
    /// let w = shard(&ones([8, 16])?, &mesh, &columns)?;
    /// // Column parallel: each device computes its 4 columns of x @ w.
    /// let y = mesh.run("matmul", &[&x, &w], &[columns], |b, xs| {
    ///     Ok(vec![b.dot_general(&xs[0], &xs[1], (&[], &[]), (&[1], &[0]), DType::F32)])
    /// })?;
    /// assert_eq!(y[0].shards()[0].shape().dims(), &[2, 4]);
    /// assert_eq!(y[0].to_host()?.dims(), &[2, 16]);
    /// # Ok::<(), tpu_core::Error>(())
    /// ```
    pub fn run<F>(
        &self,
        name: &str,
        inputs: &[&ShardedTensor],
        out_specs: &[ShardingSpec],
        body: F,
    ) -> Result<Vec<ShardedTensor>>
    where
        F: FnOnce(&mut Builder, &[Value]) -> Result<Vec<Value>>,
    {
        let invalid = |reason: String| Error::InvalidInput {
            kind: OpErrorKind::Invalid,
            op: name.to_string(),
            inputs: inputs
                .iter()
                .map(|x| format!("{} as {}", x.ty(), x.spec()))
                .collect::<Vec<_>>()
                .join(", "),
            device: self.to_string(),
            reason,
        };
        let mut b = Builder::new(name);
        b.set_partitions(self.len());
        let mut globals = Vec::with_capacity(inputs.len());
        for (i, x) in inputs.iter().enumerate() {
            if x.mesh() != self {
                return Err(invalid(format!(
                    "input {i} is laid out over {}, not this mesh",
                    x.mesh()
                )));
            }
            let dims = x.ty().shape.dims();
            let tiling = x
                .spec()
                .tiling(self, dims)
                .map_err(|r| invalid(format!("input {i}: {r}")))?;
            let local = b.parameter(TensorType::new(x.ty().dtype, tiling.local_dims(dims)));
            b.set_parameter_sharding(&local, MANUAL);
            let manual = annotate(&mut b, "Sharding", &local, MANUAL, local.ty().clone());
            globals.push(annotate(
                &mut b,
                "SPMDShardToFullShape",
                &manual,
                &tiling.hlo(),
                x.ty().clone(),
            ));
        }
        let results = body(&mut b, &globals)?;
        if results.len() != out_specs.len() {
            return Err(invalid(format!(
                "the program returns {} result(s) but {} output spec(s) are given",
                results.len(),
                out_specs.len()
            )));
        }
        let mut locals = Vec::with_capacity(results.len());
        for (i, (y, spec)) in results.iter().zip(out_specs).enumerate() {
            let tiling = spec
                .tiling(self, y.dims())
                .map_err(|r| invalid(format!("output {i} ({}): {r}", y.ty())))?;
            let global = annotate(&mut b, "Sharding", y, &tiling.hlo(), y.ty().clone());
            let local = TensorType::new(y.dtype(), tiling.local_dims(y.dims()));
            locals.push(annotate(
                &mut b,
                "SPMDFullToShardShape",
                &global,
                MANUAL,
                local,
            ));
            b.set_result_sharding(i, MANUAL);
        }
        let global_types: Vec<TensorType> = results.iter().map(|y| y.ty().clone()).collect();
        let program = b.finish(&locals);
        let options = CompileOptions {
            num_partitions: self.len(),
            use_spmd_partitioning: true,
            device_assignment: Some(self.devices().to_vec()),
            ..CompileOptions::default()
        };
        let executable = Runtime::global()?.compile(&program, &options)?;

        // Argument lists go in the executable's device order.
        let partitions = executable
            .devices()
            .iter()
            .map(|&d| {
                self.partition_of(d).ok_or_else(|| {
                    invalid(format!(
                        "the compiled program runs on tpu:{d}, outside the mesh"
                    ))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let buffers: Vec<Vec<Arc<Buffer>>> = inputs
            .iter()
            .map(|x| x.shards().iter().map(Tensor::buffer).collect())
            .collect::<Result<_>>()?;
        let args = partitions
            .iter()
            .map(|&p| buffers.iter().map(|per| Arg::Borrow(&per[p])).collect())
            .collect();
        let outputs = executable.execute_on_devices(args)?;

        let mut shards: Vec<Vec<Option<Tensor>>> = vec![vec![None; self.len()]; locals.len()];
        for (list, &p) in outputs.into_iter().zip(&partitions) {
            for (k, buffer) in list.into_iter().enumerate() {
                if let Some(slot) = shards.get_mut(k) {
                    slot[p] = Some(Tensor::from_buffer(buffer));
                }
            }
        }
        shards
            .into_iter()
            .zip(out_specs)
            .zip(global_types)
            .enumerate()
            .map(|(k, ((per, spec), ty))| {
                let per = per
                    .into_iter()
                    .collect::<Option<Vec<Tensor>>>()
                    .ok_or_else(|| {
                        Error::Signature(format!("`{name}` left output {k} missing on a device"))
                    })?;
                Ok(ShardedTensor::from_parts(self, spec.clone(), ty, per))
            })
            .collect()
    }
}
