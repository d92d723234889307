//! The op registry end to end: any op, with inputs and attributes bent out
//! of a valid call, through inference, the `cpu` reference and every eager
//! policy on the PJRT device (lowering, compile, execute).

use std::sync::OnceLock;

use arbitrary::{Result, Unstructured};
use tpu_core::host::assert_close;
use tpu_core::op::{Attr, Flags, Gen, OpDef, Sample, check_inputs, registry, tensor_bytes};
use tpu_core::policy::{EagerMode, call, with_eager_mode};
use tpu_core::{DType, Device, Error, ErrorCode, HostTensor, Runtime, Shape, Tensor};

/// Calls that the target runs; larger ones only go through inference.
const MAX_RUN_BYTES: u64 = 1 << 20;

/// One op call from arbitrary bytes: a value or a typed error, wherever
/// it runs. Input that starts with an op's name and a NUL byte calls that
/// op (the corpus holds one such seed per op); other input picks one.
pub fn op_call(data: &[u8]) {
    tpu_eager::link();
    let ops = registry().expect("the op registry");
    let named = data.iter().position(|&b| b == 0).and_then(|end| {
        let name = std::str::from_utf8(&data[..end]).ok()?;
        Some((ops.get(name).ok()?, &data[end + 1..]))
    });
    let (op, rest) = match named {
        Some(found) => found,
        None => {
            let all: Vec<&'static OpDef> = ops.iter().collect();
            let mut u = Unstructured::new(data);
            let Ok(&op) = u.choose(&all) else { return };
            (op, u.take_rest())
        }
    };
    if let Ok(sample) = bent_call(op, &mut Unstructured::new(rest)) {
        run(op, &sample);
    }
}

/// A valid random call of `op`, then up to four edits: an input replaced,
/// dropped or repeated; an attribute changed, added or removed.
fn bent_call(op: &OpDef, u: &mut Unstructured<'_>) -> Result<Sample> {
    let mut g = Gen::new(u.arbitrary()?);
    let mut sample = (op.arbitrary)(&mut g);
    let dictionary = dictionary();
    for _ in 0..u.int_in_range(0..=4)? {
        let inputs = &mut sample.inputs;
        match u.int_in_range(0..=6)? {
            6 if !inputs.is_empty() => {
                let i = u.choose_index(inputs.len())?;
                inputs[i] = extreme(u, &inputs[i])?;
            }
            0 if !inputs.is_empty() => {
                let i = u.choose_index(inputs.len())?;
                let dtype = *u.choose(&DType::ALL)?;
                let rank = u.int_in_range(0..=4)?;
                let dims = (0..rank)
                    .map(|_| u.int_in_range(0..=5))
                    .collect::<Result<Vec<usize>>>()?;
                inputs[i] = g.tensor(dtype, &Shape::from(dims));
            }
            1 if !inputs.is_empty() => {
                inputs.remove(u.choose_index(inputs.len())?);
            }
            2 if !inputs.is_empty() => {
                let copy = inputs[u.choose_index(inputs.len())?].clone();
                inputs.push(copy);
            }
            3 => {
                let keys: Vec<&'static str> = sample.attrs.iter().map(|(k, _)| k).collect();
                if !keys.is_empty() {
                    let key = *u.choose(&keys)?;
                    sample.attrs.set(key, attr(u, &dictionary.strings)?);
                }
            }
            4 => {
                let key = *u.choose(&dictionary.keys)?;
                sample.attrs.set(key, attr(u, &dictionary.strings)?);
            }
            _ => {
                let kept = sample
                    .attrs
                    .iter()
                    .filter(|_| u.ratio(3, 4).unwrap_or(true));
                sample.attrs = kept.fold(Default::default(), |a, (k, v)| a.with(k, v.clone()));
            }
        }
    }
    Ok(sample)
}

/// `like` with every element set to one edge value: an index far out of
/// range, a negative one, NaN, an infinity.
fn extreme(u: &mut Unstructured<'_>, like: &HostTensor) -> Result<HostTensor> {
    let (dtype, shape) = (like.dtype(), like.shape());
    let n = shape.numel();
    let t = if dtype.is_float() {
        let v = *u.choose(&[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -1e30,
            1e30,
            -0.0,
        ])?;
        HostTensor::from_f64(dtype, shape, vec![v; n])
    } else {
        let v = *u.choose(&[i64::MIN, i64::MAX, -1, -7, 1 << 33, 255])?;
        HostTensor::from_i64(dtype, shape, vec![v; n])
    };
    Ok(t.unwrap_or_else(|| like.clone()))
}

/// Runs the call everywhere it can run; panics only on a broken property.
/// Once inference accepts a call, every device either runs it, with the
/// output types inference promised, or refuses it with an error the call
/// may meet: running out of memory, or (on `cpu`, whose reference reads
/// values, and for ops that read values on the device) the op's own typed
/// error about the values. Where the op is deterministic and its inputs
/// ordinary, the device's values are the reference's.
fn run(op: &OpDef, sample: &Sample) {
    let types: Vec<_> = sample.inputs.iter().map(|t| t.ty()).collect();
    let outputs = match check_inputs(op, &types, &sample.attrs, "cpu") {
        Ok(outputs) => outputs,
        Err(Error::InvalidInput { op: name, .. }) => {
            assert_eq!(name, op.name, "an error of `{}` names `{name}`", op.name);
            return;
        }
        Err(other) => panic!("inference of `{}` failed untyped: {other}", op.name),
    };
    let small =
        |t: &tpu_core::stablehlo::TensorType| tensor_bytes(t).is_some_and(|b| b <= MAX_RUN_BYTES);
    if !outputs.iter().chain(&types).all(small) {
        return;
    }
    let reference = on_device(op, sample, &outputs, Device::Cpu);
    if Runtime::global().is_err() {
        return;
    }
    let comparable = !op.flags.contains(Flags::RANDOM) && sample.inputs.iter().all(ordinary);
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        let got = with_eager_mode(mode, || on_device(op, sample, &outputs, Device::tpu(0)))
            .expect("eager mode");
        if let (Some(got), Some(want), true) = (&got, &reference, comparable) {
            for (i, (g, w)) in got.iter().zip(want).enumerate() {
                if let Err(e) = assert_close(g, w, (op.tolerance)(w.dtype()).scaled(4.0)) {
                    panic!(
                        "`{}` under {mode}: output {i} is not the reference's: {e}",
                        op.name
                    );
                }
            }
        }
    }
}

/// Inputs far from overflow and rounding cliffs, where a device's float32
/// and the reference's float64 both compute the op's value: floats finite
/// and within 1e4, integers within 2^20.
fn ordinary(t: &HostTensor) -> bool {
    if t.dtype().is_float() {
        t.to_f64().iter().all(|v| v.is_finite() && v.abs() <= 1e4)
    } else {
        t.to_f64().iter().all(|v| v.abs() <= f64::from(1 << 20))
    }
}

/// The call on `device`: its outputs read back, each of the type inference
/// promised, or `None` when the device refused it with an error the call
/// may meet (see [`run`]). Any other error is a broken property.
fn on_device(
    op: &OpDef,
    sample: &Sample,
    inferred: &[tpu_core::stablehlo::TensorType],
    device: Device,
) -> Option<Vec<HostTensor>> {
    let inputs: Vec<Tensor> = sample
        .inputs
        .iter()
        .map(|h| Tensor::from_host(h.clone(), device).expect("uploading a small input"))
        .collect();
    let refused = |e: &Error, stage: &str| {
        assert!(
            may_meet(op, device, e),
            "`{}` on {device}: inference accepted the call, then {stage} failed: {e}",
            op.name
        );
    };
    let outputs = match call(op.name, &inputs, &sample.attrs, Some(device)) {
        Ok(outputs) => outputs,
        Err(e) => {
            refused(&e, "the call");
            return None;
        }
    };
    assert_eq!(
        outputs.len(),
        inferred.len(),
        "`{}` on {device}: output count",
        op.name
    );
    let mut hosts = Vec::with_capacity(outputs.len());
    for (out, want) in outputs.iter().zip(inferred) {
        assert_eq!(
            out.ty(),
            want,
            "`{}` on {device}: an output's type",
            op.name
        );
        match out.to_host() {
            Ok(host) => {
                assert_eq!(
                    &host.ty(),
                    want,
                    "`{}` on {device}: a read-back output",
                    op.name
                );
                hosts.push(host);
            }
            Err(e) => {
                refused(&e, "reading the result");
                return None;
            }
        }
    }
    Some(hosts)
}

/// True for an error an accepted call may meet on `device`: out of memory,
/// or the op's own typed error about its values where values are read (the
/// `cpu` reference, an op that syncs with the host).
fn may_meet(op: &OpDef, device: Device, err: &Error) -> bool {
    if is_out_of_memory(err) {
        return true;
    }
    let reads_values = device == Device::Cpu || op.flags.contains(Flags::HOST_SYNC);
    reads_values && names_op(err, op.name)
}

fn is_out_of_memory(err: &Error) -> bool {
    match err {
        Error::HostOutOfMemory { .. } => true,
        Error::Pjrt { code, .. } => *code == ErrorCode::ResourceExhausted,
        Error::OpFailed { source, .. } => is_out_of_memory(source),
        _ => false,
    }
}

/// True when `err` is `op`'s own typed error (its kind known).
fn names_op(err: &Error, op: &str) -> bool {
    match err {
        Error::InvalidInput { op: name, .. } => name == op,
        Error::OpFailed {
            op: name, source, ..
        } => name == op && source.op_error_kind().is_some(),
        _ => false,
    }
}

/// Attribute names and keyword values the registered ops use, gathered
/// from their samples: the vocabulary edits draw from.
struct Dictionary {
    keys: Vec<&'static str>,
    strings: Vec<String>,
}

fn dictionary() -> &'static Dictionary {
    static DICTIONARY: OnceLock<Dictionary> = OnceLock::new();
    DICTIONARY.get_or_init(|| {
        let mut keys = Vec::new();
        let mut strings = Vec::new();
        for op in registry().expect("the op registry").iter() {
            for sample in (op.samples)() {
                for (key, value) in sample.attrs.iter() {
                    keys.push(key);
                    if let Attr::Str(s) = value {
                        strings.push(s.clone());
                    }
                }
            }
        }
        keys.sort_unstable();
        keys.dedup();
        strings.sort_unstable();
        strings.dedup();
        strings.push(String::new());
        Dictionary { keys, strings }
    })
}

/// Any attribute value, biased toward the edges: negative, zero, huge.
fn attr(u: &mut Unstructured<'_>, strings: &[String]) -> Result<Attr> {
    Ok(match u.int_in_range(0..=5)? {
        0 => Attr::Bool(u.arbitrary()?),
        1 => Attr::Int(int(u)?),
        2 => Attr::Ints(
            (0..u.int_in_range(0..=5)?)
                .map(|_| int(u))
                .collect::<Result<_>>()?,
        ),
        3 => Attr::Float(*u.choose(&[
            0.0,
            -1.0,
            0.5,
            1e300,
            -1e-300,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ])?),
        4 => Attr::DType(*u.choose(&DType::ALL)?),
        _ => Attr::Str(match u.ratio(3, 4)? {
            true => u.choose(strings)?.clone(),
            false => u.arbitrary()?,
        }),
    })
}

fn int(u: &mut Unstructured<'_>) -> Result<i64> {
    if u.ratio(3, 4)? {
        u.int_in_range(-4..=6)
    } else {
        Ok(*u.choose(&[i64::MIN, i64::MAX, 1 << 40, -(1 << 40), 1 << 31, 100_000])?)
    }
}
