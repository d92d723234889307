//! The runtime floor: what one PJRT round trip costs before any op layer.
//!
//! `cargo bench -p tpu-core --bench runtime` (plugin from `TPU_RS_PLUGIN`).
//! Plugin load and client creation happen once per process, so they are
//! timed once and printed; everything else is measured by criterion.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tpu_core::pjrt::discovery;
use tpu_core::{Buffer, Client, ClientOptions, CompileOptions, Plugin};

const TINY: &str = r#"
func.func @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = stablehlo.add %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}"#;

fn matmul(n: usize) -> String {
    format!(
        "func.func @main(%a: tensor<{n}x{n}xf32>, %b: tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32> {{
  %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<{n}x{n}xf32>, tensor<{n}x{n}xf32>) -> tensor<{n}x{n}xf32>
  return %0 : tensor<{n}x{n}xf32>
}}"
    )
}

fn setup() -> Client {
    let path = discovery::default_plugin().expect("a PJRT plugin");
    let started = Instant::now();
    let plugin = Plugin::load(&path).expect("plugin loads");
    let loaded = started.elapsed();
    let client = Client::new(plugin, &ClientOptions::default()).expect("client");
    let (major, minor) = plugin.api_version();
    println!(
        "plugin {} (API {major}.{minor}): load {loaded:.2?}, client create {:.2?}",
        path.display(),
        started.elapsed() - loaded
    );
    client
}

fn runtime_floor(c: &mut Criterion) {
    let client = setup();
    let opts = CompileOptions::default();
    let mut group = c.benchmark_group("runtime");
    group.measurement_time(Duration::from_secs(3));

    group.bench_function("compile tiny add", |b| {
        b.iter(|| client.compile(TINY, &opts).unwrap())
    });

    let exe = client.compile(TINY, &opts).unwrap();
    let x = client.buffer_from_slice(&[1.0f32; 4], [4], 0).unwrap();
    let y = client.buffer_from_slice(&[2.0f32; 4], [4], 0).unwrap();
    group.bench_function("execute tiny add (resident inputs, until ready)", |b| {
        b.iter(|| {
            let out = exe.run(&[&x, &y]).unwrap();
            out[0].block_until_ready().unwrap();
        })
    });
    group.bench_function("enqueue tiny add (no wait)", |b| {
        b.iter(|| exe.run(&[&x, &y]).unwrap())
    });

    let mut host = [0u8; 16];
    group.bench_function("read back 4 f32 to host", |b| {
        b.iter(|| x.copy_to_host(&mut host).unwrap())
    });
    group.bench_function("upload 4 f32 from host", |b| {
        b.iter(|| client.buffer_from_slice(&[1.0f32; 4], [4], 0).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("matmul f32");
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    for n in [512, 1024, 2048] {
        let exe = client.compile(&matmul(n), &opts).unwrap();
        let values: Vec<f32> = (0..n * n).map(|i| (i % 7) as f32 * 0.25).collect();
        let a: Buffer = client.buffer_from_slice(&values, [n, n], 0).unwrap();
        // FLOPs per iteration: criterion reports them as "elements/s".
        group.throughput(Throughput::Elements(2 * (n as u64).pow(3)));
        group.bench_function(format!("{n}x{n} (elements = FLOP)"), |b| {
            b.iter(|| {
                let out = exe.run(&[&a, &a]).unwrap();
                out[0].block_until_ready().unwrap();
            })
        });
    }
    group.finish();
}

criterion_group!(benches, runtime_floor);
criterion_main!(benches);
