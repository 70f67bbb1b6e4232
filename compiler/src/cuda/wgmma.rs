//! Hopper warpgroup MMA (`wgmma.mma_async`, sm_90a) as device functions.
//!
//! The instruction names every accumulator register, so each `N` needs its own
//! inline-assembly statement with `N / 2` operands; writing them by hand would
//! be error-prone, so they are generated here for the sizes a kernel uses.
//!
//! Shared-memory operands are 128-byte-swizzled tiles stored as panels of 64
//! columns (one 128-byte row per tile row, eight rows per 1024-byte swizzle
//! atom): the layout `wgmma` reads through a matrix descriptor (PTX ISA,
//! "Shared Memory Matrix Layout"). The template's `sw128_*` helpers write it.

use super::dialect::Elem;
use std::fmt::Write;

/// Columns per 128-byte swizzle panel of a 16-bit element tile.
pub const PANEL_COLS: u32 = 64;

/// The largest `N` of one `wgmma.mma_async` instruction.
pub const MAX_N: u32 = 256;

/// The operand forms of one `wgmma.mma_async` device function.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// `wgmma_ss_n{N}(d, desc_a, desc_b, accumulate)`: A and B in shared
    /// memory, both K-major (`D (+)= A · Bᵀ`).
    Ss,
    /// `wgmma_ss_tt_n{N}(d, desc_a, desc_b, accumulate)`: A in shared memory
    /// M-major, B in shared memory N-major (`D (+)= A · B` with both stored
    /// transposed: rows of the tiles are the K dimension).
    SsTransposed,
    /// `wgmma_ssn_n{N}(d, desc_a, desc_b, accumulate)`: A in shared memory
    /// K-major, B in shared memory N-major (`D (+)= A · B` with B's rows the
    /// K dimension).
    SsNMajor,
    /// `wgmma_ssm_n{N}(d, desc_a, desc_b, accumulate)`: A in shared memory
    /// M-major, B in shared memory K-major (`D (+)= A · Bᵀ` with A's rows the
    /// K dimension).
    SsMMajor,
    /// `wgmma_rsk_n{N}(d, a, desc_b, accumulate)`: A in registers, B in
    /// shared memory K-major (`D (+)= A · Bᵀ`).
    RsKMajor,
    /// `wgmma_rs_n{N}(d, a, desc_b)`: A in registers, B in shared memory
    /// N-major (`D += A · B`).
    RsNMajor,
}

/// The device functions for each `(N, form)` a kernel uses, plus
/// `wgmma_fence_operands_n{N}` per `N`. A in registers is the `mma.sync`
/// m16n8k16 A-fragment layout per warp; accumulators are `float d[N / 8][4]`,
/// the layout of `N / 8` side-by-side `mma.sync` m16n8 accumulators per warp.
pub fn wgmma_fns(elem: Elem, uses: &[(u32, Form)]) -> String {
    let ty = elem.mma_type();
    let mut out = String::new();
    let mut sizes: Vec<u32> = uses.iter().map(|u| u.0).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for &n in &sizes {
        // Keeps the compiler from moving reads of the accumulators above the
        // wait that makes them valid.
        let _ = writeln!(
            out,
            "__device__ __forceinline__ void wgmma_fence_operands_n{n}(float (&d)[{}][4]) {{\n#pragma unroll\n    for (int i = 0; i < {}; ++i)\n#pragma unroll\n        for (int c = 0; c < 4; ++c) asm volatile(\"\" : \"+f\"(d[i][c])::\"memory\");\n}}\n",
            n / 8,
            n / 8
        );
        for form in [
            Form::Ss,
            Form::SsTransposed,
            Form::SsNMajor,
            Form::SsMMajor,
            Form::RsKMajor,
            Form::RsNMajor,
        ] {
            if uses.contains(&(n, form)) {
                out.push_str(&wgmma_fn(ty, n, form));
            }
        }
    }
    out
}

fn wgmma_fn(ty: &str, n: u32, form: Form) -> String {
    assert!(
        n.is_multiple_of(8) && (8..=MAX_N).contains(&n),
        "wgmma N must be a multiple of 8 in 8..=256, got {n}"
    );
    let nreg = n / 2;
    let d_list = (0..nreg)
        .map(|i| format!("%{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let outputs = (0..nreg)
        .map(|i| format!("\"+f\"(d[{}][{}])", i / 4, i % 4))
        .collect::<Vec<_>>()
        .join(", ");
    let rows = n / 8;
    let mut f = String::new();
    match form {
        Form::Ss | Form::SsTransposed | Form::SsNMajor | Form::SsMMajor => {
            // Operands: d…, desc_a, desc_b, accumulate (0: D = A·B).
            let (a, b, sd) = (nreg, nreg + 1, nreg + 2);
            let (name, trans) = match form {
                Form::Ss => ("ss", "0, 0"),
                Form::SsTransposed => ("ss_tt", "1, 1"),
                Form::SsMMajor => ("ssm", "1, 0"),
                _ => ("ssn", "0, 1"),
            };
            let _ = writeln!(
                f,
                "__device__ __forceinline__ void wgmma_{name}_n{n}(float (&d)[{rows}][4], unsigned long long desc_a, unsigned long long desc_b, int accumulate) {{"
            );
            let _ = writeln!(
                f,
                "    asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sd}, 0;\\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{d_list}}}, %{a}, %{b}, p, 1, 1, {trans};\\n}}\\n\""
            );
            let _ = writeln!(f, "        : {outputs}");
            let _ = writeln!(
                f,
                "        : \"l\"(desc_a), \"l\"(desc_b), \"r\"(accumulate));"
            );
        }
        Form::RsKMajor | Form::RsNMajor => {
            // Operands: d…, a0..a3, desc_b, accumulate.
            let (a0, b, sd) = (nreg, nreg + 4, nreg + 5);
            let (name, tnsp_b, acc_param, acc_arg) = if form == Form::RsNMajor {
                ("rs", 1, "", "1")
            } else {
                ("rsk", 0, ", int accumulate", "accumulate")
            };
            let _ = writeln!(
                f,
                "__device__ __forceinline__ void wgmma_{name}_n{n}(float (&d)[{rows}][4], const unsigned (&a)[4], unsigned long long desc_b{acc_param}) {{"
            );
            let _ = writeln!(
                f,
                "    asm volatile(\"{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{sd}, 0;\\nwgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty} {{{d_list}}}, {{%{a0}, %{}, %{}, %{}}}, %{b}, p, 1, 1, {tnsp_b};\\n}}\\n\"",
                a0 + 1,
                a0 + 2,
                a0 + 3
            );
            let _ = writeln!(f, "        : {outputs}");
            let _ = writeln!(
                f,
                "        : \"r\"(a[0]), \"r\"(a[1]), \"r\"(a[2]), \"r\"(a[3]), \"l\"(desc_b), \"r\"({acc_arg}));"
            );
        }
    }
    f.push_str("}\n\n");
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_are_numbered_in_order() {
        let s = wgmma_fns(Elem::Bf16, &[(64, Form::Ss), (128, Form::RsNMajor)]);
        // n64 SS: 32 accumulators, then desc_a %32, desc_b %33, scale %34.
        assert!(s.contains("setp.ne.b32 p, %34, 0"), "{s}");
        assert!(s.contains("m64n64k16.f32.bf16.bf16 {%0, %1,"), "{s}");
        assert!(s.contains("%31}, %32, %33, p, 1, 1, 0, 0;"), "{s}");
        // n128 RS: 64 accumulators, a at %64..%67, desc_b %68, scale %69,
        // N-major B (the last immediate).
        assert!(s.contains("{%64, %65, %66, %67}, %68, p, 1, 1, 1;"), "{s}");
        assert!(s.contains("setp.ne.b32 p, %69, 0"), "{s}");
        assert!(s.contains("\"+f\"(d[15][3])"), "{s}");
        assert!(!s.contains("d[16]"), "{s}");
    }

    #[test]
    fn register_a_with_k_major_b_takes_an_accumulate_flag() {
        let s = wgmma_fns(Elem::Bf16, &[(64, Form::RsKMajor)]);
        // 32 accumulators, a at %32..%35, desc_b %36, accumulate %37,
        // K-major B (the last immediate 0).
        assert!(s.contains("{%32, %33, %34, %35}, %36, p, 1, 1, 0;"), "{s}");
        assert!(s.contains("setp.ne.b32 p, %37, 0"), "{s}");
        assert!(s.contains("int accumulate"), "{s}");
    }

    #[test]
    fn shared_a_with_n_major_b_transposes_b_only() {
        let s = wgmma_fns(Elem::Bf16, &[(64, Form::SsNMajor)]);
        assert!(s.contains("void wgmma_ssn_n64("), "{s}");
        assert!(s.contains("%31}, %32, %33, p, 1, 1, 0, 1;"), "{s}");
        assert!(!s.contains("wgmma_ss_n64"), "{s}");
    }

    #[test]
    fn m_major_a_with_shared_k_major_b_transposes_a_only() {
        let s = wgmma_fns(Elem::Bf16, &[(80, Form::SsMMajor)]);
        // 40 accumulators, desc_a %40, desc_b %41, accumulate %42.
        assert!(s.contains("void wgmma_ssm_n80("), "{s}");
        assert!(s.contains("%39}, %40, %41, p, 1, 1, 1, 0;"), "{s}");
        assert!(s.contains("m64n80k16"), "{s}");
    }

    #[test]
    fn each_size_is_emitted_once() {
        let s = wgmma_fns(
            Elem::F16,
            &[(128, Form::Ss), (128, Form::Ss), (128, Form::RsNMajor)],
        );
        assert_eq!(s.matches("void wgmma_ss_n128(").count(), 1);
        assert_eq!(s.matches("void wgmma_rs_n128(").count(), 1);
        assert_eq!(s.matches("void wgmma_fence_operands_n128(").count(), 1);
        assert!(!s.contains("wgmma_rsk_"));
        assert!(s.contains(".f32.f16.f16"));
    }
}
