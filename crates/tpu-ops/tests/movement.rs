//! Hand-checked PyTorch results for the movement ops, on the reference and
//! on the PJRT plugin (through the Strict policy).

use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::op::{Attrs, run_reference};
use tpu_ops::conformance::run_on_tpu;

/// The op registry, with the policies that run ops on the device linked.
fn registry() -> tpu_core::Result<&'static tpu_core::op::Registry> {
    tpu_eager::link();
    tpu_ops::registry()
}

/// Every op of this family, as registered.
const NAMES: &[&str] = &[
    "reshape",
    "broadcast_to",
    "permute",
    "transpose",
    "unsqueeze",
    "squeeze",
    "slice",
    "narrow",
    "select",
    "concat",
    "stack",
    "split",
    "chunk",
    "pad",
    "flip",
    "triu",
    "tril",
    "gather",
    "index_select",
    "take_along_dim",
    "scatter",
    "scatter_add",
    "index_add",
    "embedding",
    "one_hot",
    "sort",
    "topk",
];

#[test]
fn every_movement_op_is_registered() {
    let registry = registry().expect("registry");
    for name in NAMES {
        assert!(registry.get(name).is_ok(), "`{name}` is not registered");
    }
}

fn f(shape: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, shape.to_vec(), v.to_vec()).expect("values fill the shape")
}

fn i(shape: &[usize], v: &[i64]) -> HostTensor {
    HostTensor::from_i64(DType::I64, shape.to_vec(), v.to_vec()).expect("values fill the shape")
}

/// Runs `op` on the reference and the plugin; both must give `expected`
/// (compared as f64 values with shapes).
fn check(op: &str, inputs: Vec<HostTensor>, attrs: Attrs, expected: &[(&[usize], &[f64])]) {
    let def = registry().expect("registry").get(op).expect("op");
    let reference = run_reference(def, &inputs, &attrs).expect("reference");
    let device = run_on_tpu(0, def, &inputs, &attrs).expect("device");
    for (name, outs) in [("reference", reference), ("device", device)] {
        assert_eq!(outs.len(), expected.len(), "{op} {name}: output count");
        for (k, (o, (shape, values))) in outs.iter().zip(expected).enumerate() {
            assert_eq!(o.dims(), *shape, "{op} {name}: output {k} shape");
            let got: Vec<f64> = o.to_f64().iter().copied().collect();
            assert_eq!(got, *values, "{op} {name}: output {k} values");
        }
    }
}

fn arange(n: usize) -> HostTensor {
    f(&[n], &(0..n).map(|v| v as f64).collect::<Vec<_>>())
}

#[test]
fn slicing_clamps_like_pytorch() {
    let a = |s: i64, e: i64, st: i64| {
        Attrs::new()
            .with("dim", 0i64)
            .with("start", s)
            .with("end", e)
            .with("step", st)
    };
    check(
        "slice",
        vec![arange(10)],
        a(-3, 100, 2),
        &[(&[2], &[7.0, 9.0])],
    );
    check("slice", vec![arange(10)], a(8, 2, 1), &[(&[0], &[])]);
    check(
        "slice",
        vec![arange(10)],
        a(-100, -7, 1),
        &[(&[3], &[0.0, 1.0, 2.0])],
    );
    let narrow = Attrs::new()
        .with("dim", 0i64)
        .with("start", -2i64)
        .with("length", 2i64);
    check("narrow", vec![arange(5)], narrow, &[(&[2], &[3.0, 4.0])]);
    let x = f(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let select = Attrs::new().with("dim", 1i64).with("index", -1i64);
    check("select", vec![x], select, &[(&[2], &[3.0, 6.0])]);
}

#[test]
fn splits_and_chunks_like_pytorch() {
    let sizes = |n: i64| Attrs::new().with("dim", 0i64).with("sizes", n);
    check(
        "split",
        vec![arange(5)],
        sizes(2),
        &[(&[2], &[0.0, 1.0]), (&[2], &[2.0, 3.0]), (&[1], &[4.0])],
    );
    let chunks = |n: i64| Attrs::new().with("chunks", n);
    check(
        "chunk",
        vec![arange(5)],
        chunks(3),
        &[(&[2], &[0.0, 1.0]), (&[2], &[2.0, 3.0]), (&[1], &[4.0])],
    );
    check(
        "chunk",
        vec![arange(6)],
        chunks(4),
        &[
            (&[2], &[0.0, 1.0]),
            (&[2], &[2.0, 3.0]),
            (&[2], &[4.0, 5.0]),
        ],
    );
    check(
        "chunk",
        vec![arange(0)],
        chunks(2),
        &[(&[0], &[]), (&[0], &[])],
    );
}

#[test]
fn joins_promote_and_skip_legacy_empties() {
    let ones = f(&[2, 2], &[1.0; 4]);
    let ints = HostTensor::from_i64(DType::I32, vec![1, 2], vec![7, 8]).expect("ints");
    check(
        "concat",
        vec![arange(0), ones.clone(), ints],
        Attrs::new(),
        &[(&[3, 2], &[1.0, 1.0, 1.0, 1.0, 7.0, 8.0])],
    );
    check(
        "stack",
        vec![arange(2), arange(2)],
        Attrs::new().with("dim", -1i64),
        &[(&[2, 2], &[0.0, 0.0, 1.0, 1.0])],
    );
}

#[test]
fn pads_crop_and_triangles_mask() {
    let x = f(&[1, 4], &[0.0, 1.0, 2.0, 3.0]);
    let pad = Attrs::new().with("pad", vec![1i64, -2]).with("value", 9.0);
    check("pad", vec![x.clone()], pad, &[(&[1, 3], &[9.0, 0.0, 1.0])]);
    let pad = Attrs::new().with("pad", vec![0i64, 0, 1, 0]);
    check(
        "pad",
        vec![x],
        pad,
        &[(&[2, 4], &[0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 3.0])],
    );
    let ones = f(&[3, 3], &[1.0; 9]);
    let d = |k: i64| Attrs::new().with("diagonal", k);
    check(
        "triu",
        vec![ones.clone()],
        d(1),
        &[(&[3, 3], &[0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])],
    );
    check(
        "tril",
        vec![ones],
        d(-1),
        &[(&[3, 3], &[0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0])],
    );
}

#[test]
fn gathers_like_pytorch() {
    let x = f(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let dim = |d: i64| Attrs::new().with("dim", d);
    check(
        "gather",
        vec![x.clone(), i(&[2, 2], &[0, 0, 1, 0])],
        dim(1),
        &[(&[2, 2], &[1.0, 1.0, 4.0, 3.0])],
    );
    check(
        "index_select",
        vec![x, i(&[3], &[1, 1, 0])],
        dim(0),
        &[(&[3, 2], &[3.0, 4.0, 3.0, 4.0, 1.0, 2.0])],
    );
    let y = f(&[2, 3], &[10.0, 30.0, 20.0, 60.0, 40.0, 50.0]);
    check(
        "take_along_dim",
        vec![y.clone(), i(&[2, 1], &[0, 1])],
        dim(1),
        &[(&[2, 1], &[10.0, 40.0])],
    );
    check(
        "take_along_dim",
        vec![y.clone(), i(&[1, 1], &[2])],
        dim(1),
        &[(&[2, 1], &[20.0, 50.0])],
    );
    check(
        "take_along_dim",
        vec![y, i(&[2], &[5, 0])],
        Attrs::new(),
        &[(&[2], &[50.0, 10.0])],
    );
    let w = f(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    check(
        "embedding",
        vec![w, i(&[1, 2], &[2, 0])],
        Attrs::new(),
        &[(&[1, 2, 2], &[5.0, 6.0, 1.0, 2.0])],
    );
    check(
        "one_hot",
        vec![i(&[2], &[0, 2])],
        Attrs::new().with("num_classes", 3i64),
        &[(&[2, 3], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0])],
    );
}

#[test]
fn scatters_like_pytorch() {
    let dim = |d: i64| Attrs::new().with("dim", d);
    let src = f(&[2, 3], &[5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
    check(
        "scatter",
        vec![f(&[2, 3], &[0.0; 6]), i(&[2, 1], &[2, 0]), src],
        dim(1),
        &[(&[2, 3], &[0.0, 0.0, 5.0, 8.0, 0.0, 0.0])],
    );
    check(
        "scatter_add",
        vec![
            f(&[3], &[1.0; 3]),
            i(&[4], &[0, 0, 2, 0]),
            f(&[4], &[1.0, 2.0, 3.0, 4.0]),
        ],
        dim(0),
        &[(&[3], &[8.0, 1.0, 4.0])],
    );
    check(
        "index_add",
        vec![
            f(&[3], &[0.0; 3]),
            i(&[3], &[0, 0, 2]),
            f(&[3], &[1.0, 2.0, 3.0]),
        ],
        dim(0),
        &[(&[3], &[3.0, 0.0, 3.0])],
    );
}

#[test]
fn sorts_are_stable_and_topk_picks_extremes() {
    let x = i(&[4], &[2, 1, 2, 1]);
    check(
        "sort",
        vec![x.clone()],
        Attrs::new().with("descending", true),
        &[(&[4], &[2.0, 2.0, 1.0, 1.0]), (&[4], &[0.0, 2.0, 1.0, 3.0])],
    );
    check(
        "sort",
        vec![x],
        Attrs::new(),
        &[(&[4], &[1.0, 1.0, 2.0, 2.0]), (&[4], &[1.0, 3.0, 0.0, 2.0])],
    );
    let y = f(&[3], &[1.0, 3.0, 2.0]);
    check(
        "topk",
        vec![y.clone()],
        Attrs::new().with("k", 2i64),
        &[(&[2], &[3.0, 2.0]), (&[2], &[1.0, 2.0])],
    );
    check(
        "topk",
        vec![y],
        Attrs::new().with("k", 1i64).with("largest", false),
        &[(&[1], &[1.0]), (&[1], &[0.0])],
    );
    let nan = f(&[3], &[1.0, f64::NAN, 0.0]);
    let def = registry().expect("registry").get("sort").expect("op");
    for desc in [false, true] {
        let attrs = Attrs::new().with("descending", desc);
        let want = if desc { vec![1, 0, 2] } else { vec![2, 0, 1] };
        let host = run_reference(def, std::slice::from_ref(&nan), &attrs).expect("reference");
        let device = run_on_tpu(0, def, std::slice::from_ref(&nan), &attrs).expect("device");
        for out in [host, device] {
            let idx: Vec<i64> = out[1].to_i64().iter().copied().collect();
            assert_eq!(idx, want, "NaN counts as the largest value");
        }
    }
}

#[test]
fn squeeze_keeps_listed_dims_that_are_not_one() {
    let x = f(&[1, 3, 1], &[1.0, 2.0, 3.0]);
    check(
        "squeeze",
        vec![x.clone()],
        Attrs::new().with("dims", vec![0i64, 1]),
        &[(&[3, 1], &[1.0, 2.0, 3.0])],
    );
    check(
        "squeeze",
        vec![x],
        Attrs::new(),
        &[(&[3], &[1.0, 2.0, 3.0])],
    );
}
