//! Fused scaled dot-product attention on tensor cores (the attention family, sm_80 and newer).
//!
//! `out = softmax(scale · q·kᵀ) · v` for each of `heads` independent heads (batch × heads,
//! flattened), with `q`, `out` of `[heads, seq_q, D]` and `k`, `v` of `[heads, seq_k, D]`, all
//! contiguous, in f16 or bf16. Each block takes 64 queries of one head and walks the keys in
//! tiles of 64: the scores of a tile live in registers in f32, an online softmax rescales the
//! running output as each tile's maximum grows, and the `[seq_q, seq_k]` matrix never exists in
//! memory. Beside `out` the kernel writes each query's log-sum-exp (natural log, f32), from which
//! a backward recomputes the probabilities.
//!
//! The products run on `mma.sync.m16n8k16` (f32 accumulators), fed by `ldmatrix` from shared
//! memory that `cp.async` fills while the previous product runs; the shared-memory rows are
//! XOR-swizzled so that neither the copies nor `ldmatrix` meet bank conflicts. See
//! `device::flash` for the tile walk.
#[cfg(not(target_arch = "nvptx64"))]
use crate::names::AttentionKernels;

macro_rules! attention_family {
    (
        $(#[$table_doc:meta])*
        $table:ident, $elem:ty, {
            forward_d64: $f64:ident,
            forward_d128: $f128:ident $(,)?
        }
    ) => {
        $(#[$table_doc])*
        #[cfg(not(target_arch = "nvptx64"))]
        pub const $table: AttentionKernels = AttentionKernels { forward_d64: $f64, forward_d128: $f128 };

        // The head size, then its unroll counts: D / 16, D / 32, D / 16 (see `device::flash`).
        attention_family!(@forward $f64, $elem, 64, 4, 2, 4);
        attention_family!(@forward $f128, $elem, 128, 8, 4, 8);
    };

    (@forward $name:ident, $elem:ty, $d:literal, $k_steps:literal, $k_pairs:literal, $loads:literal) => {
        crate::kernel! {
            #[doc = concat!("The attention forward for head_dim ", stringify!($d), ".")]
            ///
            /// `out[h, i] = Σ_j softmax_j(scale · q[h, i]·k[h, j]) · v[h, j]` and
            /// `lse[h, i] = ln Σ_j exp(scale · q[h, i]·k[h, j])`, the sums over the keys `j`
            /// query `i` may see: all `seq_k` of them, or with `causal != 0` those with `j <= i`
            /// (top-left aligned). A query that sees no key gets zeros and `lse = -inf`.
            /// `scale_log2` is `scale · log2(e)`.
            ///
            /// Launch with 128 threads per block (four warps of 16 queries) and
            /// `heads · ceil(seq_q / 64)` blocks. It holds one 64-row tile each of `q`, `k` and
            /// `v` in static shared memory: `3 · 64 · D · 2` bytes (48 KiB at D = 128).
            ///
            /// # Safety
            /// `q` and `out` are valid for `heads · seq_q · D` elements, `k` and `v` for
            /// `heads · seq_k · D`, `lse` for `heads · seq_q` f32; every buffer is 16-byte
            /// aligned; `out` and `lse` overlap nothing else. The block is 128 threads.
            pub unsafe fn $name(
                q: *const [$elem; heads * seq_q * $d],
                k: *const [$elem; heads * seq_k * $d],
                v: *const [$elem; heads * seq_k * $d],
                out: *mut [$elem; heads * seq_q * $d],
                lse: *mut [f32; heads * seq_q],
                heads: u32,
                seq_q: u32,
                seq_k: u32,
                scale_log2: f32,
                causal: u32,
            ) {
                // SAFETY: the kernel's contract is `forward`'s.
                unsafe {
                    crate::device::flash::forward::<$elem, $d, $k_steps, $k_pairs, $loads>(
                        q, k, v, out, lse, heads, seq_q, seq_k, scale_log2, causal != 0,
                    )
                }
            }
        }
    };
}

attention_family! {
    /// The f16 attention kernels.
    F16, crate::dtype::F16, { forward_d64: attention_forward_d64_f16, forward_d128: attention_forward_d128_f16 }
}
attention_family! {
    /// The bf16 attention kernels.
    BF16, crate::dtype::Bf16, { forward_d64: attention_forward_d64_bf16, forward_d128: attention_forward_d128_bf16 }
}
