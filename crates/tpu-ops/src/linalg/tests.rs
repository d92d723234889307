//! Hand-computed values for the linalg references (PyTorch semantics).

use tpu_core::DType;
use tpu_core::host::HostTensor;
use tpu_core::op::{Attrs, run_reference};

fn t(dtype: DType, dims: &[usize], values: &[f64]) -> HostTensor {
    HostTensor::from_f64(dtype, dims.to_vec(), values.to_vec()).unwrap_or_else(|| unreachable!())
}

fn run(op: &str, inputs: &[HostTensor], attrs: Attrs) -> (Vec<usize>, Vec<f64>) {
    let registry = crate::registry().unwrap_or_else(|e| panic!("{e}"));
    let def = registry.get(op).unwrap_or_else(|e| panic!("{e}"));
    let out = run_reference(def, inputs, &attrs).unwrap_or_else(|e| panic!("{op}: {e}"));
    (
        out[0].dims().to_vec(),
        out[0].to_f64().iter().copied().collect(),
    )
}

fn range(n: usize) -> Vec<f64> {
    (0..n).map(|i| i as f64).collect()
}

#[test]
fn matmul_values() {
    let a = t(DType::F32, &[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = t(DType::F32, &[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    assert_eq!(
        run("matmul", &[a.clone(), b.clone()], Attrs::new()),
        (vec![2, 2], vec![58.0, 64.0, 139.0, 154.0])
    );
    let v = t(DType::F32, &[3], &[1.0, 0.0, -1.0]);
    assert_eq!(
        run("matmul", &[a.clone(), v.clone()], Attrs::new()),
        (vec![2], vec![-2.0, -2.0])
    );
    assert_eq!(
        run("matmul", &[v.clone(), b], Attrs::new()),
        (vec![2], vec![-4.0, -4.0])
    );
    assert_eq!(
        run("matmul", &[v.clone(), v], Attrs::new()),
        (vec![], vec![2.0])
    );
    // Integer products wrap like the dtype.
    let big =
        HostTensor::from_i64(DType::I32, [1, 1], vec![1 << 20]).unwrap_or_else(|| unreachable!());
    let (_, v) = run("matmul", &[big.clone(), big], Attrs::new());
    assert_eq!(v, vec![0.0]);
}

#[test]
fn dot_general_values() {
    // Batch dim 1 of lhs with dim 0 of rhs; contract lhs 0 with rhs 1.
    let a = t(DType::F64, &[2, 2], &[1.0, 2.0, 3.0, 4.0]); // [k, b]
    let b = t(DType::F64, &[2, 2, 1], &[1.0, 10.0, 100.0, 1000.0]); // [b, k, n]
    let attrs = Attrs::new()
        .with("lhs_batch", vec![1i64])
        .with("rhs_batch", vec![0i64])
        .with("lhs_contract", vec![0i64])
        .with("rhs_contract", vec![1i64]);
    // b = 0: a[:, 0] = (1, 3) . (1, 10) = 31; b = 1: (2, 4) . (100, 1000) = 4200.
    assert_eq!(
        run("dot_general", &[a, b], attrs),
        (vec![2, 1], vec![31.0, 4200.0])
    );
}

#[test]
fn conv1d_values() {
    let x = t(DType::F32, &[1, 1, 5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
    let w = t(DType::F32, &[1, 1, 3], &[1.0, 0.0, -1.0]);
    let conv = |attrs: Attrs| run("conv1d", &[x.clone(), w.clone()], attrs).1;
    assert_eq!(conv(Attrs::new()), vec![-2.0, -2.0, -2.0]);
    assert_eq!(
        conv(Attrs::new().with("padding", 1i64)),
        vec![-2.0, -2.0, -2.0, -2.0, 4.0]
    );
    assert_eq!(conv(Attrs::new().with("stride", 2i64)), vec![-2.0, -2.0]);
    assert_eq!(conv(Attrs::new().with("dilation", 2i64)), vec![-4.0]);
    let b = t(DType::F32, &[1], &[0.5]);
    assert_eq!(
        run("conv1d", &[x.clone(), w.clone(), b], Attrs::new()).1,
        vec![-1.5, -1.5, -1.5]
    );
    // Groups: each channel with its own kernel.
    let x2 = t(DType::F32, &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w2 = t(DType::F32, &[2, 1, 1], &[2.0, 3.0]);
    assert_eq!(
        run("conv1d", &[x2, w2], Attrs::new().with("groups", 2i64)),
        (vec![2, 2], vec![2.0, 4.0, 9.0, 12.0])
    );
}

#[test]
fn conv2d_values() {
    let x = t(DType::F64, &[1, 1, 3, 3], &range(9));
    let w = t(DType::F64, &[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    // out[i, j] = x[i, j] + x[i + 1, j + 1].
    assert_eq!(
        run("conv2d", &[x, w], Attrs::new()),
        (vec![1, 1, 2, 2], vec![4.0, 6.0, 10.0, 12.0])
    );
}

#[test]
fn pool_values() {
    let x = t(DType::F32, &[1, 1, 4, 4], &range(16));
    let k2 = || Attrs::new().with("kernel_size", 2i64);
    assert_eq!(
        run("max_pool2d", std::slice::from_ref(&x), k2()).1,
        vec![5.0, 7.0, 13.0, 15.0]
    );
    assert_eq!(
        run(
            "max_pool2d",
            std::slice::from_ref(&x),
            k2().with("padding", 1i64)
        ),
        (
            vec![1, 1, 3, 3],
            vec![0.0, 2.0, 3.0, 8.0, 10.0, 11.0, 12.0, 14.0, 15.0]
        )
    );
    assert_eq!(
        run(
            "max_pool2d",
            std::slice::from_ref(&x),
            k2().with("stride", 1i64).with("dilation", 2i64)
        ),
        (vec![1, 1, 2, 2], vec![10.0, 11.0, 14.0, 15.0])
    );
    assert_eq!(
        run("avg_pool2d", std::slice::from_ref(&x), k2()).1,
        vec![2.5, 4.5, 10.5, 12.5]
    );
    let padded = run(
        "avg_pool2d",
        std::slice::from_ref(&x),
        k2().with("padding", 1i64),
    )
    .1;
    assert_eq!(padded[..2], [0.0, 0.75]);
    let exclude = k2().with("padding", 1i64).with("count_include_pad", false);
    assert_eq!(run("avg_pool2d", &[x], exclude).1[..2], [0.0, 1.5]);
    // The gradient goes to the (first) maximum of each window.
    let y = t(DType::F32, &[1, 2, 2], &[1.0, 3.0, 3.0, 0.0]);
    let g = t(DType::F32, &[1, 1, 1], &[5.0]);
    assert_eq!(
        run("max_pool2d_backward", &[y, g], k2()).1,
        vec![0.0, 5.0, 0.0, 0.0]
    );
}

/// `(dims, values)` of every output of `op`'s reference.
fn run_all(op: &str, inputs: &[HostTensor], attrs: Attrs) -> Vec<(Vec<usize>, Vec<f64>)> {
    let registry = crate::registry().unwrap_or_else(|e| panic!("{e}"));
    let def = registry.get(op).unwrap_or_else(|e| panic!("{e}"));
    let out = run_reference(def, inputs, &attrs).unwrap_or_else(|e| panic!("{op}: {e}"));
    out.iter()
        .map(|o| (o.dims().to_vec(), o.to_f64().iter().copied().collect()))
        .collect()
}

/// `x` (`m × n`, row-major) times `y` (`n × p`).
fn product(x: &[f64], y: &[f64], m: usize, n: usize, p: usize) -> Vec<f64> {
    (0..m * p)
        .map(|ij| (0..n).map(|k| x[ij / p * n + k] * y[k * p + ij % p]).sum())
        .collect()
}

fn assert_near(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-12, "{what}: got {got:?}, want {want:?}");
    }
}

#[test]
fn complete_qr_of_a_tall_matrix_is_orthogonal_and_reconstructs() {
    let a = [2.0, -1.0, 0.5, 3.0, 1.0, 1.0, -2.0, 0.25];
    let x = t(DType::F64, &[4, 2], &a);
    let complete = run_all(
        "qr",
        std::slice::from_ref(&x),
        Attrs::new().with("mode", "complete"),
    );
    let reduced = run_all("qr", &[x], Attrs::new());
    let ((qd, q), (rd, r)) = (complete[0].clone(), complete[1].clone());
    assert_eq!((qd, rd), (vec![4, 4], vec![4, 2]));
    assert_near(&product(&q, &r, 4, 4, 2), &a, "Q R");
    let qt: Vec<f64> = (0..16).map(|ij| q[ij % 4 * 4 + ij / 4]).collect();
    let eye: Vec<f64> = (0..16).map(|ij| f64::from(ij % 5 == 0)).collect();
    assert_near(&product(&qt, &q, 4, 4, 4), &eye, "QᵀQ");
    assert!(
        r[2] == 0.0 && r[4..].iter().all(|&v| v == 0.0),
        "R is upper: {r:?}"
    );
    // Its first columns and rows are the reduced factorization.
    let q_first: Vec<f64> = (0..8).map(|ij| q[ij / 2 * 4 + ij % 2]).collect();
    assert_near(&q_first, &reduced[0].1, "reduced Q");
    assert_near(&r[..4], &reduced[1].1, "reduced R");
}

#[test]
fn eigh_reads_the_lower_triangle_and_fixes_signs() {
    // [[2, 1], [1, 2]] (the upper entry is ignored): eigenvalues 1 and 3,
    // eigenvectors (1, -1)/√2 and (1, 1)/√2, each with a positive weighted
    // sum.
    let x = t(DType::F64, &[2, 2], &[2.0, 99.0, 1.0, 2.0]);
    let out = run_all("eigh", &[x], Attrs::new());
    assert_near(&out[0].1, &[1.0, 3.0], "eigenvalues");
    let h = std::f64::consts::FRAC_1_SQRT_2;
    assert_near(&out[1].1, &[h, h, -h, h], "eigenvectors");
}
