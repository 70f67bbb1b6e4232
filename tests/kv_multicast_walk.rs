//! The cluster pair's key walk (`ForwardConfig::kv_multicast`,
//! `templates/cuda/kv_multicast.cu`) run on the host: the template's walk
//! functions compiled by the host's C++ compiler, and every unit pair of
//! many sizes walked through them as the kernel's producer and consumers do.
//! Each tile must visit each of its key blocks once, and where the sizes
//! pair up the two CTAs must take the same number of steps with every
//! shared block at the same step in both (the multicast copies a block into
//! both CTAs' stage of that step; a misaligned walk would read another
//! block's data or deadlock on the stage's barriers).

mod common;

use std::path::PathBuf;
use std::process::Command;

const HARNESS: &str = r#"
#include <algorithm>
#include <cstdio>
#include <vector>
#define AEC_HD inline
#include "kv_multicast.cu"

static long fails = 0;
#define CHECK(c, ...)                                                             \
    do {                                                                          \
        if (!(c)) {                                                               \
            if (fails++ < 20) {                                                   \
                std::printf("FAIL line %d (%s): ", __LINE__, #c);                 \
                std::printf(__VA_ARGS__);                                         \
                std::printf("\n");                                                \
            }                                                                     \
        }                                                                         \
    } while (0)

// The walk's plain definition, which the kernel's two-run form must equal:
// the shared blocks (the lowest n_shared), last first, then where
// `extra_last` the extra ones, last first; otherwise all, last first.
static int plain_step_block(int it, int n_begin, int n_end, int n_shared, bool extra_last) {
    if (extra_last && it < n_shared) return n_begin + n_shared - 1 - it;
    return n_end - 1 - (it - (extra_last ? n_shared : 0));
}

struct Step {
    bool shared;
    int block;
};

// The steps of the CTA walking `unit` (both of its tiles), with the
// template's own cut of each tile's key blocks at the diagonal.
static std::vector<Step> walk(int unit, int n_rb, bool causal, int bm, int bn, int sq, int skv, bool mc_on,
                              const char* what) {
    const int n_pairs = (n_rb + 1) / 2;
    std::vector<Step> steps;
    for (int second = 0; second < 2; ++second) {
        const int pair = unit % n_pairs;
        const int rank = second ? n_rb - 1 - pair : pair;
        if (second && rank == pair) continue;
        const int m0 = (causal ? n_rb - 1 - rank : rank) * bm;
        const int n_begin = 0;
        int n_end = (skv + bn - 1) / bn;
        if (causal) n_end = std::min(n_end, (std::min(m0 + bm, sq) - 1 + bn) / bn);
        const int n_iter = n_end - n_begin;
        int n_shared = 0;
        if (mc_on) {
            if (causal) {
                const int peer_pair = (unit ^ 1) % n_pairs;
                const int peer_rank = second ? n_rb - 1 - peer_pair : peer_pair;
                n_shared = std::min(n_iter, kv_causal_key_end(peer_rank, n_rb, bm, bn, sq, skv) - n_begin);
            } else {
                n_shared = n_iter;
            }
        }
        const bool extra_last = kv_extra_last(second);
        const KvWalk w = kv_walk(n_begin, n_end, n_shared, extra_last);
        std::vector<int> seen(n_end, 0);
        for (int it = 0; it < n_iter; ++it) {
            // (The kernel's two-run form, and the plain definition beside it.)
            const int blk = kv_walk_block(w, it);
            CHECK(blk == plain_step_block(it, n_begin, n_end, n_shared, extra_last),
                  "%s unit %d tile %d step %d: two-run walk at block %d, the definition at %d", what, unit, second,
                  it, blk, plain_step_block(it, n_begin, n_end, n_shared, extra_last));
            CHECK(blk >= n_begin && blk < n_end, "%s unit %d tile %d step %d: block %d outside [%d, %d)", what, unit,
                  second, it, blk, n_begin, n_end);
            if (blk >= n_begin && blk < n_end) ++seen[blk];
            steps.push_back({kv_step_shared(it, n_iter, n_shared, extra_last), blk});
        }
        for (int b = n_begin; b < n_end; ++b)
            CHECK(seen[b] == 1, "%s unit %d tile %d: block %d visited %d times", what, unit, second, b, seen[b]);
    }
    return steps;
}

int main() {
    long sizes = 0, paired = 0, shared_steps = 0, steps_all = 0;
    const int bms[] = {64, 128, 192};
    for (int bm : bms)
        for (int bn = 32; bn <= 128; bn += 16)
            for (int causal = 0; causal < 2; ++causal) {
                // The kernel takes the causal walk only where BN divides BM.
                if (causal && bm % bn) continue;
                for (int sq = 1; sq <= 2200; sq += (sq < 600 ? 7 : 61))
                    for (int dk = -2; dk <= 2; ++dk) {
                        const int skv = causal ? (dk == 0 ? sq : sq + dk * 37) : sq + dk * 53;
                        if (skv < 1) continue;
                        char what[96];
                        std::snprintf(what, sizeof what, "bm %d bn %d causal %d sq %d skv %d", bm, bn, causal, sq, skv);
                        const int n_rb = (sq + bm - 1) / bm, n_pairs = (n_rb + 1) / 2;
                        const bool mc_on = kv_pairs_line_up(n_rb, sq, skv, causal, bm, bn);
                        ++sizes;
                        paired += mc_on;
                        for (int u = 0; u + 1 < n_pairs || (u == 0 && n_pairs == 1); u += 2) {
                            const std::vector<Step> a = walk(u, n_rb, causal, bm, bn, sq, skv, mc_on, what);
                            if (!mc_on) {
                                for (const Step& s : a) CHECK(!s.shared, "%s: a shared step with the pairing off", what);
                                continue;
                            }
                            const std::vector<Step> b = walk(u + 1, n_rb, causal, bm, bn, sq, skv, mc_on, what);
                            CHECK(a.size() == b.size(), "%s units %d, %d: %zu and %zu steps", what, u, u + 1, a.size(),
                                  b.size());
                            for (size_t gi = 0; gi < std::min(a.size(), b.size()); ++gi) {
                                CHECK(a[gi].shared == b[gi].shared, "%s units %d, %d step %zu: shared %d and %d", what, u,
                                      u + 1, gi, a[gi].shared, b[gi].shared);
                                if (a[gi].shared && b[gi].shared)
                                    CHECK(a[gi].block == b[gi].block, "%s units %d, %d step %zu: blocks %d and %d", what,
                                          u, u + 1, gi, a[gi].block, b[gi].block);
                                shared_steps += a[gi].shared;
                            }
                            steps_all += (long)a.size();
                        }
                    }
            }
    std::printf("sizes %ld paired %ld steps %ld shared %ld fails %ld\n", sizes, paired, steps_all, shared_steps, fails);
    return fails ? 1 : 0;
}
"#;

fn template_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("templates/cuda")
}

#[test]
fn cluster_pairs_walk_their_shared_key_blocks_at_the_same_steps() {
    if !common::tool_ready("c++", "the cluster pair's key walk is not checked") {
        return;
    }
    let dir = std::env::temp_dir().join(format!("aec-kv-multicast-walk-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("walk.cpp");
    std::fs::write(&src, HARNESS).unwrap();
    let exe = dir.join("walk");
    let out = Command::new("c++")
        .args(["-std=c++17", "-O1", "-Wall", "-Werror", "-I"])
        .arg(template_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the walk harness does not compile:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    let report = String::from_utf8_lossy(&run.stdout).into_owned();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.status.success(), "{report}");
    // The pairing must actually be taken, and share most steps, at sizes
    // that line up (else the check above passes vacuously).
    let field = |name: &str| -> u64 {
        let words: Vec<&str> = report.split_whitespace().collect();
        let at = words.iter().position(|w| *w == name).unwrap();
        words[at + 1].parse().unwrap()
    };
    assert!(field("paired") > 100, "{report}");
    assert!(
        field("shared") * 10 > field("steps") * 9,
        "fewer than 90% of the paired steps shared: {report}"
    );
}
