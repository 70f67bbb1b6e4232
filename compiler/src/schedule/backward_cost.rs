//! The backward's analytic cost model: a time for a backward tile
//! ([`BackwardConfig`]) on a device, from the work of one step of one key
//! block (the five GEMMs, the element step, the dQ tile added into the f32
//! accumulator, the Q and dO tiles read), the blocks' start and end, and a
//! list schedule of the key blocks over the device's block slots; plus the
//! row and element kernels around the main one.
//!
//! Its constants were fitted to an H100's profiled backward tiles (every
//! benchmark workload's default and twenty more tiles, every tile of the
//! softmax workload, three small causal grids: 252 timings,
//! bench/NOTES.md session 44). Its first plan was the measured fastest at
//! every benchmark workload, with a rank correlation of 0.71–0.97 per
//! workload; its absolute times run up to 1.4× long. Since the 80-query
//! tile (session 47) it ranks that tile first at ReLU d64 too, where it
//! measured 1.0% slower than the default: the model has no term for the
//! lagged dQ of the 64-query default. Like the forward's
//! model it orders what the tuner profiles first and is not a prediction to
//! report as a speed.

use super::cost::{ALU_PER_CLK, Engine, Estimate, list_schedule, useful_flops};
use super::device::DeviceConfig;
use super::space::{Problem, VariantFacts};
use crate::BackwardConfig;

/// The share of an engine's forward efficiency ([`Engine`]) the backward's
/// GEMMs sustain: its steps put the element step, the dSᵀ store and the dQ
/// hand-over between GEMMs of 64 columns.
const GEMM_SHARE: f64 = 0.53;
/// Cycles every step costs besides its work (mbarrier and named-barrier
/// waits, the GEMMs' issue and drain, the row constants' loads).
const STEP_OVERHEAD: f64 = 2200.0;
/// Cycles of a block's start and end: its K and V tiles loaded, its dK and
/// dV written (session 33 fitted 14.6 µs per block from two grids).
const BLOCK_OVERHEAD: f64 = 20000.0;
/// Microseconds of a call besides its kernels' work (three launches).
const CALL_OVERHEAD_US: f64 = 15.0;
/// The rate of the f32 vector atomics adding dQ tiles, as a share of the
/// L2 bandwidth into the multiprocessors (about 2.1 TB/s on an H100: the
/// rate at which session 40 found the additions bounding 64-key blocks).
const ATOMIC_SHARE_OF_L2: f64 = 0.18;
/// Without the producer warpgroup the computing warps issue the loads and
/// the atomics themselves: the share of their time that stays exposed.
const EXPOSED_WITHOUT_PRODUCER: f64 = 0.32;
/// FP32 operations per score of the element step besides transcendentals
/// (P from the saved state, dS, packing).
const ALU_PER_SCORE: f64 = 8.0;
/// Registers a thread of the mma.sync kernel holds for its dK and dV
/// accumulators and its scores before ptxas spills (RetNet's 256/512 on
/// four warps, 416 of them: 2.9× the time of split dims on an H100).
const MMA_SYNC_LIVE_REGISTERS: f64 = 200.0;
/// Row constants per query row the model assumes for the shared memory
/// (the saved state and `dO·O`; a variant's exact count is the generator's).
const ROW_CONSTANTS: u32 = 2;

/// The model's estimate for backward tile `cfg` on `device` for `problem`
/// (the main kernel and the row and element kernels beside it).
pub fn estimate_backward(
    problem: &Problem,
    facts: &VariantFacts,
    cfg: &BackwardConfig,
    device: &DeviceConfig,
) -> Estimate {
    let (bm, bn) = (f64::from(cfg.block_m), f64::from(cfg.block_n()));
    let (dqk, dv) = (f64::from(problem.dqk), f64::from(problem.dv));
    let groups = f64::from(cfg.kv_groups.max(1));
    let clock = device.clock_ghz * 1e9;
    let engine = if cfg.wgmma {
        Engine::Wgmma
    } else if device.features.wgmma {
        Engine::MmaSyncOnHopper
    } else {
        Engine::MmaSync
    };

    // One step (bm queries against the block's bn keys) of one block.
    // Sᵀ and dPᵀ are computed once per block, or by each of the warps (or
    // both warpgroups) sharing keys; dK and dV, and dQ, are split between
    // a key block's groups. The 32-row wgmma step computes dQ over 64 rows,
    // half of them padding unless its steps pair (`pairs_steps`, the
    // producer's form: one 64-row dQ per two steps).
    let recompute = match (cfg.wgmma, cfg.split_d) {
        (true, 1) => 1.0,
        (true, _) if cfg.shared_scores => 1.0,
        (_, split) => f64::from(split.max(1)),
    };
    let scores_flops = 2.0 * bn * bm * (dqk + dv) * recompute;
    let kv_flops = 2.0 * bn * bm * (dqk + dv) / groups;
    let dq_rows = if cfg.wgmma && cfg.block_m < 64 && !cfg.pairs_steps() {
        64.0
    } else {
        bm
    };
    let dq_flops = 2.0 * dq_rows * dqk * bn / groups;
    let tensor = (scores_flops + kv_flops + dq_flops)
        / (device.flops_per_clk_per_sm() * engine.efficiency() * GEMM_SHARE);
    let scores = bn * bm * recompute;
    let elementwise = scores
        * (ALU_PER_SCORE / ALU_PER_CLK
            + f64::from(facts.sfu_per_score) / f64::from(device.sfu_per_clk.max(1)));
    let l2_per_sm_clk = device.l2_gbs * 1e9 / (f64::from(device.sms) * clock);
    let atomics = bm * dqk * 4.0 / groups / (l2_per_sm_clk * ATOMIC_SHARE_OF_L2);
    let eb = problem.elem.bytes() as f64;
    let loads = bm * (dqk + dv) * eb / l2_per_sm_clk;
    let compute = tensor + 0.5 * elementwise;
    let (mut step, bound) = if cfg.warp_specialized {
        // The producer adds the staged dQ tiles and loads the next step
        // while the warpgroups compute.
        [(atomics, "l2"), (loads, "l2")]
            .into_iter()
            .fold(
                (compute, "tensor"),
                |best, c| if c.0 > best.0 { c } else { best },
            )
    } else {
        (
            compute + EXPOSED_WITHOUT_PRODUCER * (atomics + loads),
            "tensor",
        )
    };
    step += STEP_OVERHEAD;
    if !cfg.wgmma {
        // A warp's 16 keys of dK and dV (its share of the columns) and its
        // scores and score gradients, per thread.
        let live = (dqk + dv) / (2.0 * f64::from(cfg.split_d.max(1))) + bm;
        if live > MMA_SYNC_LIVE_REGISTERS {
            step *= live / MMA_SYNC_LIVE_REGISTERS;
        }
    }

    // Resident blocks per multiprocessor: shared memory, threads, and
    // registers (the wgmma kernels take the register file; the mma.sync
    // ones up to 255 a thread).
    let threads = cfg.main_threads();
    let smem = cfg.smem_bytes(problem.dqk, problem.dv, ROW_CONSTANTS) + 1024;
    let regs = if cfg.warp_specialized { 168 } else { 255 };
    let bps = (device.smem_per_sm / smem.max(1))
        .min(device.threads_per_sm / threads.max(1))
        .min(device.regs_per_sm / (threads * regs).max(1))
        .max(1);

    // The grid: key blocks (times their groups) of each KV head; a block
    // walks the query steps of its group's query heads, under a causal mask
    // those at or after its first key. Longest blocks first (the causal
    // kernels' order).
    let key_blocks = problem.skv.div_ceil(cfg.block_n() as usize);
    let bm = cfg.block_m as usize;
    let group = (problem.h / problem.hkv.max(1)).max(1);
    let mut steps: Vec<usize> = (0..key_blocks)
        .map(|kb| {
            let first_key = kb * cfg.block_n() as usize;
            let skipped = if facts.causal {
                // Query rows before the block's first key see none of it.
                (first_key + problem.sq)
                    .saturating_sub(problem.skv)
                    .min(problem.sq)
            } else {
                0
            };
            // The walk starts at the step holding the first row it needs, or
            // on 80-query steps at that row itself.
            let start = if cfg.transposes_dq() {
                skipped
            } else {
                skipped / bm * bm
            };
            (problem.sq - start).div_ceil(bm) * group
        })
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    let per_key_block = problem.b * problem.hkv * cfg.kv_groups.max(1) as usize;
    let slots = (device.sms * bps).max(1) as usize;
    // A block sharing its multiprocessor takes `bps` times as long per step.
    let cycles = steps.iter().flat_map(|&n| {
        std::iter::repeat_n(
            (BLOCK_OVERHEAD + n as f64 * step * f64::from(bps)) as u64,
            per_key_block,
        )
    });
    let makespan = list_schedule(cycles, slots);
    // The row kernel reads O and dO and zeroes dQ's f32 accumulator; the
    // element kernel reads it and writes dQ.
    let rows = (problem.b * problem.h * problem.sq) as f64;
    let row_bytes = rows * (2.0 * dv * eb + dqk * 4.0) + rows * dqk * (4.0 + eb);
    let micros = makespan as f64 / clock * 1e6
        + row_bytes / (device.dram_gbs * 1e9) * 1e6
        + CALL_OVERHEAD_US;
    Estimate {
        micros,
        tflops: useful_backward_flops(problem, facts) / (micros * 1e-6) / 1e12,
        bound,
    }
}

/// The backward's useful FLOPs: its five GEMMs (Sᵀ and dQ, dK over Dqk;
/// dPᵀ, dV over Dv) against the forward's two, `(3·Dqk + 2·Dv) / (Dqk + Dv)`
/// times the forward's.
pub fn useful_backward_flops(problem: &Problem, facts: &VariantFacts) -> f64 {
    let (dqk, dv) = (f64::from(problem.dqk), f64::from(problem.dv));
    useful_flops(problem, facts) * (3.0 * dqk + 2.0 * dv) / (dqk + dv)
}

/// A backward tile with the model's estimate.
#[derive(Clone, Debug, PartialEq)]
pub struct RankedBackward {
    pub config: BackwardConfig,
    pub estimate: Estimate,
}

/// `candidates` ordered by the model (fastest first; ties keep their order).
pub fn rank_backward(
    problem: &Problem,
    facts: &VariantFacts,
    candidates: impl IntoIterator<Item = BackwardConfig>,
    device: &DeviceConfig,
) -> Vec<RankedBackward> {
    let mut ranked: Vec<RankedBackward> = candidates
        .into_iter()
        .map(|config| RankedBackward {
            estimate: estimate_backward(problem, facts, &config, device),
            config,
        })
        .collect();
    ranked.sort_by(|a, b| a.estimate.micros.total_cmp(&b.estimate.micros));
    ranked
}
