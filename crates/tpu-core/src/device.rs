//! Devices as users name them: `cpu` (the host reference device) and `tpu:N`.

use std::fmt;
use std::str::FromStr;

/// Where a tensor lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    /// The host reference device: runs each op's CPU reference.
    Cpu,
    /// Device `N` of the PJRT runtime (a TPU, or whatever plugin stands in).
    Tpu(usize),
}

impl Device {
    /// `tpu:index`.
    pub fn tpu(index: usize) -> Device {
        Device::Tpu(index)
    }

    /// The host reference device.
    pub fn cpu() -> Device {
        Device::Cpu
    }

    /// True for PJRT devices.
    pub fn is_tpu(self) -> bool {
        matches!(self, Device::Tpu(_))
    }
}

impl Default for Device {
    /// The best device available: `tpu:0` when a PJRT plugin loads and
    /// gives a client, else `cpu`.
    fn default() -> Device {
        if crate::Runtime::global().is_ok() {
            Device::Tpu(0)
        } else {
            Device::Cpu
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Tpu(n) => write!(f, "tpu:{n}"),
        }
    }
}

/// A device string that is neither `cpu`, `tpu` nor `tpu:N`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown device `{0}`: expected `cpu`, `tpu` or `tpu:N`")]
pub struct ParseDeviceError(String);

impl FromStr for Device {
    type Err = ParseDeviceError;

    fn from_str(s: &str) -> Result<Device, ParseDeviceError> {
        match s {
            "cpu" => Ok(Device::Cpu),
            "tpu" => Ok(Device::Tpu(0)),
            _ => s
                .strip_prefix("tpu:")
                .and_then(|n| n.parse().ok())
                .map(Device::Tpu)
                .ok_or_else(|| ParseDeviceError(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for d in [Device::Cpu, Device::Tpu(0), Device::Tpu(7)] {
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
        }
        assert_eq!("tpu".parse::<Device>(), Ok(Device::Tpu(0)));
        assert!("cuda:0".parse::<Device>().is_err());
        assert!("tpu:x".parse::<Device>().is_err());
    }
}
