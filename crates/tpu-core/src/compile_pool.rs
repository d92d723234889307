//! Compiles off the calling thread: a fixed pool of workers, so a policy
//! can queue an op whose program is still compiling and go on tracing while
//! several programs compile at once (a first step is mostly compiles).
//! `TPU_RS_COMPILE_THREADS` sets the workers (default: the machine's
//! cores); `0` or `off` compiles on the calling thread.
//!
//! A process may exit while programs it will never run still compile; the
//! exit waits (up to [`EXIT_WAIT`]) for the compiles under way, starts no
//! other, and only then lets the plugin be torn down.

use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex, Once, OnceLock};
use std::time::Duration;

use crate::error::Result;
use crate::pjrt::{CompileOptions, Executable};
use crate::runtime::Runtime;
use crate::settings::{self, Lookup};

/// A compile that may still be running.
pub struct Compiling {
    result: Mutex<Option<Result<Arc<Executable>>>>,
    finished: Condvar,
    /// Callbacks to run once it has finished.
    then: Mutex<Vec<Callback>>,
}

type Callback = Box<dyn FnOnce() + Send>;

impl Compiling {
    /// A compile that has already finished with `result`.
    pub fn finished(result: Result<Arc<Executable>>) -> Arc<Compiling> {
        let compiling = Compiling::started();
        compiling.finish(result);
        compiling
    }

    fn started() -> Arc<Compiling> {
        Arc::new(Compiling {
            result: Mutex::new(None),
            finished: Condvar::new(),
            then: Mutex::new(Vec::new()),
        })
    }

    /// The outcome, if it has finished.
    pub fn try_get(&self) -> Option<Result<Arc<Executable>>> {
        self.result
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The outcome, waiting for it.
    pub fn wait(&self) -> Result<Arc<Executable>> {
        let mut result = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = result.as_ref() {
                return r.clone();
            }
            result = self
                .finished
                .wait(result)
                .unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Runs `f` once the compile has finished: now, on this thread, if it
    /// has; else on the worker that finishes it.
    pub fn then(&self, f: impl FnOnce() + Send + 'static) {
        {
            let result = self.result.lock().unwrap_or_else(|e| e.into_inner());
            if result.is_none() {
                // Registered under the result's lock: `finish` takes the
                // callbacks only after setting the result under it.
                self.then
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Box::new(f));
                return;
            }
        }
        f()
    }

    fn finish(&self, outcome: Result<Arc<Executable>>) {
        {
            let mut result = self.result.lock().unwrap_or_else(|e| e.into_inner());
            *result = Some(outcome);
            self.finished.notify_all();
        }
        let callbacks = std::mem::take(&mut *self.then.lock().unwrap_or_else(|e| e.into_inner()));
        for f in callbacks {
            f();
        }
    }
}

struct Job {
    program: String,
    options: CompileOptions,
    compiling: Arc<Compiling>,
}

struct Pool {
    jobs: Mutex<Sender<Job>>,
}

/// A program compiled once when the pool starts (see [`compile`]).
const FIRST: &str = "func.func @main(%x: tensor<2xf32>) -> tensor<2xf32> {
  %0 = stablehlo.add %x, %x : tensor<2xf32>
  return %0 : tensor<2xf32>
}";

/// The longest a process exit waits for compiles under way.
pub const EXIT_WAIT: Duration = Duration::from_secs(120);

/// The workers' compiles under way, and whether the process is exiting.
#[derive(Default)]
struct Busy {
    state: Mutex<(usize, bool)>,
    idle: Condvar,
}

fn busy() -> &'static Busy {
    static BUSY: OnceLock<Busy> = OnceLock::new();
    BUSY.get_or_init(Busy::default)
}

impl Busy {
    /// Counts a compile as started; false once the process is exiting.
    fn start(&self) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.1 {
            return false;
        }
        state.0 += 1;
        true
    }

    fn done(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.0 -= 1;
        self.idle.notify_all();
    }

    /// Starts no more compiles, and waits for those under way.
    fn close(&self, timeout: Duration) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.1 = true;
        let _ = self
            .idle
            .wait_timeout_while(state, timeout, |(running, _)| *running > 0);
    }
}

extern "C" fn close_at_exit() {
    busy().close(EXIT_WAIT);
}

/// Registers [`close_at_exit`] to run before every exit handler registered
/// so far (the plugin's destructors among them).
fn register_exit_wait() {
    if !crate::pjrt::exit::before_plugin_teardown(close_at_exit) {
        tracing::warn!("cannot register the compile pool's exit handler");
    }
}

/// The workers `TPU_RS_COMPILE_THREADS` asks for in `get` (default: the
/// machine's cores; `0` or `off` for none).
pub fn threads_from_lookup(get: Lookup<'_>) -> Result<usize> {
    const NAME: &str = "TPU_RS_COMPILE_THREADS";
    if let Some(text) = get(NAME)?
        && matches!(text.trim().to_ascii_lowercase().as_str(), "0" | "off")
    {
        return Ok(0);
    }
    Ok(settings::count(get, NAME)?.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    }))
}

/// Whether compiles run on the pool (`TPU_RS_COMPILE_THREADS` is not 0).
pub fn enabled() -> Result<bool> {
    Ok(pool()?.is_some())
}

fn pool() -> Result<Option<&'static Pool>> {
    static POOL: OnceLock<Result<Option<Pool>>> = OnceLock::new();
    POOL.get_or_init(|| {
        let threads = threads_from_lookup(&settings::env)?;
        if threads == 0 {
            return Ok(None);
        }
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        for i in 0..threads {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name(format!("tpu-rs-compile-{i}"))
                .spawn(move || work(&queue))
                .map_err(|e| {
                    crate::Error::Signature(format!("cannot start a compile thread: {e}"))
                })?;
        }
        Ok(Some(Pool {
            jobs: Mutex::new(jobs),
        }))
    })
    .as_ref()
    .map(Option::as_ref)
    .map_err(Clone::clone)
}

fn work(queue: &Mutex<Receiver<Job>>) {
    loop {
        let job = match queue.lock().unwrap_or_else(|e| e.into_inner()).recv() {
            Ok(job) => job,
            Err(_) => return,
        };
        if !busy().start() {
            job.compiling.finish(Err(crate::Error::Signature(
                "the process is exiting".into(),
            )));
            continue;
        }
        let outcome = Runtime::global().and_then(|r| r.compile(&job.program, &job.options));
        // A compile may have set up more statics: registered again, the
        // exit wait runs before their destructors too.
        register_exit_wait();
        job.compiling.finish(outcome);
        busy().done();
    }
}

/// Starts compiling `program` (through the runtime's cache) on the pool,
/// or compiles it now when the pool is off. Options the client cannot take
/// (a device out of range) are an error now, not when the compile ends.
pub fn compile(program: String, options: CompileOptions) -> Result<Arc<Compiling>> {
    let runtime = Runtime::global()?;
    options.validate(runtime.client().device_count())?;
    let Some(pool) = pool()? else {
        return Ok(Compiling::finished(runtime.compile(&program, &options)));
    };
    static STARTED: Once = Once::new();
    STARTED.call_once(|| {
        // The first compile sets up most of the compiler's statics, whose
        // destructors the C runtime runs at exit in reverse order of
        // registration: one done here, before registering the exit wait,
        // leaves them to run after it.
        let _ = runtime.client().compile(FIRST, &CompileOptions::default());
        register_exit_wait();
    });
    let compiling = Compiling::started();
    let job = Job {
        program,
        options,
        compiling: compiling.clone(),
    };
    if let Err(returned) = pool
        .jobs
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send(job)
    {
        // No worker left to take it: compile here.
        let job = returned.0;
        job.compiling
            .finish(runtime.compile(&job.program, &job.options));
    }
    Ok(compiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn threads_default_to_the_cores_and_zero_or_off_turns_the_pool_off() {
        let one = |v: &'static str| move |_: &'static str| Ok(Some(v.to_string()));
        assert_eq!(threads_from_lookup(&one("0")).unwrap(), 0);
        assert_eq!(threads_from_lookup(&one("off")).unwrap(), 0);
        assert_eq!(threads_from_lookup(&one("3")).unwrap(), 3);
        assert!(threads_from_lookup(&|_| Ok(None)).unwrap() >= 1);
        let err = threads_from_lookup(&one("many")).unwrap_err().to_string();
        assert!(err.contains("TPU_RS_COMPILE_THREADS"), "{err}");
    }

    #[test]
    fn callbacks_run_once_the_compile_has_finished() {
        let pending = Compiling::started();
        let ran = Arc::new(Mutex::new(0));
        let counter = ran.clone();
        pending.then(move || *counter.lock().unwrap() += 1);
        assert_eq!(*ran.lock().unwrap(), 0);
        assert!(pending.try_get().is_none());
        pending.finish(Err(crate::Error::Signature("no program".into())));
        assert_eq!(*ran.lock().unwrap(), 1);
        assert!(pending.wait().is_err());
        // Registered after finishing: runs at once.
        let counter = ran.clone();
        pending.then(move || *counter.lock().unwrap() += 1);
        assert_eq!(*ran.lock().unwrap(), 2);
    }
}
