//! `as_strided` and `as_strided_scatter`: PyTorch's results on the
//! reference and the plugin, the programs they lower to, and the errors of
//! views that leave their storage.

use tpu_core::host::HostTensor;
use tpu_core::op::{Attrs, OpDef, run_reference, single_op_program};
use tpu_core::stablehlo::TensorType;
use tpu_core::{DType, Shape};
use tpu_ops::conformance::run_on_tpu;

fn def(op: &str) -> &'static OpDef {
    tpu_eager::link();
    tpu_ops::registry().expect("registry").get(op).expect("op")
}

fn view(size: &[usize], stride: &[usize], offset: usize) -> Attrs {
    Attrs::new()
        .with("size", size)
        .with("stride", stride)
        .with("offset", offset)
}

fn arange(dims: &[usize]) -> HostTensor {
    let n = dims.iter().product::<usize>();
    HostTensor::from_f64(
        DType::F32,
        dims.to_vec(),
        (0..n).map(|v| v as f64).collect(),
    )
    .expect("values fill the shape")
}

/// The program text of `op` on inputs of `dims` (f32).
fn program(op: &str, dims: &[&[usize]], attrs: &Attrs) -> String {
    let types: Vec<TensorType> = dims
        .iter()
        .map(|d| TensorType::new(DType::F32, Shape::from(*d)))
        .collect();
    single_op_program(def(op), &types, attrs).expect("lowers")
}

/// Runs `op` on the reference and the plugin; both must give `want`.
fn check(op: &str, inputs: &[HostTensor], attrs: &Attrs, dims: &[usize], want: &[f64]) {
    let host = run_reference(def(op), inputs, attrs).expect("reference");
    let device = run_on_tpu(0, def(op), inputs, attrs).expect("device");
    for (name, out) in [("reference", &host[0]), ("device", &device[0])] {
        assert_eq!(out.dims(), dims, "{op} {name}: shape");
        let got: Vec<f64> = out.to_f64().iter().copied().collect();
        assert_eq!(got, want, "{op} {name}: values");
    }
}

#[test]
fn views_read_like_pytorch() {
    let x = [arange(&[2, 3])];
    let cases: [(Attrs, &[usize], &[f64]); 4] = [
        (
            view(&[3, 2], &[1, 3], 0),
            &[3, 2],
            &[0., 3., 1., 4., 2., 5.],
        ),
        (
            view(&[2, 3], &[1, 1], 2),
            &[2, 3],
            &[2., 3., 4., 3., 4., 5.],
        ),
        (view(&[2, 2], &[0, 2], 1), &[2, 2], &[1., 3., 1., 3.]),
        (view(&[], &[], 5), &[], &[5.]),
    ];
    for (attrs, dims, want) in &cases {
        check("as_strided", &x, attrs, dims, want);
    }
}

#[test]
fn scatters_write_like_pytorch() {
    let base = arange(&[2, 3]);
    let src = HostTensor::from_f64(DType::F32, vec![2, 2], vec![-1., -2., -3., -4.])
        .expect("values fill the shape");
    let t = view(&[2, 2], &[1, 3], 1);
    check(
        "as_strided_scatter",
        &[base.clone(), src.clone()],
        &t,
        &[2, 3],
        &[0., -1., -3., 3., -2., -4.],
    );
    let rows = view(&[2, 2], &[2, 1], 1);
    check(
        "as_strided_scatter",
        &[base, src],
        &rows,
        &[2, 3],
        &[0., -1., -2., -3., -4., 5.],
    );
}

#[test]
fn block_views_lower_without_a_gather() {
    let contiguous = program("as_strided", &[&[4, 5]], &view(&[3, 4], &[4, 1], 2));
    assert!(contiguous.contains("stablehlo.slice"));
    for op in ["gather", "transpose", "pad", "broadcast"] {
        assert!(!contiguous.contains(op), "{op} in\n{contiguous}");
    }
    let permuted = program("as_strided", &[&[2, 3]], &view(&[3, 2], &[1, 3], 0));
    assert!(permuted.contains("stablehlo.transpose"), "{permuted}");
    let stepped = program("as_strided", &[&[3, 3]], &view(&[2, 2], &[3, 1], 4));
    assert!(stepped.contains("stablehlo.pad"), "{stepped}");
    let expand = program("as_strided", &[&[3]], &view(&[2, 3], &[0, 1], 0));
    assert!(expand.contains("stablehlo.broadcast_in_dim"), "{expand}");
    for text in [permuted, stepped, expand] {
        assert!(!text.contains("gather"), "{text}");
    }
    let windows = program("as_strided", &[&[5]], &view(&[3, 3], &[1, 1], 0));
    assert!(windows.contains("stablehlo.gather"), "{windows}");
}

#[test]
fn contiguous_scatters_are_an_update_slice() {
    let attrs = view(&[2, 2], &[2, 1], 3);
    let text = program("as_strided_scatter", &[&[3, 3], &[2, 2]], &attrs);
    assert!(text.contains("stablehlo.dynamic_update_slice"), "{text}");
    let attrs = view(&[2, 2], &[1, 2], 0);
    let text = program("as_strided_scatter", &[&[2, 2], &[2, 2]], &attrs);
    assert!(text.contains("stablehlo.scatter"), "{text}");
}

#[test]
fn bad_views_are_rejected_with_their_numbers() {
    let x = [TensorType::new(DType::F32, [2, 3])];
    let infer = |attrs: &Attrs| (def("as_strided").infer)(&x, attrs).unwrap_err().message;
    assert!(infer(&view(&[2], &[1, 1], 0)).contains("same length"));
    let e = infer(
        &Attrs::new()
            .with("size", vec![-2i64])
            .with("stride", vec![1i64]),
    );
    assert!(e.contains("-2"), "{e}");
    let e = infer(&view(&[2, 3], &[3, 1], 1));
    assert!(
        e.contains("reaches element 6") && e.contains("only 6"),
        "{e}"
    );
    let e = infer(
        &Attrs::new()
            .with("size", vec![1i64])
            .with("stride", vec![1i64])
            .with("offset", -1i64),
    );
    assert!(e.contains("-1"), "{e}");
    let overflow = view(&[4], &[usize::MAX / 2], 0);
    assert!(infer(&overflow).contains("overflows"));

    let scatter = |src: &[usize], attrs: &Attrs| {
        let types = [x[0].clone(), TensorType::new(DType::F32, Shape::from(src))];
        (def("as_strided_scatter").infer)(&types, attrs)
            .unwrap_err()
            .message
    };
    assert!(scatter(&[2, 3], &view(&[2, 3], &[0, 1], 0)).contains("stride 0"));
    assert!(scatter(&[3], &view(&[2], &[1], 0)).contains("src shape"));
}
