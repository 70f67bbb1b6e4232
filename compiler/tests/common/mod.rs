//! What the compiler's test files share.

use aec_frontend::{Variant, parse_file};
use std::path::PathBuf;

/// Every variant of `examples/`, with its file's stem, sorted by stem.
#[allow(dead_code)] // (each test crate uses part of this module)
pub fn examples() -> Vec<(String, Variant)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("examples dir") {
        let path = entry.expect("entry").path();
        let src = std::fs::read_to_string(&path).expect("read example");
        for inv in parse_file(&src).expect("rust file") {
            let v = inv
                .variant
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            out.push((path.file_stem().unwrap().to_string_lossy().into_owned(), v));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// The first variant of `examples/<name>.rs`.
#[allow(dead_code)]
pub fn example(name: &str) -> Variant {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{name}.rs"));
    let src = std::fs::read_to_string(&path).expect("read example");
    parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant")
}
