//! The CUDA dialect: everything target-specific the emitters need, in one place.

/// Element type of q, k, v and o in memory (bf16 unless asked otherwise).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Elem {
    #[default]
    Bf16,
    F16,
}

impl Elem {
    pub fn c_type(self) -> &'static str {
        match self {
            Elem::Bf16 => "__nv_bfloat16",
            Elem::F16 => "__half",
        }
    }

    /// The PTX type suffix of `mma.sync` operands.
    pub fn mma_type(self) -> &'static str {
        match self {
            Elem::Bf16 => "bf16",
            Elem::F16 => "f16",
        }
    }

    /// Bytes per element.
    pub fn bytes(self) -> u32 {
        2
    }

    pub fn name(self) -> &'static str {
        match self {
            Elem::Bf16 => "bf16",
            Elem::F16 => "f16",
        }
    }
}

/// The instruction set a kernel is generated for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Isa {
    /// `mma.sync`, `ldmatrix`, `cp.async`: every GPU from sm_80 on.
    #[default]
    Sm80,
    /// Hopper with its architecture-specific features (`wgmma`): sm_90a only.
    Sm90a,
}

impl Isa {
    /// The instruction set for an NVRTC architecture name (`sm_90a`, `sm_80`, …).
    pub fn for_arch(arch: &str) -> Isa {
        if arch == "sm_90a" {
            Isa::Sm90a
        } else {
            Isa::Sm80
        }
    }

    /// The NVRTC architecture name of the instruction set's builds (also
    /// the `target` of tuning keys): `sm_80`, `sm_90a`.
    pub fn arch(self) -> &'static str {
        match self {
            Isa::Sm80 => "sm_80",
            Isa::Sm90a => "sm_90a",
        }
    }

    /// Shared memory one thread block may use (static and dynamic): 163 KiB
    /// on sm_80 (A100), 227 KiB on sm_90 (H100, H200).
    /// Shared memory of one multiprocessor, less the 1 KiB the driver
    /// reserves per resident block, for `blocks` resident blocks: what their
    /// dynamic allocations may add up to.
    pub fn smem_per_sm(self, blocks: u32) -> u32 {
        let total = match self {
            Isa::Sm80 => 164 * 1024,
            Isa::Sm90a => 228 * 1024,
        };
        total - blocks * 1024
    }

    pub fn max_dynamic_smem(self) -> u32 {
        match self {
            Isa::Sm80 => 163 * 1024,
            Isa::Sm90a => 227 * 1024,
        }
    }
}

/// Lanes per warp on NVIDIA GPUs. Kept here, never written as a literal in
/// templates or emitters, so the HIP dialect can say 64.
pub const WARP_SIZE: u32 = 32;

/// Spellings of the element type in the templates' prelude.
#[derive(Debug, Clone, Copy)]
pub struct ElemSpelling {
    pub header: &'static str,
    /// The C type (`elem_t`).
    pub c_type: &'static str,
    /// The PTX type suffix of `mma.sync` operands.
    pub mma_type: &'static str,
    pub pack2_body: &'static str,
    pub to_f32: &'static str,
    pub from_f32: &'static str,
}

pub fn elem_spelling(elem: Elem) -> ElemSpelling {
    let (c_type, mma_type) = (elem.c_type(), elem.mma_type());
    match elem {
        Elem::Bf16 => ElemSpelling {
            header: "cuda_bf16.h",
            c_type,
            mma_type,
            pack2_body: "__nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);\n    return *reinterpret_cast<unsigned*>(&v);",
            to_f32: "__bfloat162float",
            from_f32: "__float2bfloat16",
        },
        Elem::F16 => ElemSpelling {
            header: "cuda_fp16.h",
            c_type,
            mma_type,
            pack2_body: "__half2 v = __floats2half2_rn(lo, hi);\n    return *reinterpret_cast<unsigned*>(&v);",
            to_f32: "__half2float",
            from_f32: "__float2half",
        },
    }
}
