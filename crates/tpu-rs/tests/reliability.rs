//! What a long-lived process needs: threads sharing a device, malformed
//! settings, Ctrl-C in the middle of compiling or training, and a few
//! hundred training steps that hold device memory and programs constant.
//! The cases that need a process of their own run this test binary again
//! as a child doing one of the `child_*` roles below (they do nothing when
//! run any other way).

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use tpu_rs::Result;
use tpu_rs::models::{Gpt, GptConfig};
use tpu_rs::nn::{Linear, Module, ParamStore, mse};
use tpu_rs::optim::{AdamW, Optimizer};
use tpu_rs::prelude::*;

/// This binary again, running only the child role `role`. It starts with
/// SIGINT at its default action: a shell that runs the suite in the
/// background ignores SIGINT, and children inherit that.
fn child(role: &str) -> Command {
    let mut cmd = Command::new("env");
    cmd.arg("--default-signal=INT")
        .arg(std::env::current_exe().expect("the test binary"))
        .args([role, "--exact", "--ignored", "--nocapture"])
        .args(["--test-threads", "1"])
        .env("TPU_RS_RELIABILITY_CHILD", role);
    cmd
}

/// True in the child process started for `role`.
fn is_child(role: &str) -> bool {
    std::env::var("TPU_RS_RELIABILITY_CHILD").is_ok_and(|r| r == role)
}

fn output_text(out: &Output) -> String {
    format!(
        "{}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

// --- threads ---------------------------------------------------------------

#[test]
fn threads_sharing_a_device_each_get_their_own_answers() {
    for mode in [EagerMode::Strict, EagerMode::DeferAndFuse] {
        std::thread::scope(|s| {
            for k in 0..4 {
                s.spawn(move || {
                    with_eager_mode(mode, || thread_work(k)).unwrap();
                });
            }
        });
    }
}

/// Thread `k`'s own chain, 30 times on inputs that change each time, each
/// result checked against the same chain on `cpu`.
fn thread_work(k: usize) -> Result<()> {
    for i in 0..30 {
        let values: Vec<f32> = (0..48)
            .map(|j| ((j * (k + 3) + i) % 17) as f32 / 8.0 - 1.0)
            .collect();
        let chain = |device: Device| -> Result<Vec<f64>> {
            let a = Tensor::from_slice(&values, [6, 8], device)?;
            let b = a.transpose(0, 1)?.scale(0.5 + k as f64)?;
            let y = a.matmul(&b)?.tanh()?.add_scalar(i as f64)?;
            y.sum([1], false)?.to_f64_vec()
        };
        let (got, want) = (chain(Device::Tpu(0))?, chain(Device::Cpu)?);
        for (g, w) in got.iter().zip(&want) {
            assert!(
                (g - w).abs() <= 1e-4 * w.abs().max(1.0),
                "thread {k} step {i}: {got:?} vs {want:?}"
            );
        }
    }
    Ok(())
}

// --- settings ----------------------------------------------------------------

#[test]
fn malformed_settings_are_errors_naming_the_variable() {
    let cases = [
        ("TPU_RS_EAGER", "fast", None),
        ("TPU_RS_DEFER_MAX_OPS", "abc", Some("defer_and_fuse")),
        ("TPU_RS_DEFER_MAX_BYTES", "-1", Some("defer_and_fuse")),
        ("TPU_RS_DEBUG_CHECKS", "nan,parrity", Some("debug")),
        ("TPU_RS_CPU_DEVICES", "zero", None),
        ("TPU_RS_CPU_ASYNC", "sometimes", None),
        ("TPU_RS_CACHE_MAX_BYTES", "lots", None),
        ("TPU_RS_COMPILE_THREADS", "many", Some("strict")),
    ];
    for (variable, value, mode) in cases {
        let mut cmd = child("child_one_op");
        cmd.env(variable, value);
        if let Some(mode) = mode {
            cmd.env("TPU_RS_EAGER", mode);
        }
        let out = cmd.output().unwrap();
        let text = output_text(&out);
        assert!(
            text.contains("one op: error"),
            "{variable}={value} was accepted:\n{text}"
        );
        assert!(
            text.contains(variable) && text.contains(value),
            "{variable}={value}:\n{text}"
        );
    }
}

#[test]
#[ignore = "a child role of malformed_settings_are_errors_naming_the_variable"]
fn child_one_op() {
    if !is_child("child_one_op") {
        return;
    }
    let result = Tensor::from_slice(&[1.0f32, 2.0], [2], Device::Tpu(0))
        .and_then(|x| x.scale(3.0)?.to_f64_vec());
    match result {
        Ok(v) => println!("one op: ok {v:?}"),
        Err(e) => println!("one op: error {e}"),
    }
}

// --- Ctrl-C ------------------------------------------------------------------

#[test]
fn ctrl_c_while_compiling_or_training_stops_promptly_and_leaves_the_cache_sound() {
    for (after, delay) in [
        ("start", Duration::from_millis(50)),
        ("step 3", Duration::ZERO),
    ] {
        let cache = std::env::temp_dir().join(format!(
            "tpu-rs-ctrl-c-{}-{}",
            std::process::id(),
            after.replace(' ', "")
        ));
        let _ = std::fs::remove_dir_all(&cache);
        let mut training = child("child_train_forever")
            .env("TPU_RS_CACHE_DIR", &cache)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(training.stdout.take().unwrap()).lines();
        let started = Instant::now();
        loop {
            let line = lines
                .next()
                .expect("the child printed its progress")
                .unwrap();
            // The test harness may start the line (`test child_... `).
            if line.ends_with(&format!("progress: {after}")) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "no `{after}` yet"
            );
        }
        std::thread::sleep(delay);
        let interrupted = Instant::now();
        let kill = Command::new("kill")
            .args(["-INT", &training.id().to_string()])
            .status();
        assert!(kill.is_ok_and(|s| s.success()));
        let status = wait_at_most(&mut training, Duration::from_secs(10));
        assert_eq!(status.signal(), Some(2), "after `{after}`: {status}");
        if after == "start" {
            // Stopped in its first step: compiling into the empty cache.
            let rest: Vec<String> = lines.map_while(std::result::Result::ok).collect();
            assert!(
                !rest.iter().any(|l| l.contains("progress: step")),
                "{rest:?}"
            );
        }
        eprintln!(
            "SIGINT after `{after}`: stopped in {:?}",
            interrupted.elapsed()
        );

        // A second process on the same cache: what it loads computes right.
        let out = child("child_one_step")
            .env("TPU_RS_CACHE_DIR", &cache)
            .output()
            .unwrap();
        let text = output_text(&out);
        assert!(
            out.status.success() && text.contains("one step: equal"),
            "after `{after}`: {text}"
        );
        std::fs::remove_dir_all(&cache).unwrap();
    }
}

fn wait_at_most(child: &mut std::process::Child, limit: Duration) -> std::process::ExitStatus {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            panic!("still running {limit:?} after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A small MLP, its optimizer and a fixed batch on `device`.
fn mlp(device: Device) -> Result<(Linear, Linear, AdamW, Tensor, Tensor)> {
    let store = ParamStore::new(device, DType::F32, 7);
    let first = Linear::new(&store.root().sub("0"), 16, 32, true)?;
    let second = Linear::new(&store.root().sub("1"), 32, 4, true)?;
    let opt = AdamW::new(store.parameters(), 1e-2, 0.01);
    let x: Vec<f32> = (0..8 * 16)
        .map(|i| ((i * 7) % 11) as f32 / 5.0 - 1.0)
        .collect();
    let y: Vec<f32> = (0..8 * 4).map(|i| ((i * 3) % 5) as f32 / 4.0).collect();
    let x = Tensor::from_slice(&x, [8, 16], device)?;
    let y = Tensor::from_slice(&y, [8, 4], device)?;
    Ok((first, second, opt, x, y))
}

fn mlp_step(m: &mut (Linear, Linear, AdamW, Tensor, Tensor)) -> Result<f64> {
    let (first, second, opt, x, y) = m;
    let loss = mse(&second.forward(&first.forward(x)?.relu()?)?, y)?;
    loss.backward()?;
    opt.step()?;
    opt.zero_grad();
    loss.item()
}

#[test]
#[ignore = "a child role of the Ctrl-C test"]
fn child_train_forever() {
    if !is_child("child_train_forever") {
        return;
    }
    println!("progress: start");
    let mut model = mlp(Device::Tpu(0)).unwrap();
    for step in 1.. {
        mlp_step(&mut model).unwrap();
        println!("progress: step {step}");
    }
}

#[test]
#[ignore = "a child role of the Ctrl-C test"]
fn child_one_step() {
    if !is_child("child_one_step") {
        return;
    }
    let mut losses = Vec::new();
    for device in [Device::Tpu(0), Device::Cpu] {
        let mut model = mlp(device).unwrap();
        losses.push((mlp_step(&mut model).unwrap(), mlp_step(&mut model).unwrap()));
    }
    let ((a1, a2), (b1, b2)) = (losses[0], losses[1]);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-5 * b.abs().max(1.0);
    if close(a1, b1) && close(a2, b2) {
        println!("one step: equal");
    } else {
        println!("one step: differs {losses:?}");
    }
}

// --- exit ------------------------------------------------------------------

#[test]
fn a_process_that_exits_while_its_programs_compile_exits_cleanly() {
    // Each run into an empty cache folder, so the programs really compile.
    for run in 0..3 {
        let cache = std::env::temp_dir().join(format!("tpu-rs-exit-{}-{run}", std::process::id()));
        let out = child("child_exits_while_compiling")
            .env("TPU_RS_EAGER", "strict")
            .env("TPU_RS_CACHE_DIR", &cache)
            .output()
            .unwrap();
        let text = output_text(&out);
        assert!(out.status.success(), "run {run}:\n{text}");
        assert!(
            text.contains("queued 60 calls"),
            "run {run}: the child did not run:\n{text}"
        );
        let _ = std::fs::remove_dir_all(&cache);
    }
}

#[test]
#[ignore = "a child role of a_process_that_exits_while_its_programs_compile_exits_cleanly"]
fn child_exits_while_compiling() {
    if !is_child("child_exits_while_compiling") {
        return;
    }
    // Strict queues each call behind its compile and returns; the process
    // then exits with the compiles under way.
    let width = 1000 + std::process::id() as usize % 5000;
    let mut y = Tensor::ones([2, width], DType::F32, Device::Tpu(0)).unwrap();
    for _ in 0..20 {
        y = y
            .sin()
            .and_then(|s| &s + &y)
            .and_then(|z| z.tanh())
            .unwrap();
    }
    println!("queued 60 calls");
}

// --- long runs -----------------------------------------------------------------

#[test]
fn training_holds_device_bytes_and_programs_constant_after_warm_up() {
    for mode in ["strict", "defer_and_fuse"] {
        let out = child("child_soak")
            .env("TPU_RS_EAGER", mode)
            .output()
            .unwrap();
        let text = output_text(&out);
        // The child says it ran: a filter that matched nothing exits 0 too.
        assert!(
            out.status.success() && text.contains("soak: flat"),
            "{mode}: {text}"
        );
    }
}

#[test]
#[ignore = "a child role of the long-run test"]
fn child_soak() {
    if !is_child("child_soak") {
        return;
    }
    const STEPS: usize = 300;
    const EVERY: usize = 50;
    const WARM_UP: usize = 100;
    let config = GptConfig {
        vocab_size: 64,
        block_size: 16,
        n_layer: 2,
        n_head: 2,
        n_embd: 32,
    };
    let device = Device::Tpu(0);
    let store = ParamStore::new(device, DType::F32, 3);
    let model = Gpt::new(&store, config).unwrap();
    let mut opt = AdamW::new(store.parameters(), 1e-3, 0.01);
    let ids = |offset: usize| -> Vec<i64> {
        (0..4 * 16)
            .map(|i| ((i * 5 + offset) % 64) as i64)
            .collect()
    };
    let mut table = Vec::new();
    for step in 1..=STEPS {
        let x = Tensor::from_vec(ids(step % 4), [4, 16], device).unwrap();
        let y = Tensor::from_vec(ids(step % 4 + 1), [4, 16], device).unwrap();
        let loss = model.loss(&x, &y).unwrap();
        loss.backward().unwrap();
        opt.step().unwrap();
        opt.zero_grad();
        let loss = loss.item().unwrap();
        if step % EVERY == 0 {
            let m = tpu_core::metrics::metrics();
            table.push((step, m.live_device_bytes, m.compiles + m.disk_hits, loss));
        }
    }
    let after: Vec<_> = table.iter().filter(|r| r.0 >= WARM_UP).collect();
    let flat = after.iter().all(|r| (r.1, r.2) == (after[0].1, after[0].2));
    assert!(flat, "(step, live device bytes, programs, loss) {table:?}");
    assert!(
        table.last().unwrap().3 < table[0].3,
        "the loss went down: {table:?}"
    );
    println!("soak: flat {} {table:?}", Path::new(file!()).display());
}
