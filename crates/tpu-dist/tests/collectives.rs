//! Collectives over the CPU plugin's devices against values computed on
//! the host: every op, on groups of 2 and 4 and a reordered sub-group.

use tpu_core::{DType, Error, HostTensor, Tensor};
use tpu_dist::{DeviceGroup, ReduceOp};

/// Groups to run each case on: the first 2 devices, the first 4, and a
/// reordered sub-group.
fn groups() -> Vec<DeviceGroup> {
    let all = DeviceGroup::all().unwrap();
    assert!(
        all.len() >= 4,
        "the CPU plugin exposes {} devices; these tests need 4 (TPU_RS_CPU_DEVICES)",
        all.len()
    );
    vec![
        DeviceGroup::new(vec![0, 1]).unwrap(),
        DeviceGroup::new(vec![0, 1, 2, 3]).unwrap(),
        DeviceGroup::new(vec![3, 1, 2]).unwrap(),
    ]
}

/// Rank `r`'s input: small integers, so every sum and product is exact in
/// any order.
fn input(r: usize, len: usize) -> Vec<f64> {
    (0..len)
        .map(|i| ((r * 7 + i * 3) % 5) as f64 - 2.0)
        .collect()
}

fn tensor(group: &DeviceGroup, r: usize, dtype: DType, shape: &[usize], v: Vec<f64>) -> Tensor {
    let host = HostTensor::from_f64(dtype, shape.to_vec(), v).unwrap();
    Tensor::from_host(host, group.device(r)).unwrap()
}

fn inputs(group: &DeviceGroup, dtype: DType, shape: &[usize]) -> Vec<Vec<f64>> {
    let len = shape.iter().product();
    (0..group.len())
        .map(|r| {
            let v = input(r, len);
            if dtype == DType::Bool {
                v.into_iter()
                    .map(|x| f64::from(u8::from(x > 0.0)))
                    .collect()
            } else {
                v
            }
        })
        .collect()
}

fn values(t: &Tensor) -> Vec<f64> {
    t.to_host().unwrap().to_f64().iter().copied().collect()
}

/// `got` equals `want` up to `dtype`'s rounding of a mean (integer sums,
/// maxima and products are exact).
fn assert_near(got: &[f64], want: &[f64], dtype: DType, what: &str) {
    let tol = match dtype {
        DType::BF16 => 1.0 / 128.0,
        DType::F16 => 1.0 / 1024.0,
        DType::F32 => 1e-6,
        _ => 1e-12,
    };
    assert_eq!(got.len(), want.len(), "{what}");
    for (g, w) in got.iter().zip(want) {
        assert!(
            (g - w).abs() <= tol * w.abs().max(1.0),
            "{what}: {got:?} vs {want:?}"
        );
    }
}

fn combine(op: ReduceOp, a: f64, b: f64) -> f64 {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => a + b,
        ReduceOp::Max => a.max(b),
        ReduceOp::Min => a.min(b),
        ReduceOp::Prod => a * b,
    }
}

fn reduced(op: ReduceOp, dtype: DType, xs: &[Vec<f64>]) -> Vec<f64> {
    let mut out = xs[0].clone();
    for x in &xs[1..] {
        for (o, v) in out.iter_mut().zip(x) {
            *o = combine(op, *o, *v);
        }
    }
    if dtype == DType::Bool {
        out.iter_mut()
            .for_each(|v| *v = f64::from(u8::from(*v != 0.0)));
    }
    if op == ReduceOp::Mean {
        out.iter_mut().for_each(|v| *v /= xs.len() as f64);
    }
    out
}

#[test]
fn all_reduce_every_op_and_dtype() {
    let shape = [2, 3];
    for group in groups() {
        for dtype in [
            DType::F32,
            DType::BF16,
            DType::F64,
            DType::I32,
            DType::I64,
            DType::U8,
            DType::Bool,
        ] {
            for op in [
                ReduceOp::Sum,
                ReduceOp::Mean,
                ReduceOp::Max,
                ReduceOp::Min,
                ReduceOp::Prod,
            ] {
                let xs = inputs(&group, dtype, &shape);
                let xs = if dtype == DType::U8 {
                    xs.into_iter()
                        .map(|v| v.into_iter().map(|x| x + 2.0).collect())
                        .collect()
                } else {
                    xs
                };
                let ts: Vec<Tensor> = (0..group.len())
                    .map(|r| tensor(&group, r, dtype, &shape, xs[r].clone()))
                    .collect();
                let result = group.all_reduce(&ts, op);
                if op == ReduceOp::Mean && !dtype.is_float() {
                    assert!(
                        matches!(result, Err(Error::InvalidInput { .. })),
                        "{dtype} mean"
                    );
                    continue;
                }
                let out = result.unwrap_or_else(|e| panic!("{op} of {dtype} on {group:?}: {e}"));
                let want = reduced(op, dtype, &xs);
                for (r, t) in out.iter().enumerate() {
                    assert_eq!(t.device(), group.device(r));
                    assert_near(&values(t), &want, dtype, &format!("{op} {dtype} rank {r}"));
                }
            }
        }
    }
}

#[test]
fn all_gather_concatenates_in_rank_order() {
    for group in groups() {
        let n = group.len();
        for dim in [0, 1] {
            let xs = inputs(&group, DType::F32, &[2, 3]);
            let ts: Vec<Tensor> = (0..n)
                .map(|r| tensor(&group, r, DType::F32, &[2, 3], xs[r].clone()))
                .collect();
            let out = group.all_gather(&ts, dim).unwrap();
            // The expected concatenation, row-major.
            let mut want = Vec::new();
            if dim == 0 {
                for x in &xs {
                    want.extend_from_slice(x);
                }
            } else {
                for row in 0..2 {
                    for x in &xs {
                        want.extend_from_slice(&x[row * 3..row * 3 + 3]);
                    }
                }
            }
            for t in &out {
                assert_eq!(
                    t.shape().dims(),
                    if dim == 0 {
                        vec![2 * n, 3]
                    } else {
                        vec![2, 3 * n]
                    }
                    .as_slice()
                );
                assert_eq!(values(t), want);
            }
        }
    }
}

#[test]
fn reduce_scatter_gives_each_rank_its_block_of_the_reduction() {
    for group in groups() {
        let n = group.len();
        let shape = [n * 2, 3];
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            let xs = inputs(&group, DType::F32, &shape);
            let ts: Vec<Tensor> = (0..n)
                .map(|r| tensor(&group, r, DType::F32, &shape, xs[r].clone()))
                .collect();
            let out = group.reduce_scatter(&ts, op, 0).unwrap();
            let full = reduced(op, DType::F32, &xs);
            for (r, t) in out.iter().enumerate() {
                assert_eq!(t.shape().dims(), &[2, 3]);
                assert_near(
                    &values(t),
                    &full[r * 6..(r + 1) * 6],
                    DType::F32,
                    &format!("{op} rank {r}"),
                );
            }
        }
    }
}

#[test]
fn broadcast_copies_the_roots_tensor_bit_for_bit() {
    for group in groups() {
        let n = group.len();
        let root = n - 1;
        let ts: Vec<Tensor> = (0..n)
            .map(|r| {
                let v = if r == root {
                    vec![-0.0, f64::NAN, f64::INFINITY, 1.5]
                } else {
                    vec![r as f64; 4]
                };
                tensor(&group, r, DType::F32, &[4], v)
            })
            .collect();
        for t in group.broadcast(&ts, root).unwrap() {
            let got = values(&t);
            assert_eq!(got[0].to_bits(), (-0.0f64).to_bits());
            assert!(got[1].is_nan());
            assert_eq!(&got[2..], &[f64::INFINITY, 1.5]);
        }
    }
}

#[test]
fn all_to_all_sends_block_r_to_rank_r() {
    for group in groups() {
        let n = group.len();
        // Rank s holds n rows; row t goes to rank t, which stacks them by s.
        let ts: Vec<Tensor> = (0..n)
            .map(|s| {
                let v = (0..n * 2).map(|i| (s * 100 + i) as f64).collect();
                tensor(&group, s, DType::F32, &[n, 2], v)
            })
            .collect();
        let out = group.all_to_all(&ts, 0, 0).unwrap();
        for (t, y) in out.iter().enumerate() {
            let want: Vec<f64> = (0..n)
                .flat_map(|s| [(s * 100 + 2 * t) as f64, (s * 100 + 2 * t + 1) as f64])
                .collect();
            assert_eq!(y.shape().dims(), &[n, 2]);
            assert_eq!(values(y), want, "rank {t}");
        }
    }
}

#[test]
fn permute_moves_tensors_between_ranks() {
    for group in groups() {
        let n = group.len();
        let ts: Vec<Tensor> = (0..n)
            .map(|r| tensor(&group, r, DType::I64, &[3], vec![r as f64 + 1.0; 3]))
            .collect();
        // A ring: rank r sends to r + 1.
        let ring: Vec<(usize, usize)> = (0..n).map(|r| (r, (r + 1) % n)).collect();
        for (r, y) in group.permute(&ts, &ring).unwrap().iter().enumerate() {
            let from = (r + n - 1) % n;
            assert_eq!(values(y), vec![from as f64 + 1.0; 3]);
        }
        // One send: every other rank receives zeros.
        for (r, y) in group
            .permute(&ts, &[(0, n - 1)])
            .unwrap()
            .iter()
            .enumerate()
        {
            let want = if r == n - 1 { 1.0 } else { 0.0 };
            assert_eq!(values(y), vec![want; 3], "rank {r}");
        }
    }
}

#[test]
fn barrier_returns() {
    for group in groups() {
        group.barrier().unwrap();
    }
}

#[test]
fn bad_calls_are_typed_errors_naming_the_collective() {
    let group = DeviceGroup::new(vec![0, 1]).unwrap();
    let on = |r: usize, shape: &[usize]| {
        tensor(
            &group,
            r,
            DType::F32,
            shape,
            vec![1.0; shape.iter().product()],
        )
    };
    let expect = |result: tpu_core::Result<Vec<Tensor>>, op: &str, words: &str| {
        let err = result.err().unwrap_or_else(|| panic!("{op}: no error"));
        let text = err.to_string();
        assert!(matches!(err, Error::InvalidInput { .. }), "{text}");
        assert!(
            text.contains(op) && text.contains(words) && text.contains("tpu:{0, 1}"),
            "{text}"
        );
    };
    expect(
        group.all_reduce(&[on(0, &[2])], ReduceOp::Sum),
        "all_reduce",
        "one tensor per member",
    );
    expect(
        group.all_reduce(&[on(0, &[2]), on(0, &[2])], ReduceOp::Sum),
        "all_reduce",
        "must live on tpu:1",
    );
    expect(
        group.all_reduce(&[on(0, &[2]), on(1, &[3])], ReduceOp::Sum),
        "all_reduce",
        "same dtype and shape",
    );
    expect(
        group.reduce_scatter(&[on(0, &[3]), on(1, &[3])], ReduceOp::Sum, 0),
        "reduce_scatter",
        "equal blocks",
    );
    expect(
        group.all_gather(&[on(0, &[3]), on(1, &[3])], 1),
        "all_gather",
        "out of range",
    );
    expect(
        group.broadcast(&[on(0, &[3]), on(1, &[3])], 2),
        "broadcast",
        "root rank 2",
    );
    expect(
        group.permute(&[on(0, &[3]), on(1, &[3])], &[(0, 1), (0, 0)]),
        "permute",
        "twice",
    );
    let ints = |r: usize| tensor(&group, r, DType::I32, &[2], vec![1.0, 2.0]);
    expect(
        group.all_reduce(&[ints(0), ints(1)], ReduceOp::Mean),
        "all_reduce",
        "floating dtype",
    );
    assert!(matches!(
        DeviceGroup::new(vec![0, 0]),
        Err(Error::InvalidOption { .. })
    ));
    assert!(matches!(
        DeviceGroup::new(vec![0, 99]),
        Err(Error::DeviceOutOfRange { index: 99, .. })
    ));
    assert!(DeviceGroup::new(vec![]).is_err());
}

#[test]
fn collectives_from_several_threads_at_once_each_get_their_own_answer() {
    // Overlapping groups in different orders: launched concurrently, their
    // replicas could meet the devices in different orders and wait on each
    // other forever.
    let groups = [vec![0, 1, 2, 3], vec![1, 0], vec![3, 2, 1, 0], vec![2, 3]];
    std::thread::scope(|s| {
        for (t, devices) in groups.iter().enumerate() {
            s.spawn(move || {
                let group = DeviceGroup::new(devices.clone()).unwrap();
                let n = group.len();
                for i in 0..25usize {
                    let len = 1 << (8 + i % 6);
                    let xs: Vec<Tensor> = (0..n)
                        .map(|r| {
                            tensor(
                                &group,
                                r,
                                DType::F32,
                                &[len],
                                vec![(t * 100 + i + r) as f64; len],
                            )
                        })
                        .collect();
                    let want = (0..n).map(|r| (t * 100 + i + r) as f64).sum::<f64>();
                    for y in group.all_reduce(&xs, ReduceOp::Sum).unwrap() {
                        assert!(values(&y).iter().all(|&v| v == want), "thread {t} call {i}");
                    }
                }
            });
        }
    });
}
