//! A trace read back as a table: top ops by time, compiles, launches,
//! graph cuts and recompiles by reason, transfers, and device memory over
//! time (as an SVG plot).

use std::collections::BTreeMap;
use std::fmt;

use super::trace::{Detail, Event, Phase};

/// Calls and time of one kind of span.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Stat {
    /// How many.
    pub count: u64,
    /// Their total time, in microseconds.
    pub micros: f64,
}

impl Stat {
    fn add(&mut self, micros: f64) {
        self.count += 1;
        self.micros += micros;
    }
}

/// Transfers in one direction.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Transfers {
    /// Calls and time.
    pub stat: Stat,
    /// Bytes moved.
    pub bytes: u64,
}

/// Most points kept for the memory plot; beyond it every other is dropped.
const MAX_MEMORY_POINTS: usize = 100_000;

/// What a trace holds, summed up.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    /// Op dispatch by op name (recording, under DeferAndFuse; compiling
    /// and launching too, under Strict).
    pub ops: BTreeMap<String, Stat>,
    /// Programs compiled.
    pub compiles: Stat,
    /// Compiles served by the in-memory cache.
    pub memory_hits: u64,
    /// Compiles served by loading from the disk cache.
    pub disk_hits: u64,
    /// Program launches.
    pub launches: Stat,
    /// Graph cuts by reason.
    pub cuts: BTreeMap<String, u64>,
    /// Recompiles by reason.
    pub recompiles: BTreeMap<String, u64>,
    /// Transfers by direction (`host_to_device`, `device_to_host`, ...).
    pub transfers: BTreeMap<String, Transfers>,
    /// Live device bytes over time: (microseconds, bytes).
    pub memory: Vec<(f64, u64)>,
}

impl Summary {
    /// Counts `event` in.
    pub fn add(&mut self, event: &Event) {
        match (event.phase, event.cat.as_str()) {
            (Phase::Complete, "op") => self
                .ops
                .entry(event.name.clone())
                .or_default()
                .add(event.dur),
            (Phase::Complete, "compile") => match event.arg("cache").and_then(Detail::as_str) {
                Some("memory") => self.memory_hits += 1,
                Some("disk") => self.disk_hits += 1,
                _ => self.compiles.add(event.dur),
            },
            (Phase::Complete, "execute") => self.launches.add(event.dur),
            (Phase::Complete, "transfer") => {
                let t = self.transfers.entry(event.name.clone()).or_default();
                t.stat.add(event.dur);
                t.bytes += event.arg("bytes").and_then(Detail::as_num).unwrap_or(0.0) as u64;
            }
            (Phase::Instant, "cut") => *self.cuts.entry(event.name.clone()).or_default() += 1,
            (Phase::Instant, "recompile") => {
                let reason = event
                    .arg("reason")
                    .and_then(Detail::as_str)
                    .unwrap_or("unknown");
                *self.recompiles.entry(reason.to_owned()).or_default() += 1;
            }
            (Phase::Counter, _) => {
                let bytes = event.arg("bytes").and_then(Detail::as_num).unwrap_or(0.0) as u64;
                if self.memory.len() >= MAX_MEMORY_POINTS {
                    let mut i = 0;
                    self.memory.retain(|_| {
                        i += 1;
                        i % 2 == 0
                    });
                }
                self.memory.push((event.ts, bytes));
            }
            _ => {}
        }
    }

    /// The summary of a trace file's text.
    pub fn from_json(text: &str) -> Result<Summary, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let events = match &value {
            serde_json::Value::Array(events) => events,
            serde_json::Value::Object(o) => o
                .get("traceEvents")
                .and_then(serde_json::Value::as_array)
                .ok_or("no `traceEvents` list")?,
            _ => return Err("not a trace: neither a list nor an object".into()),
        };
        let mut summary = Summary::default();
        for event in events.iter().filter_map(parse_event) {
            summary.add(&event);
        }
        Ok(summary)
    }

    /// The most live device bytes seen.
    pub fn peak_bytes(&self) -> u64 {
        self.memory.iter().map(|&(_, b)| b).max().unwrap_or(0)
    }

    /// Device memory over time as an SVG line plot; `None` without samples.
    pub fn memory_svg(&self) -> Option<String> {
        let (first, last) = (self.memory.first()?.0, self.memory.last()?.0);
        let (w, h, margin) = (800.0, 300.0, 60.0);
        let span = (last - first).max(1.0);
        let peak = self.peak_bytes().max(1) as f64;
        let x = |t: f64| margin + (t - first) / span * (w - 2.0 * margin);
        let y = |b: u64| h - margin + (b as f64 / peak) * (2.0 * margin - h);
        let mut points = String::new();
        let mut previous = None;
        for &(t, b) in &self.memory {
            // A step plot: the value holds until the next sample.
            if let Some(p) = previous {
                points.push_str(&format!("{:.1},{:.1} ", x(t), y(p)));
            }
            points.push_str(&format!("{:.1},{:.1} ", x(t), y(b)));
            previous = Some(b);
        }
        Some(format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n\
             <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
             <text x=\"{margin}\" y=\"20\" font-size=\"14\">live device memory (peak {})</text>\n\
             <line x1=\"{margin}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <line x1=\"{margin}\" y1=\"{margin}\" x2=\"{margin}\" y2=\"{b}\" stroke=\"black\"/>\n\
             <text x=\"{margin}\" y=\"{lb}\">0 s</text>\n\
             <text x=\"{r}\" y=\"{lb}\" text-anchor=\"end\">{:.3} s</text>\n\
             <text x=\"{lx}\" y=\"{margin}\" text-anchor=\"end\">{}</text>\n\
             <text x=\"{lx}\" y=\"{b}\" text-anchor=\"end\">0</text>\n\
             <polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{points}\"/>\n</svg>\n",
            bytes(self.peak_bytes()),
            span / 1e6,
            bytes(self.peak_bytes()),
            b = h - margin,
            r = w - margin,
            lb = h - margin + 16.0,
            lx = margin - 4.0,
        ))
    }
}

fn parse_event(value: &serde_json::Value) -> Option<Event> {
    let phase = Phase::from_code(value.get("ph")?.as_str()?)?;
    let text = |key: &str| {
        value
            .get(key)
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .to_owned()
    };
    let number = |key: &str| {
        value
            .get(key)
            .and_then(serde_json::Value::as_f64)
            .unwrap_or(0.0)
    };
    let args = value
        .get("args")
        .and_then(serde_json::Value::as_object)
        .map(|args| {
            args.iter()
                .filter_map(|(k, v)| {
                    let arg = match v {
                        serde_json::Value::String(s) => Detail::Str(s.clone()),
                        v => Detail::Num(v.as_f64()?),
                    };
                    Some((k.clone(), arg))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(Event {
        phase,
        cat: text("cat"),
        name: text("name"),
        ts: number("ts"),
        dur: number("dur"),
        tid: value
            .get("tid")
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0),
        args,
    })
}

/// `bytes` in KiB, MiB or GiB.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `name n, ...` for the nonzero counts, most first; `none` without any.
pub(crate) fn by_count<'a>(counts: impl IntoIterator<Item = (&'a str, u64)>) -> String {
    let mut sorted: Vec<(&str, u64)> = counts.into_iter().filter(|(_, n)| *n > 0).collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    if sorted.is_empty() {
        return "none".into();
    }
    sorted
        .iter()
        .map(|(k, n)| format!("{k} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Rows in the op table.
const TOP_OPS: usize = 15;

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ops: Vec<_> = self.ops.iter().collect();
        ops.sort_by(|a, b| b.1.micros.total_cmp(&a.1.micros).then(a.0.cmp(b.0)));
        let total = ops.iter().fold(0.0, |sum, (_, s)| sum + s.micros);
        writeln!(
            f,
            "top ops by dispatch time ({} ops, {:.1} ms in all)",
            ops.len(),
            total / 1e3
        )?;
        writeln!(
            f,
            "  {:<28} {:>8} {:>11} {:>10} {:>7}",
            "op", "calls", "total ms", "mean µs", "share"
        )?;
        for (name, stat) in ops.iter().take(TOP_OPS) {
            writeln!(
                f,
                "  {:<28} {:>8} {:>11.2} {:>10.1} {:>6.1}%",
                name,
                stat.count,
                stat.micros / 1e3,
                stat.micros / stat.count.max(1) as f64,
                100.0 * stat.micros / total.max(f64::MIN_POSITIVE)
            )?;
        }
        if ops.len() > TOP_OPS {
            writeln!(f, "  ... {} more", ops.len() - TOP_OPS)?;
        }
        writeln!(
            f,
            "compiles: {} ({:.2} s); served from memory {}, from disk {}",
            self.compiles.count,
            self.compiles.micros / 1e6,
            self.memory_hits,
            self.disk_hits
        )?;
        writeln!(
            f,
            "program launches: {} ({:.1} ms)",
            self.launches.count,
            self.launches.micros / 1e3
        )?;
        writeln!(
            f,
            "graph cuts: {}",
            by_count(self.cuts.iter().map(|(k, n)| (k.as_str(), *n)))
        )?;
        writeln!(
            f,
            "recompiles: {}",
            by_count(self.recompiles.iter().map(|(k, n)| (k.as_str(), *n)))
        )?;
        let transfers: Vec<String> = self
            .transfers
            .iter()
            .map(|(dir, t)| {
                format!(
                    "{dir} {} ({}, {:.1} ms)",
                    t.stat.count,
                    bytes(t.bytes),
                    t.stat.micros / 1e3
                )
            })
            .collect();
        writeln!(
            f,
            "transfers: {}",
            if transfers.is_empty() {
                "none".into()
            } else {
                transfers.join(", ")
            }
        )?;
        write!(f, "device memory: peak {}", bytes(self.peak_bytes()))
    }
}
