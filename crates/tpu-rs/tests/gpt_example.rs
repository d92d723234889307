//! The main job's command line: its flags, and data-parallel training
//! across processes under `tpu-rs launch`, which must report one
//! process's losses. Builds the `gpt` example (in this test's profile) and
//! runs it next to the `tpu-rs` binary.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;

fn gpt() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let mut build = Command::new(env!("CARGO"));
            build.args(["build", "--quiet", "-p", "tpu-rs", "--example", "gpt"]);
            if !cfg!(debug_assertions) {
                build.arg("--release");
            }
            run(&mut build);
            let bin = PathBuf::from(env!("CARGO_BIN_EXE_tpu-rs"));
            bin.parent().unwrap().join("examples").join("gpt")
        })
        .clone()
}

fn run(command: &mut Command) -> Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `loss A -> B` of a run's summary line.
fn losses(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("trained in"))
        .unwrap_or_else(|| panic!("no summary in {text}"));
    line.split("loss ").nth(1).unwrap().to_string()
}

#[test]
fn two_processes_report_one_process_s_losses() {
    let steps = ["--steps", "3"];
    let alone = run(Command::new(gpt()).args(steps));
    let launched = run(Command::new(env!("CARGO_BIN_EXE_tpu-rs"))
        .args(["launch", "-n", "2", "--"])
        .arg(gpt())
        .args(steps));
    assert_eq!(losses(&launched), losses(&alone));
    let text = String::from_utf8_lossy(&launched.stdout);
    assert!(text.contains("in each of 2 processes"), "{text}");
    assert_eq!(text.matches("trained in").count(), 1, "only rank 0 reports");
}

#[test]
fn help_prints_usage_and_bad_flags_exit_2_without_training() {
    let help = Command::new(gpt()).arg("--help").output().unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("usage: gpt"));
    for bad in [
        &["--bogus"][..],
        &["--steps", "0"],
        &["--devices", "3"],
        &["--eager", "fast"],
    ] {
        let out = Command::new(gpt()).args(bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("usage: gpt"), "{bad:?}: {stderr}");
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("step"),
            "{bad:?} trained"
        );
    }
}
