//! The examples a new user runs first, run as they would be: the spirals
//! MLP and the CNN reach their accuracy bars, and a training stopped and
//! resumed in new processes equals the uninterrupted one bit for bit.
//! Each example exits non-zero when its own check fails.

use std::path::PathBuf;
use std::process::Command;

/// Builds example `name` (in this test's profile) and returns its path.
fn example(name: &str) -> PathBuf {
    let mut build = Command::new(env!("CARGO"));
    build.args(["build", "--quiet", "-p", "tpu-rs", "--example", name]);
    if !cfg!(debug_assertions) {
        build.arg("--release");
    }
    let status = build.status().unwrap();
    assert!(status.success(), "building example {name}: {status}");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_tpu-rs"));
    bin.parent().unwrap().join("examples").join(name)
}

/// Runs example `name`; its output, which must hold `expected`.
fn run(name: &str, expected: &str) -> String {
    let out = Command::new(example(name)).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name}: {}\n{text}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(expected),
        "{name} printed no `{expected}`:\n{text}"
    );
    text
}

#[test]
fn the_spirals_mlp_separates_the_spirals() {
    run("spirals", "accuracy");
}

#[test]
fn the_cnn_tells_the_bars_apart_on_held_out_images() {
    let text = run("cnn", "held-out accuracy");
    assert!(
        text.contains("10 parameters"),
        "the model summary is missing:\n{text}"
    );
}

#[test]
fn training_resumed_in_a_new_process_equals_the_uninterrupted_run() {
    let text = run("resume", "bit for bit");
    // Three training processes ran: whole, first half, second half.
    assert_eq!(text.matches("trained steps").count(), 3, "{text}");
    assert!(text.contains("trained steps 50..100"), "{text}");
}
