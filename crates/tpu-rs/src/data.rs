//! Feeding a model: a [`Dataset`] of examples, and a [`DataLoader`] that
//! groups them into batches (in order, or shuffled per epoch from a seed),
//! optionally drops a short last batch, and can prepare batches ahead on a
//! background thread, copied to the device, so the host builds batch k+1
//! while the device runs step k.

use std::sync::Arc;
use std::sync::mpsc::{Receiver, sync_channel};
use std::thread::JoinHandle;

use tpu_core::Device;

use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// Examples addressed by index; each example is one tensor per field (an
/// image and its label, a token window and its targets).
pub trait Dataset: Send + Sync {
    /// How many examples there are.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Example `index` (`< len()`).
    fn get(&self, index: usize) -> Result<Vec<Tensor>>;

    /// The examples at `indices`, each field stacked along a new leading
    /// dimension. Datasets held as whole tensors override this with one
    /// gather per field.
    fn batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let examples = indices
            .iter()
            .map(|&i| self.get(i))
            .collect::<Result<Vec<_>>>()?;
        let fields = examples.first().map_or(0, Vec::len);
        (0..fields)
            .map(|f| {
                let column: Vec<&Tensor> = examples.iter().map(|e| &e[f]).collect();
                Tensor::stack(&column, 0)
            })
            .collect()
    }
}

/// Tensors whose leading dimension indexes the examples (PyTorch's
/// `TensorDataset`).
pub struct TensorDataset {
    fields: Vec<Tensor>,
    len: usize,
}

impl TensorDataset {
    /// A dataset over `fields`, which must agree on their leading size.
    pub fn new(fields: Vec<Tensor>) -> Result<TensorDataset> {
        let sizes: Vec<usize> = fields
            .iter()
            .map(|t| t.dims().first().copied().unwrap_or(0))
            .collect();
        let len = sizes.first().copied().unwrap_or(0);
        if fields.is_empty() || sizes.iter().any(|&n| n != len) {
            return Err(Error::shape(
                "TensorDataset",
                format!("needs fields with one leading size, got sizes {sizes:?}"),
            ));
        }
        Ok(TensorDataset { fields, len })
    }
}

impl Dataset for TensorDataset {
    fn len(&self) -> usize {
        self.len
    }

    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        let i = index as i64;
        self.fields
            .iter()
            .map(|t| t.slice(0, i, i + 1, 1)?.squeeze([0]))
            .collect()
    }

    fn batch(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let rows: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        self.fields
            .iter()
            .map(|t| {
                let index = Tensor::from_slice(&rows, [rows.len()], t.device())?;
                t.index_select(0, &index)
            })
            .collect()
    }
}

/// Batches of a [`Dataset`]: `for batch in loader.epoch(e) { let [x, y] = ... }`.
#[derive(Clone)]
pub struct DataLoader {
    dataset: Arc<dyn Dataset>,
    batch_size: usize,
    shuffle: Option<u64>,
    drop_last: bool,
    device: Option<Device>,
    prefetch: usize,
}

impl DataLoader {
    /// Batches of `batch_size` examples (at least 1) in order, built on
    /// the calling thread, left where the dataset holds them.
    pub fn new(dataset: Arc<dyn Dataset>, batch_size: usize) -> DataLoader {
        DataLoader {
            dataset,
            batch_size: batch_size.max(1),
            shuffle: None,
            drop_last: false,
            device: None,
            prefetch: 0,
        }
    }

    /// Shuffles each epoch's order from `seed` and the epoch's number: the
    /// same seed and epoch give the same order.
    pub fn shuffle(mut self, seed: u64) -> DataLoader {
        self.shuffle = Some(seed);
        self
    }

    /// Leaves out a last batch smaller than the batch size.
    pub fn drop_last(mut self, drop: bool) -> DataLoader {
        self.drop_last = drop;
        self
    }

    /// Copies each batch to `device`.
    pub fn to_device(mut self, device: Device) -> DataLoader {
        self.device = Some(device);
        self
    }

    /// Builds up to `batches` batches ahead on a background thread (0:
    /// none, on the calling thread).
    pub fn prefetch(mut self, batches: usize) -> DataLoader {
        self.prefetch = batches;
        self
    }

    /// Batches per epoch.
    pub fn len(&self) -> usize {
        let n = self.dataset.len();
        if self.drop_last {
            n / self.batch_size
        } else {
            n.div_ceil(self.batch_size)
        }
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The example indices of epoch `epoch`, batch by batch.
    pub fn order(&self, epoch: u64) -> Vec<Vec<usize>> {
        let mut order: Vec<usize> = (0..self.dataset.len()).collect();
        if let Some(seed) = self.shuffle {
            let mut state = crate::random::Generator::new(seed ^ epoch.rotate_left(32));
            // Fisher-Yates.
            for i in (1..order.len()).rev() {
                let j = (state.next_u64() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
        }
        let mut batches: Vec<Vec<usize>> = order
            .chunks(self.batch_size)
            .map(<[usize]>::to_vec)
            .collect();
        if self.drop_last && batches.last().is_some_and(|b| b.len() < self.batch_size) {
            batches.pop();
        }
        batches
    }

    /// The batches of epoch `epoch`.
    pub fn epoch(&self, epoch: u64) -> Batches {
        let order = self.order(epoch);
        if self.prefetch == 0 {
            return Batches::Here {
                loader: self.clone(),
                order: order.into_iter(),
            };
        }
        let (send, receive) = sync_channel(self.prefetch);
        let loader = self.clone();
        let worker = std::thread::Builder::new()
            .name("tpu-rs data".into())
            .spawn(move || {
                for indices in order {
                    // The consumer went away: stop.
                    if send.send(loader.load(&indices)).is_err() {
                        return;
                    }
                }
            });
        match worker {
            Ok(worker) => Batches::Ahead {
                receive: Some(receive),
                worker: Some(worker),
            },
            Err(e) => Batches::Failed(Some(Error::shape(
                "DataLoader",
                format!("cannot start the prefetch thread: {e}"),
            ))),
        }
    }

    fn load(&self, indices: &[usize]) -> Result<Vec<Tensor>> {
        let batch = self.dataset.batch(indices)?;
        match self.device {
            Some(device) => batch.iter().map(|t| t.to_device(device)).collect(),
            None => Ok(batch),
        }
    }
}

/// An epoch's batches (see [`DataLoader::epoch`]).
pub enum Batches {
    /// Built on the calling thread as they are asked for.
    Here {
        /// Whose batches.
        loader: DataLoader,
        /// The batches still to build.
        order: std::vec::IntoIter<Vec<usize>>,
    },
    /// Built ahead on a background thread.
    Ahead {
        /// Batches as the thread finishes them.
        receive: Option<Receiver<Result<Vec<Tensor>>>>,
        /// The thread.
        worker: Option<JoinHandle<()>>,
    },
    /// The background thread could not start.
    Failed(Option<Error>),
}

impl Iterator for Batches {
    type Item = Result<Vec<Tensor>>;

    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Batches::Here { loader, order } => order.next().map(|indices| loader.load(&indices)),
            Batches::Ahead { receive, .. } => receive.as_ref()?.recv().ok(),
            Batches::Failed(error) => error.take().map(Err),
        }
    }
}

impl Drop for Batches {
    fn drop(&mut self) {
        if let Batches::Ahead { receive, worker } = self {
            // Dropping the receiver ends the thread at its next batch.
            drop(receive.take());
            if let Some(worker) = worker.take() {
                let _ = worker.join();
            }
        }
    }
}
