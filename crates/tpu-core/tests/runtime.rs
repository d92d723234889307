//! The runtime suite: run against whichever plugin `TPU_RS_PLUGIN` selects
//! (the XLA CPU plugin by default; CI runs it on two plugins with different
//! PJRT API versions).

use std::sync::OnceLock;

use half::{bf16, f16};
use tpu_core::pjrt::discovery;
use tpu_core::{
    Arg, Client, ClientOptions, CompileCache, CompileOptions, DType, DiskCache, Element, Error,
    Plugin,
};

fn plugin() -> &'static Plugin {
    Plugin::from_env().expect("a PJRT plugin (run `tpu-rs plugin install cpu`)")
}

/// A client with `devices` CPU devices, shared by the tests in this file.
fn client(devices: usize) -> &'static Client {
    static CLIENTS: [OnceLock<Client>; 5] = [const { OnceLock::new() }; 5];
    CLIENTS[devices].get_or_init(|| {
        let options = ClientOptions {
            cpu_device_count: Some(devices),
            ..ClientOptions::default()
        };
        Client::new(plugin(), &options).expect("client")
    })
}

fn round_trip<T: Element + PartialEq + std::fmt::Debug>(values: &[T]) {
    let c = client(1);
    let buffer = c.buffer_from_slice(values, [values.len()], 0).unwrap();
    assert_eq!(buffer.dtype(), T::DTYPE);
    let back = buffer.to_vec::<T>().unwrap();
    assert_eq!(T::as_bytes(&back), T::as_bytes(values), "{}", T::DTYPE);
}

#[test]
fn every_dtype_round_trips_bit_exactly() {
    round_trip(&[true, false, true]);
    round_trip(&[i8::MIN, -1, 0, 1, i8::MAX]);
    round_trip(&[i16::MIN, -1, 0, i16::MAX]);
    round_trip(&[i32::MIN, -7, 0, i32::MAX]);
    round_trip(&[i64::MIN, -7, 0, i64::MAX]);
    round_trip(&[0u8, 1, 128, 255]);
    round_trip(&[0u32, 1, u32::MAX]);
    round_trip(&[
        f16::MIN_POSITIVE_SUBNORMAL,
        f16::NEG_INFINITY,
        f16::from_f32(-0.0),
        f16::MAX,
    ]);
    round_trip(&[
        bf16::MIN_POSITIVE_SUBNORMAL,
        bf16::INFINITY,
        bf16::from_f32(-0.0),
        bf16::MIN,
    ]);
    round_trip(&[
        f32::from_bits(0x7fc0_1234),
        -0.0,
        f32::MIN_POSITIVE / 2.0,
        f32::MAX,
    ]);
    round_trip(&[
        f64::from_bits(0x7ff8_0000_0000_beef),
        -0.0,
        5e-324,
        f64::MIN,
    ]);
}

#[test]
fn shapes_and_empty_buffers_round_trip() {
    let c = client(1);
    let scalar = c.buffer_from_slice(&[3.5f32], [], 0).unwrap();
    assert_eq!(scalar.to_vec::<f32>().unwrap(), vec![3.5]);
    let empty = c.buffer_from_slice::<f32>(&[], [2, 0, 3], 0).unwrap();
    assert_eq!(empty.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    let grid: Vec<i32> = (0..24).collect();
    let b = c.buffer_from_slice(&grid, [2, 3, 4], 0).unwrap();
    assert_eq!(b.shape().dims(), &[2, 3, 4]);
    assert_eq!(b.to_vec::<i32>().unwrap(), grid);
    assert!(b.on_device_size().unwrap() >= 24 * 4);
}

const MATMUL_TANH: &str = r#"
module @matmul_tanh {
  func.func public @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>, %c: tensor<2x2xf32>) -> tensor<2x2xf32> {
    %0 = stablehlo.dot_general %a, %b, contracting_dims = [1] x [0] : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<2x2xf32>
    %1 = stablehlo.add %0, %c : tensor<2x2xf32>
    %2 = stablehlo.tanh %1 : tensor<2x2xf32>
    return %2 : tensor<2x2xf32>
  }
}"#;

#[test]
fn hand_written_matmul_and_elementwise_give_the_right_numbers() {
    let c = client(1);
    let a = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.25];
    let b = [0.1f32, -0.2, 0.3, 0.4, -0.5, 0.6];
    let bias = [0.05f32, -0.1, 0.2, 0.0];
    let exe = c.compile(MATMUL_TANH, &CompileOptions::default()).unwrap();
    let out = exe
        .run(&[
            &c.buffer_from_slice(&a, [2, 3], 0).unwrap(),
            &c.buffer_from_slice(&b, [3, 2], 0).unwrap(),
            &c.buffer_from_slice(&bias, [2, 2], 0).unwrap(),
        ])
        .unwrap();
    let got = out[0].to_vec::<f32>().unwrap();
    for i in 0..2 {
        for j in 0..2 {
            let dot: f64 = (0..3)
                .map(|k| f64::from(a[i * 3 + k]) * f64::from(b[k * 2 + j]))
                .sum();
            let want = (dot + f64::from(bias[i * 2 + j])).tanh();
            assert!((f64::from(got[i * 2 + j]) - want).abs() < 1e-6, "{got:?}");
        }
    }
}

fn all_reduce_program(n: usize) -> String {
    let group: Vec<String> = (0..n).map(|i| i.to_string()).collect();
    format!(
        r#"module @all_reduce attributes {{mhlo.num_replicas = {n} : i32}} {{
  func.func public @main(%x: tensor<3xf32>) -> tensor<3xf32> {{
    %0 = "stablehlo.all_reduce"(%x) ({{
    ^bb0(%a: tensor<f32>, %b: tensor<f32>):
      %s = stablehlo.add %a, %b : tensor<f32>
      stablehlo.return %s : tensor<f32>
    }}) {{replica_groups = dense<[[{}]]> : tensor<1x{n}xi64>}} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }}
}}"#,
        group.join(", ")
    )
}

fn check_all_reduce(n: usize) {
    let c = client(n);
    assert_eq!(c.device_count(), n);
    let exe = c
        .compile(&all_reduce_program(n), &CompileOptions::replicated(n))
        .unwrap();
    assert_eq!(exe.devices(), (0..n).collect::<Vec<_>>().as_slice());
    let inputs: Vec<_> = (0..n)
        .map(|d| {
            let v = [d as f32, 1.0, 10.0 * d as f32];
            c.buffer_from_slice(&v, [3], d).unwrap()
        })
        .collect();
    let args = inputs.iter().map(|b| vec![Arg::Borrow(b)]).collect();
    let outputs = exe.execute_on_devices(args).unwrap();
    let total: f32 = (0..n).map(|d| d as f32).sum();
    for (d, out) in outputs.iter().enumerate() {
        assert_eq!(out[0].device(), d);
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            vec![total, n as f32, 10.0 * total]
        );
    }
}

#[test]
fn all_reduce_across_two_replicas() {
    check_all_reduce(2);
}

#[test]
fn all_reduce_across_four_replicas() {
    check_all_reduce(4);
}

#[test]
fn devices_describe_themselves_and_copy_between_each_other() {
    let c = client(2);
    let devices = c.devices();
    assert_eq!(devices.len(), 2);
    assert_ne!(devices[0].id, devices[1].id);
    assert!(!devices[0].kind.is_empty());
    assert_eq!(c.platform_name(), "cpu");
    let x = c.buffer_from_slice(&[1u8, 2, 3], [3], 0).unwrap();
    let y = x.copy_to_device(1).unwrap();
    assert_eq!(y.device(), 1);
    assert_eq!(y.to_vec::<u8>().unwrap(), vec![1, 2, 3]);
    // Memory stats are optional in PJRT; when reported they must be sane.
    if let Some(stats) = c.memory_stats(0).unwrap() {
        assert!(
            stats
                .peak_bytes_in_use
                .is_none_or(|p| p >= stats.bytes_in_use)
        );
    }
}

#[test]
fn plugin_reports_its_versions() {
    let p = plugin();
    let (major, minor) = p.api_version();
    assert_eq!(major, 0);
    assert!(minor >= 54, "API 0.{minor}");
    let (hlo_major, hlo_minor, _) = p.stablehlo_version().expect("stablehlo_current_version");
    assert!(hlo_major >= 1 && hlo_minor > 0);
    assert!(client(1).identity().contains(&format!("{major}.{minor}")));
}

const DONOR: &str = r#"
module @scale_in_place {
  func.func public @main(%x: tensor<4xf32> {tf.aliasing_output = 0 : i32}) -> tensor<4xf32> {
    %0 = stablehlo.add %x, %x : tensor<4xf32>
    return %0 : tensor<4xf32>
  }
}"#;

#[test]
fn donated_inputs_are_consumed_and_borrowed_ones_survive() {
    let c = client(1);
    let exe = c.compile(DONOR, &CompileOptions::default()).unwrap();
    assert!(exe.signature().parameters[0].donor);
    let values = [1.0f32, 2.0, 3.0, 4.0];

    // Borrowed: never donated, the input keeps its contents.
    let x = c.buffer_from_slice(&values, [4], 0).unwrap();
    let y = exe.execute(vec![Arg::Borrow(&x)]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    assert!(!x.is_deleted().unwrap());
    assert_ne!(y[0].device_address().unwrap(), x.device_address().unwrap());
    assert_eq!(x.to_vec::<f32>().unwrap(), values.to_vec());

    // Donated: the buffer moves into the call, its memory becomes the output.
    let x = c.buffer_from_slice(&values, [4], 0).unwrap();
    let address = x.device_address().unwrap();
    let y = exe.execute(vec![Arg::Donate(x)]).unwrap();
    assert_eq!(y[0].to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0, 8.0]);
    assert_eq!(
        y[0].device_address().unwrap(),
        address,
        "the output reuses the donated memory"
    );

    // A donated output can be donated again, step after step.
    let mut state = y.into_iter().next().unwrap();
    for _ in 0..3 {
        state = exe.execute(vec![Arg::Donate(state)]).unwrap().remove(0);
    }
    assert_eq!(state.to_vec::<f32>().unwrap(), vec![16.0, 32.0, 48.0, 64.0]);
}

#[test]
fn cache_compiles_identical_programs_once() {
    let c = client(1);
    let cache = CompileCache::new(8);
    let opts = CompileOptions::default();
    let first = cache.get_or_compile(c, MATMUL_TANH, &opts).unwrap();
    for _ in 0..5 {
        let again = cache.get_or_compile(c, MATMUL_TANH, &opts).unwrap();
        assert!(std::sync::Arc::ptr_eq(&first, &again));
    }
    let stats = cache.stats();
    assert_eq!((stats.compiles, stats.hits), (1, 5));
    assert!(stats.compile_time.as_nanos() > 0);
    // Other options are another program.
    let other = cache.get_or_compile(
        client(2),
        &all_reduce_program(2),
        &CompileOptions::replicated(2),
    );
    assert!(other.is_ok());
    assert_eq!(cache.stats().compiles, 2);
    assert_eq!(cache.len(), 2);
}

#[test]
fn cache_evicts_the_least_recently_used() {
    let c = client(1);
    let cache = CompileCache::new(1);
    let opts = CompileOptions::default();
    cache.get_or_compile(c, MATMUL_TANH, &opts).unwrap();
    cache.get_or_compile(c, DONOR, &opts).unwrap();
    cache.get_or_compile(c, MATMUL_TANH, &opts).unwrap();
    let stats = cache.stats();
    assert_eq!((stats.compiles, stats.evictions, stats.hits), (3, 2, 0));
}

/// MATMUL_TANH on fixed inputs through `exe`.
fn matmul_tanh_values(c: &Client, exe: &tpu_core::Executable) -> Vec<f32> {
    let a = c.buffer_from_slice(&[1.0f32, 2.0, 3.0, -1.0, 0.5, 0.25], [2, 3], 0);
    let b = c.buffer_from_slice(&[0.1f32, -0.2, 0.3, 0.4, -0.5, 0.6], [3, 2], 0);
    let bias = c.buffer_from_slice(&[0.05f32, -0.1, 0.2, 0.0], [2, 2], 0);
    let out = exe
        .run(&[&a.unwrap(), &b.unwrap(), &bias.unwrap()])
        .unwrap();
    out[0].to_vec::<f32>().unwrap()
}

#[test]
fn damaged_disk_entries_are_recompiled_and_rewritten() {
    let c = client(1);
    if !c.plugin().serializes_safely() {
        return; // this plugin keeps no disk tier
    }
    let dir = std::env::temp_dir().join(format!("tpu-rs-damaged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let opts = CompileOptions::default();
    let fresh = || CompileCache::with_disk(8, DiskCache::open(&dir, 1 << 30).unwrap());
    let first = fresh();
    let want = matmul_tanh_values(c, &first.get_or_compile(c, MATMUL_TANH, &opts).unwrap());
    let entry = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let good = std::fs::read(&entry).unwrap();
    let mut flipped = good.clone();
    let middle = good.len() / 2;
    flipped[middle] ^= 0x40;
    for damaged in [&good[..middle], &flipped[..], &[][..]] {
        std::fs::write(&entry, damaged).unwrap();
        let cache = fresh();
        let exe = cache.get_or_compile(c, MATMUL_TANH, &opts).unwrap();
        assert_eq!((cache.stats().compiles, cache.stats().disk_hits), (1, 0));
        assert_eq!(matmul_tanh_values(c, &exe), want);
        // The recompiled executable replaced the damaged entry.
        let next = fresh();
        let exe = next.get_or_compile(c, MATMUL_TANH, &opts).unwrap();
        assert_eq!((next.stats().compiles, next.stats().disk_hits), (0, 1));
        assert_eq!(matmul_tanh_values(c, &exe), want);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

// ---- Bad input: typed errors, never an abort. ----

#[test]
fn missing_plugin_path_is_not_found() {
    let err = Plugin::load("/nonexistent/libpjrt.so").unwrap_err();
    assert!(matches!(err, Error::PluginNotFound { .. }), "{err}");
}

#[test]
fn a_file_that_is_not_a_plugin_is_a_load_error() {
    let dir = std::env::temp_dir().join(format!("tpu-rs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("not_a_plugin.so");
    std::fs::write(&text, b"this is not an ELF file").unwrap();
    let err = Plugin::load(&text).unwrap_err();
    assert!(matches!(err, Error::PluginLoad { .. }), "{err}");
    // A real shared library without GetPjrtApi.
    let libm = [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists());
    if let Some(libm) = libm {
        let err = Plugin::load(libm).unwrap_err();
        assert!(err.to_string().contains("GetPjrtApi"), "{err}");
    }
}

#[test]
fn invalid_stablehlo_is_a_pjrt_error() {
    let c = client(1);
    let bad = "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> { %0 = stablehlo.frobnicate %x : tensor<2xf32>\n return %0 : tensor<2xf32> }";
    let err = c.compile(bad, &CompileOptions::default()).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Pjrt {
                call: "PJRT_Client_Compile",
                ..
            }
        ),
        "{err}"
    );
    let err = c
        .compile("not mlir at all", &CompileOptions::default())
        .unwrap_err();
    assert!(matches!(err, Error::Signature(_)), "{err}");
    // Type-incorrect body with a readable signature.
    let mistyped =
        "func.func @main(%x: tensor<2xf32>) -> tensor<3xf32> { return %x : tensor<2xf32> }";
    assert!(c.compile(mistyped, &CompileOptions::default()).is_err());
}

#[test]
fn zero_replicas_and_too_many_devices_are_rejected_before_the_plugin() {
    let c = client(1);
    let zero = CompileOptions {
        num_replicas: 0,
        ..Default::default()
    };
    let err = c.compile(MATMUL_TANH, &zero).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                option: "num_replicas",
                ..
            }
        ),
        "{err}"
    );
    let zero = CompileOptions {
        num_partitions: 0,
        ..Default::default()
    };
    assert!(matches!(
        c.compile(MATMUL_TANH, &zero),
        Err(Error::InvalidOption { .. })
    ));
    let err = c
        .compile(MATMUL_TANH, &CompileOptions::replicated(3))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
    let err = Client::new(
        plugin(),
        &ClientOptions {
            cpu_device_count: Some(0),
            ..ClientOptions::default()
        },
    )
    .unwrap_err();
    assert!(matches!(err, Error::InvalidOption { .. }), "{err}");
}

#[test]
fn wrong_buffer_sizes_are_rejected() {
    let c = client(1);
    let err = c
        .buffer_from_bytes(&[0u8; 7], DType::F32, [2], 0)
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::BufferSize {
                expected: 8,
                actual: 7,
                ..
            }
        ),
        "{err}"
    );
    let err = c.buffer_from_slice(&[1.0f64; 3], [2, 2], 0).unwrap_err();
    assert!(err.to_string().contains("[2, 2]"), "{err}");
    let b = c.buffer_from_slice(&[1i32; 4], [4], 0).unwrap();
    assert!(matches!(
        b.copy_to_host(&mut [0u8; 3]),
        Err(Error::BufferSize { .. })
    ));
    assert!(matches!(
        b.to_vec::<f32>(),
        Err(Error::DTypeMismatch { .. })
    ));
}

#[test]
fn executables_check_their_arguments() {
    let c = client(1);
    let exe = c.compile(MATMUL_TANH, &CompileOptions::default()).unwrap();
    let a = c.buffer_from_slice(&[0.0f32; 6], [2, 3], 0).unwrap();
    let b = c.buffer_from_slice(&[0.0f32; 6], [3, 2], 0).unwrap();
    let wrong_dtype = c.buffer_from_slice(&[0.0f64; 4], [2, 2], 0).unwrap();
    let err = exe.run(&[&a, &b, &wrong_dtype]).unwrap_err();
    assert!(
        matches!(err, Error::ArgumentMismatch { index: 2, .. })
            && err.to_string().contains("f64[2, 2]"),
        "{err}"
    );
    let wrong_shape = c.buffer_from_slice(&[0.0f32; 6], [3, 2], 0).unwrap();
    assert!(matches!(
        exe.run(&[&a, &b, &wrong_shape]),
        Err(Error::ArgumentMismatch { index: 2, .. })
    ));
    assert!(matches!(
        exe.run(&[&a, &b]),
        Err(Error::ArgumentCount {
            expected: 3,
            actual: 2,
            ..
        })
    ));
    assert!(matches!(
        exe.execute_on_devices(vec![vec![], vec![]]),
        Err(Error::DeviceCount { .. })
    ));
    // A buffer from another client is refused, not misread.
    let foreign = client(2)
        .buffer_from_slice(&[0.0f32; 4], [2, 2], 0)
        .unwrap();
    assert!(matches!(
        exe.run(&[&a, &b, &foreign]),
        Err(Error::ArgumentMismatch { .. })
    ));
}

#[test]
fn device_indices_out_of_range_are_rejected() {
    let c = client(2);
    let err = c.buffer_from_slice(&[1.0f32], [1], 2).unwrap_err();
    assert!(
        matches!(
            err,
            Error::DeviceOutOfRange {
                index: 2,
                count: 2,
                ..
            }
        ),
        "{err}"
    );
    let x = c.buffer_from_slice(&[1.0f32], [1], 0).unwrap();
    assert!(matches!(
        x.copy_to_device(9),
        Err(Error::DeviceOutOfRange { .. })
    ));
    assert!(matches!(
        c.memory_stats(5),
        Err(Error::DeviceOutOfRange { .. })
    ));
    let err = c.compile(DONOR, &CompileOptions::on_device(2)).unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidOption {
                option: "device_assignment",
                ..
            }
        ),
        "{err}"
    );
    // On device 1, arguments must live on device 1.
    let exe = c.compile(DONOR, &CompileOptions::on_device(1)).unwrap();
    assert_eq!(exe.devices(), &[1]);
    let on0 = c.buffer_from_slice(&[1.0f32; 4], [4], 0).unwrap();
    assert!(matches!(
        exe.run(&[&on0]),
        Err(Error::ArgumentMismatch { .. })
    ));
    let on1 = on0.copy_to_device(1).unwrap();
    assert_eq!(
        exe.run(&[&on1]).unwrap()[0].to_vec::<f32>().unwrap(),
        vec![2.0; 4]
    );
}

#[test]
fn discovery_finds_the_plugin_in_use() {
    let installed = discovery::installed_plugins();
    assert!(
        installed
            .iter()
            .any(|(_, path)| path.canonicalize().ok().as_deref() == Some(plugin().path())),
        "{installed:?} vs {:?}",
        plugin().path()
    );
}

#[test]
fn device_scalars_are_uploaded_once_and_hold_their_values() {
    use tpu_core::{Device, scalars::scalar};
    let tpu = Device::Tpu(0);
    let half = scalar(DType::F32, 0.5, tpu).unwrap();
    assert!(
        half.same(&scalar(DType::F32, 0.5, tpu).unwrap()),
        "uploaded twice"
    );
    // Value bits and dtype are the key: -0.0, another dtype, NaN.
    let negative_zero = scalar(DType::F32, -0.0, tpu).unwrap();
    assert!(!negative_zero.same(&scalar(DType::F32, 0.0, tpu).unwrap()));
    assert!(!half.same(&scalar(DType::BF16, 0.5, tpu).unwrap()));
    assert!(
        scalar(DType::F32, f64::NAN, tpu)
            .unwrap()
            .to_host()
            .unwrap()
            .to_f64()[[]]
        .is_nan()
    );
    assert_eq!(half.to_host().unwrap().to_f64()[[]], 0.5);
    assert_eq!(
        negative_zero.to_host().unwrap().to_f64()[[]].to_bits(),
        (-0.0f64).to_bits()
    );
    // Many distinct values (a schedule) cycle through a bounded cache, and
    // every one still reads back right.
    for i in 0..500 {
        let v = 1.0 + f64::from(i) / 1024.0;
        let t = scalar(DType::F32, v, tpu).unwrap();
        assert_eq!(t.to_host().unwrap().to_f64()[[]], v);
    }
    // cpu scalars are plain host values.
    let host = scalar(DType::I64, 7.0, Device::Cpu).unwrap();
    assert_eq!(host.device(), Device::Cpu);
    assert_eq!(host.to_host().unwrap().to_i64()[[]], 7);
}

/// A store that records what the plugin asks of it.
#[derive(Default)]
struct RecordingStore {
    values: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
}

impl tpu_core::pjrt::KeyValueStore for RecordingStore {
    fn get(&self, key: &str, _: std::time::Duration) -> Result<Vec<u8>, String> {
        let values = self.values.lock().unwrap();
        values
            .get(key)
            .cloned()
            .ok_or_else(|| format!("no key {key}"))
    }

    fn put(&self, key: &str, value: &[u8]) -> Result<(), String> {
        self.values
            .lock()
            .unwrap()
            .insert(key.into(), value.to_vec());
        Ok(())
    }
}

#[test]
fn a_client_with_key_value_callbacks_runs_programs() {
    let store = std::sync::Arc::new(RecordingStore::default());
    let options = ClientOptions {
        cpu_device_count: Some(2),
        kv_store: Some(tpu_core::pjrt::KeyValueStoreHandle(store.clone())),
        ..ClientOptions::default()
    };
    let c = Client::new(plugin(), &options).expect("client with callbacks");
    assert_eq!(c.device_count(), 2);
    let exe = c.compile(MATMUL_TANH, &CompileOptions::default()).unwrap();
    let zeros = |dims: [usize; 2]| {
        c.buffer_from_slice(&vec![0.0f32; dims[0] * dims[1]], dims, 0)
            .unwrap()
    };
    let out = exe
        .run(&[&zeros([2, 3]), &zeros([3, 2]), &zeros([2, 2])])
        .unwrap();
    assert_eq!(out[0].to_vec::<f32>().unwrap(), [0.0; 4]);
    drop(c);
    // A single-process CPU client needs no rendezvous; whatever it put is
    // readable back.
    for (key, value) in store.values.lock().unwrap().iter() {
        assert_eq!(
            tpu_core::pjrt::KeyValueStore::get(&*store, key, std::time::Duration::ZERO).unwrap(),
            *value
        );
    }
}

/// A 512-wide matmul chain: milliseconds of work, far past the size the
/// CPU plugin runs inline on its own.
const LONG_MATMULS: &str = r#"
func.func @main(%a: tensor<512x512xf32>) -> tensor<512x512xf32> {
  %0 = stablehlo.dot_general %a, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
  %1 = stablehlo.dot_general %0, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
  %2 = stablehlo.dot_general %1, %a, contracting_dims = [1] x [0] : (tensor<512x512xf32>, tensor<512x512xf32>) -> tensor<512x512xf32>
  return %2 : tensor<512x512xf32>
}"#;

#[test]
fn a_synchronous_cpu_client_finishes_each_program_before_launch_returns() {
    let made = Client::new(
        plugin(),
        &ClientOptions {
            cpu_asynchronous: Some(false),
            ..ClientOptions::default()
        },
    );
    let takes_it = tpu_core::pjrt::discovery::known_plugin_at(plugin().path())
        .is_some_and(|p| p.asynchronous_option);
    if !takes_it {
        // A plugin without the option refuses it rather than ignore it.
        let err = made.expect_err("a plugin without the option refuses it");
        assert!(
            matches!(err, Error::InvalidOption { .. })
                && err.to_string().contains("TPU_RS_CPU_ASYNC"),
            "{err}"
        );
        return;
    }
    let c = made.expect("synchronous client");
    let exe = c.compile(LONG_MATMULS, &CompileOptions::default()).unwrap();
    // Powers of two stay exact: a = I/2 gives a^4 = I/16.
    let n = 512;
    let mut half_identity = vec![0.0f32; n * n];
    for i in 0..n {
        half_identity[i * n + i] = 0.5;
    }
    let a = c.buffer_from_slice(&half_identity, [n, n], 0).unwrap();
    for _ in 0..3 {
        let out = exe.run(&[&a]).unwrap();
        assert!(
            out[0].ready_event().unwrap().is_ready().unwrap(),
            "the result must be ready when the launch returns"
        );
        let values = out[0].to_vec::<f32>().unwrap();
        assert_eq!(values[0], 0.0625);
        assert_eq!(values[1], 0.0);
        assert_eq!(values[n * n - 1], 0.0625);
    }
}

#[test]
fn a_mark_fires_after_the_work_launched_before_it() {
    let runtime = tpu_core::Runtime::global().expect("runtime");
    let c = runtime.client();
    let exe = c.compile(LONG_MATMULS, &CompileOptions::default()).unwrap();
    let n = 512;
    let a = c
        .buffer_from_slice(&vec![0.5f32; n * n], [n, n], 0)
        .unwrap();
    runtime.mark(0).unwrap().wait().unwrap();
    let outputs: Vec<_> = (0..4).map(|_| exe.run(&[&a]).unwrap()).collect();
    let mark = runtime.mark(0).unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    mark.on_ready(move |outcome| sender.send(outcome.is_ok()).unwrap())
        .unwrap();
    mark.wait_ref().unwrap();
    assert!(mark.is_ready().unwrap());
    for out in &outputs {
        assert!(out[0].ready_event().unwrap().is_ready().unwrap());
    }
    let fired = receiver.recv_timeout(std::time::Duration::from_secs(30));
    assert_eq!(fired, Ok(true), "on_ready ran with the work's outcome");
}
