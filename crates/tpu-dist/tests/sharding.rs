//! Tensor parallelism on the CPU plugin's 4 devices, each case against the
//! same math on the host (f64) and the same program on one device: sharded
//! matmuls, a 2-layer MLP forward and backward on a ("model", 4) and a
//! ("data", 2) x ("model", 2) mesh, and an expert-parallel dispatch with
//! all-to-all. Inputs are small multiples of 1/2, so every f32 result here
//! is exact whatever order XLA sums in.

use tpu_core::stablehlo::{Builder, Compare, Value};
use tpu_core::{DType, Device, Error, HostTensor, Result, Tensor};
use tpu_dist::{Mesh, ShardedTensor, ShardingSpec, shard};

fn mesh(axes: &[(&str, usize)]) -> Mesh {
    let count = tpu_dist::DeviceGroup::all().unwrap().len();
    assert!(
        count >= 4,
        "the CPU plugin exposes {count} devices; these tests need 4 (TPU_RS_CPU_DEVICES)"
    );
    let n = axes.iter().map(|a| a.1).product();
    Mesh::new(axes, (0..n).collect()).unwrap()
}

/// One device, with both axis names, so every spec here fits it.
fn one_device() -> Mesh {
    Mesh::new(&[("data", 1), ("model", 1)], vec![0]).unwrap()
}

/// `n` values in {-1, -1/2, 0, 1/2, 1}, varying with `seed`.
fn values(n: usize, seed: usize) -> Vec<f64> {
    (0..n)
        .map(|i| ((i * 7 + seed * 3 + i / 3) % 5) as f64 * 0.5 - 1.0)
        .collect()
}

fn host(dims: &[usize], v: Vec<f64>) -> Tensor {
    let h = HostTensor::from_f64(DType::F32, dims.to_vec(), v).unwrap();
    Tensor::from_host(h, Device::Cpu).unwrap()
}

fn flat(t: &HostTensor) -> Vec<f64> {
    t.to_f64().iter().copied().collect()
}

/// Row-major `a (m x k) @ b (k x n)`.
fn matmul(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

/// Row-major transpose of an `m x n` matrix.
fn transpose(a: &[f64], m: usize, n: usize) -> Vec<f64> {
    (0..n * m).map(|i| a[(i % m) * n + i / m]).collect()
}

fn assert_exact(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{what}: element {i} is {g}, expected {w}\n got {got:?}\nwant {want:?}"
        );
    }
}

fn dot(b: &mut Builder, x: &Value, y: &Value, contract: (usize, usize)) -> Value {
    b.dot_general(x, y, (&[], &[]), (&[contract.0], &[contract.1]), DType::F32)
}

/// Runs `body` on `mesh` with inputs laid out by their specs, and the same
/// program on one device; returns both sets of results, gathered to host.
#[allow(clippy::type_complexity)]
fn sharded_and_single(
    mesh: &Mesh,
    inputs: &[(&[usize], Vec<f64>, ShardingSpec)],
    out_specs: &[ShardingSpec],
    body: fn(&mut Builder, &[Value]) -> Result<Vec<Value>>,
) -> (Vec<ShardedTensor>, Vec<Vec<f64>>, Vec<Vec<f64>>) {
    let run = |mesh: &Mesh| {
        let xs: Vec<ShardedTensor> = inputs
            .iter()
            .map(|(dims, v, spec)| shard(&host(dims, v.clone()), mesh, spec).unwrap())
            .collect();
        let refs: Vec<&ShardedTensor> = xs.iter().collect();
        mesh.run("case", &refs, out_specs, body).unwrap()
    };
    let sharded = run(mesh);
    let single = run(&one_device());
    let gather = |ys: &[ShardedTensor]| -> Vec<Vec<f64>> {
        ys.iter().map(|y| flat(&y.to_host().unwrap())).collect()
    };
    let (got, want) = (gather(&sharded), gather(&single));
    (sharded, got, want)
}

#[test]
fn shards_hold_their_blocks_and_gather_back() {
    let m = mesh(&[("data", 2), ("model", 2)]);
    let v: Vec<f64> = (0..32).map(f64::from).collect();
    let x = host(&[4, 8], v.clone());
    // Rows split over `model`, copies over `data`: partition p = (data, model)
    // holds row block `model`.
    let rows = shard(&x, &m, &ShardingSpec::new(&[Some("model"), None])).unwrap();
    for (p, s) in rows.shards().iter().enumerate() {
        let block = p % 2;
        assert_eq!(s.device(), Device::Tpu(p));
        assert_eq!(s.shape().dims(), &[2, 8]);
        assert_exact(
            &flat(&s.to_host().unwrap()),
            &v[block * 16..block * 16 + 16],
            "rows",
        );
    }
    // Both dims split: (data, model) holds rows block `data`, column block
    // `model`.
    let tiles = shard(&x, &m, &ShardingSpec::new(&[Some("data"), Some("model")])).unwrap();
    let s = flat(&tiles.shards()[1].to_host().unwrap());
    assert_exact(&s, &[4.0, 5.0, 6.0, 7.0, 12.0, 13.0, 14.0, 15.0], "tile");
    // Back to one tensor: on the host, on a mesh device, via a reshard.
    assert_exact(&flat(&tiles.to_host().unwrap()), &v, "gather to host");
    let on1 = tiles.gather(Device::Tpu(1)).unwrap();
    assert_eq!(on1.device(), Device::Tpu(1));
    assert_exact(&flat(&on1.to_host().unwrap()), &v, "gather to tpu:1");
    let cols = rows
        .reshard(&ShardingSpec::from_axes(&[&[], &["data", "model"]]))
        .unwrap();
    assert_eq!(cols.shards()[3].shape().dims(), &[4, 2]);
    assert_exact(&flat(&cols.to_host().unwrap()), &v, "reshard");
    // A device tensor, integer dtype: exact bytes.
    let ints = HostTensor::from_i64(DType::I32, vec![8], (0..8).map(|i| i - 3).collect()).unwrap();
    let on_device = Tensor::from_host(ints, Device::Tpu(2)).unwrap();
    let split = shard(
        &on_device,
        &m,
        &ShardingSpec::from_axes(&[&["data", "model"]]),
    )
    .unwrap();
    assert_eq!(
        split.shards()[2].to_host().unwrap().to_i64().as_slice(),
        Some(&[1, 2][..])
    );
    assert_eq!(
        split
            .to_host()
            .unwrap()
            .to_i64()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        (0..8).map(|i| i - 3).collect::<Vec<i64>>()
    );
}

#[test]
fn scalars_bools_empty_tensors_and_programs_without_inputs() {
    let m = mesh(&[("data", 2), ("model", 2)]);
    let s = shard(&host(&[], vec![2.5]), &m, &ShardingSpec::replicated()).unwrap();
    let doubled = m
        .run("double", &[&s], &[ShardingSpec::replicated()], |b, xs| {
            Ok(vec![b.binary("stablehlo.add", &xs[0], &xs[0])])
        })
        .unwrap();
    assert_exact(&flat(&doubled[0].to_host().unwrap()), &[5.0], "scalar");
    let bits = vec![1, 0, 1, 1, 0, 0, 1, 0];
    let h = HostTensor::from_i64(DType::Bool, vec![4, 2], bits.clone()).unwrap();
    let tiles = ShardingSpec::new(&[Some("data"), Some("model")]);
    let b = shard(&Tensor::from_host(h, Device::Cpu).unwrap(), &m, &tiles).unwrap();
    let b = b
        .reshard(&ShardingSpec::new(&[Some("model"), None]))
        .unwrap();
    assert_eq!(
        b.to_host()
            .unwrap()
            .to_i64()
            .iter()
            .copied()
            .collect::<Vec<_>>(),
        bits
    );
    let empty = shard(&host(&[0, 4], vec![]), &m, &tiles).unwrap();
    assert_eq!(empty.to_host().unwrap().dims(), &[0, 4]);
    // No inputs: a constant, laid out as asked.
    let iota = m
        .run("iota", &[], std::slice::from_ref(&tiles), |b, _| {
            Ok(vec![b.iota(DType::I32, &[4, 4], 1)])
        })
        .unwrap();
    let block = iota[0].shards()[1].to_host().unwrap().to_i64();
    assert_eq!(block.iter().copied().collect::<Vec<_>>(), vec![2, 3, 2, 3]);
}

fn matmul_body(b: &mut Builder, xs: &[Value]) -> Result<Vec<Value>> {
    Ok(vec![dot(b, &xs[0], &xs[1], (1, 0))])
}

#[test]
fn column_parallel_matmul() {
    let m = mesh(&[("model", 4)]);
    let (x, w) = (values(4 * 8, 1), values(8 * 16, 2));
    let (ys, got, want) = sharded_and_single(
        &m,
        &[
            (&[4, 8], x.clone(), ShardingSpec::replicated()),
            (
                &[8, 16],
                w.clone(),
                ShardingSpec::new(&[None, Some("model")]),
            ),
        ],
        &[ShardingSpec::new(&[None, Some("model")])],
        matmul_body,
    );
    let host = matmul(&x, &w, 4, 8, 16);
    assert_exact(&got[0], &host, "column-parallel vs host");
    assert_exact(&got[0], &want[0], "column-parallel vs one device");
    // Each device holds its 4 columns of the result.
    for (p, s) in ys[0].shards().iter().enumerate() {
        assert_eq!(s.shape().dims(), &[4, 4]);
        let cols: Vec<f64> = (0..16)
            .map(|i| host[(i / 4) * 16 + p * 4 + i % 4])
            .collect();
        assert_exact(&flat(&s.to_host().unwrap()), &cols, "column block");
    }
}

#[test]
fn row_parallel_matmul_sums_partial_products() {
    let m = mesh(&[("model", 4)]);
    let (x, w) = (values(4 * 8, 3), values(8 * 16, 4));
    // Contracting dim split: each device has a partial product; the
    // replicated result needs XLA's all-reduce.
    let (ys, got, want) = sharded_and_single(
        &m,
        &[
            (
                &[4, 8],
                x.clone(),
                ShardingSpec::new(&[None, Some("model")]),
            ),
            (
                &[8, 16],
                w.clone(),
                ShardingSpec::new(&[Some("model"), None]),
            ),
        ],
        &[ShardingSpec::replicated()],
        matmul_body,
    );
    let host = matmul(&x, &w, 4, 8, 16);
    assert_exact(&got[0], &host, "row-parallel vs host");
    assert_exact(&got[0], &want[0], "row-parallel vs one device");
    for s in ys[0].shards() {
        assert_exact(
            &flat(&s.to_host().unwrap()),
            &host,
            "every device has the sum",
        );
    }
}

#[test]
fn a_permuted_mesh_keeps_its_device_order() {
    let m = Mesh::new(&[("model", 4)], vec![2, 0, 3, 1]).unwrap();
    let (x, w) = (values(2 * 4, 5), values(4 * 8, 6));
    let (ys, got, _) = sharded_and_single(
        &m,
        &[
            (
                &[2, 4],
                x.clone(),
                ShardingSpec::new(&[None, Some("model")]),
            ),
            (
                &[4, 8],
                w.clone(),
                ShardingSpec::new(&[Some("model"), None]),
            ),
        ],
        &[ShardingSpec::new(&[None, Some("model")])],
        matmul_body,
    );
    let host = matmul(&x, &w, 2, 4, 8);
    assert_exact(&got[0], &host, "permuted mesh");
    for (p, s) in ys[0].shards().iter().enumerate() {
        assert_eq!(s.device(), Device::Tpu(m.devices()[p]));
        let cols: Vec<f64> = (0..4).map(|i| host[(i / 2) * 8 + p * 2 + i % 2]).collect();
        assert_exact(&flat(&s.to_host().unwrap()), &cols, "block of partition");
    }
}

/// Inputs x [B, D], w1 [D, H], w2 [H, O], t [B, O]; results y = relu(x w1)
/// w2, loss = sum((y - t)^2) / 2, and its gradients dw1, dw2, dx.
fn mlp_body(b: &mut Builder, xs: &[Value]) -> Result<Vec<Value>> {
    let (x, w1, w2, t) = (&xs[0], &xs[1], &xs[2], &xs[3]);
    let h = dot(b, x, w1, (1, 0));
    let zero = b.constant(DType::F32, h.shape().clone(), 0.0);
    let a = b.binary("stablehlo.maximum", &h, &zero);
    let y = dot(b, &a, w2, (1, 0));
    let r = b.binary("stablehlo.subtract", &y, t);
    let sq = b.binary("stablehlo.multiply", &r, &r);
    let sum = b.reduce(&sq, 0.0, &[0, 1], "stablehlo.add");
    let half = b.constant(DType::F32, [], 0.5);
    let loss = b.binary("stablehlo.multiply", &sum, &half);
    // Backward: dy = r.
    let dw2 = dot(b, &a, &r, (0, 0));
    let da = dot(b, &r, w2, (1, 1));
    let active = b.compare(Compare::Gt, &h, &zero);
    let dh = b.select(&active, &da, &zero);
    let dw1 = dot(b, x, &dh, (0, 0));
    let dx = dot(b, &dh, w1, (1, 1));
    Ok(vec![y, loss, dw1, dw2, dx])
}

/// The MLP's results on the host, in `mlp_body`'s order.
fn mlp_host(x: &[f64], w1: &[f64], w2: &[f64], t: &[f64], dims: [usize; 4]) -> Vec<Vec<f64>> {
    let [bs, d, h, o] = dims;
    let pre = matmul(x, w1, bs, d, h);
    let a: Vec<f64> = pre.iter().map(|v| v.max(0.0)).collect();
    let y = matmul(&a, w2, bs, h, o);
    let r: Vec<f64> = y.iter().zip(t).map(|(y, t)| y - t).collect();
    let loss = r.iter().map(|v| v * v).sum::<f64>() * 0.5;
    let dw2 = matmul(&transpose(&a, bs, h), &r, h, bs, o);
    let da = matmul(&r, &transpose(w2, h, o), bs, o, h);
    let dh: Vec<f64> = da
        .iter()
        .zip(&pre)
        .map(|(g, p)| if *p > 0.0 { *g } else { 0.0 })
        .collect();
    let dw1 = matmul(&transpose(x, bs, d), &dh, d, bs, h);
    let dx = matmul(&dh, &transpose(w1, d, h), bs, h, d);
    vec![y, vec![loss], dw1, dw2, dx]
}

/// Column-parallel first layer, row-parallel second; `batch` splits the
/// batch dim (or not, with `None`).
fn mlp_case(m: &Mesh, batch: Option<&str>) {
    let dims = [8, 4, 8, 4];
    let [bs, d, h, o] = dims;
    let (x, w1, w2, t) = (
        values(bs * d, 7),
        values(d * h, 8),
        values(h * o, 9),
        values(bs * o, 10),
    );
    let by_batch = ShardingSpec::new(&[batch, None]);
    let col = ShardingSpec::new(&[None, Some("model")]);
    let row = ShardingSpec::new(&[Some("model"), None]);
    let out_specs = [
        by_batch.clone(),
        ShardingSpec::replicated(),
        col.clone(),
        row.clone(),
        by_batch.clone(),
    ];
    let (ys, got, want) = sharded_and_single(
        m,
        &[
            (&[bs, d], x.clone(), by_batch.clone()),
            (&[d, h], w1.clone(), col.clone()),
            (&[h, o], w2.clone(), row.clone()),
            (&[bs, o], t.clone(), by_batch.clone()),
        ],
        &out_specs,
        mlp_body,
    );
    let host = mlp_host(&x, &w1, &w2, &t, dims);
    let names = ["y", "loss", "dw1", "dw2", "dx"];
    for (i, name) in names.iter().enumerate() {
        assert_exact(&got[i], &host[i], &format!("{m}: {name} vs host"));
        assert_exact(&got[i], &want[i], &format!("{m}: {name} vs one device"));
    }
    let model = m.axis_size("model").unwrap_or(1);
    assert_eq!(ys[2].shards()[0].shape().dims(), &[d, h / model]);
    assert_eq!(ys[3].shards()[0].shape().dims(), &[h / model, o]);
    assert!(
        host[1][0] > 0.0,
        "a loss of zero would hide wrong gradients"
    );
}

#[test]
fn mlp_forward_and_backward_on_a_model_axis() {
    mlp_case(&mesh(&[("model", 4)]), None);
}

#[test]
fn mlp_forward_and_backward_on_a_data_by_model_mesh() {
    mlp_case(&mesh(&[("data", 2), ("model", 2)]), Some("data"));
}

fn experts_body(b: &mut Builder, xs: &[Value]) -> Result<Vec<Value>> {
    // [E, tokens, hidden] x [E, hidden, out] -> [E, tokens, out], per expert.
    Ok(vec![b.dot_general(
        &xs[0],
        &xs[1],
        (&[0], &[0]),
        (&[2], &[1]),
        DType::F32,
    )])
}

#[test]
fn expert_parallel_dispatch_with_all_to_all() {
    let m = mesh(&[("expert", 4)]);
    let group = m.group();
    let (experts, tokens, hidden, out) = (4, 6, 4, 3);
    // Capacity = tokens: no token is dropped even if all pick one expert.
    let cap = tokens;
    let route = |d: usize, t: usize| (d * 5 + t * 3 + t * t) % experts;
    let x: Vec<Vec<f64>> = (0..4).map(|d| values(tokens * hidden, 20 + d)).collect();
    let w = values(experts * hidden * out, 30);
    // Dispatch: device d's [E, cap, hidden] slots, token t in slot
    // (route(d, t), its rank among d's tokens for that expert).
    let mut slot_of = vec![vec![0; tokens]; 4];
    let dispatched = (0..4)
        .map(|d| {
            let mut buf = vec![0.0; experts * cap * hidden];
            let mut filled = vec![0; experts];
            for t in 0..tokens {
                let e = route(d, t);
                let slot = e * cap + filled[e];
                filled[e] += 1;
                slot_of[d][t] = slot;
                buf[slot * hidden..(slot + 1) * hidden]
                    .copy_from_slice(&x[d][t * hidden..(t + 1) * hidden]);
            }
            let h = HostTensor::from_f64(DType::F32, vec![experts * cap, hidden], buf).unwrap();
            Tensor::from_host(h, group.device(d)).unwrap()
        })
        .collect::<Vec<_>>();
    // Device e receives every device's slots for expert e.
    let received = group.all_to_all(&dispatched, 0, 0).unwrap();
    let per_expert = received
        .iter()
        .map(|r| {
            let ty = tpu_core::stablehlo::TensorType::new(DType::F32, [1, 4 * cap, hidden]);
            Tensor::reshaped(r.buffer().unwrap(), ty).unwrap()
        })
        .collect();
    let by_expert = ShardingSpec::new(&[Some("expert"), None, None]);
    let tokens_in = ShardedTensor::from_shards(&m, &by_expert, per_expert).unwrap();
    assert_eq!(tokens_in.ty().shape.dims(), &[experts, 4 * cap, hidden]);
    let weights = shard(&host(&[experts, hidden, out], w.clone()), &m, &by_expert).unwrap();
    let ys = m
        .run(
            "experts",
            &[&tokens_in, &weights],
            std::slice::from_ref(&by_expert),
            experts_body,
        )
        .unwrap();
    // Back to the devices the tokens came from, in slot order.
    let flat_out = ys[0]
        .shards()
        .iter()
        .map(|y| {
            let ty = tpu_core::stablehlo::TensorType::new(DType::F32, [4 * cap, out]);
            Tensor::reshaped(y.buffer().unwrap(), ty).unwrap()
        })
        .collect::<Vec<_>>();
    let combined = group.all_to_all(&flat_out, 0, 0).unwrap();
    for d in 0..4 {
        let got = flat(&combined[d].to_host().unwrap());
        for t in 0..tokens {
            let e = route(d, t);
            let token = &x[d][t * hidden..(t + 1) * hidden];
            let want = matmul(
                token,
                &w[e * hidden * out..(e + 1) * hidden * out],
                1,
                hidden,
                out,
            );
            let slot = slot_of[d][t];
            assert_exact(
                &got[slot * out..(slot + 1) * out],
                &want,
                &format!("device {d} token {t} (expert {e})"),
            );
        }
    }
    let used: std::collections::BTreeSet<usize> = (0..4)
        .flat_map(|d| (0..tokens).map(move |t| route(d, t)))
        .collect();
    assert_eq!(used.len(), experts, "every expert gets tokens");
}

/// `err` is an `InvalidOption` / `InvalidInput` whose message names all of
/// `parts`.
fn assert_error_names(err: Error, parts: &[&str]) {
    assert!(
        matches!(
            err,
            Error::InvalidOption { .. } | Error::InvalidInput { .. }
        ),
        "unexpected error kind: {err:?}"
    );
    let text = err.to_string();
    for part in parts {
        assert!(text.contains(part), "`{text}` does not name `{part}`");
    }
}

#[test]
fn meshes_must_match_their_devices() {
    let _ = mesh(&[("model", 4)]);
    let three = Mesh::new(&[("data", 2), ("model", 2)], vec![0, 1, 2]).unwrap_err();
    assert_error_names(
        three,
        &[
            "mesh(data=2, model=2) on tpu:{0, 1, 2}",
            "multiply to 4",
            "3 are given",
        ],
    );
    let twice = Mesh::new(&[("model", 2), ("model", 2)], vec![0, 1, 2, 3]).unwrap_err();
    assert_error_names(twice, &["`model` appears twice"]);
    let zero = Mesh::new(&[("model", 0)], vec![]).unwrap_err();
    assert_error_names(zero, &["size 0"]);
    let dup = Mesh::new(&[("model", 2)], vec![1, 1]).unwrap_err();
    assert_error_names(dup, &["tpu:1 appears twice"]);
    assert!(matches!(
        Mesh::new(&[("model", 2)], vec![0, 99]),
        Err(Error::DeviceOutOfRange { index: 99, .. })
    ));
    assert!(Mesh::all(&[("model", 3)]).is_err());
}

#[test]
fn specs_must_fit_the_mesh_and_the_shape() {
    let m = mesh(&[("model", 4)]);
    let x = host(&[6, 8], values(48, 0));
    let unknown = shard(&x, &m, &ShardingSpec::new(&[Some("expert"), None])).unwrap_err();
    assert_error_names(
        unknown,
        &[
            "`shard`",
            "f32[6, 8]",
            "mesh(model=4)",
            "`expert`",
            "axes: model",
        ],
    );
    let uneven = shard(&x, &m, &ShardingSpec::new(&[Some("model"), None])).unwrap_err();
    assert_error_names(
        uneven,
        &[
            "`shard`",
            "f32[6, 8]",
            "mesh(model=4)",
            "dim 0 of size 6",
            "4 equal blocks",
        ],
    );
    let rank = shard(&x, &m, &ShardingSpec::new(&[None])).unwrap_err();
    assert_error_names(rank, &["`shard`", "1 entries", "rank 2"]);
}

#[test]
fn programs_check_their_inputs_and_output_specs() {
    let m = mesh(&[("model", 4)]);
    let x = shard(
        &host(&[4, 8], values(32, 1)),
        &m,
        &ShardingSpec::replicated(),
    )
    .unwrap();
    let w = shard(
        &host(&[8, 6], values(48, 2)),
        &m,
        &ShardingSpec::replicated(),
    )
    .unwrap();
    // Result [4, 6]: its dim 1 does not split over 4 devices.
    let uneven = m
        .run(
            "matmul",
            &[&x, &w],
            &[ShardingSpec::new(&[None, Some("model")])],
            matmul_body,
        )
        .unwrap_err();
    assert_error_names(
        uneven,
        &[
            "`matmul`",
            "mesh(model=4)",
            "output 0 (f32[4, 6])",
            "dim 1 of size 6",
        ],
    );
    let count = m.run("matmul", &[&x, &w], &[], matmul_body).unwrap_err();
    assert_error_names(count, &["`matmul`", "1 result(s) but 0 output spec(s)"]);
    let other = mesh(&[("data", 2), ("model", 2)]);
    let foreign = other.run(
        "matmul",
        &[&x, &w],
        &[ShardingSpec::replicated()],
        matmul_body,
    );
    assert_error_names(
        foreign.unwrap_err(),
        &["input 0 is laid out over mesh(model=4)"],
    );
    let short = ShardedTensor::from_shards(&m, &ShardingSpec::replicated(), vec![]).unwrap_err();
    assert_error_names(
        short,
        &["`from_shards`", "one shard per mesh device (4), got 0"],
    );
}
