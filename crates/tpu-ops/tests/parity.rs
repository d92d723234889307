//! Every op against PyTorch CPU: each record's PyTorch expression
//! (`OpDef::torch`) runs on the op's samples and generated cases, forward in
//! the sample's dtypes and, for ops with a backward rule, through
//! `torch.autograd` in f64, and must agree with the op's reference and its
//! backward rule. PyTorch is an oracle written by other people: where it
//! and the reference disagree, the reference is wrong.
//!
//! PyTorch comes from `TPU_RS_TORCH_PYTHON`, else the workspace's `.venv`;
//! without one the test is skipped, unless `TPU_RS_REQUIRE_TORCH` is set.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::{Value, json};
use tpu_core::host::{HostData, HostTensor, Tolerance, assert_close};
use tpu_core::op::{Attr, OpDef, Sample, Torch, run_reference};
use tpu_core::{Complex, DType};
use tpu_ops::conformance::{cases, selected_ops, vjp_case};

/// Generated cases per op (`TPU_RS_CONFORMANCE_CASES`, default 12), as in
/// the conformance suite.
fn random_cases() -> usize {
    std::env::var("TPU_RS_CONFORMANCE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(12)
}

/// Both sides compute gradients in f64; they differ only by the order of
/// float operations (or by the op's own f64 tolerance, where that is
/// looser: PyTorch's f64 kernel is the less exact side).
const GRAD_TOLERANCE: Tolerance = Tolerance::new(1e-8, 1e-6);

fn grad_tolerance(op: &OpDef) -> Tolerance {
    let own = (op.tolerance)(DType::F64);
    Tolerance::new(
        GRAD_TOLERANCE.atol.max(own.atol),
        GRAD_TOLERANCE.rtol.max(own.rtol),
    )
}

fn python() -> Option<String> {
    let candidates = [
        std::env::var("TPU_RS_TORCH_PYTHON").ok(),
        Some(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python").to_string()),
    ];
    candidates.into_iter().flatten().find(|p| {
        std::process::Command::new(p)
            .args(["-c", "import torch"])
            .output()
            .is_ok_and(|o| o.status.success())
    })
}

/// What PyTorch's answer is compared with.
enum Expected {
    /// The reference's outputs, compared within the op's tolerance.
    Outputs(Vec<HostTensor>),
    /// The backward rule's gradients, per input.
    Grads(Vec<Option<HostTensor>>),
}

/// One case sent to PyTorch.
struct Case {
    op: &'static OpDef,
    what: String,
    expected: Expected,
}

fn describe(op: &OpDef, inputs: &[HostTensor], sample: &Sample) -> String {
    let types: Vec<String> = inputs.iter().map(|x| x.ty().to_string()).collect();
    format!("{}({}) attrs {}", op.name, types.join(", "), sample.attrs)
}

/// A float as JSON, the non-finite ones as strings.
fn float_json(v: f64) -> Value {
    match v {
        v if v.is_nan() => json!("nan"),
        v if v == f64::INFINITY => json!("inf"),
        v if v == f64::NEG_INFINITY => json!("-inf"),
        v => json!(v),
    }
}

fn json_float(x: &Value) -> Option<f64> {
    match x.as_str() {
        Some("nan") => Some(f64::NAN),
        Some("inf") => Some(f64::INFINITY),
        Some("-inf") => Some(f64::NEG_INFINITY),
        Some(_) => None,
        None => x.as_f64(),
    }
}

/// A tensor as JSON: row-major values, a complex value as `[re, im]`.
fn tensor_json(t: &HostTensor) -> Value {
    let data: Vec<Value> = match t.data() {
        HostData::Float(a) => a.iter().map(|&v| float_json(v)).collect(),
        HostData::Int(a) => a.iter().map(|&v| json!(v)).collect(),
        HostData::Complex(a) => a
            .iter()
            .map(|v| json!([float_json(v.re), float_json(v.im)]))
            .collect(),
    };
    json!({"dtype": t.dtype().name(), "shape": t.dims(), "data": data})
}

fn json_tensor(v: &Value) -> Result<HostTensor, String> {
    let bad = || format!("malformed tensor from PyTorch: {v}");
    let name = v["dtype"].as_str().ok_or_else(bad)?;
    let dtype = DType::ALL
        .into_iter()
        .find(|d| d.name() == name)
        .ok_or_else(bad)?;
    let shape: Vec<usize> = v["shape"]
        .as_array()
        .ok_or_else(bad)?
        .iter()
        .map(|d| d.as_u64().map(|d| d as usize))
        .collect::<Option<_>>()
        .ok_or_else(bad)?;
    let data = v["data"].as_array().ok_or_else(bad)?;
    let tensor = if dtype.is_complex() {
        let values = data
            .iter()
            .map(|x| Some(Complex::new(json_float(&x[0])?, json_float(&x[1])?)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(bad)?;
        ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&shape), values)
            .ok()
            .map(|a| HostTensor::complex(dtype, a))
    } else if dtype.is_float() {
        let values = data
            .iter()
            .map(json_float)
            .collect::<Option<Vec<f64>>>()
            .ok_or_else(bad)?;
        HostTensor::from_f64(dtype, shape, values)
    } else {
        let values = data
            .iter()
            .map(Value::as_i64)
            .collect::<Option<Vec<i64>>>()
            .ok_or_else(bad)?;
        HostTensor::from_i64(dtype, shape, values)
    };
    tensor.ok_or_else(bad)
}

fn attrs_json(sample: &Sample) -> Value {
    let attrs: serde_json::Map<String, Value> = sample
        .attrs
        .iter()
        .map(|(k, v)| {
            let v = match v {
                Attr::Bool(b) => json!({"bool": b}),
                Attr::Int(i) => json!({"int": i}),
                Attr::Ints(v) => json!({"ints": v}),
                Attr::Float(x) => json!({"float": x}),
                Attr::DType(d) => json!({"dtype": d.name()}),
                Attr::Str(s) => json!({"str": s}),
            };
            (k.to_string(), v)
        })
        .collect();
    Value::Object(attrs)
}

/// The forward and backward cases of `op`, and their JSON for PyTorch.
fn op_cases(op: &'static OpDef, expr: &str) -> Vec<(Case, Value)> {
    let mut out = Vec::new();
    for (i, sample) in cases(op, random_cases(), 0x9ad).iter().enumerate() {
        // A sample the reference rejects is the conformance suite's concern.
        if let Ok(outputs) = run_reference(op, &sample.inputs, &sample.attrs) {
            let json = json!({
                "op": op.name, "expr": expr, "kind": "forward",
                "inputs": sample.inputs.iter().map(tensor_json).collect::<Vec<_>>(),
                "attrs": attrs_json(sample),
            });
            let what = describe(op, &sample.inputs, sample);
            let expected = Expected::Outputs(outputs);
            out.push((Case { op, what, expected }, json));
        }
        // Where the value is not finite the gradient is not defined.
        if let Ok(Ok(case)) = vjp_case(op, sample, i as u64)
            && case
                .outputs
                .iter()
                .all(|o| o.to_complex().iter().all(|v| v.is_finite()))
        {
            let json = json!({
                "op": op.name, "expr": expr, "kind": "backward",
                "inputs": case.inputs.iter().map(tensor_json).collect::<Vec<_>>(),
                "attrs": attrs_json(sample),
                "cotangents": case.cotangents.iter().map(tensor_json).collect::<Vec<_>>(),
            });
            let what = format!("{} backward", describe(op, &case.inputs, sample));
            let expected = Expected::Grads(case.grads);
            out.push((Case { op, what, expected }, json));
        }
    }
    out
}

/// Compares PyTorch's `result` for `case`; `Ok(false)` when PyTorch has no
/// CPU kernel for the case's dtypes.
fn compare(case: &Case, result: &Value) -> Result<bool, String> {
    if let Some(error) = result["error"].as_str() {
        if result["unsupported"].as_bool() == Some(true) {
            return Ok(false);
        }
        return Err(format!("PyTorch raised {error}"));
    }
    let tensors = |key: &str| -> Result<Vec<Option<HostTensor>>, String> {
        result[key]
            .as_array()
            .ok_or_else(|| format!("no `{key}` in PyTorch's result {result}"))?
            .iter()
            .map(|v| {
                if v.is_null() {
                    Ok(None)
                } else {
                    json_tensor(v).map(Some)
                }
            })
            .collect()
    };
    match &case.expected {
        Expected::Outputs(expected) => {
            let actual = tensors("outputs")?;
            if actual.len() != expected.len() {
                return Err(format!(
                    "PyTorch gives {} outputs, the reference {}",
                    actual.len(),
                    expected.len()
                ));
            }
            for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
                let a = a.as_ref().ok_or("PyTorch gave no output")?;
                assert_close(a, e, (case.op.tolerance)(e.dtype()))
                    .map_err(|why| format!("output {i}: PyTorch {why} by the reference"))?;
            }
        }
        Expected::Grads(expected) => {
            let actual = tensors("grads")?;
            for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
                match (a, e) {
                    (Some(a), Some(e)) => {
                        assert_close(a, e, grad_tolerance(case.op)).map_err(|why| {
                            format!("gradient {i}: torch.autograd {why} by the backward rule")
                        })?
                    }
                    (None, None) => {}
                    _ => return Err(format!("gradient {i}: one side has none")),
                }
            }
        }
    }
    Ok(true)
}

#[derive(Default)]
struct Tally {
    forward: usize,
    backward: usize,
    backward_cases: usize,
    unsupported: usize,
}

#[test]
fn every_op_matches_pytorch() {
    let Some(python) = python() else {
        if std::env::var_os("TPU_RS_REQUIRE_TORCH").is_some() {
            panic!("TPU_RS_REQUIRE_TORCH is set but no Python with torch was found");
        }
        eprintln!("skipped: no Python with torch (set TPU_RS_TORCH_PYTHON)");
        return;
    };
    let ops = selected_ops().unwrap_or_else(|e| panic!("TPU_RS_OPS: {e}"));
    let mut unmatched = Vec::new();
    let mut all = Vec::new();
    for &op in &ops {
        match op.torch {
            Torch::Expr(expr) => all.extend(op_cases(op, expr)),
            Torch::Unmatched(why) => unmatched.push(format!("{} ({why})", op.name)),
        }
    }
    let (cases, json): (Vec<Case>, Vec<Value>) = all.into_iter().unzip();

    let dir = std::env::temp_dir().join(format!("tpu-rs-parity-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (cases_path, results_path) = (dir.join("cases.json"), dir.join("results.json"));
    std::fs::write(&cases_path, json!({"cases": json}).to_string()).expect("writing cases");
    let script: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests", "parity.py"]
        .iter()
        .collect();
    let status = std::process::Command::new(&python)
        .arg(&script)
        .arg(&cases_path)
        .arg(&results_path)
        .status()
        .expect("running parity.py");
    assert!(status.success(), "parity.py failed: {status}");
    let results: Value =
        serde_json::from_str(&std::fs::read_to_string(&results_path).expect("results"))
            .expect("results are JSON");
    let _ = std::fs::remove_dir_all(&dir);
    let results = results["results"].as_array().expect("a results list");
    assert_eq!(results.len(), cases.len(), "one result per case");

    let mut tally: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut failures = Vec::new();
    for (case, result) in cases.iter().zip(results) {
        let t = tally.entry(case.op.name).or_default();
        let backward = matches!(case.expected, Expected::Grads(_));
        t.backward_cases += usize::from(backward);
        match compare(case, result) {
            Ok(true) if backward => t.backward += 1,
            Ok(true) => t.forward += 1,
            Ok(false) => t.unsupported += 1,
            Err(why) => failures.push(format!("{}: {why}", case.what)),
        }
    }
    for &op in &ops {
        let Torch::Expr(_) = op.torch else { continue };
        let t = tally.entry(op.name).or_default();
        if t.forward == 0 {
            failures.push(format!("{}: no forward case ran on PyTorch", op.name));
        }
        if t.backward_cases > 0 && t.backward == 0 {
            failures.push(format!("{}: no backward case ran on PyTorch", op.name));
        }
    }

    let matched = ops.len() - unmatched.len();
    let with_grads = tally.values().filter(|t| t.backward > 0).count();
    let rules = ops.iter().filter(|op| op.vjp.is_some()).count();
    let unsupported: usize = tally.values().map(|t| t.unsupported).sum();
    println!(
        "{matched} of {} ops checked against PyTorch CPU ({} cases, {unsupported} with no \
         PyTorch CPU kernel for their dtype); gradients of {with_grads} of {rules} backward rules",
        ops.len(),
        cases.len(),
    );
    println!(
        "{} without a PyTorch counterpart: {}",
        unmatched.len(),
        unmatched.join(", ")
    );
    let unchecked_rules: Vec<&str> = ops
        .iter()
        .filter(|op| op.vjp.is_some() && tally.get(op.name).is_none_or(|t| t.backward == 0))
        .map(|op| op.name)
        .collect();
    println!(
        "backward rules PyTorch did not check: {}",
        unchecked_rules.join(", ")
    );
    assert!(
        failures.is_empty(),
        "{} cases disagree with PyTorch:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
