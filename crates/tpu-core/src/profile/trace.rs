//! Trace events and the file they go to: Chrome's trace-event JSON
//! (`{"traceEvents": [...]}`), which Perfetto and `chrome://tracing` open.
//! Events are appended in batches and the file is complete JSON after each
//! batch, so a process that ends without stopping still leaves a readable
//! trace of everything up to its last batch.

use std::fmt::Write as _;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// A value attached to an event (Chrome calls them `args`).
#[derive(Clone, Debug, PartialEq)]
pub enum Detail {
    /// Text.
    Str(String),
    /// A number.
    Num(f64),
}

impl From<&str> for Detail {
    fn from(s: &str) -> Detail {
        Detail::Str(s.to_owned())
    }
}

impl From<String> for Detail {
    fn from(s: String) -> Detail {
        Detail::Str(s)
    }
}

impl From<f64> for Detail {
    fn from(x: f64) -> Detail {
        Detail::Num(x)
    }
}

impl From<u64> for Detail {
    fn from(x: u64) -> Detail {
        Detail::Num(x as f64)
    }
}

impl From<usize> for Detail {
    fn from(x: usize) -> Detail {
        Detail::Num(x as f64)
    }
}

impl Detail {
    /// The text, if this is text.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Detail::Str(s) => Some(s),
            Detail::Num(_) => None,
        }
    }

    /// The number, if this is a number.
    pub fn as_num(&self) -> Option<f64> {
        match self {
            Detail::Num(x) => Some(*x),
            Detail::Str(_) => None,
        }
    }
}

/// The kind of an event (Chrome's `ph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// A span with a duration (`X`).
    Complete,
    /// A moment (`i`).
    Instant,
    /// A counter's new value (`C`).
    Counter,
    /// A thread's name (`M`).
    ThreadName,
}

impl Phase {
    fn code(self) -> &'static str {
        match self {
            Phase::Complete => "X",
            Phase::Instant => "i",
            Phase::Counter => "C",
            Phase::ThreadName => "M",
        }
    }

    /// The phase of a `ph` code.
    pub fn from_code(code: &str) -> Option<Phase> {
        match code {
            "X" => Some(Phase::Complete),
            "i" | "I" => Some(Phase::Instant),
            "C" => Some(Phase::Counter),
            "M" => Some(Phase::ThreadName),
            _ => None,
        }
    }
}

/// One trace event; times in microseconds since the process's first probe.
#[derive(Clone, Debug, PartialEq)]
pub struct Event {
    /// Its kind.
    pub phase: Phase,
    /// Category: `op`, `compile`, `execute`, `transfer`, `cut`, `recompile`, `memory`.
    pub cat: String,
    /// Name: the op, the transfer's direction, the cut's reason...
    pub name: String,
    /// Start.
    pub ts: f64,
    /// Duration (spans only).
    pub dur: f64,
    /// The recording thread.
    pub tid: u64,
    /// Details.
    pub args: Vec<(String, Detail)>,
}

impl Event {
    /// Argument `key`, if present.
    pub fn arg(&self, key: &str) -> Option<&Detail> {
        self.args.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    fn write_json(&self, out: &mut String) {
        out.push_str("{\"ph\":\"");
        out.push_str(self.phase.code());
        out.push_str("\",\"cat\":");
        json_string(&self.cat, out);
        out.push_str(",\"name\":");
        json_string(&self.name, out);
        let _ = write!(out, ",\"pid\":1,\"tid\":{},\"ts\":{:.3}", self.tid, self.ts);
        match self.phase {
            Phase::Complete => {
                let _ = write!(out, ",\"dur\":{:.3}", self.dur);
            }
            Phase::Instant => out.push_str(",\"s\":\"t\""),
            Phase::Counter | Phase::ThreadName => {}
        }
        out.push_str(",\"args\":{");
        for (i, (key, value)) in self.args.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            json_string(key, out);
            out.push(':');
            match value {
                Detail::Str(s) => json_string(s, out),
                Detail::Num(x) if x.is_finite() => {
                    let _ = write!(out, "{x}");
                }
                Detail::Num(_) => out.push_str("null"),
            }
        }
        out.push_str("}}");
    }
}

fn json_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

const HEAD: &str = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
const TAIL: &str = "\n]}\n";

/// A trace file being written.
pub(crate) struct TraceFile {
    path: PathBuf,
    file: File,
    written: usize,
}

impl TraceFile {
    /// Creates (or truncates) `path` holding an empty trace.
    pub fn create(path: &Path) -> std::io::Result<TraceFile> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = File::create(path)?;
        file.write_all(HEAD.as_bytes())?;
        file.write_all(TAIL.as_bytes())?;
        Ok(TraceFile {
            path: path.to_owned(),
            file,
            written: 0,
        })
    }

    /// Where it is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `events`, leaving complete JSON behind.
    pub fn append(&mut self, events: &[Event]) -> std::io::Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let mut text = String::with_capacity(events.len() * 160);
        for event in events {
            text.push_str(if self.written == 0 { "\n" } else { ",\n" });
            event.write_json(&mut text);
            self.written += 1;
        }
        text.push_str(TAIL);
        self.file.seek(SeekFrom::End(-(TAIL.len() as i64)))?;
        self.file.write_all(text.as_bytes())?;
        self.file.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(name: &str) -> Event {
        Event {
            phase: Phase::Instant,
            cat: "cut".into(),
            name: name.into(),
            ts: 1.5,
            dur: 0.0,
            tid: 3,
            args: vec![
                ("at".into(), Detail::from("C:\\src\\\"odd\"\nfile.py:3")),
                ("ops".into(), Detail::from(7usize)),
                ("nan".into(), Detail::Num(f64::NAN)),
            ],
        }
    }

    #[test]
    fn the_file_is_complete_json_after_every_batch() {
        let path = std::env::temp_dir().join(format!("tpu-rs-trace-{}.json", std::process::id()));
        let mut file = TraceFile::create(&path).unwrap();
        let parse = || -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
        };
        assert_eq!(parse()["traceEvents"].as_array().unwrap().len(), 0);
        file.append(&[event("a"), event("b")]).unwrap();
        file.append(&[event("c")]).unwrap();
        let trace = parse();
        let events = trace["traceEvents"].as_array().unwrap();
        let names: Vec<&str> = events.iter().map(|e| e["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert_eq!(events[0]["args"]["at"], "C:\\src\\\"odd\"\nfile.py:3");
        assert_eq!(events[0]["args"]["ops"], 7.0);
        assert!(events[0]["args"]["nan"].is_null());
        assert_eq!(events[0]["ph"], "i");
        let _ = std::fs::remove_file(&path);
    }
}
