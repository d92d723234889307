//! Every fuzz target on stable: its corpus replayed (the regression inputs
//! among them), then mutations of it for `TPU_RS_FUZZ_SECONDS` (10 s by
//! default) from a seed printed here (`TPU_RS_FUZZ_SEED` repeats one).

use std::path::Path;
use std::time::{Duration, SystemTime};

use tpu_rs_fuzz::{TARGETS, runner};

fn setting(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a non-negative integer, got `{v}`"))
    })
}

fn fuzz(name: &str) {
    let (_, target) = TARGETS.iter().find(|(n, _)| *n == name).expect("a target");
    let budget = Duration::from_secs(setting("TPU_RS_FUZZ_SECONDS").unwrap_or(10));
    let seed = setting("TPU_RS_FUZZ_SEED").unwrap_or_else(|| {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH);
        now.map_or(0, |d| d.as_nanos() as u64)
    });
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(name);
    match runner::run(name, *target, &corpus, budget, seed) {
        Ok(report) => eprintln!(
            "fuzz {name}: {} corpus inputs and {} mutations passed (TPU_RS_FUZZ_SEED={seed})",
            report.replayed, report.explored
        ),
        Err(failure) => panic!(
            "fuzz {name} (TPU_RS_FUZZ_SEED={seed}): {}\n  input saved to {}; replay it with \
             `cargo run -p tpu-rs-fuzz --bin {name} -- {}` and add it to fuzz/corpus/{name}/",
            failure.message,
            failure.saved.display(),
            failure.saved.display()
        ),
    }
}

#[test]
fn corpus_has_a_folder_for_every_target() {
    for (name, _) in TARGETS {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("corpus")
            .join(name);
        let files = std::fs::read_dir(&dir).map_or(0, |d| d.count());
        assert!(files > 0, "{} holds no seed inputs", dir.display());
    }
}

#[test]
fn signature() {
    fuzz("signature");
}

#[test]
fn checkpoint() {
    fuzz("checkpoint");
}

#[test]
fn cache_entry() {
    fuzz("cache_entry");
}

#[test]
fn program_record() {
    fuzz("program_record");
}

#[test]
fn specs() {
    fuzz("specs");
}

#[test]
fn settings() {
    fuzz("settings");
}

#[test]
fn op_call() {
    fuzz("op_call");
}
