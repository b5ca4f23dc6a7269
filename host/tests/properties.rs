//! Property tests on the CPU: random lengths (0 and primes included), offsets, dtypes and values
//! (±0, subnormals, ±inf and NaN included), every op against an f64 reference, 10,500 cases.
mod common;

use common::{Op, dtype_strategy, length_strategy, run_case, seeds_strategy, tensor, values};
use opsmith_host::{DType, Device};
use proptest::prelude::*;

const CASES_PER_OP: u32 = 1500;

macro_rules! property {
    ($name:ident, $op:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig { cases: CASES_PER_OP, ..ProptestConfig::default() })]
            #[test]
            fn $name(dtype in dtype_strategy(), n in length_strategy(), offset in 0usize..5, seeds in seeds_strategy()) {
                run_case(Device::Cpu, $op, dtype, n, offset, &seeds);
            }
        }
    };
}

property!(add_matches_f64, Op::Add);
property!(sub_matches_f64, Op::Sub);
property!(div_matches_f64, Op::Div);
property!(mul_matches_f64, Op::Mul);
property!(affine_matches_f64, Op::Affine);
property!(fused_mul_add_matches_f64, Op::FusedMulAdd);
property!(add_mul_matches_f64, Op::AddMul);
property!(add_mul_backward_matches_f64, Op::AddMulBackward);
property!(add_mul_backward_uniform_matches_f64, Op::AddMulBackwardUniform);
property!(add_mul_backward_split_matches_f64, Op::AddMulBackwardSplit);
property!(add_mul_backward_split_uniform_matches_f64, Op::AddMulBackwardSplitUniform);

/// IEEE 754 specials, spelled out: NaN in, NaN out; inf·0 = NaN; inf − inf = NaN; inf + finite = inf.
#[test]
fn nan_and_inf_propagate() {
    let inf = f64::INFINITY;
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::F64] {
        let t = |v: &[f64]| tensor(v, dtype, Device::Cpu).unwrap();
        let a = t(&[f64::NAN, inf, inf, inf, -0.0, 1.0]);
        let b = t(&[1.0, 0.0, -inf, 2.0, 0.0, -0.0]);
        let c = t(&[1.0, 1.0, 1.0, -inf, -0.0, 0.0]);
        let fma = values(&opsmith_host::ops::fused_mul_add(&a, &b, &c).unwrap()).unwrap();
        assert!(fma[0].is_nan() && fma[1].is_nan() && fma[2] == -inf && fma[3].is_nan(), "{dtype}: {fma:?}");
        assert!(fma[4] == 0.0 && fma[4].is_sign_negative(), "-0·0 + -0 = -0 ({dtype}: {fma:?})");
        assert!(fma[5] == 0.0 && fma[5].is_sign_positive(), "1·-0 + 0 = +0 ({dtype}: {fma:?})");
        let sum = values(&opsmith_host::ops::add(&a, &b).unwrap()).unwrap();
        assert!(sum[0].is_nan() && sum[1] == inf && sum[2].is_nan() && sum[3] == inf, "{dtype}: {sum:?}");
    }
}
