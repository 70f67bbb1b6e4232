//! Level 1 of the search: the tile configurations of a kernel, enumerated
//! from multiples of the device's MMA base tile, each checked by the
//! template's own rules and placed by level 2 ([`super::intermediate`]).
//! Every configuration that does not fit is kept with the reason, so a
//! tuning report can say what was rejected and why.

use super::cost::{Engine, TilePlan};
use super::device::{DeviceConfig, Target};
use super::intermediate::{Budget, IntermediateTensor, Placement, Tier, place};
use crate::cuda::forward::{
    WS_STATIC_SMEM, check_config as check_forward_config, smem_bytes as forward_smem_bytes,
    tile_stride, wgmma_dims_ok,
};
use crate::cxx::regions::implies_causal;
use crate::hip::forward::{HipForwardConfig, check_config as check_hip_forward_config, lds_bytes};
use crate::{Elem, ForwardConfig, Isa, combine::combine_plan};
use aec_frontend::Variant;
use aec_frontend::ir::{Axis, Op, Unary};
use serde::Serialize;

/// The sizes of one call: what a plan is searched and ranked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Problem {
    pub b: usize,
    pub h: usize,
    pub hkv: usize,
    pub sq: usize,
    pub skv: usize,
    pub dqk: u32,
    pub dv: u32,
    pub elem: Elem,
}

/// What the cost model needs to know of a variant: facts read off its
/// regions, not its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct VariantFacts {
    /// The mask hides every key after the query (blocks past the diagonal
    /// are not visited).
    pub causal: bool,
    /// A mask is evaluated per score.
    pub masked: bool,
    /// Transcendental operations (exp, log, tanh, …) per score in the score
    /// modification and the online step.
    pub sfu_per_score: u32,
    /// Decoding: the variant fixes `Sq ≤ 16`.
    pub decode: bool,
    /// q is modified, or k and v (which rule out warp specialisation).
    pub modifies_kv: bool,
    /// Split-KV is possible (the online state has a derived combine).
    pub combinable: bool,
}

impl VariantFacts {
    /// The facts of a parallel variant.
    pub fn of(variant: &Variant) -> VariantFacts {
        let par = variant.parallel();
        let transcendental = |r: Option<&aec_frontend::ir::Region>| {
            r.map_or(0, |r| {
                r.graph
                    .nodes()
                    .iter()
                    .filter(|n| {
                        matches!(
                            n.op,
                            Op::Unary(
                                Unary::Exp
                                    | Unary::Exp2
                                    | Unary::Log
                                    | Unary::Log2
                                    | Unary::Tanh
                                    | Unary::Sigmoid
                            )
                        )
                    })
                    .count() as u32
            })
        };
        VariantFacts {
            causal: par.is_some_and(|p| p.mask.as_ref().is_some_and(implies_causal)),
            masked: par.is_some_and(|p| p.mask.is_some()),
            // The online step's exponentials of the row state are per row,
            // not per score: at most one per score remains after
            // simplification (`exp(s − m)`).
            sfu_per_score: par.map_or(0, |p| {
                transcendental(p.modify_scores.as_ref())
                    + transcendental(Some(&p.online.fwd)).min(1)
            }),
            decode: variant
                .fixed_sizes
                .iter()
                .any(|&(a, n)| a == Axis::Sq && n <= 16),
            modifies_kv: crate::cuda::forward::modifies_kv(variant),
            combinable: par.is_some_and(|p| combine_plan(&p.online).is_ok()),
        }
    }
}

/// One point of the search space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum KernelConfig {
    Cuda(ForwardConfig),
    Hip(HipForwardConfig),
}

impl KernelConfig {
    /// A short label for reports: `m128 n128 w8 s2 wgmma-ws persistent tma`.
    pub fn label(&self) -> String {
        match self {
            KernelConfig::Cuda(c) => {
                let mut s = format!(
                    "m{} n{} w{} s{} {}",
                    c.block_m,
                    c.block_n,
                    c.warps,
                    c.stages,
                    match (c.wgmma, c.warp_specialized) {
                        (true, true) => "wgmma-ws",
                        (true, false) => "wgmma",
                        _ => "mma.sync",
                    }
                );
                // Every option that changes the kernel, so two plans of a
                // report never read alike.
                let flags = [
                    (c.persistent, " persistent"),
                    (c.tma_loads && c.warp_specialized, " tma"),
                    (c.q_in_registers, " q-regs"),
                    (c.late_epilogue, " late-epilogue"),
                    (c.pack_gqa, " gqa-packed"),
                    (c.split_kv, " split-kv"),
                    (c.fused_combine, " fused-combine"),
                    (c.v_in_k, " v-in-k"),
                ];
                for (on, name) in flags {
                    if on {
                        s += name;
                    }
                }
                if c.dv_split > 1 {
                    s += &format!(" dv/{}", c.dv_split);
                }
                if c.key_warps > 1 {
                    s += &format!(" key-warps/{}", c.key_warps);
                }
                if c.dv_warps > 1 {
                    s += &format!(" dv-warps/{}", c.dv_warps);
                }
                s
            }
            KernelConfig::Hip(c) => format!(
                "m{} n{} waves{}{}{}",
                c.block_m,
                c.block_n,
                c.waves,
                if c.dv_split > 1 {
                    format!(" dv/{}", c.dv_split)
                } else {
                    String::new()
                },
                if c.pack_gqa { " gqa-packed" } else { "" },
            ),
        }
    }
}

/// A configuration that fits, with its placement and the plan the cost
/// model reads.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Candidate {
    pub config: KernelConfig,
    pub placement: Placement,
    pub plan: TilePlan,
}

/// A configuration that does not fit, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Rejected {
    pub config: KernelConfig,
    pub reason: String,
}

/// The search space of one kernel: what fits, what does not.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Space {
    pub candidates: Vec<Candidate>,
    pub rejected: Vec<Rejected>,
}

/// Registers every thread needs besides its tiles (addresses, loop
/// counters, the row state, closure temporaries). Calibrated on the
/// sm_90a forward: at d128 with 128-key blocks, Q in registers (192 tile
/// registers) spilled 48 bytes (bench/NOTES.md w6), while Dqk 128 / Dv 256
/// with 80-key blocks (188) spills at most 4 bytes (64 keys are the
/// faster tile there since session 34); 96-key blocks (200) spill 40.
const FIXED_REGISTERS: u32 = 44;

/// Registers a computing warpgroup of the warp-specialised kernel gets
/// (`setmaxnreg`; the producer gives its registers up).
const WS_CONSUMER_REGISTERS: u32 = 232;

/// The forward's search space for `problem` on `device`.
pub fn forward_space(variant: &Variant, problem: &Problem, device: &DeviceConfig) -> Space {
    let facts = VariantFacts::of(variant);
    let mut space = Space::default();
    let splits: Vec<u32> = [1, 2, 4]
        .into_iter()
        .filter(|&n| crate::cuda::forward::check_dv_split(n, problem.dv).is_ok())
        .collect();
    match device.target {
        Target::Cuda(isa) => {
            let late_epilogue = crate::cuda::forward::late_epilogue_pays(variant);
            for cfg in cuda_forward_configs(&facts, problem, isa, &splits) {
                consider_cuda(&mut space, cfg, problem, device, late_epilogue);
            }
        }
        Target::Hip(_) => {
            for cfg in hip_forward_configs(&facts, problem, &splits) {
                consider_hip(&mut space, cfg, problem, device);
            }
        }
    }
    space
}

/// Level 1 for CUDA: block tiles from multiples of the MMA tile (16 rows
/// per warp, 64 per warpgroup; keys in multiples of 32), the ring depth,
/// the template, and the Dv split.
fn cuda_forward_configs(
    facts: &VariantFacts,
    problem: &Problem,
    isa: Isa,
    splits: &[u32],
) -> Vec<ForwardConfig> {
    let base = ForwardConfig {
        block_m: 128,
        block_n: 64,
        warps: 4,
        elem: problem.elem,
        pack_gqa: false,
        wgmma: false,
        warp_specialized: false,
        stages: 2,
        q_in_registers: false,
        dv_split: 1,
        split_kv: false,
        fused_combine: false,
        persistent: false,
        v_in_k: false,
        key_warps: 1,
        dv_warps: 1,
        tma_loads: false,
        late_epilogue: false,
        kv_multicast: false,
    };
    let mut out = Vec::new();
    for &dv_split in splits {
        if facts.decode {
            for block_n in [32, 64, 128] {
                // Warps splitting each key block need the combine to merge
                // their partial rows.
                let key_warps: &[u32] = if facts.combinable { &[1, 2, 4] } else { &[1] };
                for &key_warps in key_warps.iter().filter(|&&k| block_n / k >= 16) {
                    out.push(ForwardConfig {
                        block_m: 16,
                        block_n,
                        warps: key_warps,
                        key_warps,
                        pack_gqa: true,
                        dv_split,
                        split_kv: facts.combinable,
                        ..base
                    });
                }
            }
            // 64 or more packed rows per KV head (MQA, the latent cache's
            // heads): 64- and 128-row blocks, which share each K/V tile
            // between that many rows — on sm_90a `wgmma`, with and without
            // a producer warpgroup (MQA d128: on an H200 the producer's
            // 64-row tile 9% ahead of the default; which of the tiles
            // without it leads differed between an H100 and an H200;
            // bench/NOTES.md sessions 39 and 51).
            let rows = problem.h / problem.hkv.max(1) * problem.sq;
            if rows >= 64 {
                for block_n in [32, 64] {
                    out.push(ForwardConfig {
                        block_m: 64,
                        block_n,
                        warps: 4,
                        pack_gqa: true,
                        dv_split,
                        split_kv: facts.combinable,
                        ..base
                    });
                }
                if isa == Isa::Sm90a && wgmma_dims_ok(problem.dqk, problem.dv / dv_split) {
                    for (block_m, warps) in [(64, 4), (128, 8)] {
                        for block_n in [64, 128] {
                            for ws in [false, true] {
                                if ws && facts.modifies_kv {
                                    continue;
                                }
                                for stages in [2, 3] {
                                    out.push(ForwardConfig {
                                        block_m,
                                        block_n,
                                        warps,
                                        wgmma: true,
                                        warp_specialized: ws,
                                        stages,
                                        pack_gqa: true,
                                        dv_split,
                                        split_kv: facts.combinable,
                                        ..base
                                    });
                                }
                            }
                        }
                    }
                    // Two key warpgroups over 64 rows, taking key blocks in
                    // turn, with the producer (MQA d128 on an H200: 96-key
                    // blocks in four stages 7% ahead of one warpgroup;
                    // bench/NOTES.md session 52).
                    // (Whole Dv only: the form the GPU tests run.)
                    if !facts.modifies_kv && facts.combinable && dv_split == 1 {
                        for (block_n, stages) in [(96, 4), (128, 3), (64, 6)] {
                            out.push(ForwardConfig {
                                block_m: 64,
                                block_n,
                                warps: 8,
                                key_warps: 2,
                                wgmma: true,
                                warp_specialized: true,
                                stages,
                                pack_gqa: true,
                                dv_split,
                                split_kv: facts.combinable,
                                ..base
                            });
                        }
                    }
                }
            }
            continue;
        }
        let slice = problem.dv / dv_split;
        if isa == Isa::Sm90a && wgmma_dims_ok(problem.dqk, slice) {
            for warps in [4, 8] {
                // 80 and 96: the key blocks that fit beside a Dv = 256
                // accumulator (check_config refuses them where the loader
                // cannot split them evenly).
                for block_n in [32, 64, 80, 96, 128] {
                    for ws in [true, false] {
                        if ws && facts.modifies_kv {
                            continue;
                        }
                        let stages: &[u32] = if ws { &[2, 3, 4] } else { &[2] };
                        for &stages in stages {
                            let persistent: &[bool] = if ws { &[false, true] } else { &[false] };
                            for &persistent in persistent {
                                out.push(ForwardConfig {
                                    block_m: 16 * warps,
                                    block_n,
                                    warps,
                                    wgmma: true,
                                    warp_specialized: ws,
                                    stages,
                                    dv_split,
                                    persistent,
                                    // (TMA loads wherever the producer is a
                                    // warp of its own: 1-6% faster.)
                                    tma_loads: ws,
                                    ..base
                                });
                            }
                        }
                    }
                }
            }
        }
        for (block_m, warps) in [(64, 4), (128, 4), (128, 8), (64, 2)] {
            for block_n in [32, 64, 128] {
                out.push(ForwardConfig {
                    block_m,
                    block_n,
                    warps,
                    dv_split,
                    ..base
                });
            }
        }
    }
    out
}

/// `late_epilogue`: whether the variant takes the late epilogue where Q is
/// in registers.
fn consider_cuda(
    space: &mut Space,
    mut cfg: ForwardConfig,
    problem: &Problem,
    device: &DeviceConfig,
    late_epilogue: bool,
) {
    let reject = |space: &mut Space, cfg, reason: String| {
        space.rejected.push(Rejected {
            config: KernelConfig::Cuda(cfg),
            reason,
        })
    };
    if let Err(e) = check_forward_config(&cfg, problem.dqk, problem.dv) {
        return reject(space, cfg, e.0);
    }
    let (dqk, slice) = (problem.dqk, cfg.dv_slice(problem.dv));
    let eb = problem.elem.bytes();
    // Level 2 over the tiles of one register-holding unit: a warpgroup (64
    // rows) for wgmma, a warp (16 or 32 rows) for mma.sync.
    let (unit_rows, unit_threads) = if cfg.wgmma {
        (64, 4 * device.warp_size)
    } else {
        (cfg.block_m / cfg.warps, device.warp_size)
    };
    let threads = (cfg.warps + if cfg.warp_specialized { 4 } else { 0 }) * device.warp_size;
    let register_cap = if cfg.warp_specialized {
        WS_CONSUMER_REGISTERS
    } else {
        (device.regs_per_sm / threads).min(device.regs_per_thread) & !7
    };
    let slack = if cfg.wgmma { 1024 } else { 0 };
    let (q_cols, v_cols) = (
        tile_stride(&cfg, slice, dqk),
        tile_stride(&cfg, slice, slice),
    );
    // (Packed decoding rows keep Q in shared memory: the register tier is
    // the persistent prefill kernel's.)
    let q_tiers: &[Tier] = if cfg.warp_specialized && !cfg.pack_gqa {
        &[Tier::Register, Tier::Shared]
    } else {
        &[Tier::Shared]
    };
    // Q is held per unit in registers but per block in shared memory.
    let q_rows = if cfg.warp_specialized {
        unit_rows
    } else {
        cfg.block_m
    };
    let tensors = vec![
        IntermediateTensor::new("q", (q_rows, q_cols), eb, 1, q_tiers),
        IntermediateTensor::new("k", (cfg.block_n, q_cols), eb, cfg.stages, &[Tier::Shared]),
        IntermediateTensor::new("v", (cfg.block_n, v_cols), eb, cfg.stages, &[Tier::Shared]),
        IntermediateTensor::new("s", (unit_rows, cfg.block_n), 4, 1, &[Tier::Register]),
        IntermediateTensor::new("p", (unit_rows, cfg.block_n), eb, 1, &[Tier::Register]),
        IntermediateTensor::new("o", (unit_rows, slice), 4, 1, &[Tier::Register]),
    ];
    let static_smem = if cfg.warp_specialized {
        WS_STATIC_SMEM
    } else {
        0
    };
    let budget = Budget {
        threads: unit_threads,
        registers: register_cap.saturating_sub(FIXED_REGISTERS),
        shared: device.smem_per_block.saturating_sub(slack + static_smem),
    };
    let mut placement = match place(tensors, &budget) {
        Ok(p) => p,
        Err(e) => return reject(space, cfg, e),
    };
    if cfg.warp_specialized {
        cfg.q_in_registers = placement.tier_of("q") == Some(Tier::Register);
        // The next tile's Q is ready at the last tile's end only from
        // registers, where finishing a tile late pays for the variants
        // `late_epilogue_pays` names (as in the default).
        cfg.late_epilogue = late_epilogue && cfg.q_in_registers && cfg.persistent;
        if !cfg.q_in_registers {
            // In shared memory Q is the block's whole tile, not a unit's.
            let q = placement
                .tensors
                .iter_mut()
                .find(|t| t.name == "q")
                .unwrap();
            q.rows = cfg.block_m;
        }
        // Q reaches registers through shared memory: its tile stays there.
        placement.shared = forward_smem_bytes(&cfg, dqk, slice) - slack;
    }
    debug_assert_eq!(
        placement.shared + slack,
        forward_smem_bytes(&cfg, dqk, slice)
    );
    if placement.shared + slack + static_smem > device.smem_per_block {
        return reject(
            space,
            cfg,
            format!(
                "{} bytes of shared memory needed, {} per block",
                placement.shared + slack + static_smem,
                device.smem_per_block
            ),
        );
    }
    let regs = (placement.registers + FIXED_REGISTERS).min(register_cap);
    let smem = placement.shared + slack + static_smem;
    let blocks_per_sm = if cfg.warp_specialized {
        1
    } else {
        (device.regs_per_sm / (threads * regs.next_multiple_of(8)))
            .min(device.smem_per_sm / (smem + 1024))
            .min(device.threads_per_sm / threads)
            .max(1)
    };
    let engine = match (cfg.wgmma, device.target) {
        (true, _) => Engine::Wgmma,
        (false, Target::Cuda(Isa::Sm90a)) => Engine::MmaSyncOnHopper,
        _ => Engine::MmaSync,
    };
    let plan = TilePlan {
        block_m: cfg.block_m,
        block_n: cfg.block_n,
        dv_slice: slice,
        dv_split: cfg.dv_split,
        units: if cfg.wgmma { cfg.warps / 4 } else { cfg.warps },
        unit_rows,
        key_units: cfg.key_warps.max(1),
        engine,
        overlapped: cfg.warp_specialized,
        q_in_registers: cfg.q_in_registers,
        stages: cfg.stages,
        blocks_per_sm,
        packed_gqa: cfg.pack_gqa,
        split_kv: cfg.split_kv,
        persistent: cfg.persistent,
    };
    space.candidates.push(Candidate {
        config: KernelConfig::Cuda(cfg),
        placement,
        plan,
    });
}

fn hip_forward_configs(
    facts: &VariantFacts,
    problem: &Problem,
    splits: &[u32],
) -> Vec<HipForwardConfig> {
    let mut out = Vec::new();
    for &dv_split in splits {
        let tiles: &[(u32, u32)] = if facts.decode {
            &[(16, 1)]
        } else {
            &[(64, 4), (64, 2), (128, 4), (32, 2)]
        };
        for &(block_m, waves) in tiles {
            for block_n in [16, 32, 64, 128] {
                out.push(HipForwardConfig {
                    block_m,
                    block_n,
                    waves,
                    elem: problem.elem,
                    pack_gqa: facts.decode,
                    dv_split,
                    split_kv: facts.decode && facts.combinable,
                    v_in_k: false,
                });
            }
        }
    }
    out
}

fn consider_hip(
    space: &mut Space,
    cfg: HipForwardConfig,
    problem: &Problem,
    device: &DeviceConfig,
) {
    let reject = |space: &mut Space, reason: String| {
        space.rejected.push(Rejected {
            config: KernelConfig::Hip(cfg),
            reason,
        })
    };
    if let Err(e) = check_hip_forward_config(&cfg, problem.dqk, problem.dv) {
        return reject(space, e.0);
    }
    let (dqk, slice) = (problem.dqk, problem.dv / cfg.dv_split);
    let eb = problem.elem.bytes();
    let wave_rows = cfg.block_m / cfg.waves;
    let threads = cfg.waves * device.warp_size;
    let tensors = vec![
        // Q fragments stay in registers for the whole loop.
        IntermediateTensor::new("q", (wave_rows, dqk), eb, 1, &[Tier::Register]),
        IntermediateTensor::new("k", (cfg.block_n, dqk + 8), eb, 1, &[Tier::Shared]),
        IntermediateTensor::new("v", (slice, cfg.block_n + 4), eb, 1, &[Tier::Shared]),
        IntermediateTensor::new("s", (wave_rows, cfg.block_n), 4, 1, &[Tier::Register]),
        IntermediateTensor::new("p", (wave_rows, cfg.block_n), eb, 1, &[Tier::Register]),
        IntermediateTensor::new("o", (wave_rows, slice), 4, 1, &[Tier::Register]),
    ];
    let budget = Budget {
        threads: device.warp_size,
        registers: device.regs_per_thread.saturating_sub(FIXED_REGISTERS),
        shared: device.smem_per_block,
    };
    let placement = match place(tensors, &budget) {
        Ok(p) => p,
        Err(e) => return reject(space, e),
    };
    debug_assert_eq!(placement.shared, lds_bytes(cfg.block_n, dqk, slice));
    let regs = placement.registers + FIXED_REGISTERS;
    // Four SIMDs per CU, each with 512 registers per lane shared by its waves.
    let waves_per_simd = (512 / regs.next_multiple_of(8)).clamp(1, 8);
    let blocks_per_sm = ((4 * waves_per_simd) / cfg.waves)
        .min(device.smem_per_sm / placement.shared.max(1))
        .min(device.threads_per_sm / threads)
        .max(1);
    let plan = TilePlan {
        block_m: cfg.block_m,
        block_n: cfg.block_n,
        dv_slice: slice,
        dv_split: cfg.dv_split,
        units: cfg.waves,
        unit_rows: wave_rows,
        key_units: 1,
        engine: Engine::Mfma,
        overlapped: false,
        q_in_registers: true,
        stages: 1,
        blocks_per_sm,
        packed_gqa: cfg.pack_gqa,
        split_kv: cfg.split_kv,
        persistent: false,
    };
    space.candidates.push(Candidate {
        config: KernelConfig::Hip(cfg),
        placement,
        plan,
    });
}
