//! Batching, shuffling and prefetch of `tpu_rs::data`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tpu_rs::data::{DataLoader, Dataset, TensorDataset};
use tpu_rs::prelude::*;
use tpu_rs::{Error, Result};

/// Ten examples: x = [i, 10 i], y = i.
fn dataset(device: Device) -> Result<Arc<TensorDataset>> {
    let x: Vec<f32> = (0..10).flat_map(|i| [i as f32, 10.0 * i as f32]).collect();
    let y: Vec<i64> = (0..10).collect();
    Ok(Arc::new(TensorDataset::new(vec![
        Tensor::from_slice(&x, [10, 2], device)?,
        Tensor::from_slice(&y, [10], device)?,
    ])?))
}

fn labels(loader: &DataLoader, epoch: u64) -> Result<Vec<Vec<i64>>> {
    loader
        .epoch(epoch)
        .map(|batch| {
            let batch = batch?;
            let x = batch[0].to_f64_vec()?;
            let y = batch[1].to_vec::<i64>()?;
            // Each example keeps its fields together.
            for (k, &i) in y.iter().enumerate() {
                assert_eq!((x[2 * k], x[2 * k + 1]), (i as f64, 10.0 * i as f64));
            }
            Ok(y)
        })
        .collect()
}

#[test]
fn batches_in_order_with_or_without_the_short_last_one() -> Result<()> {
    let data = dataset(Device::Cpu)?;
    let loader = DataLoader::new(data.clone(), 3);
    assert_eq!(loader.len(), 4);
    assert_eq!(
        labels(&loader, 0)?,
        [vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8], vec![9]]
    );
    let loader = loader.drop_last(true);
    assert_eq!(loader.len(), 3);
    assert_eq!(labels(&loader, 0)?.len(), 3);
    // Examples one by one, stacked: the trait's default batching.
    struct OneByOne(Arc<TensorDataset>);
    impl Dataset for OneByOne {
        fn len(&self) -> usize {
            self.0.len()
        }
        fn get(&self, index: usize) -> Result<Vec<Tensor>> {
            self.0.get(index)
        }
    }
    let stacked = DataLoader::new(Arc::new(OneByOne(data)), 4);
    assert_eq!(
        labels(&stacked, 0)?,
        [vec![0, 1, 2, 3], vec![4, 5, 6, 7], vec![8, 9]]
    );
    Ok(())
}

#[test]
fn shuffling_is_a_permutation_fixed_by_seed_and_epoch() -> Result<()> {
    let loader = DataLoader::new(dataset(Device::Cpu)?, 4).shuffle(5);
    let epoch0: Vec<i64> = labels(&loader, 0)?.concat();
    let mut sorted = epoch0.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..10).collect::<Vec<_>>());
    assert_ne!(epoch0, sorted, "shuffled");
    assert_eq!(labels(&loader, 0)?.concat(), epoch0, "same seed and epoch");
    assert_ne!(labels(&loader, 1)?.concat(), epoch0, "another epoch");
    Ok(())
}

/// A dataset that notes which examples were asked for, slowly.
struct Watched {
    inner: Arc<TensorDataset>,
    asked: AtomicUsize,
    fail_at: Option<usize>,
}

impl Dataset for Watched {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        self.inner.get(index)
    }
    fn batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        std::thread::sleep(Duration::from_millis(20));
        self.asked.fetch_add(1, Ordering::SeqCst);
        if self.fail_at.is_some_and(|i| indices.contains(&i)) {
            return Err(Error::shape("Watched", "a broken example"));
        }
        self.inner.batch(indices)
    }
}

#[test]
fn prefetch_builds_batches_ahead_on_the_device() -> Result<()> {
    let watched = Arc::new(Watched {
        inner: dataset(Device::Cpu)?,
        asked: AtomicUsize::new(0),
        fail_at: None,
    });
    let loader = DataLoader::new(watched.clone(), 2)
        .prefetch(2)
        .to_device(Device::Tpu(0));
    let mut batches = loader.epoch(0);
    let first = batches.next().unwrap()?;
    assert_eq!(first[0].device(), Device::Tpu(0));
    // While the caller works on the first batch, the next ones are built.
    let deadline = Instant::now() + Duration::from_secs(10);
    while watched.asked.load(Ordering::SeqCst) < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        watched.asked.load(Ordering::SeqCst) >= 3,
        "nothing was built ahead"
    );
    let rest: Vec<Vec<Tensor>> = batches.collect::<Result<_>>()?;
    assert_eq!(rest.len(), 4);
    // The same values as built on the calling thread.
    let here = DataLoader::new(dataset(Device::Cpu)?, 2);
    assert_eq!(labels(&loader, 3)?, labels(&here, 3)?);
    Ok(())
}

#[test]
fn a_failing_batch_is_an_error_and_stopping_early_ends_the_thread() -> Result<()> {
    let watched = Arc::new(Watched {
        inner: dataset(Device::Cpu)?,
        asked: AtomicUsize::new(0),
        fail_at: Some(5),
    });
    for prefetch in [0, 3] {
        let loader = DataLoader::new(watched.clone(), 2).prefetch(prefetch);
        let got: Vec<Result<Vec<Tensor>>> = loader.epoch(0).collect();
        assert!(got[..2].iter().all(Result::is_ok));
        let err = got[2].as_ref().err().map(ToString::to_string).unwrap();
        assert!(err.contains("a broken example"), "{err}");
    }
    // Dropped after one batch: the thread stops (the drop joins it).
    let loader = DataLoader::new(dataset(Device::Cpu)?, 1).prefetch(1);
    let mut batches = loader.epoch(0);
    batches.next().unwrap()?;
    drop(batches);
    Ok(())
}

#[test]
fn fields_of_different_lengths_are_refused() -> Result<()> {
    let err = TensorDataset::new(vec![
        Tensor::zeros([4, 2], DType::F32, Device::Cpu)?,
        Tensor::zeros([3], DType::I64, Device::Cpu)?,
    ])
    .err()
    .map(|e| e.to_string())
    .unwrap();
    assert!(err.contains("[4, 3]"), "{err}");
    Ok(())
}
