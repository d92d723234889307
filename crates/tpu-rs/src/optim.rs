//! Optimizers (SGD with momentum, Nesterov and weight decay; Adam and
//! AdamW; RMSprop), learning-rate schedules (cosine with warmup, step,
//! linear warmup, one-cycle) and the [`Scheduler`] that applies them, and
//! gradient-norm clipping. Every
//! step-dependent number (learning rate, bias corrections) enters as a
//! rank-0 tensor, so a changing schedule never recompiles a fused step.

use std::collections::BTreeMap;
use std::panic::Location;

use tpu_core::policy::{self, EagerMode};
use tpu_core::{DType, Device, HostTensor, profile};

use crate::autograd::no_grad;
use crate::error::Result;
use crate::nn::Parameter;
use crate::tensor::Tensor;

/// Something that updates parameters from their gradients.
pub trait Optimizer {
    /// Applies one update from the accumulated gradients; profile traces
    /// attribute its ops to the caller.
    #[track_caller]
    fn step(&mut self) -> Result<()>;
    /// Forgets every parameter's gradient.
    fn zero_grad(&self);
    /// Sets the learning rate for later steps.
    fn set_lr(&mut self, lr: f64);
    /// The per-parameter state, named as PyTorch's `optimizer.state_dict()`
    /// names it (`state.{i}.exp_avg` for the `i`-th parameter given to the
    /// optimizer), with step counts as rank-0 tensors: with the parameters,
    /// what resuming a run needs ([`crate::checkpoint::save_optimizer`]).
    fn state(&self) -> Result<Vec<(String, Tensor)>>;
    /// Restores what [`Optimizer::state`] gave; the names must match this
    /// optimizer's parameters (a name it does not know is an error, and
    /// nothing changes).
    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()>;
}

/// An error naming every name of `state` that is not `known`.
fn take_state(state: &BTreeMap<String, HostTensor>, known: &[String]) -> Result<()> {
    let unknown: Vec<&String> = state.keys().filter(|k| !known.contains(k)).collect();
    if unknown.is_empty() {
        return Ok(());
    }
    Err(crate::Error::Checkpoint {
        missing: String::new(),
        unexpected: unknown
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        mismatched: String::new(),
    })
}

/// `state`'s tensor `name`, on `like`'s device and in its dtype.
fn restored(
    state: &BTreeMap<String, HostTensor>,
    name: &str,
    like: &Tensor,
) -> Result<Option<Tensor>> {
    state
        .get(name)
        .map(|h| {
            if h.shape() != *like.shape() {
                return Err(crate::Error::Checkpoint {
                    missing: String::new(),
                    unexpected: String::new(),
                    mismatched: format!("{name}: {} vs {}", h.shape(), like.shape()),
                });
            }
            Tensor::from_host(h.cast(like.dtype()), like.device())
        })
        .transpose()
}

fn scalar_for(p: &Tensor, value: f64) -> Result<Tensor> {
    Tensor::scalar(value, p.dtype(), p.device())
}

/// The end of an optimizer step is a cut point: the update runs as its own
/// graph under DeferAndFuse, so every training step finds the same graphs.
fn end_of_step() -> Result<()> {
    Ok(tpu_core::policy::sync()?)
}

/// Runs an optimizer step's ops: under Strict as one deferred graph (one
/// program for the whole update, not several per parameter, each compiled
/// on first use); other modes run them as they run any op (Debug one at a
/// time).
fn as_one_graph(step: impl FnOnce() -> Result<()>) -> Result<()> {
    if policy::current_policy_name()? == EagerMode::Strict.name() {
        policy::with_eager_mode(EagerMode::DeferAndFuse, step)?
    } else {
        step()
    }
}

fn clear(params: &[Parameter]) {
    for p in params {
        p.get().zero_grad();
    }
}

/// Stochastic gradient descent.
pub struct Sgd {
    params: Vec<Parameter>,
    /// Learning rate.
    pub lr: f64,
    /// Momentum factor (0 for none).
    pub momentum: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    /// Nesterov momentum: the step looks ahead along the velocity.
    pub nesterov: bool,
    velocity: Vec<Option<Tensor>>,
}

impl Sgd {
    /// SGD over `params`.
    pub fn new(params: Vec<Parameter>, lr: f64, momentum: f64, weight_decay: f64) -> Sgd {
        let velocity = vec![None; params.len()];
        Sgd {
            params,
            lr,
            momentum,
            weight_decay,
            nesterov: false,
            velocity,
        }
    }

    /// With Nesterov momentum (PyTorch's `nesterov=True`).
    pub fn with_nesterov(mut self, nesterov: bool) -> Sgd {
        self.nesterov = nesterov;
        self
    }
}

impl Optimizer for Sgd {
    #[track_caller]
    fn step(&mut self) -> Result<()> {
        profile::at(Location::caller(), || {
            no_grad(|| {
                as_one_graph(|| {
                    for (p, v) in self.params.iter().zip(&mut self.velocity) {
                        let value = p.get();
                        let Some(mut g) = value.grad() else { continue };
                        if self.weight_decay != 0.0 {
                            g = (&g + &(&value * &scalar_for(&value, self.weight_decay)?)?)?;
                        }
                        if self.momentum != 0.0 {
                            let next = match v.take() {
                                Some(prev) => {
                                    (&(&prev * &scalar_for(&value, self.momentum)?)? + &g)?
                                }
                                None => g.clone(),
                            };
                            *v = Some(next.clone());
                            g = if self.nesterov {
                                (&g + &(&next * &scalar_for(&value, self.momentum)?)?)?
                            } else {
                                next
                            };
                        }
                        p.set(&(&value - &(&g * &scalar_for(&value, self.lr)?)?)?);
                    }
                    end_of_step()
                })
            })
        })
    }

    fn zero_grad(&self) {
        clear(&self.params);
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        Ok(self
            .velocity
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((format!("state.{i}.momentum_buffer"), v.clone()?)))
            .collect())
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let names: Vec<String> = (0..self.params.len())
            .map(|i| format!("state.{i}.momentum_buffer"))
            .collect();
        take_state(state, &names)?;
        let velocity = self
            .params
            .iter()
            .zip(&names)
            .map(|(p, name)| restored(state, name, &p.get()))
            .collect::<Result<Vec<_>>>()?;
        self.velocity = velocity;
        Ok(())
    }
}

/// Adam with decoupled weight decay.
pub struct AdamW {
    params: Vec<Parameter>,
    /// Learning rate.
    pub lr: f64,
    /// Decay rates of the first and second moments.
    pub betas: (f64, f64),
    /// Denominator guard.
    pub eps: f64,
    /// Weight decay: decoupled from the gradient (AdamW), or added to it
    /// as an L2 penalty (Adam, see [`AdamW::adam`]).
    pub weight_decay: f64,
    /// Whether the weight decay is decoupled (AdamW) or L2 (Adam).
    pub decoupled: bool,
    moments: Vec<Option<(Tensor, Tensor)>>,
    steps: u32,
}

impl AdamW {
    /// AdamW over `params` with PyTorch's defaults for betas and eps.
    pub fn new(params: Vec<Parameter>, lr: f64, weight_decay: f64) -> AdamW {
        let moments = vec![None; params.len()];
        AdamW {
            params,
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay,
            decoupled: true,
            moments,
            steps: 0,
        }
    }

    /// Adam (PyTorch's `torch.optim.Adam`): the weight decay is an L2
    /// penalty added to the gradient.
    pub fn adam(params: Vec<Parameter>, lr: f64, weight_decay: f64) -> AdamW {
        AdamW {
            decoupled: false,
            ..AdamW::new(params, lr, weight_decay)
        }
    }
}

impl Optimizer for AdamW {
    #[track_caller]
    fn step(&mut self) -> Result<()> {
        self.steps += 1;
        let (b1, b2) = self.betas;
        let t = f64::from(self.steps);
        let (c1, c2) = (1.0 - b1.powf(t), 1.0 - b2.powf(t));
        profile::at(Location::caller(), || {
            no_grad(|| {
                as_one_graph(|| {
                    for (p, state) in self.params.iter().zip(&mut self.moments) {
                        let value = p.get();
                        let Some(mut g) = value.grad() else { continue };
                        let s = |x: f64| scalar_for(&value, x);
                        let decay = if self.decoupled {
                            self.weight_decay
                        } else {
                            0.0
                        };
                        if !self.decoupled && self.weight_decay != 0.0 {
                            g = (&g + &(&value * &s(self.weight_decay)?)?)?;
                        }
                        let (m, v) = match state.take() {
                            Some((m, v)) => (
                                (&(&m * &s(b1)?)? + &(&g * &s(1.0 - b1)?)?)?,
                                (&(&v * &s(b2)?)? + &(&(&g * &g)? * &s(1.0 - b2)?)?)?,
                            ),
                            None => ((&g * &s(1.0 - b1)?)?, (&(&g * &g)? * &s(1.0 - b2)?)?),
                        };
                        let m_hat = (&m / &s(c1)?)?;
                        let v_hat = (&v / &s(c2)?)?;
                        let denom = (&v_hat.sqrt()? + &s(self.eps)?)?;
                        let update = (&(&m_hat / &denom)? + &(&value * &s(decay)?)?)?;
                        p.set(&(&value - &(&update * &s(self.lr)?)?)?);
                        *state = Some((m, v));
                    }
                    end_of_step()
                })
            })
        })
    }

    fn zero_grad(&self) {
        clear(&self.params);
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut state = Vec::new();
        for (i, (m, v)) in self
            .moments
            .iter()
            .enumerate()
            .filter_map(|(i, mv)| Some((i, mv.as_ref()?)))
        {
            let step = Tensor::scalar(f64::from(self.steps), DType::F32, Device::Cpu)?;
            state.push((format!("state.{i}.step"), step));
            state.push((format!("state.{i}.exp_avg"), m.clone()));
            state.push((format!("state.{i}.exp_avg_sq"), v.clone()));
        }
        Ok(state)
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let name = |i: usize, what: &str| format!("state.{i}.{what}");
        let known: Vec<String> = (0..self.params.len())
            .flat_map(|i| ["step", "exp_avg", "exp_avg_sq"].map(|w| name(i, w)))
            .collect();
        take_state(state, &known)?;
        let mut moments = Vec::with_capacity(self.params.len());
        let mut steps = None;
        for (i, p) in self.params.iter().enumerate() {
            let value = p.get();
            let m = restored(state, &name(i, "exp_avg"), &value)?;
            let v = restored(state, &name(i, "exp_avg_sq"), &value)?;
            let step = state.get(&name(i, "step")).map(|s| s.to_f64().sum() as u32);
            match (m, v, step) {
                (Some(m), Some(v), Some(step)) if steps.is_none_or(|s| s == step) => {
                    steps = Some(step);
                    moments.push(Some((m, v)));
                }
                (None, None, None) => moments.push(None),
                _ => {
                    return Err(crate::Error::Checkpoint {
                        missing: String::new(),
                        unexpected: String::new(),
                        mismatched: format!(
                            "state.{i}: needs step, exp_avg and exp_avg_sq, with one step count for every parameter"
                        ),
                    });
                }
            }
        }
        self.moments = moments;
        self.steps = steps.unwrap_or(0);
        Ok(())
    }
}

/// RMSprop, as PyTorch's `torch.optim.RMSprop` without momentum or
/// centering: each parameter steps by its gradient over the root of a
/// running mean of its squares.
pub struct RmsProp {
    params: Vec<Parameter>,
    /// Learning rate.
    pub lr: f64,
    /// Decay of the running mean of squared gradients.
    pub alpha: f64,
    /// Denominator guard.
    pub eps: f64,
    /// L2 penalty added to the gradient.
    pub weight_decay: f64,
    square_avg: Vec<Option<Tensor>>,
    steps: u32,
}

impl RmsProp {
    /// RMSprop over `params` with PyTorch's defaults (alpha 0.99, eps 1e-8).
    pub fn new(params: Vec<Parameter>, lr: f64, weight_decay: f64) -> RmsProp {
        let square_avg = vec![None; params.len()];
        RmsProp {
            params,
            lr,
            alpha: 0.99,
            eps: 1e-8,
            weight_decay,
            square_avg,
            steps: 0,
        }
    }
}

impl Optimizer for RmsProp {
    #[track_caller]
    fn step(&mut self) -> Result<()> {
        self.steps += 1;
        profile::at(Location::caller(), || {
            no_grad(|| {
                as_one_graph(|| {
                    for (p, avg) in self.params.iter().zip(&mut self.square_avg) {
                        let value = p.get();
                        let Some(mut g) = value.grad() else { continue };
                        let s = |x: f64| scalar_for(&value, x);
                        if self.weight_decay != 0.0 {
                            g = (&g + &(&value * &s(self.weight_decay)?)?)?;
                        }
                        let fresh = (&(&g * &g)? * &s(1.0 - self.alpha)?)?;
                        let v = match avg.take() {
                            Some(v) => (&(&v * &s(self.alpha)?)? + &fresh)?,
                            None => fresh,
                        };
                        let denom = (&v.sqrt()? + &s(self.eps)?)?;
                        p.set(&(&value - &(&(&g / &denom)? * &s(self.lr)?)?)?);
                        *avg = Some(v);
                    }
                    end_of_step()
                })
            })
        })
    }

    fn zero_grad(&self) {
        clear(&self.params);
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }

    fn state(&self) -> Result<Vec<(String, Tensor)>> {
        let mut state = Vec::new();
        for (i, v) in self
            .square_avg
            .iter()
            .enumerate()
            .filter_map(|(i, v)| Some((i, v.as_ref()?)))
        {
            let step = Tensor::scalar(f64::from(self.steps), DType::F32, Device::Cpu)?;
            state.push((format!("state.{i}.step"), step));
            state.push((format!("state.{i}.square_avg"), v.clone()));
        }
        Ok(state)
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let name = |i: usize, what: &str| format!("state.{i}.{what}");
        let known: Vec<String> = (0..self.params.len())
            .flat_map(|i| ["step", "square_avg"].map(|w| name(i, w)))
            .collect();
        take_state(state, &known)?;
        let square_avg = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| restored(state, &name(i, "square_avg"), &p.get()))
            .collect::<Result<Vec<_>>>()?;
        let steps = (0..self.params.len())
            .find_map(|i| state.get(&name(i, "step")))
            .map_or(0, |s| s.to_f64().sum() as u32);
        self.square_avg = square_avg;
        self.steps = steps;
        Ok(())
    }
}

/// Linear warmup to `base_lr`, then cosine decay to `min_lr` at `total_steps`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CosineSchedule {
    /// Peak learning rate.
    pub base_lr: f64,
    /// Final learning rate.
    pub min_lr: f64,
    /// Steps of linear warmup.
    pub warmup_steps: usize,
    /// Total steps.
    pub total_steps: usize,
}

/// A learning rate for each step (0-based); [`Scheduler`] applies it.
pub trait Schedule {
    /// The learning rate at `step`.
    fn lr(&self, step: usize) -> f64;
}

impl<S: Schedule + ?Sized> Schedule for Box<S> {
    fn lr(&self, step: usize) -> f64 {
        (**self).lr(step)
    }
}

/// Drives an optimizer's learning rate from a [`Schedule`]: the first
/// step's rate when made, the next one at each [`Scheduler::step`]
/// (PyTorch's `scheduler.step()` after `optimizer.step()`).
pub struct Scheduler<S> {
    schedule: S,
    step: usize,
}

impl<S: Schedule> Scheduler<S> {
    /// Sets `optimizer`'s rate to the schedule's first.
    pub fn new(schedule: S, optimizer: &mut dyn Optimizer) -> Scheduler<S> {
        optimizer.set_lr(schedule.lr(0));
        Scheduler { schedule, step: 0 }
    }

    /// Moves to the next step's rate.
    pub fn step(&mut self, optimizer: &mut dyn Optimizer) {
        self.step += 1;
        optimizer.set_lr(self.schedule.lr(self.step));
    }

    /// The rate in force.
    pub fn lr(&self) -> f64 {
        self.schedule.lr(self.step)
    }
}

/// `base_lr` times `gamma` every `step_size` steps (PyTorch's `StepLR`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepSchedule {
    /// The first rate.
    pub base_lr: f64,
    /// Steps between decays.
    pub step_size: usize,
    /// The factor of each decay.
    pub gamma: f64,
}

impl Schedule for StepSchedule {
    fn lr(&self, step: usize) -> f64 {
        let decays = step / self.step_size.max(1);
        self.base_lr * self.gamma.powi(i32::try_from(decays).unwrap_or(i32::MAX))
    }
}

/// `base_lr` scaled from `start_factor` up to 1 over `warmup_steps`, then
/// `base_lr` (PyTorch's `LinearLR` with `end_factor=1`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearWarmup {
    /// The rate after warmup.
    pub base_lr: f64,
    /// The first step's fraction of it.
    pub start_factor: f64,
    /// Steps of warmup.
    pub warmup_steps: usize,
}

impl Schedule for LinearWarmup {
    fn lr(&self, step: usize) -> f64 {
        let done = step.min(self.warmup_steps) as f64 / self.warmup_steps.max(1) as f64;
        self.base_lr * (self.start_factor + (1.0 - self.start_factor) * done)
    }
}

/// The one-cycle policy (PyTorch's `OneCycleLR` with cosine annealing):
/// from `max_lr / div_factor` up to `max_lr` over the first `pct_start` of
/// the steps, then down to `max_lr / div_factor / final_div_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OneCycle {
    /// The peak rate.
    pub max_lr: f64,
    /// Steps in the cycle.
    pub total_steps: usize,
    /// The rising part's share of the steps.
    pub pct_start: f64,
    /// `max_lr` over the first rate.
    pub div_factor: f64,
    /// The first rate over the last.
    pub final_div_factor: f64,
}

impl OneCycle {
    /// PyTorch's defaults: 30% rising, from `max_lr / 25` to `max_lr / 25e4`.
    pub fn new(max_lr: f64, total_steps: usize) -> OneCycle {
        OneCycle {
            max_lr,
            total_steps,
            pct_start: 0.3,
            div_factor: 25.0,
            final_div_factor: 1e4,
        }
    }
}

impl Schedule for OneCycle {
    fn lr(&self, step: usize) -> f64 {
        let initial = self.max_lr / self.div_factor;
        let last = initial / self.final_div_factor;
        let peak_at = self.pct_start * self.total_steps as f64 - 1.0;
        let end_at = self.total_steps as f64 - 1.0;
        let anneal = |from: f64, to: f64, pct: f64| {
            to + (from - to) / 2.0 * ((std::f64::consts::PI * pct).cos() + 1.0)
        };
        let t = step as f64;
        if peak_at > 0.0 && t <= peak_at {
            anneal(initial, self.max_lr, t / peak_at)
        } else {
            let falling = (end_at - peak_at).max(1.0);
            anneal(self.max_lr, last, ((t - peak_at) / falling).clamp(0.0, 1.0))
        }
    }
}

impl Schedule for CosineSchedule {
    fn lr(&self, step: usize) -> f64 {
        CosineSchedule::lr(self, step)
    }
}

impl CosineSchedule {
    /// The learning rate at `step` (0-based).
    pub fn lr(&self, step: usize) -> f64 {
        if step < self.warmup_steps {
            return self.base_lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / span as f64).min(1.0);
        self.min_lr
            + 0.5 * (self.base_lr - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Scales every gradient so their joint L2 norm is at most `max_norm`;
/// returns the norm before clipping (computed on the device, no host read).
pub fn clip_grad_norm(params: &[Parameter], max_norm: f64) -> Result<Option<Tensor>> {
    no_grad(|| {
        let pairs: Vec<(Tensor, Tensor)> = params
            .iter()
            .map(Parameter::get)
            .filter_map(|p| p.grad().map(|g| (p, g)))
            .collect();
        let mut total: Option<Tensor> = None;
        for (_, g) in &pairs {
            let g = g.to_dtype(tpu_core::DType::F32)?;
            let sq = (&g * &g)?.sum_all()?;
            total = Some(match total {
                Some(t) => (&t + &sq)?,
                None => sq,
            });
        }
        let Some(total) = total else { return Ok(None) };
        let norm = total.sqrt()?;
        let device = norm.device();
        let max = Tensor::scalar(max_norm, tpu_core::DType::F32, device)?;
        let guard = Tensor::scalar(1e-6, tpu_core::DType::F32, device)?;
        let one = Tensor::scalar(1.0, tpu_core::DType::F32, device)?;
        let scale = (&max / &(&norm + &guard)?)?.minimum(&one)?;
        for (p, g) in &pairs {
            let s = scale.to_dtype(g.dtype())?;
            p.set_grad((g * &s)?);
        }
        Ok(Some(norm))
    })
}
