//! What the scheduler knows about a GPU: capacities that decide whether a
//! tile configuration fits, and the rates the cost model ranks with. One
//! entry per product we target; [`DeviceConfig::detect`] maps a device the
//! runtime found onto one (or a generic entry built from what it reports).

use crate::Isa;
use crate::hip::dialect::Gfx;
use serde::Serialize;

/// The instruction set kernels for a device are generated for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Target {
    Cuda(#[serde(serialize_with = "isa_name")] Isa),
    Hip(#[serde(serialize_with = "gfx_name")] Gfx),
}

fn isa_name<S: serde::Serializer>(isa: &Isa, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(isa.arch())
}

fn gfx_name<S: serde::Serializer>(gfx: &Gfx, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(gfx.name())
}

impl Target {
    /// The architecture name (`sm_90a`, `gfx942`, …): part of tuning keys.
    pub fn name(self) -> &'static str {
        match self {
            Target::Cuda(isa) => isa.arch(),
            Target::Hip(gfx) => gfx.name(),
        }
    }
}

/// Hardware features a template may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Features {
    /// Asynchronous global → shared copies (`cp.async`; on AMD none: loads
    /// go through registers).
    pub async_copy: bool,
    /// The Tensor Memory Accelerator (`cp.async.bulk.tensor`).
    pub tma: bool,
    /// Warpgroup MMA (`wgmma.mma_async`) and `setmaxnreg`.
    pub wgmma: bool,
}

/// One GPU (for AMD MI250: one GCD, which the runtime sees as a device).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DeviceConfig {
    /// Short name, as `aec compile --target` spells it (`h100`, `mi300x`).
    pub name: &'static str,
    pub target: Target,
    /// Streaming multiprocessors (NVIDIA) or compute units (AMD).
    pub sms: u32,
    /// Lanes per warp or wavefront.
    pub warp_size: u32,
    /// 32-bit registers of one multiprocessor.
    pub regs_per_sm: u32,
    /// The most registers one thread may use (AMD: VGPRs and AGPRs together).
    pub regs_per_thread: u32,
    /// Shared memory (LDS) one block may allocate, bytes.
    pub smem_per_block: u32,
    /// Shared memory (LDS) of one multiprocessor, bytes.
    pub smem_per_sm: u32,
    /// The most threads one block may have.
    pub threads_per_block: u32,
    /// The most resident threads per multiprocessor.
    pub threads_per_sm: u32,
    /// The MMA instruction's base tile (m, n, k) for 16-bit inputs: every
    /// tile dimension the scheduler enumerates is a multiple of it.
    pub mma_tile: (u32, u32, u32),
    pub features: Features,
    /// Clock for the model, GHz.
    pub clock_ghz: f64,
    /// Dense 16-bit tensor throughput, TFLOP/s.
    pub peak_tflops: f64,
    /// DRAM bandwidth, GB/s.
    pub dram_gbs: f64,
    /// L2 (NVIDIA) or last-level cache (AMD: Infinity Cache) bytes.
    pub l2_bytes: u64,
    /// The bandwidth K/V tiles stream at from L2 (or the last-level cache)
    /// into the multiprocessors, all of them together, GB/s. H100 and H200
    /// (one die): fitted to the forward's measured times at small grids on
    /// an H100 (bench/NOTES.md, session 43); the others 2.5× their DRAM
    /// bandwidth, unmeasured.
    pub l2_gbs: f64,
    /// Shared memory (LDS) bandwidth of one multiprocessor, bytes per clock.
    pub smem_bytes_per_clk: u32,
    /// Transcendental (`ex2`, `tanh`) results per clock per multiprocessor.
    pub sfu_per_clk: u32,
}

impl DeviceConfig {
    /// Dense 16-bit tensor FLOPs per clock of one multiprocessor.
    pub fn flops_per_clk_per_sm(&self) -> f64 {
        self.peak_tflops * 1e12 / (self.sms as f64 * self.clock_ghz * 1e9)
    }

    /// The entry for a product name (`a100`, `h100`, `h200`, `mi250`,
    /// `mi300x`, also their architectures `sm_80`, `sm_90a`, `gfx90a`,
    /// `gfx942`).
    pub fn named(name: &str) -> Option<DeviceConfig> {
        let lower = name.to_ascii_lowercase();
        let key = match lower.as_str() {
            "sm_80" | "a100" => "a100",
            "sm_90" | "sm_90a" | "h100" => "h100",
            "gfx90a" | "mi250" | "mi250x" => "mi250",
            "gfx942" | "mi300x" => "mi300x",
            other => other,
        };
        known().into_iter().find(|d| d.name == key)
    }

    /// The entry for a CUDA device the runtime found: by its name (`NVIDIA
    /// H100 80GB HBM3` → `h100`), else a generic entry from its compute
    /// capability with its own multiprocessor count and shared memory.
    pub fn detect(device_name: &str, compute_capability: (u32, u32), sms: u32) -> DeviceConfig {
        let lower = device_name.to_ascii_lowercase();
        let by_name = ["h200", "h100", "a100"]
            .into_iter()
            .find(|n| lower.contains(n))
            .and_then(DeviceConfig::named);
        if let Some(mut d) = by_name {
            // Cut-down parts (PCIe, NVL) have fewer multiprocessors.
            if sms > 0 && sms != d.sms {
                d.peak_tflops *= sms as f64 / d.sms as f64;
                d.l2_gbs *= sms as f64 / d.sms as f64;
                d.sms = sms;
            }
            return d;
        }
        let mut d = if compute_capability.0 >= 9 {
            h100()
        } else {
            a100()
        };
        d.name = "generic";
        if compute_capability != (9, 0) {
            // Only sm_90 has the `a` features this crate uses.
            d.target = Target::Cuda(Isa::Sm80);
            d.features.wgmma = false;
            d.features.tma = compute_capability.0 >= 9;
        }
        if sms > 0 {
            d.peak_tflops *= sms as f64 / d.sms as f64;
            d.l2_gbs *= sms as f64 / d.sms as f64;
            d.sms = sms;
        }
        d
    }
}

/// Every product with an entry.
pub fn known() -> Vec<DeviceConfig> {
    vec![a100(), h100(), h200(), mi250(), mi300x()]
}

fn a100() -> DeviceConfig {
    DeviceConfig {
        name: "a100",
        target: Target::Cuda(Isa::Sm80),
        sms: 108,
        warp_size: 32,
        regs_per_sm: 65536,
        regs_per_thread: 255,
        smem_per_block: Isa::Sm80.max_dynamic_smem(),
        smem_per_sm: Isa::Sm80.smem_per_sm(0),
        threads_per_block: 1024,
        threads_per_sm: 2048,
        mma_tile: (16, 8, 16),
        features: Features {
            async_copy: true,
            tma: false,
            wgmma: false,
        },
        clock_ghz: 1.41,
        peak_tflops: 312.0,
        dram_gbs: 2039.0,
        l2_bytes: 40 << 20,
        l2_gbs: 5100.0,
        smem_bytes_per_clk: 128,
        sfu_per_clk: 64,
    }
}

fn h100() -> DeviceConfig {
    DeviceConfig {
        name: "h100",
        target: Target::Cuda(Isa::Sm90a),
        sms: 132,
        warp_size: 32,
        regs_per_sm: 65536,
        regs_per_thread: 255,
        smem_per_block: Isa::Sm90a.max_dynamic_smem(),
        smem_per_sm: Isa::Sm90a.smem_per_sm(0),
        threads_per_block: 1024,
        threads_per_sm: 2048,
        mma_tile: (64, 8, 16),
        features: Features {
            async_copy: true,
            tma: true,
            wgmma: true,
        },
        clock_ghz: 1.83,
        peak_tflops: 989.0,
        dram_gbs: 3350.0,
        l2_bytes: 50 << 20,
        l2_gbs: 11700.0,
        smem_bytes_per_clk: 128,
        sfu_per_clk: 64,
    }
}

fn h200() -> DeviceConfig {
    DeviceConfig {
        name: "h200",
        dram_gbs: 4800.0,
        ..h100()
    }
}

/// One GCD of an MI250 (the runtime sees each GCD as a device).
fn mi250() -> DeviceConfig {
    DeviceConfig {
        name: "mi250",
        target: Target::Hip(Gfx::Gfx90a),
        sms: 104,
        warp_size: 64,
        // 4 SIMDs × 512 VGPRs (incl. AGPRs) × 64 lanes.
        regs_per_sm: 4 * 512 * 64,
        regs_per_thread: 512,
        smem_per_block: 64 * 1024,
        smem_per_sm: 64 * 1024,
        threads_per_block: 1024,
        threads_per_sm: 2048,
        mma_tile: (16, 16, 16),
        features: Features {
            async_copy: false,
            tma: false,
            wgmma: false,
        },
        clock_ghz: 1.7,
        peak_tflops: 181.0,
        dram_gbs: 1600.0,
        l2_bytes: 8 << 20,
        l2_gbs: 4000.0,
        smem_bytes_per_clk: 128,
        sfu_per_clk: 16,
    }
}

fn mi300x() -> DeviceConfig {
    DeviceConfig {
        name: "mi300x",
        target: Target::Hip(Gfx::Gfx942),
        sms: 304,
        clock_ghz: 2.1,
        peak_tflops: 1307.0,
        dram_gbs: 5300.0,
        l2_bytes: 256 << 20,
        l2_gbs: 13250.0,
        ..mi250()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_and_detected_entries() {
        let h100 = DeviceConfig::named("h100").unwrap();
        assert_eq!(h100.sms, 132);
        assert_eq!(h100.target.name(), "sm_90a");
        // ~4096 dense bf16 FLOP per clock per SM.
        assert!((h100.flops_per_clk_per_sm() - 4094.0).abs() < 10.0);
        assert_eq!(DeviceConfig::named("gfx942").unwrap().name, "mi300x");
        assert_eq!(DeviceConfig::named("mi250").unwrap().warp_size, 64);
        assert!(DeviceConfig::named("v100").is_none());

        let h200 = DeviceConfig::detect("NVIDIA H200", (9, 0), 132);
        assert_eq!((h200.name, h200.dram_gbs), ("h200", 4800.0));
        let pcie = DeviceConfig::detect("NVIDIA H100 PCIe", (9, 0), 114);
        assert_eq!(pcie.sms, 114);
        assert!(pcie.peak_tflops < h100.peak_tflops);
        let ada = DeviceConfig::detect("NVIDIA L40S", (8, 9), 142);
        assert_eq!(
            (ada.name, ada.target, ada.features.wgmma),
            ("generic", Target::Cuda(Isa::Sm80), false)
        );
    }
}
