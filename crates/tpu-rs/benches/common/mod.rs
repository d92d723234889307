//! What the benches share: PyTorch's figure for the same work, from a
//! script run by the workspace's Python.

use std::path::Path;
use std::process::Command;

use tpu_rs::models::GptConfig;

/// A model's dimensions as the PyTorch scripts take them: vocabulary,
/// block size, layers, heads, channels.
pub fn model_args(c: GptConfig) -> [usize; 5] {
    [c.vocab_size, c.block_size, c.n_layer, c.n_head, c.n_embd]
}

/// Runs `benches/<script>` with `args` under `TPU_RS_TORCH_PYTHON` (else the
/// workspace's `.venv`) and reads the number on its line starting with
/// `prefix`, or says why there is none.
pub fn torch_figure(script: &str, args: &[usize], prefix: &str) -> Result<f64, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = std::env::var("TPU_RS_TORCH_PYTHON")
        .unwrap_or_else(|_| root.join("../../.venv/bin/python").display().to_string());
    let out = Command::new(&python)
        .arg(root.join("benches").join(script))
        .args(args.iter().map(|v| v.to_string()))
        .output()
        .map_err(|e| format!("cannot run {python}: {e}"))?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| {
            format!(
                "{python} gave no figure: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}
