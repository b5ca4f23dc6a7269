//! Optimizer steps on the CPU: the shared cases (`common/optim.rs`).
mod common;

use opsmith_host::Device;

optim_cases!(Device::Cpu);
