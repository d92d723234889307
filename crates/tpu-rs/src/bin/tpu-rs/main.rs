//! The `tpu-rs` command: install PJRT plugins, inspect devices, warm the
//! compile cache, launch distributed jobs.

mod install;
mod launch;

use std::process::ExitCode;

use tpu_rs::discovery::{self, KNOWN_PLUGINS};
use tpu_rs::{Plugin, Runtime, program_record};

const USAGE: &str = "usage:
  tpu-rs plugin install NAME... [--force]   fetch pinned plugins (cpu = jax-cpu, xla-cpu, tpu)
  tpu-rs plugin list                        known plugins and where they are installed
  tpu-rs devices                            the devices of the plugin TPU_RS_PLUGIN selects
  tpu-rs trace summary TRACE [--memory SVG] a trace's top ops, compiles, cuts, recompiles and
                                            transfers; device memory over time into SVG
                                            (default: TRACE with .memory.svg)
  tpu-rs cache warm RECORD [--threads N]   compile the programs a run recorded (TPU_RS_RECORD_PROGRAMS=
                                            RECORD) into the compile cache, N at a time (default: cores)
  tpu-rs launch -n N [--master-addr A] [--master-port P] -- PROGRAM ARGS...
                                            run N ranks of PROGRAM with torchrun's env:// variables";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let words: Vec<&str> = args.iter().map(String::as_str).collect();
    let result = match words.as_slice() {
        ["plugin", "install", rest @ ..] if !rest.is_empty() => install_plugins(rest),
        ["plugin", "list"] => {
            list_plugins();
            Ok(())
        }
        ["devices"] => show_devices(),
        ["cache", "warm", record] => warm(record, "0"),
        ["cache", "warm", record, "--threads", n] => warm(record, n),
        ["trace", "summary", trace] => summarize(trace, None),
        ["trace", "summary", trace, "--memory", svg] => summarize(trace, Some(svg)),
        ["launch", rest @ ..] => {
            return match launch::Launch::parse(rest).and_then(|l| l.run()) {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("tpu-rs launch: {e}\n{USAGE}");
                    ExitCode::from(2)
                }
            };
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tpu-rs: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Prints the summary of trace file `trace` and writes its memory plot.
fn summarize(trace: &str, svg: Option<&str>) -> Result<(), String> {
    let text = std::fs::read_to_string(trace).map_err(|e| format!("cannot read {trace}: {e}"))?;
    let summary =
        tpu_rs::profile::Summary::from_json(&text).map_err(|e| format!("{trace}: {e}"))?;
    println!("{summary}");
    let svg_path = match svg {
        Some(path) => std::path::PathBuf::from(path),
        None => std::path::Path::new(trace).with_extension("memory.svg"),
    };
    match summary.memory_svg() {
        Some(plot) => {
            std::fs::write(&svg_path, plot)
                .map_err(|e| format!("cannot write {}: {e}", svg_path.display()))?;
            println!("device memory over time: {}", svg_path.display());
        }
        None => println!("device memory over time: no samples in the trace"),
    }
    Ok(())
}

fn warm(record: &str, threads: &str) -> Result<(), String> {
    let threads = threads
        .parse()
        .map_err(|_| format!("--threads {threads}: not a number"))?;
    let report =
        program_record::warm(std::path::Path::new(record), threads).map_err(|e| e.to_string())?;
    let cache = Runtime::global()
        .ok()
        .and_then(|r| r.cache().disk_dir().map(|d| d.display().to_string()))
        .unwrap_or_else(|| "memory only: the disk tier is off for this plugin".into());
    println!(
        "{} programs: {} compiled, {} already cached, {} failed in {:.2} s ({cache})",
        report.programs,
        report.compiled,
        report.cached,
        report.failed.len(),
        report.seconds
    );
    for error in &report.failed {
        println!("  failed: {error}");
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} programs failed to compile",
            report.failed.len()
        ))
    }
}

fn install_plugins(words: &[&str]) -> Result<(), String> {
    let force = words.contains(&"--force");
    for name in words.iter().filter(|w| !w.starts_with("--")) {
        // A platform (`cpu`) names its first plugin in discovery order.
        let by_platform = || KNOWN_PLUGINS.iter().find(|p| p.platform == *name);
        let plugin = discovery::known_plugin(name)
            .or_else(by_platform)
            .ok_or_else(|| {
                let names: Vec<&str> = KNOWN_PLUGINS.iter().map(|p| p.name).collect();
                format!("unknown plugin `{name}`; known: {}", names.join(", "))
            })?;
        let path = install::install(plugin, force)?;
        println!(
            "{} {} -> {}",
            plugin.package,
            plugin.version,
            path.display()
        );
    }
    Ok(())
}

fn list_plugins() {
    let installed = discovery::installed_plugins();
    for plugin in KNOWN_PLUGINS {
        let location = installed
            .iter()
            .find(|(p, _)| p.name == plugin.name)
            .map(|(_, path)| path.display().to_string())
            .unwrap_or_else(|| "not installed".to_string());
        println!(
            "{:<8} {:<4} {:<20} {:<7} {location}",
            plugin.name, plugin.platform, plugin.package, plugin.version
        );
    }
}

fn show_devices() -> Result<(), String> {
    let plugin = Plugin::from_env().map_err(|e| e.to_string())?;
    let (major, minor) = plugin.api_version();
    println!("plugin   {}", plugin.path().display());
    println!("PJRT API {major}.{minor}");
    for (name, value) in plugin.attributes() {
        println!("  {name} = {value:?}");
    }
    let runtime = Runtime::global().map_err(|e| e.to_string())?;
    let client = runtime.client();
    println!(
        "platform {} {}",
        client.platform_name(),
        client.platform_version()
    );
    for device in client.devices() {
        println!(
            "{}",
            runtime.describe(device.index).map_err(|e| e.to_string())?
        );
        if let Ok(Some(stats)) = client.memory_stats(device.index) {
            println!("  memory: {stats:?}");
        }
    }
    Ok(())
}
