//! The analytic cost model: a time for a tile plan on a device, from the
//! work of one KV step of one block (tensor-core FLOPs, shared-memory bytes,
//! transcendental results, L2 bytes), the per-block prologue and epilogue,
//! and a list schedule of the grid over the device's block slots. It ranks
//! plans where nothing can be measured (AMD targets here) and orders what
//! the profiler tries first; it is not a prediction to report as a speed.

use super::device::DeviceConfig;
use super::space::{Problem, VariantFacts};
use crate::cuda::forward::{KvSplitInputs, MAX_KV_SPLITS, Residency, SplitTile, kv_split_rule};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// The instruction a plan's GEMMs run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Engine {
    /// Hopper warpgroup MMA, operands from swizzled shared memory.
    Wgmma,
    /// `mma.sync` on an sm_80-class GPU.
    MmaSync,
    /// `mma.sync` on Hopper: about half of what wgmma reaches there.
    MmaSyncOnHopper,
    /// AMD MFMA.
    Mfma,
}

impl Engine {
    /// The fraction of the device's dense peak the engine sustains in a
    /// well-fed GEMM loop.
    pub(crate) fn efficiency(self) -> f64 {
        match self {
            Engine::Wgmma => 0.85,
            Engine::MmaSync => 0.8,
            Engine::MmaSyncOnHopper => 0.5,
            Engine::Mfma => 0.7,
        }
    }
}

/// What the model reads of a configuration (every target's configurations
/// map onto it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct TilePlan {
    pub block_m: u32,
    pub block_n: u32,
    /// Dv columns one block computes.
    pub dv_slice: u32,
    /// Blocks per row block (each recomputes the scores).
    pub dv_split: u32,
    /// Register-holding units (warpgroups, warps or waves) per block.
    pub units: u32,
    /// Query rows per unit.
    pub unit_rows: u32,
    /// Units that hold the same rows and share each KV step's keys: the
    /// sm_80 template's key warps (each a share of every block's keys) or
    /// key warpgroups (each whole blocks in turn). 1 elsewhere.
    pub key_units: u32,
    pub engine: Engine,
    /// The scores and online step of one KV block overlap the previous
    /// block's P·V (the warp-specialised kernel).
    pub overlapped: bool,
    /// Q is read from registers by the S GEMM (not from shared memory).
    pub q_in_registers: bool,
    /// K/V buffers in flight.
    pub stages: u32,
    /// Resident blocks per multiprocessor.
    pub blocks_per_sm: u32,
    pub packed_gqa: bool,
    pub split_kv: bool,
    /// One block per SM walks the row blocks in pairs (`x`, `n - 1 - x`),
    /// the next tile's loads overlapping the last one's epilogue.
    pub persistent: bool,
}

/// The model's figures for one plan.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub micros: f64,
    /// Useful FLOPs (scores once, visible pairs only) per second.
    pub tflops: f64,
    /// What bounds one KV step: `tensor`, `shared`, `sfu`, `l2` or `latency`.
    pub bound: &'static str,
}

/// Latency of a K/V tile load (global memory into shared memory), cycles:
/// with two stages the warp-specialised kernel waits it out once per step
/// (measured on an H100: Diff 128/256, 2 stages 560 µs, 4 stages 459 µs).
const LOAD_LATENCY: f64 = 2500.0;
/// Fixed cycles of a block's start (launch, Q load issue) and end.
const BLOCK_OVERHEAD: f64 = 1500.0;
/// Cycles a persistent block spends between two tiles (the consumers'
/// epilogue stores and state reset; the loads for the next tile are already
/// in flight).
const TILE_SWITCH: f64 = 600.0;
/// FP32 lanes per multiprocessor per clock for the elementwise score work.
pub(crate) const ALU_PER_CLK: f64 = 128.0;
/// Elementwise operations per score besides transcendentals (scale, max,
/// subtract, convert, pack; a mask adds its compare).
const ALU_PER_SCORE: f64 = 8.0;
/// Cycles every KV step costs besides its work: barrier and mbarrier
/// waits, MMA issue and drain, the loop's bookkeeping. Small key blocks
/// pay it more often.
const STEP_OVERHEAD: f64 = 300.0;

/// The model's estimate for `plan` on `device` for `problem`.
pub fn estimate(
    problem: &Problem,
    facts: &VariantFacts,
    plan: &TilePlan,
    device: &DeviceConfig,
) -> Estimate {
    let (bm, bn) = (plan.block_m as f64, plan.block_n as f64);
    let (dqk, dvs) = (problem.dqk as f64, plan.dv_slice as f64);
    let eb = problem.elem.bytes() as f64;
    let clock = device.clock_ghz * 1e9;
    let bps = plan.blocks_per_sm.max(1) as f64;

    // One KV step of one block, cycles, if it had the SM to itself.
    let flops = 2.0 * bm * bn * (dqk + dvs);
    let tensor = flops / (device.flops_per_clk_per_sm() * plan.engine.efficiency());
    let units = plan.units as f64;
    let unit_rows = plan.unit_rows as f64;
    // Units with rows of their own (key units share theirs and split the
    // block's keys).
    let row_units = units / plan.key_units.max(1) as f64;
    let smem_read = match plan.engine {
        // Each warpgroup reads K (and Q unless in registers) for S, V for O;
        // key warpgroups take whole blocks in turn, so a block is read by
        // one of them.
        Engine::Wgmma => {
            row_units
                * ((if plan.q_in_registers {
                    0.0
                } else {
                    unit_rows * dqk
                }) + bn * dqk
                    + bn * dvs)
        }
        // Each warp (wave) reads its Q fragments and its keys' K and V: all
        // of them, or with key warps its share.
        _ => units * unit_rows * dqk + row_units * (bn * dqk + bn * dvs),
    } * eb;
    let smem_write = bn * (dqk + dvs) * eb;
    let shared = (smem_read + smem_write) / device.smem_bytes_per_clk as f64;
    let scores = bm * bn;
    let sfu = scores * facts.sfu_per_score as f64 / device.sfu_per_clk as f64;
    let alu = scores * (ALU_PER_SCORE + if facts.masked { 2.0 } else { 0.0 }) / ALU_PER_CLK;
    let l2_per_sm_clk = device.l2_gbs * 1e9 / (device.sms as f64 * clock);
    // Every resident block streams its own K/V tiles through L2.
    let l2 = bn * (dqk + dvs) * eb * bps / l2_per_sm_clk;
    let (mut step, mut bound) = (tensor, "tensor");
    let elementwise = sfu + alu;
    let candidates = if plan.overlapped {
        [(shared, "shared"), (elementwise, "sfu"), (l2 / bps, "l2")]
    } else {
        // Without the overlap the softmax waits for the GEMMs (other
        // resident units fill part of that gap).
        let exposed = elementwise * (1.0 - 0.5 * ((units - 1.0).min(1.0)));
        step = tensor + exposed;
        [
            (shared + exposed, "shared"),
            (elementwise, "sfu"),
            (l2 / bps, "l2"),
        ]
    };
    for (t, name) in candidates {
        if t > step {
            step = t;
            bound = name;
        }
    }
    step += STEP_OVERHEAD;
    // Loads in flight must cover their latency.
    let in_flight = (plan.stages.max(2) - 1) as f64;
    if step * in_flight * bps < LOAD_LATENCY {
        step = LOAD_LATENCY / (in_flight * bps);
        bound = "latency";
    }

    // The grid: row blocks, their KV steps (causal rows stop at the
    // diagonal), the split of Dv and of KV.
    let rows = if plan.packed_gqa {
        problem.sq * (problem.h / problem.hkv.max(1))
    } else {
        problem.sq
    };
    let heads = if plan.packed_gqa {
        problem.hkv
    } else {
        problem.h
    };
    let row_blocks = rows.div_ceil(plan.block_m as usize);
    let kv_blocks = problem.skv.div_ceil(plan.block_n as usize);
    let mut steps: Vec<usize> = (0..row_blocks)
        .map(|r| {
            if facts.causal {
                let last_row = ((r + 1) * plan.block_m as usize).min(problem.sq);
                let last_key = last_row + problem.skv.saturating_sub(problem.sq);
                last_key.div_ceil(plan.block_n as usize).min(kv_blocks)
            } else {
                kv_blocks
            }
        })
        .collect();
    // Causal grids launch the longest row blocks first.
    steps.sort_unstable_by(|a, b| b.cmp(a));
    let tile = SplitTile {
        block_m: plan.block_m,
        block_n: plan.block_n,
        stages: plan.stages,
        dqk: problem.dqk,
        dv_slice: plan.dv_slice,
        v_in_k: false,
        elem_bytes: problem.elem.bytes(),
    };
    let splits = plan_splits(
        plan,
        row_blocks * heads * problem.b * plan.dv_split as usize,
        kv_blocks,
        tile.kv_bytes_in_flight(),
        tile.split_fixed_work(),
        device,
    );
    let epilogue = bm * dvs * eb / (device.dram_gbs * 1e9 / (device.sms as f64 * clock));
    let prologue = BLOCK_OVERHEAD + (bm * dqk + bn * (dqk + dvs)) * eb / l2_per_sm_clk;
    let slots = (device.sms * plan.blocks_per_sm).max(1) as usize;
    let per_head = problem.b * heads * plan.dv_split as usize * splits;
    let makespan = if plan.persistent {
        // Units of two row blocks (rank x and n - 1 - x) strided over one
        // block per slot; one prologue and epilogue per block.
        let units: Vec<(usize, f64)> = (0..row_blocks.div_ceil(2))
            .map(|x| match row_blocks - 1 - x {
                other if other != x => (steps[x] + steps[other], 2.0),
                _ => (steps[x], 1.0),
            })
            .collect();
        let n_units = units.len() * per_head;
        let grid = n_units.min(slots).max(1);
        let mut load = vec![0.0f64; grid];
        for u in 0..n_units {
            let (n, tiles) = units[(u / (plan.dv_split as usize * splits)) % units.len()];
            load[u % grid] += n as f64 * step * bps + tiles * TILE_SWITCH;
        }
        load.iter().cloned().fold(0.0, f64::max) + prologue + epilogue
    } else {
        // A list schedule of the blocks over the device's slots; a block
        // sharing its SM with others takes `bps` times as long per step,
        // while its prologue and epilogue overlap theirs.
        let cycles = steps.iter().flat_map(|&n| {
            let n = n.div_ceil(splits);
            std::iter::repeat_n(
                (prologue + epilogue + n as f64 * step * bps) as u64,
                per_head,
            )
        });
        list_schedule(cycles, slots) as f64
    };
    let mut micros = makespan / clock * 1e6;
    if splits > 1 {
        // The combine kernel reads every partial row once.
        let bytes = (problem.b * problem.h * problem.sq * splits) as f64 * dvs * 4.0;
        micros += bytes / (device.dram_gbs * 1e9) * 1e6 + 3.0;
    }
    Estimate {
        micros,
        tflops: useful_flops(problem, facts) / (micros * 1e-6) / 1e12,
        bound,
    }
}

/// KV splits of a split-KV plan over `blocks` blocks (before splits) of
/// `kv_blocks` key blocks: the runtime's rule ([`kv_split_rule`]), with the
/// plan's resident blocks as the driver's count, `block_bytes_in_flight`
/// K/V bytes in flight and `block_fixed_work` per block, so that the model prices
/// the split count that runs (its own estimate had given MQA's 64-row tile
/// 8 splits where it runs 4).
pub(crate) fn plan_splits(
    plan: &TilePlan,
    blocks: usize,
    kv_blocks: usize,
    block_bytes_in_flight: u64,
    block_fixed_work: u64,
    device: &DeviceConfig,
) -> usize {
    if !plan.split_kv {
        return 1;
    }
    kv_split_rule(KvSplitInputs {
        blocks: blocks as u64,
        key_blocks: kv_blocks as u64,
        max_splits: MAX_KV_SPLITS,
        block_smem: 0,
        block_bytes_in_flight,
        block_fixed_work,
        sms: u64::from(device.sms),
        residency: Residency::Blocks(u64::from(plan.blocks_per_sm.max(1))),
    }) as usize
}

/// The makespan of blocks of `cycles` each, in launch order, over `slots`
/// block slots: each block starts on the first slot to come free.
pub(crate) fn list_schedule(cycles: impl IntoIterator<Item = u64>, slots: usize) -> u64 {
    let mut free: BinaryHeap<Reverse<u64>> = (0..slots.max(1)).map(|_| Reverse(0)).collect();
    let mut makespan = 0u64;
    for c in cycles {
        let Reverse(start) = free.pop().unwrap_or(Reverse(0));
        let end = start + c;
        makespan = makespan.max(end);
        free.push(Reverse(end));
    }
    makespan
}

/// FLOPs of the two GEMMs over the visible pairs (scores computed once).
pub fn useful_flops(problem: &Problem, facts: &VariantFacts) -> f64 {
    let pairs = if facts.causal {
        let (sq, skv) = (problem.sq as f64, problem.skv as f64);
        // Row i sees keys up to i + (skv − sq).
        (0..problem.sq)
            .map(|i| (i as f64 + 1.0 + (skv - sq)).clamp(0.0, skv))
            .sum::<f64>()
    } else {
        problem.sq as f64 * problem.skv as f64
    };
    2.0 * pairs * (problem.dqk + problem.dv) as f64 * (problem.b * problem.h) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_model_prices_the_split_count_that_runs() {
        // MQA d128 on an H200 (16 sequences × 4096 keys, 128 heads on one
        // KV head), one block per SM: the 64-row tile's 32 blocks run 4
        // splits and the 128-row tile's 16 blocks 8 (the splits the GPU
        // ran, bench/results/2026-12-02-nvidia-h200-mqa-tiles-timeline.txt).
        let h200 = DeviceConfig::named("h200").unwrap();
        let plan = |block_m| TilePlan {
            block_m,
            block_n: 128,
            dv_slice: 128,
            dv_split: 1,
            units: block_m / 64,
            unit_rows: 64,
            key_units: 1,
            engine: Engine::Wgmma,
            overlapped: false,
            q_in_registers: false,
            stages: 3,
            blocks_per_sm: 1,
            packed_gqa: true,
            split_kv: true,
            persistent: false,
        };
        // Two 128-key blocks of K and V at d128 in flight.
        let tile = SplitTile {
            block_m: 64,
            block_n: 128,
            stages: 3,
            dqk: 128,
            dv_slice: 128,
            v_in_k: false,
            elem_bytes: 2,
        };
        let in_flight = tile.kv_bytes_in_flight();
        assert_eq!(in_flight, 128 * 1024);
        assert_eq!(plan_splits(&plan(64), 32, 32, in_flight, 0, &h200), 4);
        assert_eq!(plan_splits(&plan(128), 16, 32, in_flight, 0, &h200), 8);
        // No split-KV, or a grid of two blocks per SM: one.
        let whole = TilePlan {
            split_kv: false,
            ..plan(64)
        };
        assert_eq!(plan_splits(&whole, 32, 32, in_flight, 0, &h200), 1);
        assert_eq!(plan_splits(&plan(64), 2 * 132, 32, in_flight, 0, &h200), 1);
    }
}
