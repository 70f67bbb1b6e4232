//! Tuning keys carry a digest of each kernel family's template text
//! (`TEMPLATE_TEXT` constants), so that a changed template never reuses
//! results tuned on the old one. That holds only if the text holds every
//! file the template includes, directly or through another include: a file
//! left out could change the kernels under an unchanged key.

use aec_compiler::cuda::{backward, forward, recurrent};
use std::collections::BTreeSet;
use std::path::PathBuf;

fn templates() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../templates")
}

/// `root` and every template it includes, transitively (paths under
/// `templates/`, as askama's `{% include "…" %}` names them).
fn closure(root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![root.to_string()];
    while let Some(path) = todo.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let text = std::fs::read_to_string(templates().join(&path))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        for part in text.split("{% include \"").skip(1) {
            let name = part.split('"').next().expect("an include's closing quote");
            todo.push(name.to_string());
        }
    }
    seen
}

fn assert_digest_covers(what: &str, digest: &str, roots: &[&str]) {
    for root in roots {
        for path in closure(root) {
            let text = std::fs::read_to_string(templates().join(&path)).unwrap();
            assert!(
                digest.contains(&text),
                "{what}: the tuning keys' template text lacks `{path}` (included from `{root}`)"
            );
        }
    }
}

#[test]
fn tuning_keys_digest_every_template_file_a_kernel_includes() {
    // (The include scan itself: the forward pulls in at least its types,
    // prelude, tile layouts, Hopper prelude and the multicast walk.)
    assert!(closure("cuda/parallel_fwd.cu").len() >= 6);
    assert_digest_covers(
        "parallel forward",
        forward::TEMPLATE_TEXT,
        &["cuda/parallel_fwd.cu"],
    );
    assert_digest_covers(
        "parallel backward",
        backward::TEMPLATE_TEXT,
        &["cuda/parallel_bwd.cu"],
    );
    assert_digest_covers(
        "recurrent forward",
        recurrent::TEMPLATE_TEXT,
        &["cuda/recurrent_fwd.cu", "cuda/recurrent_fwd_sm90.cu"],
    );
    // (The backward's states pass is the mma.sync forward's template.)
    assert_digest_covers(
        "recurrent backward",
        recurrent::BACKWARD_TEMPLATE_TEXT,
        &["cuda/recurrent_bwd.cu", "cuda/recurrent_fwd.cu"],
    );
}
