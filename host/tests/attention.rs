//! The CPU suite of attention (`ops::attention`, `attention_with_lse`, `attention_weights`): the
//! shared cases of `attention_cases` on `Device::Cpu`, every dtype against an f64 reference.
mod attention_cases;

use opsmith_host::Device;

attention_cases!(Device::Cpu);
