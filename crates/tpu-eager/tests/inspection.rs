//! Inspection of DeferAndFuse through the process-wide metrics: what fused,
//! what compiled, why graphs were cut, what was materialised or donated.
//! Tests here run one at a time, so the counters they read are their own.

mod common;

use std::sync::Mutex;

use common::*;
use tpu_core::metrics::{CutReason, metrics};
use tpu_core::op::Attrs;
use tpu_core::policy::{EagerMode, sync, with_eager_mode, with_policy};
use tpu_core::{Device, Tensor};
use tpu_eager::{DeferAndFuse, DeferConfig};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn chain(x: &Tensor, scale: &Tensor, n: usize) -> Tensor {
    let mut y = x.clone();
    for i in 0..n {
        y = match i % 3 {
            0 => op("tanh", &[&y]),
            1 => op("mul", &[&y, scale]),
            _ => op("add", &[&y, x]),
        };
    }
    y
}

#[test]
fn defer_fuses_a_chain_into_one_program_and_values_never_recompile() {
    let _serial = serial();
    let policy = DeferAndFuse::new(DeferConfig::default());
    with_policy(policy, || {
        let x = ramp(&[4, 6], 0.1, Device::Tpu(0));
        let before = metrics();
        let y = chain(&x, &tensor(&[], vec![0.5], Device::Tpu(0)), 30);
        let first = values(&y);
        let after_first = metrics();
        assert_eq!(
            after_first.executions - before.executions,
            1,
            "one fused program"
        );
        assert_eq!(
            after_first.cuts(CutReason::HostRead) - before.cuts(CutReason::HostRead),
            1
        );
        // New values, a new scalar: the same program.
        let x2 = ramp(&[4, 6], -0.2, Device::Tpu(0));
        let y2 = chain(&x2, &tensor(&[], vec![0.25], Device::Tpu(0)), 30);
        let second = values(&y2);
        let after_second = metrics();
        assert_eq!(
            after_second.compiles, after_first.compiles,
            "no recompilation"
        );
        let expect = with_eager_mode(EagerMode::Strict, || {
            values(&chain(&x2, &tensor(&[], vec![0.25], Device::Tpu(0)), 30))
        })
        .unwrap();
        assert_close(&second, &expect, 1e-5);
        assert_ne!(first, second);
    });
}

#[test]
fn dead_intermediates_are_never_materialized() {
    let _serial = serial();
    let x = ramp(&[256, 256], 0.01, Device::Tpu(0));
    let scale = tensor(&[], vec![0.9], Device::Tpu(0));
    let peak = |mode| {
        with_eager_mode(mode, || {
            let _ = values(&chain(&x, &scale, 3)); // warm up compiles
            tpu_core::metrics::reset_peak_device_bytes();
            let base = metrics().live_device_bytes;
            let y = chain(&x, &scale, 40);
            let _ = values(&y);
            metrics().peak_device_bytes - base
        })
        .unwrap()
    };
    let strict = peak(EagerMode::Strict);
    let fused = peak(EagerMode::DeferAndFuse);
    assert!(fused < strict, "defer peak {fused} bytes, strict {strict}");
    assert!(
        fused <= 256 * 256 * 4,
        "only the result is materialised: {fused}"
    );
}

#[test]
fn cut_points_sync_and_cap() {
    let _serial = serial();
    let policy = DeferAndFuse::new(DeferConfig {
        max_ops: 8,
        ..DeferConfig::default()
    });
    with_policy(policy.clone(), || {
        let x = ramp(&[5], 0.1, Device::Tpu(0));
        let before = metrics();
        let y = chain(&x, &tensor(&[], vec![0.5], Device::Tpu(0)), 20);
        assert!(metrics().cuts(CutReason::PendingCap) > before.cuts(CutReason::PendingCap));
        assert!(policy.pending_ops(0) < 8);
        sync().unwrap();
        assert_eq!(policy.pending_ops(0), 0);
        assert!(metrics().cuts(CutReason::Sync) > before.cuts(CutReason::Sync));
        let expect = with_eager_mode(EagerMode::Strict, || {
            values(&chain(&x, &tensor(&[], vec![0.5], Device::Tpu(0)), 20))
        })
        .unwrap();
        assert_close(&values(&y), &expect, 1e-5);
    });
}

/// One "training step" without any host read: the loop gives the policy no
/// cut of its own.
fn step(p: &Tensor, x: &Tensor, lr: &Tensor) -> Tensor {
    let h = op("mul", &[p, x]);
    let a = op("tanh", &[&h]);
    let g = op("mul", &[&a, x]);
    let s = op("mul", &[&g, lr]);
    op("sub", &[p, &s])
}

#[test]
fn repeated_steps_become_one_stable_graph() {
    let _serial = serial();
    let policy = DeferAndFuse::new(DeferConfig {
        max_ops: 64,
        ..DeferConfig::default()
    });
    let x = ramp(&[8], 0.1, Device::Tpu(0));
    let expect = with_eager_mode(EagerMode::Strict, || {
        let mut p = ramp(&[8], 0.05, Device::Tpu(0));
        for i in 0..60 {
            p = step(
                &p,
                &x,
                &tensor(&[], vec![0.1 / (1.0 + i as f64)], Device::Tpu(0)),
            );
        }
        values(&p)
    })
    .unwrap();
    with_policy(policy, || {
        let mut p = ramp(&[8], 0.05, Device::Tpu(0));
        let mut compiles_at = Vec::new();
        for i in 0..60 {
            p = step(
                &p,
                &x,
                &tensor(&[], vec![0.1 / (1.0 + i as f64)], Device::Tpu(0)),
            );
            compiles_at.push(metrics().compiles);
        }
        assert!(metrics().cuts(CutReason::RepeatedSequence) > 0);
        assert_eq!(compiles_at[30], compiles_at[59], "steps stopped compiling");
        assert_close(&values(&p), &expect, 1e-5);
    });
}

#[test]
fn donated_inputs_are_reused() {
    let _serial = serial();
    let policy = DeferAndFuse::new(DeferConfig::default());
    with_policy(policy, || {
        let x = ramp(&[64, 64], 0.01, Device::Tpu(0));
        let _ = values(&op("tanh", &[&x])); // compile once
        let x = ramp(&[64, 64], 0.01, Device::Tpu(0));
        let address = x.buffer().unwrap().device_address().unwrap();
        let y = op("tanh", &[&x]);
        drop(x); // nothing holds the input any more: it is donated
        let out = y.buffer().unwrap();
        assert_eq!(
            out.device_address().unwrap(),
            address,
            "output reuses the donated input"
        );
    });
}

/// A 3-layer MLP: parameters, a batch, and one SGD step (forward, backward,
/// update), with the learning rate a tensor.
struct Mlp {
    params: Vec<Tensor>,
}

impl Mlp {
    fn new() -> Mlp {
        let sizes = [8usize, 16, 16, 4];
        let mut params = Vec::new();
        for i in 0..3 {
            params.push(ramp(
                &[sizes[i], sizes[i + 1]],
                0.05 / (1.0 + i as f64),
                Device::Tpu(0),
            ));
            params.push(ramp(&[sizes[i + 1]], 0.01, Device::Tpu(0)));
        }
        Mlp { params }
    }

    /// One training step; returns the loss.
    fn step(&mut self, x: &Tensor, y: &Tensor, lr: f64) -> f64 {
        let p: Vec<tpu_rs::Tensor> = self
            .params
            .iter()
            .map(|t| tpu_rs::Tensor::from_core(t.clone()).with_requires_grad(true))
            .collect();
        let mut h = tpu_rs::Tensor::from_core(x.clone());
        for layer in 0..3 {
            let z = (&h.matmul(&p[2 * layer]).unwrap() + &p[2 * layer + 1]).unwrap();
            h = if layer < 2 { z.relu().unwrap() } else { z };
        }
        let d = (&h - &tpu_rs::Tensor::from_core(y.clone())).unwrap();
        let loss = (&d * &d).unwrap().mean_all().unwrap();
        loss.backward().unwrap();
        let lr = tensor(&[], vec![lr], Device::Tpu(0));
        for (param, p) in self.params.iter_mut().zip(&p) {
            let g = p.grad().expect("every parameter gets a gradient");
            *param = op("sub", &[param, &op("mul", &[g.value(), &lr])]);
        }
        // The end of an optimizer step: the update runs as its own graph.
        sync().unwrap();
        values(loss.value())[0]
    }
}

fn batch() -> (Tensor, Tensor) {
    (
        ramp(&[32, 8], 0.1, Device::Tpu(0)),
        ramp(&[32, 4], 0.05, Device::Tpu(0)),
    )
}

#[test]
fn an_mlp_training_step_compiles_on_step_one_only() {
    let _serial = serial();
    with_policy(DeferAndFuse::new(DeferConfig::default()), || {
        let (x, y) = batch();
        let mut model = Mlp::new();
        // Programs built, whether compiled or loaded from the disk cache.
        let built = || {
            let m = metrics();
            m.compiles + m.disk_hits
        };
        let start = built();
        let mut compiles = Vec::new();
        let mut losses = Vec::new();
        for step in 0..8 {
            // A new learning rate every step: a new value, not a new program.
            losses.push(model.step(&x, &y, 0.1 / (1.0 + step as f64)));
            compiles.push(built() - start);
        }
        assert!(
            (1..=4).contains(&compiles[0]),
            "step 1 compiled {} modules",
            compiles[0]
        );
        assert_eq!(
            compiles[7], compiles[0],
            "steps 2..8 compiled: {compiles:?}"
        );
        assert!(losses[7] < losses[0], "{losses:?}");
    });
}

#[test]
fn first_steps_queued_behind_compiles_build_the_programs_later_steps_reuse() {
    let _serial = serial();
    let width = 1000 + (std::process::id() as usize % 50_000);
    // A slow program to build (forty ops), reading the parameter.
    let gradient = |p: &Tensor| {
        let mut y = p.clone();
        for name in ["tanh", "sin", "cos", "sigmoid"].iter().cycle().take(20) {
            y = op("add", &[&op(name, &[&y]), &y]);
        }
        y
    };
    let start = ramp(&[2, width], 0.01, Device::Cpu);
    let mut expected = start.clone();
    for _ in 0..4 {
        expected = op("sub", &[&expected, &gradient(&expected)]);
    }
    with_policy(DeferAndFuse::new(DeferConfig::default()), || {
        let policy = tpu_core::policy::current_policy().unwrap();
        let built = || {
            let m = metrics();
            m.compiles + m.disk_hits
        };
        let mut p = ramp(&[2, width], 0.01, Device::Tpu(0));
        let mut step = || {
            let g = gradient(&p);
            policy.start(CutReason::Backward).unwrap();
            // The update reads the parameter the gradient's graph, queued
            // behind its compile, still reads: the steps after this one
            // donate it, and so must this one, or it builds a program of
            // its own.
            p = op("sub", &[&p, &g]);
            policy.start(CutReason::Sync).unwrap();
        };
        let before = built();
        for _ in 0..3 {
            step();
        }
        sync().unwrap();
        let first_steps = built() - before;
        step();
        sync().unwrap();
        assert_eq!(
            built() - before,
            first_steps,
            "a step that waited on no compile built another program"
        );
        assert_close(&values(&p), &values(&expected), 1e-4);
    });
}

/// Runs in a child process (see the next test): MLP training steps through
/// the runtime's cache, then reports the counters.
#[test]
fn child_runs_a_program_with_the_disk_cache() {
    if std::env::var_os("TPU_RS_CACHE_CHILD").is_none() {
        return;
    }
    with_eager_mode(EagerMode::DeferAndFuse, || {
        let (x, y) = batch();
        let mut model = Mlp::new();
        for step in 0..3 {
            model.step(&x, &y, 0.1 / (1.0 + step as f64));
        }
    })
    .unwrap();
    let m = metrics();
    println!("CHILD compiles={} disk_hits={}", m.compiles, m.disk_hits);
}

/// Runs the child above with `env` set (`None`: removed) and returns its
/// compile and disk-hit counts.
fn child_counts(env: &[(&str, Option<&std::path::Path>)]) -> (u64, u64) {
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_runs_a_program_with_the_disk_cache",
        "--nocapture",
        "--test-threads=1",
    ])
    .env("TPU_RS_CACHE_CHILD", "1");
    for (name, value) in env {
        match value {
            Some(v) => cmd.env(name, v),
            None => cmd.env_remove(name),
        };
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let line = text
        .lines()
        .find_map(|l| l.find("CHILD").map(|i| l[i..].to_string()))
        .unwrap_or_else(|| panic!("child said: {text}"));
    let field = |name: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    (field("compiles="), field("disk_hits="))
}

fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("tpu-rs-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Whether this run's plugin keeps executables on disk.
fn plugin_uses_disk_cache() -> bool {
    tpu_core::Runtime::global()
        .unwrap()
        .client()
        .plugin()
        .serializes_safely()
}

#[test]
fn a_second_process_loads_executables_instead_of_compiling() {
    let _serial = serial();
    let dir = scratch_dir("cache-test");
    let env = [("TPU_RS_CACHE_DIR", Some(dir.as_path()))];
    if !plugin_uses_disk_cache() {
        // The disk tier stays off: both processes compile.
        assert_eq!(child_counts(&env).1, 0);
        assert_eq!(
            child_counts(&env).1,
            0,
            "a plugin without safe serialization read the disk"
        );
        return;
    }
    let (compiles, hits) = child_counts(&env);
    assert!(
        compiles >= 1 && hits == 0,
        "first process: {compiles} compiles, {hits} disk hits"
    );
    let (compiles, hits) = child_counts(&env);
    assert_eq!(compiles, 0, "second process compiled");
    assert!(hits >= 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs in a child process (see the next test): warms the runtime's
/// cache from the record `TPU_RS_WARM_CHILD` names.
#[test]
fn child_warms_the_cache() {
    let Some(record) = std::env::var_os("TPU_RS_WARM_CHILD") else {
        return;
    };
    let report = tpu_core::program_record::warm(std::path::Path::new(&record), 2).unwrap();
    println!(
        "CHILD programs={} compiled={} cached={} failed={}",
        report.programs,
        report.compiled,
        report.cached,
        report.failed.len()
    );
}

#[test]
fn a_recorded_run_warms_an_empty_cache_without_running_the_model() {
    let _serial = serial();
    if !plugin_uses_disk_cache() {
        return; // nothing to warm: this plugin's executables stay in memory
    }
    let (recorded_in, warmed) = (scratch_dir("record-run"), scratch_dir("record-warm"));
    std::fs::create_dir_all(&recorded_in).unwrap();
    let record = recorded_in.join("programs.txt");
    let (built, hits) = child_counts(&[
        ("TPU_RS_CACHE_DIR", Some(recorded_in.as_path())),
        ("TPU_RS_RECORD_PROGRAMS", Some(record.as_path())),
    ]);
    assert!(
        built >= 1 && hits == 0,
        "{built} compiles, {hits} disk hits"
    );

    let warm = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_warms_the_cache", "--nocapture"])
        .env("TPU_RS_WARM_CHILD", &record)
        .env("TPU_RS_CACHE_DIR", &warmed)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&warm.stdout).into_owned();
    assert!(
        said.contains(&format!(
            "CHILD programs={built} compiled={built} cached=0 failed=0"
        )),
        "warming from the record: {said}"
    );
    // A run on the warmed cache compiles nothing.
    let (compiles, hits) = child_counts(&[("TPU_RS_CACHE_DIR", Some(warmed.as_path()))]);
    assert_eq!((compiles, hits), (0, built), "a run on the warmed cache");
    let _ = std::fs::remove_dir_all(&recorded_in);
    let _ = std::fs::remove_dir_all(&warmed);
}

#[test]
fn the_disk_cache_is_on_by_default_and_an_empty_folder_turns_it_off() {
    let _serial = serial();
    if !plugin_uses_disk_cache() {
        return; // covered by the test above
    }
    let home = scratch_dir("cache-home");
    // Plugins stay where they are; only the executable cache moves.
    let plugins = tpu_core::pjrt::discovery::plugin_cache_dir();
    let default = [
        ("TPU_RS_CACHE_DIR", None),
        ("XDG_CACHE_HOME", Some(home.as_path())),
        ("TPU_RS_PLUGIN_DIR", Some(plugins.as_path())),
    ];
    let (first, _) = child_counts(&default);
    assert!(first >= 1);
    let stored = std::fs::read_dir(home.join("tpu-rs").join("executables"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(stored >= 1, "nothing stored under $XDG_CACHE_HOME/tpu-rs");
    assert_eq!(
        child_counts(&default).0,
        0,
        "the default cache was not used"
    );

    let empty = std::path::Path::new("");
    let off = [
        ("TPU_RS_CACHE_DIR", Some(empty)),
        ("XDG_CACHE_HOME", Some(home.as_path())),
        ("TPU_RS_PLUGIN_DIR", Some(plugins.as_path())),
    ];
    let (compiles, hits) = child_counts(&off);
    assert_eq!(
        (compiles, hits),
        (first, 0),
        "TPU_RS_CACHE_DIR= still read the disk"
    );
    let _ = std::fs::remove_dir_all(&home);
}

/// One step of a decode loop: a fixed-shape "model" on the newest row of a
/// growing history, whose output is appended to the history.
fn decode_step(history: &Tensor, weight: &Tensor) -> (Tensor, Tensor) {
    let rows = history.ty().shape.dims()[0] as i64;
    let last = op_with(
        "slice",
        &[history],
        Attrs::new()
            .with("dim", 0i64)
            .with("start", rows - 1)
            .with("end", rows)
            .with("step", 1i64),
    );
    let mut h = last;
    for _ in 0..12 {
        h = op("tanh", &[&op("matmul", &[&h, weight])]);
    }
    let history = op_with("concat", &[history, &h], Attrs::new().with("dim", 0i64));
    (history, h)
}

#[test]
fn a_growing_sequence_recompiles_only_the_ops_that_grow() {
    let _serial = serial();
    let weight = ramp(&[8, 8], 0.05, Device::Tpu(0));
    let start = ramp(&[1, 8], 0.3, Device::Tpu(0));
    // (values, cache hits and varying-shape cuts over the last 6 steps)
    let run = |mode: EagerMode| -> (Vec<f64>, u64, u64) {
        with_eager_mode(mode, || {
            let mut history = start.clone();
            let mut before = metrics();
            for step in 0..9 {
                if step == 3 {
                    before = metrics();
                }
                let (next, h) = decode_step(&history, &weight);
                history = next;
                values(&h); // a host read each step, as a stopping check
                // Each step starts with nothing queued behind the growing
                // ops' compiles: a graph planned while launches still wait
                // may donate differently and build a program of its own.
                tpu_eager::launch_queued();
            }
            let m = metrics();
            let splits = m.cuts(CutReason::VaryingShapes) - before.cuts(CutReason::VaryingShapes);
            (values(&history), m.cache_hits - before.cache_hits, splits)
        })
        .unwrap()
    };
    let (want, _, _) = run(EagerMode::Strict);
    let (got, hits, splits) = run(EagerMode::DeferAndFuse);
    assert_close(&got, &want, 1e-6);
    // Each step's graph repeats the last one but for the slice and the
    // concatenation, which run on their own; the 24 ops between them run
    // one cached program every step.
    assert!(
        splits >= 6,
        "{splits} cuts split off the changing ops in 6 steps"
    );
    assert!(hits >= 6, "{hits} cached programs reused in 6 steps");
}

#[test]
fn dumped_graphs_are_the_compiled_program_and_a_picture_of_it() {
    let _serial = serial();
    let dir = std::env::temp_dir().join(format!("tpu-rs-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = DeferConfig {
        dump_dir: Some(dir.clone()),
        ..DeferConfig::default()
    };
    with_policy(DeferAndFuse::new(config), || {
        let x = ramp(&[3, 5], 0.1, Device::Tpu(0));
        // A fresh scale shape, so the graph compiles here rather than
        // coming from an earlier test's cache.
        let y = chain(&x, &ramp(&[1, 5], 0.7, Device::Tpu(0)), 7);
        values(&y);
    });
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the dump folder exists")
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let mlir = files
        .iter()
        .find(|p| p.extension().is_some_and(|e| e == "mlir"))
        .expect("a .mlir file");
    let dot = mlir.with_extension("dot");
    let program = std::fs::read_to_string(mlir).unwrap();
    assert!(program.contains("func.func public @main") && program.contains("stablehlo.tanh"));
    let picture = std::fs::read_to_string(&dot).expect("a .dot beside it");
    assert!(picture.starts_with("digraph fused {") && picture.trim_end().ends_with('}'));
    assert!(picture.contains("cut by host_read"), "{picture}");
    // 7 ops, each labelled with the line of this file that recorded it.
    assert_eq!(picture.matches("inspection.rs:").count(), 7, "{picture}");
    assert!(picture.contains("parameter 0\\nf32[3, 5]"), "{picture}");
    assert!(picture.contains("parameter 1\\nf32[1, 5]"), "{picture}");
    assert!(picture.contains("result 0\\nf32[3, 5]"), "{picture}");
    // Every edge joins declared nodes.
    let declared: Vec<&str> = picture
        .lines()
        .filter(|l| l.contains(" [shape="))
        .map(|l| l.trim().split(' ').next().unwrap())
        .collect();
    for edge in picture.lines().filter(|l| l.contains(" -> ")) {
        let mut ends = edge.trim().split(" -> ");
        let from = ends.next().unwrap();
        let to = ends.next().unwrap().split(' ').next().unwrap();
        assert!(declared.contains(&from) && declared.contains(&to), "{edge}");
    }
    if std::process::Command::new("dot").arg("-V").output().is_ok() {
        // Graphviz parsed the picture and drew it.
        let svg = std::fs::read_to_string(dot.with_extension("svg")).expect("an .svg beside it");
        assert!(
            svg.contains("<svg") && svg.contains("inspection.rs:"),
            "{svg}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
