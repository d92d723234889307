//! PyTorch as the tests' oracle: a Python that imports what a test needs,
//! and scripts whose last line of output is JSON.

/// A Python that imports `modules` (`TPU_RS_TORCH_PYTHON`, else the
/// repository's `.venv`), or `None`; with `TPU_RS_REQUIRE_TORCH` set, no
/// such Python fails the test instead of skipping it.
pub fn python(modules: &str) -> Option<String> {
    let candidates = [
        std::env::var("TPU_RS_TORCH_PYTHON").ok(),
        Some(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.venv/bin/python").to_string()),
    ];
    let found = candidates.into_iter().flatten().find(|p| {
        std::process::Command::new(p)
            .args(["-c", &format!("import {modules}")])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if found.is_none() {
        assert!(
            std::env::var_os("TPU_RS_REQUIRE_TORCH").is_none(),
            "TPU_RS_REQUIRE_TORCH is set but no Python imports {modules}"
        );
        eprintln!("skipped: no Python imports {modules} (set TPU_RS_TORCH_PYTHON)");
    }
    found
}

/// Runs `script` and parses its output as JSON.
#[allow(dead_code)] // not every test binary runs scripts
pub fn run_json(python: &str, script: &str) -> serde_json::Value {
    let out = std::process::Command::new(python)
        .args(["-c", script])
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}
