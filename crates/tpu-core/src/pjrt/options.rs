//! Compile options, validated in Rust before any plugin sees them: plugins
//! abort the process on options they dislike (`replica_count > 0`).

use pjrt_sys::protos::xla;
use prost::Message;

use crate::error::{Error, Result};

/// How to compile a program: replicas, partitions and device placement.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Data-parallel copies of the program, one per device (>= 1).
    pub num_replicas: usize,
    /// SPMD partitions of each replica (>= 1).
    pub num_partitions: usize,
    /// Let XLA partition the program from its sharding annotations.
    pub use_spmd_partitioning: bool,
    /// Device indices in replica-major order (`replica * num_partitions +
    /// partition`); `None` lets the plugin choose, starting at device 0.
    pub device_assignment: Option<Vec<usize>>,
}

impl Default for CompileOptions {
    fn default() -> CompileOptions {
        CompileOptions {
            num_replicas: 1,
            num_partitions: 1,
            use_spmd_partitioning: false,
            device_assignment: None,
        }
    }
}

impl CompileOptions {
    /// One replica on device `index`.
    pub fn on_device(index: usize) -> CompileOptions {
        CompileOptions {
            device_assignment: Some(vec![index]),
            ..CompileOptions::default()
        }
    }

    /// `n` replicas, replica `r` on device `r`.
    pub fn replicated(n: usize) -> CompileOptions {
        CompileOptions {
            num_replicas: n,
            ..CompileOptions::default()
        }
    }

    /// Devices the executable will run on.
    pub fn device_count(&self) -> usize {
        self.num_replicas * self.num_partitions
    }

    /// Checks the options against a client with `devices` addressable devices.
    pub fn validate(&self, devices: usize) -> Result<()> {
        let invalid = |option, reason: String| Err(Error::InvalidOption { option, reason });
        if self.num_replicas == 0 {
            return invalid("num_replicas", "must be at least 1".into());
        }
        if self.num_partitions == 0 {
            return invalid("num_partitions", "must be at least 1".into());
        }
        let needed = self.num_replicas.checked_mul(self.num_partitions);
        if needed.is_none_or(|n| n > devices) {
            return invalid(
                "num_replicas",
                format!(
                    "{} replica(s) x {} partition(s) need more than the {devices} device(s) available",
                    self.num_replicas, self.num_partitions
                ),
            );
        }
        if let Some(assignment) = &self.device_assignment {
            if assignment.len() != self.device_count() {
                return invalid(
                    "device_assignment",
                    format!(
                        "has {} entries, expected replicas x partitions = {}",
                        assignment.len(),
                        self.device_count()
                    ),
                );
            }
            if let Some(&bad) = assignment.iter().find(|&&d| d >= devices) {
                return invalid(
                    "device_assignment",
                    format!("device {bad} is out of range ({devices} available)"),
                );
            }
            let mut sorted = assignment.clone();
            sorted.sort_unstable();
            if sorted.windows(2).any(|w| w[0] == w[1]) {
                return invalid("device_assignment", "names a device twice".into());
            }
        }
        Ok(())
    }

    /// The serialized `CompileOptionsProto`; `device_ids` maps our device
    /// indices to PJRT device ids. Call [`CompileOptions::validate`] first.
    pub(crate) fn to_proto(&self, device_ids: &[i64]) -> Vec<u8> {
        let device_assignment = self.device_assignment.as_ref().map(|assignment| {
            let computation_devices = (0..self.num_partitions)
                .map(|p| xla::device_assignment_proto::ComputationDevice {
                    replica_device_ids: (0..self.num_replicas)
                        .map(|r| device_ids[assignment[r * self.num_partitions + p]])
                        .collect(),
                })
                .collect();
            xla::DeviceAssignmentProto {
                replica_count: self.num_replicas as i32,
                computation_count: self.num_partitions as i32,
                computation_devices,
            }
        });
        let build = xla::ExecutableBuildOptionsProto {
            device_ordinal: -1,
            num_replicas: self.num_replicas as i64,
            num_partitions: self.num_partitions as i64,
            use_spmd_partitioning: self.use_spmd_partitioning,
            device_assignment,
            ..Default::default()
        };
        // Every rounding a program asks for happens: without this XLA may
        // keep f32 where a bf16 or f16 result was requested (dropping
        // convert pairs across a fusion), so a fused graph would differ
        // from the same ops run one at a time, and from PyTorch.
        let exact_precision = xla::OptionOverrideProto {
            value: Some(xla::option_override_proto::Value::BoolField(false)),
        };
        xla::CompileOptionsProto {
            executable_build_options: Some(build),
            env_option_overrides: [("xla_allow_excess_precision".to_string(), exact_precision)]
                .into_iter()
                .collect(),
            ..Default::default()
        }
        .encode_to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_replicas_or_partitions_are_rejected() {
        let zero = CompileOptions {
            num_replicas: 0,
            ..Default::default()
        };
        assert!(matches!(
            zero.validate(4),
            Err(Error::InvalidOption {
                option: "num_replicas",
                ..
            })
        ));
        let zero = CompileOptions {
            num_partitions: 0,
            ..Default::default()
        };
        assert!(zero.validate(4).is_err());
    }

    #[test]
    fn assignments_must_fit_the_devices() {
        assert!(CompileOptions::replicated(4).validate(2).is_err());
        assert!(CompileOptions::on_device(3).validate(2).is_err());
        let twice = CompileOptions {
            num_replicas: 2,
            device_assignment: Some(vec![1, 1]),
            ..Default::default()
        };
        assert!(twice.validate(2).is_err());
        assert!(CompileOptions::replicated(2).validate(2).is_ok());
    }

    #[test]
    fn proto_carries_replicas_and_assignment() {
        let opts = CompileOptions {
            num_replicas: 2,
            device_assignment: Some(vec![1, 0]),
            ..Default::default()
        };
        let proto = xla::CompileOptionsProto::decode(&opts.to_proto(&[10, 11])[..]).unwrap();
        let build = proto.executable_build_options.unwrap();
        assert_eq!((build.num_replicas, build.num_partitions), (2, 1));
        let assignment = build.device_assignment.unwrap();
        assert_eq!(
            assignment.computation_devices[0].replica_device_ids,
            vec![11, 10]
        );
        // Requested roundings are kept (fused graphs equal op-by-op runs).
        let precision = &proto.env_option_overrides["xla_allow_excess_precision"];
        assert_eq!(
            precision.value,
            Some(xla::option_override_proto::Value::BoolField(false))
        );
    }
}
