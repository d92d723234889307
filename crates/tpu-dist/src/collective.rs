//! Collectives as StableHLO programs replicated over a device group.

use std::sync::Arc;

use tpu_core::metrics::CutReason;
use tpu_core::op::OpResult;
use tpu_core::pjrt::{Arg, Buffer, CompileOptions};
use tpu_core::policy::{CollectiveCall, ExecutionPolicy};
use tpu_core::stablehlo::{Builder, TensorType, Value};
use tpu_core::{Error, Result, Runtime, Tensor, TensorValue, invalid, out_of_range};

use crate::{DeviceGroup, ReduceOp};

/// One collective and its parameters.
#[derive(Clone, Debug)]
pub(crate) enum Collective {
    AllReduce(ReduceOp),
    AllGather { dim: usize },
    ReduceScatter { op: ReduceOp, dim: usize },
    Broadcast { root: usize },
    AllToAll { split_dim: usize, concat_dim: usize },
    Permute { pairs: Vec<(usize, usize)> },
}

impl Collective {
    fn name(&self) -> &'static str {
        match self {
            Collective::AllReduce(_) => "all_reduce",
            Collective::AllGather { .. } => "all_gather",
            Collective::ReduceScatter { .. } => "reduce_scatter",
            Collective::Broadcast { .. } => "broadcast",
            Collective::AllToAll { .. } => "all_to_all",
            Collective::Permute { .. } => "permute",
        }
    }
}

/// `replica_groups` spanning all `n` replicas.
fn one_group(n: usize) -> String {
    let ranks: Vec<String> = (0..n).map(|r| r.to_string()).collect();
    format!(
        "replica_groups = dense<[[{}]]> : tensor<1x{n}xi64>",
        ranks.join(", ")
    )
}

/// A dimension within `rank`, or why not.
pub(crate) fn check_dim(what: &str, dim: usize, rank: usize) -> OpResult<()> {
    if dim < rank {
        Ok(())
    } else {
        Err(out_of_range!(
            "{what} {dim} is out of range for rank {rank}"
        ))
    }
}

/// `dims` with `dims[dim]` replaced by `size`.
fn with_dim(dims: &[usize], dim: usize, size: usize) -> Vec<usize> {
    let mut out = dims.to_vec();
    out[dim] = size;
    out
}

/// A block of `n` equal parts along `dim`, or why `dims` does not split so.
pub(crate) fn split(dims: &[usize], dim: usize, n: usize) -> OpResult<usize> {
    if dims[dim] % n != 0 {
        return Err(invalid!(
            "dim {dim} of size {} does not split into {n} equal blocks",
            dims[dim]
        ));
    }
    Ok(dims[dim] / n)
}

fn all_reduce(b: &mut Builder, x: &Value, op: ReduceOp, n: usize) -> OpResult<Value> {
    let dtype = x.dtype();
    let region = b.scalar_region(op.combiner(dtype)?, dtype);
    let sum = b
        .op(
            "stablehlo.all_reduce",
            &[x],
            &[region],
            &one_group(n),
            vec![x.ty().clone()],
        )
        .remove(0);
    if op != ReduceOp::Mean {
        return Ok(sum);
    }
    let count = b.constant(dtype, x.shape().clone(), n as f64);
    Ok(b.binary("stablehlo.divide", &sum, &count))
}

fn all_gather(b: &mut Builder, x: &Value, dim: usize, n: usize) -> OpResult<Value> {
    check_dim("dim", dim, x.rank())?;
    let out = TensorType::new(x.dtype(), with_dim(x.dims(), dim, x.dims()[dim] * n));
    let attrs = format!("all_gather_dim = {dim} : i64, {}", one_group(n));
    Ok(b.op1("stablehlo.all_gather", &[x], &attrs, out))
}

/// The body of `collective` on one member's input `x` of a group of `n`.
fn lower(b: &mut Builder, collective: &Collective, x: &Value, n: usize) -> OpResult<Value> {
    match collective {
        Collective::AllReduce(op) => all_reduce(b, x, *op, n),
        Collective::AllGather { dim } => all_gather(b, x, *dim, n),
        Collective::ReduceScatter { op, dim } => {
            check_dim("dim", *dim, x.rank())?;
            let block = split(x.dims(), *dim, n)?;
            let dtype = x.dtype();
            let region = b.scalar_region(op.combiner(dtype)?, dtype);
            let out = TensorType::new(dtype, with_dim(x.dims(), *dim, block));
            let attrs = format!("scatter_dimension = {dim} : i64, {}", one_group(n));
            let scattered = b
                .op(
                    "stablehlo.reduce_scatter",
                    &[x],
                    &[region],
                    &attrs,
                    vec![out],
                )
                .remove(0);
            if *op != ReduceOp::Mean {
                return Ok(scattered);
            }
            let count = b.constant(dtype, scattered.shape().clone(), n as f64);
            Ok(b.binary("stablehlo.divide", &scattered, &count))
        }
        Collective::Broadcast { root } => {
            if *root >= n {
                return Err(out_of_range!("root rank {root} is not in a group of {n}"));
            }
            // Gather along a new leading dim and keep the root's slot: exact
            // for every value (-0.0 and NaN payloads included).
            let mut dims = vec![1];
            dims.extend_from_slice(x.dims());
            let lifted = b.reshape(x, &dims);
            let gathered = all_gather(b, &lifted, 0, n)?;
            let mut start = vec![0; dims.len()];
            start[0] = *root;
            let mut limit = gathered.dims().to_vec();
            limit[0] = root + 1;
            let strides = vec![1; dims.len()];
            let slot = b.slice(&gathered, &start, &limit, &strides);
            Ok(b.reshape(&slot, x.dims()))
        }
        Collective::AllToAll {
            split_dim,
            concat_dim,
        } => {
            check_dim("split_dim", *split_dim, x.rank())?;
            check_dim("concat_dim", *concat_dim, x.rank())?;
            let block = split(x.dims(), *split_dim, n)?;
            let dims = with_dim(x.dims(), *split_dim, block);
            let dims = with_dim(&dims, *concat_dim, dims[*concat_dim] * n);
            let attrs = format!(
                "split_dimension = {split_dim} : i64, concat_dimension = {concat_dim} : i64, split_count = {n} : i64, {}",
                one_group(n)
            );
            Ok(b.op1(
                "stablehlo.all_to_all",
                &[x],
                &attrs,
                TensorType::new(x.dtype(), dims),
            ))
        }
        Collective::Permute { pairs } => {
            for (i, &(s, t)) in pairs.iter().enumerate() {
                if s >= n || t >= n {
                    return Err(out_of_range!(
                        "pair ({s}, {t}) names a rank outside a group of {n}"
                    ));
                }
                if pairs[..i].iter().any(|&(s2, t2)| s2 == s || t2 == t) {
                    return Err(invalid!(
                        "rank {s} sends or rank {t} receives twice in {pairs:?}"
                    ));
                }
            }
            let list: Vec<String> = pairs.iter().map(|(s, t)| format!("[{s}, {t}]")).collect();
            let attrs = format!(
                "source_target_pairs = dense<[{}]> : tensor<{}x2xi64>",
                list.join(", "),
                pairs.len()
            );
            Ok(b.op1("stablehlo.collective_permute", &[x], &attrs, x.ty().clone()))
        }
    }
}

/// Runs the deferred work `xs` wait on, counting the cut as a
/// collective's: each policy holding one of them flushes once (a policy
/// records a cut only for the devices that had work pending).
pub(crate) fn flush_pending(xs: &[Tensor]) -> Result<()> {
    let mut flushed: Vec<Arc<dyn ExecutionPolicy>> = Vec::new();
    for x in xs {
        if let TensorValue::Pending(p) = x.value()
            && !flushed.iter().any(|f| Arc::ptr_eq(f, &p.policy))
        {
            p.policy.flush(CutReason::Collective)?;
            flushed.push(p.policy);
        }
    }
    Ok(())
}

/// Offers `collective` to the policy holding `xs`' pending work, which
/// may run both as one replicated program; `None` when it did not.
fn fuse(
    group: &DeviceGroup,
    collective: &Collective,
    xs: &[Tensor],
) -> Result<Option<Vec<Tensor>>> {
    let Some(policy) = xs.iter().find_map(|x| match x.value() {
        TensorValue::Pending(p) => Some(p.policy),
        _ => None,
    }) else {
        return Ok(None);
    };
    let n = group.len();
    let body = |b: &mut Builder, x: &Value| lower(b, collective, x, n);
    policy.fuse_collective(&CollectiveCall {
        name: collective.name(),
        devices: group.devices(),
        inputs: xs,
        lower: &body,
    })
}

/// Runs `collective` over `group` on `xs` (one tensor per member).
pub(crate) fn run(
    group: &DeviceGroup,
    collective: Collective,
    xs: &[Tensor],
) -> Result<Vec<Tensor>> {
    let name = collective.name();
    let ty = group.common_type(name, xs)?;
    let n = group.len();
    if let Collective::Permute { pairs } = &collective
        && pairs.is_empty()
    {
        return Err(group.invalid(name, xs, "no (source, target) pairs"));
    }
    let mut b = Builder::new(name);
    b.set_replicas(n);
    let x = b.parameter(ty);
    let y = lower(&mut b, &collective, &x, n).map_err(|reason| group.invalid(name, xs, reason))?;
    let program = b.finish(&[y]);
    if let Some(fused) = fuse(group, &collective, xs)? {
        return Ok(fused);
    }
    let options = CompileOptions {
        num_replicas: n,
        device_assignment: Some(group.devices().to_vec()),
        ..CompileOptions::default()
    };
    let executable = Runtime::global()?.compile(&program, &options)?;
    flush_pending(xs)?;
    let buffers: Vec<Arc<Buffer>> = xs.iter().map(Tensor::buffer).collect::<Result<_>>()?;
    let args = buffers.iter().map(|b| vec![Arg::Borrow(b)]).collect();
    let outputs = executable.execute_on_devices(args)?;
    outputs
        .into_iter()
        .map(|mut out| {
            out.pop()
                .map(Tensor::from_buffer)
                .ok_or_else(|| Error::Signature(format!("`{name}` returned nothing")))
        })
        .collect()
}
