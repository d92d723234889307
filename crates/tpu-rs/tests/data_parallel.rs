//! Data parallelism: training replicas on 2 and 4 devices over equal shards
//! of a batch gives the losses and parameters of one model on the whole
//! batch, step by step, under Strict and DeferAndFuse; misuse is a typed
//! error.

use tpu_rs::dist::{DataParallel, DeviceGroup, ProcessGroup, World};
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::{Linear, Module, ParamStore, Parameter, mse};
use tpu_rs::optim::{AdamW, Optimizer, Sgd, clip_grad_norm};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

/// Rows of every global batch: divisible by 1, 2 and 4.
const ROWS: usize = 8;
const STEPS: usize = 4;
const MODES: [EagerMode; 2] = [EagerMode::Strict, EagerMode::DeferAndFuse];

/// A deterministic stream of numbers in [-1, 1).
struct Rng(u64);

impl Rng {
    fn bits(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn next(&mut self) -> f64 {
        (self.bits() as f64 / (1u64 << 31) as f64) * 2.0 - 1.0
    }
    fn below(&mut self, n: usize) -> i64 {
        (self.bits() % n as u64) as i64
    }
}

/// A different seed per device, so only the broadcast from rank 0 can
/// make the replicas agree.
fn seed(device: Device) -> u64 {
    match device {
        Device::Tpu(i) => 11 + 1000 * i as u64,
        Device::Cpu => 11,
    }
}

/// `|a - b|` within 1e-5 relative (with a floor for values near zero).
fn assert_close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = 1e-5 * g.abs().max(w.abs()).max(1e-2);
        assert!(
            (g - w).abs() <= tol,
            "{what}[{i}]: {g} vs {w} (diff {:e})",
            (g - w).abs()
        );
    }
}

/// Every parameter of `store`, by name.
fn snapshot(store: &ParamStore) -> Result<Vec<(String, Vec<f64>)>> {
    store
        .parameters()
        .iter()
        .map(|p| Ok((p.name().to_string(), p.get().to_f64_vec()?)))
        .collect()
}

fn assert_same_params(store: &ParamStore, want: &[(String, Vec<f64>)], what: &str) -> Result<()> {
    let got = snapshot(store)?;
    assert_eq!(got.len(), want.len(), "{what}: parameter count");
    for ((name, g), (wname, w)) in got.iter().zip(want) {
        assert_eq!(name, wname);
        assert_close(g, w, &format!("{what} {name}"));
    }
    Ok(())
}

/// Every replica holds rank 0's parameter values, bit for bit.
fn assert_identical_replicas<M>(dp: &DataParallel<M>, what: &str) -> Result<()> {
    let first = snapshot(dp.store())?;
    for (rank, replica) in dp.replicas().iter().enumerate().skip(1) {
        let got = snapshot(replica.store())?;
        for ((name, g), (_, w)) in got.iter().zip(&first) {
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(
                bits(g) == bits(w),
                "{what}: rank {rank}'s `{name}` differs from rank 0's"
            );
        }
    }
    Ok(())
}

// ---- A small MLP. ----

struct Mlp {
    layers: Vec<Linear>,
}

impl Mlp {
    fn new(store: &ParamStore) -> Result<Mlp> {
        let root = store.root();
        Ok(Mlp {
            layers: vec![
                Linear::new(&root.sub("0"), 6, 16, true)?,
                Linear::new(&root.sub("1"), 16, 16, true)?,
                Linear::new(&root.sub("2"), 16, 2, true)?,
            ],
        })
    }

    fn loss(&self, x: &Tensor, y: &Tensor) -> Result<Tensor> {
        let mut h = x.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if i + 1 < self.layers.len() {
                h = h.tanh()?;
            }
        }
        mse(&h, y)
    }
}

fn build_mlp(device: Device) -> Result<(Mlp, ParamStore)> {
    let store = ParamStore::new(device, DType::F32, seed(device));
    Ok((Mlp::new(&store)?, store))
}

/// `STEPS` global batches `([ROWS, 6], [ROWS, 2])` on tpu:0.
fn mlp_batches() -> Result<Vec<(Tensor, Tensor)>> {
    let mut rng = Rng(5);
    (0..STEPS)
        .map(|_| {
            let x: Vec<f32> = (0..ROWS * 6).map(|_| rng.next() as f32).collect();
            let y: Vec<f32> = (0..ROWS * 2).map(|_| rng.next() as f32).collect();
            Ok((
                Tensor::from_vec(x, [ROWS, 6], Device::Tpu(0))?,
                Tensor::from_vec(y, [ROWS, 2], Device::Tpu(0))?,
            ))
        })
        .collect()
}

/// Losses and parameters after each step of one model on tpu:0.
type Trace = Vec<(f64, Vec<(String, Vec<f64>)>)>;

fn mlp_on_one_device<O: Optimizer>(
    batches: &[(Tensor, Tensor)],
    optimizer: impl Fn(Vec<Parameter>) -> O,
) -> Result<Trace> {
    let (model, store) = build_mlp(Device::Tpu(0))?;
    let mut opt = optimizer(store.parameters());
    let mut trace = Vec::new();
    for (x, y) in batches {
        let loss = model.loss(x, y)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        trace.push((loss.item()?, snapshot(&store)?));
    }
    Ok(trace)
}

fn mlp_data_parallel<O: Optimizer>(
    optimizer: impl Fn(Vec<Parameter>) -> O,
    devices: usize,
    bucket_bytes: usize,
    batches: &[(Tensor, Tensor)],
    want: &Trace,
    what: &str,
) -> Result<()> {
    let group = DeviceGroup::new((0..devices).collect())?;
    let dp = DataParallel::new(group, build_mlp)?.with_bucket_bytes(bucket_bytes);
    let mut opts = dp.optimizers(optimizer);
    let (_, initial) = build_mlp(Device::Tpu(0))?;
    let initial = snapshot(&initial)?;
    for (rank, replica) in dp.replicas().iter().enumerate() {
        assert_eq!(replica.device(), Device::Tpu(rank));
        assert_same_params(
            replica.store(),
            &initial,
            &format!("{what} initial rank {rank}"),
        )?;
    }
    for (step, ((x, y), (loss, params))) in batches.iter().zip(want).enumerate() {
        let got = dp.step(x, y, |m, x, y| m.loss(x, y), &mut opts)?;
        assert_eq!(got.device(), Device::Tpu(0));
        assert_close(
            &[got.item()?],
            &[*loss],
            &format!("{what} loss at step {step}"),
        );
        assert_identical_replicas(&dp, &format!("{what} step {step}"))?;
        assert_same_params(dp.store(), params, &format!("{what} step {step}"))?;
    }
    Ok(())
}

fn sgd(params: Vec<Parameter>) -> Sgd {
    Sgd::new(params, 0.1, 0.9, 0.01)
}

fn adamw(params: Vec<Parameter>) -> AdamW {
    AdamW::new(params, 1e-2, 0.01)
}

#[test]
fn an_mlp_on_2_and_4_devices_trains_as_on_one() -> Result<()> {
    for mode in MODES {
        with_eager_mode(mode, || -> Result<()> {
            let batches = mlp_batches()?;
            let want = mlp_on_one_device(&batches, sgd)?;
            for devices in [2, 4] {
                let what = format!("{mode} mlp sgd x{devices}");
                let bytes = tpu_rs::dist::DEFAULT_BUCKET_BYTES;
                mlp_data_parallel(sgd, devices, bytes, &batches, &want, &what)?;
            }
            // Small buckets: several all_reduces per step, same result.
            let what = format!("{mode} mlp sgd x2 256-byte buckets");
            mlp_data_parallel(sgd, 2, 256, &batches, &want, &what)?;
            let want = mlp_on_one_device(&batches, adamw)?;
            let what = format!("{mode} mlp adamw x4");
            mlp_data_parallel(adamw, 4, 1024, &batches, &want, &what)?;
            Ok(())
        })?;
    }
    Ok(())
}

// ---- The small GPT. ----

const GPT: GptConfig = GptConfig {
    vocab_size: 64,
    block_size: 16,
    n_layer: 2,
    n_head: 4,
    n_embd: 32,
};

fn build_gpt(device: Device) -> Result<(Gpt, ParamStore)> {
    let store = ParamStore::new(device, DType::F32, seed(device));
    Ok((Gpt::new(&store, GPT)?, store))
}

/// `STEPS` batches of token ids `[ROWS, 16]` and their next tokens.
fn gpt_batches() -> Result<Vec<(Tensor, Tensor)>> {
    let mut rng = Rng(9);
    let t = GPT.block_size;
    (0..STEPS)
        .map(|_| {
            let text: Vec<i64> = (0..ROWS * (t + 1))
                .map(|_| rng.below(GPT.vocab_size))
                .collect();
            let (mut x, mut y) = (Vec::new(), Vec::new());
            for row in text.chunks(t + 1) {
                x.extend_from_slice(&row[..t]);
                y.extend_from_slice(&row[1..]);
            }
            Ok((
                Tensor::from_vec(x, [ROWS, t], Device::Tpu(0))?,
                Tensor::from_vec(y, [ROWS, t], Device::Tpu(0))?,
            ))
        })
        .collect()
}

/// The example's step (backward, clipping, an optimizer step) on tpu:0.
fn gpt_on_one_device<O: Optimizer>(
    batches: &[(Tensor, Tensor)],
    optimizer: impl Fn(Vec<Parameter>) -> O,
) -> Result<Trace> {
    let (model, store) = build_gpt(Device::Tpu(0))?;
    let mut opt = optimizer(store.parameters());
    let mut trace = Vec::new();
    for (x, y) in batches {
        let loss = model.loss(x, y)?;
        loss.backward()?;
        clip_grad_norm(&store.parameters(), 1.0)?;
        opt.step()?;
        opt.zero_grad();
        trace.push((loss.item()?, snapshot(&store)?));
    }
    Ok(trace)
}

/// The example's step data-parallel over `devices`, checked against `want`
/// at every step: the loss; every replica's parameters against rank 0's,
/// bit for bit; rank 0's against one device's when `compare_params`.
fn gpt_data_parallel<O: Optimizer>(
    optimizer: impl Fn(Vec<Parameter>) -> O,
    world: World,
    batches: &[(Tensor, Tensor)],
    want: &Trace,
    compare_params: bool,
    what: &str,
) -> Result<()> {
    let dp = DataParallel::new(world, build_gpt)?;
    let mut opts = dp.optimizers(optimizer);
    for (step, ((x, y), (loss, params))) in batches.iter().zip(want).enumerate() {
        let got = dp.forward_backward(x, y, |m, x, y| m.loss(x, y))?;
        for (replica, opt) in dp.replicas().iter().zip(&mut opts) {
            clip_grad_norm(replica.parameters(), 1.0)?;
            opt.step()?;
            opt.zero_grad();
        }
        assert_close(
            &[got.item()?],
            &[*loss],
            &format!("{what} loss at step {step}"),
        );
        assert_identical_replicas(&dp, &format!("{what} step {step}"))?;
        if compare_params {
            assert_same_params(dp.store(), params, &format!("{what} step {step}"))?;
        }
    }
    Ok(())
}

fn gpt_sgd(params: Vec<Parameter>) -> Sgd {
    Sgd::new(params, 0.1, 0.9, 0.01)
}

/// The example's optimizer. Adam divides by the root of the second moment,
/// so a gradient that is zero in exact arithmetic but rounding noise in
/// floats (the attention key bias: softmax ignores a shift of every score)
/// becomes a step of about `lr` whose sign depends on the summation order,
/// and small gradients turn their rounding into parameter differences of
/// order `lr * error / |g|`. Those parameters cannot match another
/// summation order to 1e-5 (the key bias also cannot change the loss);
/// the losses can, and the replicas must stay identical.
fn gpt_adamw(params: Vec<Parameter>) -> AdamW {
    AdamW::new(params, 3e-3, 0.01)
}

#[test]
fn the_small_gpt_on_2_and_4_devices_trains_as_on_one() -> Result<()> {
    for mode in MODES {
        with_eager_mode(mode, || -> Result<()> {
            let batches = gpt_batches()?;
            let want = gpt_on_one_device(&batches, gpt_sgd)?;
            for devices in [2, 4] {
                let what = format!("{mode} gpt sgd x{devices}");
                gpt_data_parallel(gpt_sgd, local(devices)?, &batches, &want, true, &what)?;
            }
            let want = gpt_on_one_device(&batches, gpt_adamw)?;
            let what = format!("{mode} gpt adamw x2");
            gpt_data_parallel(gpt_adamw, local(2)?, &batches, &want, false, &what)?;
            Ok(())
        })?;
    }
    Ok(())
}

/// `tpu:0 .. tpu:devices-1` of this process alone.
fn local(devices: usize) -> Result<World> {
    Ok(DeviceGroup::new((0..devices).collect())?.into())
}

// ---- Across processes: each rank is a copy of this test binary. ----

const ROLE: &str = "TPU_RS_DP_TEST_ROLE";
/// What a rank prints once it has checked every step.
const RANK_DONE: &str = "rank: every step checked";

#[test]
fn the_small_gpt_on_2_processes_trains_as_on_one_device() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "rank_of_a_data_parallel_job", "--nocapture"])
                .env(ROLE, "rank")
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("TPU_DIST_TIMEOUT", "120")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, child) in ranks.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        // The rank says it ran: a filter that matched nothing exits 0 too.
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains(RANK_DONE),
            "rank {rank}: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// One rank: the same global batches as one device, split over 1 and then
/// 2 devices in each of 2 processes, in Strict and DeferAndFuse; losses
/// and parameters must match one device's at every step.
#[test]
fn rank_of_a_data_parallel_job() -> Result<()> {
    if std::env::var_os(ROLE).is_none() {
        return Ok(());
    }
    let processes = ProcessGroup::from_env()?;
    for mode in MODES {
        with_eager_mode(mode, || -> Result<()> {
            let batches = gpt_batches()?;
            let want = gpt_on_one_device(&batches, gpt_sgd)?;
            for devices in [1, 2] {
                let world = World::new(
                    DeviceGroup::new((0..devices).collect())?,
                    Some(processes.clone()),
                );
                let what = format!("{mode} gpt sgd, {devices} device(s) x 2 processes");
                gpt_data_parallel(gpt_sgd, world, &batches, &want, true, &what)?;
            }
            // Each process passes only its half of every batch.
            let rank = processes.rank() as i64;
            let halves: Vec<(Tensor, Tensor)> = batches
                .iter()
                .map(|(x, y)| {
                    let half = (ROWS / 2) as i64;
                    Ok((
                        x.narrow(0, rank * half, half)?,
                        y.narrow(0, rank * half, half)?,
                    ))
                })
                .collect::<Result<_>>()?;
            let world = World::new(DeviceGroup::new(vec![0])?, Some(processes.clone()));
            let dp = DataParallel::new(world, build_gpt)?.with_process_batches();
            let mut opts = dp.optimizers(gpt_sgd);
            for (step, ((x, y), (loss, params))) in halves.iter().zip(&want).enumerate() {
                let got = dp.forward_backward(x, y, |m, x, y| m.loss(x, y))?;
                for (replica, opt) in dp.replicas().iter().zip(&mut opts) {
                    clip_grad_norm(replica.parameters(), 1.0)?;
                    opt.step()?;
                    opt.zero_grad();
                }
                let what = format!("{mode} gpt sgd, per-process batches, step {step}");
                assert_close(&[got.item()?], &[*loss], &what);
                assert_same_params(dp.store(), params, &what)?;
            }
            Ok(())
        })?;
    }
    println!("{RANK_DONE}");
    Ok(())
}

// ---- Misuse. ----

#[test]
fn a_batch_that_does_not_divide_is_a_typed_error() -> Result<()> {
    for (devices, rows) in [(2, 7), (4, 6)] {
        let dp = DataParallel::new(DeviceGroup::new((0..devices).collect())?, build_mlp)?;
        let mut opts = dp.optimizers(|params| Sgd::new(params, 0.1, 0.0, 0.0));
        let x = Tensor::zeros([rows, 6], DType::F32, Device::Tpu(0))?;
        let y = Tensor::zeros([rows, 2], DType::F32, Device::Tpu(0))?;
        let Err(e) = dp.step(&x, &y, |m, x, y| m.loss(x, y), &mut opts) else {
            panic!("a batch of {rows} rows over {devices} devices must fail");
        };
        assert!(
            matches!(e, Error::UnevenBatch { rows: r, replicas: n, .. } if r == rows && n == devices),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(message.contains(&format!("{rows} rows")), "{message}");
        assert!(
            message.contains(&format!("{devices} equal shards")),
            "{message}"
        );
        // Nothing ran: no replica holds a gradient.
        for replica in dp.replicas() {
            assert!(
                replica
                    .parameters()
                    .iter()
                    .all(|p| p.get().grad().is_none())
            );
        }
    }
    let dp = DataParallel::new(DeviceGroup::new(vec![0, 1])?, build_mlp)?;
    let scalar = Tensor::scalar(1.0, DType::F32, Device::Tpu(0))?;
    assert!(matches!(dp.scatter(&scalar), Err(Error::Shape { .. })));
    Ok(())
}

#[test]
fn replicas_that_do_not_match_their_group_are_typed_errors() -> Result<()> {
    // Every replica built on tpu:0, whatever device it was asked for.
    let on_tpu0 = |_device: Device| build_mlp(Device::Tpu(0));
    match DataParallel::new(DeviceGroup::new(vec![0, 1])?, on_tpu0) {
        Err(Error::Replicas { group, reason }) => {
            assert_eq!(group, "tpu:{0, 1}");
            assert!(
                reason.contains("rank 1") && reason.contains("tpu:0"),
                "{reason}"
            );
        }
        Err(e) => panic!("expected a replica error, got {e}"),
        Ok(_) => panic!("expected a replica error"),
    }
    // Rank 1's model differs in shape from rank 0's.
    let uneven = |device: Device| -> Result<(Linear, ParamStore)> {
        let store = ParamStore::new(device, DType::F32, 1);
        let out = if device == Device::Tpu(0) { 3 } else { 4 };
        Ok((Linear::new(&store.root(), 2, out, true)?, store))
    };
    match DataParallel::new(DeviceGroup::new(vec![0, 1])?, uneven) {
        Err(Error::Replicas { reason, .. }) => {
            assert!(
                reason.contains("`bias`") && reason.contains("rank 1"),
                "{reason}"
            );
        }
        Err(e) => panic!("expected a replica error, got {e}"),
        Ok(_) => panic!("expected a replica error"),
    }
    // Rank 1's model has a parameter rank 0's lacks.
    let extra = |device: Device| -> Result<(Linear, ParamStore)> {
        let store = ParamStore::new(device, DType::F32, 1);
        Ok((
            Linear::new(&store.root(), 2, 3, device != Device::Tpu(0))?,
            store,
        ))
    };
    match DataParallel::new(DeviceGroup::new(vec![0, 1])?, extra) {
        Err(Error::Replicas { reason, .. }) => {
            assert!(
                reason.contains("`bias`") && reason.contains("rank 0 lacks"),
                "{reason}"
            );
        }
        Err(e) => panic!("expected a replica error, got {e}"),
        Ok(_) => panic!("expected a replica error"),
    }
    // Groups naming a device twice or one the client lacks.
    assert!(DeviceGroup::new(vec![1, 1]).is_err());
    assert!(DeviceGroup::new(vec![0, 99]).is_err());
    // One optimizer for two replicas.
    let dp = DataParallel::new(DeviceGroup::new(vec![0, 1])?, build_mlp)?;
    let mut one = vec![Sgd::new(dp.store().parameters(), 0.1, 0.0, 0.0)];
    let x = Tensor::zeros([ROWS, 6], DType::F32, Device::Tpu(0))?;
    let y = Tensor::zeros([ROWS, 2], DType::F32, Device::Tpu(0))?;
    match dp.step(&x, &y, |m, x, y| m.loss(x, y), &mut one) {
        Err(Error::Replicas { reason, .. }) => {
            assert!(reason.contains("one optimizer per replica"))
        }
        other => panic!("expected a replica error, got {other:?}"),
    }
    Ok(())
}

#[test]
fn a_reordered_group_trains_as_one_device() -> Result<()> {
    // Rank 0 on tpu:2: its parameters are the ones every replica starts from.
    let batches = mlp_batches()?;
    let dp = DataParallel::new(DeviceGroup::new(vec![2, 0])?, build_mlp)?;
    let (_, initial) = build_mlp(Device::Tpu(2))?;
    let initial = snapshot(&initial)?;
    assert_same_params(dp.replicas()[1].store(), &initial, "rank 1 from rank 0")?;
    let mut opts = dp.optimizers(|params| Sgd::new(params, 0.1, 0.0, 0.0));
    let store = ParamStore::new(Device::Tpu(0), DType::F32, seed(Device::Tpu(2)));
    let model = Mlp::new(&store)?;
    let mut opt = Sgd::new(store.parameters(), 0.1, 0.0, 0.0);
    for (x, y) in &batches {
        let got = dp.step(x, y, |m, x, y| m.loss(x, y), &mut opts)?;
        let want = model.loss(x, y)?;
        want.backward()?;
        opt.step()?;
        opt.zero_grad();
        assert_close(&[got.item()?], &[want.item()?], "loss");
        assert_eq!(got.device(), Device::Tpu(2));
        let params = snapshot(&store)?;
        for replica in dp.replicas() {
            assert_same_params(replica.store(), &params, "reordered")?;
        }
    }
    Ok(())
}
