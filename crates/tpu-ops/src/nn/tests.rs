//! Spot checks of the nn references against values PyTorch gives.

use tpu_core::DType;
use tpu_core::op::Attrs;

use crate::reduce::tests::{close, f32s, ints, run, values};

#[test]
fn cross_entropy_and_nll_loss() {
    let logits = f32s(&[2, 3], &[1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    let t = ints(DType::I64, &[2], &[2, -100]);
    let ce =
        |a: Attrs| values(&run("cross_entropy", vec![logits.clone(), t.clone()], a).unwrap()[0]);
    assert!(close(&ce(Attrs::new()), &[0.40760596444438013]));
    assert!(close(
        &ce(Attrs::new().with("reduction", "sum")),
        &[0.40760596444438013]
    ));
    assert!(close(
        &ce(Attrs::new().with("reduction", "none")),
        &[0.40760596444438013, 0.0]
    ));
    assert!(close(
        &ce(Attrs::new().with("label_smoothing", 0.1)),
        &[0.5076059644443801]
    ));
    let t32 = ints(DType::I32, &[2], &[0, 1]);
    let r = run("nll_loss", vec![logits.clone(), t32], Attrs::new()).unwrap();
    assert!(close(&values(&r[0]), &[-1.5]));
    let all_ignored = ints(DType::I64, &[2], &[-100, -100]);
    let r = run(
        "cross_entropy",
        vec![logits.clone(), all_ignored],
        Attrs::new(),
    )
    .unwrap();
    assert!(values(&r[0])[0].is_nan());
    let bad = ints(DType::I64, &[3], &[0, 0, 0]);
    assert!(run("cross_entropy", vec![logits.clone(), bad], Attrs::new()).is_err());
    let floats = f32s(&[2], &[0.0, 1.0]);
    assert!(run("cross_entropy", vec![logits, floats], Attrs::new()).is_err());
    // (N, C, d) logits with (N, d) targets.
    let x = f32s(&[1, 2, 2], &[0.0, 1.0, 1.0, 0.0]);
    let t = ints(DType::I64, &[1, 2], &[1, 1]);
    let r = run(
        "cross_entropy",
        vec![x, t],
        Attrs::new().with("reduction", "none"),
    )
    .unwrap();
    let a = (1.0f64 + (-1.0f64).exp()).ln();
    assert!(close(&values(&r[0]), &[a, 1.0 + a]));
}

#[test]
fn normalisations() {
    let x = f32s(&[1, 3], &[1.0, 2.0, 3.0]);
    let r = run("layer_norm", vec![x.clone()], Attrs::new()).unwrap();
    let s = (2.0f64 / 3.0 + 1e-5).sqrt();
    assert!(close(&values(&r[0]), &[-1.0 / s, 0.0, 1.0 / s]));
    let w = f32s(&[3], &[1.0, 2.0, 3.0]);
    let r = run("rms_norm", vec![x.clone(), w], Attrs::new()).unwrap();
    let rms = (14.0f64 / 3.0 + 1e-6).sqrt();
    assert!(close(&values(&r[0]), &[1.0 / rms, 4.0 / rms, 9.0 / rms]));
    let bad = f32s(&[2], &[1.0, 2.0]);
    assert!(run("layer_norm", vec![x, bad], Attrs::new()).is_err());
    // batch_norm in training: batch statistics, running stats updated.
    let x = f32s(&[2, 1], &[1.0, 3.0]);
    let p = |v: f64| f32s(&[1], &[v]);
    let r = run(
        "batch_norm",
        vec![x.clone(), p(1.0), p(0.0), p(0.0), p(1.0)],
        Attrs::new().with("training", true),
    )
    .unwrap();
    let s = (1.0f64 + 1e-5).sqrt();
    assert!(close(&values(&r[0]), &[-1.0 / s, 1.0 / s]));
    assert!(close(&values(&r[1]), &[0.2]));
    assert!(close(&values(&r[2]), &[0.9 + 0.1 * 2.0]));
    let one = f32s(&[1, 1], &[1.0]);
    let train = Attrs::new().with("training", true);
    assert!(
        run(
            "batch_norm",
            vec![one, p(1.0), p(0.0), p(0.0), p(1.0)],
            train
        )
        .is_err()
    );
}

#[test]
fn attention() {
    let q = f32s(&[2, 1], &[1.0, 2.0]);
    let v = f32s(&[2, 1], &[10.0, 20.0]);
    let r = run(
        "scaled_dot_product_attention",
        vec![q.clone(), q.clone(), v.clone()],
        Attrs::new().with("causal", true),
    )
    .unwrap();
    let p1 = 1.0 / (1.0 + (-2.0f64).exp());
    assert!(close(
        &values(&r[0]),
        &[10.0, 10.0 * (1.0 - p1) + 20.0 * p1]
    ));
    let mask = ints(DType::Bool, &[2, 2], &[1, 0, 1, 1]);
    let r2 = run(
        "scaled_dot_product_attention",
        vec![q.clone(), q.clone(), v.clone(), mask.clone()],
        Attrs::new(),
    )
    .unwrap();
    assert_eq!(values(&r[0]), values(&r2[0]));
    assert!(
        run(
            "scaled_dot_product_attention",
            vec![q.clone(), q.clone(), v, mask],
            Attrs::new().with("causal", true)
        )
        .is_err()
    );
}
