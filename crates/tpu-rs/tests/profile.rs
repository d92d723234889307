//! Profile traces: a short GPT run's trace parses as Chrome trace JSON and
//! holds compile, launch and transfer spans and graph cuts attributed to
//! this file; a changed batch size is reported as a recompile naming the
//! dimension; `tpu-rs trace summary` reads the trace back. Tests that
//! record run one at a time: a process records one trace at a time.

use std::sync::Mutex;

use serde_json::Value;
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::ParamStore;
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;
use tpu_rs::{RecompileReason, Result, profile};

static RECORDING: Mutex<()> = Mutex::new(());

fn events(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("the trace is written");
    let trace: Value = serde_json::from_str(&text).expect("the trace is JSON");
    trace["traceEvents"]
        .as_array()
        .expect("a traceEvents list")
        .clone()
}

fn of<'a>(events: &'a [Value], cat: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["cat"] == cat).collect()
}

fn train_a_few_steps(steps: usize) -> Result<()> {
    let store = ParamStore::new(Device::Tpu(0), DType::F32, 11);
    let model = Gpt::new(&store, GptConfig::tiny())?;
    let mut opt = AdamW::new(store.parameters(), 1e-3, 0.0);
    let config = model.config();
    let tokens: Vec<i64> = (0..2 * 8).map(|i| i % config.vocab_size as i64).collect();
    let inputs = Tensor::from_vec(tokens.clone(), [2, 8], Device::Tpu(0))?;
    let targets = Tensor::from_vec(tokens, [2, 8], Device::Tpu(0))?;
    for _ in 0..steps {
        let loss = model.loss(&inputs, &targets)?;
        loss.backward()?;
        opt.step()?;
        opt.zero_grad();
        loss.item()?;
    }
    Ok(())
}

#[test]
fn a_gpt_runs_trace_has_compiles_launches_transfers_and_cuts_from_this_file() -> Result<()> {
    let _one = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("gpt");
    let path = dir.join("trace.json");
    profile::record(&path, || {
        with_eager_mode(EagerMode::DeferAndFuse, || train_a_few_steps(3))
    })??;
    let events = events(&path);

    let compiles = of(&events, "compile");
    assert!(!compiles.is_empty(), "no compile spans");
    for c in &compiles {
        let tier = c["args"]["cache"].as_str().unwrap_or_default();
        assert!(
            ["memory", "disk", "compiled"].contains(&tier),
            "cache tier {tier:?}"
        );
        assert!(
            c["dur"].as_f64().is_some(),
            "a compile span without a duration"
        );
    }
    assert!(!of(&events, "execute").is_empty(), "no launch spans");
    let transfers = of(&events, "transfer");
    for direction in ["host_to_device", "device_to_host"] {
        let moved: Vec<_> = transfers
            .iter()
            .filter(|t| t["name"] == direction)
            .collect();
        assert!(!moved.is_empty(), "no {direction} transfer");
        assert!(moved.iter().all(|t| t["args"]["bytes"].as_f64().is_some()));
    }
    let ops = of(&events, "op");
    assert!(
        ops.iter().any(|o| o["name"] == "matmul"),
        "no matmul dispatch span"
    );

    let cuts = of(&events, "cut");
    assert!(!cuts.is_empty(), "DeferAndFuse cut no graph");
    let this_file = cuts
        .iter()
        .filter(|c| {
            c["args"]["at"]
                .as_str()
                .unwrap_or_default()
                .contains("tests/profile.rs")
        })
        .count();
    assert_eq!(
        this_file,
        cuts.len(),
        "cuts not attributed to this file: {cuts:?}"
    );
    let reasons: Vec<&str> = cuts.iter().filter_map(|c| c["name"].as_str()).collect();
    assert!(
        reasons.contains(&"host_read") || reasons.contains(&"sync"),
        "{reasons:?}"
    );
    assert!(
        of(&events, "memory")
            .iter()
            .any(|m| m["args"]["bytes"].as_f64() > Some(0.0)),
        "no live device bytes counted"
    );

    // The summary reads the same file back.
    let summary = profile::Summary::from_json(&std::fs::read_to_string(&path).unwrap())
        .expect("the summary parses the trace");
    assert_eq!(summary.cuts.values().sum::<u64>(), cuts.len() as u64);
    assert_eq!(summary.launches.count, of(&events, "execute").len() as u64);
    assert!(summary.peak_bytes() > 0);
    assert!(
        summary
            .memory_svg()
            .is_some_and(|svg| svg.contains("<polyline"))
    );
    Ok(())
}

#[test]
fn a_changed_batch_size_is_a_recompile_that_names_the_dimension() -> Result<()> {
    let _one = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("recompile");
    let path = dir.join("trace.json");
    let before = tpu_rs::metrics().recompiles(RecompileReason::InputShape);
    profile::record(&path, || {
        with_eager_mode(EagerMode::Strict, || -> Result<()> {
            let w = Tensor::ones([13, 7], DType::F32, Device::Tpu(0))?;
            for batch in [5, 9] {
                let x = Tensor::ones([batch, 13], DType::F32, Device::Tpu(0))?;
                x.matmul(&w)?.to_vec::<f32>()?;
            }
            Ok(())
        })
    })??;
    let after = tpu_rs::metrics().recompiles(RecompileReason::InputShape);
    assert!(
        after > before,
        "the second batch size was not counted as a recompile"
    );
    let events = events(&path);
    let detail = of(&events, "recompile")
        .iter()
        .filter(|r| r["name"] == "op `matmul`")
        .filter_map(|r| r["args"]["detail"].as_str())
        .collect::<Vec<_>>()
        .join("; ");
    assert!(
        detail.contains("input 0 dim 0: 5 -> 9"),
        "recompile detail {detail:?} does not name the batch dimension"
    );
    Ok(())
}

#[test]
fn the_cli_summarizes_a_trace_and_plots_its_memory() -> Result<()> {
    let _one = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("cli");
    let path = dir.join("run.json");
    profile::record(&path, || {
        with_eager_mode(EagerMode::Strict, || train_a_few_steps(1))
    })??;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpu-rs"))
        .args(["trace", "summary"])
        .arg(&path)
        .output()
        .expect("tpu-rs runs");
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for line in [
        "top ops by dispatch time",
        "matmul",
        "compiles:",
        "transfers:",
        "device memory: peak",
    ] {
        assert!(printed.contains(line), "no {line:?} in\n{printed}");
    }
    let svg = std::fs::read_to_string(dir.join("run.memory.svg")).expect("the memory plot");
    assert!(svg.starts_with("<svg") && svg.contains("<polyline"));

    let bad = dir.join("bad.json");
    std::fs::write(&bad, "{not json").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpu-rs"))
        .args(["trace", "summary"])
        .arg(&bad)
        .output()
        .expect("tpu-rs runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not JSON"));
    Ok(())
}

#[test]
fn a_second_recording_at_once_is_an_error() {
    let _one = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempdir("twice");
    let nested = profile::record(dir.join("outer.json"), || {
        profile::record(dir.join("inner.json"), || ())
    });
    let inner = nested.expect("the outer recording starts");
    let message = inner
        .expect_err("the inner recording is refused")
        .to_string();
    assert!(message.contains("already being recorded"), "{message}");
    assert!(!profile::recording(), "the outer recording did not stop");
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tpu-rs-profile-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
