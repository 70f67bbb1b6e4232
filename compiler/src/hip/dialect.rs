//! The HIP dialect: everything AMD-specific the HIP emitters need, in one
//! place — the targets, the wavefront width, the matrix instruction and its
//! operand types, the local-memory limits.

use crate::Elem;

/// Lanes per wavefront on CDNA GPUs (gfx90a, gfx94x). The templates read it as
/// `WAVE`; nothing assumes 32.
pub const WAVE_SIZE: u32 = 64;

/// LDS one workgroup may allocate on CDNA2/CDNA3.
pub const MAX_LDS_BYTES: u32 = 64 * 1024;

/// Vector registers per lane (VGPRs and AGPRs together) on CDNA2/CDNA3.
pub const MAX_REGISTERS_PER_LANE: u32 = 512;

/// An AMD GPU architecture the HIP templates are generated and compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gfx {
    /// CDNA2: MI210, MI250, MI250X (per GCD: 104 or 110 CUs, 1.6 TB/s HBM2e).
    Gfx90a,
    /// CDNA3: MI300X (304 CUs, 5.3 TB/s HBM3).
    Gfx942,
}

impl Gfx {
    /// The LLVM processor name (`--offload-arch`, `--mcpu`).
    pub fn name(self) -> &'static str {
        match self {
            Gfx::Gfx90a => "gfx90a",
            Gfx::Gfx942 => "gfx942",
        }
    }

    /// The architecture of a library target (`mi250`, `mi300x`), or of its
    /// processor name.
    pub fn for_target(target: &str) -> Option<Gfx> {
        match target {
            "mi250" | "mi250x" | "mi210" | "gfx90a" => Some(Gfx::Gfx90a),
            "mi300x" | "mi300" | "gfx942" => Some(Gfx::Gfx942),
            _ => None,
        }
    }
}

/// The matrix instruction of an element type: `v_mfma_f32_16x16x16{suffix}`
/// through its clang builtin. One shape for both targets: gfx90a and gfx94x
/// both have the 16x16x16 bf16 (`_1k`) and f16 forms with the same lane layout.
pub fn mfma(elem: Elem) -> (&'static str, &'static str) {
    match elem {
        Elem::Bf16 => ("bf16_1k", "__builtin_amdgcn_mfma_f32_16x16x16bf16_1k"),
        Elem::F16 => ("f16", "__builtin_amdgcn_mfma_f32_16x16x16f16"),
    }
}

/// Which prelude a HIP source is rendered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HipPrelude {
    /// The real target: clang's AMDGPU builtins (MFMA, `ds_bpermute`,
    /// `s_barrier`), no HIP headers needed.
    Amdgcn,
    /// Standard C++20 for the CPU: work-items as threads, MFMA as a reference
    /// routine on the documented lane layout. For checking the template's
    /// index arithmetic and online normalisation where no AMD GPU exists.
    CpuEmulation,
}

impl HipPrelude {
    /// What a source rendered with this prelude is for, in its header comment.
    pub fn target_label(self, gfx: Gfx) -> String {
        match self {
            HipPrelude::Amdgcn => gfx.name().to_string(),
            HipPrelude::CpuEmulation => format!("the CPU emulation of {}", gfx.name()),
        }
    }
}

/// What every HIP template's header comment and preludes read (as `h.…`):
/// the generator's version, the variant and entry point, the target label,
/// the prelude, the element type and its MFMA builtin, the wave width.
pub(crate) struct HipHeader<'a> {
    pub version: &'static str,
    pub variant: &'a str,
    pub kernel_name: &'a str,
    pub target: String,
    pub emulate: bool,
    pub elem: &'static str,
    pub f16: bool,
    pub mfma_suffix: &'static str,
    pub mfma_builtin: &'static str,
    pub wave_size: u32,
}

impl<'a> HipHeader<'a> {
    pub(crate) fn new(
        variant: &'a str,
        kernel_name: &'a str,
        elem: Elem,
        gfx: Gfx,
        prelude: HipPrelude,
    ) -> HipHeader<'a> {
        let (mfma_suffix, mfma_builtin) = mfma(elem);
        HipHeader {
            version: env!("CARGO_PKG_VERSION"),
            variant,
            kernel_name,
            target: prelude.target_label(gfx),
            emulate: prelude == HipPrelude::CpuEmulation,
            elem: elem.name(),
            f16: elem == Elem::F16,
            mfma_suffix,
            mfma_builtin,
            wave_size: WAVE_SIZE,
        }
    }
}
