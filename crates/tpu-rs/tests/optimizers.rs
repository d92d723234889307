//! Each optimizer against PyTorch's on the same problem: five steps on a
//! weighted quadratic, the parameters after each step equal PyTorch's.

mod torch;

use tpu_rs::Result;
use tpu_rs::nn::{Init, ParamStore};
use tpu_rs::optim::{
    AdamW, LinearWarmup, OneCycle, Optimizer, RmsProp, Schedule, Scheduler, Sgd, StepSchedule,
};
use tpu_rs::prelude::*;

const START: [f32; 5] = [0.5, -1.0, 2.0, 0.25, -0.75];
const TARGET: [f32; 5] = [1.0, 0.0, -1.0, 2.0, 0.5];
const COEF: [f32; 5] = [0.2, 0.4, 0.6, 0.8, 1.0];
const STEPS: usize = 5;

/// The optimizers compared, as PyTorch constructs them.
const CASES: [&str; 5] = [
    "torch.optim.SGD([w], lr=0.1, momentum=0.9, weight_decay=0.01)",
    "torch.optim.SGD([w], lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)",
    "torch.optim.Adam([w], lr=0.1, weight_decay=0.01)",
    "torch.optim.AdamW([w], lr=0.1, weight_decay=0.01)",
    "torch.optim.RMSprop([w], lr=0.01, weight_decay=0.01)",
];

fn ours(case: usize, params: Vec<tpu_rs::nn::Parameter>) -> Box<dyn Optimizer> {
    match case {
        0 => Box::new(Sgd::new(params, 0.1, 0.9, 0.01)),
        1 => Box::new(Sgd::new(params, 0.1, 0.9, 0.01).with_nesterov(true)),
        2 => Box::new(AdamW::adam(params, 0.1, 0.01)),
        3 => Box::new(AdamW::new(params, 0.1, 0.01)),
        _ => Box::new(RmsProp::new(params, 0.01, 0.01)),
    }
}

fn trajectory(case: usize, device: Device) -> Result<Vec<Vec<f64>>> {
    let store = ParamStore::new(device, DType::F32, 0);
    let w = store.root().param("w", [5], Init::Zeros)?;
    w.set(&Tensor::from_slice(&START, [5], device)?);
    let mut opt = ours(case, store.parameters());
    let target = Tensor::from_slice(&TARGET, [5], device)?;
    let coef = Tensor::from_slice(&COEF, [5], device)?;
    let mut out = Vec::new();
    for _ in 0..STEPS {
        let d = (&w.get() - &target)?;
        let loss = (&(&d * &d)? * &coef)?.sum_all()?;
        opt.zero_grad();
        loss.backward()?;
        opt.step()?;
        out.push(w.get().to_f64_vec()?);
    }
    Ok(out)
}

/// PyTorch's trajectory for each of [`CASES`], from one interpreter.
fn pytorch(python: &str) -> Vec<Vec<Vec<f64>>> {
    let script = format!(
        "import json, torch\n\
         runs = []\n\
         for make in [{lambdas}]:\n\
         \x20   w = torch.tensor({START:?}, requires_grad=True)\n\
         \x20   target, coef = torch.tensor({TARGET:?}), torch.tensor({COEF:?})\n\
         \x20   opt = make(w)\n\
         \x20   out = []\n\
         \x20   for _ in range({STEPS}):\n\
         \x20       opt.zero_grad()\n\
         \x20       ((w - target) ** 2 * coef).sum().backward()\n\
         \x20       opt.step()\n\
         \x20       out.append(w.tolist())\n\
         \x20   runs.append(out)\n\
         print(json.dumps(runs))\n",
        lambdas = CASES.map(|c| format!("lambda w: {c}")).join(", ")
    );
    serde_json::from_value(torch::run_json(python, &script)).expect("a JSON list")
}

#[test]
fn optimizers_step_as_pytorchs_do() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    let runs = pytorch(&python);
    assert_eq!(runs.len(), CASES.len());
    for (i, (case, want)) in CASES.iter().zip(&runs).enumerate() {
        for device in [Device::Cpu, Device::Tpu(0)] {
            let got = trajectory(i, device)?;
            assert_eq!(got.len(), want.len());
            for (step, (g, w)) in got.iter().zip(want).enumerate() {
                for (a, b) in g.iter().zip(w) {
                    assert!(
                        (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                        "{case} on {device}, step {step}: {g:?} vs {w:?}"
                    );
                }
            }
        }
    }
    Ok(())
}

/// PyTorch's learning rates over `steps` steps for each scheduler made by
/// `makers` (Python expressions over an optimizer `opt` with rate 0.1).
fn pytorch_rates(python: &str, makers: &[&str], steps: usize) -> Vec<Vec<f64>> {
    let script = format!(
        "import json, torch\n\
         runs = []\n\
         for make in [{}]:\n\
         \x20   opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)\n\
         \x20   sched = make(opt)\n\
         \x20   rates = []\n\
         \x20   for _ in range({steps}):\n\
         \x20       rates.append(opt.param_groups[0]['lr'])\n\
         \x20       opt.step()\n\
         \x20       sched.step()\n\
         \x20   runs.append(rates)\n\
         print(json.dumps(runs))\n",
        makers
            .iter()
            .map(|m| format!("lambda opt: {m}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    serde_json::from_value(torch::run_json(python, &script)).expect("a JSON list")
}

#[test]
fn schedules_give_pytorchs_rates() -> Result<()> {
    let Some(python) = torch::python("torch") else {
        return Ok(());
    };
    const STEPS: usize = 20;
    let makers = [
        "torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)",
        "torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.25, total_iters=6)",
        "torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=20)",
    ];
    let ours: [Box<dyn Schedule>; 3] = [
        Box::new(StepSchedule {
            base_lr: 0.1,
            step_size: 4,
            gamma: 0.5,
        }),
        Box::new(LinearWarmup {
            base_lr: 0.1,
            start_factor: 0.25,
            warmup_steps: 6,
        }),
        Box::new(OneCycle::new(0.1, 20)),
    ];
    let want = pytorch_rates(&python, &makers, STEPS);
    for ((maker, schedule), want) in makers.iter().zip(ours).zip(&want) {
        // Through a Scheduler driving an optimizer, as a training loop does.
        let store = tpu_rs::nn::ParamStore::new(Device::Cpu, DType::F32, 0);
        let mut opt = Sgd::new(store.parameters(), 1.0, 0.0, 0.0);
        let mut scheduler = Scheduler::new(schedule, &mut opt);
        let mut got = Vec::new();
        for _ in 0..STEPS {
            got.push(scheduler.lr());
            scheduler.step(&mut opt);
        }
        for (step, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-9 * (1.0 + w.abs()),
                "{maker}, step {step}: {got:?} vs {want:?}"
            );
        }
    }
    Ok(())
}
