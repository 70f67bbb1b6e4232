// The key walk of a cluster pair sharing K/V blocks by TMA multicast
// (ForwardConfig::kv_multicast). Plain integer functions, no CUDA: the
// tests compile this file with the host's C++ compiler (AEC_HD defined
// there) and walk every unit of many sizes through them.
//
// The pair's CTAs take units 2u and 2u + 1, which are row-block pairs p and
// p + 1 (p even) of one head: tile `second` of unit u is row block
// rank = second ? n_rb - 1 - pair : pair, which starts at row
// (causal ? n_rb - 1 - rank : rank) * BM. Both walk their key blocks from the
// last down. Without a mask their walks are the same. Under a causal mask
// the row blocks of one tile differ by one: in the first tile (second == 0)
// CTA 0 sees BM / BN blocks more, in the second CTA 1 does. Those extra
// blocks are its solo steps: CTA 0 takes them after the shared blocks of its
// first tile, CTA 1 before the shared blocks of its second, so both run solo
// steps at the same ring positions and every shared block is at the same
// step in both CTAs.
#ifndef AEC_HD
#define AEC_HD __device__ __forceinline__
#endif

// Whether the sizes pair up as above: whole unit pairs of one head (row
// blocks a multiple of 4) and, under a causal mask, square scores whose last
// row block ends in the last key block, so that every tile's extra blocks
// are BM / BN of them.
AEC_HD bool kv_pairs_line_up(int n_rb, int sq, int skv, bool causal, int bm, int bn) {
    return n_rb % 4 == 0 && (!causal || (sq == skv && (skv + bn - 1) / bn == n_rb * (bm / bn)));
}

// One past the last key block that row block `rank`'s tile visits under a
// causal mask (the template's cut at the diagonal), for `n_rows` rows and
// `skv` keys.
AEC_HD int kv_causal_key_end(int rank, int n_rb, int bm, int bn, int n_rows, int skv) {
    const int m0 = (n_rb - 1 - rank) * bm;
    const int last = (m0 + bm < n_rows ? m0 + bm : n_rows) - 1;
    const int end = (last + bn) / bn, all = (skv + bn - 1) / bn;
    return end < all ? end : all;
}

// Whether tile `second`'s shared steps come first (its extra blocks last).
AEC_HD bool kv_extra_last(int second) { return second == 0; }

// Whether step `it` of a tile of `n_iter` steps reads a block both CTAs read.
AEC_HD bool kv_step_shared(int it, int n_iter, int n_shared, bool extra_last) {
    return extra_last ? it < n_shared : it >= n_iter - n_shared;
}

// The key blocks of a walk over [n_begin, n_end) whose lowest `n_shared`
// are shared, last block first, with the extra blocks after the shared ones
// where `extra_last`: two descending runs, steps below `cut` counting down
// from block `top0`, the others from `top1` (three values live through a
// tile's loops; the causal tile with Q in registers spilled 4 bytes fewer
// than with the five the plain definition reads).
struct KvWalk {
    int cut, top0, top1;
};
AEC_HD KvWalk kv_walk(int n_begin, int n_end, int n_shared, bool extra_last) {
    KvWalk w;
    w.cut = extra_last ? n_shared : 0;
    w.top0 = n_begin + n_shared - 1;
    w.top1 = n_end - 1 + w.cut;
    return w;
}
AEC_HD int kv_walk_block(const KvWalk& w, int it) { return (it < w.cut ? w.top0 : w.top1) - it; }
