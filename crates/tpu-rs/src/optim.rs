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

/// A checkpoint error for optimizer state that does not fit.
fn misfit(unexpected: String, mismatched: String) -> crate::Error {
    crate::Error::Checkpoint {
        missing: String::new(),
        unexpected,
        mismatched,
    }
}

/// Per-parameter state as PyTorch's `optimizer.state_dict()` names it:
/// `state.{i}.{field}` for each of `fields` of each parameter `i` that has
/// state, beside `state.{i}.step` (a rank-0 count) when `step` is given.
fn state_dict(
    fields: &[&str],
    slots: impl IntoIterator<Item = Option<Vec<Tensor>>>,
    step: Option<u32>,
) -> Result<Vec<(String, Tensor)>> {
    let mut out = Vec::new();
    for (i, slot) in slots.into_iter().enumerate() {
        let Some(values) = slot else { continue };
        if let Some(step) = step {
            let count = Tensor::scalar(f64::from(step), DType::F32, Device::Cpu)?;
            out.push((format!("state.{i}.step"), count));
        }
        out.extend(
            fields
                .iter()
                .zip(values)
                .map(|(f, t)| (format!("state.{i}.{f}"), t)),
        );
    }
    Ok(out)
}

/// What [`state_dict`] wrote, for `params`: each parameter's `fields`
/// (all of them, or none), on its device and in its dtype, and the step
/// count (one for every parameter; 0 when none has state). A name it does
/// not know, a shape that differs or a partial state is an error.
fn from_state_dict(
    state: &BTreeMap<String, HostTensor>,
    params: &[Parameter],
    fields: &[&str],
    counts_steps: bool,
) -> Result<(Vec<Option<Vec<Tensor>>>, u32)> {
    let name = |i: usize, field: &str| format!("state.{i}.{field}");
    let step_field: &[&str] = if counts_steps { &["step"] } else { &[] };
    let known: Vec<String> = (0..params.len())
        .flat_map(|i| fields.iter().chain(step_field).map(move |f| name(i, f)))
        .collect();
    let unknown: Vec<&str> = state
        .keys()
        .filter(|k| !known.contains(k))
        .map(String::as_str)
        .collect();
    if !unknown.is_empty() {
        return Err(misfit(unknown.join(", "), String::new()));
    }
    let mut slots = Vec::with_capacity(params.len());
    let mut steps = None;
    for (i, p) in params.iter().enumerate() {
        let like = p.get();
        let mut values = Vec::with_capacity(fields.len());
        for field in fields {
            let Some(h) = state.get(&name(i, field)) else {
                continue;
            };
            if h.shape() != *like.shape() {
                let what = format!("{}: {} vs {}", name(i, field), h.shape(), like.shape());
                return Err(misfit(String::new(), what));
            }
            values.push(Tensor::from_host(h.cast(like.dtype()), like.device())?);
        }
        let step = state.get(&name(i, "step")).map(|s| s.to_f64().sum() as u32);
        if values.is_empty() && step.is_none() {
            slots.push(None);
            continue;
        }
        let whole = values.len() == fields.len() && step.is_some() == counts_steps;
        if !whole || (steps.is_some() && steps != step) {
            let needs = [fields, step_field].concat().join(", ");
            let what = format!("state.{i}: needs {needs}, with one step count for every parameter");
            return Err(misfit(String::new(), what));
        }
        steps = step;
        slots.push(Some(values));
    }
    Ok((slots, steps.unwrap_or(0)))
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
        let slots = self.velocity.iter().map(|v| Some(vec![v.clone()?]));
        state_dict(&["momentum_buffer"], slots, None)
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let (slots, _) = from_state_dict(state, &self.params, &["momentum_buffer"], false)?;
        self.velocity = slots.into_iter().map(|s| s?.pop()).collect();
        Ok(())
    }
}

/// The moments Adam keeps per parameter, as PyTorch names them.
const ADAM_FIELDS: [&str; 2] = ["exp_avg", "exp_avg_sq"];

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
        let slots =
            (self.moments.iter()).map(|mv| mv.as_ref().map(|(m, v)| vec![m.clone(), v.clone()]));
        state_dict(&ADAM_FIELDS, slots, Some(self.steps))
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let (slots, steps) = from_state_dict(state, &self.params, &ADAM_FIELDS, true)?;
        self.moments = slots
            .into_iter()
            .map(|slot| {
                let [m, v] = <[Tensor; 2]>::try_from(slot?).ok()?;
                Some((m, v))
            })
            .collect();
        self.steps = steps;
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
        let slots = self.square_avg.iter().map(|v| Some(vec![v.clone()?]));
        state_dict(&["square_avg"], slots, Some(self.steps))
    }

    fn load_state(&mut self, state: &BTreeMap<String, HostTensor>) -> Result<()> {
        let (slots, steps) = from_state_dict(state, &self.params, &["square_avg"], true)?;
        self.square_avg = slots.into_iter().map(|s| s?.pop()).collect();
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
