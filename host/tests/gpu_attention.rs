//! The GPU suite of attention (`--features gpu-tests`; needs a CUDA device): the shared cases of
//! `attention_cases` on `Device::Cuda(0)` against f64 (f32, f16 and bf16; CUDA has no f64), over
//! NaN-poisoned output memory, and the CUDA results against the CPU's on the same inputs.
mod attention_cases;

use opsmith_host::Device;

const GPU: Device = Device::Cuda(0);

attention_cases!(GPU);

#[test]
fn cuda_matches_cpu() -> opsmith_host::Result<()> {
    attention_cases::devices_agree(GPU, Device::Cpu)
}
