//! What both benches share.

use std::time::Instant;

use tpu_core::Result;

/// Median seconds of `f` over `runs` runs, after one warm-up.
pub fn median(runs: usize, mut f: impl FnMut() -> Result<()>) -> Result<f64> {
    f()?;
    let mut samples = Vec::with_capacity(runs);
    for _ in 0..runs {
        let started = Instant::now();
        f()?;
        samples.push(started.elapsed().as_secs_f64());
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[runs / 2])
}
