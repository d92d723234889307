//! `TPU_RS_DUMP_GRAPHS=DIR`: each fused graph DeferAndFuse compiles is
//! written to `DIR` as its StableHLO text (`NNNN.mlir`) and as a Graphviz
//! picture (`NNNN.dot`): ops with their output types and the source line
//! that recorded them, parameters (donated ones marked), results, and why
//! the graph was cut; and an SVG of the picture (`NNNN.svg`) where
//! Graphviz's `dot` is installed. Only graphs that compile are written, so
//! a training loop writes each distinct step once.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tpu_core::metrics::CutReason;

use super::graph::{Graph, Plan, Src};

/// Files written so far in this process, to number them.
static WRITTEN: AtomicUsize = AtomicUsize::new(0);

/// Writes `program` and the picture of `graph` into `dir`; returns the
/// two paths. A write that fails is reported and the compile goes on.
pub(crate) fn write(
    dir: &Path,
    graph: &Graph,
    plan: &Plan,
    needed: &[bool],
    reason: CutReason,
    program: &str,
) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir)?;
    let n = WRITTEN.fetch_add(1, Ordering::Relaxed);
    let mlir = dir.join(format!("{n:04}.mlir"));
    let dot = dir.join(format!("{n:04}.dot"));
    std::fs::write(&mlir, program)?;
    std::fs::write(&dot, picture(graph, plan, needed, reason))?;
    render_svg(&dot);
    Ok((mlir, dot))
}

/// Longest `dot` may take on one picture before it is stopped.
const DOT_TIMEOUT: Duration = Duration::from_secs(20);

/// Renders `dot` to an SVG beside it with Graphviz, where installed; a
/// failure is reported and the dump goes on without the SVG.
fn render_svg(dot: &Path) {
    let svg = dot.with_extension("svg");
    let child = Command::new("dot")
        .arg("-Tsvg")
        .arg("-o")
        .arg(&svg)
        .arg(dot)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(mut child) = child else {
        return; // Graphviz is not installed.
    };
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return,
            Ok(Some(status)) => {
                tracing::warn!(dot = %dot.display(), %status, "TPU_RS_DUMP_GRAPHS: dot failed");
                return;
            }
            Ok(None) if started.elapsed() < DOT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(5));
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                tracing::warn!(dot = %dot.display(), "TPU_RS_DUMP_GRAPHS: dot took too long; no SVG");
                return;
            }
        }
    }
}

/// The Graphviz text of the live part of `graph`.
pub(crate) fn picture(graph: &Graph, plan: &Plan, needed: &[bool], reason: CutReason) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph fused {{");
    let _ = writeln!(
        out,
        "  label=\"fused graph: {} ops, cut by {}\"; labelloc=t; node [fontname=monospace];",
        needed.iter().filter(|&&x| x).count(),
        reason.name()
    );
    for (p, &i) in plan.params.iter().enumerate() {
        let donated =
            plan.donations[p].map_or(String::new(), |r| format!("\\ndonated to result {r}"));
        let _ = writeln!(
            out,
            "  p{i} [shape=box, style=rounded, label=\"parameter {p}\\n{}{donated}\"];",
            graph.src_type(Src::External(i))
        );
    }
    for (n, node) in graph.nodes.iter().enumerate() {
        if !needed[n] {
            continue;
        }
        let types: Vec<String> = node.outputs.iter().map(|o| o.ty.to_string()).collect();
        let _ = writeln!(
            out,
            "  n{n} [shape=box, label=\"{}\\n{}\\n{}:{}\"];",
            node.op.name,
            types.join(", "),
            node.location.file().replace('\\', "/"),
            node.location.line()
        );
        for (k, src) in node.inputs.iter().enumerate() {
            let from = match *src {
                Src::External(i) => format!("p{i}"),
                Src::Node(m, _) => format!("n{m}"),
            };
            let _ = writeln!(out, "  {from} -> n{n} [label=\"{k}\"];");
        }
    }
    for (r, &(n, o)) in plan.results.iter().enumerate() {
        let _ = writeln!(
            out,
            "  r{r} [shape=box, style=bold, label=\"result {r}\\n{}\"];\n  n{n} -> r{r} [label=\"{o}\"];",
            graph.src_type(Src::Node(n, o))
        );
    }
    out.push_str("}\n");
    out
}
