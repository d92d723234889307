//! Spot checks of the references against values PyTorch gives, and of the
//! errors PyTorch raises.

use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::op::OpResult;
use tpu_core::op::{Attrs, run_reference};

pub(crate) fn run(op: &str, inputs: Vec<HostTensor>, attrs: Attrs) -> OpResult<Vec<HostTensor>> {
    let def = crate::registry()?.get(op)?;
    Ok(run_reference(def, &inputs, &attrs)?)
}

pub(crate) fn values(t: &HostTensor) -> Vec<f64> {
    t.to_f64().iter().copied().collect()
}

pub(crate) fn f32s(dims: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F32, dims.to_vec(), v.to_vec()).unwrap()
}

pub(crate) fn f64s(dims: &[usize], v: &[f64]) -> HostTensor {
    HostTensor::from_f64(DType::F64, dims.to_vec(), v.to_vec()).unwrap()
}

pub(crate) fn ints(dtype: DType, dims: &[usize], v: &[i64]) -> HostTensor {
    HostTensor::from_i64(dtype, dims.to_vec(), v.to_vec()).unwrap()
}

pub(crate) fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x.is_nan() && y.is_nan()) || (x - y).abs() < 1e-6 * (1.0 + y.abs()))
}

#[test]
fn arg_reductions_pick_the_first_extreme() {
    let x = ints(DType::I32, &[2, 3], &[1, 5, 5, 2, 2, 0]);
    let r = run("argmax", vec![x.clone()], Attrs::new().with("dim", 1i64)).unwrap();
    assert_eq!((r[0].dtype(), values(&r[0])), (DType::I64, vec![1.0, 0.0]));
    let r = run("argmin", vec![x.clone()], Attrs::new().with("dim", -1i64)).unwrap();
    assert_eq!(values(&r[0]), vec![0.0, 2.0]);
    let r = run(
        "argmax",
        vec![x.clone()],
        Attrs::new().with("keepdim", true),
    )
    .unwrap();
    assert_eq!(
        (r[0].dims().to_vec(), values(&r[0])),
        (vec![1, 1], vec![1.0])
    );
    let nan = f32s(&[3], &[1.0, f64::NAN, 2.0]);
    assert_eq!(
        values(&run("argmax", vec![nan], Attrs::new()).unwrap()[0]),
        vec![1.0]
    );
    let empty = f32s(&[0, 3], &[]);
    assert!(run("argmax", vec![empty.clone()], Attrs::new()).is_err());
    assert!(
        run(
            "argmax",
            vec![empty.clone()],
            Attrs::new().with("dim", 0i64)
        )
        .is_err()
    );
    assert_eq!(
        run("argmax", vec![empty], Attrs::new().with("dim", 1i64)).unwrap()[0].dims(),
        &[0]
    );
    assert!(
        run(
            "argmax",
            vec![ints(DType::Bool, &[2], &[0, 1])],
            Attrs::new()
        )
        .is_err()
    );
}

#[test]
fn value_reductions_follow_pytorch() {
    let x = f32s(&[4], &[1.0, 2.0, 3.0, 4.0]);
    let v = |op: &str, a: Attrs| values(&run(op, vec![x.clone()], a).unwrap()[0]);
    assert!(close(&v("var", Attrs::new()), &[5.0 / 3.0]));
    assert!(close(
        &v("var", Attrs::new().with("correction", 0i64)),
        &[1.25]
    ));
    assert!(close(&v("std", Attrs::new()), &[(5.0f64 / 3.0).sqrt()]));
    assert!(close(&v("mean", Attrs::new()), &[2.5]));
    assert!(close(&v("prod", Attrs::new()), &[24.0]));
    assert!(close(
        &v("logsumexp", Attrs::new().with("dims", vec![0i64])),
        &[4.440189698561196]
    ));
    assert!(close(
        &v("cumsum", Attrs::new().with("dim", 0i64)),
        &[1.0, 3.0, 6.0, 10.0]
    ));
    let one = f32s(&[1], &[3.0]);
    assert!(values(&run("var", vec![one], Attrs::new()).unwrap()[0])[0].is_nan());
    let empty = f32s(&[0], &[]);
    assert!(values(&run("mean", vec![empty.clone()], Attrs::new()).unwrap()[0])[0].is_nan());
    assert_eq!(
        values(&run("sum", vec![empty.clone()], Attrs::new()).unwrap()[0]),
        vec![0.0]
    );
    assert!(run("max", vec![empty.clone()], Attrs::new()).is_err());
    let neg = values(&run("logsumexp", vec![empty.clone()], Attrs::new()).unwrap()[0]);
    assert_eq!(neg, vec![f64::NEG_INFINITY]);
    assert_eq!(
        values(&run("any", vec![empty.clone()], Attrs::new()).unwrap()[0]),
        vec![0.0]
    );
    assert_eq!(
        values(&run("all", vec![empty], Attrs::new()).unwrap()[0]),
        vec![1.0]
    );
    let i = ints(DType::I32, &[3], &[1, 2, 3]);
    assert!(run("mean", vec![i.clone()], Attrs::new()).is_err());
    assert!(run("var", vec![i.clone()], Attrs::new()).is_err());
    assert_eq!(
        run("prod", vec![i.clone()], Attrs::new()).unwrap()[0].dtype(),
        DType::I64
    );
    assert_eq!(
        run("max", vec![i.clone()], Attrs::new()).unwrap()[0].dtype(),
        DType::I32
    );
    let c = run("cumsum", vec![i.clone()], Attrs::new().with("dim", 0i64)).unwrap();
    assert_eq!(
        (c[0].dtype(), values(&c[0])),
        (DType::I64, vec![1.0, 3.0, 6.0])
    );
    assert_eq!(
        run("logsumexp", vec![i], Attrs::new()).unwrap()[0].dtype(),
        DType::F32
    );
    let inf = f32s(&[2], &[f64::NEG_INFINITY, f64::NEG_INFINITY]);
    let r = values(&run("logsumexp", vec![inf], Attrs::new()).unwrap()[0]);
    assert_eq!(r, vec![f64::NEG_INFINITY]);
    let big = f32s(&[2], &[1000.0, 0.0]);
    let r = values(&run("softmax", vec![big.clone()], Attrs::new().with("dim", 0i64)).unwrap()[0]);
    assert!(close(&r, &[1.0, 0.0]));
    let r = values(&run("log_softmax", vec![big], Attrs::new().with("dim", 0i64)).unwrap()[0]);
    assert!(close(&r, &[0.0, -1000.0]));
    let m = ints(DType::Bool, &[2, 2], &[1, 0, 0, 0]);
    let r = run(
        "any",
        vec![m.clone()],
        Attrs::new().with("dims", vec![1i64]),
    )
    .unwrap();
    assert_eq!(values(&r[0]), vec![1.0, 0.0]);
    assert_eq!(
        values(&run("max", vec![m], Attrs::new()).unwrap()[0]),
        vec![1.0]
    );
}

#[test]
fn gradients_of_reductions() {
    use tpu_core::op::{HostTape, Tape, VjpArgs};
    // prod with one zero: the gradient at the zero is the product of the rest.
    let x = f64s(&[3], &[2.0, 0.0, 3.0]);
    let registry = crate::registry().unwrap();
    let def = registry.get("prod").unwrap();
    let out = run("prod", vec![x.clone()], Attrs::new()).unwrap();
    let mut tape = HostTape::new();
    let xv = tape.push(x);
    let yv = tape.push(out[0].clone());
    let gv = tape.push(f64s(&[], &[1.0]));
    let attrs = Attrs::new();
    let args = VjpArgs {
        inputs: &[xv],
        outputs: &[yv],
        grads: &[gv],
        attrs: &attrs,
    };
    let vjp = def.vjp.unwrap();
    let g = vjp(&mut tape as &mut dyn Tape, &args).unwrap();
    assert_eq!(
        values(tape.value(g[0].unwrap()).unwrap()),
        vec![0.0, 6.0, 0.0]
    );
}
