//! The `env://` contract of torchrun and `tpu-rs launch`: who this process
//! is and where the job meets.

use std::time::Duration;

use tpu_core::settings::{self, invalid};
use tpu_core::{Error, Result};

/// torch's default process-group timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// Where and as whom a process joins a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOptions {
    /// This process's rank, `0..world_size` (`RANK`).
    pub rank: usize,
    /// Number of processes (`WORLD_SIZE`).
    pub world_size: usize,
    /// Rank among the processes of this host (`LOCAL_RANK`; default `rank`).
    pub local_rank: usize,
    /// Host of rank 0's store (`MASTER_ADDR`; default `127.0.0.1`).
    pub master_addr: String,
    /// Port of rank 0's store (`MASTER_PORT`; default 29500, as torch's).
    /// Under torchrun, whose agent already serves its own store there, the
    /// next port up.
    pub master_port: u16,
    /// How long any blocking call waits (`TPU_DIST_TIMEOUT` in seconds;
    /// default 30 minutes, as torch's).
    pub timeout: Duration,
}

impl JobOptions {
    /// The options torchrun and `tpu-rs launch` set. `RANK` and
    /// `WORLD_SIZE` are required; a malformed value is an error naming
    /// its variable.
    pub fn from_env() -> Result<JobOptions> {
        let rank: usize = required("RANK")?;
        let world_size: usize = required("WORLD_SIZE")?;
        JobOptions::from_env_with(rank, world_size)
    }

    /// Whether this process was started by a launcher (`WORLD_SIZE` set).
    pub fn launched() -> bool {
        std::env::var_os("WORLD_SIZE").is_some_and(|v| !v.is_empty())
    }

    fn from_env_with(rank: usize, world_size: usize) -> Result<JobOptions> {
        if world_size == 0 {
            return Err(invalid("WORLD_SIZE", "0", "must be at least 1"));
        }
        if rank >= world_size {
            return Err(invalid(
                "RANK",
                &rank.to_string(),
                &format!("must be below WORLD_SIZE ({world_size})"),
            ));
        }
        Ok(JobOptions {
            rank,
            world_size,
            local_rank: optional("LOCAL_RANK")?.unwrap_or(rank),
            master_addr: std::env::var("MASTER_ADDR")
                .ok()
                .filter(|a| !a.is_empty())
                .unwrap_or_else(|| "127.0.0.1".into()),
            master_port: store_port()?,
            timeout: timeout_from_env()?,
        })
    }

    /// `MASTER_ADDR:MASTER_PORT`.
    pub fn store_address(&self) -> String {
        if self.master_addr.contains(':') && !self.master_addr.starts_with('[') {
            format!("[{}]:{}", self.master_addr, self.master_port)
        } else {
            format!("{}:{}", self.master_addr, self.master_port)
        }
    }
}

/// `MASTER_PORT`, or the port above it when torchrun's agent holds it.
fn store_port() -> Result<u16> {
    let port: u16 = optional("MASTER_PORT")?.unwrap_or(29500);
    let agent_store = std::env::var("TORCHELASTIC_USE_AGENT_STORE").is_ok_and(|v| v == "True");
    if !agent_store {
        return Ok(port);
    }
    port.checked_add(1).ok_or_else(|| {
        invalid(
            "MASTER_PORT",
            &port.to_string(),
            "leaves no port above it for the tpu-dist store under torchrun",
        )
    })
}

/// `TPU_DIST_TIMEOUT` (seconds, fractions allowed), or the default.
pub fn timeout_from_env() -> Result<Duration> {
    let Some(text) = settings::env("TPU_DIST_TIMEOUT")? else {
        return Ok(DEFAULT_TIMEOUT);
    };
    match text.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s.is_finite() && s < 1e9 => Ok(Duration::from_secs_f64(s)),
        _ => Err(invalid(
            "TPU_DIST_TIMEOUT",
            &text,
            "must be a positive number of seconds",
        )),
    }
}

fn optional<T: std::str::FromStr>(variable: &'static str) -> Result<Option<T>> {
    settings::env(variable)?
        .map(|text| {
            text.trim()
                .parse()
                .map_err(|_| invalid(variable, &text, "is not a valid number"))
        })
        .transpose()
}

fn required<T: std::str::FromStr>(variable: &'static str) -> Result<T> {
    optional(variable)?.ok_or_else(|| Error::InvalidOption {
        option: variable,
        reason: "is not set; launch with torchrun or `tpu-rs launch`".into(),
    })
}
