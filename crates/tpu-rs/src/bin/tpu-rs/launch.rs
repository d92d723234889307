//! `tpu-rs launch`: start N copies of a program as the ranks of one job,
//! with the `env://` variables torchrun sets, and supervise them.

use std::net::TcpListener;
use std::process::{Child, Command, ExitCode};
use std::time::Duration;

/// What `launch` was asked to run.
#[derive(Debug, PartialEq)]
pub struct Launch {
    processes: usize,
    master_addr: String,
    master_port: Option<u16>,
    program: Vec<String>,
}

impl Launch {
    /// Parses `-n N [--master-addr A] [--master-port P] -- PROGRAM ARGS...`.
    pub fn parse(words: &[&str]) -> Result<Launch, String> {
        let split = words
            .iter()
            .position(|w| *w == "--")
            .ok_or("expected `--` before the program")?;
        let (options, program) = (&words[..split], &words[split + 1..]);
        if program.is_empty() {
            return Err("no program after `--`".into());
        }
        let mut launch = Launch {
            processes: 0,
            master_addr: "127.0.0.1".into(),
            master_port: None,
            program: program.iter().map(ToString::to_string).collect(),
        };
        let mut it = options.iter();
        while let Some(&flag) = it.next() {
            let mut value = || it.next().copied().ok_or(format!("`{flag}` needs a value"));
            match flag {
                "-n" | "--nproc" => {
                    launch.processes = value()?
                        .parse()
                        .ok()
                        .filter(|&n| n > 0)
                        .ok_or("-n takes a positive number of processes")?;
                }
                "--master-addr" => launch.master_addr = value()?.to_string(),
                "--master-port" => {
                    launch.master_port = Some(
                        value()?
                            .parse()
                            .map_err(|_| "--master-port takes a port number")?,
                    );
                }
                other => return Err(format!("unknown option `{other}`")),
            }
        }
        if launch.processes == 0 {
            return Err("-n N is required".into());
        }
        Ok(launch)
    }

    /// Starts every rank and waits: the first rank to fail stops the
    /// others, and its exit code is the job's.
    pub fn run(&self) -> Result<ExitCode, String> {
        let port = match self.master_port {
            Some(port) => port,
            None => free_port()?,
        };
        let mut children: Vec<Child> = Vec::new();
        for rank in 0..self.processes {
            let spawned = Command::new(&self.program[0])
                .args(&self.program[1..])
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", self.processes.to_string())
                .env("LOCAL_WORLD_SIZE", self.processes.to_string())
                .env("MASTER_ADDR", &self.master_addr)
                .env("MASTER_PORT", port.to_string())
                .spawn();
            match spawned {
                Ok(child) => children.push(child),
                Err(e) => {
                    stop(&mut children);
                    return Err(format!("cannot start `{}`: {e}", self.program[0]));
                }
            }
        }
        supervise(children)
    }
}

/// A port nobody listens on now.
fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("cannot pick a free port: {e}"))
}

fn stop(children: &mut [Child]) {
    for child in children.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn supervise(mut children: Vec<Child>) -> Result<ExitCode, String> {
    let mut running: Vec<usize> = (0..children.len()).collect();
    while !running.is_empty() {
        let mut still = Vec::new();
        for rank in running {
            match children[rank].try_wait() {
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => {
                    eprintln!(
                        "tpu-rs launch: rank {rank} exited with {status}; stopping the others"
                    );
                    stop(&mut children);
                    let code = status
                        .code()
                        .and_then(|c| u8::try_from(c).ok())
                        .unwrap_or(1);
                    return Ok(ExitCode::from(code.max(1)));
                }
                Ok(None) => still.push(rank),
                Err(e) => {
                    stop(&mut children);
                    return Err(format!("cannot wait for rank {rank}: {e}"));
                }
            }
        }
        running = still;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_process_count_and_the_program() {
        let launch = Launch::parse(&["-n", "2", "--", "prog", "--devices", "1"]).unwrap();
        assert_eq!(launch.processes, 2);
        assert_eq!(launch.program, ["prog", "--devices", "1"]);
        assert_eq!(launch.master_port, None);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        for words in [
            &["-n", "2"][..],
            &["-n", "0", "--", "prog"],
            &["-n", "x", "--", "prog"],
            &["--", "prog"],
            &["-n", "2", "--"],
            &["-n", "2", "--bogus", "--", "prog"],
        ] {
            assert!(Launch::parse(words).is_err(), "{words:?}");
        }
    }

    #[test]
    fn every_rank_sees_its_variables_and_a_failure_is_the_job_s() {
        let script = "test \"$WORLD_SIZE\" = 3 && test \"$RANK\" -lt 3 && test -n \"$MASTER_PORT\"";
        let ok = Launch::parse(&["-n", "3", "--", "sh", "-c", script]).unwrap();
        assert_eq!(ok.run().unwrap(), ExitCode::SUCCESS);
        // Rank 1 fails at once; rank 0 would sleep for a minute.
        let failing = "if [ \"$RANK\" = 1 ]; then exit 7; else sleep 60; fi";
        let start = std::time::Instant::now();
        let job = Launch::parse(&["-n", "2", "--", "sh", "-c", failing]).unwrap();
        assert_eq!(job.run().unwrap(), ExitCode::from(7));
        assert!(start.elapsed() < Duration::from_secs(30));
    }
}
