//! The shared conformance harness: every op against its own reference on
//! any execution path, and every backward rule against finite differences.
//! Written once; the op tests, the eager policies and the bridge reuse it.

use tpu_core::host::{HostData, HostTensor};
use tpu_core::invalid;
use tpu_core::op::OpResult;
use tpu_core::op::{Attrs, Gen, HostTape, OpDef, Sample, Tape, Torch, Var, VjpArgs, run_reference};
use tpu_core::{DType, Device, Result, Tensor, policy};

/// An op's hand-picked samples followed by `random` generated ones.
pub fn cases(op: &OpDef, random: usize, seed: u64) -> Vec<Sample> {
    let mut all = (op.samples)();
    let mut g = Gen::new(seed);
    all.extend((0..random).map(|_| (op.arbitrary)(&mut g)));
    all
}

/// Runs `op` on `tpu:device` through the execution policy in force (a
/// binary that links no policy crate has none: link `tpu-eager`): upload,
/// dispatch, download.
pub fn run_on_tpu(
    device: usize,
    op: &OpDef,
    inputs: &[HostTensor],
    attrs: &Attrs,
) -> Result<Vec<HostTensor>> {
    let device = Device::Tpu(device);
    let tensors = inputs
        .iter()
        .map(|x| Tensor::from_host(x.clone(), device))
        .collect::<Result<Vec<_>>>()?;
    policy::call(op.name, &tensors, attrs, Some(device))?
        .iter()
        .map(Tensor::to_host)
        .collect()
}

fn describe(sample: &Sample) -> String {
    let types: Vec<String> = sample.inputs.iter().map(|x| x.ty().to_string()).collect();
    format!("inputs ({}) attrs {}", types.join(", "), sample.attrs)
}

/// Checks one sample: `run` must agree with the reference within the op's
/// tolerance for each output dtype.
pub fn check_sample(
    op: &OpDef,
    sample: &Sample,
    run: impl Fn(&OpDef, &[HostTensor], &Attrs) -> Result<Vec<HostTensor>>,
) -> OpResult<()> {
    let fail = |why: String| Err(invalid!("{}: {} — {why}", op.name, describe(sample)));
    let expected = match run_reference(op, &sample.inputs, &sample.attrs) {
        Ok(e) => e,
        Err(e) => return fail(format!("reference failed: {e}")),
    };
    let actual = match run(op, &sample.inputs, &sample.attrs) {
        Ok(a) => a,
        Err(e) => return fail(format!("run failed: {e}")),
    };
    if actual.len() != expected.len() {
        return fail(format!(
            "{} outputs, reference has {}",
            actual.len(),
            expected.len()
        ));
    }
    for (i, (a, e)) in actual.iter().zip(&expected).enumerate() {
        if let Err(why) = tpu_core::host::assert_close(a, e, (op.tolerance)(e.dtype())) {
            return fail(format!("output {i}: {why}"));
        }
    }
    Ok(())
}

/// True when `x` carries a gradient (a float or complex tensor).
fn differentiable(x: &HostTensor) -> bool {
    x.dtype().is_inexact()
}

/// The full-precision type gradients of `x` are checked in: f64, or c128
/// for complex tensors.
fn wide(x: &HostTensor) -> DType {
    if x.dtype().is_complex() {
        DType::C128
    } else {
        DType::F64
    }
}

/// The real inner product, a complex number counting as its two parts:
/// with it, PyTorch's gradient of a real loss `L` is the `g` for which
/// `dL = <g, dx>`.
fn dot(a: &HostTensor, b: &HostTensor) -> f64 {
    let (a, b) = (a.to_complex(), b.to_complex());
    a.iter()
        .zip(b.iter())
        .map(|(x, y)| x.re * y.re + x.im * y.im)
        .sum()
}

fn axpy(x: &HostTensor, dir: &HostTensor, eps: f64) -> HostTensor {
    if x.dtype().is_complex() {
        let (x, d) = (x.to_complex(), dir.to_complex());
        HostTensor::complex(DType::C128, &x + &d.mapv(|v| v * eps))
    } else {
        let (x64, d) = (x.to_f64(), dir.to_f64());
        HostTensor::float(DType::F64, &x64 + &(d * eps))
    }
}

/// What [`check_vjp`] did with one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VjpCheck {
    /// The backward rule met finite differences.
    Checked,
    /// The case could not be checked, and why: the suite counts and lists
    /// these, so a rule no case reaches is visible.
    Unchecked(&'static str),
}

/// One backward case: the inputs (float ones promoted to f64), the
/// reference's outputs there, random cotangents, and the gradients the
/// op's backward rule gives for them (`None` for inputs without one).
#[derive(Clone, Debug)]
pub struct VjpCase {
    /// The inputs, float ones in f64.
    pub inputs: Vec<HostTensor>,
    /// The reference's outputs at `inputs`.
    pub outputs: Vec<HostTensor>,
    /// One cotangent per output (zeros for non-float outputs).
    pub cotangents: Vec<HostTensor>,
    /// The backward rule's gradient for each input.
    pub grads: Vec<Option<HostTensor>>,
}

/// Runs `op`'s backward rule on `sample` with float inputs promoted to f64
/// and random cotangents. `Ok(Err(why))` when the case cannot be checked;
/// `Err` when the reference or the rule fails.
pub fn vjp_case(
    op: &OpDef,
    sample: &Sample,
    seed: u64,
) -> OpResult<std::result::Result<VjpCase, &'static str>> {
    let Some(vjp) = op.vjp else {
        return Ok(Err("no backward rule"));
    };
    // Promote to f64 and nudge off the low-precision grid, so finite
    // differences never straddle a kink at a representable value.
    let mut g = Gen::new(seed);
    let inputs: Vec<HostTensor> = sample
        .inputs
        .iter()
        .map(|x| {
            if differentiable(x) {
                let jitter = g.tensor_in(wide(x), &x.shape(), -1e-4, 1e-4);
                axpy(&x.cast(wide(x)), &jitter, 1.0)
            } else {
                x.clone()
            }
        })
        .collect();
    if !inputs.iter().any(differentiable) {
        return Ok(Err("no float input"));
    }
    let outputs = run_reference(op, &inputs, &sample.attrs)
        .map_err(|e| format!("reference failed in f64: {e}"))?;
    // Gradients are checked in full precision; an op asked for a narrower or
    // non-float output (cast to bf16, argmax) is not checked here.
    if outputs
        .iter()
        .any(|o| differentiable(o) && o.dtype() != wide(o))
    {
        return Ok(Err("output narrower than f64"));
    }
    if !outputs.iter().any(differentiable) {
        return Ok(Err("no float output"));
    }
    let cotangents: Vec<HostTensor> = outputs
        .iter()
        .map(|o| {
            if differentiable(o) {
                g.tensor_in(wide(o), &o.shape(), -1.0, 1.0)
            } else {
                HostTensor::float(o.dtype(), o.to_f64().mapv(|_| 0.0))
            }
        })
        .collect();

    let mut tape = HostTape::new();
    let in_vars: Vec<Var> = inputs.iter().map(|x| tape.push(x.clone())).collect();
    let out_vars: Vec<Var> = outputs.iter().map(|x| tape.push(x.clone())).collect();
    let grad_vars: Vec<Var> = cotangents.iter().map(|x| tape.push(x.clone())).collect();
    let args = VjpArgs {
        inputs: &in_vars,
        outputs: &out_vars,
        grads: &grad_vars,
        attrs: &sample.attrs,
    };
    let grad_vars =
        vjp(&mut tape as &mut dyn Tape, &args).map_err(|e| format!("backward rule failed: {e}"))?;
    if grad_vars.len() != inputs.len() {
        return Err(invalid!(
            "{} gradients for {} inputs",
            grad_vars.len(),
            inputs.len()
        ));
    }
    let mut grads = Vec::with_capacity(inputs.len());
    for (grad, x) in grad_vars.iter().zip(&inputs) {
        let grad = match grad {
            Some(v) => Some(tape.value(*v)?.clone()),
            None if differentiable(x) => return Err("no gradient for a float input".into()),
            None => None,
        };
        if let Some(gt) = &grad
            && gt.ty() != x.ty()
        {
            return Err(invalid!("gradient {} for input {}", gt.ty(), x.ty()));
        }
        grads.push(grad);
    }
    Ok(Ok(VjpCase {
        inputs,
        outputs,
        cotangents,
        grads,
    }))
}

/// Checks `op`'s backward rule on `sample` (float inputs promoted to f64)
/// against central finite differences of its reference, along one random
/// direction: `<vjp(g), v> ≈ <g, (f(x + εv) - f(x - εv)) / 2ε>`.
pub fn check_vjp(op: &OpDef, sample: &Sample, seed: u64) -> OpResult<VjpCheck> {
    let fail = |why: String| {
        Err(invalid!(
            "{} backward: {} — {why}",
            op.name,
            describe(sample)
        ))
    };
    let case = match vjp_case(op, sample, seed) {
        Ok(Ok(case)) => case,
        Ok(Err(why)) => return Ok(VjpCheck::Unchecked(why)),
        Err(e) => return fail(e.message),
    };
    let mut g = Gen::new(seed ^ 0xd1ec);
    let directions: Vec<Option<HostTensor>> = case
        .inputs
        .iter()
        .map(|x| differentiable(x).then(|| g.tensor_in(wide(x), &x.shape(), -1.0, 1.0)))
        .collect();
    let analytic: f64 = case
        .grads
        .iter()
        .zip(&directions)
        .filter_map(|(grad, dir)| Some(dot(grad.as_ref()?, dir.as_ref()?)))
        .sum();
    let eps = 1e-6;
    let shifted = |sign: f64| -> OpResult<Vec<HostTensor>> {
        let moved: Vec<HostTensor> = case
            .inputs
            .iter()
            .zip(&directions)
            .map(|(x, d)| match d {
                Some(d) => axpy(x, d, sign * eps),
                None => x.clone(),
            })
            .collect();
        Ok(run_reference(op, &moved, &sample.attrs)?)
    };
    let (plus, centre, minus) = match (shifted(1.0), shifted(0.0), shifted(-1.0)) {
        (Ok(p), Ok(c), Ok(m)) => (p, c, m),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
            return fail(format!("reference failed at a shifted point: {e}"));
        }
    };
    // The directional derivative from differences over `from - to`.
    let slope = |from: &[HostTensor], to: &[HostTensor], width: f64| -> f64 {
        from.iter()
            .zip(to)
            .zip(&case.cotangents)
            .filter(|(_, c)| differentiable(c))
            .map(|((p, m), c)| {
                let diff = axpy(p, &m.cast(wide(m)), -1.0);
                dot(&diff, c) / width
            })
            .sum()
    };
    let numeric = slope(&plus, &minus, 2.0 * eps);
    // A piecewise op (floor, remainder) sampled within `eps` of a jump has
    // one-sided differences that disagree; no derivative exists there.
    let (right, left) = (slope(&plus, &centre, eps), slope(&centre, &minus, eps));
    if (right - left).abs() > 1e-3 * right.abs().max(left.abs()).max(1.0) {
        return Ok(VjpCheck::Unchecked(
            "a jump or kink within finite-difference reach",
        ));
    }
    let scale = analytic.abs().max(numeric.abs()).max(1.0);
    if (analytic - numeric).abs() > 1e-5 * scale {
        return fail(format!(
            "vjp gives {analytic:.9}, finite differences {numeric:.9}"
        ));
    }
    Ok(VjpCheck::Checked)
}

/// Every registered op, or only those named in `TPU_RS_OPS`
/// (comma-separated): a name no op has is an error, so a typo never leaves
/// a suite with nothing to check.
pub fn selected_ops() -> Result<Vec<&'static OpDef>> {
    let registry = crate::registry()?;
    let Ok(only) = std::env::var("TPU_RS_OPS") else {
        return Ok(registry.iter().collect());
    };
    only.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|name| registry.get(name))
        .collect()
}

/// A markdown table of every registered op: dtypes, flags, backward rule.
pub fn coverage_table() -> Result<String> {
    let registry = crate::registry()?;
    let mut out = String::from(
        "# Ops\n\nGenerated from the registry by `cargo test -p tpu-ops --test coverage`; do not edit.\n\n",
    );
    let with_vjp = registry.iter().filter(|op| op.vjp.is_some()).count();
    out.push_str(&format!(
        "{} ops, {} with a backward rule.\n\n",
        registry.len(),
        with_vjp
    ));
    out.push_str(
        "An op's reference is PyTorch-checked when the parity test (`cargo test -p tpu-ops \
         --test parity`) runs its cases through the PyTorch function its record names and \
         they agree; its gradient, when `torch.autograd` agrees with its backward rule too.\n\n",
    );
    out.push_str("| op | inputs | dtypes | backward | PyTorch-checked | flags | defined in |\n| --- | --- | --- | --- | --- | --- | --- |\n");
    for op in registry.iter() {
        let dtypes: Vec<&str> = op.dtypes.iter().map(|d| d.name()).collect();
        let arity = match op.arity {
            tpu_core::op::Arity::Exactly(n) => n.to_string(),
            tpu_core::op::Arity::AtLeast(n) => format!("{n}+"),
        };
        let flags = flag_names(op.flags).join(", ");
        let file = op.location.split(':').next().unwrap_or_default();
        let file = file.split("src/").last().unwrap_or(file);
        out.push_str(&format!(
            "| `{}` | {arity} | {} | {} | {} | {flags} | `{file}` |\n",
            op.name,
            dtypes.join(" "),
            if op.vjp.is_some() { "yes" } else { "—" },
            pytorch_checked(op),
        ));
    }
    Ok(out)
}

/// What the parity test checks of `op` against PyTorch (it fails when an
/// op with a PyTorch expression has no agreeing case of either kind).
fn pytorch_checked(op: &OpDef) -> String {
    match op.torch {
        Torch::Unmatched(why) => format!("no: {why}"),
        Torch::Expr(_) => {
            let gradients = op.vjp.is_some()
                && cases(op, 12, 0x9ad)
                    .iter()
                    .enumerate()
                    .any(|(i, s)| matches!(vjp_case(op, s, i as u64), Ok(Ok(_))));
            if gradients {
                "reference, gradient"
            } else {
                "reference"
            }
            .to_string()
        }
    }
}

fn flag_names(flags: tpu_core::op::Flags) -> Vec<&'static str> {
    use tpu_core::op::Flags;
    [
        (Flags::ELEMENTWISE, "elementwise"),
        (Flags::REDUCTION, "reduction"),
        (Flags::VIEW, "view"),
        (Flags::HOST_SYNC, "host-sync"),
        (Flags::RANDOM, "random"),
        (Flags::NOT_FUSIBLE, "not-fusible"),
        (Flags::NOT_DIFFERENTIABLE, "not-differentiable"),
    ]
    .into_iter()
    .filter(|(f, _)| flags.contains(*f))
    .map(|(_, n)| n)
    .collect()
}

/// True when some input and some output of `sample` are floats: the op
/// should have a backward rule unless flagged otherwise.
pub fn looks_differentiable(op: &OpDef, sample: &Sample) -> bool {
    let float_in = sample
        .inputs
        .iter()
        .any(|x| matches!(x.data(), HostData::Float(_)));
    let float_out = run_reference(op, &sample.inputs, &sample.attrs)
        .map(|outs| outs.iter().any(|o| o.dtype().is_float()))
        .unwrap_or(false);
    float_in && float_out
}
