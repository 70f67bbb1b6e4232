//! The order in which a persistent block-sparse forward's CTAs take their
//! row blocks ([`KernelSource::tile_schedule`](crate::KernelSource)).
//!
//! Under a block-sparse mask a row block costs about what its mask row lists,
//! and random masks list very different numbers per row: a static stride
//! over the row blocks left the CTA with the most work ~20% above the mean
//! (H100, 90% hidden at s8192; bench/NOTES.md). The kernel hands out row
//! blocks from a counter, so each goes to the CTA that frees up first; taken
//! longest first, that is the longest-processing-time rule, which ends with
//! short tiles. A global sort would scatter the heads over time and the CTAs
//! would stop sharing K and V through L2, so the sort stays within windows
//! of whole heads, each window holding at least one row block per CTA.

/// Row blocks `plane · row_blocks + r` for `planes` (batch · head) planes of
/// `row_blocks` each, in the order a grid of `ctas` CTAs should take them:
/// windows of `ceil(ctas / row_blocks)` consecutive planes, each sorted by
/// descending `cost(plane, r)` (ties in row-block order).
pub fn tile_order(
    planes: usize,
    row_blocks: usize,
    ctas: usize,
    cost: impl Fn(usize, usize) -> u32,
) -> Vec<u32> {
    let window = ctas.div_ceil(row_blocks.max(1)).max(1);
    let mut order: Vec<(u32, u32)> = (0..planes)
        .flat_map(|p| (0..row_blocks).map(move |r| (p, r)))
        .map(|(p, r)| (cost(p, r), (p * row_blocks + r) as u32))
        .collect();
    for chunk in order.chunks_mut(window * row_blocks.max(1)) {
        chunk.sort_by_key(|&(c, tile)| (std::cmp::Reverse(c), tile));
    }
    order.into_iter().map(|(_, tile)| tile).collect()
}
