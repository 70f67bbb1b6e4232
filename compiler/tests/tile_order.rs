//! The block-sparse tile order (`aec_compiler::tile_order`): every row block
//! once, windows of whole heads holding a row block per CTA, longest lists
//! first inside each window.

use aec_compiler::tile_order::tile_order;

/// A deterministic, uneven cost per (plane, row block).
fn cost(plane: usize, r: usize) -> u32 {
    ((plane * 7 + r * 13) % 11) as u32
}

#[test]
fn every_row_block_once_longest_first_within_windows_of_heads() {
    let (planes, row_blocks, ctas) = (7, 5, 12);
    let order = tile_order(planes, row_blocks, ctas, cost);
    let mut seen = order.clone();
    seen.sort_unstable();
    assert_eq!(
        seen,
        (0..(planes * row_blocks) as u32).collect::<Vec<_>>(),
        "each row block exactly once"
    );
    // ceil(12 / 5) = 3 planes per window: 15 row blocks, the last window 1 plane.
    let window = 3 * row_blocks;
    for (w, chunk) in order.chunks(window).enumerate() {
        for &tile in chunk {
            let plane = tile as usize / row_blocks;
            assert_eq!(plane / 3, w, "tile {tile} left its window of heads");
        }
        for pair in chunk.windows(2) {
            let c = |t: u32| cost(t as usize / row_blocks, t as usize % row_blocks);
            let (a, b) = (pair[0], pair[1]);
            assert!(
                c(a) > c(b) || (c(a) == c(b) && a < b),
                "window {w}: {a} (cost {}) before {b} (cost {})",
                c(a),
                c(b)
            );
        }
    }
}

#[test]
fn windows_cover_at_least_one_row_block_per_cta() {
    // 64 row blocks and 132 CTAs: three heads a window.
    let order = tile_order(5, 64, 132, |p, r| (p * 64 + r) as u32);
    let first: Vec<u32> = order[..192].to_vec();
    assert_eq!(first[0], 191, "the window's longest (plane 2's last) first");
    assert!(
        first.iter().all(|&t| t < 192),
        "planes 0-2 form the first window"
    );
    assert_eq!(
        order[192], 319,
        "then plane 4's last, the second window's longest"
    );
    // Fewer CTAs than row blocks: one head a window.
    let order = tile_order(2, 8, 3, |_, r| r as u32);
    assert_eq!(
        order,
        vec![7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 8]
    );
    // Equal costs keep row-block order.
    assert_eq!(tile_order(2, 3, 6, |_, _| 4), vec![0, 1, 2, 3, 4, 5]);
    assert!(tile_order(0, 3, 6, |_, _| 4).is_empty());
}
