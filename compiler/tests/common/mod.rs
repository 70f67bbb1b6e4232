//! What the compiler's test files share.

use aec_frontend::{Variant, parse_file};
use std::path::PathBuf;

/// The first variant of `examples/<name>.rs`.
pub fn example(name: &str) -> Variant {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("../examples/{name}.rs"));
    let src = std::fs::read_to_string(&path).expect("read example");
    parse_file(&src)
        .expect("rust file")
        .remove(0)
        .variant
        .expect("valid variant")
}
