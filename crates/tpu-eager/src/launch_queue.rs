//! Launches waiting for their programs to compile. A policy queues a call
//! whose program is still compiling (or whose inputs wait in the queue),
//! hands out pending outputs and goes on; queued launches run in the order
//! they were queued as soon as each program is ready — from the compile
//! worker that finished it, from the next call, or from a read of a value
//! that waits for it. Values are immutable, so a ready call that skips the
//! queue cannot see a stale input.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock};

use tpu_core::compile_pool::Compiling;
use tpu_core::profile::CallSite;

use crate::op_failed;
use tpu_core::{Buffer, Error, Executable, Result, Shape, Tensor, TensorValue, WeakTensor};

/// What a queued launch does once it is first in line.
pub(crate) enum Work {
    /// Runs the program.
    Program(Arc<Compiling>),
    /// Gives its one input's elements its output's shape, running nothing.
    Reshape,
    /// Runs a fused graph: `launch` gets the compile's outcome and the
    /// buffers of the launch's inputs, and returns the outputs' buffers
    /// (or the error, blamed on one of its ops). It holds one reference to
    /// each buffer in `holds` until it runs.
    Graph {
        program: Arc<Compiling>,
        launch: GraphLaunch,
        holds: Vec<BufferKey>,
    },
}

/// Identifies a buffer while a reference to it is held.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct BufferKey(usize);

impl BufferKey {
    pub fn of(buffer: &Arc<Buffer>) -> BufferKey {
        BufferKey(Arc::as_ptr(buffer) as usize)
    }
}

/// See [`Work::Graph`].
pub(crate) type GraphLaunch =
    Box<dyn FnOnce(Result<Arc<Executable>>, Vec<Arc<Buffer>>) -> Result<Vec<Buffer>> + Send>;

impl Work {
    fn holds(&self) -> &[BufferKey] {
        match self {
            Work::Graph { holds, .. } => holds,
            Work::Program(_) | Work::Reshape => &[],
        }
    }

    fn program(&self) -> Option<&Arc<Compiling>> {
        match self {
            Work::Program(program) | Work::Graph { program, .. } => Some(program),
            Work::Reshape => None,
        }
    }
}

/// One queued call: its op and call site (which a failure names), work,
/// inputs and outputs.
pub(crate) struct Launch {
    pub op: &'static str,
    pub location: CallSite,
    pub work: Work,
    pub inputs: Vec<Tensor>,
    pub outputs: Vec<Output>,
}

/// A queued call's output.
pub(crate) struct Output {
    /// Its pending value's token.
    pub token: u64,
    /// Held weakly: an output nobody holds needs no value.
    pub tensor: WeakTensor,
    /// The shape of the buffer that will hold its elements.
    pub stored: Shape,
}

/// How long [`LaunchQueue::pump`] waits for compiles.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Until {
    /// Launches what is ready, waiting for nothing.
    Ready,
    /// Until the launch computing the value with this token has run.
    Token(u64),
    /// Until the queue is empty.
    Empty,
}

#[derive(Default)]
struct State {
    waiting: VecDeque<Launch>,
    /// Outputs of launches that failed, with the error a read of them
    /// raises.
    failed: Vec<(u64, WeakTensor, Error)>,
    /// How many waiting launches hold a reference to each buffer.
    held: HashMap<BufferKey, usize>,
}

/// The queue: one per process, so a value queued by one policy can be
/// read by another without waiting.
#[derive(Default)]
pub(crate) struct LaunchQueue {
    state: Mutex<State>,
}

/// The process's queue.
pub(crate) fn global() -> &'static Arc<LaunchQueue> {
    static QUEUE: OnceLock<Arc<LaunchQueue>> = OnceLock::new();
    QUEUE.get_or_init(Arc::default)
}

impl LaunchQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `launch` behind the others; the worker that finishes its
    /// compile launches it if nothing has by then.
    pub fn push(self: &Arc<Self>, launch: Launch) {
        let program = launch.work.program().cloned();
        {
            let mut state = self.lock();
            for &key in launch.work.holds() {
                *state.held.entry(key).or_default() += 1;
            }
            state.waiting.push_back(launch);
        }
        match program {
            Some(program) => {
                let queue = Arc::downgrade(self);
                program.then(move || {
                    if let Some(queue) = queue.upgrade() {
                        queue.pump(Until::Ready);
                    }
                });
            }
            None => self.pump(Until::Ready),
        }
    }

    /// Runs queued launches in order: each one whose program is ready, and
    /// with `until` other than [`Until::Ready`], waits for compiles until
    /// that point.
    pub fn pump(&self, until: Until) {
        loop {
            let mut state = self.lock();
            let Some(front) = state.waiting.front() else {
                return;
            };
            if let Until::Token(token) = until
                && !state
                    .waiting
                    .iter()
                    .any(|l| l.outputs.iter().any(|o| o.token == token))
            {
                return;
            }
            let program = match front.work.program() {
                Some(compiling) => match compiling.try_get() {
                    Some(program) => Some(program),
                    None if until == Until::Ready => return,
                    None => {
                        let compiling = compiling.clone();
                        drop(state);
                        let _ = compiling.wait();
                        continue;
                    }
                },
                None => None,
            };
            if let Some(launch) = state.waiting.pop_front() {
                for key in launch.work.holds() {
                    if let Some(n) = state.held.get_mut(key) {
                        *n -= 1;
                        if *n == 0 {
                            state.held.remove(key);
                        }
                    }
                }
                // Launched under the lock: the queue's order is the order
                // programs reach the device.
                run(&mut state, launch, program);
            }
        }
    }

    /// How many references to `buffer` waiting launches hold.
    pub fn holders(&self, buffer: &Arc<Buffer>) -> usize {
        self.lock()
            .held
            .get(&BufferKey::of(buffer))
            .copied()
            .unwrap_or(0)
    }

    /// The shape of the buffer that will hold the elements of the pending
    /// value with `token`, while its launch waits.
    pub fn stored_shape(&self, token: u64) -> Option<Shape> {
        self.lock()
            .waiting
            .iter()
            .flat_map(|l| &l.outputs)
            .find(|o| o.token == token)
            .map(|o| o.stored.clone())
    }

    /// Computes the pending value with `token`, or raises the error of the
    /// launch that failed to.
    pub fn materialize(&self, token: u64) -> Result<()> {
        self.pump(Until::Token(token));
        self.lock().failure(token).map_or(Ok(()), Err)
    }
}

impl State {
    /// The error of the failed launch that was to compute `token`.
    fn failure(&self, token: u64) -> Option<Error> {
        self.failed
            .iter()
            .find(|(t, _, _)| *t == token)
            .map(|(_, _, e)| e.clone())
    }
}

/// Runs `launch` and gives its outputs their values, or notes its error.
fn run(state: &mut State, launch: Launch, program: Option<Result<Arc<Executable>>>) {
    let Launch {
        op,
        location,
        work,
        inputs,
        outputs,
    } = launch;
    if outputs.iter().all(|o| !o.tensor.is_alive()) {
        return;
    }
    let program = || {
        program.unwrap_or_else(|| Err(Error::Signature("a queued program was not ready".into())))
    };
    // An input's failure is passed on as it is: it names its own op.
    let buffers = inputs
        .iter()
        .map(|x| elements(state, x))
        .collect::<Result<Vec<Arc<Buffer>>>>();
    let outcome = buffers.and_then(|buffers| match work {
        Work::Reshape => Ok(buffers.into_iter().map(TensorValue::Reshaped).collect()),
        Work::Graph { launch, .. } => Ok(on_device(launch(program(), buffers)?)),
        Work::Program(_) => {
            let args: Vec<&Buffer> = buffers.iter().map(Arc::as_ref).collect();
            program()
                .and_then(|p| p.run(&args))
                .map(on_device)
                .map_err(|source| op_failed(op, location, &inputs, source))
        }
    });
    match outcome {
        Ok(values) => {
            for (output, value) in outputs.iter().zip(values) {
                if let Some(t) = output.tensor.upgrade() {
                    t.set_value(match value {
                        TensorValue::Reshaped(b) if b.shape() == t.shape() => {
                            TensorValue::Device(b)
                        }
                        value => value,
                    });
                }
            }
        }
        Err(error) => {
            state.failed.retain(|(_, o, _)| o.is_alive());
            for output in outputs {
                state
                    .failed
                    .push((output.token, output.tensor, error.clone()));
            }
        }
    }
}

fn on_device(buffers: Vec<Buffer>) -> Vec<TensorValue> {
    buffers
        .into_iter()
        .map(|b| TensorValue::Device(Arc::new(b)))
        .collect()
}

/// The buffer holding `x`'s elements: every launch `x` waited on has run,
/// so it is on the device unless that launch failed.
fn elements(state: &State, x: &Tensor) -> Result<Arc<Buffer>> {
    match x.value() {
        TensorValue::Device(b) | TensorValue::Reshaped(b) => Ok(b),
        TensorValue::Pending(p) => Err(state.failure(p.token).unwrap_or_else(|| {
            Error::Signature("a queued launch's input was never computed".into())
        })),
        TensorValue::Host(_) => x.elements(),
    }
}
