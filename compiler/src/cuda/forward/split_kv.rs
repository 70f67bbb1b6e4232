//! How many KV splits a split-KV forward launches with: the residency the
//! caller knows, the bytes a tile keeps in flight, and the rule that picks
//! the splits for which the busiest multiprocessor finishes first.

use super::*;

/// The most KV splits a split-KV forward launches with.
pub const MAX_KV_SPLITS: u64 = 128;

/// How many blocks of one kernel a multiprocessor holds at once, as far as
/// the caller knows: the KV-split rule's wave cap ([`kv_split_rule`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Residency {
    /// Not known: no wave cap.
    Unknown,
    /// Only the multiprocessor's shared memory, in bytes, is known: the cap
    /// counts the blocks it fits (each with 1 KiB the driver reserves). An
    /// upper bound of [`Blocks`](Self::Blocks): registers are not counted.
    SharedMemory(u64),
    /// The driver's count for this kernel, its threads and its dynamic
    /// shared memory (`cuOccupancyMaxActiveBlocksPerMultiprocessor`), which
    /// also counts registers.
    Blocks(u64),
}

impl Residency {
    /// Blocks of `block_smem` bytes of dynamic shared memory that one
    /// multiprocessor holds, where known (the shared-memory bound needs both
    /// figures).
    pub fn per_sm(self, block_smem: u64) -> Option<u64> {
        match self {
            Residency::Unknown => None,
            Residency::SharedMemory(bytes) => (block_smem > 0 && bytes > 0)
                .then(|| bytes / (block_smem + u64::from(SMEM_RESERVED_PER_BLOCK))),
            Residency::Blocks(n) => Some(n),
        }
    }
}

/// Whether a decoding grid of `blocks` blocks takes the fat tile
/// ([`ForwardConfig::for_few_blocks`]): fewer than half the `sms`
/// multiprocessors, or more than three quarters of them and at most one
/// each.
pub(super) fn few_or_one_per_sm(blocks: usize, sms: u32) -> bool {
    let sms = sms as usize;
    blocks * 2 < sms || (blocks * 4 > sms * 3 && blocks <= sms)
}

/// Bytes of K and V a multiprocessor needs in flight for the DRAM to run at
/// full speed: the KV-split rule ([`split_cost`]) prices fewer as a slower
/// stream. (H200, d128 decoding tile of 16 KB in flight per block, B16 ×
/// 4096: one block per SM 103.5 µs, two 73.4, three to five 66.9–67.4;
/// B32 × 4096: two per SM 133.4, four 123.0. 64 KiB is where the rule's
/// choices match the fastest of 1 to 16 splits on eight shapes within 2%,
/// bench/NOTES.md session 67.)
pub const KV_BYTES_IN_FLIGHT_PER_SM: u64 = 64 * 1024;

/// What the KV-split rule reads of a split-KV tile: its shape, ring depth,
/// head dims (`dv_slice`: the Dv columns one block computes) and element
/// size.
#[derive(Clone, Copy, Debug)]
pub struct SplitTile {
    pub block_m: u32,
    pub block_n: u32,
    pub stages: u32,
    pub dqk: u32,
    pub dv_slice: u32,
    pub v_in_k: bool,
    pub elem_bytes: u32,
}

impl SplitTile {
    /// Bytes of K and V one block of a key block's rows: Dqk elements of K
    /// and, unless V is read from K's rows, the block's Dv slice of V.
    fn key_block_bytes(&self) -> u64 {
        let row = u64::from(self.dqk)
            + if self.v_in_k {
                0
            } else {
                u64::from(self.dv_slice)
            };
        u64::from(self.block_n) * row * u64::from(self.elem_bytes)
    }

    /// Bytes of K and V one block keeps loading ahead of its compute:
    /// `stages - 1` key blocks (at least one).
    pub fn kv_bytes_in_flight(&self) -> u64 {
        u64::from(self.stages.saturating_sub(1).max(1)) * self.key_block_bytes()
    }

    /// A block's work besides its key blocks, in 1024ths of a key block, for
    /// the KV-split rule ([`split_cost`]): one key block's worth (the start
    /// and the end of a block) plus the bytes it moves once per split — its
    /// Q rows and its partial output rows (f32), `block_m` of each at most —
    /// counted in key blocks. A 64-row tile's partial rows are twice a
    /// 32-key block's K and V: splitting it finer costs more than the keys
    /// show.
    pub fn split_fixed_work(&self) -> u64 {
        let once = u64::from(self.block_m)
            * (u64::from(self.dqk) * u64::from(self.elem_bytes) + u64::from(self.dv_slice) * 4);
        1024 + once * 1024 / self.key_block_bytes().max(1)
    }
}

/// What the KV-split rule ([`kv_split_rule`]) reads.
#[derive(Clone, Copy, Debug)]
pub struct KvSplitInputs {
    /// Blocks of the grid without splits.
    pub blocks: u64,
    /// Key blocks of the longest sequence.
    pub key_blocks: u64,
    pub max_splits: u64,
    /// Dynamic shared memory of one block (with [`Residency::SharedMemory`]
    /// 0 means no wave cap).
    pub block_smem: u64,
    /// K/V bytes one block keeps in flight
    /// ([`SplitTile::kv_bytes_in_flight`]); 0 when
    /// not known ([`split_cost`]).
    pub block_bytes_in_flight: u64,
    /// A block's fixed work in 1024ths of a key block
    /// ([`SplitTile::split_fixed_work`]); 0 when not known (one key block).
    pub block_fixed_work: u64,
    pub sms: u64,
    pub residency: Residency,
}

/// The KV-split rule that [`KernelSource::kv_splits`] and the launch plans'
/// `KvSplitPlan::splits` share. 1 when the grid already has two blocks per
/// multiprocessor. Otherwise the splits `s` from 1 to `min(clamp(key_blocks
/// / 4, 1, max_splits), max(1, resident · SMs / blocks))` (each split at
/// least four key blocks; at most one wave of the blocks a multiprocessor
/// holds, where `resident` is known: [`Residency`]) for which the busiest
/// multiprocessor finishes first ([`split_cost`]); ties go to fewer splits.
pub fn kv_split_rule(i: KvSplitInputs) -> u64 {
    let sms = i.sms.max(1);
    if i.blocks >= 2 * sms || i.blocks == 0 {
        return 1;
    }
    let most = (i.key_blocks / 4).clamp(1, i.max_splits.max(1));
    let resident = i.residency.per_sm(i.block_smem);
    let top = resident.map_or(most, |r| most.min((r * sms / i.blocks).max(1)));
    (1..=top)
        .min_by_key(|&s| {
            let cost = split_cost(
                i.blocks,
                i.key_blocks,
                s,
                sms,
                resident,
                i.block_bytes_in_flight,
                i.block_fixed_work,
            );
            (cost, s)
        })
        .unwrap_or(1)
}

/// The busiest multiprocessor's time with `splits` KV splits, in key blocks
/// × 1024: it runs `n = ceil(blocks · splits / SMs)` blocks of
/// `ceil(key_blocks / splits)` key blocks each plus the block's fixed work
/// (`block_fixed_work` 1024ths of a key block, [`SplitTile::split_fixed_work`]; 0: one
/// key block), streamed at full speed when the blocks resident at once
/// (`resident`: how many fit; `None`: all) keep
/// [`KV_BYTES_IN_FLIGHT_PER_SM`] in flight between them
/// (`block_bytes_in_flight` each), and slower with less: by `1 + 0.078 ·
/// (KV_BYTES_IN_FLIGHT_PER_SM / in_flight − 1)²`, the curve of the H200
/// sweep (a quarter of the bytes 1.70× the time, half 1.08×, three quarters
/// 1.01×; bench/NOTES.md session 67). With `block_bytes_in_flight` 0 (not
/// known) a block counts as half that figure.
pub fn split_cost(
    blocks: u64,
    key_blocks: u64,
    splits: u64,
    sms: u64,
    resident: Option<u64>,
    block_bytes_in_flight: u64,
    block_fixed_work: u64,
) -> u64 {
    let n = (blocks * splits).div_ceil(sms.max(1));
    let fixed = if block_fixed_work == 0 {
        1024
    } else {
        block_fixed_work
    };
    let per_block = (key_blocks.div_ceil(splits.max(1)) * 1024).saturating_add(fixed);
    let together = resident.map_or(n, |r| n.min(r)).max(1);
    let per_block_bytes = if block_bytes_in_flight == 0 {
        KV_BYTES_IN_FLIGHT_PER_SM / 2
    } else {
        block_bytes_in_flight
    };
    let in_flight = together.saturating_mul(per_block_bytes);
    // The shortfall (need / in flight − 1) in 1024ths, and the factor in
    // 2^20ths: 80 / 1024 ≈ 0.078.
    let short = (KV_BYTES_IN_FLIGHT_PER_SM * 1024 / in_flight).saturating_sub(1024);
    let factor = (1u64 << 20).saturating_add(short.saturating_mul(short).saturating_mul(80) / 1024);
    (n.saturating_mul(per_block) / 1024).saturating_mul(factor) / 1024
}
