//! Tile classification of masks: sound against brute force on random tiles
//! (an empty tile has no visible key, a full tile no hidden one) for every
//! example's mask and for synthetic ones, and exact where the mask is plain
//! index arithmetic (causal, sliding window).

use aec_compiler::intervals::{BlockClass, Tile, classify};
use aec_frontend::ir::{Axis, Op, Region};
use aec_frontend::parse_file;
use aec_frontend::reference::eval::eval_scalar_with;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::PathBuf;

fn masks() -> Vec<(String, Region)> {
    let mut out = Vec::new();
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for entry in std::fs::read_dir(&dir).expect("examples") {
        let path = entry.expect("entry").path();
        let src = std::fs::read_to_string(&path).expect("read");
        for inv in parse_file(&src).expect("rust") {
            let v = inv.variant.expect("valid");
            if let Some(m) = v.parallel().and_then(|p| p.mask.clone()) {
                out.push((path.file_stem().unwrap().to_string_lossy().into_owned(), m));
            }
        }
    }
    // Masks no example has: a band, a block-diagonal through division, a
    // strided pattern with select, a per-head window.
    for (name, mask) in [
        ("band", "i - j < 100 && j - i < 50"),
        ("blocks", "i / 64 - j / 64 < 1 && j / 64 - i / 64 < 1"),
        ("select", "select(i > 300, j, 600 - j) < 200"),
        ("per_head", "i >= j && i - j < 64 * (h + 1)"),
        ("not_or", "!(i < j) || j == 0"),
    ] {
        let src = format!(
            "attention! {{ pub struct M: parallel {{ q: [B, H, Sq, Dqk]; k: [B, H, Skv, Dqk]; v: [B, H, Skv, Dv]; mask = |b, h, i, j| {mask}; }} }}"
        );
        let v = parse_file(&src)
            .expect("rust")
            .remove(0)
            .variant
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        out.push((
            name.to_string(),
            v.parallel().unwrap().mask.clone().unwrap(),
        ));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn truth(mask: &Region, b: i64, h: i64, i: i64, j: i64, customs: &[f64]) -> bool {
    eval_scalar_with(
        mask,
        &mut |op| match op {
            Op::Index(Axis::B) => b as f64,
            Op::Index(Axis::H) | Op::Index(Axis::Hkv) => h as f64,
            Op::Index(Axis::Sq) => i as f64,
            Op::Index(Axis::Skv) => j as f64,
            Op::Shape(_) => 4096.0,
            Op::Custom(c) => customs[*c as usize],
            other => unreachable!("{other:?}"),
        },
        &mut |_, _| 0.0,
    )[0] != 0.0
}

fn tile(i0: i64, i1: i64, j0: i64, j1: i64, b: i64, h: i64) -> Tile {
    Tile {
        i: (i0, i1),
        j: (j0, j1),
        point: vec![(Axis::B, b), (Axis::H, h), (Axis::Hkv, h)],
        sizes: [Axis::B, Axis::H, Axis::Hkv, Axis::Sq, Axis::Skv]
            .map(|a| (a, 4096))
            .to_vec(),
    }
}

#[test]
fn classification_is_sound_on_random_tiles() {
    let mut rng = StdRng::seed_from_u64(5);
    let mut seen = std::collections::HashMap::new();
    for (name, mask) in masks() {
        for _ in 0..150 {
            let (bm, bn) = (
                [16, 32, 64, 128][rng.random_range(0..4)],
                [32, 64][rng.random_range(0..2)],
            );
            let i0 = rng.random_range(0..600);
            let j0 = rng.random_range(0..600);
            let (b, h) = (rng.random_range(0..2), rng.random_range(0..3));
            let class = classify(&mask, &tile(i0, i0 + bm - 1, j0, j0 + bn - 1, b, h));
            *seen.entry((name.clone(), class)).or_insert(0) += 1;
            if class == BlockClass::Partial {
                continue;
            }
            let customs: Vec<f64> = (0..4).map(|_| rng.random_range(0..3) as f64).collect();
            for i in i0..i0 + bm {
                for j in j0..j0 + bn {
                    let t = truth(&mask, b, h, i, j, &customs);
                    assert_eq!(
                        t,
                        class == BlockClass::Full,
                        "{name}: tile i {i0}..{} j {j0}..{} classified {class:?}, but ({i}, {j}) is {t}",
                        i0 + bm,
                        j0 + bn
                    );
                }
            }
        }
    }
    // Index-only masks find both kinds of tile; a mask that reads custom
    // inputs (the document mask) is never known to be true everywhere.
    for name in [
        "softmax_causal",
        "sliding_window",
        "band",
        "blocks",
        "select",
        "per_head",
    ] {
        for class in [BlockClass::Empty, BlockClass::Full] {
            assert!(
                seen.get(&(name.to_string(), class)).copied().unwrap_or(0) > 0,
                "{name}: no {class:?} tile among 150"
            );
        }
    }
    assert!(!seen.contains_key(&("document_mask".to_string(), BlockClass::Full)));
}

#[test]
fn causal_tiles_are_classified_exactly() {
    let causal = masks()
        .into_iter()
        .find(|(n, _)| n == "softmax_causal")
        .expect("causal example")
        .1;
    // Below the diagonal: full; above: empty; crossing it: partial.
    assert_eq!(
        classify(&causal, &tile(128, 191, 0, 63, 0, 0)),
        BlockClass::Full
    );
    assert_eq!(
        classify(&causal, &tile(0, 63, 64, 127, 0, 0)),
        BlockClass::Empty
    );
    assert_eq!(
        classify(&causal, &tile(64, 127, 64, 127, 0, 0)),
        BlockClass::Partial
    );
    assert_eq!(
        classify(&causal, &tile(64, 127, 127, 190, 0, 0)),
        BlockClass::Partial
    );
    assert_eq!(
        classify(&causal, &tile(64, 127, 128, 191, 0, 0)),
        BlockClass::Empty
    );
}
