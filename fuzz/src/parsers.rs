//! Targets for the parsers: program signatures, checkpoints, compile-cache
//! entries, device and plugin specs, environment settings.

use std::path::PathBuf;

use arbitrary::Unstructured;
use tpu_core::policy::EagerMode;
use tpu_core::program_record::{self, RecordedProgram};
use tpu_core::settings::{self, Lookup};
use tpu_core::stablehlo::Signature;
use tpu_core::{DType, Device, DiskCache, Error, Runtime};
use tpu_eager::{DebugChecks, DeferConfig};
use tpu_rs::Tensor;
use tpu_rs::nn::{Linear, ParamStore};

/// Reading a StableHLO entry signature from any text.
pub fn signature(data: &[u8]) {
    let _ = Signature::parse(&String::from_utf8_lossy(data));
}

/// Loading any file as a safetensors checkpoint, alone and into a model.
pub fn checkpoint(data: &[u8]) {
    let path = scratch_file("checkpoint.safetensors");
    std::fs::write(&path, data).expect("writing the fuzz input");
    if let Ok(tensors) = tpu_rs::checkpoint::load_tensors(&path) {
        for (name, t) in &tensors {
            assert_eq!(t.to_f64().len(), t.shape().numel(), "{name}");
        }
    }
    let store = ParamStore::new(Device::Cpu, DType::F32, 0);
    let _layer = Linear::new(&store.root().sub("fc"), 2, 3, true).expect("a small layer");
    let _ = tpu_rs::checkpoint::load(&store, &path);
}

/// Reading any bytes as a compile-cache entry: only an intact entry for the
/// identity asked for gives an executable, and stored entries read back.
pub fn cache_entry(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let identity: String = u.arbitrary().unwrap_or_default();
    let file = u.take_rest();
    if let Some(executable) = DiskCache::decode_entry(&identity, file) {
        assert_eq!(DiskCache::encode_entry(&identity, executable), file);
    }
    let entry = DiskCache::encode_entry(&identity, file);
    assert_eq!(DiskCache::decode_entry(&identity, &entry), Some(file));
    // Through the folder: the file as found on disk under this identity.
    let cache = DiskCache::open(scratch_file("cache"), 1 << 20).expect("a private folder");
    cache.store(&identity, file).expect("storing an entry");
    assert_eq!(cache.load(&identity).as_deref(), Some(file));
}

/// A record of programs (`TPU_RS_RECORD_PROGRAMS`), as found in a file:
/// its distinct programs, which read back the same once written again, or
/// an error naming the file.
pub fn program_record(data: &[u8]) {
    let path = scratch_file("record");
    std::fs::write(&path, data).expect("writing the record");
    match program_record::read(&path) {
        Ok(programs) => {
            let text: String = programs.iter().map(RecordedProgram::encode).collect();
            std::fs::write(&path, text).expect("writing the record");
            assert_eq!(program_record::read(&path).ok(), Some(programs));
        }
        Err(Error::ProgramRecord { path: named, .. }) => {
            assert_eq!(named, path.display().to_string());
        }
        Err(e) => panic!("not a record error: {e}"),
    }
}

/// Device strings (`cpu`, `tpu`, `tpu:N`) and plugin specs (names, paths).
pub fn specs(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(device) = text.parse::<Device>() {
        assert_eq!(device.to_string().parse::<Device>(), Ok(device));
        // A device that does not exist is an error naming it, on first use.
        if !device.is_tpu() || Runtime::global().is_ok() {
            let _ = Tensor::zeros([2], DType::F32, device).and_then(|t| t.to_f64_vec());
        }
    }
    // Resolving only: loading runs the library's code.
    if let Ok(path) = tpu_core::pjrt::discovery::resolve_plugin(&text) {
        assert!(path.is_file(), "{text:?} resolved to {}", path.display());
    }
}

/// The variables the settings target sets, with values that are near
/// misses of valid ones as well as arbitrary text.
const VARIABLES: &[&str] = &[
    "TPU_RS_EAGER",
    "TPU_RS_DEBUG_CHECKS",
    "TPU_RS_DEFER_MAX_OPS",
    "TPU_RS_DEFER_MAX_BYTES",
    "TPU_RS_CPU_DEVICES",
    "TPU_RS_CPU_ASYNC",
    "TPU_RS_CACHE_MAX_BYTES",
    "TPU_RS_COMPILE_THREADS",
];

const NEAR_MISSES: &[&str] = &[
    "strict",
    "Debug",
    "defer-and-fuse",
    "fuse",
    "nan",
    "nan,parity",
    "parity,",
    "nan;parity",
    "0",
    "1",
    " 4096 ",
    "-1",
    "1.5",
    "abc",
    "2G",
    "3 MiB",
    "1e3",
    "off",
    "True",
    "18446744073709551616",
];

/// Each environment setting, set to anything: a value, or an error that
/// names the variable.
pub fn settings(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let mut values: Vec<(&'static str, String)> = Vec::new();
    for &name in VARIABLES {
        let value = match u.int_in_range(0..=2u8).unwrap_or(0) {
            0 => continue,
            1 => u
                .choose(NEAR_MISSES)
                .map(|s| s.to_string())
                .unwrap_or_default(),
            _ => u.arbitrary::<String>().unwrap_or_default(),
        };
        values.push((name, value));
    }
    let get = |name: &'static str| -> tpu_core::Result<Option<String>> {
        let value = values.iter().find(|(n, _)| *n == name).map(|(_, v)| v);
        Ok(value.filter(|v| !v.is_empty()).cloned())
    };
    let get: Lookup<'_> = &get;
    check_setting(EagerMode::from_lookup(get).map(drop));
    check_setting(DebugChecks::from_lookup(get).map(drop));
    check_setting(DeferConfig::from_lookup(get).map(drop));
    check_setting(settings::count(get, "TPU_RS_CPU_DEVICES").map(drop));
    check_setting(settings::switch(get, "TPU_RS_CPU_ASYNC").map(drop));
    check_setting(settings::bytes(get, "TPU_RS_CACHE_MAX_BYTES").map(drop));
    check_setting(tpu_core::compile_pool::threads_from_lookup(get).map(drop));
}

fn check_setting(result: tpu_core::Result<()>) {
    match result {
        Ok(()) => {}
        Err(Error::InvalidOption { option, reason }) => {
            assert!(VARIABLES.contains(&option), "unexpected option {option}");
            assert!(
                Error::InvalidOption { option, reason }
                    .to_string()
                    .contains(option),
                "the error does not name {option}"
            );
        }
        Err(other) => panic!("a setting gave an error of the wrong kind: {other}"),
    }
}

/// A file of this thread's own under the system's temporary folder.
fn scratch_file(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "tpu-rs-fuzz-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    std::fs::create_dir_all(&dir).expect("creating a scratch folder");
    dir.join(name)
}
