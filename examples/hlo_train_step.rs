//! The runtime without the tensor layer: a two-layer MLP whose whole
//! training step — forward, backward and SGD update — is one hand-written
//! StableHLO program; parameters are donated back to it each step, so they
//! never leave the device.
//!
//! ```text
//! cargo run --release -p tpu-rs --example hlo_train_step
//! ```

use std::time::Instant;

use tpu_rs::{Arg, Buffer, CompileOptions, Runtime};

const BATCH: usize = 64;
const INPUTS: usize = 8;
const HIDDEN: usize = 64;
const STEPS: usize = 400;
const LEARNING_RATE: f32 = 0.05;

fn main() -> tpu_rs::Result<()> {
    let runtime = Runtime::global()?;
    println!("{}", runtime.describe(0)?);
    let client = runtime.client();
    let step = runtime.compile(
        &train_step(BATCH, INPUTS, HIDDEN),
        &CompileOptions::default(),
    )?;

    let mut rng = Lcg(0x5eed);
    let (x, y) = synthetic_data(&mut rng, BATCH * 16);
    let scale1 = (2.0 / INPUTS as f32).sqrt();
    let scale2 = (1.0 / HIDDEN as f32).sqrt();
    let mut params: Vec<Buffer> = vec![
        client.buffer_from_slice(&rng.normals(INPUTS * HIDDEN, scale1), [INPUTS, HIDDEN], 0)?,
        client.buffer_from_slice(&vec![0.0f32; HIDDEN], [HIDDEN], 0)?,
        client.buffer_from_slice(&rng.normals(HIDDEN, scale2), [HIDDEN, 1], 0)?,
        client.buffer_from_slice(&[0.0f32], [1], 0)?,
    ];
    let lr = client.buffer_from_slice(&[LEARNING_RATE], [], 0)?;
    let batches: Vec<(Buffer, Buffer)> = (0..16)
        .map(|b| {
            let xs = &x[b * BATCH * INPUTS..(b + 1) * BATCH * INPUTS];
            let ys = &y[b * BATCH..(b + 1) * BATCH];
            Ok((
                client.buffer_from_slice(xs, [BATCH, INPUTS], 0)?,
                client.buffer_from_slice(ys, [BATCH, 1], 0)?,
            ))
        })
        .collect::<tpu_rs::Result<_>>()?;

    let started = Instant::now();
    let mut first_loss = None;
    let mut last_loss = 0.0;
    for i in 0..STEPS {
        let (xb, yb) = &batches[i % batches.len()];
        let mut args: Vec<Arg> = params.drain(..).map(Arg::Donate).collect();
        args.extend([Arg::Borrow(xb), Arg::Borrow(yb), Arg::Borrow(&lr)]);
        let mut outputs = step.execute(args)?;
        let loss = outputs.pop().expect("the step returns its loss");
        params = outputs;
        if i % 50 == 0 || i == STEPS - 1 {
            last_loss = loss.to_vec::<f32>()?[0];
            first_loss.get_or_insert(last_loss);
            println!("step {i:>4}  loss {last_loss:.5}");
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{STEPS} steps in {:.2?} ({:.0} steps/s); loss {:.4} -> {:.4}",
        elapsed,
        STEPS as f64 / elapsed.as_secs_f64(),
        first_loss.unwrap_or_default(),
        last_loss
    );
    let stats = runtime.cache().stats();
    println!(
        "compiles {}, compile time {:.2?}",
        stats.compiles, stats.compile_time
    );
    Ok(())
}

/// y = sin(x0) + x1 * x2 - 0.5 * x3, with x uniform in [-1, 1).
fn synthetic_data(rng: &mut Lcg, n: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..n * INPUTS).map(|_| rng.uniform() * 2.0 - 1.0).collect();
    let y = x
        .chunks(INPUTS)
        .map(|r| r[0].sin() + r[1] * r[2] - 0.5 * r[3])
        .collect();
    (x, y)
}

/// A small deterministic generator, so every run trains the same way.
struct Lcg(u64);

impl Lcg {
    fn uniform(&mut self) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }

    fn normals(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u1, u2) = (self.uniform().max(1e-7), self.uniform());
                scale * (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
            })
            .collect()
    }
}

/// One SGD step of `pred = relu(x W1 + b1) W2 + b2` on the mean squared
/// error; returns the updated parameters (aliased to the donated inputs)
/// and the loss before the update.
fn train_step(b: usize, d: usize, h: usize) -> String {
    format!(
        r#"module @mlp_train_step {{
  func.func public @main(
      %w1: tensor<{d}x{h}xf32> {{tf.aliasing_output = 0 : i32}},
      %b1: tensor<{h}xf32> {{tf.aliasing_output = 1 : i32}},
      %w2: tensor<{h}x1xf32> {{tf.aliasing_output = 2 : i32}},
      %b2: tensor<1xf32> {{tf.aliasing_output = 3 : i32}},
      %x: tensor<{b}x{d}xf32>, %y: tensor<{b}x1xf32>, %lr: tensor<f32>)
      -> (tensor<{d}x{h}xf32>, tensor<{h}xf32>, tensor<{h}x1xf32>, tensor<1xf32>, tensor<f32>) {{
    %zero = stablehlo.constant dense<0.0> : tensor<f32>
    %zeros = stablehlo.constant dense<0.0> : tensor<{b}x{h}xf32>
    %xw1 = stablehlo.dot_general %x, %w1, contracting_dims = [1] x [0] : (tensor<{b}x{d}xf32>, tensor<{d}x{h}xf32>) -> tensor<{b}x{h}xf32>
    %b1b = stablehlo.broadcast_in_dim %b1, dims = [1] : (tensor<{h}xf32>) -> tensor<{b}x{h}xf32>
    %pre = stablehlo.add %xw1, %b1b : tensor<{b}x{h}xf32>
    %act = stablehlo.maximum %pre, %zeros : tensor<{b}x{h}xf32>
    %hw2 = stablehlo.dot_general %act, %w2, contracting_dims = [1] x [0] : (tensor<{b}x{h}xf32>, tensor<{h}x1xf32>) -> tensor<{b}x1xf32>
    %b2b = stablehlo.broadcast_in_dim %b2, dims = [1] : (tensor<1xf32>) -> tensor<{b}x1xf32>
    %pred = stablehlo.add %hw2, %b2b : tensor<{b}x1xf32>
    %diff = stablehlo.subtract %pred, %y : tensor<{b}x1xf32>
    %sq = stablehlo.multiply %diff, %diff : tensor<{b}x1xf32>
    %sum = stablehlo.reduce(%sq init: %zero) applies stablehlo.add across dimensions = [0, 1] : (tensor<{b}x1xf32>, tensor<f32>) -> tensor<f32>
    %n = stablehlo.constant dense<{b}.0> : tensor<f32>
    %loss = stablehlo.divide %sum, %n : tensor<f32>
    %two_over_n = stablehlo.constant dense<{scale}> : tensor<{b}x1xf32>
    %dpred = stablehlo.multiply %diff, %two_over_n : tensor<{b}x1xf32>
    %dw2 = stablehlo.dot_general %act, %dpred, contracting_dims = [0] x [0] : (tensor<{b}x{h}xf32>, tensor<{b}x1xf32>) -> tensor<{h}x1xf32>
    %db2 = stablehlo.reduce(%dpred init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<{b}x1xf32>, tensor<f32>) -> tensor<1xf32>
    %dact = stablehlo.dot_general %dpred, %w2, contracting_dims = [1] x [1] : (tensor<{b}x1xf32>, tensor<{h}x1xf32>) -> tensor<{b}x{h}xf32>
    %live = stablehlo.compare GT, %pre, %zeros : (tensor<{b}x{h}xf32>, tensor<{b}x{h}xf32>) -> tensor<{b}x{h}xi1>
    %dpre = stablehlo.select %live, %dact, %zeros : tensor<{b}x{h}xi1>, tensor<{b}x{h}xf32>
    %dw1 = stablehlo.dot_general %x, %dpre, contracting_dims = [0] x [0] : (tensor<{b}x{d}xf32>, tensor<{b}x{h}xf32>) -> tensor<{d}x{h}xf32>
    %db1 = stablehlo.reduce(%dpre init: %zero) applies stablehlo.add across dimensions = [0] : (tensor<{b}x{h}xf32>, tensor<f32>) -> tensor<{h}xf32>
    %lr_w1 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<{d}x{h}xf32>
    %lr_b1 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<{h}xf32>
    %lr_w2 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<{h}x1xf32>
    %lr_b2 = stablehlo.broadcast_in_dim %lr, dims = [] : (tensor<f32>) -> tensor<1xf32>
    %sw1 = stablehlo.multiply %dw1, %lr_w1 : tensor<{d}x{h}xf32>
    %sb1 = stablehlo.multiply %db1, %lr_b1 : tensor<{h}xf32>
    %sw2 = stablehlo.multiply %dw2, %lr_w2 : tensor<{h}x1xf32>
    %sb2 = stablehlo.multiply %db2, %lr_b2 : tensor<1xf32>
    %nw1 = stablehlo.subtract %w1, %sw1 : tensor<{d}x{h}xf32>
    %nb1 = stablehlo.subtract %b1, %sb1 : tensor<{h}xf32>
    %nw2 = stablehlo.subtract %w2, %sw2 : tensor<{h}x1xf32>
    %nb2 = stablehlo.subtract %b2, %sb2 : tensor<1xf32>
    return %nw1, %nb1, %nw2, %nb2, %loss : tensor<{d}x{h}xf32>, tensor<{h}xf32>, tensor<{h}x1xf32>, tensor<1xf32>, tensor<f32>
  }}
}}"#,
        scale = format_args!("{:e}", 2.0 / b as f32),
    )
}
